"""bench/forecast_floor.py, the forecast's error floor that docs/lab-month.md reports: its
ideal forecast knows the built-in month's run-length distribution, given what a head sees
(a job's --time, how long it has run). Its draws must be that distribution, or the floor
is the floor of something else: checked against the jobs ``workload.lab_month`` draws."""

from __future__ import annotations

import importlib.util
import random
import statistics
from pathlib import Path

from nebula_tui.month import workload

REPO = Path(__file__).resolve().parents[2]


def _floor():
    spec = importlib.util.spec_from_file_location("forecast_floor", REPO / "bench" / "forecast_floor.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def _near(a: float, b: float, share: float) -> bool:
    return abs(a - b) <= share * b


def test_the_floors_draws_are_the_generators_run_lengths_given_what_the_head_sees():
    floor, rng = _floor(), random.Random(3)
    jobs = [r for r in workload.lab_month(80, 4, users=20, seed=11) if not r.service]
    timed = [r for r in jobs if r.time_limit_s]
    assert len(timed) > 1000
    # with --time: the share of it used, drawn from the limit alone, as the month drew it
    real = sorted(r.duration_s / r.time_limit_s for r in timed)
    drawn = sorted(floor.timed(rng, r.time_limit_s, 0.0) / r.time_limit_s for r in timed)
    for q in (0.1, 0.5, 0.9):
        assert _near(drawn[int(q * len(drawn))], real[int(q * len(real))], 0.05), q
    assert all(0.0 < d <= 1 / 1.5 + 1e-9 for d in drawn)
    # without: the log-normal beyond the time already run
    runs = [r.duration_s for r in jobs]
    for ran in (0.0, 3600.0):
        longer = sorted(d - ran for d in runs if d > ran)
        draws = sorted(floor.untimed(rng, ran) for _ in range(len(longer)))
        assert _near(statistics.median(draws), statistics.median(longer), 0.15), ran
        assert _near(draws[int(0.9 * len(draws))], longer[int(0.9 * len(longer))], 0.2), ran
    # a job that has run past what its limit allows it to be drawn as ends now
    assert floor.timed(rng, 3600.0, 3500.0) == 0.0


def test_the_ideal_point_minimises_the_mean_relative_error_and_the_bound_counts_a_share():
    floor = _floor()
    waits = [600.0, 1200.0, 2400.0, 4800.0, 96000.0]
    best = floor.ideal(waits)
    mean = lambda f: sum(abs(f - w) / w for w in waits) / len(waits)  # noqa: E731
    assert all(mean(best) <= mean(f) + 1e-12 for f in waits + [best * 1.1, best * 0.9, 10000.0])
    assert floor.best_share([1000.0, 1100.0, 5000.0], 0.2) == 2 / 3
