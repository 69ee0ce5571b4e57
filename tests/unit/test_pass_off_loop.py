"""A pass over a long queue decides off the head's loop: requests are answered meanwhile,
and what changed under the pass is never overruled by its decisions.

The real ``Engine`` over a real store file (``inprocess``: two up nodes of two A100s, links
that record the launches). The pass's thread is held at a gate while the test changes the
head on its loop, so the order of events is fixed, not left to timing.
"""

from __future__ import annotations

import asyncio
import getpass
import threading


from nebula_tui.model import JobSpec, JobState

ME = getpass.getuser()


def held_pass(head) -> tuple[threading.Event, threading.Event]:
    """Every pass decides off the loop and waits at a gate first: (entered, release)."""
    head.scheduling.threaded_from = 1
    entered, release = threading.Event(), threading.Event()
    decide = head.scheduling._decide

    def gated(snapshot):
        entered.set()
        assert release.wait(10), "the test never opened the gate"
        return decide(snapshot)

    head.scheduling._decide = gated
    return entered, release


async def until(event: threading.Event) -> None:
    for _ in range(500):
        if event.is_set():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the pass never reached its thread")


def launched(head) -> set[int]:
    return {fields["job"] for link in head.links.values() for op, fields in link.requests
            if op == "launch"}


async def test_a_submit_is_answered_while_a_pass_decides(engine):
    first = engine.submit(ME, JobSpec(command=("true",), gpu_count=1))
    entered, release = held_pass(engine)
    passing = asyncio.ensure_future(engine.scheduling.pass_now())
    await until(entered)
    # The pass is under way, and will be until the gate opens: the submit is answered anyway.
    second = await asyncio.wait_for(engine.submit_on_disk(ME, JobSpec(command=("true",))), 5)
    assert not passing.done() and second.id > first.id
    release.set()
    await passing
    assert engine.jobs[first.id].state == JobState.LAUNCHING
    assert engine.jobs[second.id].state == JobState.PENDING  # not in that pass's snapshot


async def test_a_job_cancelled_during_the_pass_is_not_started_by_it(engine):
    kept = engine.submit(ME, JobSpec(command=("true",), gpu_count=1))
    gone = engine.submit(ME, JobSpec(command=("true",), gpu_count=1))
    entered, release = held_pass(engine)
    passing = asyncio.ensure_future(engine.scheduling.pass_now())
    await until(entered)
    await engine.cancel(ME, gone.id)
    engine.state._wake.clear()
    release.set()
    await passing
    assert engine.jobs.get(gone.id) is None and engine.job(gone.id).state == JobState.CANCELLED
    assert engine.jobs[kept.id].state == JobState.LAUNCHING
    await asyncio.sleep(0.05)  # the launches' tasks
    assert launched(engine) == {kept.id}
    assert engine.state._wake.is_set()  # a pass follows for what changed


async def test_a_start_on_a_node_drained_during_the_pass_is_not_made(engine):
    jobs = [engine.submit(ME, JobSpec(command=("true",), gpu_count=2)) for _ in range(2)]
    entered, release = held_pass(engine)
    passing = asyncio.ensure_future(engine.scheduling.pass_now())
    await until(entered)
    engine.set_drained(ME, "node01", True, "maintenance")
    release.set()
    await passing
    states = {j.id: engine.jobs[j.id] for j in jobs}
    started = [j for j in states.values() if j.state == JobState.LAUNCHING]
    assert [{p.node for p in j.placements} for j in started] == [{"node02"}]
    assert sum(j.state == JobState.PENDING for j in states.values()) == 1

    # The next pass, on the loop as a short queue's, sees the drain itself.
    engine.scheduling.threaded_from = 100
    engine.scheduling.schedule_pass()
    assert sum(j.state == JobState.PENDING for j in (engine.jobs[x.id] for x in jobs)) == 1
