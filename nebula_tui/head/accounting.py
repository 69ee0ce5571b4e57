"""Accounting: what ended jobs cost and did (``job_history``), and the monthly report.

Every ended job keeps, in the store, the GPU-hours it was charged and what its cards did
while it held them, from telemetry (``Store._charge_run``). ``history`` lists ended jobs
with filters; ``report`` sums them per user and month, and sets the GPU-hours each node
had against those its jobs held and the utilisation its cards really showed.

Whether users see each other's ended jobs is ``accounting.history`` (open by default;
``own``: users see theirs, admins everyone's).
"""

from __future__ import annotations

import asyncio
import time

from .. import views
from ..model import InvalidRequest, Job, JobState, RequestError
from ..store import Store
from ..wire import HistoryJob, Report, ReportBookingRow, ReportNodeRow, ReportUserRow
from .access import Access
from .state import HeadState


class Accounting:
    def __init__(self, state: HeadState, access: Access):
        self.state = state
        self.access = access

    async def _read(self, query):
        """``query(store)`` on a read-only connection of its own, in a thread: a month of
        telemetry is millions of rows, and the head's loop must not wait for them."""
        def run():
            store = Store(self.state.store.path, readonly=True)
            try:
                return query(store)
            finally:
                store.close()

        return await asyncio.to_thread(run)

    # ------------------------------------------------------------------ history
    async def history(self, user: str, *, who: str | None = None, since: float | None = None,
                      until: float | None = None, states: tuple[JobState, ...] = (),
                      node: str | None = None, limit: int = 1000) -> list[HistoryJob]:
        """Ended jobs (``views.history_json``), oldest first: the newest ``limit`` that
        ended in [since, until), of ``who``, in ``states``, on ``node``."""
        who = self._visible_owner(user, who)
        rows = await self._read(lambda store: store.ended_jobs(
            user=who, since=since, until=until, states=states, node=node, limit=limit))
        return [views.history_json(job, usage) for job, usage in rows]

    def ended_job(self, user: str, job: Job) -> HistoryJob | None:
        """One ended job as history shows it (``nebula job N`` of a job that ended); None
        while its history row is not written yet (it is shown as ``views.job_json``)."""
        self._visible_owner(user, job.user)
        rows = self.state.store.ended_jobs(job_id=job.id, limit=1)
        return views.history_json(*rows[0]) if rows else None


    def _visible_owner(self, user: str, who: str | None) -> str | None:
        """The owner whose jobs ``user`` may list (``who``, or None for everyone's)."""
        if self.state.accounting.history == "open" or self.access.is_admin(user):
            return who
        if who not in (None, user):
            raise RequestError(f"the history of {who}'s jobs is theirs and the admins' "
                               f"({self.access.admins_text()}) to see")
        return user

    def month_figures(self, since: float) -> dict[str, ReportUserRow]:
        """Each user's report row for the month that began at ``since`` (the Users
        screen's figures: jobs, GPU-hours, efficiency, idle GPU-hours, mean wait)."""
        return {row["user"]: _user_row(row)
                for row in self.state.store.user_months(since, self.state.clock() + 1)}

    # ------------------------------------------------------------------- report
    async def report(self, user: str, since: float, until: float) -> Report:
        """The report of [since, until) (until at most now; see ``api.py`` for its shape):
        per user and month, the ended jobs' figures; per node and month, and for the
        cluster per month and per day, the GPU-hours its cards had, those held by jobs,
        and the utilisation the cards showed; each booking's GPU-hours and their use."""
        now = self.state.clock()
        until = min(until, now)
        if until <= since:
            raise InvalidRequest("the report's period is empty: --since must be before --until and now")
        who = self._visible_owner(user, None)
        return await self._read(lambda store: _report(store, who, since, until, now))


def _report(store: Store, who: str | None, since: float, until: float, now: float) -> Report:
    users = [_user_row(row) for row in store.user_months(since, until)
             if who is None or row["user"] == who]
    cards: dict[str, list[float]] = {}  # node -> when each of its cards was first seen
    for gpu in store.gpus():
        cards.setdefault(gpu["node"], []).append(gpu["registered_at"] or since)
    held: dict[str, list[tuple[float, float | None, float]]] = {}
    for node, t0, t1, share in store.held_between(since, until):
        held.setdefault(node, []).append((t0, t1, share))
    busy: dict[tuple[str, str], list[float]] = {}  # (node, day or month) -> [sampled, busy]
    days: dict[float, str] = {}  # quarter hour -> its local day
    for node, quarter, sampled, used in store.utilisation_by_quarter(since, until):
        day = days.get(quarter)
        if day is None:
            day = days[quarter] = time.strftime("%Y-%m-%d", time.localtime(quarter))
        for period in (day, day[:7]):
            totals = busy.setdefault((node, period), [0.0, 0.0])
            totals[0] += sampled
            totals[1] += used
    return {"since": since, "until": until, "users": users,
            "nodes": _node_rows(_periods(since, until, "month"), cards, held, busy, now),
            "days": _node_rows(_periods(since, until, "day"), cards, held, busy, now),
            "bookings": _booking_rows(store, since, until)}


def _booking_rows(store: Store, since: float, until: float) -> list[ReportBookingRow]:
    """Each booking whose window overlaps [since, until): its GPU-hours in the period, and
    those its users' jobs held on its cards then (its use)."""
    rows: list[ReportBookingRow] = []
    for b in store.bookings(since):
        begin, end = max(b["start"], since), min(b["end"], b["ended_at"] or b["end"], until)
        if b["start"] >= until or end <= begin:
            continue
        booked = len(b["cards"]) * (end - begin) / 3600
        used = store.booked_use([c[0] for c in b["cards"]], b["users"], begin, end)
        rows.append({"name": b["name"], "users": b["users"], "created_by": b["created_by"],
                     "start": b["start"], "end": min(b["end"], b["ended_at"] or b["end"]),
                     "booked_gpu_hours": round(booked, 6), "used_gpu_hours": round(used, 6),
                     "used_pct": round(100 * used / booked, 1) if booked else None})
    return rows


def _user_row(row: dict) -> ReportUserRow:
    sampled = row["sampled_gpu_hours"] or 0.0
    over = row["over_quota_gpu_hours"] or 0.0
    return {"month": row["month"], "user": row["user"], "jobs": row["jobs"],
            "gpu_hours": round(row["gpu_hours"] or 0.0, 6),
            # of them, those of jobs that ran past the user's quota, as preemptible work on
            # idle cards (charged scheduler.preemptible_charge), and the rest
            "in_quota_gpu_hours": round((row["gpu_hours"] or 0.0) - over, 6),
            "over_quota_gpu_hours": round(over, 6),
            "efficiency_pct": round(100 * row["busy_gpu_hours"] / sampled, 1) if sampled else None,
            "idle_gpu_hours": round(row["idle_gpu_hours"] or 0.0, 6),
            "mean_wait_s": round(row["wait_s_sum"] / row["started"], 1) if row["started"] else None}


def _periods(since: float, until: float, unit: str) -> list[tuple[str, float, float]]:
    """(name, start, end) of each local calendar month ("2026-12") or day ("2026-12-01")
    that [since, until) touches, cut to it."""
    found = []
    t = since
    while t < until:
        lt = time.localtime(t)
        if unit == "month":
            name = f"{lt.tm_year:04d}-{lt.tm_mon:02d}"
            nxt = (lt.tm_year + lt.tm_mon // 12, lt.tm_mon % 12 + 1, 1)
        else:
            name = f"{lt.tm_year:04d}-{lt.tm_mon:02d}-{lt.tm_mday:02d}"
            nxt = (lt.tm_year, lt.tm_mon, lt.tm_mday + 1)  # mktime rolls the month over
        end = min(until, time.mktime((*nxt, 0, 0, 0, 0, 0, -1)))
        found.append((name, t, end))
        t = end
    return found


def _overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


def _node_rows(periods, cards, held, busy, now) -> list[ReportNodeRow]:
    """Per period, a row per node and one for the whole cluster (``node`` "cluster"):
    GPU-hours available (each card from when it was first seen), allocated (held by jobs,
    a slice its share), both as a percentage, and the cards' mean utilisation."""
    rows: list[ReportNodeRow] = []
    for name, start, end in periods:
        totals = {"available": 0.0, "allocated": 0.0, "sampled": 0.0, "used": 0.0}
        gpus = 0
        for node in sorted(cards):
            available = sum(_overlap(seen, now, start, end) for seen in cards[node]) / 3600
            allocated = sum(_overlap(t0, t1 if t1 is not None else now, start, end) * share
                            for t0, t1, share in held.get(node, ())) / 3600
            sampled, used = busy.get((node, name), (0.0, 0.0))
            rows.append(_capacity_row(name, node, len(cards[node]), available, allocated, sampled, used))
            for key, value in (("available", available), ("allocated", allocated),
                               ("sampled", sampled), ("used", used)):
                totals[key] += value
            gpus += len(cards[node])
        rows.append(_capacity_row(name, "cluster", gpus, totals["available"],

                                  totals["allocated"], totals["sampled"], totals["used"]))
    return rows


def _capacity_row(period: str, node: str, gpus: int, available: float, allocated: float,
                  sampled: float, used: float) -> ReportNodeRow:
    return {"period": period, "node": node, "gpus": gpus,
            "available_gpu_hours": round(available, 6), "allocated_gpu_hours": round(allocated, 6),
            "allocated_pct": round(100 * allocated / available, 1) if available else None,
            "util_pct": round(100 * used / sampled, 1) if sampled else None}
