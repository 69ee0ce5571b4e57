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
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging

from ..model import RequestError
from ..remote import launcher
from ..remote.ssh import NodeUnavailable
from .access import Access
from .state import HeadState, job_nodes

log = logging.getLogger(__name__)

MAX_SIDE = 1000  # columns or rows of a terminal: a bound on what a client may ask
TERM_TYPES = ("xterm", "xterm-256color", "screen", "screen-256color", "tmux", "tmux-256color",
              "vt100", "vt220", "linux", "rxvt-unicode", "rxvt-unicode-256color", "alacritty",
              "xterm-kitty", "foot", "dumb")


class Attach:
    def __init__(self, state: HeadState, access: Access):
        self.state = state
        self.access = access

    def target(self, user: str, job_id: int, rank: int) -> tuple[str, str]:
        """(node, tmux session) of part ``rank`` of the job, if ``user`` may attach to it."""
        job = self.state.jobs.get(job_id) or self.state.store.job(job_id)
        if job is None:
            raise RequestError(f"no job {job_id}; `nebula queue` lists the jobs")
        self.access.check_may_manage(user, job, "attach to")
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
            process = await self.state.links[node].open_terminal(
                ["tmux", "-L", launcher.TMUX_SOCKET, "attach-session", "-t", f"={session}"], term,
                (_side(cols), _side(rows)))
        except RequestError as err:
            await _reply(writer, {"ok": False, "error": str(err)})
            return
        except (NodeUnavailable, OSError, KeyError) as err:
            await _reply(writer, {"ok": False, "error": f"cannot reach the job's node: {err}"})
            return
        await _reply(writer, {"ok": True, "node": node, "session": session})
        log.info("%s attached to job %s on %s", user, job_id, node)
        pumps = [asyncio.create_task(_to_client(process, writer)),
                 asyncio.create_task(_from_client(reader, process))]
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pump in pumps:
                pump.cancel()
            process.close()  # the remote tmux client goes: a detach, the job runs on
            with contextlib.suppress(Exception):
                await asyncio.wait_for(process.wait_closed(), 5)


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
