"""The socket protocol between clients and the head service, and the clients' side of it.

JSON lines over a Unix socket. A client sends one request ``{"op": …, …}`` and reads one
reply ``{"ok": true, …}`` or ``{"ok": false, "error": "…", "usage": bool}`` (``usage``: a
request that could never be valid as written — a field out of its bounds, an empty name, a
job id past any there can be, no such card, a --time past max_time — which a client treats
like a usage error it caught itself: exit 2; a refusal of what is now — no such job, not
yours, already ended — is not one: exit 1); ``wait`` (``within``: at most that many seconds)
replies ``{"job", "ended"}`` when the job
ends or ``within`` has passed, whichever is first (a client that waits in such steps notices
a head that stopped answering); ``subscribe`` replies with a snapshot and then streams events until the client goes.
``submit`` takes the fields of ``head.requests.spec_from_request`` (``after_type``: ok, any,
notok or started; ``array``: "0-99%8") and answers ``{"job", "tasks"}`` (an array's
first task, and how many it has); ``cancel`` of an array's id cancels every task;
``requeue`` stops a running job and puts it back in the queue.
``why`` (``job``, or ``user``) replies ``{"why": …}``: for a job its place, the rule that
holds it, its start forecast, its user's fair share, the jobs ahead and holding its cards,
and the changes that would start it sooner, each tried on the forecast; for a user their
fair share and jobs (docs/reference.md has both shapes).
``logs`` (``job``, ``offset``; ``rank``: one node of a multi-node job, or ``offsets``: one
per rank, for all of them; ``attempt``: which run, 1 the first — a job's own ``attempt``
field counts its requeues, so its latest run is that + 1) replies ``{"data", "offset",
"size", "parts", "state", "ended"}`` (``size``: the log's size on its node as it was read,
where a client that reads the log once stops — a reply holds at most 64 KB;
``ended``: that log will not grow; an attempt the job never
had is refused with the attempts it had).
Bookings (head/bookings.py): ``reserve`` (``gpus``: "node02:0-3", or ``gpu_count`` and
``gpu_mem_mb``; ``start``: Unix seconds; ``duration_s``; ``users``: a list; ``name``)
replies ``{"booking", "note"}``; with ``"list": true`` it replies ``{"bookings": [...]}``
(those not yet over), with ``"delete": NAME`` it ends one, ``{"booking"}``. A booking is ``{"name", "gpus",
"uuids", "users", "start", "end", "created_by", "active", "broken", "gpu_hours", "when"}``.
The server learns who is asking from the kernel (``SO_PEERCRED``), never from the request.
Lists of jobs (``queue``, ``job_history``, the subscription) cut a command or data mounts
longer than ``views.LISTED_COMMAND_CHARS`` (1,024 characters), saying so in their last
word; ``job`` and ``wait`` give them whole.

Accounting: ``job_history`` (fields ``user``, ``since``, ``until`` — Unix seconds, ``state``
— one ended state or a list, ``node``, ``limit``) replies ``{"jobs": [...]}``, the newest
``limit`` (1000; at most 10,000) ended jobs that match, oldest first, each as ``views.history_json``:
``views.job_json`` plus ``wait_s``, ``run_s``, ``gpu_hours``, ``mean_util_pct``,
``idle_gpu_hours``, ``mem_used_mb_mean``, ``mem_used_mb_peak``. ``job`` answers an ended
job in that shape too. ``report`` (``since``, ``until``: Unix seconds, at most 400 days
apart) replies ``{"report": {"since", "until", "users", "nodes", "days", "bookings"}}``
(``bookings``: ``name``, ``users``, ``created_by``, ``start``, ``end``,
``booked_gpu_hours``, ``used_gpu_hours``, ``used_pct`` of each overlapping it): ``users`` a row
per user and month of the jobs that ended then (``month``, ``user``, ``jobs``,
``gpu_hours``, ``efficiency_pct`` — utilisation of its cards while held, ``idle_gpu_hours``,
``mean_wait_s``); ``nodes`` per month and ``days`` per day a row per node and one with
``"node": "cluster"`` (``period``, ``node``, ``gpus``, ``available_gpu_hours``,
``allocated_gpu_hours``, ``allocated_pct``, ``util_pct``).

The subscription: first ``{"ok": true, "type": "snapshot", "nodes", "gpus", "jobs",
"summary", "events", "users", "temperatures", "pools"}`` (``pools``: each pool as
``head.pools.Pools.view_json``, whose ``line`` `nebula status` prints; GPUs as ``views.gpu_json`` without the raw
reading, users as the ``users`` request's rows, ``bookings`` as the ``reservations``
request's ``list``, ``temperatures`` the health policy's
``{"hot_c", "warm_c"}`` that clients colour temperatures by: ``model.Temperatures``), then
one line per event, each with a ``type``:

* ``job``: ``{"job": …}``, a job as ``views.job_json`` (whole, after each change);
* ``node``: ``{"node": …}``, a node (whole; ``"state": "removed"`` when it left);
* ``event``: ``{"event": {"t", "kind", "message", "job_id", "node", "gpu", "user"}}``, a
  line of the events log exactly as the store recorded it (``events`` returns the same
  lines; ``kind`` is one of ``EVENT_KINDS``; its ``user`` filter takes the user's own lines
  and those of their jobs): every change has one, written where it happens, at the head's time;
* ``queue``: ``{"order": [job id, …]}``, the waiting jobs in the order the scheduler
  considers them (priority, fair share, submit time), after a pass changed it (at most
  every 0.5 s); the snapshot has it as ``"queue"``. After each new start forecast it also
  carries ``"starts"`` (job id -> its ``starts``, below), as the snapshot does. ``queue`` and ``job`` requests give
  each waiting job's ``queue_pos`` (its 1-based place; null before its first pass), the
  ``queue`` request its ``starts`` (the last start forecast: ``start_at``, ``early``,
  ``late`` as Unix times, null when not within ``within_s``; ``after_job``, the job
  without a --time whose estimated end it waits for; ``node``; ``made_at``), and
  ``job`` also its ``environment`` once placed (node -> the variables its command gets);
* ``pool``: ``{"pool": …}``, one pool's view (as in the snapshot's ``pools``), after each
  poll of it;
* ``bookings``: ``{"bookings": [...]}``, every booking not yet over, after one was made,
  ended, or can no longer (or again) be honoured;
* ``user``: ``{"user": …}``, one user's row as the ``users`` request returns it, after
  their figures moved (a job of theirs submitted, started, charged or ended; their quota);
* ``tick``: nothing else, after ``HEARTBEAT_S`` (15 s) with no other event: the head is
  alive, so a client that hears nothing for longer knows it is not;
* ``gpus``: ``{"node": N, "gpus": {uuid: fields}, "gone": [uuid, …]}``, after each probe
  of node N and each change to what its GPUs show: only what changed since the
  subscriber's previous state of N's GPUs (the snapshot, then every ``gpus`` event of N
  applied in order). ``fields`` holding ``"uuid"`` is a whole GPU (new to the subscriber,
  or moved to N): it replaces any earlier one; otherwise it is the fields whose values
  changed, to merge. GPUs of N not listed did not change; ``gone`` (present only when some
  went) names GPUs no longer on N. An event with no GPUs still means N reported; ``seen``
  is when the head last heard from N (its ``last_seen``, which no ``node`` event repeats).

Telemetry is gathered for up to ``head.server.STREAM_GATHER_S`` (0.1 s) and written together (one wake-up of
the client instead of one per node); any other event goes out at once.

This module is the reference of the protocol and holds what both ends share (limits, the
patterns of ``--arch``/``--cuda``); the server side is ``head/server.py``. Clients import
this module, never the head.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import struct
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar, overload

from .waits import within
from .wire import JobWire, WaitReply, WaitRequest

#: A reply's shape in ``wire``, as a caller names it: ``client.call("logs", LogsReply, …)``
#: is read as a ``LogsReply`` (``wire.REPLIES`` says which each op has; the JSON is not
#: checked here, ``tests/unit/test_wire.py`` holds the head to it).
R = TypeVar("R")

#: Every kind of line in the events log (``event["kind"]``): a job's life (submit, hold,
#: cancel, place, start, end, requeue, and what the head's limits did: idle, guard,
#: limit), nodes (node, hardware, reconcile), GPUs' health (health, xid), what admins did
#: (admin), the store's own notes (store), pools (pool: a job sent to one and its id
#: there, a pool unreachable and back) and a job past its user's quota run as preemptible
#: work (quota). ``tests/unit/test_events.py`` holds the source to it.
EVENT_KINDS = ("submit", "hold", "cancel", "place", "start", "end", "requeue", "idle", "guard",
               "limit", "node", "hardware", "reconcile", "health", "xid", "admin", "store",
               "preempt", "pool", "booking", "quota")

#: The longest request line the server reads, and a tenth of the longest reply line.
MAX_LINE = 1 << 20
MAX_GPU_COUNT = 64
# NVIDIA's sm_89, or AMD's gfx90a (the LLVM target rocm-smi reports).
ARCH_RE = re.compile(r"^(>=)?(sm_\d{2,3}|gfx\d{1,2}[0-9a-f]{2})$")
CUDA_RE = re.compile(r"^\d{1,2}\.\d{1,2}$")


#: How long a client waits for the head's reply unless ``NEBULA_TIMEOUT`` (seconds) says
#: otherwise: a head that stopped (SIGSTOP, a hung disk) is then one line, never a wait for ever.
REPLY_TIMEOUT_S = 30.0
MAX_REPLY_TIMEOUT_S = 86400.0
#: a subscription with nothing to say sends a ``tick`` this often
HEARTBEAT_S = 15.0
#: the longest step of a client's ``wait`` (the server's bound on ``within``)
MAX_WAIT_STEP_S = 3600


def reply_timeout() -> float:
    """``NEBULA_TIMEOUT`` or ``REPLY_TIMEOUT_S``; a usage ``ApiError`` for any other value."""
    text = os.environ.get("NEBULA_TIMEOUT", "").strip()
    if not text:
        return REPLY_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 1 <= value <= MAX_REPLY_TIMEOUT_S:  # NaN fails it too
        raise ApiError(f"NEBULA_TIMEOUT={text[:40]!r}: give the seconds a client waits for the "
                       f"head's reply, from 1 to {MAX_REPLY_TIMEOUT_S:.0f} (e.g. 30)", usage=True)
    return value


def peer_pid(sock: socket.socket) -> int | None:
    """The pid of the process on the other end of a connected Unix socket (the kernel's word)."""
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return None
    return struct.unpack("3i", creds)[0] or None


def no_answer(path: Path, sock: socket.socket | None, seconds: float) -> "NoAnswer":
    """The one line of a head that took the connection (``sock``, when connected) and said
    nothing for ``seconds``."""
    pid = peer_pid(sock) if sock is not None else None
    who = f"the head service (pid {pid})" if pid else f"the head service at {path}"
    return NoAnswer(f"{who} did not answer within {seconds:g} s: it is stopped or busy; try "
                    "again, or ask its admin to look (NEBULA_TIMEOUT=SECONDS waits longer)")


class ApiError(Exception):
    """The service refused a request or could not be reached; str() is the one-line reason.
    ``usage``: the request could never be valid as written (a client exits 2, as on a usage
    error it catches itself); otherwise it was refused for what is now (exit 1)."""

    def __init__(self, message: str, usage: bool = False) -> None:
        super().__init__(message)
        self.usage = usage


class NoAnswer(ApiError):
    """A head is there (it holds the socket) but did not answer in time: stopped or stuck.
    Starting another beside it would help nobody."""


class Client:
    """A blocking client for the CLI: one connection, request/reply."""

    def __init__(self, path: Path, timeout: float | None = None):
        """Connect to ``path``; ``timeout``: how long any reply is waited for (None: the
        ``reply_timeout``)."""
        self.path = Path(path)
        self.timeout = reply_timeout() if timeout is None else timeout
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        try:
            self.sock.connect(str(self.path))
        except socket.timeout:
            self.sock.close()
            raise no_answer(self.path, None, self.timeout) from None
        except OSError as err:
            self.sock.close()
            raise ApiError(f"cannot reach the head service at {self.path}: {err.strerror}") from None
        self._file = self.sock.makefile("rb")

    def close(self) -> None:
        self._file.close()
        self.sock.close()

    def peer(self) -> tuple[int, int]:
        """(pid, uid) of the process serving this socket, as the kernel says."""
        creds = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        pid, uid, _gid = struct.unpack("3i", creds)
        return pid, uid

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @overload
    def call(self, op: str, reply: type[R], timeout: float | None = None, **fields: Any) -> R: ...

    @overload
    def call(self, op: str, reply: None = None, timeout: float | None = None, **fields: Any) -> dict[str, Any]: ...

    def call(self, op: str, reply: type[Any] | None = None, timeout: float | None = None, **fields: Any) -> Any:
        """One request; raises ApiError with the service's reason when it refuses, or when
        no reply came within ``timeout`` seconds (at least the client's own timeout). Read
        as ``reply``, the op's shape in ``wire``, when one is named."""
        self.sock.settimeout(max(timeout or 0, self.timeout))
        try:
            self.sock.sendall(json.dumps({"op": op, **fields}).encode() + b"\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused before it was read whole (too long): the reply says why
        answer = self._read()
        if not answer.get("ok"):
            raise ApiError(answer.get("error", "request failed"), usage=bool(answer.get("usage")))
        return answer

    def wait(self, job: int) -> JobWire:
        """The job once it ended, asked for in steps of the client's timeout, so a head that
        stops answering meanwhile is noticed within two of them."""
        while True:
            within = min(self.timeout, MAX_WAIT_STEP_S)
            reply = self.call("wait", WaitReply, timeout=within + self.timeout,
                              **WaitRequest(job=job, within=within))
            if reply.get("ended"):
                return reply["job"]

    def _read(self) -> dict[str, Any]:
        try:
            line = self._file.readline()
        except socket.timeout:
            raise no_answer(self.path, self.sock, self.sock.gettimeout() or self.timeout) from None
        if not line:
            raise ApiError("the head service closed the connection")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def events(self) -> Iterator[dict[str, Any]]:
        """Subscribe: the snapshot first, then every event."""
        self.sock.settimeout(None)
        self.sock.sendall(b'{"op": "subscribe"}\n')
        while True:
            yield self._read()


class AsyncClient:
    """An asyncio client (the TUI): request/reply and an event stream on its own connection."""

    def __init__(self, path: Path):
        self.path = Path(path)

    @overload
    async def call(self, op: str, reply: type[R], **fields: Any) -> R: ...

    @overload
    async def call(self, op: str, reply: None = None, **fields: Any) -> dict[str, Any]: ...

    async def call(self, op: str, reply: type[Any] | None = None, **fields: Any) -> Any:
        """One request; ApiError when refused, or when no reply came within the
        ``reply_timeout``. Read as ``reply``, the op's shape in ``wire``, when one is named."""
        seconds = reply_timeout()
        reader, writer = await self._open_within(seconds)
        try:
            writer.write(json.dumps({"op": op, **fields}).encode() + b"\n")
            await within(seconds, writer.drain())
            line = await within(seconds, reader.readline())
        except TimeoutError:
            raise no_answer(self.path, writer.get_extra_info("socket"), seconds) from None
        finally:
            writer.close()
        if not line:
            raise ApiError("the head service closed the connection")
        answer: dict[str, Any] = json.loads(line)
        if not answer.get("ok"):
            raise ApiError(answer.get("error", "request failed"))
        return answer

    async def events(self, decode: Callable[[bytes], Any] = json.loads) -> AsyncIterator[dict[str, Any]]:
        """Subscribe: the snapshot first, then every event, each line read with ``decode``.
        The snapshot is waited for at most the ``reply_timeout``, and each line after it at
        most that and a ``HEARTBEAT_S`` more (a head with nothing to say ticks): a head that
        stops answering is an ApiError, never a stream that is merely quiet."""
        seconds = reply_timeout()
        reader, writer = await self._open_within(seconds)
        try:
            writer.write(b'{"op": "subscribe"}\n')
            try:
                await within(seconds, writer.drain())
                line = await within(seconds, reader.readline())
            except TimeoutError:
                raise no_answer(self.path, writer.get_extra_info("socket"), seconds) from None
            while line:
                yield decode(line)
                try:
                    line = await within(seconds + HEARTBEAT_S, reader.readline())
                except TimeoutError:
                    raise no_answer(self.path, writer.get_extra_info("socket"),
                                    seconds + HEARTBEAT_S) from None
        finally:
            writer.close()
        raise ApiError("the head service closed the event stream")

    async def _open_within(self, seconds: float) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        try:
            return await within(seconds, asyncio.open_unix_connection(str(self.path), limit=64 * MAX_LINE))
        except TimeoutError:
            raise no_answer(self.path, None, seconds) from None
        except OSError as err:
            raise ApiError(f"cannot reach the head service at {self.path}: {err.strerror}") from None
