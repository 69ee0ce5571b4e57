"""The head's pools: which waiting jobs go to a batch cluster, and their life there.

A job goes to a pool when it asks (``--pool hpc``) or when it has waited a pool's
``burst_after`` here and the pool's hardware can run it, in the queue's (fair-share)
order, at most ``max_jobs`` of ours there at once. Sending is an intent first: the store
marks the job the pool's and keeps the token that names it there, then the pool is asked
(``sbatch``); a head restarted in between finds the job by its token before it would
submit again. Each pool is polled on one connection every ``poll_interval``: its report
moves our jobs (waiting there with the pool's reason, running on ``pool:node``, ended as
the pool says, charged elapsed × GPUs). A pool that stops answering leaves its jobs alone
("unreachable since …") until it answers again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..model import (Cancelling, InvalidRequest, Job, JobSpec, JobState, Pending, Placement, RequestError, Running,
                     UnfitRequest, holding)
from ..pools.base import (Capacity, PoolNotAuthorised, PoolRefusal, PoolSubmission,
                          PoolUnavailable, RemoteJob)
from ..pools.keys import head_pool_key
from ..pools.slurm import SlurmPool
from ..pools.status import pool_view
from ..printable import printable
from ..store import StaleDecision, StoreUnavailable
from ..units import duration_text
from .access import Access
from .jobs import JobTransitions
from .shares import Shares
from .state import HeadState
from .stream import Stream

log = logging.getLogger(__name__)

#: polls a job the pool no longer lists (and its accounting does not know) may miss
#: before it is taken as ended without a word
MISSED_POLLS = 3
#: how long a user's refused login is believed before it is tried again
REFUSAL_TTL_S = 60.0


@dataclass
class PoolView:
    """What the head knows of one pool between polls."""

    capacity: Capacity | None = None
    unreachable_since: float | None = None
    reason: str = ""
    polled_at: float | None = None
    missed: dict[int, int] = field(default_factory=dict)  # job id -> polls it was not listed
    refused: dict[str, float] = field(default_factory=dict)  # account -> when its login was refused


class Pools:
    def __init__(self, state: HeadState, stream: Stream, shares: Shares,
                 transitions: JobTransitions, access: Access, home: Path | None = None):
        self.state = state
        self.stream = stream
        self.shares = shares
        self.transitions = transitions
        self.access = access
        key = None
        if home is not None and any(p.per_submitter and not p.identity for p in state.config.pools):
            key = head_pool_key(home)
        self.pools = {p.name: SlurmPool(p, state.config, key) for p in state.config.pools}
        self.views = {name: PoolView() for name in self.pools}
        self.rows: dict[int, dict] = {}  # job id -> its pool row (store.pool_jobs)
        self._submitting: set[int] = set()
        #: intents this head has asked its pool for already: a retry (or an intent found at
        #: start, written by a head before) looks for the job there first
        self._asked: set[int] = set()

    # ------------------------------------------------------------------- lifecycle
    def start(self) -> None:
        self.rows = self.state.store.pool_jobs() if self.pools else {}
        self._asked = set(self.rows)  # a head before this one may have asked: find them first
        for name in self.pools:
            self.state.spawn(self._loop(name), f"pool-{name}")

    async def close(self) -> None:
        for pool in self.pools.values():
            await pool.close()

    async def _loop(self, name: str) -> None:
        while True:
            with contextlib.suppress(StoreUnavailable):
                try:
                    await self.tick(name)
                except Exception:
                    log.exception("pool %s: poll failed", name)
            await asyncio.sleep(self.pools[name].config.poll_interval_s)

    # ------------------------------------------------------------------- at submit
    def check(self, user: str, spec: JobSpec) -> None:
        """Refuse at submit what ``--pool`` names but the pool could never run (the pool's
        best in the sentence), in one line; UnfitRequest for hardware."""
        if spec.pool is None or spec.pool == "local":
            return
        pool = self.pools.get(spec.pool)
        if pool is None:
            known = ", ".join([*self.pools, "local"])
            raise InvalidRequest(f"no pool {spec.pool}; known: {known}")
        refusal = self.refusal(spec.pool, spec)
        if refusal:
            raise UnfitRequest(refusal)

    def refusal(self, name: str, spec: JobSpec) -> str | None:
        """Why pool ``name`` could never run ``spec`` (None: it could, or it is not known yet)."""
        config = self.pools[name].config
        if spec.image and config.runtime == "none":
            return (f"pool {name} declares no container runtime (runtime: none in nodes.yaml); "
                    "--image cannot run there: leave out --image or use --pool local")
        if spec.interactive:
            return f"pool {name} runs batch jobs only; `nebula run` runs here (--pool local)"
        if spec.after:
            return f"--after is not carried to pool {name}; submit it once its dependencies ended"
        if spec.vendor not in (None, "nvidia"):
            return f"pool {name} has NVIDIA GPUs only (Slurm gres gpu); leave out --vendor {spec.vendor}"
        capacity = self.views[name].capacity
        if capacity is None or not capacity.nodes:
            return None  # not reached yet: its sbatch says no if it must
        best = capacity.max_gpus_per_node
        if spec.gpu_count > best:
            return (f"pool {name} has at most {best} GPUs on one node; ask for --gpu-count {best} "
                    "or fewer (with --nodes for more)")
        fit = capacity.nodes_with(spec.gpu_count)
        if spec.nodes > fit:
            return (f"pool {name} has {fit} node{'s' if fit != 1 else ''} with {spec.gpu_count} "
                    f"GPUs; ask for --nodes {fit} or fewer")
        return None

    def bursts_for(self, spec: JobSpec) -> bool:
        """Whether a pool that takes jobs after burst_after could run ``spec`` (as far as
        its last capacity tells)."""
        return any(pool.config.burst_after_s is not None and self.views[name].capacity is not None
                   and self.refusal(name, spec) is None for name, pool in self.pools.items())

    async def admit(self, user: str, spec: JobSpec) -> None:
        """The checks at submit that ask the pool: with ``user: submitter``, whether the
        user's own account there lets the head's key in."""
        self.check(user, spec)
        pool = self.pools.get(spec.pool or "")
        if pool is None or not pool.config.per_submitter:
            return
        try:
            await pool.check_login(pool.account_for(user))
        except PoolNotAuthorised:
            raise RequestError(f"{user} has not authorised the head's key on pool {pool.name}: "
                               f"run `nebula pool authorize {pool.name}` and add the line it "
                               "prints to your ~/.ssh/authorized_keys there") from None
        except PoolUnavailable:
            pass  # the job waits here for the pool, which may answer later

    def accepted(self, job: Job) -> None:
        """A job just submitted: one asking for a pool goes there now if it has room."""
        if job.spec.pool in self.pools:
            self._send_waiting(job.spec.pool)

    # --------------------------------------------------------------------- sending
    def live(self, name: str) -> int:
        return sum(1 for row in self.rows.values() if row["pool"] == name)

    def _send_waiting(self, name: str) -> None:
        """Send the jobs that asked for pool ``name`` (as the queue orders: priority, then
        fair share), then those waiting past its burst_after in the queue's order, while it
        has room."""
        pool, view = self.pools[name], self.views[name]
        room = pool.config.max_jobs - self.live(name)
        now = self.state.clock()
        weights = {user: share.weight for user, share in self.shares.shares().items()}
        asked = sorted((j for j in self.state.jobs.values() if j.spec.pool == name
                        and j.pool is None and j.state == JobState.PENDING and not j.held_by),
                       key=lambda j: (-j.spec.priority, weights.get(j.user, 1.0), j.id))
        bursting = []
        burst_after = pool.config.burst_after_s
        if burst_after is not None and view.unreachable_since is None and view.capacity is not None:
            place = self.state.queue_place
            bursting = sorted(
                (j for j in self.state.jobs.values()
                 if j.spec.pool is None and j.pool is None and j.state == JobState.PENDING
                 and not j.held_by and now - j.submitted_at >= burst_after
                 and not self.refusal(name, j.spec)
                 and view.refused.get(pool.account_for(j.user), -1e18) < now - REFUSAL_TTL_S),
                key=lambda j: (place.get(j.id, len(place) + 1), j.id))
        for job in asked[:max(0, room)]:
            self.send(name, job, f"sent to pool {name} (--pool)")
        room -= len(asked)
        for job in bursting[:max(0, room)]:
            waited = duration_text(now - job.submitted_at)
            self.send(name, job, f"sent to pool {name} after {waited} waiting here")
        for job in asked[max(0, room + len(asked)):]:
            self._set_reason(job, f"waiting for room in pool {name} ({self.live(name)} of ours "
                                  f"there, max_jobs {pool.config.max_jobs})")

    def send(self, name: str, job: Job, why: str) -> None:
        """The intent, then the pool is asked (in the background)."""
        pool = self.pools[name]
        account = pool.account_for(job.user)
        token = f"{self.state.store.head_token}.{job.id}.{job.attempt}.{secrets.token_hex(4)}"
        note = why + pool.slices_note(job.spec)
        try:
            self.state.store.send_to_pool(job.id, name, account, token, "", note, self.state.clock())
        except StaleDecision:
            return
        self.rows[job.id] = {"job_id": job.id, "pool": name, "account": account, "token": token,
                             "remote_id": None, "log_path": "", "sent_at": self.state.clock()}
        job = replace(job, pool=name, status=Pending(note))
        self._put(job)
        self.state.spawn(self.submit(job.id), f"pool-submit-{job.id}")

    async def submit(self, job_id: int) -> None:
        """Ask the pool to run a job whose intent is written: first whether it already has
        it (a head restarted mid-submit), never twice at once."""
        row = self.rows.get(job_id)
        job = self.state.jobs.get(job_id)
        if row is None or job is None or row["remote_id"] or job_id in self._submitting:
            return
        pool, view = self.pools[row["pool"]], self.views[row["pool"]]
        self._submitting.add(job_id)
        try:
            # A new intent cannot be there yet: one sbatch, no squeue before it.
            found = await pool.find(row["account"], row["token"]) if job_id in self._asked else None
            self._asked.add(job_id)
            remote_id = found.remote_id if found else None
            shards = job.spec.gpu_count if job.spec.gpu_mem_mb and pool.config.shards_per_gpu else 0
            submission = PoolSubmission(job, row["account"], row["token"], job.spec.gpu_count, shards)
            if remote_id is None:
                remote_id = await pool.submit(submission)
                if job_id not in self.rows:  # cancelled while sbatch ran: it must not run there
                    return await pool.cancel(row["account"], remote_id)
            if not row["log_path"]:
                row["log_path"] = pool.log_path(await pool.workdir(row["account"]), submission)
            row["remote_id"] = remote_id
            self.state.store.pool_submitted(job_id, remote_id, row["log_path"], self.state.clock())
        except PoolNotAuthorised as err:
            view.refused[row["account"]] = self.state.clock()
            self._fail(job_id, f"{err}; run `nebula pool authorize {pool.name}`")
        except PoolRefusal as err:
            self._fail(job_id, str(err))
        except PoolUnavailable as err:
            self._unreachable(pool.name, str(err))  # tried again at the next poll
        finally:
            self._submitting.discard(job_id)

    def _fail(self, job_id: int, reason: str) -> None:
        job = self.state.jobs.get(job_id)
        self.rows.pop(job_id, None)
        if job is not None and not job.state.finished:
            self.transitions.finish(job, JobState.FAILED, None, printable(reason)[:500])

    # ------------------------------------------------------------------------ poll
    async def tick(self, name: str) -> None:
        """One poll of pool ``name``: submissions not answered yet, cancels not done yet,
        what the pool says of every job of ours, then the jobs it has room for."""
        pool, view = self.pools[name], self.views[name]
        self._asked &= set(self.rows)
        mine = {job_id: row for job_id, row in self.rows.items() if row["pool"] == name}
        for job_id, row in mine.items():
            if not row["remote_id"]:
                await self.submit(job_id)
        # Whose jobs to list; with none of ours there, the pool's account (a submitter
        # pool's: the head's own user, whose account there may have authorised its key).
        accounts = {row["account"] for row in mine.values()}
        try:
            result = await pool.poll(accounts or {pool.account_for(self.state.owner)},
                                     {row["remote_id"]: row["token"]
                                      for row in mine.values() if row["remote_id"]})
        except PoolNotAuthorised as err:
            if accounts:
                self._unreachable(name, str(err))
            else:  # a submitter pool nobody has sent a job to yet: nothing to poll with
                view.reason = printable(f"{err}: its status is read once a user's job went there")
            self._send_waiting(name)
            return
        except PoolUnavailable as err:
            self._unreachable(name, str(err))
            self._send_waiting(name)  # the intents are written, their sbatch retried
            return
        if view.unreachable_since is not None:
            self.state.record("pool", f"pool {name} answers again; its jobs are reconciled")
        view.unreachable_since, view.reason = None, ""
        view.capacity = result.capacity or view.capacity
        view.polled_at = self.state.clock()
        for job_id, row in mine.items():
            job = self.state.jobs.get(job_id)
            if job is None:
                self.rows.pop(job_id, None)
                continue
            if isinstance(job.status, Cancelling) and row["remote_id"]:  # asked while away
                with contextlib.suppress(PoolUnavailable, PoolRefusal):
                    await pool.cancel(row["account"], row["remote_id"])
            report = result.jobs.get(row["token"])
            if report is None:
                if row["remote_id"]:
                    self._not_listed(name, job, view)
                continue
            view.missed.pop(job_id, None)
            await self._apply(name, job, row, report)
        self._send_waiting(name)
        self.stream.publish({"type": "pool", "pool": self.view_json(name)})

    def _not_listed(self, name: str, job: Job, view: PoolView) -> None:
        """Neither the pool's job list nor its accounting has the job any more (it ended
        more than MinJobAge ago while the pool did not answer, on a cluster without
        accounting): after MISSED_POLLS polls it ends, failed, saying so."""
        view.missed[job.id] = view.missed.get(job.id, 0) + 1
        if view.missed[job.id] >= MISSED_POLLS:
            view.missed.pop(job.id, None)
            self._fail(job.id, f"pool {name} no longer lists it and keeps no accounting of "
                               "its end; its output may still be read with `nebula logs`")

    async def _apply(self, name: str, job: Job, row: dict, report: RemoteJob) -> None:
        """The job's state here follows what the pool reports."""
        if report.end is not None:
            if job.state == JobState.PENDING and report.started_at and report.nodes:
                job = self._mark_running(name, job, report)  # it ran between two polls
            state, reason = report.end
            if isinstance(job.status, Cancelling):
                state, reason = JobState.CANCELLED, f"cancelled by {job.status.by}"
            if report.preempted and not job.spec.no_requeue:
                self._preempted(name, job)
                return
            self.rows.pop(job.id, None)
            at = report.ended_at if report.ended_at and job.started_at and \
                report.ended_at >= job.started_at else None
            if at is not None and report.elapsed_s is not None and job.started_at:
                at = job.started_at + report.elapsed_s  # the accounting's own elapsed time
            self.transitions.finish(job, state, report.exit_code, printable(reason)[:500], at=at)
            return
        if report.running and job.state == JobState.PENDING:
            self._mark_running(name, job, report)
        elif report.waiting and job.state.holds_gpus:
            self.transitions.requeue(job, f"requeued in pool {name}"
                                          + (f": {printable(report.reason)}" if report.reason else ""))
        elif report.waiting and job.state == JobState.PENDING:
            why = printable(report.reason or "waiting")[:200]
            self._set_reason(job, f"pending in pool {name}: {why}")

    def _preempted(self, name: str, job: Job) -> None:
        """The pool took the job back and will not run it again (PREEMPTED): it waits in our
        queue again, as a new attempt, to be sent (or run here) afresh."""
        why = f"requeued: preempted in pool {name}"
        self.rows.pop(job.id, None)
        if job.state.holds_gpus:
            self.transitions.requeue(job, why)
        self.state.store.leave_pool(job.id, self.state.clock(), why)
        job = self.state.jobs.get(job.id)
        if job is not None:
            job = replace(job, pool=None, status=Pending(why))
            self._put(job)

    def _mark_running(self, name: str, job: Job, report: RemoteJob) -> Job:
        placements = tuple(
            Placement(f"{name}:{report.remote_id}:{node}:{i}", f"{name}:{printable(node)[:63]}",
                      i, 0, True)
            for node in (report.nodes or ("?",)) for i in range(max(1, job.spec.gpu_count)))
        started = report.started_at or self.state.clock()
        self.state.store.pool_running(job.id, placements, started, self.state.clock())
        job = replace(job, status=Running(placements, started, token=self.rows[job.id]["token"]))
        self._put(job)
        self.shares.changed(job.user)
        return job

    def _set_reason(self, job: Job, reason: str) -> None:
        if job.reason == reason or not isinstance(job.status, Pending):
            return
        self.state.store.set_reasons({job.id: reason})
        job = replace(job, status=replace(job.status, reason=reason))
        self._put(job)

    def _put(self, job: Job) -> Job:
        """The job's new status in the live table, and out to subscribers."""
        self.state.jobs[job.id] = job
        self.stream.publish_job(job)
        return job

    def _unreachable(self, name: str, why: str) -> None:
        view = self.views[name]
        why = printable(why)[:300]
        if view.unreachable_since is None:
            view.unreachable_since = self.state.clock()
            self.state.record("pool", f"pool {name} unreachable: {why}; its jobs are left as they are")
        view.reason = why

    # ---------------------------------------------------------------- users' requests
    def _row(self, job: Job) -> dict:
        row = self.rows.get(job.id) or self.state.store.pool_job(job.id)
        if row is None:
            raise RequestError(f"job {job.id} was never sent to a pool")
        return row

    async def cancel(self, user: str, job: Job) -> None:
        """scancel, then the job ends cancelled (a job not sent yet ends at once)."""
        self.access.check_may_manage(user, job, "cancel")
        if job.state.finished:
            raise RequestError(f"job {job.id} has already ended: it {job.state.phrase}")
        row = self.rows.get(job.id)
        if row is not None:
            pool = self.pools[row["pool"]]
            while job.id in self._submitting:  # its sbatch under way (bounded by its timeouts)
                await asyncio.sleep(0.1)
            remote = row["remote_id"] or (found.remote_id if (found := await self._find(pool, row)) else None)
            if remote:
                try:
                    await pool.cancel(row["account"], remote)
                except PoolUnavailable as err:
                    held = holding(job.status)
                    if not isinstance(held, Running):
                        raise RequestError(f"{err}; cancel it again once it answers") from None
                    # Kept, like a lab job's cancel on a node away: scancel once it answers.
                    self.state.store.request_cancel(job.id, user, self.state.clock(), audit=user != job.user)
                    self._put(replace(job, status=Cancelling(held, user, self.state.clock())))
                    return
                except PoolRefusal as err:
                    raise RequestError(str(err)) from None
        current = self.state.jobs.get(job.id)
        if current is None or current.state.finished:
            return
        if user != job.user:
            self.state.record("admin", f"{user} cancelled job {job.id} of {job.user}",
                              job_id=job.id, user=user)
        self.rows.pop(job.id, None)
        self.transitions.finish(current, JobState.CANCELLED, None, f"cancelled by {user}")

    async def _find(self, pool: SlurmPool, row: dict) -> RemoteJob | None:
        try:
            return await pool.find(row["account"], row["token"])
        except PoolUnavailable as err:
            raise RequestError(f"{err}; try again when it answers") from None

    async def hold(self, user: str, job: Job, hold: bool) -> Job:
        what = "hold" if hold else "release"
        self.access.check_may_manage(user, job, what)
        if job.state != JobState.PENDING:
            raise RequestError(f"job {job.id} {job.state.phrase}; only waiting jobs can be "
                               f"{'held' if hold else 'released'}")
        row = self.rows.get(job.id)
        if row is not None and row["remote_id"]:
            try:
                await self.pools[row["pool"]].hold(row["account"], row["remote_id"], hold)
            except (PoolUnavailable, PoolRefusal) as err:
                raise RequestError(str(err)) from None
        self.state.store.set_held(job.id, user if hold else None, user, self.state.clock())
        reason = (f"held by {user}; `nebula release {job.id}` lets it run" if hold
                  else f"released by {user}" if row else "waiting for the scheduler")
        job = replace(job, status=Pending(reason, held_by=user if hold else None))
        self._put(job)
        return job

    async def requeue(self, user: str, job: Job) -> Job:
        self.access.check_may_manage(user, job, "requeue")
        row = self._row(job)
        if not job.state.holds_gpus or not row.get("remote_id"):
            raise RequestError(f"job {job.id} {job.state.phrase}; only a running job can be requeued")
        try:
            await self.pools[row["pool"]].requeue(row["account"], row["remote_id"])
        except (PoolUnavailable, PoolRefusal) as err:
            raise RequestError(str(err)) from None
        self.state.record("requeue", f"job {job.id} is requeued in pool {row['pool']} by {user}",
                          job_id=job.id)
        self.transitions.requeue(job, f"requeued in pool {row['pool']} by {user}")
        return self.state.jobs.get(job.id, job)

    async def read_log(self, user: str, job: Job, offset: int) -> dict:
        """The job's output file there, read over SSH from byte ``offset``."""
        self.access.check_may_manage(user, job, "read the log of")
        row = self._row(job)
        if not row.get("log_path"):
            return {"data": "", "offset": offset, "parts": [], "state": job.state.value,
                    "ended": job.state.finished}
        try:
            data, end, size = await self.pools[row["pool"]].logs(row["account"], row["log_path"],
                                                                 offset)
        except (PoolUnavailable, PoolNotAuthorised) as err:
            raise RequestError(f"cannot read the log of job {job.id}: {err}") from None
        node = job.node or row["pool"]
        now = self.state.jobs.get(job.id) or self.state.store.job(job.id) or job
        return {"data": data, "offset": end,
                "parts": [{"rank": 0, "node": node, "data": data, "offset": end, "size": size}],
                "state": now.state.value, "ended": now.state.finished and not data}

    # ----------------------------------------------------------------------- status
    def view_json(self, name: str) -> dict:
        """One pool as `nebula status` and the TUI show it (the head's words, one author)."""
        pool, view = self.pools[name], self.views[name]
        jobs = [self.state.jobs.get(i) for i, row in self.rows.items() if row["pool"] == name]
        running = sum(1 for j in jobs if j is not None and j.state.holds_gpus)
        pending = sum(1 for j in jobs if j is not None and j.state == JobState.PENDING)
        return pool_view(pool.config, pool.kind, view.capacity, view.unreachable_since,
                         view.reason, running, pending, self.state.clock(), pool.authorize())

    def status(self) -> list[dict]:
        return [self.view_json(name) for name in self.pools]

