"""The head's view of its waiting jobs for the scheduler: made once per job, not per pass.

The real ``Engine`` over a real store file, with no nodes: what is checked is which
``PendingJob`` objects a pass is given, not where they go.
"""

from __future__ import annotations

import getpass
from dataclasses import replace

import pytest

from nebula_tui.config.cluster import parse_config
from nebula_tui.head.engine import Engine
from nebula_tui.model import JobSpec, JobState, Pending
from nebula_tui.store import Store


@pytest.fixture
async def engine(tmp_path):
    config = parse_config(f"cluster:\n  name: t\n  known_hosts: {tmp_path / 'kh'}\nnodes: []\n")
    store = Store(tmp_path / "state.db")
    head = Engine(config, store)
    yield head
    await head.stop()
    store.close()


def waiting(head: Engine):
    return [j for j in head.jobs.values() if j.state == JobState.PENDING]


async def test_a_waiting_job_keeps_its_view_until_its_spec_changes(engine):
    me = getpass.getuser()
    first = engine.submit(me, JobSpec(command="python a.py", gpu_count=1, gpu_mem_mb=8192))
    second = engine.submit(me, JobSpec(command="python b.py", gpu_count=2, arch=">=sm_80"))
    before = {v.id: v for v in engine.scheduling.snapshot_for(waiting(engine)).queue}
    assert set(before) == {first.id, second.id}
    assert before[second.id].gpu_count == 2 and before[second.id].arch == ">=sm_80"

    # a new waiting reason replaces the Job, not its spec: the same view is handed out
    engine.jobs[first.id] = replace(engine.jobs[first.id], status=Pending("needs 1 GPU"))
    again = {v.id: v for v in engine.scheduling.snapshot_for(waiting(engine)).queue}
    assert again[first.id] is before[first.id] and again[second.id] is before[second.id]

    # a different spec is seen at once
    engine.jobs[second.id] = replace(engine.jobs[second.id], spec=replace(second.spec, gpu_count=4))
    changed = {v.id: v for v in engine.scheduling.snapshot_for(waiting(engine)).queue}
    assert changed[second.id].gpu_count == 4
    assert changed[second.id].request_key != before[second.id].request_key

    # a job no longer waiting is not kept
    del engine.jobs[first.id]
    assert [v.id for v in engine.scheduling.snapshot_for(waiting(engine)).queue] == [second.id]
    assert set(engine.scheduling.pending_views) == {second.id}
