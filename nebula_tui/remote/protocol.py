"""The wire between the head and its nodelets, typed both ways: each line a node sends is
read here once, into one frozen message, and the head's handlers take its fields (never the
raw dict); each request the head sends is one of the ``*Request`` shapes below, checked
against them before it leaves (``request_problems``), and each reply one of the ``*Reply``
shapes.

A node is not trusted: :func:`read_message` never raises on odd content. A field of the
wrong type reads as its "missing" value (a job number that is not one: ``None``; a
``pid_jobs`` that is no mapping: empty), so a handler only ever checks for that. Replies
to the head's requests are matched with their requests in ``ssh.NodeLink`` and are not
messages here. The nodelet's docstring (``node/nodelet.py``) lists every field it sends.

The requests are ``TypedDict``s of their fields (the ``id`` and ``op`` the link adds are
not among them): on the wire still the plain JSON object the nodelet reads, while
``REQUESTS`` names each op's shape, so that ``request_problems`` refuses an op or a field
the nodelet does not know, or a required field left out, and
``tests/unit/test_protocol.py`` holds the nodelet's ``ops.OPS`` and what each op reads
to the same list.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NotRequired, TypedDict

from .readings import ProbeView, hello_cuda_version, hello_topology, read_probe


@dataclass(frozen=True, slots=True)
class Hello:
    """Once per connection: the node's facts, which ``nebula node show``, the doctor and
    the launches read (a node not heard from yet has this one, every field missing)."""

    hostname: str | None = None
    python: str | None = None  # its python3's version ("3.6.8")
    uid: int | None = None  # the login's: 0 when the nodelet runs as root
    node_dir: str | None = None  # its job directories' root
    #: ``kind`` ("linux", "wsl2"), the kernel's ``release``, ``dev_nvidia`` (nodelet.platform)
    platform: dict[str, Any] = field(default_factory=dict)
    runtimes: dict[str, str] = field(default_factory=dict)  # container runtime -> its version
    #: the hardware backends that serve it, ``{"name", "vendor"}`` each, preferred first
    backends: tuple[dict[str, Any], ...] = ()
    #: its devices' first readings (static facts: persistence mode, MIG parents, PCIe links)
    devices: tuple[dict[str, Any], ...] = ()
    #: the highest job number the node holds of this head's store (0: none)
    max_job: int = 0
    #: the highest CUDA version the node's driver supports ("12.4"), or None
    cuda_version: str | None = None
    #: the node's link matrix (``readings.hello_topology``), or None when it sent none
    topology: dict[str, Any] | None = None
    #: the node's clock when it said hello (its offset from the head's), None: unsaid
    t: float | None = None


@dataclass(frozen=True, slots=True)
class Probe:
    """Every probe interval: the devices' readings and who holds them."""

    view: ProbeView
    #: pid -> job, for the GPU processes of this head's jobs
    pid_jobs: dict[str, str] = field(default_factory=dict)
    #: pid -> Unix user, for the GPU processes that are no job of ours
    pid_users: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Started:
    """A job's attempt passed its checks; ``workdir``: where its command runs (None: unsaid)."""

    job: int | None
    token: str | None
    workdir: str | None = None


@dataclass(frozen=True, slots=True)
class Phase:
    """What a starting job does before its command ("" when done; None: unsaid)."""

    job: int | None
    token: str | None
    text: str | None = None


@dataclass(frozen=True, slots=True)
class Exit:
    """A job's attempt ended: ``code`` None when it vanished without one; ``reason`` why its
    part could not start, if so ("" otherwise)."""

    job: int | None
    token: str | None
    code: int | None = None
    reason: str = ""
    #: when it ended by the node's clock (its exit code's file), None: unsaid. The job's
    #: user owns that file: the head takes it only for an end it did not hear at once
    at: float | None = None


@dataclass(frozen=True, slots=True)
class KernelLines:
    """Kernel log lines logged since the last look, or why the log cannot be read."""

    lines: tuple[str, ...] = ()
    #: pid -> job for the pids the lines name
    pid_jobs: dict[str, str] = field(default_factory=dict)
    #: "" when the log was read
    error: str = ""


NodeMessage = Hello | Probe | Started | Phase | Exit | KernelLines


def read_message(node: str, message: dict[str, Any]) -> NodeMessage | None:
    """One line of ``node``'s, decoded from JSON, as its message; None for a kind the head
    does not know (a newer nodelet's) or a line that is no object."""
    reader = _READERS.get(str(message.get("type"))) if isinstance(message, dict) else None
    return reader(node, message) if reader is not None else None


def _hello(node: str, message: dict[str, Any]) -> Hello:
    uid = message.get("uid")
    return Hello(hostname=_text(message.get("hostname")), python=_text(message.get("python")),
                 uid=uid if isinstance(uid, int) and not isinstance(uid, bool) else None,
                 node_dir=_text(message.get("node_dir")), platform=_mapping(message.get("platform")),
                 runtimes=_mapping(message.get("runtimes")), backends=_dicts(message.get("backends")),
                 devices=_dicts(message.get("devices")), max_job=job_number(message.get("max_job")),
                 cuda_version=hello_cuda_version(message), topology=hello_topology(message),
                 t=node_time(message.get("t")))


def _probe(node: str, message: dict[str, Any]) -> Probe:
    return Probe(view=read_probe(node, message), pid_jobs=_names(message.get("pid_jobs")),
                 pid_users=_names(message.get("pid_users")))


def _started(node: str, message: dict[str, Any]) -> Started:
    workdir = message.get("workdir")
    return Started(job=_job(message.get("job")), token=_text(message.get("token")),
                   workdir=workdir if isinstance(workdir, str) and workdir else None)


def _phase(node: str, message: dict[str, Any]) -> Phase:
    text = message.get("text")
    return Phase(job=_job(message.get("job")), token=_text(message.get("token")),
                 text=text if isinstance(text, str) else None)


def _exit(node: str, message: dict[str, Any]) -> Exit:
    code = message.get("code")
    reason = message.get("reason")
    return Exit(job=_job(message.get("job")), token=_text(message.get("token")),
                code=code if isinstance(code, int) and not isinstance(code, bool) else None,
                reason=str(reason) if reason else "", at=node_time(message.get("t")))


def _kernel(node: str, message: dict[str, Any]) -> KernelLines:
    lines = message.get("lines")
    error = message.get("error")
    return KernelLines(
        lines=tuple(str(line) for line in lines) if isinstance(lines, list) else (),
        pid_jobs=_names(message.get("pid_jobs")), error=str(error) if error else "")


_READERS: dict[str, Callable[[str, dict[str, Any]], NodeMessage]] = {
    "hello": _hello, "probe": _probe, "started": _started, "phase": _phase, "exit": _exit, "kmsg": _kernel}
#: Every kind of message the head reads (the ``type`` of a nodelet's line, replies aside).
KINDS = frozenset(_READERS)


def _job(value: object) -> int | None:
    """A job number as the node writes it (its directory's name, or a number); None when
    it is not one."""
    try:
        number: int = int(value)  # type: ignore[call-overload]
        return number
    except (TypeError, ValueError):
        return None


def job_number(value: object) -> int:
    """A job number from a node's message, such as the hello's highest; anything else (a
    node is not trusted) is 0."""
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 < value < 2**62
    return value if ok else 0  # type: ignore[return-value]


def node_time(value: object) -> float | None:
    """A time in seconds since the epoch as a node sends it; None unless a finite number."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None  # type: ignore[arg-type]


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _mapping(value: object) -> dict[str, Any]:
    return dict(value) if isinstance(value, dict) else {}


def _dicts(value: object) -> tuple[dict[str, Any], ...]:
    return tuple(v for v in value if isinstance(v, dict)) if isinstance(value, list) else ()


def _names(value: object) -> dict[str, str]:
    """A ``{pid: name}`` map as sent, keys and values as strings (a None value left out);
    empty when it is none."""
    if not isinstance(value, dict):
        return {}
    return {str(k): str(v) for k, v in value.items() if v is not None}


# ------------------------------------------------------------------ head -> node
class LaunchRequest(TypedDict):
    """Write the job's run script and start its tmux session, once per launch token."""

    job: int
    token: str  # ``<head>:<attempt>``: whose launch, which attempt
    script: str  # the run script the head wrote (``remote/launcher.py``), already quoted
    user: str | None  # run it as this Unix user (a shared box), or as the login
    record: dict[str, Any]  # what the node keeps of the job (``launch_record``)


class CancelRequest(TypedDict):
    """SIGTERM the job's processes, kill its session ``grace`` seconds later."""

    job: int
    grace: float
    token: NotRequired[str]  # only this launch's session: a relaunch's is left alone


class AckRequest(TypedDict):
    """The head recorded these exits: ``[job, token]`` or ``[job, token, end]`` each."""

    jobs: list[list[Any]]


class LogRequest(TypedDict):
    """Read part of the job's output log (an attempt's, when given)."""

    job: int
    offset: NotRequired[int]
    limit: NotRequired[int]
    attempt: NotRequired[int]


class ListRequest(TypedDict):
    """Every job directory and tmux session of this head's, for the reconcile."""

    records: NotRequired[bool]  # with each attempt's launch record


class SignalRequest(TypedDict):
    """USR1 or TERM to the job's processes, KILL to its session."""

    job: int
    signal: str
    once: NotRequired[bool]  # no USR1 when this attempt had one already


class NoteRequest(TypedDict):
    """Append one line of the head's to the job's log."""

    job: int
    text: str


class SelftestRequest(TypedDict):
    """The GPU self-test on one card (the reply's ``result``: ``scheduler.health``'s input)."""

    gpu: str
    command: list[str] | None  # the site's own test, or None for the built-in ones


class ResetRequest(TypedDict):
    """``nvidia-smi -r`` of one card."""

    gpu: str


#: op -> the shape of its fields: every request the nodelet serves (``node/ops.py``'s OPS)
REQUESTS: dict[str, type] = {
    "launch": LaunchRequest, "cancel": CancelRequest, "ack": AckRequest, "log": LogRequest,
    "list": ListRequest, "signal": SignalRequest, "note": NoteRequest, "selftest": SelftestRequest,
    "reset": ResetRequest,
}


def request_problems(op: str, fields: dict[str, Any]) -> list[str]:
    """What is wrong with request ``op`` of ``fields`` by its shape ([] when nothing): an op
    the nodelet does not serve, a field it does not read, a required field left out."""
    shape = REQUESTS.get(op)
    if shape is None:
        return [f"no such node request: {op!r}"]
    known: dict[str, object] = shape.__annotations__
    # Read from the annotations' text: under ``from __future__ import annotations`` Python
    # 3.11's ``__required_keys__`` does not see a ``NotRequired`` written as a string.
    required = {name for name, kind in known.items()
                if not getattr(kind, "__forward_arg__", str(kind)).startswith("NotRequired[")}
    return [*(f"{op}: no field {name!r}" for name in sorted(set(fields) - set(known))),
            *(f"{op}: {name!r} missing" for name in sorted(required - set(fields)))]


# ------------------------------------------------------------------ node -> head: replies
class Reply(TypedDict):
    """Every reply: ``ok``, and when not, the node's one line of why."""

    ok: bool
    error: NotRequired[str]


class LaunchReply(Reply):
    already: NotRequired[bool]  # this launch had started before (a head's retry)


class CancelReply(Reply):
    alive: NotRequired[bool]


class LogReply(Reply):
    exists: NotRequired[bool]
    data: NotRequired[str]
    offset: NotRequired[int]  # where the next read starts
    size: NotRequired[int]


class ListReply(Reply):
    jobs: NotRequired[dict[str, dict[str, Any]]]  # job -> its latest attempt
    attempts: NotRequired[dict[str, dict[str, dict[str, Any]]]]  # job -> attempt -> facts
    sessions: NotRequired[list[str]]
    session_tokens: NotRequired[dict[str, str | None]]


class SignalReply(Reply):
    pids: NotRequired[list[int]]
    alive: NotRequired[bool]
    first: NotRequired[bool]  # the attempt's first USR1


class SelftestReply(Reply):
    result: NotRequired[dict[str, Any]]


class ResetReply(Reply):
    reset: NotRequired[bool]
    detail: NotRequired[str]

