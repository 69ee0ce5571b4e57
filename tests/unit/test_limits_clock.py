"""Time limits and idle cards on the head's own clocks: a real in-process head whose wall
and monotonic clocks the test moves, its nodes' requests kept (``QuietNode``). What took the
lab tests seconds of real waiting (tests/lab/test_limits_e2e.py keeps one of each end to
end) is here a step of the clock: the rule, its moment and its words."""

from __future__ import annotations

import asyncio

import pytest
from support.inprocess import gpu_row, probe, up_engine

from nebula_tui.model import JobSpec, JobState, Placement, Stopping

LIMITS = "limits:\n  idle_after: 10m\n  idle_action: cancel\n  idle_grace: 30m\n"


@pytest.fixture
async def clocked(tmp_path):
    """A head of two nodes with idle_after 10 min (cancel after 30 more), and its clocks:
    ``wall`` (the head's ``clock``) and ``mono`` (its ``monotonic``), both the test's."""
    wall, mono = [1_800_000_000.0], [5_000.0]
    head = up_engine(tmp_path, LIMITS, clock=lambda: wall[0])
    head.state.monotonic = lambda: mono[0]
    yield head, wall, mono
    await head.stop()
    head.state.store.close()


def running(head, **spec) -> int:
    """A job of one card on node01's first, running now."""
    job = head.submit("alice", JobSpec(command=("sleep", "9999"), **spec))
    head.transitions.begin_launch(head.jobs[job.id], (Placement("GPU-node01-0", "node01", 0, 81920, True),))
    head.transitions.mark_running(head.jobs[job.id])
    return job.id


def step(wall: list[float], mono: list[float], seconds: float) -> None:
    wall[0] += seconds
    mono[0] += seconds


async def after(head, wall: list[float], mono: list[float], seconds: float) -> None:
    """``seconds`` later on both clocks, the limits checked and what they spawned run."""
    step(wall, mono, seconds)
    head.limits.check()
    await settle()


async def settle() -> None:
    """Let the tasks the head spawned (a stop's signal to the node) take their turns."""
    for _ in range(10):
        await asyncio.sleep(0)


def signals(head, job_id: int) -> list[str]:
    """The signals the head has sent the job's node for it, in order."""
    return [fields["signal"] for op, fields in head.links["node01"].requests
            if op == "signal" and fields["job"] == job_id]


async def test_a_job_is_stopped_at_its_time_limit_to_the_second_of_the_heads_clock(clocked):
    head, wall, mono = clocked
    job = running(head, time_limit_s=3600.0)
    await after(head, wall, mono, 3599)
    assert signals(head, job) == [] and not isinstance(head.jobs[job].status, Stopping)
    await after(head, wall, mono, 1)
    assert signals(head, job) == ["USR1"]
    stopping = head.jobs[job].status
    assert isinstance(stopping, Stopping) and stopping.ends == JobState.TIMEOUT
    assert stopping.why == "stopped at its time limit (--time 60 min)"
    assert stopping.kill_at == wall[0] + head.limits.grace_s  # SIGKILL after the grace, on its clock


async def test_a_step_of_the_wall_clock_stops_nobody_early(clocked):
    head, wall, mono = clocked
    job = running(head, time_limit_s=3600.0)
    wall[0] += 7200  # date -s, NTP: the wall clock jumps two hours, no time passes
    head.limits.check()
    await settle()
    assert signals(head, job) == []


async def test_an_idle_job_is_marked_then_warned_then_cancelled_by_the_heads_clock(clocked):
    head, wall, mono = clocked
    job = running(head)
    head.on_node_message("node01", probe("node01", [gpu_row("node01", i, util=0) for i in range(2)]))
    assert head.jobs[job].status.idle_since == wall[0]  # marked at once, for people
    step(wall, mono, 599)
    head.limits.check()
    assert not [e for e in head.state.store.events(job_id=job) if f"job {job} is idle" in e["message"]]
    step(wall, mono, 1)
    head.limits.check()
    warned = [e["message"] for e in head.state.store.events(job_id=job) if f"job {job} is idle" in e["message"]]
    assert warned and warned[0].endswith("it will be cancelled in 30 min unless it uses them")
    await after(head, wall, mono, 1799)
    assert signals(head, job) == []
    await after(head, wall, mono, 1)
    assert signals(head, job) == ["USR1"]
    stopping = head.jobs[job].status
    assert isinstance(stopping, Stopping) and stopping.ends == JobState.CANCELLED
    assert stopping.why.startswith("cancelled: idle 40 min")


async def test_a_card_busy_again_clears_the_mark_and_restarts_the_count(clocked):
    head, wall, mono = clocked
    job = running(head)
    head.on_node_message("node01", probe("node01", [gpu_row("node01", i, util=0) for i in range(2)]))
    step(wall, mono, 500)
    head.on_node_message("node01", probe("node01", [gpu_row("node01", 0, util=90), gpu_row("node01", 1)]))
    assert head.jobs[job].status.idle_since is None
    head.on_node_message("node01", probe("node01", [gpu_row("node01", i, util=0) for i in range(2)]))
    step(wall, mono, 500)  # 1000 s since the first mark, 500 since the second
    head.limits.check()
    assert not [e for e in head.state.store.events(job_id=job) if f"job {job} is idle" in e["message"]]


async def test_a_step_of_the_wall_clock_cancels_no_idle_job(clocked):
    head, wall, mono = clocked
    job = running(head)
    head.on_node_message("node01", probe("node01", [gpu_row("node01", i, util=0) for i in range(2)]))
    wall[0] += 7200  # two hours on the wall clock, a moment of its idleness
    head.limits.check()
    await settle()
    assert not [e for e in head.state.store.events(job_id=job) if f"job {job} is idle" in e["message"]]
    assert signals(head, job) == []


async def test_a_card_that_reports_no_utilisation_is_idle_unknown_and_never_cancelled(clocked):
    """N/A utilisation cannot tell an idle job from a busy one: the job says "idle unknown"
    and is neither marked, warned nor cancelled, hours past idle_after and idle_grace; read
    again as idle, it is marked at once and no longer unknown. (The nodelet's parsers that
    read N/A are tests/lab/test_limits_e2e.py's, end to end.)"""
    head, wall, mono = clocked
    job = running(head)
    unread = [{**gpu_row("node01", i), "utilization_pct": None} for i in range(2)]
    head.on_node_message("node01", probe("node01", unread))
    status = head.jobs[job].status
    assert (status.idle_since, status.idle_unknown) == (None, True)
    for _ in range(3):  # an hour each: past idle_after (10 min) and idle_grace (30 min) twice
        head.on_node_message("node01", probe("node01", unread))
        await after(head, wall, mono, 3600)
    assert signals(head, job) == [] and not isinstance(head.jobs[job].status, Stopping)
    assert not [e for e in head.state.store.events(job_id=job) if f"job {job} is idle" in e["message"]]
    head.on_node_message("node01", probe("node01", [gpu_row("node01", i, util=0) for i in range(2)]))
    status = head.jobs[job].status
    assert (status.idle_since, status.idle_unknown) == (wall[0], False)
