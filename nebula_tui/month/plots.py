"""A month's pictures: utilisation day by day and the wait CDF, per policy — as text for
the terminal (plotext, a dependency already), as a PNG for a person (matplotlib, the
optional ``plot`` extra), and as JSON."""

from __future__ import annotations

import re
from dataclasses import asdict
from pathlib import Path

from .compare import Comparison
from .metrics import Figures

CDF_POINTS = (10, 25, 50, 75, 90, 95, 99, 100)


class PlotError(RuntimeError):
    """No PNG can be drawn here; str() says what to install."""


def wait_cdf(f: Figures) -> tuple[list[float], list[float], float]:
    """The wait CDF of a policy over every runnable job: (hours each started job waited,
    sorted; the share of all runnable jobs started within it; the share never run). A job
    that never ran never reaches the curve, so it ends at 1 − never run, not at 1."""
    total = len(f.waits_s) + f.never_run
    hours = sorted(w / 3600 for w in f.waits_s)
    return hours, [(i + 1) / total for i in range(len(hours))], (f.never_run / total if total else 0.0)


def cdf_minutes(f: Figures, q: float) -> float | None:
    """The wait (minutes) within which ``q`` % of the runnable jobs started; None when
    fewer than that ever started (the jobs past it never ran)."""
    total = len(f.waits_s) + f.never_run
    if not total:
        return 0.0
    place = min(total - 1, int(q / 100 * total))
    return sorted(f.waits_s)[place] / 60 if place < len(f.waits_s) else None


def as_json(result: Comparison) -> dict:
    figures = []
    for f in result.figures:
        row = asdict(f)
        row.pop("waits_s")
        row["never_run_pct"] = f.never_run_pct
        # null past the share that ever started: those jobs never ran
        row["wait_cdf_min"] = {q: cdf_minutes(f, q) for q in CDF_POINTS}
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
    drawn = figure(result)
    drawn.savefig(path, dpi=110)
    from matplotlib import pyplot
    pyplot.close(drawn)


def figure(result: Comparison):
    """The PNG's matplotlib figure: utilisation per day, and the wait CDF whose curves stop
    short of 1 by the jobs that never ran (dotted on from there; the legend says the share)."""
    try:
        import matplotlib
    except ImportError:
        raise PlotError("--plot needs matplotlib: pip install 'nebula-tui[plot]' "
                        "(in this checkout: .venv/bin/pip install -e '.[plot]')") from None
    matplotlib.use("Agg")
    from matplotlib import pyplot

    drawn, (days, cdf) = pyplot.subplots(1, 2, figsize=(12, 4.5))
    for f in result.figures:
        days.plot(range(1, len(f.utilisation_by_day) + 1), [100 * u for u in f.utilisation_by_day],
                  label=f"{f.policy} ({f.utilisation:.0%})")
        waits, shares, never = wait_cdf(f)
        line, = cdf.plot(waits, shares, label=f"{f.policy} (never ran: {never:.1%})")
        if waits and never:  # where the curve stops short of 1: the jobs that never started
            cdf.hlines(shares[-1], waits[-1], max(waits[-1] * 10, 1.0), colors=line.get_color(),
                       linestyles="dotted")
    days.set(title="Work served per day", xlabel="day of the month", ylabel="% of the cards' memory-hours",
             ylim=(0, 100))
    cdf.set(title="Waits (CDF; jobs that never ran never reach it)", xlabel="hours from submit to start",
            ylabel="share of runnable jobs started", xscale="symlog", ylim=(0, 1))
    for axes in (days, cdf):
        axes.grid(alpha=0.3)
        axes.legend()
    drawn.suptitle(f"A lab month: {result.jobs} jobs on {result.cards} cards")
    drawn.tight_layout()
    return drawn
