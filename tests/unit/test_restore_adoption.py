"""A store restored from a backup takes in what its nodes ran since, as it was there, and
never holds a card twice while it does (the real ``Engine`` over a real store; the node's
answer to ``list`` is the nodelet's, written out; ``tests/lab/test_recovery.py`` does it
on the lab with real nodelets)."""

from __future__ import annotations

import asyncio
import getpass
import time

import pytest

from nebula_tui.config.cluster import load_config
from nebula_tui.head.engine import Engine
from nebula_tui.head.jobs import launch_record
from nebula_tui.model import Job, JobSpec, JobState, Launching, NodeState, Placement
from nebula_tui.remote.protocol import request_problems
from nebula_tui.store import Store

from support.inprocess import NODES, cluster_file, gpu_row, probe
from support.stores import never_overcommitted

ME = getpass.getuser()
CARD = Placement("GPU-node01-0", "node01", 0, 81920, True)  # a whole A100 of the head's lab


class ListingNode:
    """A node link whose nodelet has ``attempts`` in its job directories and ``sessions``
    (job -> token) live; every other request gets the nodelet's empty reply."""

    def __init__(self, attempts: dict | None = None, sessions: dict | None = None) -> None:
        self.attempts, self.sessions = attempts or {}, sessions or {}

    async def request(self, op: str, timeout: float | None = None, **fields) -> dict:
        assert not request_problems(op, fields), request_problems(op, fields)  # as NodeLink
        if op == "list":
            return {"ok": True, "jobs": {}, "attempts": self.attempts,
                    "sessions": sorted(self.sessions, key=int), "session_tokens": self.sessions}
        return {"ok": True, "sessions": [], "jobs": {}}

    async def close(self) -> None:
        pass


def attempt(job_id: int, token: str, started_at: float, exit_code: int | None) -> dict:
    """One attempt's entry in the nodelet's ``list`` with records (``node/ops.py``)."""
    job = Job(job_id, ME, JobSpec(command=("true",)), started_at - 1, status=Launching((CARD,)))
    return {"token": token, "launched": True, "started": True, "started_at": started_at,
            "exit_code": exit_code, "acked": False, "ended_as": None,
            "record": launch_record(job), "reason": ""}


async def reconciled(tmp_path, store: Store, node01: ListingNode, node02: ListingNode | None = None) -> None:
    """A head on ``store`` (restored: it waits for its nodes) whose node01 answers as
    ``node01`` does (and node02 as ``node02``), until every node has been reconciled; then
    stopped. node01 comes up first."""
    cluster_file(tmp_path / "nodes.yaml", NODES)
    head = Engine(load_config(tmp_path / "nodes.yaml"), store, time.time)
    head.state.await_nodes_after_restore()  # as its start does, the store being restored
    head.transitions.load()
    try:
        for node in NODES:
            head.links[node] = {"node01": node01, "node02": node02}.get(node) or ListingNode()
            head.on_node_message(node, {"type": "hello", "hostname": node,
                                        "smi_table": "CUDA Version: 12.4"})
            head.on_node_message(node, probe(node, [gpu_row(node, i) for i in range(2)]))
            head.on_node_state(node, NodeState.UP, "")
        for _ in range(100):
            if not store.restore_pending:
                break
            await asyncio.sleep(0.01)
        assert not store.restore_pending, "the nodes were never reconciled"
    finally:
        await head.stop()


async def test_a_restore_takes_in_the_launches_that_ended_before_those_still_running(tmp_path):
    """After the backup, job 4 ran on a whole card and ended, then job 5 took the card and
    runs. The node lists job 5 first: taken in in that order, job 4 would hold the card
    beside job 5 from its taking in to its end."""
    store = Store(tmp_path / "state.db")
    store.mark_restored("a backup")
    t = time.time() - 60
    token = {job: f"{store.head_token}.0.{job:04x}" for job in (4, 5)}  # the head's before the restore
    node01 = ListingNode({"5": {"0": attempt(5, token[5], t + 20, None)},
                          "4": {"0": attempt(4, token[4], t, 0)}}, {"5": token[5]})
    try:
        await reconciled(tmp_path, store, node01)
        assert store.job(4).state == JobState.SUCCEEDED
        assert store.job(5).state == JobState.RUNNING and store.job(5).placements == (CARD,)
    finally:
        store.close()
    never_overcommitted(tmp_path / "state.db")


async def test_a_job_the_backup_has_launching_is_settled_from_its_node_before_the_next_is_taken_in(tmp_path):
    """The backup was taken after job 4's card was written, before its node answered; it
    ran there and ended (its end acked), then job 5 took the card. Restored, job 4 ran from
    when its node started it and ended as the node's record says, before job 5 is taken
    in: never both on the card."""
    store = Store(tmp_path / "state.db")
    t = time.time() - 60
    four = store.add_job(ME, JobSpec(command=("true",)), t).id
    token4 = store.start_launching(four, (CARD,), t)
    store.mark_restored("a backup")
    token5 = f"{store.head_token}.0.0005"
    ended = attempt(four, token4, t + 1, 0)
    ended.update(acked=True, ended_as={"state": "succeeded", "reason": "", "at": t + 10})
    node01 = ListingNode({str(four): {"0": ended}, "5": {"0": attempt(5, token5, t + 20, None)}},
                         {"5": token5})
    try:
        await reconciled(tmp_path, store, node01)
        assert store.job(four).state == JobState.SUCCEEDED
        assert store.job(four).started_at == t + 1  # its run is charged from its start
        assert store.job(5).state == JobState.RUNNING and store.job(5).placements == (CARD,)
    finally:
        store.close()
    never_overcommitted(tmp_path / "state.db")


class LateNode(ListingNode):
    """node01 back after the head stopped waiting for it: its ``list`` answers only once
    ``answer`` is set (the scheduler may pass meanwhile)."""

    def __init__(self, attempts: dict, sessions: dict) -> None:
        super().__init__(attempts, sessions)
        self.answer = asyncio.Event()

    async def request(self, op: str, timeout: float | None = None, **fields) -> dict:
        if op == "list":
            await self.answer.wait()
        return await super().request(op, timeout, **fields)


def node_up(head, node: str, link) -> None:
    head.links[node] = link
    head.on_node_message(node, {"type": "hello", "hostname": node, "smi_table": "CUDA Version: 12.4"})
    head.on_node_message(node, probe(node, [gpu_row(node, i) for i in range(2)]))
    head.on_node_state(node, NodeState.UP, "")


async def past_the_wait(tmp_path, store: Store) -> Engine:
    """A head on the restored ``store`` whose wait for its nodes ended with only node02
    told (node01 away a node lease, on the head's monotonic clock)."""
    cluster_file(tmp_path / "nodes.yaml", NODES)
    now = [0.0]
    head = Engine(load_config(tmp_path / "nodes.yaml"), store, time.time)
    head.state.monotonic = lambda: now[0]
    head.state.await_nodes_after_restore()
    head.transitions.load()
    node_up(head, "node02", ListingNode())
    for _ in range(100):
        if "node02" not in head.state.unreconciled:
            break
        await asyncio.sleep(0.01)
    now[0] += head.state.config.node_lease + 1
    assert not head.state.holding_for_restore() and not store.restore_pending
    return head


async def test_a_node_back_after_the_restore_wait_is_reconciled_as_one_in_time(tmp_path):
    """The restored head waited a node lease for node01 and went on without it. Since the
    backup node01 ran job 5 (ended) and runs job 6 on a whole card: back later, both are
    taken in as they are there, as if it had answered in time; and till it has told, no
    new work goes on its cards (four waiting whole-card jobs: two start, on node02)."""
    store = Store(tmp_path / "state.db")
    t = time.time() - 60
    waiting = [store.add_job(ME, JobSpec(command=("true",)), t).id for _ in range(4)]
    store.mark_restored("a backup")
    token = {job: f"{store.head_token}.0.{job:04x}" for job in (5, 6)}
    node01 = LateNode({"6": {"0": attempt(6, token[6], t + 20, None)},
                       "5": {"0": attempt(5, token[5], t, 0)}}, {"6": token[6]})
    head = await past_the_wait(tmp_path, store)
    try:
        node_up(head, "node01", node01)
        await asyncio.sleep(0.05)
        head.scheduling.schedule_pass()  # while node01's list is on its way
        await asyncio.sleep(0.05)
        placed = {j.id: j.placements for j in map(store.job, waiting) if j.placements}
        assert len(placed) == 2 and all(p.node == "node02" for ps in placed.values() for p in ps)
        node01.answer.set()
        for _ in range(100):
            if store.job(6) is not None and store.job(6).state == JobState.RUNNING:
                break
            await asyncio.sleep(0.01)
        assert store.job(5) is not None, "what node01 ran since the backup was never taken in"
        assert store.job(5).state == JobState.SUCCEEDED
        assert store.job(6).state == JobState.RUNNING and store.job(6).placements == (CARD,)
        head.scheduling.schedule_pass()  # node01's other card is free now: one more starts
        await asyncio.sleep(0.05)
        assert sum(bool(store.job(j).placements) for j in waiting) == 3
    finally:
        await head.stop()
        store.close()
    never_overcommitted(tmp_path / "state.db")


async def test_a_node_late_for_the_restore_wait_is_still_asked_after_the_head_restarts(tmp_path):
    """The wait for node01 ended, then the head restarted before node01 was back: the new
    head still keeps new work off its cards and takes in what it ran since the backup."""
    store = Store(tmp_path / "state.db")
    t = time.time() - 60
    store.mark_restored("a backup")
    token = f"{store.head_token}.0.0005"
    await (await past_the_wait(tmp_path, store)).stop()
    head = Engine(load_config(tmp_path / "nodes.yaml"), store, time.time)  # restarted
    head.transitions.load()
    try:
        node01 = LateNode({"5": {"0": attempt(5, token, t, None)}}, {"5": token})
        node_up(head, "node01", node01)
        await asyncio.sleep(0.05)
        blocked = [v.blocked for v in head.state.gpu_views("node01")]
        assert all(b and "restored backup" in b for b in blocked), blocked
        node01.answer.set()
        for _ in range(100):
            if store.job(5) is not None:
                break
            await asyncio.sleep(0.01)
        assert store.job(5) is not None, "the restarted head never asked node01"
        assert store.job(5).state == JobState.RUNNING and store.job(5).placements == (CARD,)
        assert not store.restore_late
    finally:
        await head.stop()
        store.close()


async def test_a_late_nodes_copy_of_a_job_the_head_started_elsewhere_meanwhile_is_stopped(tmp_path):
    """The backup has job W waiting; node01 started it since, then was away past the
    restore wait, and the head, going on without it, started W on node02. When node01 is
    back its copy of W, which no launch of the store accounts for, is stopped (with the
    token of its launch) and said so: one copy of W runs, on the cards the store gives it."""
    store = Store(tmp_path / "state.db")
    t = time.time() - 60
    w = store.add_job(ME, JobSpec(command=("true",)), t).id
    store.mark_restored("a backup")
    token = f"{store.head_token}.0.{w:04x}"
    node01 = LateNode({str(w): {"0": attempt(w, token, t + 20, None)}}, {str(w): token})
    asked = []
    answer = node01.request

    async def request(op: str, timeout: float | None = None, **fields) -> dict:
        asked.append((op, fields))
        return await answer(op, timeout, **fields)

    node01.request = request
    head = await past_the_wait(tmp_path, store)
    try:
        node_up(head, "node01", node01)
        await asyncio.sleep(0.05)
        head.scheduling.schedule_pass()  # while node01's list is on its way: W goes to node02
        await asyncio.sleep(0.05)
        assert store.job(w).placements and store.job(w).placements[0].node == "node02"
        node01.answer.set()
        for _ in range(100):
            if any(op == "cancel" for op, _ in asked):
                break
            await asyncio.sleep(0.01)
        cancels = [fields for op, fields in asked if op == "cancel"]
        assert cancels and cancels[0]["job"] == w and cancels[0]["token"] == token, asked
        assert store.job(w).state.holds_gpus and store.job(w).placements[0].node == "node02"
        assert any("copy" in e["message"] and "node02" in e["message"] for e in store.events(50, job_id=w))
    finally:
        await head.stop()
        store.close()
    never_overcommitted(tmp_path / "state.db")


async def test_a_restore_reconcile_the_store_could_not_write_is_tried_again_without_a_reconnect(tmp_path):
    """node01, late for the restore wait, is back while the disk fails: taking in what it
    ran since the backup cannot be written. It is tried again while node01 stays connected,
    and once the disk is back its cards are taken in and take work again (before, they
    stayed blocked till node01 happened to reconnect)."""
    from nebula_tui.store import StoreUnavailable

    store = Store(tmp_path / "state.db")
    t = time.time() - 60
    store.mark_restored("a backup")
    token = f"{store.head_token}.0.0005"
    node01 = LateNode({"5": {"0": attempt(5, token, t, None)}}, {"5": token})
    node01.answer.set()
    head = await past_the_wait(tmp_path, store)
    head.fleet.reconciler.retry_s = 0.05
    adopt_launch, failures = store.adopt_launch, [1, 1]

    def failing(*args, **kwargs):
        if failures:
            failures.pop()
            raise StoreUnavailable("the head could not write its database (x): the disk failed")
        return adopt_launch(*args, **kwargs)

    store.adopt_launch = failing
    try:
        node_up(head, "node01", node01)
        for _ in range(200):
            if store.job(5) is not None and not store.restore_late:
                break
            await asyncio.sleep(0.01)
        assert not failures, "the disk never failed: the test did not test"
        assert store.job(5) is not None and store.job(5).state == JobState.RUNNING
        assert not store.restore_late
        assert not any(v.blocked for v in head.state.gpu_views("node01"))
    finally:
        await head.stop()
        store.close()
    never_overcommitted(tmp_path / "state.db")


@pytest.mark.parametrize("later_on", ["node01", "node02"])
async def test_a_job_requeued_and_relaunched_since_the_backup_is_taken_in_at_its_later_attempt(tmp_path, later_on):
    """The backup has job X running on one node; since, X was preempted there (its end
    acked, with no end kept: a requeue is its own record) and runs again, attempt 1, on the
    other. Whichever node answers first, X is taken in running at attempt 1 where it runs:
    not failed by its first attempt's end while its second runs on, untracked."""
    earlier_on = "node02" if later_on == "node01" else "node01"
    store = Store(tmp_path / "state.db")
    t = time.time() - 60
    x = store.add_job(ME, JobSpec(command=("true",)), t).id
    first = Placement(f"GPU-{earlier_on}-0", earlier_on, 0, 81920, True)
    token0 = store.start_launching(x, (first,), t)
    store.mark_running(x, t + 1)
    store.mark_restored("a backup")
    ended = attempt(x, token0, t + 1, 143)
    ended["acked"] = True
    token1 = f"{store.head_token}.1.{x:04x}"
    second = Placement(f"GPU-{later_on}-0", later_on, 0, 81920, True)
    running = attempt(x, token1, t + 30, None)
    record = Job(x, ME, JobSpec(command=("true",)), t, attempt=1, status=Launching((second,)))
    running["record"] = launch_record(record)
    nodes = {earlier_on: ListingNode({str(x): {"0": ended}}),
             later_on: ListingNode({str(x): {"1": running}}, {str(x): token1})}
    try:
        await reconciled(tmp_path, store, nodes["node01"], nodes["node02"])
        job = store.job(x)
        assert job.state == JobState.RUNNING, (job.state, job.reason)
        assert job.attempt == 1 and job.placements == (second,)
    finally:
        store.close()
    never_overcommitted(tmp_path / "state.db")
