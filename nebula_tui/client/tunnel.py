"""``nebula --host BOX``: use the head service of another machine, over SSH.

One asyncssh connection to BOX, configured as OpenSSH would be: ``~/.ssh/config`` applies
(HostName, User, Port, IdentityFile, ProxyJump …), keys come from the agent and the usual
files, and BOX's host key must already be in ``known_hosts`` — an unknown or changed key is
refused, never accepted unseen. A Unix socket on this machine, in a private (0700)
temporary directory, is forwarded to the service's socket on BOX (OpenSSH's stream-local
forwarding), so every client — the CLI's and the TUI's — talks to it as to a local service.
On BOX the socket is opened by the SSH session of the user's own login, so the service's
peer credentials name that login: no token, nothing to leak, nothing to forge.

The connection lives in a background thread with its own event loop for as long as the
command (or the TUI) runs. A client ended by SIGHUP (its terminal closed) or SIGTERM
removes that directory and closes the connection before it dies of the signal, as a
``with`` block's end would; a signal the process ignores (``nohup``) stays ignored. Only
``nebula --host`` imports this module (and asyncssh).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

import asyncssh

from ..homedir import SYSTEM_SOCKET
from ..waits import within
from .service import ServiceUnavailable

#: How long logging in to the box (and finding its service) may take.
CONNECT_TIMEOUT_S = 20.0
#: The signals that end a client with no chance for its ``with`` block to unwind.
ENDING_SIGNALS = (signal.SIGHUP, signal.SIGTERM)
#: what ``signal.signal`` takes and ``signal.getsignal`` gives back
_Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None
T = TypeVar("T")
#: The longest path a Unix socket may have (Linux's sun_path is 108 bytes with its NUL).
SOCKET_PATH_MAX = 107


def open_tunnel(host: str, remote_socket: str | None = None,
                timeout: float = CONNECT_TIMEOUT_S) -> "Tunnel":
    """Log in to ``host`` (``[USER@]BOX``) and forward a local socket to its service.

    ``remote_socket`` is the service's socket on the box; by default the shared service's
    (``/run/nebula/nebula.sock``), else the login's own (``~/.nebula/nebula.sock``).
    Raises ServiceUnavailable with a one-line reason. Close it (or use ``with``) when done.
    """
    return Tunnel(host, remote_socket, timeout)


class Tunnel:
    """A live SSH connection to the box and the local socket forwarded to its service."""

    def __init__(self, host: str, remote_socket: str | None, timeout: float):
        self.host = host
        user, _, box = host.rpartition("@")
        self._user, self._box = user or None, box
        self._timeout = timeout
        self._conn: asyncssh.SSHClientConnection | None = None
        self.remote_socket = remote_socket
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="nebula-ssh",
                                        daemon=True)
        self._thread.start()
        self._dir: str | None = None
        self._previous = self._catch_ending_signals()
        try:
            self._dir = _private_socket_dir()
            self.local_socket = Path(self._dir) / "nebula.sock"
            self._run(self._open(), timeout + 5)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> "Tunnel":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    async def _open(self) -> None:
        try:
            login = {"username": self._user} if self._user else {}  # else ~/.ssh/config's
            self._conn = await within(self._timeout, asyncssh.connect(self._box, **login))
            self.remote_socket = await self._find_service(self._conn)
            await self._conn.forward_local_path(str(self.local_socket), self.remote_socket)
        except asyncssh.HostKeyNotVerifiable:
            raise ServiceUnavailable(
                f"cannot connect to {self.host}: its host key is not in your known_hosts (or "
                f"changed); check its fingerprint with the box's admin, then `ssh {self.host}` "
                f"once to record it (a changed key: `ssh-keygen -R HOSTNAME` first)") from None
        except asyncssh.PermissionDenied:
            raise ServiceUnavailable(
                f"cannot log in to {self.host}: permission denied (is your key in its "
                "authorized_keys, and your agent running?)") from None
        except asyncio.TimeoutError:
            raise ServiceUnavailable(
                f"cannot connect to {self.host}: no answer within {self._timeout:.0f}s") from None
        except asyncssh.Error as err:
            raise ServiceUnavailable(f"cannot connect to {self.host}: {_one_line(err.reason)}") from None
        except OSError as err:
            raise ServiceUnavailable(
                f"cannot connect to {self.host}: {_one_line(err.strerror or str(err))}") from None

    async def _find_service(self, conn: asyncssh.SSHClientConnection) -> str:
        """The first socket on the box a service answers on (opening it is the test)."""
        tried = [self.remote_socket or str(SYSTEM_SOCKET)]
        if await _answers(conn, tried[0]):
            return tried[0]
        if not self.remote_socket:  # no shared service: the login's own, under its home
            out = (await conn.run('printf %s "$HOME"', check=True, timeout=self._timeout)).stdout
            home = out.decode() if isinstance(out, bytes) else out or ""
            tried.append(f"{home}/.nebula/nebula.sock")
            if await _answers(conn, tried[1]):
                return tried[1]
        raise ServiceUnavailable(
            f"no head service answers on {self.host} (tried {', '.join(tried)}); start it "
            "there (`nebula serve`, or `systemctl start nebula`), or name its socket with --socket")

    def close(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            try:
                self._run(_close(conn), 5)
            except Exception:  # noqa: BLE001 — closing a dead connection may fail; we are leaving
                pass
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
        if not self._loop.is_running():
            self._loop.close()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
        self._release_ending_signals()

    # ------------------------------------------------------------------ signals
    def _catch_ending_signals(self) -> dict[int, _Handler]:
        """Handle SIGHUP and SIGTERM (those not ignored) until ``close``; returns what was
        there before. Only the main thread may; a tunnel opened elsewhere handles none."""
        if threading.current_thread() is not threading.main_thread():
            return {}
        previous: dict[int, _Handler] = {}
        for signo in ENDING_SIGNALS:
            handler = signal.getsignal(signo)
            if handler is not signal.SIG_IGN:
                previous[signo] = handler
                signal.signal(signo, self._ended_by)
        return previous

    def _release_ending_signals(self) -> None:
        previous, self._previous = self._previous, {}
        for signo, handler in previous.items():
            if signal.getsignal(signo) == self._ended_by:
                signal.signal(signo, handler if handler is not None else signal.SIG_DFL)

    def _ended_by(self, signo: int, frame: FrameType | None) -> None:
        """Clean up, then die of the signal as if it had never been caught (or let the
        handler that was there before have it)."""
        handler = self._previous.get(signo, signal.SIG_DFL)
        self.close()
        if callable(handler):
            handler(signo, frame)
        else:
            signal.signal(signo, signal.SIG_DFL)
            os.kill(os.getpid(), signo)


def _private_socket_dir() -> str:
    """A new 0700 directory (nobody else may use our login) whose ``nebula.sock`` fits a
    Unix socket's path: under $TMPDIR, else — a long $TMPDIR — under $XDG_RUNTIME_DIR or
    /tmp, which are short."""
    for parent in [None] + [d for d in (os.environ.get("XDG_RUNTIME_DIR"), "/tmp") if d]:
        try:
            made = tempfile.mkdtemp(prefix="nebula-ssh-", dir=parent)
        except OSError:  # a missing or read-only directory: the next one
            continue
        if len(os.fsencode(os.path.join(made, "nebula.sock"))) <= SOCKET_PATH_MAX:
            return made
        os.rmdir(made)
    raise ServiceUnavailable(
        f"cannot make the local socket: TMPDIR ({tempfile.gettempdir()}) and /tmp are missing, "
        f"read-only or too long for a Unix socket's path ({SOCKET_PATH_MAX} bytes); set TMPDIR "
        "to a short directory you can write")


async def _answers(conn: asyncssh.SSHClientConnection, path: str) -> bool:
    try:
        _, writer = await conn.open_unix_connection(path)
    except asyncssh.ChannelOpenError:
        return False
    writer.close()
    return True


async def _close(conn: asyncssh.SSHClientConnection) -> None:
    conn.close()
    await conn.wait_closed()


def _one_line(text: str) -> str:
    return " ".join(str(text).split()) or "connection failed"
