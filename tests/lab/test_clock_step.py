"""A step of the head's wall clock (NTP, an admin's `date -s`) is not time that passed: a
node silent for 8 s while the clock jumps 700 s keeps its jobs (the review's job was
requeued and ran twice). That a step stops no job before its time limit and cancels no idle
job is the head's rule on its own clocks: tests/unit/test_limits_clock.py steps them."""

from __future__ import annotations

import time

import pytest

from labkit.harness import wait_for
from support.reliability import needs_own_clock
from labkit.harness import HeadProcess
from support.head import submit


def node_state(head, name: str) -> str:
    return next(n for n in head.call("status")["nodes"] if n["name"] == name)["state"]


@pytest.mark.slow
def test_a_wall_clock_step_during_a_short_silence_requeues_nothing(openssh_lab, tmp_path):
    needs_own_clock()
    head = HeadProcess(tmp_path / "home", openssh_lab, own_clock=True)  # lease: 600 s
    head.start()
    try:
        job = submit(head, "--gpu-mem", "4G", "--", "sleep", "120")
        node = wait_for(lambda: (j := head.job(job))["state"] == "running" and j["node"], 20,
                        what="the job running")
        openssh_lab.stop_node(node)
        silent = time.monotonic()
        try:
            wait_for(lambda: node_state(head, node) == "unknown", 20, what="the node unknown")
            head.step_clock(+700)
            time.sleep(max(0.0, 8 - (time.monotonic() - silent)))
            assert head.job(job)["state"] == "running"
        finally:
            openssh_lab.start_node(node)
        wait_for(lambda: node_state(head, node) == "up", 30, what="the node back")
        time.sleep(2)  # a pass or two, and the reconcile
        after = head.job(job)
        assert (after["state"], after["node"], after["attempt"]) == ("running", node, 0)
        events = " ".join(e["message"] for e in head.call("events", limit=300)["events"])
        assert "lost with node" not in events and "stale copy" not in events
        assert head.run("cancel", str(job)).returncode == 0
        assert head.wait_job(job)["state"] == "cancelled"
    finally:
        head.stop()


@pytest.mark.slow
def test_a_wall_clock_step_neither_cancels_an_idle_job_nor_kills_an_over_user_early(openssh_lab, tmp_path):
    """Idle for a moment, over its reservation for a moment: with an hour of idleness and an
    hour of over-use allowed, two hours of wall clock that did not pass act on neither."""
    needs_own_clock()
    from support.labfixtures import lab_config

    config = lab_config(openssh_lab, "clock-limits", limits={
        "memory_overuse": "kill", "memory_grace": "1h", "idle_after": "1h",
        "idle_action": "cancel", "idle_grace": "2s"})
    head = HeadProcess(tmp_path / "home", openssh_lab, config=config, own_clock=True)
    head.start()
    try:
        idle = submit(head, "--gpu-mem", "4G", "--", "env", "NEBULA_SIM_GPU_UTIL=0", "sleep", "120")
        greedy = submit(head, "--gpu-mem", "4G", "--", "env", "NEBULA_SIM_GPU_MEM=8G", "sleep", "120")
        wait_for(lambda: head.job(idle)["idle_since"], 20, what="the idle mark")
        events = lambda: " ".join(e["message"] for e in head.call("events", limit=300)["events"])
        wait_for(lambda: f"job {greedy} holds 8 GB" in events(), 20, what="the guard's warning")
        head.step_clock(+7200)
        time.sleep(8)  # a second's wait for the step, passes, the idle grace twice over
        assert (head.job(idle)["state"], head.job(greedy)["state"]) == ("running", "running")
        assert f"job {idle} is idle" not in events()
        for job in (idle, greedy):
            assert head.run("cancel", str(job)).returncode == 0
    finally:
        head.stop()
