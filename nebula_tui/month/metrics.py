"""What a policy did with a month: the figures a replay prints side by side.

* utilisation — work served: the memory-hours of the jobs that ran (a job counts the
  memory it asked for on each card, a whole-card job the card's), over the memory-hours
  the cards offered; a card held whole by an 8 GB job counts 8 GB of work, not 24;
  and the part of it served to jobs that end (not services): a service's hours are work
  the trace says ran, but a policy that fills the lab's largest cards with services shows
  a higher figure while its batch jobs wait;
* held — the share of card-hours with any job on the card, whole or a slice;
* waits — from submit to its first start (a job preempted and requeued waited once),
  p50/p95/max, overall and by size; a job some card could run that never started counts
  its whole wait until the month's end;
* completion — submit to end, the mean over jobs that ended;
* fairness — Jain's index over users of served ÷ demanded work (memory-hours);
* waited over 24 h, and never run (of the jobs some card of the lab could run).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from .baselines import Card
from .records import Outcome, Request

#: request sizes the waits are broken down by
SIZES = (("slice", lambda r: r.gpu_mem_mb is not None and r.gpus == 1 and r.nodes <= 1),
         ("1 card", lambda r: r.gpu_mem_mb is None and r.gpus == 1 and r.nodes <= 1),
         ("2 cards", lambda r: r.gpus == 2 and r.nodes <= 1),
         ("3-4 cards", lambda r: 3 <= r.gpus <= 4 and r.nodes <= 1),
         ("5+ cards", lambda r: r.gpus >= 5 and r.nodes <= 1),
         ("multi-node", lambda r: r.nodes > 1))


@dataclass(frozen=True)
class Figures:
    policy: str
    utilisation: float
    held: float
    wait_p50_s: float
    wait_p95_s: float
    wait_max_s: float
    waits_by_size: dict[str, tuple[float, float, int, int]]  # size -> (p50, p95, jobs, never run)
    completion_mean_s: float
    fairness: float
    over_24h: int
    never_run: int
    runnable: int
    utilisation_by_day: list[float]
    #: the waits of the runnable jobs that started (those that never did are ``never_run``)
    waits_s: list[float]
    #: the part of ``utilisation`` served to jobs that end (not ``--service``)
    utilisation_batch: float = 0.0

    @property
    def never_run_pct(self) -> float:
        return 100.0 * self.never_run / self.runnable if self.runnable else 0.0


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


def figures(policy: str, requests: Sequence[Request], outcomes: dict[int, Outcome],
            cards: Sequence[Card], horizon_s: float, runnable: set[int]) -> Figures:
    """``runnable``: the keys of the jobs some card of the lab could run (pooled), the same
    set for every policy so their "never run" compare."""
    memory = {c.uuid: c.memory_mb for c in cards}
    offered = sum(memory.values()) * horizon_s
    days = max(1, int(horizon_s // 86400))
    by_day = [0.0] * days
    served = batch = 0.0
    per_user_served: dict[str, float] = defaultdict(float)
    per_user_demand: dict[str, float] = defaultdict(float)
    held_intervals: dict[str, list[tuple[float, float]]] = defaultdict(list)
    waits, started_waits, by_size, completions = [], [], defaultdict(list), []
    never_by_size: dict[str, int] = defaultdict(int)
    over_24h = never = 0
    for r in requests:
        o = outcomes.get(r.key)
        asked = [(r.gpu_mem_mb or 0) for _ in range(r.gpus)]
        if o is None or r.key not in runnable:
            continue
        whole_mb = min((memory[u] for _, u, _, _ in o.placements), default=0) if o.placements else 0
        demand_mb = sum(asked) if r.gpu_mem_mb is not None else r.gpus * (whole_mb or _typical(memory))
        per_user_demand[r.user] += demand_mb * min(r.duration_s, max(0.0, horizon_s - r.submit_s))
        first = o.started_s if o.first_started_s is None else o.first_started_s
        wait = max(0.0, (horizon_s if first is None else first) - r.submit_s)
        never += first is None
        for uuid, since, until in o.held:
            held_intervals[uuid].append((since, min(horizon_s, horizon_s if until is None else until)))
        if o.started_s is not None:  # its last run: the work it served (earlier ones ran again)
            end = min(horizon_s, o.ended_s if o.ended_s is not None else horizon_s)
            work_mb = r.gpu_mem_mb * len(o.placements) if r.gpu_mem_mb is not None \
                else sum(memory[u] for _, u, _, _ in o.placements)
            run = max(0.0, end - o.started_s)
            served += work_mb * run
            if not r.service:
                batch += work_mb * run
            per_user_served[r.user] += work_mb * run
            _spread(by_day, o.started_s, end, work_mb)
            for _, uuid, _, _ in () if o.held else o.placements:
                held_intervals[uuid].append((o.started_s, end))
            if o.ended_s is not None:
                completions.append(o.ended_s - r.submit_s)
        waits.append(wait)
        if first is not None:
            started_waits.append(wait)
        over_24h += wait > 86400
        for size, match in SIZES:
            if match(r):
                by_size[size].append(wait)
                never_by_size[size] += first is None
    total_mb = sum(memory.values())
    held = sum(_union(spans) for spans in held_intervals.values()) / (len(memory) * horizon_s) if memory else 0.0
    ratios = [min(1.0, per_user_served[u] / d) for u, d in per_user_demand.items() if d > 0]
    fairness = (sum(ratios) ** 2 / (len(ratios) * sum(x * x for x in ratios))) if ratios and any(ratios) else 0.0
    return Figures(
        policy, served / offered if offered else 0.0, held, percentile(waits, 50), percentile(waits, 95),
        max(waits, default=0.0),
        {size: (percentile(w, 50), percentile(w, 95), len(w), never_by_size[size]) for size, w in by_size.items()},
        sum(completions) / len(completions) if completions else 0.0, fairness, over_24h, never,
        len(runnable), [d / (total_mb * 86400) for d in by_day] if total_mb else by_day, started_waits,
        batch / offered if offered else 0.0)


def _typical(memory: dict[str, int]) -> int:
    values = sorted(memory.values())
    return values[len(values) // 2] if values else 0


def _spread(by_day: list[float], start: float, end: float, mb: float) -> None:
    day = int(start // 86400)
    while start < end and day < len(by_day):
        edge = min(end, (day + 1) * 86400)
        by_day[day] += mb * (edge - start)
        start, day = edge, day + 1


def _union(spans: list[tuple[float, float]]) -> float:
    total, reach = 0.0, None
    for start, end in sorted(spans):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


#: the forecast is scored on the jobs that waited longer than this (a shorter wait's
#: relative error says little)
SCORED_WAIT_S = 600.0


@dataclass(frozen=True)
class ForecastScore:
    """How the head's start forecast at submit fared against the (first) start the replay gave:
    |forecast − actual| ÷ actual wait (p50, p90) over the ``jobs`` that waited longer than
    ``SCORED_WAIT_S``, and the share of all ``started`` jobs forecast whose start fell
    inside the interval."""

    jobs: int
    p50: float
    p90: float
    started: int
    inside: float

    def text(self) -> str:
        return (f"start forecast at submit: error p50 {self.p50:.0%}, p90 {self.p90:.0%} of the wait "
                f"({self.jobs} jobs that waited over {SCORED_WAIT_S / 60:.0f} min); "
                f"{self.inside:.0%} of {self.started} starts inside the interval")


def forecast_score(requests: Sequence[Request], outcomes: dict[int, Outcome]) -> ForecastScore | None:
    """The score of the forecasts ``outcomes`` carry (None when none does)."""
    errors, inside, started = [], 0, 0
    for r in requests:
        o = outcomes[r.key]
        # what was foretold is its first start: a job preempted or requeued starts again later
        began = o.started_s if o.first_started_s is None else o.first_started_s
        if o.forecast is None or began is None:
            continue
        at, early, late = o.forecast
        started += 1
        inside += (early is None or early - 1 <= began) and (late is None or began <= late + 1)
        wait = began - r.submit_s
        if wait > SCORED_WAIT_S:
            errors.append(abs(at - began) / wait)
    if not started:
        return None
    return ForecastScore(len(errors), percentile(errors, 50) if errors else 0.0,
                         percentile(errors, 90) if errors else 0.0, started, inside / started)


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f}"


def table(all_figures: Sequence[Figures]) -> str:
    """The side-by-side table, one column per policy."""
    rows = [("", [f.policy for f in all_figures]),
            ("utilisation (work served)", [f"{f.utilisation:.0%}" for f in all_figures]),
            ("  of it, jobs that end (not services)", [f"{f.utilisation_batch:.0%}" for f in all_figures]),
            ("held (cards allocated)", [f"{f.held:.0%}" for f in all_figures]),
            ("wait p50 / p95 / max (min)", [f"{minutes(f.wait_p50_s)} / {minutes(f.wait_p95_s)} / "
                                            f"{minutes(f.wait_max_s)}" for f in all_figures])]
    for size, _ in SIZES:
        if not any(f.waits_by_size.get(size) for f in all_figures):
            continue  # no job of that size in the month
        rows.append((f"  {size}: wait p50 / p95, never run",
                     [(lambda w: f"{minutes(w[0])} / {minutes(w[1])}, {w[3]} of {w[2]}")(
                         f.waits_by_size.get(size, (0, 0, 0, 0))) for f in all_figures]))
    rows += [("completion time, mean (h)", [f"{f.completion_mean_s / 3600:.1f}" for f in all_figures]),
             ("fairness (Jain)", [f"{f.fairness:.2f}" for f in all_figures]),
             ("waited over 24 h", [str(f.over_24h) for f in all_figures]),
             ("never run", [f"{f.never_run} ({f.never_run_pct:.1f}%)" for f in all_figures])]
    width = max(len(name) for name, _ in rows) + 2
    cols = [max(len(row[1][i]) for row in rows) + 2 for i in range(len(all_figures))]
    return "\n".join(name.ljust(width) + "".join(v.rjust(c) for v, c in zip(values, cols))
                     for name, values in rows)


def last_line(nebula: Figures, spreadsheet: Figures, slurm: Figures) -> str:
    return (f"lab month: wait p95 {minutes(nebula.wait_p95_s)} min (spreadsheet {minutes(spreadsheet.wait_p95_s)}, "
            f"slurm-like {minutes(slurm.wait_p95_s)}), never run {nebula.never_run_pct:.1f}% "
            f"({spreadsheet.never_run_pct:.1f}%, {slurm.never_run_pct:.1f}%), fairness {nebula.fairness:.2f} "
            f"({spreadsheet.fairness:.2f}, {slurm.fairness:.2f}), utilisation {nebula.utilisation:.0%} "
            f"({spreadsheet.utilisation:.0%}, {slurm.utilisation:.0%}){worst_class(nebula, slurm)}")


def worst_class(nebula: Figures, slurm: Figures) -> str:
    """", worst class: 3-4 cards p95 N min (slurm-like N)": the size whose p95 wait is
    furthest above slurm-like's (as a ratio; the largest p95 when none is above)."""
    def ratio(size: str) -> tuple[float, float]:
        ours, theirs = nebula.waits_by_size[size][1], slurm.waits_by_size.get(size, (0, 0, 0, 0))[1]
        return (ours / theirs if theirs else (math.inf if ours else 0.0), ours)
    sizes = [size for size, _ in SIZES if size in nebula.waits_by_size]
    if not sizes:
        return ""
    size = max(sizes, key=ratio)
    theirs = slurm.waits_by_size.get(size, (0, 0, 0, 0))[1]
    return (f", worst class: {size} p95 {minutes(nebula.waits_by_size[size][1])} min "
            f"(slurm-like {minutes(theirs)})")
