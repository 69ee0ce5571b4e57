"""One author per event: a change writes its line of the events log once, where it
happens, at the head's time; the store records it and subscribers get the same line.
A user's figures go out as a ``user`` event when they move.

The head is the real ``Engine`` over a real store (``inprocess``), with its clock fixed.
"""

from __future__ import annotations

import ast
import asyncio
import getpass
from pathlib import Path

from support.inprocess import drain

from nebula_tui.api import EVENT_KINDS
from nebula_tui.model import JobSpec, JobState, NodeState, Placement
from nebula_tui.client.cluster import Cluster

ME = getpass.getuser()
NOW = 1_900_000_000.0


def lines(events: list[dict]) -> list[dict]:
    return [e["event"] for e in events if e["type"] == "event"]


async def test_subscribers_get_each_line_of_the_events_log_once_at_the_heads_time(engine):
    engine.state.clock = lambda: NOW
    queue: asyncio.Queue = asyncio.Queue()
    engine.subscribe(queue)
    before = len(engine.store.events(1000))
    job = engine.submit(ME, JobSpec(command=("true",), gpu_mem_mb=8192))
    engine.transitions.begin_launch(engine.jobs[job.id],
                                    (Placement("GPU-node01-0", "node01", 0, 8192, False),))
    engine.transitions.mark_running(engine.jobs[job.id])
    engine.transitions.finish(engine.jobs[job.id], JobState.SUCCEEDED, 0, "")
    engine.on_node_state("node02", NodeState.UNKNOWN, "silent")
    engine.set_quota("root", ME, 500)
    engine.health.on_kernel_lines("node01", ["NVRM: Xid (PCI:0000:07:00): 13, pid=1, name=x, "
                                             "Graphics Exception"])
    published = lines(drain(queue))
    logged = engine.store.events(1000)[before:]
    assert published == logged  # the same lines, in the same order, nothing invented
    assert {e["kind"] for e in published} >= {"submit", "place", "start", "end", "node", "admin", "xid"}
    assert {e["t"] for e in published} == {NOW}


async def test_a_users_figures_go_out_when_they_move(engine):
    queue: asyncio.Queue = asyncio.Queue()
    rows = {u["name"]: u for u in engine.subscribe(queue)["users"]}
    assert ME not in rows  # nobody has submitted yet
    engine.set_quota("root", ME, 123)
    job = engine.submit(ME, JobSpec(command=("true",)))
    await asyncio.sleep(0.4)
    (row,) = [e["user"] for e in drain(queue) if e["type"] == "user"]
    assert row == next(u for u in engine.users_json() if u["name"] == ME)
    assert row["quota_gpu_hours"] == 123

    engine.transitions.begin_launch(engine.jobs[job.id],
                                    (Placement("GPU-node01-0", "node01", 0, 81920, True),))
    engine.transitions.mark_running(engine.jobs[job.id])
    engine.transitions.finish(engine.jobs[job.id], JobState.SUCCEEDED, 0, "")
    await asyncio.sleep(0.4)
    (row,) = [e["user"] for e in drain(queue) if e["type"] == "user"]
    assert row["jobs_finished"] == 1 and row["running_jobs"] == 0


def test_the_tui_shows_the_heads_lines_and_invents_none():
    cluster = Cluster()
    cluster.apply_snapshot({"nodes": [], "gpus": [], "jobs": [], "events": []})
    job = {"id": 1, "user": "u", "name": "", "state": "running", "gpus": [], "reason": ""}
    cluster.apply_job(job)
    cluster.apply_job(dict(job, state="succeeded"))
    cluster.apply_node({"name": "n1", "state": "down", "reason": "refused"})
    assert list(cluster.events) == []
    line = {"t": NOW, "kind": "end", "message": "job 1 succeeded", "job_id": 1, "node": None,
            "gpu": None, "user": "u"}
    cluster.apply_event(line)
    assert list(cluster.events) == [line]


#: The calls that write a line of the events log, and where their kind argument may be.
_WRITERS = {"_event": (0, 1), "add_event": (1,), "record": (0,), "_tell": (1,)}


def test_every_kind_the_head_writes_is_one_the_protocol_names():
    """``nebula events --kind`` takes only ``api.EVENT_KINDS``: a kind written anywhere in
    the head or the store but missing there could never be asked for."""
    package = Path(__file__).resolve().parents[2] / "nebula_tui"
    written: dict[str, str] = {}
    for path in [*sorted((package / "store").glob("*.py")), *sorted((package / "head").glob("*.py"))]:
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            name = getattr(node.func, "attr", getattr(node.func, "id", None))
            for n in _WRITERS.get(name, ()):  # the first that is a word (or a choice of two)
                arg = node.args[n] if n < len(node.args) else None
                words = [arg] if isinstance(arg, ast.Constant) else \
                    [arg.body, arg.orelse] if isinstance(arg, ast.IfExp) else []
                for word in words:
                    if isinstance(word, ast.Constant) and isinstance(word.value, str):
                        written[word.value] = f"{path.name}:{node.lineno}"
                if words:
                    break
    assert {"submit", "place", "start", "end", "health", "xid", "store", "idle"} <= set(written)
    assert {k: where for k, where in written.items() if k not in EVENT_KINDS} == {}
