"""The head's side of the socket: who is asking, what they ask, and the answers.

``ApiServer`` accepts connections on the Unix socket, takes each caller's Unix user from
the kernel (``SO_PEERCRED``), validates every request field by field (``spec_from_request``
and the ``op_*`` methods: a bad field is a one-line refusal naming it) and answers with
the engine. The protocol itself is written down in ``api.py``'s docstring.

Bounds: a user holds at most ``MAX_CONNECTIONS_PER_USER`` connections (admins too: a
runaway script of theirs must not take the head's descriptors either); a connection that
sends no request for ``IDLE_TIMEOUT_S`` is closed; a request line is at most ``MAX_LINE``
bytes and nested at most ``requests.MAX_JSON_DEPTH`` deep. A subscriber that falls
``MAX_BACKLOG`` events behind is sent a fresh snapshot instead (``stream.Stream``), and one
that reads nothing for ``STALL_S`` is dropped. Every refusal, and every failure while
answering (a full disk), is a one-line reply; the connection stays open.
"""

from __future__ import annotations

import asyncio
import contextlib
import grp
import json
import logging
import os
import pwd
import socket
import stat
import struct
import time
from collections import Counter
from pathlib import Path

from .. import views
from ..api import HEARTBEAT_S, MAX_GPU_COUNT, MAX_LINE, MAX_WAIT_STEP_S
from ..model import InvalidRequest, JobState, RequestError
from ..store import StoreUnavailable
from ..waits import within
from .engine import Engine
from .requests import (attach_fields, job_id, number, parse_request, port_field, refusal,
                       spec_from_request, text_field, unix_time, whole)
from .stream import RESYNC

log = logging.getLogger(__name__)

#: Telemetry ("gpus" events) is written to a subscriber at most this often: what arrives
#: meanwhile goes in the same write, so 125 nodes reporting once a second wake the client
#: ~10 times, not 125. Any other event is written at once, with what is waiting (seconds).
STREAM_GATHER_S = 0.1
MAX_CONNECTIONS_PER_USER = 64
IDLE_TIMEOUT_S = 600.0
STALL_S = 60.0
#: events a subscriber may fall behind before it is resynchronised with a fresh snapshot
MAX_BACKLOG = 2000

TOGGLES_PER_S = 10.0
TOGGLE_BURST = 100


class RateLimit:
    """A token bucket per user: ``burst`` at once, then ``per_s`` a second."""

    def __init__(self, per_s: float, burst: int):
        self.per_s, self.burst = per_s, burst
        self._buckets: dict[str, tuple[float, float]] = {}  # user -> (tokens, when)

    def check(self, user: str, what: str) -> None:
        now = time.monotonic()
        tokens, when = self._buckets.get(user, (float(self.burst), now))
        tokens = min(self.burst, tokens + (now - when) * self.per_s)
        if tokens < 1:
            raise RequestError(f"too many requests to {what} from {user}: at most "
                               f"{self.per_s:g} a second; try again in a moment")
        self._buckets[user] = (tokens - 1, now)


class SocketTaken(Exception):
    """Another head answers on the socket path; str() says so in one line."""

    @classmethod
    def at(cls, path: Path) -> "SocketTaken":
        return cls(f"another head service answers on {path}; stop it first, or give this "
                   "one a socket of its own (--socket PATH)")


def socket_answers(path: Path) -> bool:
    """Whether something accepts connections on the Unix socket ``path`` now."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(2)
    try:
        probe.connect(str(path))
        return True
    except OSError:
        return False
    finally:
        probe.close()

#: The longest period one report may cover (a bound on its work).
MAX_REPORT_S = 400 * 86400
MAX_OFFSET = (1 << 63) - 1  # a byte position in a log (what a node's seek takes)
#: The most ended jobs one job_history reply holds: 100,000 were a 93 MB reply whose JSON
#: took the head's loop seconds to write (every node's messages waited meanwhile).
MAX_HISTORY_JOBS = 10_000
MAX_ATTEMPT = 10 ** 9  # a job's runs, 1 the first (a launch token holds at most 9 digits of it)


def peer_user(sock: socket.socket) -> str:
    """The Unix user on the other end of a connected Unix socket, as the kernel says."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _, uid, _ = struct.unpack("3i", creds)
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid{uid}"


def _ended_states(value) -> tuple[JobState, ...]:
    """``state`` of ``job_history``: None (every ended state), one, or a list of them."""
    names = [] if value is None else [value] if isinstance(value, str) else value
    ended = {s.value: s for s in JobState if s.finished}
    if not isinstance(names, list) or not all(isinstance(n, str) and n in ended for n in names):
        raise InvalidRequest(f"state must be one or more of {', '.join(ended)}")
    return tuple(ended[n] for n in names)


class ApiServer:
    """Serves one engine on a Unix socket."""

    def __init__(self, engine: Engine, path: Path, on_shutdown=None, group: str | None = None):
        self.engine = engine
        self.path = Path(path)
        self.on_shutdown = on_shutdown
        self.group = group  # shared-box mode: this Unix group's members may connect
        self._server: asyncio.AbstractServer | None = None
        self._bound: tuple[int, int] | None = None  # (device, inode) of the socket we made
        self._connections: Counter[str] = Counter()  # per user
        #: hold and release toggles per user (each writes an event): 1,500 a second once
        self._toggles = RateLimit(TOGGLES_PER_S, TOGGLE_BURST)

    async def start(self) -> None:
        """Take the socket path, only when nothing answers there (raises SocketTaken):
        a live head's socket is never unlinked."""
        if socket_answers(self.path):
            raise SocketTaken.at(self.path)
        with contextlib.suppress(FileNotFoundError):
            if not stat.S_ISSOCK(self.path.lstat().st_mode):
                raise SocketTaken(f"{self.path} exists and is not a socket; give the service "
                                  "another path (--socket PATH)")
            self.path.unlink()  # a stale socket: its head is gone
        old_umask = os.umask(0o077)  # never a moment when others could connect
        try:
            self._server = await asyncio.start_unix_server(self._serve, str(self.path),
                                                           limit=MAX_LINE)
        finally:
            os.umask(old_umask)
        made = self.path.stat()
        self._bound = (made.st_dev, made.st_ino)
        if self.group:
            # Who may connect is the socket's business; who is asking, the kernel's.
            os.chown(self.path, -1, grp.getgrnam(self.group).gr_gid)
            os.chmod(self.path, 0o660)

    async def close(self) -> None:
        if self._server:
            self._server.close()
        with contextlib.suppress(OSError):
            now = self.path.stat()
            if (now.st_dev, now.st_ino) == self._bound:  # ours still: not a successor's
                self.path.unlink()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        user = peer_user(writer.get_extra_info("socket"))
        try:
            if self._connections[user] >= MAX_CONNECTIONS_PER_USER:
                await self._send(writer, {"ok": False, "error": (
                    f"{user} has {MAX_CONNECTIONS_PER_USER} connections to the head service "
                    "already, the most one user may hold; close some (each command holds one, "
                    "a TUI two)")})
                return
            self._connections[user] += 1
            try:
                await self._requests(user, reader, writer)
            finally:
                self._connections[user] -= 1
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.TimeoutError):
            pass
        except asyncio.CancelledError:
            # The service is stopping (asyncio.run cancels every connection's task). Ending
            # quietly is the end of this task anyway; raised, asyncio's stream callback logs
            # it as a traceback (Python 3.11), one per connected client on every clean quit.
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def _requests(self, user: str, reader: asyncio.StreamReader,
                        writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                line = await within(IDLE_TIMEOUT_S, reader.readline())
            except asyncio.TimeoutError:
                return  # idle: a client that asks nothing holds no descriptor
            except ValueError:  # asyncio's LimitOverrunError: no end of line within MAX_LINE
                await self._send(writer, {"ok": False, "error": (
                    f"request longer than {MAX_LINE >> 20} MB; put long input in a file")})
                return
            if not line:
                return
            try:
                req = parse_request(line)
            except RequestError as err:
                await self._send(writer, refusal(err))
                continue
            if req.get("op") == "attach":  # the connection becomes the terminal's
                try:
                    job, rank, size = attach_fields(req)
                except RequestError as err:
                    await self._send(writer, refusal(err))
                    continue
                await self.engine.attach.relay(user, job, rank, size, req.get("term"), reader, writer)
                return
            await self._handle(user, req, writer)

    async def _send(self, writer: asyncio.StreamWriter, *messages: dict) -> None:
        """Write ``messages``, a line each, in one write; a client that reads nothing for
        STALL_S is dropped (asyncio.TimeoutError), so its replies cannot pile up here."""
        writer.write(b"".join(json.dumps(m).encode() + b"\n" for m in messages))
        transport = writer.transport
        if transport.get_write_buffer_size() <= transport.get_write_buffer_limits()[1]:
            return await writer.drain()  # nothing waits: at once
        # A slow reader is waited for as long as it reads; one that stopped is dropped.
        drain = asyncio.ensure_future(writer.drain())
        loop = asyncio.get_running_loop()
        left, moved_at = transport.get_write_buffer_size(), loop.time()
        while not (await asyncio.wait({drain}, timeout=1.0))[0]:
            if transport.get_write_buffer_size() < left:
                left, moved_at = transport.get_write_buffer_size(), loop.time()
            elif loop.time() - moved_at > STALL_S:
                drain.cancel()
                raise asyncio.TimeoutError
        drain.result()

    async def _handle(self, user: str, req: dict, writer: asyncio.StreamWriter) -> None:
        op = req.get("op")
        if op == "subscribe":  # outside the try: a subscriber that stalls is dropped
            await self._subscribe(user, writer)
            return
        try:
            handler = getattr(self, f"op_{op}", None) if isinstance(op, str) else None
            if handler is None:
                raise InvalidRequest(f"unknown request {str(op)[:40]!r}")
            reply = await handler(user, req)
        except (RequestError, StoreUnavailable) as err:
            reply = refusal(err)
        except Exception as err:  # a bug must cost one request, never the connection
            log.exception("%s request of %s failed", str(op)[:40], user)
            reply = {"ok": False, "error": f"the head service failed on this {str(op)[:40]} "
                     f"request ({type(err).__name__}: {str(err)[:200]}); see its log"}
        else:
            reply = {"ok": True, **reply}
        await self._send(writer, reply)

    # ----------------------------------------------------------------- ops
    async def op_ping(self, user, req):
        return {"pid": os.getpid(), "user": user}

    async def op_submit(self, user, req):
        job = await self.engine.submit_on_disk(user, spec_from_request(req, self.engine.state.settings.default_vendor))
        tasks = len(job.spec.array.indices) if job.spec.array else 1
        return {"job": views.job_json(job), "tasks": tasks}

    async def op_requeue(self, user, req):
        return {"job": views.job_json(await self.engine.requeue_job(user, job_id(req)))}

    async def op_status(self, user, req):
        return {k: v for k, v in self.engine.status().items() if k in ("summary", "nodes", "pools")}

    async def op_queue(self, user, req):
        return {"jobs": list(map(self._seen_by(user, listing=True), self.engine.queue_json()))}

    async def op_gpus(self, user, req):
        return {"gpus": self.engine.gpus_json()}

    async def op_job(self, user, req):
        return {"job": self._seen_by(user)(self.engine.job_detail(job_id(req), user))}

    async def op_report(self, user, req):
        """Per user and month, per node and day, over [since, until) (api.py: its shape)."""
        since, until = unix_time(req, "since", required=True), unix_time(req, "until", required=True)
        if until - since > MAX_REPORT_S:
            raise InvalidRequest(f"a report covers at most {MAX_REPORT_S // 86400} days; "
                                 "ask for a shorter period")
        return {"report": await self.engine.accounting.report(user, since, until)}

    async def op_job_history(self, user, req):
        """Ended jobs as views.history_json, filtered by the fields api.py lists."""
        texts = {}
        for key in ("user", "node"):
            value = req.get(key)
            if value is not None and (not isinstance(value, str) or not 0 < len(value) <= 64):
                raise InvalidRequest(f"{key} must be a name of at most 64 characters")
            texts[key] = value
        bounds = {key: unix_time(req, key) for key in ("since", "until")}
        limit = req.get("limit", 1000)
        if not whole(limit, 1, MAX_HISTORY_JOBS):
            raise InvalidRequest(f"limit must be a number from 1 to {MAX_HISTORY_JOBS}; "
                                 "ask for a shorter period (--since, --until) for more")
        jobs = await self.engine.accounting.history(user, who=texts["user"], node=texts["node"],
                                                    states=_ended_states(req.get("state")),
                                                    limit=limit, **bounds)
        seen = self._seen_by(user, listing=True)
        return {"jobs": [seen(job) for job in jobs]}

    async def op_cancel(self, user, req):
        return {"job": views.job_json(await self.engine.cancel(user, job_id(req)))}

    async def op_wait(self, user, req):
        """The job once it ended, or as it is after ``within`` seconds (the client asks again)."""
        job, within = job_id(req), req.get("within")
        if within is not None and not number(within, 1, MAX_WAIT_STEP_S):
            raise InvalidRequest(f"within must be a number of seconds from 1 to {MAX_WAIT_STEP_S}")
        ended = await self.engine.wait_finished(job, within)
        return {"job": self._seen_by(user)(views.job_json(ended)), "ended": ended.state.finished}

    def _seen_by(self, user: str, listing: bool = False):
        """What ``user`` sees of a job (as views.job_json): another user's command line only
        as an admin, or with ``cluster.commands_visible_to: everyone`` (it can hold a
        password, as ``TOKEN=hunter2`` once did); in a ``listing`` (many jobs), only the
        start of a long command (``views.listed``)."""
        everyone = self.engine.access.sees_commands_of_all(user)
        shown = views.listed if listing else (lambda job: job)

        def seen(job: dict) -> dict:
            if everyone or job.get("user") == user:
                return shown(job)
            return {**job, "command": [f"(hidden: only {job.get('user')} and admins see it)"]}
        return seen

    async def op_hold(self, user, req):
        self._toggles.check(user, "hold or release")
        return {"job": views.job_json(await self.engine.hold_job(user, job_id(req), True))}

    async def op_release(self, user, req):
        self._toggles.check(user, "hold or release")
        return {"job": views.job_json(await self.engine.hold_job(user, job_id(req), False))}

    async def op_drain(self, user, req):
        reason = req.get("reason") or ""
        if not isinstance(reason, str) or len(reason) > 200 or not reason.isprintable():
            raise InvalidRequest("reason must be one line of at most 200 characters")
        return {"node": self.engine.set_drained(user, text_field(req, "node"), True, reason).json()}

    async def op_resume(self, user, req):
        return {"node": self.engine.set_drained(user, text_field(req, "node"), False).json()}

    async def op_why(self, user, req):  # a job's answer, or a user's standing: head/why.py
        return {"why": await self.engine.why.request(req)}

    async def op_plan(self, user, req):
        return self.engine.plan(user, spec_from_request(req, self.engine.state.settings.default_vendor))

    async def op_attach_info(self, user, req):
        return {"argv": self.engine.attach_argv(user, job_id(req))}

    async def op_history(self, user, req):
        since = req.get("since", 3600)
        if not number(since, 1, MAX_REPORT_S):
            raise InvalidRequest(f"since must be a number of seconds from 1 to {MAX_REPORT_S}")
        gpu = self.engine.resolve_gpu(text_field(req, "gpu"))
        return {"gpu": gpu, "samples": self.engine.history(gpu, float(since))}

    async def op_reload(self, user, req):
        return await self.engine.reload(user)

    async def op_node_key(self, user, req):
        return {"fingerprint": await self.engine.node_key(user, text_field(req, "host"), port_field(req))}

    async def op_node_add(self, user, req):
        login, identity = req.get("user"), req.get("identity")
        for value, what in ((login, "user"), (identity, "identity")):
            if value is not None and not isinstance(value, str):
                raise InvalidRequest(f"{what} must be text")
        return await self.engine.add_node(user, text_field(req, "node"), text_field(req, "host"), port_field(req),
                                          login, identity, text_field(req, "trust"))

    async def op_node_smoke(self, user, req):
        """The smoke job on a node (just added): ``{"job", "gpu", "model", "output", "ended"}``."""
        return await self.engine.smoke.run(user, text_field(req, "node"))

    async def op_node_remove(self, user, req):
        return await self.engine.remove_node(user, text_field(req, "node"))

    async def op_quota(self, user, req):
        hours = req.get("hours")
        if not number(hours, 0, 1e9):
            raise InvalidRequest("the quota is a number of GPU-hours per month, e.g. 3000")
        self.engine.set_quota(user, text_field(req, "user"), float(hours))
        return {}

    async def op_reserve(self, user, req):  # a booking made, ended or listed: head/bookings.py
        return self.engine.bookings.request(user, req)

    async def op_gpu_resume(self, user, req):
        """An admin brings a GPU in maintenance back into service (R16/R17)."""
        gpu = await self.engine.health.resume(user, text_field(req, "gpu"), force=req.get("force") is True)
        return {"gpu": next(g for g in self.engine.gpus_json() if g["uuid"] == gpu)}

    async def op_users(self, user, req):
        return {"users": self.engine.users_json()}

    async def op_events(self, user, req):
        """The newest ``limit`` events, filtered by kind, node, job, user and since."""
        limit = req.get("limit", 100)
        if not whole(limit, 1, 10000):
            raise InvalidRequest("limit must be a number from 1 to 10000")
        names = {}
        for key in ("kind", "node", "user"):
            value = req.get(key)
            if value is not None and (not isinstance(value, str) or not 0 < len(value) <= 64):
                raise InvalidRequest(f"{key} must be a name of at most 64 characters")
            names[key] = value
        since = unix_time(req, "since")
        job = job_id(req) if req.get("job") is not None else None
        return {"events": self.engine.store.events(limit, job_id=job, since=since, **names)}

    async def op_doctor(self, user, req):
        nodes = req.get("nodes") or []
        if not isinstance(nodes, list) or len(nodes) > 10_000 or not all(
                isinstance(n, str) and n for n in nodes):
            raise InvalidRequest("nodes: give a list of node names")
        return await self.engine.doctor.check(user, list(dict.fromkeys(nodes)))

    async def op_node_show(self, user, req):
        return {"node": self.engine.fleet.show(text_field(req, "node"))}

    async def op_logs(self, user, req):
        offset = req.get("offset", 0)
        if not whole(offset, 0, MAX_OFFSET):
            raise InvalidRequest("offset must be a byte position >= 0")
        rank, offsets = req.get("rank"), req.get("offsets")
        if rank is not None and not whole(rank, 0, MAX_GPU_COUNT):
            raise InvalidRequest("--rank must be a node's rank, 0 or more")
        if offsets is not None and (not isinstance(offsets, list) or len(offsets) > MAX_GPU_COUNT
                                    or not all(whole(o, 0, MAX_OFFSET) for o in offsets)):
            raise InvalidRequest("offsets must be byte positions >= 0, one per rank")
        attempt = req.get("attempt")
        if attempt is not None and not whole(attempt, 1, MAX_ATTEMPT):
            raise InvalidRequest("--attempt must be one of the job's runs: 1 (its first) or more")
        return await self.engine.read_log(user, job_id(req), offset, rank, offsets, attempt)

    async def op_shutdown(self, user, req):
        if not self.engine.is_admin(user):
            raise RequestError("only an admin may stop the service")
        if self.on_shutdown:
            asyncio.get_running_loop().call_soon(self.on_shutdown)
        return {}

    async def _subscribe(self, user: str, writer: asyncio.StreamWriter) -> None:
        """The snapshot, then every event. The queue is bounded: a subscriber that falls
        MAX_BACKLOG events behind gets a fresh snapshot in place of its backlog
        (``Stream.publish``), and one that reads nothing for STALL_S is dropped."""
        queue: asyncio.Queue = asyncio.Queue(MAX_BACKLOG)
        seen = self._seen_by(user, listing=True)

        def snapshot() -> dict:
            snap = self.engine.subscribe(queue)
            return {"ok": True, "type": "snapshot", **snap, "jobs": [seen(j) for j in snap["jobs"]]}
        try:
            await self._send(writer, snapshot())
            while True:
                events = await gather_events(queue)
                if any(event is RESYNC for event in events):
                    events = [snapshot()]
                await self._send(writer, *(
                    {**e, "job": seen(e["job"])} if e.get("type") == "job" else e for e in events))
        finally:
            self.engine.unsubscribe(queue)


async def gather_events(queue: asyncio.Queue) -> list[dict]:
    """The next events to write, in order: all that are waiting and, while they are all
    telemetry, what follows within STREAM_GATHER_S of the first."""
    try:
        events = [await within(HEARTBEAT_S, queue.get())]
    except asyncio.TimeoutError:
        return [{"type": "tick"}]  # a quiet stream still says the head is alive
    urgent = events[0].get("type") != "gpus"
    loop = asyncio.get_running_loop()
    deadline = loop.time() + STREAM_GATHER_S
    while True:
        while not queue.empty():
            events.append(queue.get_nowait())
            urgent = urgent or events[-1].get("type") != "gpus"
        left = deadline - loop.time()
        if urgent or left <= 0:
            return events
        try:
            events.append(await within(left, queue.get()))
        except asyncio.TimeoutError:
            return events
        urgent = events[-1].get("type") != "gpus"
