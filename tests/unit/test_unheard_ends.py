"""A job that ends while no head hears its node (the head restarted, the link was down) is
charged until its end as the node recorded it, not until the head heard of it; a time the
job's user could have written is taken only within what the head knows (the real
``Engine`` over a real store file, the nodelet's messages written out;
``tests/lab/test_recovery.py`` kills a real head while a real job ends)."""

from __future__ import annotations

import getpass

import pytest

from nebula_tui.config.cluster import load_config
from nebula_tui.head.engine import Engine
from nebula_tui.model import Job, JobSpec, NodeState, Placement
from nebula_tui.store import Store

from support.inprocess import NODES, QuietNode, cluster_file, gpu_row, probe

ME = getpass.getuser()
CARD = Placement("GPU-node01-0", "node01", 0, 81920, True)  # a whole A100
T0 = 1_800_000_000.0


def head_on(tmp_path, store: Store, clock: list[float]) -> Engine:
    cluster_file(tmp_path / "nodes.yaml", NODES)
    head = Engine(load_config(tmp_path / "nodes.yaml"), store, lambda: clock[0])
    head.transitions.load()
    return head


def connect(head: Engine, node_clock: float) -> None:
    """Every node says hello (its clock reading ``node_clock``) and its cards, and is up."""
    for node in NODES:
        head.links[node] = QuietNode()
        head.on_node_message(node, {"type": "hello", "hostname": node, "t": node_clock,
                                    "smi_table": "CUDA Version: 12.4"})
        head.on_node_message(node, probe(node, [gpu_row(node, i) for i in range(2)]))
        head.on_node_state(node, NodeState.UP, "")


async def running_then_crashed(tmp_path, alive_at: float) -> tuple[int, str]:
    """A head starts a job on a whole card at T0, marks itself alive at ``alive_at``, and
    is gone (its store closed as a crash leaves it). The job's id and token."""
    clock = [T0]
    head = head_on(tmp_path, Store(tmp_path / "state.db"), clock)
    connect(head, T0)
    job = head.submit(ME, JobSpec(command=("train",), gpu_count=1))
    head.transitions.begin_launch(head.jobs[job.id], (CARD,))
    head.transitions.mark_running(head.jobs[job.id])
    token = head.state.token(head.jobs[job.id])
    clock[0] = alive_at
    head.state.store.mark_alive(alive_at)
    await head.stop()
    head.state.store.close()
    return job.id, token


async def ended_after_restart(tmp_path, job: int, token: str, node_end: float,
                              skew: float = 0.0) -> Job:
    """A new head on the store at T0 + 1 h hears the node (its clock ``skew`` s off the
    head's) report the job's end at ``node_end`` (the head's time); the ended job."""
    clock = [T0 + 3600]
    head = head_on(tmp_path, Store(tmp_path / "state.db"), clock)
    try:
        connect(head, clock[0] + skew)
        head.on_node_message("node01", {"type": "exit", "job": job, "token": token, "code": 0,
                                        "t": node_end + skew})
        assert job not in head.jobs, "the end was recorded"
        return head.state.store.job(job)
    finally:
        await head.stop()
        head.state.store.close()


async def test_a_job_that_ended_while_the_head_was_down_is_charged_until_its_end(tmp_path):
    """The head crashed at T0 + 5 min; the job ended at T0 + 15 min; a head came back at
    T0 + 1 h. Charged until T0 + 15 min (a quarter of a GPU-hour): it was charged until
    the restart, a whole hour."""
    job, token = await running_then_crashed(tmp_path, T0 + 300)
    row = await ended_after_restart(tmp_path, job, token, T0 + 900)
    assert row.status.ended_at == pytest.approx(T0 + 900, abs=1.0)
    store = Store(tmp_path / "state.db")
    try:
        assert store.charged_hours([job])[job] == pytest.approx(0.25, abs=1e-6)
    finally:
        store.close()


async def test_a_node_clock_off_the_heads_is_read_through_its_hello(tmp_path):
    """The node's clock runs 5,000 s behind the head's: its times are moved by what its
    hello said, not taken as they are (which would put the end before the job began)."""
    job, token = await running_then_crashed(tmp_path, T0 + 300)
    row = await ended_after_restart(tmp_path, job, token, T0 + 900, skew=-5000.0)
    assert row.status.ended_at == pytest.approx(T0 + 900, abs=1.0)


async def test_an_end_dated_before_the_head_last_knew_the_job_ran_is_not_believed(tmp_path):
    """The exit code's file is the job's user's: one who set its time back to a minute in
    is charged until the last moment the head knew the job ran (T0 + 10 min), no less."""
    job, token = await running_then_crashed(tmp_path, T0 + 600)
    row = await ended_after_restart(tmp_path, job, token, T0 + 60)
    assert row.status.ended_at == pytest.approx(T0 + 600, abs=1.0)


async def test_an_end_the_head_heard_at_once_ends_when_it_heard_it(tmp_path):
    """With the head listening all along, an end is when the head heard it, whatever time
    the node's file says (its user could have set it)."""
    clock = [T0]
    head = head_on(tmp_path, Store(tmp_path / "state.db"), clock)
    try:
        connect(head, T0)
        job = head.submit(ME, JobSpec(command=("train",), gpu_count=1))
        head.transitions.begin_launch(head.jobs[job.id], (CARD,))
        head.transitions.mark_running(head.jobs[job.id])
        token = head.state.token(head.jobs[job.id])
        clock[0] = T0 + 1800
        head.on_node_message("node01", {"type": "exit", "job": job.id, "token": token, "code": 0,
                                        "t": T0 + 60})
        assert head.state.store.job(job.id).status.ended_at == pytest.approx(T0 + 1800, abs=1.0)
    finally:
        await head.stop()
        head.state.store.close()
