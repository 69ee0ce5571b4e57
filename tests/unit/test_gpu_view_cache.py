"""The head keeps each GPU's view, and each running job's scheduler view, between passes:
a pass at 4,000 cards must not rebuild every card, and must never see one as it was.

The real ``Engine`` over a real store file (``inprocess``: two up nodes of two A100s, links
that answer launches with nothing). Each test changes the head the way it really changes
(a probe, a start, an end, an isolation, a drain, a node's hello) and checks that the
view of the card it touched is made again and that every other card's is the very object
the last pass had: the first half fails where the invalidation is missing, the second
where nothing is kept.
"""

from __future__ import annotations

import getpass

from support.inprocess import gpu_row, probe

from nebula_tui.head.state import Maintenance
from nebula_tui.model import JobSpec, JobState

ME = getpass.getuser()
CARDS = ("GPU-node01-0", "GPU-node01-1", "GPU-node02-0", "GPU-node02-1")


def views(engine) -> dict:
    """Every GPU's view as a pass is given it."""
    return {v.uuid: v for v in engine.scheduling.snapshot_for([]).gpus}


def only_changed(before: dict, after: dict, changed: set[str]) -> None:
    """The views of ``changed`` are new; every other is the one ``before`` had."""
    assert set(before) == set(after) == set(CARDS)
    for uuid in CARDS:
        if uuid in changed:
            assert after[uuid] is not before[uuid], f"{uuid}'s view was not made again"
        else:
            assert after[uuid] is before[uuid], f"{uuid}'s view was rebuilt though nothing changed"


async def test_a_card_is_viewed_again_after_a_probe_of_its_node_and_only_then(engine):
    before = views(engine)
    assert views(engine) == before and all(views(engine)[u] is before[u] for u in CARDS)
    engine.on_node_message("node02", probe("node02", [gpu_row("node02", 0, util=97, used=4096),
                                                      gpu_row("node02", 1, util=12)]))
    after = views(engine)
    only_changed(before, after, {"GPU-node02-0", "GPU-node02-1"})
    assert after["GPU-node02-0"].reading.utilization_pct == 97.0
    assert after["GPU-node02-0"].reading.memory_used_mb == 4096
    assert after["GPU-node02-1"].reading.utilization_pct == 12.0


async def test_a_start_and_an_end_show_on_the_card_they_took(engine):
    before = views(engine)
    job = engine.submit(ME, JobSpec(command=("true",), gpu_count=1))
    engine.scheduling.schedule_pass()
    started = engine.jobs[job.id]
    assert started.state == JobState.LAUNCHING
    (uuid,) = [p.gpu_uuid for p in started.placements]
    during = views(engine)
    only_changed(before, during, {uuid})
    assert [j for j, _ in during[uuid].placements] == [job.id]
    running = {r.id: r for r in engine.scheduling.snapshot_for([]).running}
    assert running[job.id].placements == started.placements

    node = started.placements[0].node  # the node says it ended: its card is given back
    engine.on_node_message(node, {"type": "exit", "job": str(job.id), "token": started.launch_token,
                                  "code": 0, "reason": None})
    assert engine.jobs.get(job.id) is None
    after = views(engine)
    only_changed(during, after, {uuid})
    assert after[uuid].placements == ()
    assert job.id not in {r.id for r in engine.scheduling.snapshot_for([]).running}


async def test_a_running_jobs_view_is_kept_until_the_job_changes(engine):
    job = engine.submit(ME, JobSpec(command=("true",), gpu_count=1))
    engine.scheduling.schedule_pass()
    first = {r.id: r for r in engine.scheduling.snapshot_for([]).running}[job.id]
    assert {r.id: r for r in engine.scheduling.snapshot_for([]).running}[job.id] is first
    engine.transitions.mark_running(engine.jobs[job.id])  # the node said it runs: a new Job
    again = {r.id: r for r in engine.scheduling.snapshot_for([]).running}[job.id]
    assert again is not first and again.started_at == engine.jobs[job.id].started_at


async def test_an_isolated_card_is_blocked_at_once_and_free_again_once_resumed(engine):
    before = views(engine)
    engine.state.set_maintenance("GPU-node01-1", Maintenance("ECC errors"))
    isolated = views(engine)
    only_changed(before, isolated, {"GPU-node01-1"})
    assert isolated["GPU-node01-1"].maintenance
    assert isolated["GPU-node01-1"].blocked == "GPU in maintenance: ECC errors"
    engine.state.set_maintenance("GPU-node01-1", None)
    resumed = views(engine)
    only_changed(isolated, resumed, {"GPU-node01-1"})
    assert resumed["GPU-node01-1"].blocked is None and not resumed["GPU-node01-1"].maintenance


async def test_a_drained_node_and_a_new_driver_are_seen_on_every_card_of_that_node(engine):
    before = views(engine)
    engine.set_drained(engine.owner, "node01", True, "new cables")
    drained = views(engine)
    only_changed(before, drained, {"GPU-node01-0", "GPU-node01-1"})
    assert drained["GPU-node01-0"].blocked == "node node01 is drained"
    engine.on_node_message("node02", {"type": "hello", "hostname": "node02",
                                      "smi_table": "CUDA Version: 12.8"})
    hello = views(engine)
    only_changed(drained, hello, {"GPU-node02-0", "GPU-node02-1"})
    assert hello["GPU-node02-1"].cuda_version == "12.8"


async def test_the_waiting_and_holding_lists_follow_every_change_of_the_job_table(engine):
    """A pass's lists of waiting and holding jobs (a walk over every unfinished job) are
    kept while the job table is unchanged, and made again after any change to it."""
    sched = engine.scheduling

    def lists() -> tuple[list[int], list[int]]:
        waiting, holding = sched._jobs_lists()
        assert [j.id for j in sched.waiting()] == [j.id for j in waiting]
        return [j.id for j in waiting], [j.id for j in holding]

    first = engine.submit(ME, JobSpec(command=("true",), gpu_count=1))
    assert sched._jobs_lists()[0] is sched._jobs_lists()[0]  # nothing changed: the same list
    assert lists() == ([first.id], [])
    second = engine.submit(ME, JobSpec(command=("true",), gpu_count=1))
    assert lists() == ([first.id, second.id], [])
    await engine.hold_job(ME, second.id, True)
    assert lists() == ([first.id], [])
    engine.scheduling.schedule_pass()
    assert engine.jobs[first.id].state == JobState.LAUNCHING
    assert lists() == ([], [first.id])
    await engine.hold_job(ME, second.id, False)
    assert lists() == ([second.id], [first.id])
    started = engine.jobs[first.id]
    engine.on_node_message(started.placements[0].node, {
        "type": "exit", "job": str(first.id), "token": started.launch_token, "code": 0, "reason": None})
    assert lists() == ([second.id], [])
