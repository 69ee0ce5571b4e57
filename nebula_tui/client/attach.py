"""``nebula attach``'s side of the relay: this terminal, raw, joined to a job's tmux session
through the head service (see ``head/attach.py`` for the wire). Stdlib only, like the CLI.

The terminal is put in raw mode (keys go to tmux as typed, Ctrl-C included) and restored
however the session ends; a window resize (SIGWINCH) is sent on. tmux's own detach
(prefix, then ``d``) ends it and leaves the job running.
"""

from __future__ import annotations

import base64
import json
import os
import select
import signal
import socket
import sys
import termios
import tty
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..api import ApiError, no_answer, reply_timeout
from ..wire import AttachRequest


def _size() -> tuple[int, int]:
    """The terminal's own size (not $COLUMNS/$LINES, which a shell may have left stale)."""
    try:
        size = os.get_terminal_size(sys.stdin.fileno())
    except OSError:
        return 80, 24
    return size.columns, size.lines


def _send(sock: socket.socket, event: dict[str, Any]) -> None:
    sock.sendall(json.dumps(event).encode() + b"\n")


def attach(path: Path, job: int, rank: int = 0) -> bool:
    """Relay until the session detaches or ends; True when it ended (its command exited),
    False on a detach. Raises ApiError when refused."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    seconds = reply_timeout()
    sock.settimeout(seconds)  # the head's answer, as any reply; the relay then waits on keys
    try:
        sock.connect(str(path))
        cols, rows = _size()
        _send(sock, {"op": "attach", **AttachRequest(job=job, rank=rank, cols=cols, rows=rows,
                                                     term=os.environ.get("TERM", "xterm-256color"))})
        buffered = b""
        while b"\n" not in buffered:
            chunk = sock.recv(65536)
            if not chunk:
                raise ApiError("the head service closed the connection")
            buffered += chunk
    except socket.timeout:
        refusal = no_answer(path, sock, seconds)
        sock.close()
        raise refusal from None
    except OSError as err:
        sock.close()
        raise ApiError(f"cannot reach the head service at {path}: {err.strerror}") from None
    sock.settimeout(None)
    line, rest = buffered.split(b"\n", 1)
    reply = json.loads(line)
    if not reply.get("ok"):
        sock.close()
        raise ApiError(reply.get("error", "attach refused"))
    if not sys.stdin.isatty():  # asked after the head's answer: a refusal says why first
        sock.close()
        raise ApiError("attach needs a terminal (run it in one, or read the output with "
                       f"`nebula logs {job} -f`)")
    print(detach_keys(os.environ), file=sys.stderr, flush=True)
    return _relay(sock, rest)


def detach_keys(environ: Mapping[str, str]) -> str:
    """How to leave the job's session and keep it running. Inside the user's own tmux
    (``$TMUX``) the first Ctrl-b goes to that tmux: it takes Ctrl-b twice."""
    if environ.get("TMUX"):
        return ("Attaching inside your own tmux: detach with Ctrl-b Ctrl-b d (the first Ctrl-b goes "
                "to your tmux); the job runs on")
    return "Attaching: detach with Ctrl-b d; the job runs on"


# What tmux's client prints as it leaves when the session itself is gone (a detach prints
# "[detached (from session …)]").
SESSION_GONE = b"[exited]"


def _relay(sock: socket.socket, first: bytes) -> bool:
    stdin, stdout = sys.stdin.fileno(), sys.stdout.fileno()
    saved = termios.tcgetattr(stdin)
    resized = os.pipe()  # the SIGWINCH handler only writes a byte: the loop sends the size
    os.set_blocking(resized[1], False)
    old_handler = signal.signal(signal.SIGWINCH, lambda *_: _poke(resized[1]))
    try:
        tty.setraw(stdin)
        if first:
            os.write(stdout, first)
        tail = first[-64:]
        while True:
            ready, _, _ = select.select([stdin, sock, resized[0]], [], [])
            if sock in ready:
                data = sock.recv(65536)
                if not data:  # detached, or the session ended
                    return SESSION_GONE in tail
                os.write(stdout, data)
                tail = (tail + data)[-64:]
            if stdin in ready:
                keys = os.read(stdin, 4096)
                if not keys:
                    return False
                _send(sock, {"data": base64.b64encode(keys).decode()})
            if resized[0] in ready:
                os.read(resized[0], 64)
                _send(sock, {"resize": list(_size())})
    except (BrokenPipeError, ConnectionError):
        return False
    finally:
        termios.tcsetattr(stdin, termios.TCSAFLUSH, saved)
        signal.signal(signal.SIGWINCH, old_handler)
        for fd in resized:
            os.close(fd)
        sock.close()


def _poke(fd: int) -> None:
    try:
        os.write(fd, b"!")
    except OSError:
        pass
