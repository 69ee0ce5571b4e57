"""The nodelet's messages as the head reads them (remote/protocol.py): each kind read once
into its frozen type, odd content from an untrusted node read as missing, never raised."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from nebula_tui.remote.protocol import (KINDS, REQUESTS, Exit, Hello, KernelLines, Phase, Probe, Started,
                                        job_number, read_message, request_problems)

REPO = Path(__file__).resolve().parents[2]

DEVICE = {"index": 0, "uuid": "GPU-a", "name": "NVIDIA A100-SXM4-80GB", "vendor": "nvidia",
          "pci_bus_id": "00000000:07:00.0", "memory_total_mb": 81920, "memory_used_mb": 100}


def test_each_kind_the_nodelet_sends_is_read_into_its_type():
    hello = read_message("n1", {"type": "hello", "hostname": "n1", "python": "3.6.8", "uid": 0,
                                "node_dir": "/root/.nebula-node", "max_job": 41,
                                "runtimes": {"podman": "podman version 4.3.1"},
                                "backends": [{"name": "nvml", "vendor": "nvidia"}],
                                "devices": [DEVICE], "platform": {"kind": "linux"},
                                "cuda_version": "12.4", "links": {"GPU0": {"GPU1": "NV12"}}})
    assert isinstance(hello, Hello) and hello.max_job == 41 and hello.cuda_version == "12.4"
    assert (hello.hostname, hello.python, hello.uid, hello.node_dir) == \
        ("n1", "3.6.8", 0, "/root/.nebula-node")
    assert hello.runtimes == {"podman": "podman version 4.3.1"} and hello.devices == (DEVICE,)
    assert hello.backends == ({"name": "nvml", "vendor": "nvidia"},)
    assert hello.platform == {"kind": "linux"}
    assert hello.topology == {"gpus": ["GPU0", "GPU1"], "links": {"GPU0": {"GPU1": "NV12"}}}
    probe = read_message("n1", {"type": "probe", "t": 1.0, "error": "", "devices": [DEVICE],
                                "processes": [{"gpu_uuid": "GPU-a", "pid": 7, "name": "python",
                                               "used_memory_mb": 90}],
                                "pid_jobs": {"7": "3"}, "pid_users": {"8": "alice"}})
    assert isinstance(probe, Probe)
    assert [r.uuid for r in probe.view.readings] == ["GPU-a"]
    assert [p.pid for p in probe.view.processes] == [7]
    assert (probe.pid_jobs, probe.pid_users) == ({"7": "3"}, {"8": "alice"})
    assert read_message("n1", {"type": "started", "job": "5", "attempt": 0, "token": "h.0.x",
                               "t": 1.0, "workdir": "/home/a"}) == Started(5, "h.0.x", "/home/a")
    assert read_message("n1", {"type": "phase", "job": "5", "token": "h.0.x", "text": "pulling",
                               "t": 1.0}) == Phase(5, "h.0.x", "pulling")
    assert read_message("n1", {"type": "exit", "job": "5", "token": "h.0.x", "code": 3,
                               "t": 1.0, "reason": "no such image"}) == \
        Exit(5, "h.0.x", 3, "no such image", at=1.0)
    assert read_message("n1", {"type": "kmsg", "lines": ["NVRM: Xid 79"], "pid_jobs": {"9": "5"},
                               "t": 1.0}) == KernelLines(("NVRM: Xid 79",), {"9": "5"}, "")


@pytest.mark.parametrize("message, expected", [
    ({"type": "exit", "job": "x", "token": 7, "code": "3", "reason": None},
     Exit(None, None, None, "")),
    ({"type": "exit", "job": 5, "code": True, "t": float("nan")}, Exit(5, None, None, "")),
    ({"type": "exit", "job": 5, "t": True}, Exit(5, None, None, "")),
    ({"type": "started", "job": None, "token": "t", "workdir": ""}, Started(None, "t", None)),
    ({"type": "phase", "job": 2, "token": "t", "text": 12}, Phase(2, "t", None)),
    ({"type": "kmsg", "lines": "one line", "pid_jobs": [1], "error": "dmesg: denied"},
     KernelLines((), {}, "dmesg: denied")),
])
def test_odd_fields_from_a_node_read_as_missing(message, expected):
    assert read_message("n1", message) == expected


def test_odd_probes_and_hellos_never_raise():
    probe = read_message("n1", {"type": "probe", "devices": "none", "pid_jobs": "x"})
    assert isinstance(probe, Probe) and probe.view.readings == [] and probe.pid_jobs == {}
    assert "devices is not a list" in probe.view.problem
    hello = read_message("n1", {"type": "hello", "max_job": True, "uid": "0", "devices": {},
                                "backends": ["nvml"], "platform": None, "runtimes": ["podman"],
                                "t": "noon"})
    assert hello == Hello()
    assert [job_number(v) for v in (12, 0, -1, 2**62, "12", 1.5, None)] == [12, 0, 0, 0, 0, 0, 0]


def test_kinds_the_head_does_not_know_are_none():
    assert read_message("n1", {"type": "reply", "id": 1, "ok": True}) is None
    assert read_message("n1", {"type": "gossip"}) is None
    assert read_message("n1", {"no": "type"}) is None


def test_messages_are_frozen_and_slotted():
    exit_ = Exit(5, "h.0.x", 0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        exit_.code = 1  # type: ignore[misc]
    assert not hasattr(exit_, "__dict__")


def _kinds_sent(source: str) -> set[str]:
    """The ``type`` of every message a node-side module builds: ``{"type": "x", …}`` and
    ``dict(…, type="x")``."""
    kinds = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Dict):
            kinds |= {v.value for k, v in zip(node.keys, node.values)
                      if isinstance(k, ast.Constant) and k.value == "type"
                      and isinstance(v, ast.Constant)}
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "dict":
            kinds |= {k.value.value for k in node.keywords
                      if k.arg == "type" and isinstance(k.value, ast.Constant)}
    return kinds


def test_every_kind_the_nodelet_sends_has_a_reader_on_the_head():
    sent = set()
    for path in (REPO / "nebula_tui" / "node").glob("*.py"):
        sent |= _kinds_sent(path.read_text())
    assert {"hello", "probe", "started", "exit", "phase", "kmsg", "reply"} <= sent
    # replies are matched with their requests by the link, never handled as messages
    assert sent - {"reply"} == KINDS


# ------------------------------------------------------------------ head -> node requests
def fields_read(source: str) -> dict[str, set[str]]:
    """op -> the request fields the nodelet's handler of that op reads (``req["x"]`` and
    ``req.get("x")``), in the handler and in the module's functions it hands ``req`` to."""
    tree = ast.parse(source)
    functions = {f.name: f for f in tree.body if isinstance(f, ast.FunctionDef)}

    def reads(name: str, seen: set[str]) -> set[str]:
        if name in seen or name not in functions:
            return set()
        seen.add(name)
        found = set()
        for node in ast.walk(functions[name]):
            if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) \
                    and node.value.id == "req" and isinstance(node.slice, ast.Constant):
                found.add(node.slice.value)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "req" \
                    and node.func.attr == "get" and isinstance(node.args[0], ast.Constant):
                found.add(node.args[0].value)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                    and any(isinstance(a, ast.Name) and a.id == "req" for a in node.args):
                found |= reads(node.func.id, seen)
        return found

    table = next(n.value for n in tree.body if isinstance(n, ast.Assign)
                 and any(isinstance(t, ast.Name) and t.id == "OPS" for t in n.targets))
    return {key.value: reads(value.id, set()) - {"id", "op"}
            for key, value in zip(table.keys, table.values)}


def shape_problems(source: str) -> list[str]:
    """Where the nodelet's requests and the protocol's shapes part: an op one side has
    and the other not, a field a handler reads that its shape does not name."""
    read = fields_read(source)
    found = [f"op {op!r} on one side only" for op in sorted(set(read) ^ set(REQUESTS))]
    for op in sorted(set(read) & set(REQUESTS)):
        shape = REQUESTS[op]
        found += [f"{op} reads {name!r}" for name in sorted(read[op] - set(shape.__annotations__))]
    return found


def test_the_request_shape_check_can_fail():
    made_up = ('def op_log(req):\n    return _read(req, req["job"])\n'
               'def _read(req, job):\n    return req.get("since")\n'
               'def op_dance(req):\n    pass\n'
               'OPS = {"log": op_log, "dance": op_dance}\n')
    problems = shape_problems(made_up)
    assert "op 'dance' on one side only" in problems and "log reads 'since'" in problems
    assert "op 'launch' on one side only" in problems and not any("'job'" in p for p in problems)


def test_every_request_the_nodelet_serves_has_its_shape_and_reads_only_its_fields():
    assert shape_problems((REPO / "nebula_tui" / "node" / "ops.py").read_text()) == []


@pytest.mark.parametrize("op, fields, problems", [
    ("log", {"job": 3, "offset": 0}, []),
    ("launch", {"job": 3, "token": "h:1", "script": "", "user": None, "record": {}}, []),
    ("cancel", {"job": 3}, ["cancel: 'grace' missing"]),
    ("signal", {"job": 3, "signal": "USR1", "twice": True}, ["signal: no field 'twice'"]),
    ("dance", {}, ["no such node request: 'dance'"]),
])
def test_a_request_is_held_to_its_shape(op, fields, problems):
    assert request_problems(op, fields) == problems
