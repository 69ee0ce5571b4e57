"""A job's life on the head: launch, running, exit, finish, requeue, cancel, stop, eviction, acks.

A job's ``status`` carries exactly the data of its state (``model.Pending``, ``Launching``,
``Running``, ``Cancelling``, ``Evicting``, ``Stopping``, ``Ended``); every change here is one
transition: one store transaction, then the new status in the live job table, then its
events out. A launch writes the intent (allocation + ``launching``) before any node is
asked; a gang is running once every node confirmed and ends when every node's part
ended. An exit is acked to its node only once its job's end is committed (a gang's parts
once the whole gang's is), in batches; one the store could not take (a full disk) is kept
and tried again, so no exit is ever lost while the node holds it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ..model import (Cancelling, Ended, Evicting, Job, JobState, Launching, Pending, Placement,
                     RequestError, Running, Stopping, held, holding, launching, spec_fields, stopping,
                     with_holding)
from ..remote import launcher
from ..remote.protocol import Exit, Phase, Started, job_number
from ..remote.ssh import NodeUnavailable
from ..store import StaleDecision, StoreUnavailable, spec_of
from .access import Access
from .launches import Launches
from .shares import Shares
from .state import HeadState, JobTable, job_nodes
from .stream import Stream

log = logging.getLogger(__name__)

ACK_BATCH_S = 0.1
CANCEL_GRACE_S = 10.0


def launch_record(job: Job) -> dict:
    """What a launch leaves on its node besides the run script: enough for a store restored
    from an older backup to take the job in again (``JobTransitions.adopt``)."""
    return {"user": job.user, "spec": spec_fields(job.spec), "submitted_at": job.submitted_at,
            "attempt": job.attempt,
            "placements": [[p.gpu_uuid, p.node, p.gpu_index, p.memory_mb, p.exclusive]
                           for p in job.placements]}


def job_from_record(job_id: int, record: dict, token: str, started_at: float) -> Job:
    """The running job a launch record describes; ValueError/KeyError/TypeError when it is
    not one (a node is not trusted to be well-formed)."""
    placements = tuple(Placement(str(u), str(n), int(i), int(m), bool(e))
                       for u, n, i, m, e in record["placements"])
    return Job(job_id, str(record["user"]), spec_of(record["spec"]), float(record["submitted_at"]),
               status=Running(placements, started_at, token=token), attempt=int(record["attempt"]))


class JobTransitions:
    def __init__(self, state: HeadState, stream: Stream, shares: Shares, access: Access):
        self.state = state
        self.stream = stream
        self.shares = shares
        self.access = access
        #: told of each job that starts running (the metrics' queue waits)
        self.on_running: Callable[[Job], None] = lambda job: None
        #: told of each job that ended, and of each requeue with its reason (notifications)
        self.on_ended: Callable[[Job], None] = lambda job: None
        self.on_requeued: Callable[[Job, str], None] = lambda job, reason: None
        self._acks: dict[str, list[list[object]]] = {}  # node -> [job, token(, end)] each
        #: why a part could not start, as its node said (the first one): the job's reason
        #: when it ends failed; nodes say it again after a restart (their exits are unacked)
        self._exit_reasons: dict[int, str] = {}
        #: exits the store could not take yet, per (node, job): tried again (retry_exits)
        self._unrecorded: dict[tuple[str, str], Exit] = {}
        self._finished_waiters: dict[int, list[asyncio.Future]] = defaultdict(list)
        #: each part's launch plan: its run script and the environment `nebula job` shows
        self.launches = Launches(state)

    def load(self) -> None:
        """The unfinished jobs of the store become the live table (the head starts)."""
        active = (JobState.PENDING, JobState.LAUNCHING, JobState.RUNNING)
        self.state.jobs = JobTable(self.state.store.jobs(states=active))

    def make_scavenger(self, job: Job) -> Job:
        """Its user is past their quota (quota_mode scavenge): it runs as preemptible work."""
        job = replace(job, spec=replace(job.spec, preemptible=True))
        self.state.store.make_scavenger(job, self.state.settings.config.preemptible_charge, self.state.clock())
        return self._set(job)

    def charge_in_full(self, job: Job, why: str) -> Job:
        """A preemptible job runs as a normal one after all (its pool's scavenger QOS or
        partition left behind): charged as one, and shown as one."""
        job = replace(job, spec=replace(job.spec, preemptible=False))
        self.state.store.charge_in_full(job, self.state.clock(), why)
        return self._set(job)

    def _set(self, job: Job) -> Job:
        """The job's new status in the live table, and out to subscribers."""
        self.state.jobs[job.id] = job
        self.stream.publish_job(job)
        return job

    # ---------------------------------------------------------------- node reports
    def on_started(self, node: str, message: Started) -> None:
        """Its checks passed: running, in the workdir the node chose (given, where it was
        submitted, or the home), which ``nebula job`` shows."""
        job = self._job_from_node(node, message)
        if job is None:
            return
        workdir = message.workdir
        if workdir is not None and workdir != job.workdir_used:
            self.state.store.set_workdir_used(job.id, workdir)
            job = replace(job, workdir_used=workdir)
            self.state.jobs[job.id] = job
            if job.state != JobState.LAUNCHING:
                self.stream.publish_job(job)
        if job.state == JobState.LAUNCHING:
            self.mark_running(job)

    def on_phase(self, node: str, message: Phase) -> None:
        """What a running job does before its command (an image pull), shown as its reason
        until done; not stored (a restarted head hears the next change)."""
        job = self._job_from_node(node, message)
        text = message.text
        running = holding(job.status) if job is not None else None
        if job is not None and isinstance(running, Running) and text is not None and text[:200] != running.doing:
            self._set(replace(job, status=with_holding(job.status, replace(running, doing=text[:200]))))

    def on_exit(self, node: str, message: Exit) -> None:
        """A node reports an attempt's end. Acked once recorded; kept for a retry when the
        store cannot take it now."""
        key = (node, str(message.job))
        try:
            self._record_exit(node, message)
            self._unrecorded.pop(key, None)
        except StoreUnavailable as err:
            if key not in self._unrecorded:
                log.warning("exit of job %s on %s not recorded yet: %s", key[1], node, err)
            self._unrecorded[key] = message

    def retry_exits(self) -> None:
        """Exits the store could not take before: try them again (a loop phase)."""
        for (node, _), message in list(self._unrecorded.items()):
            self.on_exit(node, message)

    def _record_exit(self, node: str, message: Exit) -> None:
        token = message.token
        job = self._job_from_node(node, message)
        if job is None:
            if token is not None and self.state.ours(token) and message.job is not None:
                # Ours but already finished (the head crashed before its ack): ack it now.
                self._ack_soon(node, message.job, token)
            return
        code = message.code
        assert token is not None  # the job's own launch token (_job_from_node)
        if isinstance(job.status, Evicting):
            self._evicted_exit(job, job.status, code)
            self._ack_soon(node, job.id, token)  # the eviction's requeue is its own record
            return
        if message.reason:  # its part could not start: the node said why
            self._exit_reasons.setdefault(job.id, message.reason[:500])
        ran = held(job.status).with_exit(node, code)
        exits = dict(ran.exits)
        if set(exits) < set(job_nodes(job)):
            self._set(replace(job, status=with_holding(job.status, ran)))
            return  # a gang ends when every node's part has ended (each part acked then)
        codes = [exits[n] for n in job_nodes(job)]
        code = next((c for c in codes if c != 0), 0)
        if isinstance(job.status, Cancelling):
            state, reason = JobState.CANCELLED, f"cancelled by {job.status.by}"
        elif isinstance(job.status, Stopping):
            if job.status.requeue:
                self.requeue(job, job.status.why)
                return
            state, reason = job.status.ends, job.status.why
        elif code == 0:
            state, reason = JobState.SUCCEEDED, ""
        elif code is None:
            state, reason = JobState.FAILED, "its tmux session ended without an exit code (killed?)"
        else:
            state, reason = JobState.FAILED, self._exit_reasons.get(job.id, "")
        at = self.ended_at(node, job, message)
        self.finish(job, state, code, reason, at=at)  # raises StoreUnavailable: nothing acked
        # The end goes with its ack: a head restored from an older backup settles the job
        # from the node's record of it (nodes.py), whatever became of its exit code.
        end = {"state": state.value, "reason": reason[:500], "at": self.state.clock() if at is None else at}
        for part in exits:  # a gang's parts share its token
            self._ack_soon(part, job.id, token, end)

    def ended_at(self, node: str, job: Job, message: Exit) -> float | None:
        """When the end ``node`` reports happened, if it came from a time no head heard the
        node (a head restarted, a link back): the node's time of it, no earlier than the
        head last knew the job ran (its user owns the file that time is read from), nor
        later than the hello. None: it was heard at once, and ends now."""
        view = self.state.nodes.get(node)
        if message.at is None or view is None or view.unheard is None:
            return None
        known, hello = view.unheard
        at = message.at + view.clock_offset
        if at >= hello:
            return None
        return min(max(at, known, job.started_at or 0.0), hello)

    def _job_from_node(self, node: str, message: Started | Phase | Exit) -> Job | None:
        job = self.state.jobs.get(message.job) if message.job is not None else None
        if job is None or message.token != self.state.token(job):
            return None  # another head's job directory, or an earlier attempt of this job
        return job if node in job_nodes(job) and job.state.holds_gpus else None

    def _ack_soon(self, node: str, job_id: int, token: str, end: dict | None = None) -> None:
        """Tell the node its job's exit is recorded (``end``: as what, which it keeps); acks of
        one moment go as one request, each naming the launch (token), so a late ack never
        silences a relaunch."""
        batch = self._acks.setdefault(node, [])
        batch.append([job_id, token] if end is None else [job_id, token, end])
        if len(batch) == 1:
            self.state.spawn(self._send_acks(node), f"ack-{node}")

    async def _send_acks(self, node: str) -> None:
        await asyncio.sleep(ACK_BATCH_S)
        jobs = self._acks.pop(node, [])
        # Unacked exits are reported again when the node reconnects, and ignored then.
        with contextlib.suppress(NodeUnavailable, asyncio.TimeoutError):
            await self.state.links[node].request("ack", jobs=jobs)

    def adopt(self, node: str, job: Job, exit_code: int | None, alive: bool) -> None:
        """A launch the store did not know (restored from an older backup) ran on ``node``:
        the job is taken in as it is there, running, or ended with what its end left."""
        self.state.store.adopt_launch(job, node, self.state.clock())
        job = self._set(job)
        if alive:
            return
        if exit_code is not None:
            state = JobState.SUCCEEDED if exit_code == 0 else JobState.FAILED
            self.finish(job, state, exit_code, "")
        else:
            self.finish(job, JobState.FAILED, None,
                        "its tmux session ended without an exit code (killed?)")

    def adopt_unknown(self, node: str, attempts: dict, sessions: dict) -> None:
        """After a restore: launches on this node the store does not know, of jobs it has
        only as waiting (or not at all: their ids were lost with the backup), are taken in
        as they are, running or ended, so none of them runs a second time. The ended ones
        first: a card a launch holds now may have been another's that ended before it, and
        taken in after it, that other would hold the card beside it for the store."""
        found_here = []
        state = self.state
        for name, found in attempts.items():
            latest_first = sorted(((int(a), info) for a, info in (found or {}).items() if a.isdigit()),
                                  key=lambda pair: -pair[0])
            for attempt, info in latest_first:
                token: Any = info.get("token") if isinstance(info, dict) else None  # a node's word
                record = info.get("record") if token else None
                if not isinstance(record, dict) or state.ours(token):
                    continue
                job_id = job_number(int(name) if name.isdigit() else 0)
                known = state.jobs.get(job_id) or state.store.job(job_id)
                # Requeued after the backup and launched again: the node's attempt is newer
                # than all the store knows, launching, running or ended by its older attempt
                # (whichever node tells first), so it stands.
                later = known is not None and attempt > known.attempt
                if not job_id or (known is not None and known.state != JobState.PENDING
                                  and not later):
                    continue  # what the store knows of it later than that stands
                alive = sessions.get(str(job_id)) == token
                try:
                    job = job_from_record(job_id, record, token,
                                          info.get("started_at") or state.clock())
                except (KeyError, TypeError, ValueError) as err:
                    log.warning("%s: the record of job %s is not understood: %s", node, job_id, err)
                    continue
                found_here.append((alive, job, info.get("exit_code")))
                break  # its latest launch here is what it is now
        for alive, job, exit_code in sorted(found_here, key=lambda found: found[0]):
            log.warning("%s ran job %s after the store's backup: taken in again", node, job.id)
            self.adopt(node, job, exit_code, alive)

    # ---------------------------------------------------------------------- launch
    def begin_launch(self, job: Job, placements: tuple[Placement, ...]) -> None:
        """The scheduler's Start: write the intent, then ask the nodes."""
        try:
            token = self.state.store.start_launching(job.id, placements, self.state.clock())
        except StaleDecision:
            return  # the job changed since the snapshot (cancelled): nothing to launch
        job = self._set(replace(job, status=Launching(placements, token=token)))
        self.shares.changed(job.user)  # one more job running
        for node in job_nodes(job):
            self.stream.publish_gpus(node)
        self.state.spawn(self.launch(job), f"launch-{job.id}")

    async def launch(self, job: Job, only: str | None = None) -> None:
        """Start the job's tmux session on each of its nodes (or only on ``only``).

        The job is running once every node has confirmed; a node that is away keeps the
        intent in the store, and reconcile launches its part when it is back.
        """
        nodes = job_nodes(job)
        replies = await asyncio.gather(*(self._launch_on(job, node) for node in nodes
                                         if only is None or node == only), return_exceptions=True)
        current = self.state.jobs.get(job.id)
        if current is None or current.state != JobState.LAUNCHING:
            return
        failed = [r for r in replies if isinstance(r, dict) and not r.get("ok")]
        if failed:
            self.finish(current, JobState.FAILED, None,
                        f"launch failed on {failed[0].get('node')}: {failed[0].get('error')}")
            return
        launch = launching(current.status)
        confirmed = launch.confirmed | {r["node"] for r in replies if isinstance(r, dict)}
        if confirmed >= set(nodes):
            self.mark_running(current)
        elif confirmed != launch.confirmed:
            self.confirm(current, confirmed)

    def environments(self, job: Job) -> dict[str, dict[str, str]]:
        """Each of the job's nodes -> the environment its launch plan gives the command."""
        return self.launches.environments(job)

    async def _launch_on(self, job: Job, node: str) -> dict | None:
        plan = self.launches.plan(job, node)
        try:
            reply = await self.state.links[node].request(
                "launch", job=job.id, token=self.state.token(job), script=launcher.script(plan),
                user=job.user if plan.run_as else None, record=launch_record(job))
        except (NodeUnavailable, asyncio.TimeoutError) as err:
            log.warning("launch of job %s on %s deferred: %s", job.id, node, err)
            return None
        return {**reply, "node": node}

    def mark_running(self, job: Job, at: float | None = None) -> None:
        """Launching → running (a cancel or an eviction under way stays so), from ``at`` if
        it started before now (its node's word, after a restore), else now."""
        now = self.state.clock()
        started = now if at is None else min(at, now)
        self.state.store.mark_running(job.id, started)
        launch = held(job.status)
        running = Running(launch.placements, started, launch.exits, token=launch.token)
        self.on_running(self._set(replace(job, status=with_holding(job.status, running))))

    def confirm(self, job: Job, confirmed: frozenset[str]) -> None:
        """A gang's launch confirmed on ``confirmed``, not yet on every node of it."""
        launch = replace(launching(job.status), confirmed=confirmed)
        self._set(replace(job, status=with_holding(job.status, launch)))

    # --------------------------------------------------------------------- the end
    def finish(self, job: Job, state: JobState, code: int | None, reason: str,
               at: float | None = None, gpus: int | None = None) -> None:
        """End a job (succeeded, failed, cancelled, timeout): GPUs released, user charged.
        ``at``: when it ended, if not now (a pool's job, as the pool reports its end);
        ``gpus``: the cards it held as the pool's accounting says, if not its placements."""
        now = self.state.clock() if at is None else at
        charged = self.state.store.finish_job(job.id, state, self.state.clock(), exit_code=code,
                                              reason=reason, ended_at=at, gpus=gpus,
                                              reference_mb=self.state.settings.charge_reference_mb)
        self.state.jobs.pop(job.id, None)
        self._exit_reasons.pop(job.id, None)
        # its hours now count towards its user's weight
        self.shares.ended(job.id, job.user, charged, job.spec.preemptible)
        self.shares.changed(job.user)
        done = replace(job, status=Ended(state, now, code, reason, job.started_at, job.node,
                                         job.placements))
        self.stream.publish_job(done)
        for node in self._lab_nodes(job):
            self.stream.publish_gpus(node)
        for waiter in self._finished_waiters.pop(job.id, []):
            if not waiter.done():
                waiter.set_result(done)
        self.on_ended(done)
        self.state.wake()

    def _lab_nodes(self, job: Job) -> list[str]:
        """The job's nodes that are the lab's (a pool's job has its pool's)."""
        return [node for node in job_nodes(job) if node in self.state.nodes]

    def requeue(self, job: Job, reason: str) -> None:
        """Put a job that held GPUs back in the queue (its allocation released), as a new
        attempt: one transition, whatever it was doing."""
        charged = self.state.store.requeue(job.id, reason, self.state.clock(),
                                           self.state.settings.charge_reference_mb)
        self.shares.charged(job.user, charged, job.spec.preemptible)
        self._exit_reasons.pop(job.id, None)
        self.on_requeued(job, reason)
        self._set(replace(job, status=Pending(reason), attempt=job.attempt + 1))
        self.shares.changed(job.user)  # charged for what it held
        for node in self._lab_nodes(job):
            self.stream.publish_gpus(node)
        self.state.wake()

    async def wait_finished(self, job: Job) -> Job:
        """The job once it ended (at once when it has)."""
        if job.state.finished:
            return job
        future = asyncio.get_running_loop().create_future()
        waiters = self._finished_waiters[job.id]
        waiters.append(future)
        try:
            return await future
        finally:  # a wait given up (a client's bounded wait asks again) leaves no future
            if future in waiters:  # (the list goes when the job ends)
                waiters.remove(future)

    # ---------------------------------------------------------------------- cancel
    def cancel(self, user: str, job: Job) -> None:
        """A pending job ends at once; one holding GPUs is stopped on its nodes (the
        request is kept in the store until they confirm). A cancel outranks an eviction."""
        self.access.check_may_manage(user, job, "cancel")
        if job.state.finished:
            raise RequestError(f"job {job.id} has already ended: it {job.state.phrase}")
        if job.state == JobState.PENDING:
            if user != job.user:
                self.state.record("admin", f"{user} cancelled job {job.id} of {job.user}",
                                  job_id=job.id, user=user)
            self.finish(job, JobState.CANCELLED, None, f"cancelled by {user}")
            return
        now = self.state.clock()
        self.state.store.request_cancel(job.id, user, now, audit=user != job.user)
        self._set(replace(job, status=Cancelling(held(job.status), user, now)))
        self.state.spawn(self.cancel_on_node(job), f"cancel-{job.id}")

    async def cancel_on_node(self, job: Job, only: str | None = None) -> None:
        for node in job_nodes(job):
            if only is not None and node != only:
                continue
            try:
                await self.state.links[node].request("cancel", timeout=CANCEL_GRACE_S + 30,
                                                     job=job.id, grace=CANCEL_GRACE_S)
            except (NodeUnavailable, asyncio.TimeoutError) as err:
                log.warning("cancel of job %s on %s waits for the node: %s", job.id, node, err)

    def mark_idle(self, job: Job, since: float | None, unknown: bool = False) -> Job:
        """A running job whose GPUs read idle since ``since`` (None: in use again, or
        ``unknown``: its cards read no utilisation to tell)."""
        if not isinstance(job.status, Running) or (job.status.idle_since, job.status.idle_unknown) == (since, unknown):
            return job
        return self._set(replace(job, status=replace(job.status, idle_since=since, idle_unknown=unknown)))

    # ---------------------------------------------------------------------- stop
    def begin_stop(self, job: Job, ends: JobState, why: str, requeue: bool, kill_at: float,
                   preemption: bool = False) -> Job | None:
        """A launched or running job the head stops for its own reason (head/stops.py says when;
        a ``preemption`` is counted), stored before any signal goes: a restarted head ends it at
        ``kill_at``. None: it holds no GPUs, is already stopping, or the store cannot take it."""
        if not isinstance(job.status, (Launching, Running)):
            return None
        try:
            self.state.store.record_stop(job.id, ends, why, requeue, kill_at,
                                         self.state.clock() if preemption else None)
        except StoreUnavailable as err:
            log.warning("job %s not stopped yet (%s): the store cannot take it: %s", job.id, why, err)
            return None
        stopping = Stopping(job.status, ends, why, requeue, kill_at)
        return self._set(replace(job, status=stopping, preemptions=job.preemptions + preemption))

    def regrace_stop(self, job: Job, kill_at: float) -> Job:
        """Its SIGUSR1 went only now (the head that began the stop died first): SIGKILL
        moves to ``kill_at``, a whole grace later, in the store too if it can take it."""
        with contextlib.suppress(StoreUnavailable):  # else: the earlier kill_at after a restart
            self.state.store.move_kill_at(job.id, kill_at)
        return self._set(replace(job, status=replace(stopping(job.status), kill_at=kill_at)))

    def undo_stop(self, job: Job) -> None:
        """No node heard the stop (away): the job runs on as it was, asked again later."""
        with contextlib.suppress(StoreUnavailable):  # else: killed at its kill_at after a restart
            self.state.store.clear_stop(job.id)
        self._set(replace(job, status=stopping(job.status).holding))

    def end_stop(self, job: Job) -> bool:
        """A stopping job's sessions are killed (a killed session reports no exit): it
        ends as its stop said, or goes back in the queue. False while the store cannot
        take it."""
        status = stopping(job.status)
        try:
            if status.requeue:
                self.requeue(job, status.why)
            else:
                self.finish(job, status.ends, None, status.why)
        except StoreUnavailable as err:
            log.warning("job %s killed but its end not recorded yet: %s", job.id, err)
            return False
        return True

    # ------------------------------------------------------------------- eviction
    async def signal(self, node: str, job_id: int, name: str, once: bool = False) -> dict:
        """Send SIG``name`` to the job's session on ``node``; the node's reply, or why not.
        ``once``: a USR1 goes only if this attempt never got one (the reply's ``first``)."""
        fields = {"once": True} if once else {}
        try:
            return await self.state.links[node].request("signal", job=job_id, signal=name, **fields)
        except (NodeUnavailable, asyncio.TimeoutError) as err:
            # A node that is away stops the stale session when it reconnects (reconcile).
            log.warning("SIG%s to job %s on %s not sent: %s", name, job_id, node, err)
            return {"ok": False, "error": str(err)}

    def note(self, job: Job, message: str) -> None:
        """One line of the head's, "nebula: ``message``", in the job's own log on each of its
        nodes (a node away misses it; the events log has the line)."""
        for node in job_nodes(job):
            self.state.spawn(self._note(node, job.id, message), f"note-{job.id}-{node}")

    async def _note(self, node: str, job_id: int, message: str) -> None:
        with contextlib.suppress(NodeUnavailable, asyncio.TimeoutError):
            await self.state.links[node].request("note", job=job_id, text=f"nebula: {message}")

    def evict(self, job: Job, why: str) -> bool:
        """Its GPU is being isolated: it ends requeued (or failed) instead of ended, by
        its own exit or by ``put_back``. False (nothing done) for a job already cancelling
        or evicting, or no longer holding GPUs."""
        if not isinstance(job.status, (Launching, Running)):
            return False
        self._set(replace(job, status=Evicting(job.status, why)))
        return True

    def _evicted_exit(self, job: Job, evicting: Evicting, code: int | None) -> None:
        if evicting.stopping:
            return  # another node's part of the same gang, being killed
        detail = f"exit code {code}" if code is not None else "no exit code"
        self.state.record("health", f"job {job.id} ended after SIGUSR1 ({detail})", job_id=job.id)
        # A gang's other parts are stopped before it is requeued.
        self.state.spawn(self.put_back(job.id, kill=len(job_nodes(job)) > 1), f"put-back-{job.id}")

    async def put_back(self, job_id: int, kill: bool) -> None:
        """Requeue (or fail, --no-requeue) an evicted job. With ``kill`` its sessions are
        killed first and awaited, so a quick relaunch of the job on the same node cannot
        be killed instead. A job cancelled meanwhile ends cancelled."""
        job = self.state.jobs.get(job_id)
        if job is None or not isinstance(job.status, Evicting) or job.status.stopping:
            return
        attempt = job.attempt
        if kill:
            job = self._set(replace(job, status=replace(job.status, stopping=True)))
            await asyncio.gather(*(self.signal(n, job_id, "KILL") for n in job_nodes(job)))
        job = self.state.jobs.get(job_id)
        if job is None or job.attempt != attempt or not job.state.holds_gpus:
            return  # ended (or requeued) meanwhile
        if isinstance(job.status, Cancelling):
            self.finish(job, JobState.CANCELLED, None, f"cancelled by {job.status.by}")
        elif not isinstance(job.status, Evicting):
            return
        elif job.spec.no_requeue:
            self.finish(job, JobState.FAILED, None, f"{job.status.why}; not requeued (--no-requeue)")
        else:
            self.requeue(job, f"requeued: {job.status.why}")
