"""One lab month under three policies, side by side: the same jobs on the same cards.

``compare`` runs the two baselines here and NebulaGrid through ``replay`` (the caller's:
``nebula simulate`` hands it the head's own replay, ``head/replay.py``, so this package
never imports the head), then computes each policy's figures.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from . import baselines, inventory, metrics
from .records import Outcome, Request

#: a replay of NebulaGrid's own head: (requests, inventory, horizon_s) -> outcomes
NebulaReplay = Callable[[Sequence[Request], dict[str, list[dict]], float], dict[int, Outcome]]


@dataclass(frozen=True)
class Comparison:
    figures: tuple[metrics.Figures, ...]  # NebulaGrid, spreadsheet, slurm-like
    seconds: dict[str, float]  # policy -> how long its replay took
    jobs: int
    cards: int
    #: NebulaGrid's start forecasts at submit, scored (None: the replay made none)
    forecast: metrics.ForecastScore | None = None

    def text(self) -> str:
        nebula, spreadsheet, slurm = self.figures
        took = ", ".join(f"{name} {s:.1f} s" for name, s in self.seconds.items())
        score = f"\n{self.forecast.text()}" if self.forecast else ""
        return (f"{self.jobs} jobs on {self.cards} cards; replayed in {took}\n\n"
                f"{metrics.table(self.figures)}{score}\n\n{metrics.last_line(nebula, spreadsheet, slurm)}")


def cards_of(inv: dict[str, list[dict]]) -> list[baselines.Card]:
    return [baselines.Card(node, uuid, mb) for node, uuid, mb in inventory.card_list(inv)]


def compare(requests: Sequence[Request], inv: dict[str, list[dict]], horizon_s: float,
            half_life_s: float | None, replay: NebulaReplay) -> Comparison:
    cards = cards_of(inv)
    seconds = {}
    started = time.perf_counter()
    nebula = replay(requests, inv, horizon_s)
    seconds["NebulaGrid"] = time.perf_counter() - started
    started = time.perf_counter()
    sheet = baselines.spreadsheet(requests, cards, horizon_s)
    seconds["spreadsheet"] = time.perf_counter() - started
    started = time.perf_counter()
    slurm = baselines.slurm_like(requests, cards, horizon_s, half_life_s)
    seconds["slurm-like"] = time.perf_counter() - started
    # A job counts as runnable when the pooled cards could hold it and the head did not
    # refuse it as one no card here could ever run: the same set for all three, so "never
    # run" compares. A job the head refused for now (its user over quota) is runnable: some
    # card could have run it, so it counts as never run.
    runnable = {r.key for r in requests if slurm[r.key].refused is None and not nebula[r.key].unfit}
    all_figures = tuple(metrics.figures(name, requests, outcomes, cards, horizon_s, runnable)
                        for name, outcomes in (("NebulaGrid", nebula), ("spreadsheet", sheet),
                                               ("slurm-like", slurm)))
    return Comparison(all_figures, seconds, len(requests), len(cards),
                      metrics.forecast_score(requests, nebula))
