"""The head's side of the socket: who is asking, what they ask, and the answers.

``ApiServer`` accepts connections on the Unix socket, takes each caller's Unix user from
the kernel (``SO_PEERCRED``), hands each request to its handler in ``ops.OPS`` (which
validates it field by field: a bad field is a one-line refusal naming it, and answers with
the engine) and streams events to subscribers. The protocol itself is written down in ``api.py``'s docstring.

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
from collections import Counter
from pathlib import Path

from ..api import HEARTBEAT_S, MAX_LINE
from ..model import InvalidRequest, RequestError
from ..store import StoreUnavailable
from ..waits import within
from .engine import Engine
from .requests import attach_fields, parse_request, refusal
from .ops import OPS, Served
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

def peer_user(sock: socket.socket) -> str:
    """The Unix user on the other end of a connected Unix socket, as the kernel says."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _, uid, _ = struct.unpack("3i", creds)
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid{uid}"


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
        self.served = Served(engine, on_shutdown)  # what the ops answer with

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
        # Made under another name and given its rights there, then linked in: the path
        # appears with its group's rights (a member's client connecting the moment a
        # restarted head made it was refused "ask an admin to add you to the lab's group"),
        # and never in place of another head's (a link, unlike a rename, refuses a path
        # that exists).
        made_at = self.path.with_name(f".{os.getpid()}.sock") if self.group else self.path
        with contextlib.suppress(FileNotFoundError):
            if made_at != self.path:
                made_at.unlink()  # a crashed start of this pid's
        old_umask = os.umask(0o077)  # never a moment when others could connect
        try:
            self._server = await asyncio.start_unix_server(self._serve, str(made_at),
                                                           limit=MAX_LINE)
        finally:
            os.umask(old_umask)
        if self.group and made_at != self.path:
            try:
                # Who may connect is the socket's business; who is asking, the kernel's.
                os.chown(made_at, -1, grp.getgrnam(self.group).gr_gid)
                os.chmod(made_at, 0o660)
                os.link(made_at, self.path)
            except FileExistsError:
                self._server.close()
                raise SocketTaken.at(self.path) from None
            finally:
                made_at.unlink()
        made = self.path.stat()
        self._bound = (made.st_dev, made.st_ino)

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
            handler = OPS.get(op) if isinstance(op, str) else None
            if handler is None:
                raise InvalidRequest(f"unknown request {str(op)[:40]!r}")
            reply = await handler(self.served, user, req)
        except (RequestError, StoreUnavailable) as err:
            reply = refusal(err)
        except Exception as err:  # a bug must cost one request, never the connection
            log.exception("%s request of %s failed", str(op)[:40], user)
            reply = {"ok": False, "error": f"the head service failed on this {str(op)[:40]} "
                     f"request ({type(err).__name__}: {str(err)[:200]}); see its log"}
        else:
            reply = {"ok": True, **reply}
        await self._send(writer, reply)

    async def _subscribe(self, user: str, writer: asyncio.StreamWriter) -> None:
        """The snapshot, then every event. The queue is bounded: a subscriber that falls
        MAX_BACKLOG events behind gets a fresh snapshot in place of its backlog
        (``Stream.publish``), and one that reads nothing for STALL_S is dropped."""
        queue: asyncio.Queue = asyncio.Queue(MAX_BACKLOG)
        seen = self.served.seen_by(user, listing=True)

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
