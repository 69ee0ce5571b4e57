"""Attach for everyone (R13, R33): a job's tmux session relayed over the Unix socket.

The head opens a terminal channel on its own SSH connection to the job's node and runs
``tmux attach`` there; the client's keys and window size come in over the socket, the
terminal's output goes back. So nobody but the service needs the nodes' key, and who may
attach is decided here like any request: the job's owner and the admins.

The wire, after the request ``{"op": "attach", "job", "rank", "term", "cols", "rows"}``: one
reply line (``{"ok": true, "node", "session"}`` or a refusal), then raw terminal output from
the head until the session detaches or ends, while the client sends one JSON line per
event: ``{"data": base64}`` (keys) or ``{"resize": [cols, rows]}``. Either side closing ends
it; closing the channel only detaches the tmux client, the job runs on.

Every attach is one session channel on the head's one connection to the node, so the
node's sshd bounds them (OpenSSH's MaxSessions, 10 a connection by default; MaxStartups
counts connections, and the head opens one a node). The nodelet holds one channel. So
attaches are capped (R13): ATTACHES_PER_USER across the cluster, admins included (a script
of an admin's fills a node as well as anyone's), and ATTACHES_PER_NODE on one node, twice
the per-user cap, so one user never holds more than half a node's room. Each attach holds
its place from before its channel opens until its relay ends, however it ends.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import logging
from collections import Counter
from dataclasses import dataclass

import asyncssh

from ..model import RequestError
from ..remote import launcher
from ..remote.ssh import NodeUnavailable
from ..waits import within
from .access import Access
from .state import HeadState, job_nodes

log = logging.getLogger(__name__)

MAX_SIDE = 1000  # columns or rows of a terminal: a bound on what a client may ask
TERM_TYPES = ("xterm", "xterm-256color", "screen", "screen-256color", "tmux", "tmux-256color",
              "vt100", "vt220", "linux", "rxvt-unicode", "rxvt-unicode-256color", "alacritty",
              "xterm-kitty", "foot", "dumb")

#: Sessions one user may hold attached at once, on all nodes together.
ATTACHES_PER_USER = 4
#: The channels OpenSSH's sshd lets one connection open (MaxSessions' default).
NODE_SESSIONS = 10
#: Attaches on one node, all users together: the node's sessions less the nodelet's and
#: one spare, so a channel the head opens for anything else still finds room.
ATTACHES_PER_NODE = NODE_SESSIONS - 2


@dataclass(frozen=True)
class Attached:
    """One attach in progress: who, to which job, on which node."""
    user: str
    job: int
    node: str


class Attach:
    def __init__(self, state: HeadState, access: Access):
        self.state = state
        self.access = access
        self._attached: dict[int, Attached] = {}  # by a number of each attach's own
        self._numbers = itertools.count(1)

    def check_room(self, user: str, node: str) -> None:
        """Raise RequestError when ``user`` or ``node`` already has all the attaches allowed."""
        mine = sorted(a.job for a in self._attached.values() if a.user == user)
        if len(mine) >= ATTACHES_PER_USER:
            raise RequestError(f"{user} already has {len(mine)} sessions attached (jobs "
                               f"{', '.join(map(str, mine))}); detach one first")
        there = Counter(a.user for a in self._attached.values() if a.node == node)
        if there.total() >= ATTACHES_PER_NODE:
            who = ", ".join(f"{name} {n}" for name, n in sorted(there.items()))
            raise RequestError(f"{node} already has {there.total()} sessions attached ({who}), as "
                               "many as its SSH server leaves room for; try again once one detaches")

    def target(self, user: str, job_id: int, rank: int) -> tuple[str, str]:
        """(node, tmux session) of part ``rank`` of the job, if ``user`` may attach to it."""
        job = self.state.jobs.get(job_id) or self.state.store.job(job_id)
        if job is None:
            raise RequestError(f"no job {job_id}; `nebula queue` lists the jobs")
        self.access.check_may_manage(user, job, "attach to")
        if job.pool is not None:
            raise RequestError(f"job {job_id} runs in pool {job.pool}, where the head has no "
                               f"terminal of its own; `nebula logs -f {job_id}` follows its output")
        if not job.state.holds_gpus or not job.node:
            raise RequestError(f"job {job_id} {job.state.phrase}; only a running job has a session")
        nodes = job_nodes(job)
        if not 0 <= rank < len(nodes):
            raise RequestError(f"job {job_id} runs on {len(nodes)} node(s): --rank goes from 0 "
                               f"to {len(nodes) - 1}")
        return nodes[rank], launcher.session_name(self.state.store.head_token, job.id)

    async def relay(self, user: str, job_id: int, rank: int, size: tuple[int, int], term: object,
                    reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Serve one attach on this connection until either side ends it (the request's
        fields checked by ``requests.attach_fields``)."""
        cols, rows = size
        term = term if term in TERM_TYPES else "xterm-256color"
        try:
            node, session = self.target(user, job_id, rank)
            self.check_room(user, node)
        except RequestError as err:
            await _reply(writer, {"ok": False, "error": str(err)})
            return
        number = next(self._numbers)
        self._attached[number] = Attached(user, job_id, node)
        log.info("%s attaches to job %s on %s", user, job_id, node)
        try:
            await self._serve(node, session, (_side(cols), _side(rows)), term, reader, writer)
        finally:  # a detach, a killed client, the job's or the node's end, an error here
            del self._attached[number]
            log.info("%s left job %s on %s", user, job_id, node)

    async def _serve(self, node: str, session: str, size: tuple[int, int], term: str,
                     reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            process = await self.state.links[node].open_terminal(
                ["tmux", "-L", launcher.TMUX_SOCKET, "attach-session", "-t", f"={session}"], term,
                size)
        except asyncssh.ChannelOpenError as err:  # the node's sshd allows fewer sessions
            await _reply(writer, {"ok": False, "error": (
                f"{node} refused a new SSH session ({err.reason}); its sshd's MaxSessions "
                f"should be at least {NODE_SESSIONS}")})
            return
        except (NodeUnavailable, OSError, KeyError, asyncssh.Error) as err:
            await _reply(writer, {"ok": False, "error": f"cannot reach the job's node: {err}"})
            return
        pumps: list[asyncio.Task] = []
        try:  # the reply line first: the terminal's output follows it
            await _reply(writer, {"ok": True, "node": node, "session": session})
            pumps = [asyncio.create_task(_to_client(process, writer)),
                     asyncio.create_task(_from_client(reader, process))]
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pump in pumps:
                pump.cancel()
            process.close()  # the remote tmux client goes: a detach, the job runs on
            with contextlib.suppress(Exception):
                await within(5, process.wait_closed())


def _side(n: int) -> int:
    return max(1, min(MAX_SIDE, n))


async def _reply(writer: asyncio.StreamWriter, message: dict) -> None:
    writer.write(json.dumps(message).encode() + b"\n")
    await writer.drain()


async def _to_client(process, writer: asyncio.StreamWriter) -> None:
    while data := await process.stdout.read(65536):
        writer.write(data)
        await writer.drain()


async def _from_client(reader: asyncio.StreamReader, process) -> None:
    while line := await reader.readline():
        try:
            event = json.loads(line)
            if "data" in event:
                process.stdin.write(base64.b64decode(event["data"]))
            elif "resize" in event:
                cols, rows = event["resize"]
                process.change_terminal_size(_side(int(cols)), _side(int(rows)))
        except (ValueError, TypeError, KeyError, OverflowError):
            continue  # one bad line from a client never ends the session
