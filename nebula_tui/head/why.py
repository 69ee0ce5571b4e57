"""`nebula why`: one answer, in figures, to "why is my job not running, and what would start
it sooner?" — and to "where do I stand?" for a user.

For a job: its place in the queue; the rule that holds it (``RULES``), read from the
scheduler's own reason and the head's facts; its start forecast; its user's fair share
(``Shares.standing``); the jobs ahead of it in the queue and those holding the cards it is
forecast to start on (and when it would start first in the queue: "fair_share" holds it
when that is sooner); and the smallest changes of its request that would start it sooner,
each tried on the forecast (``forecast.forecast`` for the changed request in its place).
The forecasts run in a thread, on snapshots taken on the loop.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from collections.abc import Mapping
from typing import Protocol

from ..model import InvalidRequest, Job, JobSpec, JobState, RequestError
from ..pools.base import Capacity
from ..pools.slurm import SlurmPool
from ..scheduler.preemption import OVER_QUOTA
from ..wire import WhyJob, WhyJobRow, WhyRequest, WhySooner, WhyUser, WhyWaitingRow
from . import forecast
from .scheduling import Scheduling
from .shares import Shares
from .state import HeadState

#: what holds a job, as ``rule`` names it (the docs' reference lists them)
RULES = ("running", "ended", "held", "dependency", "quota", "array_limit", "reservation",
         "booking", "blocked", "fair_share", "fit", "pool", "new")
#: the most jobs ahead (and holders) an answer lists
SHOWN = 5
#: a change is offered only when it starts the job at least this much sooner (seconds)
SOONER_BY_S = 300.0
#: the priority that puts a job first in the queue, to see what the jobs ahead cost it
FIRST_PRIORITY = 1 << 30
#: --gpu-mem sizes tried for a job asking for whole cards (GiB), smallest change first
SLICES_GB = (40, 24, 16, 8)


def rule_of(job: Job, reason: str, refusal: str | None) -> str:
    """The rule that holds ``job``, from its state and the scheduler's sentence."""
    if job.state.holds_gpus:
        return "running"
    if job.state.finished:
        return "ended"
    if job.held_by:
        return "held"
    if job.pooled:
        return "pool"
    if not reason:
        return "new"
    if refusal and (reason == refusal or reason.startswith(OVER_QUOTA)):
        return "quota"  # refused, or (quota_mode scavenge) kept to idle cards
    if job.spec.after and not reason.startswith("needs "):
        return "dependency"
    if reason.startswith("array "):
        return "array_limit"
    if reason.startswith("held for job "):
        return "reservation"
    if "booked for" in reason or reason.startswith("waits for its booking"):
        return "booking"
    if "takes new work" in reason or "best usable:" in reason:
        return "blocked"
    if "in fair-share order" in reason:
        return "fair_share"
    return "fit"


def _variants(spec: JobSpec, total_mb: int | None) -> list[tuple[str, JobSpec]]:
    """The changes tried, smallest first: (the flag as a user types it, the changed spec)."""
    tried = []
    if spec.gpu_count == 1 and spec.gpu_mem_mb is None:
        for gb in SLICES_GB:
            if total_mb is None or gb * 1024 < total_mb:
                tried.append((f"--gpu-mem {gb}G", replace(spec, gpu_mem_mb=gb * 1024)))
    elif spec.gpu_mem_mb is not None and spec.gpu_mem_mb >= 2048:
        half = spec.gpu_mem_mb // 2 // 1024 * 1024 or 1024
        tried.append((f"--gpu-mem {half // 1024}G", replace(spec, gpu_mem_mb=half)))
    if spec.gpu_count > 1:
        tried.append((f"--gpu-count {spec.gpu_count // 2}", replace(spec, gpu_count=spec.gpu_count // 2)))
    if spec.time_limit_s is None or spec.time_limit_s > 3600:
        tried.append(("--time 1:00:00", replace(spec, time_limit_s=3600.0)))
    if not spec.preemptible:
        tried.append(("--preemptible", replace(spec, preemptible=True)))
    return tried


def _sooner(start: forecast.Start | None, than: forecast.Start | None) -> bool:
    """Whether ``start`` is at least ``SOONER_BY_S`` before ``than`` (None: never)."""
    if start is None or start.at is None:
        return False
    return than is None or than.at is None or start.at < than.at - SOONER_BY_S


class PoolsSeen(Protocol):
    """What an answer reads of the pools (``head.pools.Pools``, a room above this one):
    which could take a job now."""

    @property
    def pools(self) -> Mapping[str, SlurmPool]: ...
    def refusal(self, name: str, spec: JobSpec, user: str | None = None) -> str | None: ...
    def capacity_for(self, name: str, user: str | None) -> Capacity | None: ...
    def live(self, name: str, user: str | None = None) -> int: ...


class Why:
    def __init__(self, state: HeadState, scheduling: Scheduling, shares: Shares, pools: PoolsSeen):
        self.state = state
        self.scheduling = scheduling
        self.shares = shares
        self.pools = pools  # head/pools.py's Pools: which pool could take it now

    async def request(self, req: WhyRequest) -> WhyJob | WhyUser:
        """The ``why`` request: ``user`` (a name) for a user's standing, else ``job`` (an id)."""
        name, job_id = req.get("user"), req.get("job")  # checked here, whatever a client sent
        if name is not None:
            if not isinstance(name, str) or not 0 < len(name) <= 64:
                raise InvalidRequest("user must be a name of at most 64 characters")
            return self.user(name)
        if isinstance(job_id, str) and job_id.strip().isdigit():
            job_id = int(job_id)
        if not isinstance(job_id, int) or isinstance(job_id, bool) or not 0 < job_id < 1 << 62:
            raise InvalidRequest(f"{str(job_id)[:40]!r} is not a job id (a number, as `nebula queue` shows)")
        job = self.state.jobs.get(job_id) or self.state.store.job(job_id)
        if job is None:
            raise RequestError(f"no job {job_id}; `nebula queue` lists the jobs")
        return await self.job(job)

    async def job(self, job: Job) -> WhyJob:
        """The answer for one job (api.py: ``why``; docs/reference.md its shape)."""
        state = self.state
        now = state.clock()
        standing = self.shares.standing(job.user)
        reason = job.reason or ""
        answer: WhyJob = {"job": job.id, "user": job.user, "state": job.state.value,
                  "queue_pos": state.queue_pos(job), "waiting": len(state.queue_order),
                  "rule": rule_of(job, reason, standing["refusal"]), "reason": reason,
                  "share": standing, "now": now, "starts": None, "ahead": [], "holding": [],
                  "sooner": []}
        if job.state != JobState.PENDING or job.held_by or job.pooled:
            return answer
        place = state.queue_place.get(job.id)
        ahead = [state.jobs[i] for i in state.queue_order[:(place or 1) - 1] if i in state.jobs]
        answer["ahead"] = [self._job_row(j) for j in ahead[-SHOWN:]]
        # the job's own forecast and each change's, on snapshots of now, in a thread
        variants = _variants(job.spec, self._card_mb())
        pending = [j for j in self.scheduling.waiting() if j.id != job.id]
        # first in the queue: what the jobs ahead cost it (they hold it when it would start sooner)
        first = replace(job, spec=replace(job.spec, priority=FIRST_PRIORITY))
        probes = [(None, job), (None, first)] + [(flag, replace(job, id=-1, spec=spec))
                                                  for flag, spec in variants]
        snaps = [(flag, probe.id, self.scheduling.snapshot_for(pending + [probe])) for flag, probe in probes]
        max_time, history = self.scheduling.limits.settings.max_time_s, self.scheduling.histories()
        calibration = self.scheduling.calibration.copy()
        starts = await asyncio.to_thread(
            lambda: [(flag, forecast.forecast(snap, max_time, only=probe, history=history,
                                              calibration=calibration).get(probe))
                     for flag, probe, snap in snaps])
        own, alone = starts[0][1], starts[1][1]
        answer["starts"] = own.json(now) if own else None
        if ahead and answer["rule"] == "fit" and _sooner(alone, own):
            answer["rule"] = "fair_share"  # its cards free in time, but jobs ahead take them
        answer["first_in_queue"] = alone.json(now) if alone else None
        if own is not None and own.node:
            answer["holding"] = [self._job_row(j) for j in state.jobs.holders()
                                 if own.node in {p.node for p in j.placements}][:SHOWN]
        for flag, start in starts[2:]:
            if flag is not None and start is not None and start.at is not None and _sooner(start, own):
                answer["sooner"].append({"change": flag, "starts": start.json(now)})
                if start.at <= now + 60:
                    break  # the smallest change that starts it now: enough
        answer["sooner"] += self._pools(job)
        return answer

    def _pools(self, job: Job) -> list[WhySooner]:
        """Pools that could take the job as it is and have room for one more now."""
        found: list[WhySooner] = []
        for name, pool in getattr(self.pools, "pools", {}).items():
            try:
                refused = self.pools.refusal(name, job.spec, job.user)
            except RequestError:
                continue
            capacity = self.pools.capacity_for(name, job.user)
            idle = None if capacity is None else capacity.gpus_idle
            if refused is None and self.pools.live(name) < pool.config.max_jobs \
                    and self.pools.live(name, job.user) < pool.config.user_cap \
                    and idle is not None and idle >= job.spec.gpu_count:
                found.append({"change": f"--pool {name}", "pool": name, "gpus_idle": idle, "starts": None})
        return found

    def _card_mb(self) -> int | None:
        return max((g.reading.memory_total_mb or 0 for g in self.state.gpus.values()), default=None) or None

    def _job_row(self, job: Job) -> WhyJobRow:
        ends = None
        if job.state.holds_gpus and job.started_at and job.spec.time_limit_s:
            ends = job.started_at + job.spec.time_limit_s
        return {"id": job.id, "user": job.user, "state": job.state.value,
                "gpu_count": job.spec.gpu_count, "gpu_mem_mb": job.spec.gpu_mem_mb,
                "gpus": [f"{p.node}:{p.gpu_index}" for p in job.placements],
                "time_limit_s": job.spec.time_limit_s, "ends_by": ends,
                "starts": self.state.forecasts.get(job.id)}

    def user(self, name: str) -> WhyUser:
        """A user's standing: fair share, quota, their jobs running and waiting."""
        mine = [j for j in self.state.jobs.values() if j.user == name]
        waiting: list[WhyWaitingRow] = [
            {**self._job_row(j), "queue_pos": self.state.queue_pos(j), "reason": j.reason}
            for j in sorted(mine, key=lambda j: self.state.queue_place.get(j.id, 1 << 30))
            if j.state == JobState.PENDING]
        return {"share": self.shares.standing(name),
                "running": [self._job_row(j) for j in mine if j.state.holds_gpus],
                "waiting": waiting}
