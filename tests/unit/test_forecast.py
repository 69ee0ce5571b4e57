"""The start forecast (head/forecast.py): the real scheduler run forward from a snapshot,
and its words (forecasts.starts_text)."""

from __future__ import annotations

import time

import pytest

from nebula_tui import forecasts
from nebula_tui.head import forecast
from nebula_tui.model import GpuReading, GpuView, Placement
from nebula_tui.scheduler import Booking, PendingJob, RunningJob, Snapshot

NOW = 1_800_000_000.0
MB = 24576


def card(node: str, index: int, held: tuple = ()) -> GpuView:
    reading = GpuReading(index=index, uuid=f"GPU-{node}-{index}", name="NVIDIA GeForce RTX 4090",
                         memory_total_mb=MB, compute_cap="8.9")
    return GpuView(node=node, reading=reading, placements=held, cuda_version="12.4")


def whole(job: int, node: str, index: int) -> tuple:
    return ((job, Placement(f"GPU-{node}-{index}", node, index, MB, True)),)


def lab(running: list[tuple[int, float, float | None]], queue: list[PendingJob], **more) -> Snapshot:
    """Two cards on node01; ``running``: (job, started_at, --time) each holding one card."""
    gpus, held = [], []
    for index in range(2):
        mine = [r for r in running if r[0] % 2 == index]
        placements = whole(mine[0][0], "node01", index) if mine else ()
        gpus.append(card("node01", index, placements))
        for job, started, limit in mine:
            held.append(RunningJob(job, "bob", placements[0][1:], started, limit))
    return Snapshot(gpus=tuple(gpus), queue=tuple(queue), now=NOW, running=tuple(held), **more)


def test_a_job_waits_for_the_running_one_to_end_and_the_interval_holds_the_point():
    snap = lab([(10, NOW - 600, 3600.0), (11, NOW - 600, 7200.0)],
               [PendingJob(1, "ann", 1, None, NOW, time_limit_s=3600.0)])
    start = forecast.forecast(snap)[1]
    # job 10 is expected to end at 40% of its hour; before the head learned anything, the
    # interval is the default factors of the (padded) wait
    assert start.simulated == start.at == NOW - 600 + 0.4 * 3600
    wait, pad = start.at - NOW, forecast.PAD_S
    low, high = forecast.DEFAULT_FACTORS
    assert start.early == NOW + max(0.0, low * (wait + pad) - pad)
    assert start.late == NOW + high * (wait + pad) - pad
    assert start.early <= start.at <= start.late
    assert start.node == "node01"


def test_the_calibration_stretches_the_interval_by_what_the_head_learned():
    """Jobs waited 2 to 5 times their simulated (padded) wait: the interval is the
    simulated wait stretched by the 10th and 90th percentiles of that ratio; the expected
    start stays the simulated one; a start on the pass of now stays now."""
    pad = forecast.PAD_S
    learned = forecast.Calibration()
    for ratio in [2.0] * 10 + [3.0] * 30 + [5.0] * 10:
        learned.learn(1200.0, ratio * (1200.0 + pad) - pad)
    assert learned.factors() == (1.0, 5.0)  # the early end is never after the simulated start
    snap = lab([(10, NOW - 600, 3600.0), (11, NOW - 600, 7200.0)],
               [PendingJob(1, "ann", 1, None, NOW, time_limit_s=3600.0)])
    start = forecast.forecast(snap, calibration=learned)[1]
    wait = start.simulated - NOW  # 840 s
    assert (start.early, start.at, start.late) == (start.simulated, start.simulated, NOW + 5.0 * (wait + pad) - pad)
    shorter = forecast.Calibration([(1200.0, 0.5 * (1200.0 + pad) - pad)] * 10 + [(1200.0, 1200.0)] * 30)
    assert shorter.factors() == (0.5, 1.0)
    # too few starts to learn from: the defaults
    assert forecast.Calibration([(1200.0, 6000.0)] * 5).factors() == forecast.DEFAULT_FACTORS
    # only the latest starts count
    old = forecast.Calibration([(0.0, 10 * pad)] * forecast.CALIBRATION_RUNS)
    assert old.factors() == (1.0, pytest.approx(11.0))
    for _ in range(forecast.CALIBRATION_RUNS):
        old.learn(0.0, 0.0)
    assert old.factors() == (1.0, 1.0)
    free = lab([(10, NOW - 600, 3600.0)], [PendingJob(1, "ann", 1, None, NOW, time_limit_s=3600.0)])
    assert forecast.forecast(free, calibration=learned)[1] == forecast.Start(NOW, NOW, NOW, node="node01",
                                                                             simulated=NOW)


def test_a_users_weight_grows_in_the_forecast_as_their_jobs_run():
    """ann's job 10 holds card 0 for its 10 h; carol's job 11 holds card 1 until 2 h from
    now. ann starts lighter than bob (1.00 against 1.01), but by then her running job
    charged her 2 GPU-hours (+0.04): bob's job takes the freed card first, as the head
    would give it."""
    from nebula_tui.scheduler import UserShare
    gpus = (card("node01", 0, whole(10, "node01", 0)), card("node01", 1, whole(11, "node01", 1)))
    running = (RunningJob(10, "ann", whole(10, "node01", 0)[0][1:], NOW, 25 * 3600.0),
               RunningJob(11, "carol", whole(11, "node01", 1)[0][1:], NOW, 5 * 3600.0))
    queue = (PendingJob(1, "ann", 1, None, NOW, time_limit_s=3600.0),
             PendingJob(2, "bob", 1, None, NOW, time_limit_s=3600.0))
    users = {"ann": UserShare("ann", 1.00), "bob": UserShare("bob", 1.01), "carol": UserShare("carol", 1.0)}
    starts = forecast.forecast(Snapshot(gpus=gpus, queue=queue, now=NOW, running=running, users=users))
    assert starts[2].at == NOW + 0.4 * 5 * 3600  # carol's card, when her job ends
    assert starts[1].at == starts[2].at + 0.4 * 3600  # after bob's


def test_jobs_queue_behind_each_other_in_the_order_the_scheduler_gives():
    snap = lab([(10, NOW, 3600.0), (11, NOW, 3600.0)],
               [PendingJob(1, "ann", 2, None, NOW, time_limit_s=3600.0),
                PendingJob(2, "ann", 2, None, NOW + 1, time_limit_s=3600.0)])
    starts = forecast.forecast(snap)
    assert starts[1].at == NOW + 0.4 * 3600
    assert starts[2].at == starts[1].at + 0.4 * 3600  # after job 1's expected run


def test_an_untimed_holder_is_named_and_a_job_never_free_is_not_within_the_horizon():
    snap = lab([(10, NOW - 100, None), (11, NOW - 100, None)],
               [PendingJob(1, "ann", 1, None, NOW, time_limit_s=600.0),
                PendingJob(2, "ann", 4, None, NOW, time_limit_s=600.0)])  # 4 cards: never here
    starts = forecast.forecast(snap)
    assert starts[1].after in (10, 11) and starts[1].at is not None
    assert starts[2].at is None
    text = forecasts.starts_text(starts[2].json(NOW), NOW)
    assert text == "not within 7 days"
    assert forecasts.starts_text(starts[1].json(NOW), NOW).startswith(f"after job {starts[1].after} ends (~")


def test_a_booking_keeps_its_cards_until_it_ends():
    booked = Booking("paper", frozenset({"GPU-node01-0", "GPU-node01-1"}), NOW, NOW + 7200,
                     frozenset({"carol"}), "node01:0-1 booked for paper")
    snap = lab([], [PendingJob(1, "ann", 1, None, NOW, time_limit_s=600.0)], bookings=(booked,))
    start = forecast.forecast(snap)[1]
    assert start.at == NOW + 7200


def test_only_one_job_stops_each_run_once_it_started():
    snap = lab([(10, NOW, 3600.0), (11, NOW, 3600.0)],
               [PendingJob(1, "ann", 1, None, NOW, time_limit_s=3600.0),
                PendingJob(2, "ann", 1, None, NOW, time_limit_s=3600.0)])
    assert set(forecast.forecast(snap, only=1)) == {1}
    assert forecast.forecast(snap, only=1)[1] == forecast.forecast(snap)[1]


def test_the_run_length_is_the_limit_or_the_users_history():
    assert forecast.run_length(3600.0, (), None, "late") == 3600.0
    assert forecast.run_length(3600.0, (), None, "point") == 0.4 * 3600.0
    # without --time: the median of how long its user's like jobs ran, else an hour
    assert forecast.run_length(None, (600.0, 1200.0, 6000.0), None, "point") == 1200.0
    assert forecast.run_length(None, (), None, "point") == forecast.UNTIMED_POINT_S
    assert forecast.run_length(None, (600.0,), 86400.0, "late") == 86400.0
    assert forecast.run_length(None, (600.0,), None, "late") == forecast.HORIZON_S
    # a service without history runs past the horizon
    assert forecast.run_length(None, (), None, "point", service=True) == forecast.HORIZON_S


def test_a_waiting_untimed_job_runs_as_its_users_history_says():
    snap = lab([(10, NOW, 3600.0), (11, NOW, 3600.0)],
               [PendingJob(1, "ann", 2, None, NOW), PendingJob(2, "bob", 2, None, NOW + 1, time_limit_s=600.0)])
    plain = forecast.forecast(snap)
    known = forecast.forecast(snap, history={("ann", 2, None): (900.0,)})
    assert plain[1].at == known[1].at == NOW + 0.4 * 3600
    assert plain[2].at == plain[1].at + forecast.UNTIMED_POINT_S  # no history: an hour
    assert known[2].at == known[1].at + 900  # ann's like jobs ran 15 min


def test_a_job_that_ran_past_the_median_of_its_like_runs_is_expected_to_run_on():
    """Residual life: bob's like runs without --time were five short (5–25 min) and five
    long (5.5–17 h). His job that has run 3.3 h, past their median, is not expected to end
    in as long again as it ran (3.3 h more) but in what the runs longer than it say: the
    median of L − 3.3 h over them (the five long ones: 11.1 h − 3.3 h)."""
    runs = (300.0, 600.0, 900.0, 1200.0, 1500.0, 20000.0, 30000.0, 40000.0, 50000.0, 60000.0)
    ran = 12000.0
    snap = lab([(10, NOW - ran, None), (11, NOW, 360000.0)], [PendingJob(1, "ann", 1, None, NOW, time_limit_s=600.0)])
    start = forecast.forecast(snap, history={("bob", 1, None): runs})[1]
    assert start.at == NOW + 40000.0 - ran
    assert start.after == 10  # it waits for bob's untimed job
    # one that has run only a minute is expected to end by the like runs' median
    assert forecast.end_of(snap.running[0], NOW - ran + 60, None, runs,
                           forecast.History({("bob", 1, None): runs})) == NOW - ran + 1500.0


def test_a_job_with_time_is_expected_to_use_what_the_labs_jobs_used_of_theirs():
    """The lab's jobs with --time used 10% (six) or 90% (five) of it. One that has run
    half its hour is expected to run to 90% of it (not half-way to its limit: 75%); one
    not yet started, the median share of all: 10%."""
    shares = (0.1,) * 6 + (0.9,) * 5
    snap = lab([(10, NOW - 1800.0, 3600.0), (11, NOW, 36000.0)],
               [PendingJob(1, "ann", 1, None, NOW, time_limit_s=3600.0),
                PendingJob(2, "ann", 1, None, NOW, time_limit_s=3600.0)])
    past = forecast.History(shares=shares)
    starts = forecast.forecast(snap, history=past)
    assert starts[1].at == NOW - 1800.0 + 0.9 * 3600.0
    assert starts[2].at == starts[1].at + 0.1 * 3600.0
    # without that history: 40% of the limit, then half-way to it
    assert forecast.forecast(snap)[1].at == NOW + 0.5 * 1800.0


def test_runs_still_going_count_in_the_residual_life():
    """Five like runs ended (1000–5000 s), five more still run past 6000 s: the
    product-limit estimate puts the median at 5000 s, not at the ended runs' 3000 s; with
    fewer than MIN_TAIL runs longer than it has run, none."""
    ended = (1000.0, 2000.0, 3000.0, 4000.0, 5000.0)
    assert forecast.residual(ended, 0.0) == 3000.0
    assert forecast.residual(ended, 0.0, (6000.0,) * 5) == 5000.0
    assert forecast.residual(ended, 1500.0) is None


def test_the_words_of_a_forecast():
    now = time.time()
    at = {"start_at": now + 3600, "early": now + 1800, "late": now + 7200, "after_job": None}
    hhmm = lambda t: time.strftime("%H:%M", time.localtime(t))  # noqa: E731
    assert forecasts.starts_text(at, now) == f"~{hhmm(now + 3600)}, {hhmm(now + 1800)}–{hhmm(now + 7200)}"
    assert forecasts.starts_text({**at, "start_at": now + 5, "early": now}, now) == "now"
    assert forecasts.starts_text({**at, "late": None}, now).endswith("–later")
    assert forecasts.starts_text(None, now) == ""
