"""The shapes of ``nebula_tui/wire.py`` are the ones that travel: a real head's replies on
its socket are of their shapes, keys and types (the jobs', GPUs' and status's, and the
pools', users', bookings' and ``why``'s, in replies and on the stream); its job, GPU and
node carry exactly their fields; what the CLI and the TUI's form send, and the head reads
of a submit request, are fields of ``SubmitRequest``; and every other request is typed at
both ends: each op's handler takes its type in ``wire.REQUESTS``, and every call a client
makes builds its fields with that type. (mypy holds the annotated builders to them; this
holds the running code, and what JSON makes of it.) ``tests/lab/test_e2e.py`` holds a head
process on the lab to them too."""

from __future__ import annotations

import ast
import asyncio
import getpass
from pathlib import Path
from typing import get_args, get_type_hints

from support.inprocess import gpu_row, probe, up_engine
from support.shapes import mismatches, reply_mismatches

from nebula_tui import views, wire
from nebula_tui.api import AsyncClient
from nebula_tui.cli import build_parser
from nebula_tui.cli.jobs import submit_request
from nebula_tui.head import ops
from nebula_tui.head.requests import spec_from_request
from nebula_tui.head.server import ApiServer
from nebula_tui.model import JobSpec, JobState, Placement
from nebula_tui.screens.submit import request_fields
from nebula_tui.wire import (AttachInfoReply, BookingMade, BookingReply, BookingsReply, DoctorReply, EventsReply,
                             GpuHistoryReply, GpusReply, GpuWire, HistoryReply, JobDetailReply, JobReply, JobWire,
                             LogsReply, NodeReply, NodeShowReply, NodeWire, NoReply, PingReply, PlanView, QueueReply,
                             ReloadReply, ReportReply, SmokeReply, StatusReply, StreamEvent, StreamSnapshot,
                             SubmitReply, SubmitRequest, UsersReply, WaitReply, WhyJob, WhyReply, WhyUser)

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


POOL = """pools:
  - name: hpc
    kind: slurm
    host: 127.0.0.1
    user: gpulab
"""


async def test_a_served_heads_pool_user_booking_and_why_answers_are_of_their_wire_shapes(tmp_path):
    """A head with a pool (not reached yet) on its real socket: the status's pools, the
    users, a booking made, listed and ended, ``why`` for a waiting job (ahead of it, holding
    its cards, the changes that start it sooner) and for a user, and the smaller answers
    (ping, a quota set, a drain and resume, the events log, how to attach); and the snapshot
    and the events a subscriber reads meanwhile (a user's row, the bookings)."""
    engine = up_engine(tmp_path, POOL)
    server = ApiServer(engine, tmp_path / "nebula.sock")
    await server.start()
    try:
        client = AsyncClient(server.path)
        stream = client.events()
        snapshot = await anext(stream)
        assert snapshot.pop("type") == "snapshot"
        replies: list[tuple[str, dict, object]] = []

        async def ask(op: str, shape: object, **fields) -> dict:
            reply = await client.call(op, **fields)
            replies.append((op, reply, shape))
            return reply

        for node, hours in (("node01", 1), ("node02", 3)):  # both nodes' cards held, node01's for less
            held = (await client.call("submit", command=["sleep", "1"], gpu_count=2,
                                      time_limit_s=hours * 3600.0))["job"]
            engine.transitions.begin_launch(engine.jobs[held["id"]], tuple(
                Placement(f"GPU-{node}-{i}", node, i, 81920, True) for i in range(2)))
            engine.transitions.mark_running(engine.jobs[held["id"]])
        ahead = (await client.call("submit", command=["true"], gpu_count=1, time_limit_s=7200.0))["job"]["id"]
        waits = (await client.call("submit", command=["true"], gpu_count=2, time_limit_s=7200.0))["job"]["id"]
        engine.scheduling.schedule_pass()
        await ask("quota", NoReply, user=ME, hours=100.0)  # the user's row, and their event
        await ask("ping", PingReply)
        await ask("drain", NodeReply, node="node02", reason="shapes")
        await ask("resume", NodeReply, node="node02")
        await ask("events", EventsReply, limit=50)
        await ask("attach_info", AttachInfoReply, job=held["id"])
        now = engine.clock()
        await ask("reserve", BookingMade, gpus="node01:0", start=now + 86400, duration_s=3600.0, name="b1")
        await ask("reserve", BookingsReply, list=True)
        await ask("reserve", BookingReply, delete="b1")
        await ask("status", StatusReply)
        await ask("users", UsersReply)
        job_answer = (await ask("why", WhyReply, job=waits))["why"]
        user_answer = (await ask("why", WhyReply, user=ME))["why"]

        events: list[dict] = []
        while not {"user", "bookings"} <= {e["type"] for e in events}:
            events.append(await anext(stream))
        await stream.aclose()
    finally:
        await server.close()
        await engine.stop()
        engine.state.store.close()

    found = [line for op, reply, shape in replies for line in reply_mismatches(reply, shape, op)]
    found += reply_mismatches({"ok": True, **snapshot}, StreamSnapshot, "snapshot")
    found += [line for e in events for line in mismatches(e, StreamEvent, f"{e['type']} event")]
    # each why answer is of its own arm, not only of the union
    found += mismatches(job_answer, WhyJob, "why job") + mismatches(user_answer, WhyUser, "why user")
    assert not found, "\n".join(found)
    status = next(reply for op, reply, _ in replies if op == "status")
    assert [pool["name"] for pool in status["pools"]] == ["hpc"] and snapshot["pools"][0]["name"] == "hpc"
    assert job_answer["ahead"][0]["id"] == ahead and job_answer["holding"] and job_answer["sooner"]
    assert len(user_answer["running"]) == 2 and len(user_answer["waiting"]) == 2


async def test_a_served_heads_log_node_doctor_reload_and_report_answers_are_of_their_wire_shapes(tmp_path):
    """The rest of the replies, over a real head's socket: a running job's log (one rank,
    and every rank's), a GPU's telemetry, a node shown, the doctor's checks, the report,
    a reload of the cluster file, a node's smoke job (run to its end) and a node removed."""
    engine = up_engine(tmp_path)
    server = ApiServer(engine, tmp_path / "nebula.sock")
    await server.start()
    try:
        client = AsyncClient(server.path)
        replies: list[tuple[str, dict, object]] = []

        async def ask(op: str, shape: object, **fields) -> dict:
            reply = await client.call(op, **fields)
            replies.append((op, reply, shape))
            return reply

        ran = (await client.call("submit", command=["sleep", "60"], gpu_count=1))["job"]["id"]
        engine.transitions.begin_launch(engine.jobs[ran], (Placement("GPU-node01-0", "node01", 0, 81920, True),))
        engine.transitions.mark_running(engine.jobs[ran])
        await ask("logs", LogsReply, job=ran)
        await ask("logs", LogsReply, job=ran, offsets=[0])
        history = await ask("history", GpuHistoryReply, gpu="node01:0", since=3600)
        shown = await ask("node_show", NodeShowReply, node="node01")
        await ask("doctor", DoctorReply)
        now = engine.clock()
        await ask("report", ReportReply, since=now - 86400, until=now + 60)
        await ask("reload", ReloadReply)
        smoke = asyncio.ensure_future(ask("node_smoke", SmokeReply, node="node02"))
        while not (tried := [j for j in engine.jobs.values() if j.spec.name == "smoke-test node02"]):
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)  # (its reply waits for its end)
        engine.transitions.finish(engine.jobs[tried[0].id], JobState.SUCCEEDED, 0, "")
        assert (await smoke)["ended"]
        removed = await ask("node_remove", ReloadReply, node="node02")
    finally:
        await server.close()
        await engine.stop()
        engine.state.store.close()

    found = [line for op, reply, shape in replies for line in reply_mismatches(reply, shape, op)]
    assert not found, "\n".join(found)
    assert history["samples"] and shown["node"]["jobs"] == [ran] and removed["removed"] == ["node02"]


def test_each_ops_handler_returns_its_wire_reply():
    """Every op the head answers from its table has its reply's type in ``wire.REPLIES``,
    and its handler returns that type (or, for ``reserve``, the union of its arms)."""
    assert set(wire.REPLIES) == set(ops.OPS)
    wrong = {op: get_type_hints(handler).get("return") for op, handler in ops.OPS.items()
             if get_type_hints(handler).get("return") != wire.REPLIES[op]}
    assert not wrong, wrong


def test_each_ops_handler_takes_its_wire_request():
    """Every op the head answers has its request's type in ``wire.REQUESTS``, and its
    handler names that type (those answered outside the table: attach and subscribe)."""
    assert set(wire.REQUESTS) == set(ops.OPS) | {"attach", "subscribe"}
    wrong = {op: get_type_hints(handler).get("req") for op, handler in ops.OPS.items()
             if get_type_hints(handler).get("req") is not wire.REQUESTS[op]}
    assert not wrong, wrong


PACKAGE = Path(wire.__file__).parent


def client_calls() -> list[tuple[str, int, str | None, ast.Call]]:
    """Every request a client makes outside the head: (file, line, its op or None when the
    op is a variable, the call): ``….call("op", …)`` and ``{"op": "attach", …}``."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if "head" in path.relative_to(PACKAGE).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "call"
                    and node.args and not (isinstance(node.args[0], ast.Name) and node.args[0].id == "op"
                                           and path.name == "actions.py" and node.keywords
                                           and node.keywords[0].value.__class__ is ast.Name
                                           and node.keywords[0].arg is None and node.keywords[0].value.id == "fields"
                                           and len(node.keywords) == 1 and _is_passthrough(node))):
                first = node.args[0]
                op = first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else None
                found.append((path.name, node.lineno, op, node))
    return found


def _is_passthrough(node: ast.Call) -> bool:
    """``self.client.call(op, **fields)``: the TUI's one wrapper that hands its caller's
    request on (each of its callers is a call checked here)."""
    return isinstance(node.func.value, ast.Attribute) and node.func.value.attr == "client"


def reply_arms(shape: object) -> set[str]:
    """The names of a reply's shapes: itself, or each arm of a union (``reserve``'s)."""
    return {arm.__name__ for arm in get_args(shape)} or {shape.__name__}  # type: ignore[attr-defined]


def test_every_call_a_client_makes_reads_its_reply_as_the_ops_wire_reply():
    """Each call names the op's reply type (``client.call("logs", LogsReply, …)``: mypy then
    reads the reply as it), one of ``wire.REPLIES[op]``'s; a call whose op is a variable
    names a reply type all the same (a ``.call`` with no op and no request is none of the
    head's: tmux's, an event loop's; the TUI's one wrapper hands its caller's on)."""
    calls = [c for c in client_calls() if (c[2] is not None or any(k.arg is None for k in c[3].keywords))
             and not (c[0] == "actions.py" and _is_passthrough(c[3]))]
    assert len(calls) > 30
    wrong = []
    for name, line, op, call in calls:
        named = call.args[1].id if len(call.args) > 1 and isinstance(call.args[1], ast.Name) else None
        allowed = reply_arms(wire.REPLIES[op]) if op is not None else {
            arm for shape in wire.REPLIES.values() for arm in reply_arms(shape)}
        if named not in allowed:
            wrong.append(f"{name}:{line} {op}: {named}, not {' or '.join(sorted(allowed)) if op else 'a reply'}")
    assert not wrong, "\n".join(wrong)


def test_every_call_a_client_makes_builds_its_fields_with_the_ops_wire_request():
    """No field goes as a bare keyword (``job=…``): each is in a request built by the op's
    type (``**JobRequest(job=…)``), or in one a function typed so returned (``**request``)."""
    calls = client_calls()
    assert len(calls) > 30
    bare, other = [], []
    for name, line, op, call in calls:
        for keyword in call.keywords:
            if keyword.arg is not None and keyword.arg != "timeout":
                bare.append(f"{name}:{line} {op}: {keyword.arg}=")
            value = keyword.value
            if keyword.arg is None and isinstance(value, ast.Call) and isinstance(value.func, ast.Name) \
                    and op is not None and value.func.id != wire.REQUESTS[op].__name__:
                other.append(f"{name}:{line} {op}: {value.func.id}, not {wire.REQUESTS[op].__name__}")
    assert not bare and not other, "\n".join(bare + other)
