"""The nodelet's messages to the head, typed: each line a node sends is read here once, into
one frozen message, and the head's handlers take its fields (never the raw dict).

A node is not trusted: :func:`read_message` never raises on odd content. A field of the
wrong type reads as its "missing" value (a job number that is not one: ``None``; a
``pid_jobs`` that is no mapping: empty), so a handler only ever checks for that. Replies
to the head's requests are matched with their requests in ``ssh.NodeLink`` and are not
messages here. The nodelet's docstring (``node/nodelet.py``) lists every field it sends.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

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
                 cuda_version=hello_cuda_version(message), topology=hello_topology(message))


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
                reason=str(reason) if reason else "")


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
