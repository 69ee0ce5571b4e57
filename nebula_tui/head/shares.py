"""Each user's standing: fair-share weight (R6), GPU-hours this month and quota (R7).

The weights the scheduler reads are recomputed when a job ends (``ended``) and at most
once a minute otherwise, so a pass costs no SQL. What they are computed from — each user's
finished runs of the half-life window and hours this month — is read from the store at
most once a minute too (never again in a replay: ``usage_kept``); a job's end adds its own
run to it, so an end does not read the window's every finished job again (70 days of a busy
lab's). ``users_json`` is the row of
each user that the ``users`` request returns; when a user's figures move (``changed``: a job of
theirs was submitted, started, charged or ended, their quota was set) subscribers get that
row as a ``user`` event, the changes of one moment together.
"""

from __future__ import annotations

import asyncio
import bisect
from collections import defaultdict
from dataclasses import dataclass
from operator import itemgetter

from .. import scheduler
from ..model import charged_gpu_hours
from ..scheduler import fairshare
from ..views import month_start
from ..wire import Standing, UserRow
from .access import Access
from .accounting import Accounting
from .state import HeadState
from .stream import Stream

SHARES_TTL_S = 60.0
_ENDED_AT = itemgetter(0)
#: The ``user`` events of changes this close together go out together (seconds).
USERS_EVERY_S = 0.2


@dataclass
class _Usage:
    """What the weights are computed from, as read from the store at ``read_at`` and added
    to by every end since."""

    finished: dict[str, list[tuple[float, float]]]  # user -> (ended_at, gpu_hours) of runs
    month: dict[str, float]  # user -> GPU-hours charged this month (since ``month_from``)
    month_from: float
    half_life: float | None
    read_at: float


class Shares:
    def __init__(self, state: HeadState, access: Access, stream: Stream, accounting: Accounting):
        self.state = state
        self.access = access
        self.stream = stream
        self.accounting = accounting
        self._shares: dict[str, scheduler.UserShare] | None = None
        self._shares_at = 0.0
        self._usage: _Usage | None = None
        #: True: what the weights come from is read from the store once, then kept only by
        #: the ends and charges told here (``ended``, ``charged``), its window moved on as a
        #: read would move it. The replay's head sets it: no one else writes its store, and
        #: reading a month's every finished job again at each virtual minute was a fifth of
        #: a long replay. The live head reads the store again once a minute (an admin's
        #: edit, a restored backup).
        self.usage_kept = False
        self._changed: set[str] = set()  # users whose row goes out with the next batch

    def forget(self) -> None:
        """Standings changed (a quota was set): recompute at the next look."""
        self._shares = None

    def ended(self, job_id: int, user: str, charged_hours: float | None, preemptible: bool = False) -> None:
        """Job ``job_id`` of ``user`` ended, charged ``charged_hours`` (None: it had ended
        already): its run joins its user's usage, and the weights are recomputed at the
        next look."""
        self._shares = None
        usage = self._usage
        if usage is None or charged_hours is None:
            return
        run = self.state.store.counted_run(job_id)
        if run is not None:
            usage.finished.setdefault(user, []).append(run)
        self.charged(user, charged_hours, preemptible)

    def charged(self, user: str, hours: float, preemptible: bool = False) -> None:
        """``user`` was charged ``hours`` this month (a run ended, or was requeued); a
        ``preemptible`` job's count in the quota only when the settings say so."""
        if preemptible and not self.state.settings.config.preemptible_in_quota:
            return
        if self._usage is not None:
            self._usage.month[user] = self._usage.month.get(user, 0.0) + hours

    def shares(self) -> dict[str, scheduler.UserShare]:
        """R6 weights and R7 quota standing per user; recomputed when a job ends, at most
        once a minute otherwise (so a pass costs no SQL)."""
        now = self.state.clock()
        if self._shares is not None and now - self._shares_at < SHARES_TTL_S:
            return self._shares
        half_life = self.state.settings.half_life_s
        usage = self._usage_at(now, half_life)
        finished, month = usage.finished, usage.month
        held: dict[str, float] = defaultdict(float)
        in_quota: dict[str, float] = defaultdict(float)  # of ``held``, what counts in the quota
        counts = self.state.settings.config.preemptible_in_quota
        for job in self.state.jobs.holders():
            if job.started_at:
                hours = self.held_hours(job, now)
                held[job.user] += hours
                if counts or not job.spec.preemptible:
                    in_quota[job.user] += hours
        shares = {}
        quotas = self._quotas()  # one read of the users table, not one per user
        # a user who has used nothing yet is over a quota of 0 too: theirs (the users table),
        # or the lab's (every user with a job; looked for only then, as it walks the jobs)
        users = set(finished) | set(month) | set(held) | set(quotas)
        if self.state.settings.quota_gpu_hours <= 0:
            users.update(job.user for job in self.state.jobs.values())
        for user in users:
            refusal = self.quota_refusal(user, month.get(user, 0.0) + in_quota.get(user, 0.0), quotas)
            shares[user] = scheduler.UserShare(
                user, fairshare.user_weight(finished.get(user, []), held.get(user, 0.0), now, half_life),
                refusal)
        self._shares, self._shares_at = shares, now
        return shares

    def _usage_at(self, now: float, half_life: float | None) -> _Usage:
        """The usage the weights come from: the store's, read again when a minute old, in
        a new month or under another half-life; else the kept one with the ends since."""
        month = month_start(now)
        usage = self._usage
        since = now - 10 * half_life if half_life else 0.0
        if usage is None or usage.month_from != month or usage.half_life != half_life:
            pass  # read it
        elif now - usage.read_at < SHARES_TTL_S:
            return usage
        elif self.usage_kept:
            _drop_before(usage.finished, since)  # what the read would have left out
            usage.read_at = now
            return usage
        store = self.state.store
        in_quota = self.state.settings.config.preemptible_in_quota
        usage = self._usage = _Usage(store.finished_usage(since), store.usage_since(month, in_quota),
                                     month, half_life, now)
        return usage

    def standing(self, name: str) -> Standing:
        """One user's fair share in figures (``nebula why``): their weight and its place
        among the users' (1: first in the queue's order), the GPU-hours it comes from —
        finished runs as they count after the half-life's decay, and held now — and this
        month's hours, in and over their quota (over: those of the jobs that ran as
        preemptible work past the quota, as ``nebula report`` counts them)."""
        now = self.state.clock()
        half_life = self.state.settings.half_life_s
        usage = self._usage_at(now, half_life)
        runs = usage.finished.get(name, [])
        decayed = sum(hours * (2.0 ** (-max(0.0, now - ended) / half_life) if half_life else 1.0)
                      for ended, hours in runs)
        held = counted = 0.0
        counts = self.state.settings.config.preemptible_in_quota
        over, over_jobs = self.state.store.over_quota_usage(name, month_start(now))
        for job in self.state.jobs.holders():
            if job.user == name and job.started_at:
                hours = self.held_hours(job, now)
                held += hours
                counted += hours if counts or not job.spec.preemptible else 0.0
                over += hours if job.id in over_jobs else 0.0
        shares = self.shares()
        weight = shares[name].weight if name in shares else fairshare.BASE_WEIGHT
        quota = self._quotas().get(name, self.state.settings.quota_gpu_hours)
        month = usage.month.get(name, 0.0) + counted
        return {"user": name, "weight": round(weight, 4),
                "rank": 1 + sum(1 for s in shares.values() if s.weight < weight and s.name != name),
                "users": len(set(shares) | {name}), "half_life_s": half_life,
                "runs_counted": len(runs), "decayed_gpu_hours": round(decayed, 4),
                "held_gpu_hours": round(held, 4), "month_gpu_hours": round(month, 4),
                "quota_gpu_hours": quota,
                # over-quota work is preemptible: in ``month`` only when that counts
                "in_quota_gpu_hours": round(max(0.0, month - (over if counts else 0.0)), 4),
                "over_quota_gpu_hours": round(over, 4),
                "refusal": shares[name].refusal if name in shares else None}

    def held_hours(self, job, now: float) -> float:
        """GPU-hours a running job is charged for what it held until ``now``, as the store
        charges it when it ends (``model.charged_gpu_hours``: a slice by its gigabytes
        against the reference card; a preemptible job, ``scheduler.preemptible_charge``)."""
        settings = self.state.settings
        return charged_gpu_hours(
            [(p.memory_mb, p.exclusive) for p in job.placements], now - (job.started_at or now),
            settings.charge_reference_mb, settings.config.preemptible_charge if job.spec.preemptible else 1.0)

    def quota_refusal(self, user: str, month_hours: float, quotas: dict[str, float] | None = None) -> str | None:
        quota = (self._quotas() if quotas is None else quotas).get(user, self.state.settings.quota_gpu_hours)
        return fairshare.quota_refusal(user, month_hours, quota, self.access.admin_names())

    def _quotas(self) -> dict[str, float]:
        return {u["name"]: u["quota_gpu_hours"] for u in self.state.store.users()
                if u.get("quota_gpu_hours") is not None}

    def set_quota(self, user: str, name: str, hours: float) -> None:
        self.access.check_admin(user, "set quotas")
        self.state.store.set_quota(name, hours, user, self.state.clock())
        self.forget()
        self.changed(name)
        self.state.wake()

    def changed(self, user: str) -> None:
        """``user``'s figures moved: their row goes to subscribers within USERS_EVERY_S."""
        if not self.stream.subscribers:
            return  # a new subscriber's snapshot has every row as it is then
        self._changed.add(user)
        if len(self._changed) == 1:
            self.state.spawn(self._publish_changed(), "user-rows")

    async def _publish_changed(self) -> None:
        await asyncio.sleep(USERS_EVERY_S)
        names, self._changed = self._changed, set()
        for row in self.users_json():
            if row["name"] in names:
                self.stream.publish({"type": "user", "user": row})

    def users_json(self) -> list[UserRow]:
        running: dict[str, int] = defaultdict(int)
        for job in self.state.jobs.values():
            if job.state.holds_gpus:
                running[job.user] += 1
        shares = self.shares()
        since = month_start(self.state.clock())
        month = self.state.store.usage_since(since)
        figures = self.accounting.month_figures(since)
        rows: list[UserRow] = []
        for row in self.state.store.users():
            name = row["name"]
            ended = figures.get(name)
            rows.append({"name": name, "jobs_finished": row["jobs_finished"], "gpu_hours": row["gpu_hours"],
                         "created_at": row["created_at"], "running_jobs": running.get(name, 0),
                         # this month's ended jobs, as `nebula report` counts them
                         "month_jobs": ended["jobs"] if ended else 0,
                         "month_efficiency_pct": ended["efficiency_pct"] if ended else None,
                         "month_idle_gpu_hours": ended["idle_gpu_hours"] if ended else 0.0,
                         "month_mean_wait_s": ended["mean_wait_s"] if ended else None,
                         "weight": round(shares[name].weight, 4) if name in shares else 1.0,
                         "month_gpu_hours": round(month.get(name, 0.0), 4),
                         "quota_gpu_hours": self.state.settings.quota_gpu_hours
                         if row.get("quota_gpu_hours") is None else row["quota_gpu_hours"]})
        return rows


def _drop_before(finished: dict[str, list[tuple[float, float]]], since: float) -> None:
    """Leave out the runs that ended before ``since``, as ``Store.finished_usage(since)``
    would (each user's runs are in the order they ended; a user left without any is
    gone, as from the store's answer)."""
    for user in [u for u, runs in finished.items() if runs and runs[0][0] < since]:
        runs = finished[user]
        kept = bisect.bisect_left(runs, since, key=_ENDED_AT)
        if kept == len(runs):
            del finished[user]
        else:
            del runs[:kept]
