"""The shapes of ``nebula_tui/wire.py`` are the ones that travel: a real head's replies on
its socket are of their shapes, keys and types; its job, GPU and node carry exactly their
fields; and what the CLI and the TUI's form send, and the head reads of a submit request,
are fields of ``SubmitRequest``. (mypy holds the annotated builders to them; this holds
the running code, and what JSON makes of it.) ``tests/lab/test_e2e.py`` holds a head
process on the lab to them too."""

from __future__ import annotations

import getpass

from support.inprocess import gpu_row, probe
from support.shapes import mismatches, reply_mismatches

from nebula_tui import views
from nebula_tui.api import AsyncClient
from nebula_tui.cli import build_parser
from nebula_tui.cli.jobs import submit_request
from nebula_tui.head.requests import spec_from_request
from nebula_tui.model import JobSpec, Placement
from nebula_tui.screens.submit import request_fields
from nebula_tui.wire import (GpusReply, GpuWire, HistoryReply, JobDetailReply, JobReply, JobWire, NodeWire, PlanView,
                             QueueReply, StatusReply, StreamEvent, StreamSnapshot, SubmitReply, SubmitRequest,
                             WaitReply)

ME = getpass.getuser()


async def test_a_served_heads_replies_are_of_their_wire_shapes(engine, served):
    """Every reply a client reads a job, the queue, a GPU or the status from, over the
    head's real socket: a running job (placed, with its environment), a waiting one, an
    ended one (its history row), the plan of one more, the status and the GPUs."""
    client = AsyncClient(served)
    replies: list[tuple[str, dict, object]] = []

    async def ask(op: str, shape: object, **fields) -> dict:
        reply = await client.call(op, **fields)
        replies.append((op, reply, shape))
        return reply

    ran = (await ask("submit", SubmitReply, command=["sleep", "60"], gpu_count=1, name="ran"))["job"]["id"]
    engine.transitions.begin_launch(engine.jobs[ran], (Placement("GPU-node01-0", "node01", 0, 81920, True),))
    engine.transitions.mark_running(engine.jobs[ran])
    waits = (await ask("submit", SubmitReply, command=["true"], gpu_count=2, gpu_mem_mb=8192))["job"]["id"]
    await ask("submit", SubmitReply, command=["true"], array="0-2%1")
    await ask("hold", JobReply, job=waits)
    await ask("release", JobReply, job=waits)
    await ask("job", JobDetailReply, job=ran)
    await ask("job", JobDetailReply, job=waits)
    await ask("queue", QueueReply)
    await ask("plan", PlanView, command=["true"], gpu_count=1)
    await ask("plan", PlanView, command=["true"], gpu_count=2)
    await ask("cancel", JobReply, job=waits)
    await ask("wait", WaitReply, job=waits, within=1)
    await ask("job", JobDetailReply, job=waits)
    history = await ask("job_history", HistoryReply, user=ME)
    await ask("status", StatusReply)
    await ask("gpus", GpusReply)

    assert [job["id"] for job in history["jobs"]] == [waits]
    assert {op for op, _, _ in replies} >= {"submit", "job", "queue", "plan", "wait", "job_history",
                                            "status", "gpus"}
    found = [line for op, reply, shape in replies for line in reply_mismatches(reply, shape, op)]
    assert not found, "\n".join(found)


async def test_a_served_heads_stream_is_of_its_wire_shapes(engine, served):
    """The subscription over the head's socket: its snapshot, then the events a submit, a
    drain, a probe and a new forecast make (a job, the events log, a node, the GPUs' changes,
    the queue with its forecasts), each of its shape."""
    client = AsyncClient(served)
    stream = client.events()
    snapshot = await anext(stream)
    assert snapshot.pop("type") == "snapshot"
    await client.call("submit", command=["true"], gpu_count=1)
    await client.call("drain", node="node02", reason="shapes")
    engine.on_node_message("node01", probe("node01", [gpu_row("node01", i, util=40) for i in range(2)]))
    engine.state.forecasts[1] = {"start_at": None, "early": None, "late": None, "after_job": None, "node": None,
                                 "made_at": 1.0, "simulated_at": None, "within_s": 7 * 86400.0}
    engine.stream.publish_queue_order(starts=True)
    events: list[dict] = []
    while not {"job", "event", "node", "gpus", "queue"} <= {e["type"] for e in events}:
        events.append(await anext(stream))
    await stream.aclose()
    found = reply_mismatches(snapshot, StreamSnapshot, "snapshot")
    found += [line for e in events for line in mismatches(e, StreamEvent, f"{e['type']} event")]
    assert not found, "\n".join(found)
    assert snapshot["jobs"] == [] and next(e for e in events if e["type"] == "queue")["starts"]["1"]["made_at"] == 1.0


def test_the_shapes_check_finds_what_a_reply_lacks_adds_or_types_wrong(engine):
    """The check above can fail: a key gone, one too many, and a value of another type,
    each nested where the shapes nest them."""
    job = engine.submit(ME, JobSpec(command=("true",), gpu_count=1))
    row = views.queue_row(job, 1, None)
    assert mismatches({"jobs": [row]}, QueueReply) == []
    gone = {key: value for key, value in row.items() if key != "starts"}
    assert mismatches({"jobs": [gone]}, QueueReply) == ["QueueReply.jobs[0]: no starts"]
    assert mismatches({"jobs": [{**row, "stray": 1}]}, QueueReply) == ["QueueReply.jobs[0]: stray not in QueueRow"]
    assert mismatches({"jobs": [{**row, "gpu_count": "1"}]}, QueueReply) == [
        "QueueReply.jobs[0].gpu_count: '1' (str), not int"]
    assert mismatches({"jobs": [{**row, "held": 0}]}, QueueReply) == ["QueueReply.jobs[0].held: 0 (int), not bool"]


def keys(shape: type) -> tuple[frozenset[str], frozenset[str]]:
    """A TypedDict's (required, optional) keys."""
    return shape.__required_keys__, shape.__optional_keys__  # type: ignore[attr-defined]


def test_a_heads_job_gpu_and_node_carry_exactly_their_wire_fields(engine):
    job = engine.submit(getpass.getuser(), JobSpec(command=("true",), gpu_count=1))
    required, optional = keys(JobWire)
    assert set(views.job_json(engine.jobs[job.id])) == required and not optional

    required, optional = keys(GpuWire)
    gpus = engine.gpus_json()
    assert gpus
    for gpu in gpus:
        assert required <= set(gpu) <= required | optional, set(gpu) ^ required

    required, _ = keys(NodeWire)
    nodes = engine.status()["nodes"]
    assert nodes and all(set(node) == required for node in nodes)


class Reading(dict):
    """A request that notes each field the head reads of it."""

    read: set[str]

    def get(self, key, default=None):
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)

    def __contains__(self, key):
        self.read.add(key)
        return super().__contains__(key)


def test_a_submit_request_is_sent_and_read_as_its_wire_fields(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sent, _ = keys(SubmitRequest)
    optional = SubmitRequest.__optional_keys__  # total=False: every field may be left out
    args = build_parser().parse_args(["submit", "-G", "2", "--gpu-mem", "8G", "--name", "x", "-w", "node01"])
    args.trailing = ["true"]
    cli = submit_request(args)
    assert cli is not None and set(cli) <= optional, set(cli) - optional
    form = request_fields({"command": "true", "gpu_count": "1", "name": "x", "gpu_mem": "8G",
                           "workdir": "/tmp", "reservation": "r"}, preemptible=True)
    assert set(form) <= optional, set(form) - optional

    request = Reading(cli)
    request.read = set()
    spec_from_request(request)
    assert request.read and request.read <= optional, request.read - optional
    assert not sent  # (nothing is required of a request: the head checks each field)
