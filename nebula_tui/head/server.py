"""The head's side of the socket: who is asking, what they ask, and the answers.

``ApiServer`` accepts connections on the Unix socket, takes each caller's Unix user from
the kernel (``SO_PEERCRED``), validates every request field by field (``spec_from_request``
and the ``op_*`` methods: a bad field is a one-line refusal naming it) and answers with
the engine. The protocol itself is written down in ``api.py``'s docstring.
"""

from __future__ import annotations

import asyncio
import contextlib
import grp
import json
import logging
import os
import pwd
import re
import socket
import struct
from pathlib import Path

from .. import environments, views
from ..api import ARCH_RE, CUDA_RE, MAX_GPU_COUNT, MAX_LINE
from ..model import JobSpec, RequestError, UnfitRequest
from ..scheduler.snapshot import AFTER_TYPES
from ..units import parse_array
from .engine import Engine

log = logging.getLogger(__name__)

#: Telemetry ("gpus" events) is written to a subscriber at most this often: what arrives
#: meanwhile goes in the same write, so 125 nodes reporting once a second wake the client
#: ~10 times, not 125. Any other event is written at once, with what is waiting (seconds).
STREAM_GATHER_S = 0.1

def peer_user(sock: socket.socket) -> str:
    """The Unix user on the other end of a connected Unix socket, as the kernel says."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _, uid, _ = struct.unpack("3i", creds)
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid{uid}"


def spec_from_request(req: dict) -> JobSpec:
    """Validate a submit request field by field; raise RequestError naming the field."""
    command = req.get("command")
    if not isinstance(command, list) or not command or not all(isinstance(a, str) for a in command):
        raise RequestError("command: give the program to run after `--`, or --command \"…\"")
    shell = bool(req.get("shell"))
    if shell and len(command) != 1:
        raise RequestError("command: --command takes one shell command line")
    gpu_count = req.get("gpu_count", 1)
    if not isinstance(gpu_count, int) or isinstance(gpu_count, bool) or not 1 <= gpu_count <= MAX_GPU_COUNT:
        raise RequestError(f"--gpu-count must be a whole number from 1 to {MAX_GPU_COUNT}")
    gpu_mem = req.get("gpu_mem_mb")
    if gpu_mem is not None and (not isinstance(gpu_mem, int) or gpu_mem < 1):
        raise RequestError("--gpu-mem must be a positive size such as 8G")
    name = req.get("name") or ""
    if not isinstance(name, str) or len(name) > 128 or "\n" in name:
        raise RequestError("--name must be one line of at most 128 characters")
    workdir = req.get("workdir")
    if workdir is not None and (not isinstance(workdir, str) or not workdir.startswith("/")):
        raise RequestError("--workdir must be an absolute path on the node")
    after = req.get("after") or []
    if not isinstance(after, list) or not all(isinstance(a, int) and a > 0 for a in after):
        raise RequestError("--after takes job ids (numbers)")
    after_type = req.get("after_type") or "ok"
    if after_type not in AFTER_TYPES:
        raise RequestError(f"--after {after_type!r}: the kinds are {', '.join(AFTER_TYPES)} (e.g. any:12)")
    array = req.get("array")
    if array is not None:
        if not isinstance(array, str) or len(array) > 200:
            raise RequestError("--array takes task numbers like 0-99 or 0-99%8")
        try:
            parse_array(array)
        except ValueError as err:
            raise RequestError(str(err)) from None
    time_limit = req.get("time_limit_s")
    if time_limit is not None and (not isinstance(time_limit, (int, float)) or time_limit <= 0):
        raise RequestError("--time must be a duration such as 30m or 2h")
    nodes = req.get("nodes", 1)
    if not isinstance(nodes, int) or isinstance(nodes, bool) or not 1 <= nodes <= MAX_GPU_COUNT:
        raise RequestError(f"--nodes must be a whole number from 1 to {MAX_GPU_COUNT}")
    priority = req.get("priority", 0)
    if not isinstance(priority, int) or isinstance(priority, bool) or abs(priority) > 1000:
        raise RequestError("--priority must be a whole number from -1000 to 1000")
    texts = {}
    for key, flag, pattern in (("arch", "--arch", ARCH_RE), ("cuda", "--cuda", CUDA_RE),
                               ("vendor", "--vendor", _VENDOR)):
        value = req.get(key)
        if value is not None and (not isinstance(value, str) or not pattern.match(value)):
            raise RequestError(f"{flag}: {value!r} is not valid; e.g. {_EXAMPLES[key]}")
        texts[key] = value
    return JobSpec(command=tuple(command), name=name, gpu_count=gpu_count,
                   gpu_mem_mb=gpu_mem, workdir=workdir, shell=shell, nodes=nodes,
                   priority=priority, after=tuple(after), after_type=after_type, array=array,
                   time_limit_s=time_limit,
                   service=bool(req.get("service")), no_requeue=bool(req.get("no_requeue")),
                   **texts, **_world_fields(req))


def _world_fields(req: dict) -> dict:
    """What the job runs in (image, mounts, conda/venv, submit dir), each checked by
    ``environments``; a bad value is refused with its sentence."""
    checks = {"image": environments.image_reference, "runtime": environments.runtime_name,
              "conda": environments.conda_env, "venv": environments.venv_path,
              "submit_dir": lambda d: environments.absolute(d, "the submit directory")}
    fields: dict = {}
    try:
        for key, check in checks.items():
            if req.get(key) is not None:
                fields[key] = check(req[key])
        mounts = req.get("data_mounts") or []
        if not isinstance(mounts, list):
            raise ValueError("--data-mount: give SRC:DST or SRC:DST:ro, once per mount")
        fields["data_mounts"] = tuple(environments.data_mount(m) for m in mounts)
        environments.combination(fields.get("image"), fields.get("conda"), fields.get("venv"),
                                 fields["data_mounts"], fields.get("runtime"))
    except ValueError as err:
        raise RequestError(str(err)) from None
    fields["warmup"] = bool(req.get("warmup"))
    fields["interactive"] = bool(req.get("interactive"))
    return fields


_VENDOR = re.compile(r"^(nvidia|intel|ascend|amd)$")
_EXAMPLES = {"arch": "sm_89, '>=sm_80' or gfx90a", "cuda": "12.1",
             "vendor": "nvidia, amd, intel or ascend"}


def _text(req: dict, field: str) -> str:
    value = req.get(field)
    if not isinstance(value, str) or not value:
        raise RequestError(f"{field}: give a name")
    return value


def _port(req: dict) -> int:
    port = req.get("port", 22)
    if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
        raise RequestError("port must be a number from 1 to 65535")
    return port


def _job_id(req: dict) -> int:
    try:
        return int(req["job"])
    except (KeyError, TypeError, ValueError):
        raise RequestError(f"'{req.get('job')}' is not a job id (a number, as `nebula queue` shows)") from None


class ApiServer:
    """Serves one engine on a Unix socket."""

    def __init__(self, engine: Engine, path: Path, on_shutdown=None, group: str | None = None):
        self.engine = engine
        self.path = Path(path)
        self.on_shutdown = on_shutdown
        self.group = group  # shared-box mode: this Unix group's members may connect
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        old_umask = os.umask(0o077)  # never a moment when others could connect
        try:
            self._server = await asyncio.start_unix_server(self._serve, str(self.path),
                                                           limit=MAX_LINE)
        finally:
            os.umask(old_umask)
        if self.group:
            # Who may connect is the socket's business; who is asking, the kernel's.
            os.chown(self.path, -1, grp.getgrnam(self.group).gr_gid)
            os.chmod(self.path, 0o660)

    async def close(self) -> None:
        if self._server:
            self._server.close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        user = peer_user(writer.get_extra_info("socket"))
        try:
            while line := await reader.readline():
                try:
                    req = json.loads(line)
                    if not isinstance(req, dict):
                        raise ValueError
                except ValueError:
                    await self._send(writer, {"ok": False, "error": "request is not a JSON object"})
                    continue
                if req.get("op") == "attach":  # the connection becomes the terminal's
                    await self.engine.attach.relay(user, req, reader, writer)
                    break
                await self._handle(user, req, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            # The service is stopping (asyncio.run cancels every connection's task). Ending
            # quietly is the end of this task anyway; raised, asyncio's stream callback logs
            # it as a traceback (Python 3.11), one per connected client on every clean quit.
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def _send(self, writer: asyncio.StreamWriter, *messages: dict) -> None:
        """Write ``messages``, a line each, in one write."""
        writer.write(b"".join(json.dumps(m).encode() + b"\n" for m in messages))
        await writer.drain()

    async def _handle(self, user: str, req: dict, writer: asyncio.StreamWriter) -> None:
        op = req.get("op")
        try:
            if op == "subscribe":
                await self._subscribe(writer)
                return
            handler = getattr(self, f"op_{op}", None) if isinstance(op, str) else None
            if handler is None:
                raise RequestError(f"unknown request {op!r}")
            reply = await handler(user, req)
            await self._send(writer, {"ok": True, **reply})
        except RequestError as err:
            # a request no part of this cluster could serve is the client's to fix: exit 2
            await self._send(writer, {"ok": False, "error": str(err),
                                      "usage": isinstance(err, UnfitRequest)})

    # ----------------------------------------------------------------- ops
    async def op_ping(self, user, req):
        return {"pid": os.getpid(), "user": user}

    async def op_submit(self, user, req):
        job = self.engine.submit(user, spec_from_request(req))
        tasks = len(parse_array(job.spec.array)[0]) if job.spec.array else 1
        return {"job": views.job_json(job), "tasks": tasks}

    async def op_requeue(self, user, req):
        return {"job": views.job_json(self.engine.requeue(user, _job_id(req)))}

    async def op_status(self, user, req):
        status = self.engine.status()
        return {"summary": status["summary"], "nodes": status["nodes"]}

    async def op_queue(self, user, req):
        return {"jobs": self.engine.queue_json()}

    async def op_gpus(self, user, req):
        return {"gpus": self.engine.gpus_json()}

    async def op_job(self, user, req):
        return {"job": self.engine.job_detail(_job_id(req))}

    async def op_cancel(self, user, req):
        job = await self.engine.cancel(user, _job_id(req))
        return {"job": views.job_json(job)}

    async def op_wait(self, user, req):
        job = await self.engine.wait_finished(_job_id(req))
        return {"job": views.job_json(job)}

    async def op_hold(self, user, req):
        return {"job": views.job_json(self.engine.set_held(user, _job_id(req), True))}

    async def op_release(self, user, req):
        return {"job": views.job_json(self.engine.set_held(user, _job_id(req), False))}

    async def op_drain(self, user, req):
        reason = req.get("reason") or ""
        if not isinstance(reason, str) or len(reason) > 200:
            raise RequestError("reason must be one line of at most 200 characters")
        return {"node": self.engine.set_drained(user, _text(req, "node"), True, reason).json()}

    async def op_resume(self, user, req):
        return {"node": self.engine.set_drained(user, _text(req, "node"), False).json()}

    async def op_plan(self, user, req):
        return self.engine.plan(user, spec_from_request(req))

    async def op_attach_info(self, user, req):
        return {"argv": self.engine.attach_argv(user, _job_id(req))}

    async def op_history(self, user, req):
        since = req.get("since", 3600)
        if not isinstance(since, (int, float)) or since <= 0:
            raise RequestError("since must be a number of seconds > 0")
        gpu = self.engine.resolve_gpu(_text(req, "gpu"))
        return {"gpu": gpu, "samples": self.engine.history(gpu, float(since))}

    async def op_reload(self, user, req):
        return await self.engine.reload(user)

    async def op_node_key(self, user, req):
        return {"fingerprint": await self.engine.node_key(user, _text(req, "host"), _port(req))}

    async def op_node_add(self, user, req):
        login, identity = req.get("user"), req.get("identity")
        for value, what in ((login, "user"), (identity, "identity")):
            if value is not None and not isinstance(value, str):
                raise RequestError(f"{what} must be text")
        return await self.engine.add_node(user, _text(req, "node"), _text(req, "host"), _port(req),
                                          login, identity, _text(req, "trust"))

    async def op_node_remove(self, user, req):
        return await self.engine.remove_node(user, _text(req, "node"))

    async def op_quota(self, user, req):
        hours = req.get("hours")
        if not isinstance(hours, (int, float)) or isinstance(hours, bool) or hours < 0:
            raise RequestError("the quota is a number of GPU-hours per month, e.g. 3000")
        self.engine.set_quota(user, _text(req, "user"), float(hours))
        return {}

    async def op_gpu_resume(self, user, req):
        """An admin brings a GPU in maintenance back into service (R16/R17)."""
        gpu = self.engine.health.resume(user, _text(req, "gpu"))
        return {"gpu": next(g for g in self.engine.gpus_json() if g["uuid"] == gpu)}

    async def op_users(self, user, req):
        return {"users": self.engine.users_json()}

    async def op_events(self, user, req):
        limit = req.get("limit", 100)
        if not isinstance(limit, int) or not 1 <= limit <= 10000:
            raise RequestError("limit must be a number from 1 to 10000")
        return {"events": self.engine.store.events(limit)}

    async def op_logs(self, user, req):
        offset = req.get("offset", 0)
        if not isinstance(offset, int) or offset < 0:
            raise RequestError("offset must be a byte position >= 0")
        rank, offsets = req.get("rank"), req.get("offsets")
        if rank is not None and (not isinstance(rank, int) or isinstance(rank, bool) or rank < 0):
            raise RequestError("--rank must be a node's rank, 0 or more")
        if offsets is not None and (not isinstance(offsets, list) or len(offsets) > MAX_GPU_COUNT
                                    or not all(isinstance(o, int) and o >= 0 for o in offsets)):
            raise RequestError("offsets must be byte positions >= 0, one per rank")
        return await self.engine.read_log(user, _job_id(req), offset, rank, offsets)

    async def op_shutdown(self, user, req):
        if not self.engine.is_admin(user):
            raise RequestError("only an admin may stop the service")
        if self.on_shutdown:
            asyncio.get_running_loop().call_soon(self.on_shutdown)
        return {}

    async def _subscribe(self, writer: asyncio.StreamWriter) -> None:
        queue: asyncio.Queue = asyncio.Queue()
        snapshot = self.engine.subscribe(queue)
        try:
            await self._send(writer, {"ok": True, "type": "snapshot", **snapshot})
            while True:
                await self._send(writer, *await gather_events(queue))
        finally:
            self.engine.unsubscribe(queue)


async def gather_events(queue: asyncio.Queue) -> list[dict]:
    """The next events to write, in order: all that are waiting and, while they are all
    telemetry, what follows within STREAM_GATHER_S of the first."""
    events = [await queue.get()]
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
            events.append(await asyncio.wait_for(queue.get(), left))
        except asyncio.TimeoutError:
            return events
        urgent = events[-1].get("type") != "gpus"
