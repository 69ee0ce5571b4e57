"""The head's books on its pools: what it knows of each between polls (``PoolView``), the
pool jobs' rows, what a pool job is charged beyond its last run (runs of its Slurm id the
head never saw end; a preemptible job moved off the scavenger QOS or partition), and what
users ask of a pool job (cancel, hold, requeue, its log) and of a pool (its status line).
``head/pools.py`` builds on it: which job goes where, the polls.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import re
import secrets
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..model import (Cancelling, Job, JobState, Pending, Placement, RequestError, Running,
                     holding)
from ..pools.base import (Capacity, PoolNotAuthorised, PoolRefusal,
                          PoolUnavailable, RemoteJob)
from ..pools.keys import head_pool_key
from ..pools.slurm import SlurmPool
from ..pools.status import pool_view
from ..printable import printable
from ..units import duration_text
from .access import Access
from .jobs import JobTransitions
from .shares import Shares
from .state import HeadState
from .stream import Stream
from ..wire import LogsReply, PoolWire

log = logging.getLogger(__name__)

#: polls a job the pool no longer lists (and its accounting does not know) may miss
#: before it is taken as ended without a word
MISSED_POLLS = 3
#: how long a user's refused login is believed before it is tried again: doubled at each
#: refusal in a row, up to REFUSAL_MAX_S (a login node's fail2ban counts failed logins)
REFUSAL_TTL_S = 60.0
REFUSAL_MAX_S = 3600.0
#: how long after a restore's question to one account failed (an answer too long, or not
#: Slurm's) it is asked again: doubled at each failure in a row, up to REFUSAL_MAX_S
RECHECK_S = 15.0
#: how long a job that waited past burst_after and was refused by a pool is not sent there
#: again (it waits here meanwhile)
BOUNCE_S = 600.0


#: how far before its send a run of a job's Slurm id may start and still be its own (the
#: cluster's clock against the head's)
RUN_SLACK_S = 300.0


#: the mark a pool token ends with: a salt and its HMAC under the store's pool key, in hex
_SALT_HEX, _MARK_HEX = 8, 16
_TOKEN = re.compile(r"([0-9a-f]+)\.([0-9]+)\.([0-9]+)\.([0-9a-f]{%d})" % (_SALT_HEX + _MARK_HEX))
#: the attempt a token was sent at (``head.job.attempt.…``; older heads' tokens too)
TOKEN_ATTEMPT = re.compile(r"[0-9a-f]+\.[0-9]+\.([0-9]+)\..*")


def _mark(key: bytes, body: str) -> str:
    return hmac.new(key, body.encode(), hashlib.sha256).hexdigest()[:_MARK_HEX]


def mint_token(key: bytes, head: str, job: Job) -> str:
    """The token a job carries to a pool (``--comment``): ``head.job.attempt.`` and a random
    salt marked with the store's key, so a restored head knows a token it issued, and one
    that anybody on the cluster made up (the comments are public) from it."""
    body = f"{head}.{job.id}.{job.attempt}.{secrets.token_hex(_SALT_HEX // 2)}"
    return body + _mark(key, body)


def issued_job(key: bytes, head: str, token: str) -> int | None:
    """The job ``token`` was issued for by the head of ``head`` and ``key``; None for a
    token it never issued (another head's, made up, or an older head's without a mark)."""
    found = _TOKEN.fullmatch(token)
    if found is None or found.group(1) != head:
        return None
    body, mark = token[:-_MARK_HEX], token[-_MARK_HEX:]
    return int(found.group(2)) if hmac.compare_digest(_mark(key, body), mark) else None


@dataclass
class PoolView:
    """What the head knows of one pool between polls."""

    capacity: Capacity | None = None
    unreachable_since: float | None = None
    reason: str = ""
    polled_at: float | None = None
    missed: dict[int, int] = field(default_factory=dict)  # job id -> polls it was not listed
    #: account -> when its login may be tried again, and its refusals in a row
    refused: dict[str, tuple[float, int]] = field(default_factory=dict)
    degraded_since: float | None = None  # its last answer was not a Slurm answer
    #: this head's jobs there were asked for since it started (none sent before that)
    reconciled: bool = False
    #: accounts whose jobs carrying this head's tokens could not be asked (no answer, or
    #: not Slurm's): asked again at each poll, nothing of theirs sent before
    unreconciled: set[str] = field(default_factory=set)
    warned: set[int] = field(default_factory=set)  # jobs whose odd report was said once
    #: account -> why its last answer was none, or not Slurm's (its jobs left as they are)
    troubled: dict[str, str] = field(default_factory=dict)
    #: job id -> why it was cancelled there: its request grown past what was sent
    grown: dict[int, str] = field(default_factory=dict)
    #: account -> the capacity as read in it (``user: submitter``: what its owner may believe)
    capacities: dict[str, Capacity] = field(default_factory=dict)

    #: job id -> until when it is not sent here again: refused (it never asked for the pool)
    bounced: dict[int, float] = field(default_factory=dict)
    #: account -> when its restore's question may be asked again, and its failures in a row
    #: (an answer too long or not Slurm's: asked again at once, it would fail again)
    recheck: dict[str, tuple[float, int]] = field(default_factory=dict)

    def refusing(self, account: str, now: float) -> bool:
        return self.refused.get(account, (-1e18, 0))[0] > now

    def refuse(self, account: str, now: float) -> None:
        _back_off(self.refused, account, now, REFUSAL_TTL_S)

    def rechecking(self, account: str, now: float) -> bool:
        return self.recheck.get(account, (-1e18, 0))[0] > now

    def recheck_later(self, account: str, now: float) -> float:
        """The restore's question to ``account`` waits longer each time it fails; the wait."""
        return _back_off(self.recheck, account, now, RECHECK_S) - now


def _back_off(table: dict[str, tuple[float, int]], account: str, now: float, first: float) -> float:
    """``account``'s next try in ``table``: ``first`` seconds on, doubled at each failure in
    a row, up to REFUSAL_MAX_S; when it is."""
    times = table.get(account, (0.0, 0))[1] + 1
    table[account] = (now + min(REFUSAL_MAX_S, first * 2 ** (times - 1)), times)
    return table[account][0]



class PoolBooks:
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


    def _fail(self, job_id: int, reason: str) -> None:
        job = self.state.jobs.get(job_id)
        self.rows.pop(job_id, None)
        if job is not None and not job.state.finished:
            self.transitions.finish(job, JobState.FAILED, None, printable(reason)[:500])

    def _refused(self, name: str, job_id: int, why: str) -> None:
        """The pool refused a job (sbatch, or its owner's login). One that asked for it
        (``--pool``) fails, saying why; one that never did (it waited past burst_after)
        waits here again, the lab's, not sent there again for BOUNCE_S: never failed for a
        pool it never asked for (its owner's limits there, MaxSubmitJobs, an account with
        no association, a project account's limit reached by others)."""
        job = self.state.jobs.get(job_id)
        if job is None or job.spec.pool == name or job.state.finished:
            return self._fail(job_id, why)
        now = self.state.clock()
        self.views[name].bounced[job_id] = now + BOUNCE_S
        why = (f"refused by pool {name} ({printable(why)[:200]}): waits here, not sent there "
               f"again for {duration_text(BOUNCE_S)}")
        self.rows.pop(job_id, None)
        self.state.store.leave_pool(job_id, now, why)
        self.state.store.set_reasons({job_id: why})
        current = self.state.jobs.get(job_id)
        if current is not None:
            self._put(replace(current, pool=None, status=Pending(why)))

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

    def _degraded(self, name: str, why: str) -> None:
        """The pool answered, but not as Slurm answers: its jobs stay as they are."""
        self._trouble(name, "degraded_since", "degraded", why)

    def _unreachable(self, name: str, why: str) -> None:
        self._trouble(name, "unreachable_since", "unreachable", why)

    def _trouble(self, name: str, since: str, word: str, why: str) -> None:
        """The pool is ``word`` (said once, when it begins), for ``why``."""
        view = self.views[name]
        why = printable(why)[:300]
        if getattr(view, since) is None:
            setattr(view, since, self.state.clock())
            self.state.record("pool", f"pool {name} {word}: {why}; its jobs are left as they are")
        view.reason = why

    # ------------------------------------------------------------------- charging
    def _earlier_runs(self, name: str, job: Job, row: dict, report: RemoteJob, asked: int) -> None:
        """Charge the runs of the job's Slurm id before its last that the head never saw
        end: the job requeued itself (``scontrol requeue``, its owner may) and ran again
        between two polls, and the accounting of its id is its last run's alone. The head
        saw ``job.attempt`` minus the attempt it was sent at of them (and charged those)."""
        sent = TOKEN_ATTEMPT.fullmatch(row["token"] or "")
        seen = max(0, job.attempt - int(sent.group(1))) if sent else len(report.earlier_runs)
        # A run that started before the job was sent is another job's (Slurm's ids begin
        # again after its state is lost): never charged here.
        sent_at = row.get("sent_at") or self.state.clock()
        missed = [run for run in report.earlier_runs[seen:]
                  if run[2] is None or run[2] >= sent_at - RUN_SLACK_S]
        if not missed:
            return
        longest = max(0.0, self.state.clock() - sent_at)
        gpu_s = sum(min(elapsed, longest) * (asked if gpus is None else gpus) for elapsed, gpus, _ in missed)
        charged = self.state.store.charge_pool_runs(
            job.id, gpu_s / 3600, self.state.clock(),
            f"ran {len(missed)} time{'s' if len(missed) > 1 else ''} in pool {name} before its "
            f"last run (requeued there between two polls): charged {gpu_s / 3600:.4f} GPU-hours for it")
        self.shares.charged(job.user, charged, job.spec.preemptible)

    def _scavenger_or_full_price(self, name: str, job: Job, report: RemoteJob) -> Job:
        """A preemptible job's owner may move it, while it waits there, to another QOS or
        partition (``scontrol update``): where the pool says it is no longer in the
        scavenger ones, it is charged as the normal job it became, not at the scavenger's
        fraction."""
        config = self.pools[name].config
        if not job.spec.preemptible:
            return job
        moved = [f"{what} {printable(now)[:60]}" for what, now, scavenger in (
            ("QOS", report.qos, config.scavenger_qos), ("partition", report.partition, config.scavenger_partition))
            if scavenger and now and now != scavenger]
        if not moved:
            return job
        return self.transitions.charge_in_full(job, f"job {job.id} runs in pool {name}'s "
                                               f"{' and '.join(moved)}, not its scavenger one: "
                                               "charged as a normal job")

    async def _grown(self, name: str, job: Job, row: dict, report: RemoteJob) -> None:
        """A job's owner may change its request there while it waits (``scontrol update
        jobid=… gres=gpu:8``: Slurm lets a user do that to their own pending job), past what
        the head sent, checked and shows: such a job is cancelled there, once, saying why
        (its end, and the GPUs its allocation held, come as for any cancel)."""
        view = self.views[name]
        if job.id in view.grown or job.spec.gpu_mem_mb:  # a shard job's gres is not whole GPUs
            return
        sent_gpus, sent_nodes = job.spec.gpu_count * job.spec.nodes, job.spec.nodes
        grown = [f"{now} {what}" for what, now, sent in (
            ("GPUs", report.requested_gpus, sent_gpus), ("nodes", report.requested_nodes, sent_nodes))
            if now is not None and now > sent]
        if not grown:
            return
        view.grown[job.id] = (f"cancelled: its request in pool {name} was changed to "
                              f"{' on '.join(grown)}, more than it was sent with ({sent_gpus} "
                              f"GPU{'s' if sent_gpus != 1 else ''} on {sent_nodes} node"
                              f"{'s' if sent_nodes != 1 else ''})")
        self.state.record("pool", f"job {job.id}: {view.grown[job.id]}", job_id=job.id)
        with contextlib.suppress(PoolUnavailable, PoolRefusal):
            await self.pools[name].cancel(row["account"], row["remote_id"])

    # ------------------------------------------------------- what a poll moves
    def _account_troubles(self, name: str, troubled: dict, keep: bool = False) -> None:
        """Accounts whose answer this poll was no answer, or not Slurm's (a member's own key
        line may run anything): said once each, their jobs left as they are, everybody
        else's moved as their own accounts say (``keep``: the others' troubles stay)."""
        view = self.views[name]
        for account in [] if keep else list(view.troubled):
            if account not in troubled and account not in view.unreconciled:
                del view.troubled[account]
                self.state.record("pool", f"pool {name} answers as {account} again")
        for account, err in troubled.items():
            if account not in view.troubled:
                self.state.record("pool", f"pool {name}, as {account}: {printable(str(err))[:300]}; "
                                  f"{account}'s jobs there are left as they are")
            view.troubled[account] = printable(str(err))[:300]

    def _not_ours(self, name: str, account: str, remote) -> None:
        """A job of ``account`` carrying this head's prefix but not a token it issued, or a
        copy of one: never adopted, and left alone (it is that user's, not this head's)."""
        self.state.record("pool", f"pool {name}: job {printable(remote.slurm_id)[:40]} of {account} carries "
                          f"this head's token prefix but not a token it issued ({printable(remote.comment)[:80]}): "
                          "not taken for one of its jobs")

    def _preempted(self, name: str, job: Job) -> None:
        """The pool took the job back and will not run it again (PREEMPTED): it waits in our
        queue again, as a new attempt, to be sent (or run here) afresh."""
        why = f"requeued: preempted in pool {name}"
        self.rows.pop(job.id, None)
        if job.state.holds_gpus:
            self.transitions.requeue(job, why)
        self.state.store.leave_pool(job.id, self.state.clock(), why)
        now = self.state.jobs.get(job.id)
        if now is not None:
            self._put(replace(now, pool=None, status=Pending(why)))

    def _mark_running(self, name: str, job: Job, report: RemoteJob) -> Job:
        placements = tuple(
            Placement(f"{name}:{report.remote_id}:{node}:{i}", f"{name}:{printable(node)[:63]}",
                      i, 0, True)
            # at most the nodes it asked for: the list is what its owner's account printed
            for node in (report.nodes[:job.spec.nodes] or ("?",)) for i in range(max(1, job.spec.gpu_count)))
        started = report.started_at or self.state.clock()
        self.state.store.pool_running(job.id, placements, started, self.state.clock())
        job = replace(job, status=Running(placements, started, token=self.rows[job.id]["token"]))
        self._put(job)
        self.shares.changed(job.user)
        return job

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
                await self._runs_before_cancel(row["pool"], job, row, remote)
        current = self.state.jobs.get(job.id)
        if current is None or current.state.finished:
            return
        if user != job.user:
            self.state.record("admin", f"{user} cancelled job {job.id} of {job.user}",
                              job_id=job.id, user=user)
        self.rows.pop(job.id, None)
        self.transitions.finish(current, JobState.CANCELLED, None, f"cancelled by {user}")

    async def _runs_before_cancel(self, name: str, job: Job, row: dict, remote: str) -> None:
        """A job cancelled here ends here at once, with no poll reading its end: the runs of
        its Slurm id that no poll saw (it requeued itself between two, and its owner lifted
        the BeginTime) are read from the accounting and charged now, not left free."""
        with contextlib.suppress(PoolUnavailable, PoolRefusal):
            report = await self.pools[name].runs(row["account"], remote, row["token"])
            if report is not None and report.earlier_runs:
                self._earlier_runs(name, job, row, report, job.spec.gpu_count * job.spec.nodes)

    async def _find(self, pool: SlurmPool, row: dict) -> RemoteJob | None:
        """The job whose sbatch never answered, looked for among its owner's jobs there; a
        pool that does not answer, or (a head restarted between the two) an owner's login
        it refuses, is the user's one line: whether it is there is not known yet."""
        try:
            return await pool.find(row["account"], row["token"])
        except (PoolUnavailable, PoolRefusal) as err:
            raise RequestError(f"{err}; its sbatch never answered, so whether it is there is not "
                               "known: cancel it again when the pool answers") from None

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

    async def read_log(self, user: str, job: Job, offset: int) -> LogsReply:
        """The job's output file there, read over SSH from byte ``offset``."""
        self.access.check_may_manage(user, job, "read the log of")
        row = self._row(job)
        if not row.get("log_path"):
            return {"data": "", "offset": offset, "size": 0, "parts": [], "state": job.state.value,
                    "ended": job.state.finished}
        try:
            data, end, size = await self.pools[row["pool"]].logs(row["account"], row["log_path"],
                                                                 offset)
        except (PoolUnavailable, PoolNotAuthorised) as err:
            raise RequestError(f"cannot read the log of job {job.id}: {err}") from None
        node = job.node or row["pool"]
        now = self.state.jobs.get(job.id) or self.state.store.job(job.id) or job
        return {"data": data, "offset": end, "size": size,
                "parts": [{"rank": 0, "node": node, "data": data, "offset": end, "size": size}],
                "state": now.state.value, "ended": now.state.finished and not data}

    # ----------------------------------------------------------------------- status
    def view_json(self, name: str) -> PoolWire:
        """One pool as `nebula status` and the TUI show it (the head's words, one author)."""
        pool, view = self.pools[name], self.views[name]
        jobs = [self.state.jobs.get(i) for i, row in self.rows.items() if row["pool"] == name]
        running = sum(1 for j in jobs if j is not None and j.state.holds_gpus)
        pending = sum(1 for j in jobs if j is not None and j.state == JobState.PENDING)
        return pool_view(pool.config, pool.kind, view.capacity, view.unreachable_since,
                         view.reason, running, pending, self.state.clock(), pool.authorize(),
                         degraded_since=view.degraded_since, troubled=view.troubled)

    def status(self) -> list[PoolWire]:
        return [self.view_json(name) for name in self.pools]
