"""The head's pools: which waiting jobs go to a batch cluster, and their life there.

A job goes to a pool when it asks (``--pool hpc``) or when it has waited a pool's
``burst_after`` here and the pool's hardware can run it, in the queue's (fair-share)
order, at most ``max_jobs`` of ours there at once. Sending is an intent first: the store
marks the job the pool's and keeps the token that names it there, then the pool is asked
(``sbatch``); a head restarted in between finds the job by its token before it would
submit again. From sbatch's answer on, the job is its Slurm id. Every ``poll_interval``
each owner's jobs are asked of the pool in that owner's account (``pools/slurm.py``): its
report moves our jobs (waiting there with the pool's reason, running on ``pool:node``,
ended as that account's accounting says, charged the cluster's elapsed time × GPUs). A pool
that stops answering leaves its jobs alone ("unreachable since …"), as does one whose
answer is not a Slurm answer ("degraded"). Nobody's account is logged in to without a
live job of theirs there, and a refused login waits longer each time. At start the head
asks each pool which jobs carry its tokens (after a restore: those sent since the backup)
and adopts or ends exactly those before it sends any.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import replace

from ..model import (Cancelling, InvalidRequest, Job, JobSpec, JobState, Pending, RequestError, UnfitRequest)
from ..pools.base import (Capacity, PoolDegraded, PoolNotAuthorised, PoolRefusal, PoolSilent,
                          PoolSubmission, PoolUnavailable, RemoteJob, sent_order)
from ..printable import printable
from ..store import StaleDecision, StoreUnavailable
from ..units import duration_text
from .pool_books import MISSED_POLLS, PoolBooks, PoolView, issued_job, mint_token

log = logging.getLogger(__name__)


class Pools(PoolBooks):
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
        refusal = self.refusal(spec.pool, spec, user)
        if refusal:
            raise UnfitRequest(refusal)

    def refusal(self, name: str, spec: JobSpec, user: str | None = None) -> str | None:
        """Why pool ``name`` could never run ``user``'s ``spec`` (None: it could, or it is
        not known yet)."""
        config = self.pools[name].config
        if spec.image and config.runtime == "none":
            return (f"pool {name} declares no container runtime (runtime: none in nodes.yaml); "
                    "--image cannot run there: leave out --image or use --pool local")
        if spec.interactive:
            return f"pool {name} runs batch jobs only; `nebula run` runs here (--pool local)"
        if spec.nodelist:  # the lab's nodes (checked at submit): never a pool's
            return f"-w names this lab's nodes, not pool {name}'s; leave out -w or use --pool local"
        if spec.after:
            return f"--after is not carried to pool {name}; submit it once its dependencies ended"
        if spec.preemptible and not (config.scavenger_qos or config.scavenger_partition):
            return (f"pool {name} names no scavenger QOS or partition (scavenger_qos: in its "
                    "pools: entry), so --preemptible would run at full price there; leave out "
                    f"--preemptible or --pool {name}")
        if spec.vendor not in (None, "nvidia"):
            return f"pool {name} has NVIDIA GPUs only (Slurm gres gpu); leave out --vendor {spec.vendor}"
        capacity = self.capacity_for(name, user)
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

    def capacity_for(self, name: str, user: str | None) -> Capacity | None:
        """Pool ``name``'s capacity as ``user`` may believe it: with ``user: submitter``, as
        read in their own account (another member's key line may answer sinfo with
        anything), None before it was; else as the pool's account read it."""
        pool, view = self.pools[name], self.views[name]
        if not pool.config.per_submitter:
            return view.capacity
        return view.capacities.get(pool.account_for(user)) if user else None

    def bursts_for(self, spec: JobSpec, user: str | None = None) -> bool:
        """Whether a pool that takes jobs after burst_after could run ``user``'s ``spec``
        (as far as its last capacity tells)."""
        return any(pool.config.burst_after_s is not None and self.views[name].capacity is not None
                   and self.refusal(name, spec, user) is None for name, pool in self.pools.items())

    async def admit(self, user: str, spec: JobSpec) -> None:
        """The checks at submit that ask the pool: with ``user: submitter``, whether the
        user's own account there lets the head's key in."""
        self.check(user, spec)
        pool = self.pools.get(spec.pool or "")
        if pool is None or not pool.config.per_submitter:
            return
        account = pool.account_for(user)
        try:
            await pool.check_login(account)
            self.views[pool.name].refused.pop(account, None)
        except PoolNotAuthorised:
            self.views[pool.name].refuse(account, self.state.clock())
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
    def live(self, name: str, user: str | None = None) -> int:
        """Our jobs in pool ``name`` (``user``'s alone, if given)."""
        return sum(1 for job_id, row in self.rows.items() if row["pool"] == name and (
            user is None or getattr(self.state.jobs.get(job_id), "user", None) == user))

    def _within_caps(self, name: str, jobs: list[Job], room: int) -> tuple[list[Job], list[Job]]:
        """Of ``jobs`` (in the order they would go), those that go now, at most ``room``, none
        past its user's share of the pool's places (``max_jobs_per_user``: one member's jobs
        waiting or held there must not keep every other member out), and those left."""
        cap = self.pools[name].config.user_cap
        held: dict[str, int] = {}
        going: list[Job] = []
        left: list[Job] = []
        for job in jobs:
            if job.user not in held:
                held[job.user] = self.live(name, job.user)
            if len(going) < room and held[job.user] < cap:
                held[job.user] += 1
                going.append(job)
            else:
                left.append(job)
        return going, left

    def _send_waiting(self, name: str) -> None:
        """Send the jobs that asked for pool ``name`` (as the queue orders: priority, then
        fair share), then those waiting past its burst_after in the queue's order, while it
        has room."""
        pool, view = self.pools[name], self.views[name]
        room = pool.config.max_jobs - self.live(name)
        now = self.state.clock()
        weights = {user: share.weight for user, share in self.shares.shares().items()}
        asked = sorted((j for j in self.state.jobs.values() if j.spec.pool == name
                        and j.pool is None and j.state == JobState.PENDING and not j.held_by
                        and pool.account_for(j.user) not in view.unreconciled),
                       key=lambda j: (-j.spec.priority, weights.get(j.user, 1.0), j.id))
        bursting = []
        burst_after = pool.config.burst_after_s
        view.bounced = {job_id: until for job_id, until in view.bounced.items() if until > now}
        if burst_after is not None and view.unreachable_since is None and view.capacity is not None:
            place = self.state.queue_place
            bursting = sorted(
                (j for j in self.state.jobs.values()
                 if j.spec.pool is None and j.pool is None and j.state == JobState.PENDING
                 and not j.held_by and now - j.submitted_at >= burst_after
                 and not self.refusal(name, j.spec, j.user)
                 and not view.refusing(pool.account_for(j.user), now) and j.id not in view.bounced
                 and pool.account_for(j.user) not in view.unreconciled),
                key=lambda j: (place.get(j.id, len(place) + 1), j.id))
        going, waiting = self._within_caps(name, asked, room)
        for job in going:
            self.send(name, job, f"sent to pool {name} (--pool)")
        room -= len(going)
        for job in self._within_caps(name, bursting, room)[0]:
            waited = duration_text(now - job.submitted_at)
            self.send(name, job, f"sent to pool {name} after {waited} waiting here")
        for job in self.state.jobs.values():
            account = pool.account_for(job.user)
            if (account in view.unreconciled and job.spec.pool == name and job.pool is None
                    and job.state == JobState.PENDING and not job.held_by):
                self._set_reason(job, f"waiting for pool {name} to answer as {account}: its jobs "
                                      "there are asked for first (after a restore, never sent twice)")
        cap = pool.config.user_cap
        for job in waiting:
            mine = self.live(name, job.user)
            if mine >= cap:
                self._set_reason(job, f"waiting for room in pool {name}: {job.user} has {mine} "
                                      f"of its places, as many as one user may (max_jobs_per_user "
                                      f"{cap} of max_jobs {pool.config.max_jobs})")
            else:
                self._set_reason(job, f"waiting for room in pool {name} ({self.live(name)} of "
                                      f"ours there, max_jobs {pool.config.max_jobs})")

    def send(self, name: str, job: Job, why: str) -> None:
        """The intent, then the pool is asked (in the background)."""
        pool = self.pools[name]
        account = pool.account_for(job.user)
        token = mint_token(self.state.store.pool_key(), self.state.store.head_token, job)
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
            view.refuse(row["account"], self.state.clock())
            self._refused(pool.name, job_id, f"{err}; run `nebula pool authorize {pool.name}`")
        except PoolRefusal as err:
            self._refused(pool.name, job_id, str(err))
        except PoolUnavailable as err:  # tried again at the next poll
            if pool.config.per_submitter:  # that member's account's trouble alone
                self._account_troubles(pool.name, {row["account"]: err}, keep=True)
            else:
                self._unreachable(pool.name, str(err))
        finally:
            self._submitting.discard(job_id)

    # ------------------------------------------------------------------------ poll
    async def tick(self, name: str) -> None:
        """One poll of pool ``name``: this head's jobs there found first (once), then
        submissions not answered yet, cancels not done yet, what the pool says of every job
        of ours, then the jobs it has room for."""
        pool, view = self.pools[name], self.views[name]
        now = self.state.clock()
        if not view.reconciled or view.unreconciled:
            try:
                await self.reconcile(name)
            except PoolDegraded as err:
                return self._degraded(name, str(err))
            except PoolUnavailable as err:
                return self._unreachable(name, str(err))  # nothing is sent before it answers
        self._asked &= set(self.rows)
        mine = {job_id: row for job_id, row in self.rows.items() if row["pool"] == name}
        for job_id, row in mine.items():
            if not row["remote_id"] and not view.refusing(row["account"], now) \
                    and row["account"] not in view.unreconciled:
                await self.submit(job_id)
        # Keyed by owner and id: an id is what one account answered (a member's key line may
        # answer sbatch with another's id), so it is asked, and believed, in that account alone.
        asked = {(row["account"], row["remote_id"]): row["token"] for row in mine.values()
                 if row["remote_id"] and not view.refusing(row["account"], now)}
        # Capacity is read as the pool's own account, or (user: submitter) as an owner of a
        # live job there: never as an account nobody authorised.
        owners = sorted({account for account, _ in asked})
        poller = owners[0] if pool.config.per_submitter and owners else (
            None if pool.config.per_submitter else pool.config.user)
        if not asked and poller is None:
            view.reason = "not polled: no member's job there yet"
            self._send_waiting(name)
            return
        try:
            result = await pool.poll(asked, poller)
        except PoolNotAuthorised as err:
            if poller is not None:
                view.refuse(poller, now)
            self._unreachable(name, str(err))
            self._send_waiting(name)
            return
        except PoolDegraded as err:
            self._degraded(name, str(err))  # its jobs are left as they are
            return
        except PoolUnavailable as err:
            self._unreachable(name, str(err))
            self._send_waiting(name)  # the intents are written, their sbatch retried
            return
        for account in result.refused:
            view.refuse(account, now)
        logged_in = pool.config.per_submitter and all(
            isinstance(trouble, (PoolDegraded, PoolSilent)) for trouble in result.troubled.values())
        if result.troubled and set(result.troubled) >= set(owners) and not logged_in:
            # Every account asked is in trouble: the pool's (its login node, its Slurm). Not
            # where each (user: submitter) let the head in, then answered what Slurm would
            # not, or nothing in time: a member's own key line may, and she may be the only
            # one with jobs there; the others' jobs are still sent (each in its own account).
            trouble = next(iter(result.troubled.values()))
            if isinstance(trouble, PoolDegraded):
                return self._degraded(name, str(trouble))
            self._unreachable(name, str(trouble))
            self._send_waiting(name)
            return
        self._account_troubles(name, result.troubled)
        if view.unreachable_since is not None or view.degraded_since is not None:
            self.state.record("pool", f"pool {name} answers again; its jobs are reconciled")
        view.unreachable_since, view.degraded_since, view.reason = None, None, ""
        view.capacity = result.capacity or view.capacity
        view.capacities.update(result.capacities)
        view.polled_at = now
        for job_id, row in mine.items():
            job = self.state.jobs.get(job_id)
            if job is None:
                self.rows.pop(job_id, None)
                continue
            key = (row["account"], row["remote_id"])
            if key not in asked or row["account"] in result.troubled:
                continue  # not asked (its owner's login refused), or no answer: left as it is
            if isinstance(job.status, Cancelling) and row["remote_id"]:  # asked while away
                with contextlib.suppress(PoolUnavailable, PoolRefusal):
                    await pool.cancel(row["account"], row["remote_id"])
            report = result.jobs.get(key)
            if report is None:
                await self._not_listed(name, job, row, view)
                continue
            view.missed.pop(job_id, None)
            if not report.token_ok and job_id not in view.warned:
                view.warned.add(job_id)
                self.state.record("pool", f"job {job_id} rewrote its comment in pool {name}; "
                                  f"it is followed by its Slurm id {row['remote_id']}", job_id=job_id)
            await self._apply(name, job, row, report)
        self._send_waiting(name)
        self.stream.publish({"type": "pool", "pool": self.view_json(name)})

    async def reconcile(self, name: str) -> None:
        """Which jobs carrying this head's tokens the pool has, asked in each account this
        head knows: after a restore, those sent since the backup. One the restored queue
        still waits for is adopted (never sent again); any other is ended there. With
        ``user: submitter``, an account that does not answer as Slurm does is asked again
        at the next poll, and nothing of its owner's is sent before: nobody else waits."""
        pool, view = self.pools[name], self.views[name]
        now = self.state.clock()
        prefix = f"{self.state.store.head_token}."
        accounts = {row["account"] for row in self.rows.values() if row["pool"] == name}
        if pool.config.per_submitter:  # the owners of what could have gone there
            bursts = pool.config.burst_after_s is not None
            accounts |= {pool.account_for(job.user) for job in self.state.jobs.values()
                         if job.state == JobState.PENDING and (job.spec.pool == name or bursts)}
        else:
            accounts = {pool.config.user}
        retry = view.reconciled
        if retry:  # the accounts that did not answer the first time, alone
            accounts &= set(view.unreconciled)
            view.unreconciled -= view.unreconciled - accounts
        trouble: PoolUnavailable | None = None
        # each account's own ids: another's row may hold the same id (its key line's answer)
        known = {(row["account"], row["remote_id"]) for row in self.rows.values() if row["remote_id"]}
        # A job sent after the backup was waiting in it: its accounting is searched from the
        # oldest waiting job's submit on (squeue forgets an ended job after MinJobAge).
        since = min((job.submitted_at for job in self.state.jobs.values()
                     if job.state == JobState.PENDING), default=None)
        key, head = self.state.store.pool_key(), self.state.store.head_token
        for account in sorted(accounts):
            # A refused login is asked again once its backoff is over: a job of its owner's
            # sent since the backup may be there, so nothing of theirs is sent before.
            if view.refusing(account, now):
                view.unreconciled.add(account)
                continue
            if view.rechecking(account, now):  # its last answer failed: not asked at every poll
                view.unreconciled.add(account)
                continue
            try:
                found = await pool.ours(account, prefix, since)
            except PoolNotAuthorised:
                view.refuse(account, now)
                view.unreconciled.add(account)
                continue
            except PoolUnavailable as err:
                if not pool.config.per_submitter:
                    raise  # the pool's own trouble: the pool waits
                view.unreconciled.add(account)
                wait = duration_text(view.recheck_later(account, now))
                self._account_troubles(name, {account: f"{err}; asked again in {wait}"}, keep=True)
                trouble = err
                continue
            view.recheck.pop(account, None)
            if account in view.unreconciled:
                view.unreconciled.discard(account)
                view.troubled.pop(account, None)
                self.state.record("pool", f"pool {name} answers as {account} again")
            # Every comment is public: a token is ours only with the mark our key makes,
            # and of the jobs carrying one, only the first sent (a copy comes after it).
            first: dict[str, object] = {}
            for remote in sorted(found, key=lambda r: sent_order(r.slurm_id)):
                if (account, remote.slurm_id) in known:
                    first.setdefault(remote.comment, remote)
                elif issued_job(key, head, remote.comment) is None or remote.comment in first:
                    self._not_ours(name, account, remote)
                else:
                    first[remote.comment] = remote
                    await self._adopt_or_end(name, account, remote)
        if trouble is not None and not retry and accounts <= view.unreconciled:
            view.unreconciled.clear()
            raise trouble  # no account answered: the pool's own trouble, the pool waits
        view.reconciled = True

    async def _adopt_or_end(self, name: str, account: str, remote) -> None:
        pool = self.pools[name]
        job_id = issued_job(self.state.store.pool_key(), self.state.store.head_token, remote.comment)
        job = self.state.jobs.get(job_id) if job_id is not None else None
        row = self.rows.get(job_id) if job_id is not None else None
        live = remote.waiting or remote.running
        if (job is not None and job.state == JobState.PENDING and not job.held_by
                and pool.account_for(job.user) == account
                and (row is None or (row["pool"] == name and not row["remote_id"]
                                     and row["token"] == remote.comment))):
            # Sent after the backup this store came from: it is that job, not a new one.
            with contextlib.suppress(StaleDecision):
                if row is None:
                    self.state.store.send_to_pool(job.id, name, account, remote.comment, "",
                                                  f"found in pool {name} after a restore",
                                                  self.state.clock())
                log_path = f"{await pool.workdir(account)}/job-{job.id}-{remote.comment}.out"
                self.state.store.pool_submitted(job.id, remote.slurm_id, log_path,
                                                self.state.clock())
                self.rows[job.id] = {"job_id": job.id, "pool": name, "account": account,
                                     "token": remote.comment, "remote_id": remote.slurm_id,
                                     "log_path": log_path, "sent_at": self.state.clock()}
                self._put(replace(job, pool=name))
                return
        if live:
            with contextlib.suppress(PoolRefusal):
                await pool.cancel(account, remote.slurm_id)
            self.state.record("pool", f"pool {name}: its job {remote.slurm_id}, sent by this "
                              f"head{f' for job {job_id}' if job_id is not None else ''}, is not "
                              "in the restored queue: it is cancelled there")

    async def _not_listed(self, name: str, job: Job, row: dict, view: PoolView) -> None:
        """Neither the pool's job list nor its accounting has the job's id as its owner's.
        It is looked for by its token among its owner's jobs (reconciled, never ended on a
        missing line); only a cluster without accounting, whose list forgets an ended job
        after MinJobAge, ends it, after MISSED_POLLS polls, saying so."""
        view.missed[job.id] = view.missed.get(job.id, 0) + 1
        if view.missed[job.id] < MISSED_POLLS:
            return
        view.missed.pop(job.id, None)
        pool = self.pools[name]
        with contextlib.suppress(PoolUnavailable):
            found = await pool.find(row["account"], row["token"])
            if found is not None and found.remote_id != row["remote_id"]:
                row["remote_id"] = found.remote_id
                self.state.store.pool_submitted(job.id, found.remote_id, row["log_path"],
                                                self.state.clock())
                return
        if pool.accounting(row["account"]) is False:
            self._fail(job.id, f"pool {name} no longer lists it and keeps no accounting of "
                               "its end; its output may still be read with `nebula logs`")
        elif job.id not in view.warned:
            view.warned.add(job.id)
            self.state.record("pool", f"job {job.id}: pool {name} lists its Slurm id "
                              f"{row['remote_id']} neither in squeue nor in sacct as "
                              f"{row['account']}'s; it is left as it is", job_id=job.id)

    async def _apply(self, name: str, job: Job, row: dict, report: RemoteJob) -> None:
        """The job's state here follows what the pool reports."""
        job = self._scavenger_or_full_price(name, job, report)
        if report.end is None:
            await self._grown(name, job, row, report)
        if report.end is not None:
            if job.state == JobState.PENDING and report.started_at:
                job = self._mark_running(name, job, report)  # it ran between two polls
            state, reason = report.end
            if isinstance(job.status, Cancelling):
                state, reason = JobState.CANCELLED, f"cancelled by {job.status.by}"
            elif job.id in self.views[name].grown and state == JobState.CANCELLED:
                reason = self.views[name].grown[job.id]
            self.views[name].grown.pop(job.id, None)
            if report.preempted and not job.spec.no_requeue:
                self._preempted(name, job)
                return
            self.rows.pop(job.id, None)
            asked = job.spec.gpu_count * job.spec.nodes
            self._earlier_runs(name, job, row, report, asked)
            # Charged what Slurm's accounting (AllocTRES) says it held, not what it asked
            # nor anything the job wrote; a shard job's gres is not whole GPUs: its placements.
            gpus = report.gpus if report.gpus is not None and not job.spec.gpu_mem_mb else None
            if gpus is not None and gpus != asked:
                self.state.record("pool", f"job {job.id}: pool {name}'s accounting says "
                                  f"{gpus} GPUs, it asked for {asked}; charged for {gpus}",
                                  job_id=job.id)
            now = self.state.clock()
            at = report.ended_at if report.ended_at and job.started_at and \
                report.ended_at >= job.started_at else None
            if at is not None and report.elapsed_s is not None and job.started_at:
                at = job.started_at + report.elapsed_s  # the accounting's own elapsed time
            if at is not None:
                at = min(at, now)  # never past now, whatever the cluster says
            self.transitions.finish(job, state, report.exit_code, printable(reason)[:500], at=at,
                                    gpus=gpus)
            return
        if report.running and job.state == JobState.PENDING:
            self._mark_running(name, job, report)
        elif report.waiting and job.state.holds_gpus:
            self.transitions.requeue(job, f"requeued in pool {name}"
                                          + (f": {printable(report.reason)}" if report.reason else ""))
        elif report.waiting and job.state == JobState.PENDING:
            why = printable(report.reason or "waiting")[:200]
            self._set_reason(job, f"pending in pool {name}: {why}")
