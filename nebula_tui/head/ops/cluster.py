"""The requests about the cluster and the service: status, GPUs (their history, bringing one
back from maintenance), nodes (drain, resume, add with its key and smoke job, remove, show),
doctor, the events log, reload, ping and shutdown. Each handler checks its own fields."""

from __future__ import annotations

import asyncio
import os
from ...model import InvalidRequest, RequestError
from ...wire import (DoctorReply, DoctorRequest, DrainRequest, EventsReply, EventsRequest, GpuHistoryReply,
                     GpuHistoryRequest, GpuReply, GpuResumeRequest, GpusReply, NodeAddRequest, NodeKeyReply,
                     NodeKeyRequest, NodeReply, NodeRequest, NodeShowReply, NoFields, NoReply, PingReply, ReloadReply,
                     SmokeReply, StatusReply)
from ..requests import job_id, number, port_field, text_field, unix_time, whole
from .accounting import MAX_REPORT_S
from .base import Handler, Served


async def ping(s: Served, user: str, req: NoFields) -> PingReply:
    return {"pid": os.getpid(), "user": user}


async def status(s: Served, user: str, req: NoFields) -> StatusReply:
    status = s.engine.status()
    return {"summary": status["summary"], "nodes": status["nodes"], "pools": status["pools"]}


async def gpus(s: Served, user: str, req: NoFields) -> GpusReply:

    return {"gpus": s.engine.gpus_json()}


async def history(s: Served, user: str, req: GpuHistoryRequest) -> GpuHistoryReply:
    """A GPU's telemetry over the last ``since`` seconds."""
    since = req.get("since", 3600)
    if not number(since, 1, MAX_REPORT_S):
        raise InvalidRequest(f"since must be a number of seconds from 1 to {MAX_REPORT_S}")
    gpu = s.engine.resolve_gpu(text_field(req, "gpu"))
    return {"gpu": gpu, "samples": s.engine.history(gpu, float(since))}


async def gpu_resume(s: Served, user: str, req: GpuResumeRequest) -> GpuReply:
    """An admin brings a GPU in maintenance back into service (R16/R17)."""
    gpu = await s.engine.health.resume(user, text_field(req, "gpu"), force=req.get("force") is True)
    return {"gpu": next(g for g in s.engine.gpus_json() if g["uuid"] == gpu)}


async def drain(s: Served, user: str, req: DrainRequest) -> NodeReply:
    reason = req.get("reason") or ""
    if not isinstance(reason, str) or len(reason) > 200 or not reason.isprintable():
        raise InvalidRequest("reason must be one line of at most 200 characters")
    return {"node": s.engine.set_drained(user, text_field(req, "node"), True, reason).json()}


async def resume(s: Served, user: str, req: NodeRequest) -> NodeReply:
    return {"node": s.engine.set_drained(user, text_field(req, "node"), False).json()}


async def node_key(s: Served, user: str, req: NodeKeyRequest) -> NodeKeyReply:
    return {"fingerprint": await s.engine.node_key(user, text_field(req, "host"), port_field(req))}


async def node_add(s: Served, user: str, req: NodeAddRequest) -> ReloadReply:
    login, identity = req.get("user"), req.get("identity")
    for value, what in ((login, "user"), (identity, "identity")):
        if value is not None and not isinstance(value, str):
            raise InvalidRequest(f"{what} must be text")
    return await s.engine.add_node(user, text_field(req, "node"), text_field(req, "host"), port_field(req),
                                   login, identity, text_field(req, "trust"))


async def node_smoke(s: Served, user: str, req: NodeRequest) -> SmokeReply:
    """The smoke job on a node (just added)."""
    return await s.engine.smoke.run(user, text_field(req, "node"))


async def node_remove(s: Served, user: str, req: NodeRequest) -> ReloadReply:
    return await s.engine.remove_node(user, text_field(req, "node"))


async def node_show(s: Served, user: str, req: NodeRequest) -> NodeShowReply:
    return {"node": s.engine.fleet.show(text_field(req, "node"))}


async def doctor(s: Served, user: str, req: DoctorRequest) -> DoctorReply:
    nodes = req.get("nodes") or []
    if not isinstance(nodes, list) or len(nodes) > 10_000 or not all(
            isinstance(n, str) and n for n in nodes):
        raise InvalidRequest("nodes: give a list of node names")
    return await s.engine.doctor.check(user, list(dict.fromkeys(nodes)))


async def events(s: Served, user: str, req: EventsRequest) -> EventsReply:
    """The newest ``limit`` events, filtered by ``kind``, ``node``, ``job``, ``user``,
    ``since`` (Unix seconds)."""
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
    return {"events": s.engine.store.events(limit, job_id=job, since=since, **names)}


async def reload(s: Served, user: str, req: NoFields) -> ReloadReply:
    return await s.engine.reload(user)


async def shutdown(s: Served, user: str, req: NoFields) -> NoReply:
    if not s.engine.is_admin(user):
        raise RequestError("only an admin may stop the service")
    if s.on_shutdown:
        asyncio.get_running_loop().call_soon(s.on_shutdown)
    return {}


OPS: dict[str, Handler] = {
    "ping": ping, "status": status, "gpus": gpus, "history": history, "gpu_resume": gpu_resume,
    "drain": drain, "resume": resume, "node_key": node_key, "node_add": node_add,
    "node_smoke": node_smoke, "node_remove": node_remove, "node_show": node_show,
    "doctor": doctor, "events": events, "reload": reload, "shutdown": shutdown,
}
