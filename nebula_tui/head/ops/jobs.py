"""The requests about jobs: submit (and its dry run, plan), cancel, requeue, hold, release,
wait, one job, the queue, its logs, how to attach to it, and why it waits. Each handler
checks its own fields (``head/requests.py`` holds the shared checks) and answers with the
engine."""

from __future__ import annotations

from ... import views
from ...api import MAX_GPU_COUNT, MAX_WAIT_STEP_S
from ...model import InvalidRequest
from ...wire import (AttachInfoReply, JobDetailReply, JobReply, JobRequest, LogsReply, LogsRequest, NoFields, PlanView,
                     QueueReply, SubmitReply, SubmitRequest, WaitReply, WaitRequest, WhyReply, WhyRequest)
from ..requests import job_id, number, spec_from_request, whole
from .base import Handler, Served

MAX_OFFSET = (1 << 63) - 1  # a byte position in a log (what a node's seek takes)
MAX_ATTEMPT = 10 ** 9  # a job's runs, 1 the first (a launch token holds at most 9 digits of it)


async def submit(s: Served, user: str, req: SubmitRequest) -> SubmitReply:
    job = await s.engine.submit_on_disk(user, spec_from_request(req, s.engine.state.settings.default_vendor))
    tasks = len(job.spec.array.indices) if job.spec.array else 1
    return {"job": views.job_json(job), "tasks": tasks}


async def plan(s: Served, user: str, req: SubmitRequest) -> PlanView:
    """Where a job of this request would go now, submitting nothing."""
    return s.engine.plan(user, spec_from_request(req, s.engine.state.settings.default_vendor))


async def requeue(s: Served, user: str, req: JobRequest) -> JobReply:
    return {"job": views.job_json(await s.engine.requeue_job(user, job_id(req)))}


async def cancel(s: Served, user: str, req: JobRequest) -> JobReply:
    return {"job": views.job_json(await s.engine.cancel(user, job_id(req)))}


async def hold(s: Served, user: str, req: JobRequest) -> JobReply:
    s.toggles.check(user, "hold or release")
    return {"job": views.job_json(await s.engine.hold_job(user, job_id(req), True))}


async def release(s: Served, user: str, req: JobRequest) -> JobReply:
    s.toggles.check(user, "hold or release")
    return {"job": views.job_json(await s.engine.hold_job(user, job_id(req), False))}


async def wait(s: Served, user: str, req: WaitRequest) -> WaitReply:
    """The job once it ended, or as it is after ``within`` seconds (the client asks again)."""
    job, within = job_id(req), req.get("within")
    if within is not None and not number(within, 1, MAX_WAIT_STEP_S):
        raise InvalidRequest(f"within must be a number of seconds from 1 to {MAX_WAIT_STEP_S}")
    ended = await s.engine.wait_finished(job, within)
    return {"job": s.seen_by(user)(views.job_json(ended)), "ended": ended.state.finished}


async def job(s: Served, user: str, req: JobRequest) -> JobDetailReply:
    return {"job": s.seen_by(user)(s.engine.job_detail(job_id(req), user))}


async def queue(s: Served, user: str, req: NoFields) -> QueueReply:

    return {"jobs": list(map(s.seen_by(user, listing=True), s.engine.queue_json()))}


async def logs(s: Served, user: str, req: LogsRequest) -> LogsReply:
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
    return await s.engine.read_log(user, job_id(req), offset, rank, offsets, attempt)


async def attach_info(s: Served, user: str, req: JobRequest) -> AttachInfoReply:
    return {"argv": s.engine.attach_argv(user, job_id(req))}


async def why(s: Served, user: str, req: WhyRequest) -> WhyReply:
    """A job's answer, or a user's standing: head/why.py."""
    return {"why": await s.engine.why.request(req)}


OPS: dict[str, Handler] = {
    "submit": submit, "plan": plan, "requeue": requeue, "cancel": cancel, "hold": hold,
    "release": release, "wait": wait, "job": job, "queue": queue, "logs": logs,
    "attach_info": attach_info, "why": why,
}
