"""A month's pictures: utilisation day by day and the wait CDF, per policy — as text for
the terminal (plotext, a dependency already), as a PNG for a person (matplotlib, the
optional ``plot`` extra), and as JSON."""

from __future__ import annotations

import re
from dataclasses import asdict
from pathlib import Path

from .compare import Comparison
from .metrics import percentile

CDF_POINTS = (10, 25, 50, 75, 90, 95, 99, 100)


class PlotError(RuntimeError):
    """No PNG can be drawn here; str() says what to install."""


def as_json(result: Comparison) -> dict:
    figures = []
    for f in result.figures:
        row = asdict(f)
        row.pop("waits_s")
        row["never_run_pct"] = f.never_run_pct
        row["wait_cdf_min"] = {q: percentile(f.waits_s, q) / 60 for q in CDF_POINTS}
        figures.append(row)
    return {"jobs": result.jobs, "cards": result.cards, "seconds": result.seconds, "policies": figures,
            "forecast": asdict(result.forecast) if result.forecast else None}


def text_chart(result: Comparison, width: int = 78, height: int = 14, color: bool = False) -> str:
    """Utilisation per day for each policy, drawn in the terminal's characters."""
    import plotext as plt

    plt.clear_figure()
    plt.plotsize(width, height)
    plt.title("work served per day (share of the cards' memory-hours)")
    for f in result.figures:
        plt.plot(list(range(1, len(f.utilisation_by_day) + 1)), [100 * u for u in f.utilisation_by_day],
                 label=f.policy)
    plt.xlabel("day")
    plt.ylim(0, 100)
    plt.theme("clear")
    drawn = plt.build()
    return drawn if color else re.sub(r"\x1b\[[0-9;]*m", "", drawn)


def png(result: Comparison, path: Path) -> None:
    try:
        import matplotlib
    except ImportError:
        raise PlotError("--plot needs matplotlib: pip install 'nebula-tui[plot]' "
                        "(in this checkout: .venv/bin/pip install -e '.[plot]')") from None
    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, (days, cdf) = pyplot.subplots(1, 2, figsize=(12, 4.5))
    for f in result.figures:
        days.plot(range(1, len(f.utilisation_by_day) + 1), [100 * u for u in f.utilisation_by_day],
                  label=f"{f.policy} ({f.utilisation:.0%})")
        waits = sorted(w / 3600 for w in f.waits_s)
        if waits:
            cdf.plot(waits, [(i + 1) / len(waits) for i in range(len(waits))], label=f.policy)
    days.set(title="Work served per day", xlabel="day of the month", ylabel="% of the cards' memory-hours",
             ylim=(0, 100))
    cdf.set(title="Waits (CDF)", xlabel="hours from submit to start", ylabel="share of jobs", xscale="symlog",
            ylim=(0, 1))
    for axes in (days, cdf):
        axes.grid(alpha=0.3)
        axes.legend()
    figure.suptitle(f"A lab month: {result.jobs} jobs on {result.cards} cards")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    pyplot.close(figure)
