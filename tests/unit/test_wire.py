"""The shapes of ``nebula_tui/wire.py`` are the ones that travel: a real head's job, GPU and
node carry exactly their fields, and what the CLI and the TUI's form send, and the head
reads of a submit request, are fields of ``SubmitRequest``. (mypy holds the annotated
builders to them; this holds the running code, which builds them as plain dicts.)"""

from __future__ import annotations

import getpass


from nebula_tui import views
from nebula_tui.cli import build_parser
from nebula_tui.cli.jobs import submit_request
from nebula_tui.head.requests import spec_from_request
from nebula_tui.model import JobSpec
from nebula_tui.screens.submit import request_fields
from nebula_tui.wire import GpuWire, JobWire, NodeWire, SubmitRequest


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
