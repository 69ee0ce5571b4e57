"""A job's status carries the data of its state, and each change is one transition.

The head is the real ``Engine`` over a real store (``inprocess``); the nodes' reports are
the nodelet's messages, fed directly.
"""

from __future__ import annotations

import asyncio
import getpass

import pytest

from nebula_tui import views
from nebula_tui.model import (Cancelling, Ended, Evicting, Job, JobSpec, JobState, Launching,
                              Pending, Placement, Running)

ME = getpass.getuser()
CARD = {n: Placement(f"GPU-{n}-0", n, 0, 81920, True) for n in ("node01", "node02")}


def place(head, spec: JobSpec, nodes=("node01",)) -> Job:
    """Submit a job and start it on GPU 0 of ``nodes`` (as a pass's Start would)."""
    job = head.submit(ME, spec)
    head.transitions.begin_launch(head.jobs[job.id], tuple(CARD[n] for n in nodes))
    return head.jobs[job.id]


def report(head, job_id: int, node: str, kind: str, **fields) -> None:
    job = head.jobs[job_id]
    head.on_node_message(node, {"type": kind, "job": job_id, "token": head.state.token(job), **fields})


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_a_state_that_cannot_be_cannot_be_written_down():
    card = CARD["node01"]
    with pytest.raises(ValueError, match="at least one placement"):
        Launching(())
    with pytest.raises(ValueError, match="at least one placement"):
        Running((), started_at=1.0)
    with pytest.raises(ValueError, match="not running"):
        Ended(JobState.RUNNING, ended_at=1.0)
    with pytest.raises(ValueError, match="only a launching or running job"):
        Cancelling(Pending(), by="bob", since=1.0)
    with pytest.raises(TypeError, match="not a job status"):
        Job(1, "u", JobSpec(command=("true",)), 0.0, status="running")
    waiting = Job(1, "u", JobSpec(command=("true",)), 0.0, status=Pending("needs 2 GPUs", "bob"))
    assert (waiting.state, waiting.placements, waiting.node, waiting.held_by) == (
        JobState.PENDING, (), None, "bob")
    stopping = Job(1, "u", waiting.spec, 0.0, status=Evicting(Running((card,), 5.0), "GPU isolated"))
    assert (stopping.state, stopping.node, stopping.started_at) == (JobState.RUNNING, "node01", 5.0)


async def test_a_gang_ends_when_every_part_has_and_a_requeue_forgets_the_parts(engine):
    job = place(engine, JobSpec(command=("true",), gpu_count=2, nodes=2), ("node01", "node02"))
    report(engine, job.id, "node01", "started")
    report(engine, job.id, "node01", "exit", code=0)
    status = engine.jobs[job.id].status
    assert isinstance(status, Running) and status.exits == (("node01", 0),)

    engine.transitions.requeue(engine.jobs[job.id], "lost with node node02; requeued")
    again = engine.jobs[job.id]
    assert again.status == Pending("lost with node node02; requeued") and again.attempt == 1
    assert engine.store.job(job.id).status == again.status and engine.state.jobs.holding == {}

    engine.transitions.begin_launch(again, (CARD["node01"], CARD["node02"]))
    report(engine, job.id, "node02", "exit", code=0)  # the first attempt's node01 exit is gone
    assert engine.jobs[job.id].state == JobState.LAUNCHING
    report(engine, job.id, "node01", "exit", code=3)
    done = engine.job(job.id)
    assert isinstance(done.status, Ended) and (done.state, done.exit_code) == (JobState.FAILED, 3)


async def test_a_gang_is_running_once_every_node_confirmed_its_launch(engine):
    job = place(engine, JobSpec(command=("true",), gpu_count=2, nodes=2), ("node01", "node02"))
    await settle()  # the QuietNodes confirm both launches
    status = engine.jobs[job.id].status
    assert isinstance(status, Running) and status.placements == (CARD["node01"], CARD["node02"])
    assert [op for op, _ in engine.links["node02"].requests].count("launch") == 1


async def test_a_cancel_is_kept_with_who_and_when_and_ends_the_job_cancelled(engine):
    job = place(engine, JobSpec(command=("sleep", "60")))
    report(engine, job.id, "node01", "started")
    await engine.cancel("root", job.id)
    status = engine.jobs[job.id].status
    assert isinstance(status, Cancelling) and status.by == "root"
    assert engine.store.job(job.id).status == status  # a restarted head still knows
    shown = views.job_json(engine.jobs[job.id])
    assert (shown["state"], shown["phase"], shown["cancel_by"]) == ("running", "cancelling", "root")
    report(engine, job.id, "node01", "exit", code=None)
    assert engine.job(job.id).state == JobState.CANCELLED


async def test_an_evicted_job_that_exits_is_requeued_as_its_next_attempt(engine):
    job = place(engine, JobSpec(command=("sleep", "60")))
    report(engine, job.id, "node01", "started")
    assert engine.transitions.evict(engine.jobs[job.id], "GPU node01:0 was isolated (Xid 48)")
    assert views.job_json(engine.jobs[job.id])["phase"] == "evicting"
    report(engine, job.id, "node01", "exit", code=0)
    await settle()
    again = engine.jobs[job.id]
    assert again.status == Pending("requeued: GPU node01:0 was isolated (Xid 48)")
    assert again.attempt == 1


async def test_a_cancel_during_an_eviction_ends_the_job_cancelled_not_requeued(engine):
    job = place(engine, JobSpec(command=("sleep", "60")))
    report(engine, job.id, "node01", "started")
    engine.transitions.evict(engine.jobs[job.id], "GPU node01:0 was isolated (Xid 48)")
    await engine.cancel(ME, job.id)
    assert isinstance(engine.jobs[job.id].status, Cancelling)
    report(engine, job.id, "node01", "exit", code=0)
    await settle()
    assert job.id not in engine.jobs and engine.job(job.id).state == JobState.CANCELLED
