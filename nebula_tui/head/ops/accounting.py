"""The requests about use and shares: the accounting report, ended jobs' history, users'
standing, monthly quotas and bookings (reservations). Each handler checks its own fields."""

from __future__ import annotations

from ...model import InvalidRequest, JobState
from ...wire import (HistoryReply, JobHistoryRequest, NoFields, NoReply, QuotaRequest, ReportReply, ReportRequest,
                     ReserveReply, ReserveRequest, UsersReply)
from ..requests import number, text_field, unix_time, whole
from .base import Handler, Served

#: The longest period one report may cover (a bound on its work).
MAX_REPORT_S = 400 * 86400
#: The most ended jobs one job_history reply holds: 100,000 were a 93 MB reply whose JSON
#: took the head's loop seconds to write (every node's messages waited meanwhile).
MAX_HISTORY_JOBS = 10_000


def _ended_states(value: object) -> tuple[JobState, ...]:
    """``state`` of ``job_history``: None (every ended state), one, or a list of them."""
    names = [] if value is None else [value] if isinstance(value, str) else value
    ended = {s.value: s for s in JobState if s.finished}
    if not isinstance(names, list) or not all(isinstance(n, str) and n in ended for n in names):
        raise InvalidRequest(f"state must be one or more of {', '.join(ended)}")
    return tuple(ended[n] for n in names)


async def report(s: Served, user: str, req: ReportRequest) -> ReportReply:
    """GPU-hours, efficiency and waits per user and month; capacity and utilisation
    per node and cluster, per month and day, over [since, until) (Unix seconds)."""
    since, until = unix_time(req, "since", required=True), unix_time(req, "until", required=True)
    if until - since > MAX_REPORT_S:
        raise InvalidRequest(f"a report covers at most {MAX_REPORT_S // 86400} days; "
                             "ask for a shorter period")
    return {"report": await s.engine.accounting.report(user, since, until)}


async def job_history(s: Served, user: str, req: JobHistoryRequest) -> HistoryReply:

    """Ended jobs: ``{"jobs": [views.history_json …]}``, filtered by ``user``,
    ``since``/``until`` (Unix seconds), ``state`` (one or a list), ``node``, ``limit``."""
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
    jobs = await s.engine.accounting.history(user, who=texts["user"], node=texts["node"],
                                             states=_ended_states(req.get("state")),
                                             limit=limit, **bounds)
    seen = s.seen_by(user, listing=True)
    return {"jobs": [seen(job) for job in jobs]}


async def users(s: Served, user: str, req: NoFields) -> UsersReply:
    return {"users": s.engine.users_json()}


async def quota(s: Served, user: str, req: QuotaRequest) -> NoReply:
    hours = req.get("hours")
    if not number(hours, 0, 1e9):
        raise InvalidRequest("the quota is a number of GPU-hours per month, e.g. 3000")
    s.engine.set_quota(user, text_field(req, "user"), float(hours))
    return {}


async def reserve(s: Served, user: str, req: ReserveRequest) -> ReserveReply:
    """A booking made, ended or listed: head/bookings.py checks its fields."""
    return s.engine.bookings.request(user, req)


OPS: dict[str, Handler] = {
    "report": report, "job_history": job_history, "users": users, "quota": quota, "reserve": reserve,
}
