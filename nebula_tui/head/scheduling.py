"""The scheduling loop: when to run a pass, what it sees, and what its decisions do.

One turn of the loop (``run``), each phase one function:

  1. ``HeadState.wait_for_wake``: until a change asks for a pass (a submit, an exit, a
     probe that freed memory …) or ``PERIODIC_PASS_S`` went by.
  2. ``JobTransitions.retry_exits``: exits the store could not take (a full disk) are
     recorded now if it can; ``expire_leases``: the jobs of a node silent for longer than
     its lease (on the monotonic clock) are requeued; ``Limits.check``: jobs past their
     time limit are stopped, the memory guard's and idleness's actions run;
     ``Bookings.check``: a booking that can no longer be honoured is said at once. The
     wait of phase 1 ends by the next time limit.
  3. ``HeadState.holding_for_restore``: after a restore of the store, no pass until every
     node told what ran since the backup; ``pass_is_pointless``: only submits since the
     last pass and no GPU free: no pass.
  4. ``schedule_pass``: the pure scheduler decides over ``snapshot_for`` the waiting jobs;
     a ``Start`` is launched (``JobTransitions.begin_launch``), a ``Fail`` ends the job,
     a ``Wait`` keeps its (new) reason, a ``Preempt`` stops a running preemptible job
     (``Limits.preempt``) for the normal job that waits for its cards.
  5. ``housekeeping``: once an hour, the events log's retention (``Store.trim_events``).
  6. ``pause_after``: as long as the pass took (at most ``MAX_PASS_PAUSE_S``), so events
     of a busy head arrive in batches instead of each paying for a pass of its own.
  7. ``forecast_if_due``: when the queue's order changed (at most every
     ``FORECAST_GAP_S``) or ``FORECAST_EVERY_S`` went by, each waiting job's start is
     forecast (``forecast.py``) in a thread, on the snapshot a pass would see: the loop
     goes on meanwhile.

``plan`` runs the same pass for a job not yet submitted (the submit form's preview), and
the forecast for it when it would wait.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from .. import scheduler
from . import forecast
from ..model import GpuView, Job, JobSpec, JobState
from ..wire import PlanView
from .bookings import Bookings
from .jobs import JobTransitions
from .limits import Limits
from .shares import Shares
from .state import HeadState, JobTable, job_nodes
from .stream import Stream

log = logging.getLogger(__name__)

PERIODIC_PASS_S = 3.0
MAX_PASS_PAUSE_S = 0.2
#: A new order of the queue goes to subscribers at most this often (seconds): it is every
#: waiting job's id, and a busy head has a new one after nearly every pass.
QUEUE_ORDER_EVERY_S = 0.5
#: how many recent runs of one user's like jobs without --time their estimate looks at
HISTORY_RUNS = 20
#: … and of how many recent jobs with --time the forecast reads the share of it they used
SHARE_RUNS = 500
#: a head that starts learns run lengths from this many of the store's latest ended jobs
LEARNED_AT_START = 2000
HOUSEKEEPING_EVERY_S = 3600.0
#: A pass over this many waiting jobs or more decides in a thread (``pass_now``): ~10 ms
#: of scheduling on these machines, past which a submit would notice waiting behind it.
THREADED_FROM = 500
SWITCH_INTERVAL_S = 0.001
#: a start forecast is made at least this often (seconds) …
FORECAST_EVERY_S = 180.0
#: … and when the queue changed, but not sooner than this after the last one
FORECAST_GAP_S = 10.0


def pending_job(job: Job) -> scheduler.PendingJob:
    """A waiting job as the scheduler sees it."""
    s = job.spec
    return scheduler.PendingJob(
        job.id, job.user, s.gpu_count, s.gpu_mem_mb, job.submitted_at, arch=s.arch, cuda=s.cuda,
        vendor=s.vendor, max_nodes=s.nodes, priority=s.priority, after=tuple(s.after),
        after_type=s.after_type, time_limit_s=s.time_limit_s, service=s.service,
        array_id=s.array_id, array_limit=s.array_limit, preemptible=s.preemptible,
        reservation=s.reservation, nodelist=s.nodelist, exclude=s.exclude)


@dataclass(frozen=True)
class Seen:
    """What a pass decided from, for decisions applied after the loop went on: every job
    object then (by id), and every card's view."""

    jobs: dict[int, Job]
    gpus: dict[str, GpuView]


class Scheduling:
    def __init__(self, state: HeadState, stream: Stream, shares: Shares, jobs: JobTransitions,
                 limits: Limits, bookings: Bookings):
        self.state = state
        self.stream = stream
        self.shares = shares
        self.transitions = jobs
        self.limits = limits
        self.bookings = bookings
        #: the scheduler's view of each waiting job, kept while its spec is the same object
        self.pending_views: dict[int, tuple[JobSpec, scheduler.PendingJob]] = {}
        #: each running job's scheduler view, kept while the job and its estimate stay (``_running``)
        self.running_views: dict[int, tuple] = {}
        #: ``_jobs_lists``' answer and the job table (and its version) it was made from
        self._jobs_kept: tuple[JobTable, int, list[Job], list[Job]] | None = None
        self._task: asyncio.Task | None = None
        self._order_due = False  # a "queue" event is on its way
        self._housekept_at: float | None = None
        #: from how many waiting jobs a pass decides off the loop (``pass_now``)
        self.threaded_from = THREADED_FROM
        self._deciding = threading.Lock()
        #: told how long each pass took, in seconds (the metrics)
        self.on_pass: Callable[[float], None] = lambda seconds: None
        #: the last forecast: when (monotonic) and for which order of the queue
        self._forecast_at: float | None = None
        self._forecast_order: list[int] | None = None
        self._forecasting = False
        #: each waiting job's first forecast start (the one kept in the store), until it starts
        self.first_forecasts: dict[int, float | None] = {}
        #: each waiting job's first simulated start (``forecast.Start.simulated``) and when
        #: it was made: at its start, what the calibration learns from
        self.first_simulated: dict[int, tuple[float, float]] = {}
        #: the ratio of actual to simulated waits, learned from the jobs that started
        self.calibration = forecast.Calibration()
        #: (user, GPUs, memory asked) -> how long their recent jobs without --time ran,
        #: since this head started: what a running one is estimated to run (estimates.py)
        self.history: dict[tuple, deque[float]] = {}
        #: the share of its --time each recent job with one used (the forecast's estimate)
        self.time_shares: deque[float] = deque(maxlen=SHARE_RUNS)
        #: waiting job -> the cards a pass preempted for it (its ``Wait.holds``), theirs
        #: until it starts or waits for no preemption (``scheduler/preemption.py``)
        self.holds: dict[int, tuple] = {}
        #: the replay's (``Replay._only_waits``): the requests of the jobs the last pass kept
        #: waiting (key -> one such job; None: not kept), and whether one of them names a
        #: dependency or a booking
        self.keep_waiting = False
        self.waiting_requests: dict[str, scheduler.PendingJob] | None = None
        self.waiting_named = False

    def start(self) -> None:
        # A pass deciding in its thread hands the interpreter to the loop after at most
        # this long (Python's default: 5 ms); each submit needs it several times (its
        # request, its sync's thread, its reply): at 500 nodes with passes back to back,
        # submit p90 177 -> 50 ms at load 10.
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        self._task = asyncio.get_running_loop().create_task(self.run(), name="scheduler")

    def stop(self) -> None:
        if self._task:
            self._task.cancel()

    async def run(self) -> None:
        while True:
            due = self.limits.next_due()
            await self.state.wait_for_wake(PERIODIC_PASS_S if due is None else min(PERIODIC_PASS_S, due + 0.05))
            started = time.perf_counter()
            try:
                self.transitions.retry_exits()
                self.expire_leases()
                self.limits.check()
                self.bookings.check()
                if not self.state.holding_for_restore() and not self.pass_is_pointless():
                    self.state.capacity_changed = False
                    await self.pass_now()
                    self.on_pass(time.perf_counter() - started)
                self.housekeeping()
                self.forecast_if_due()
            except Exception:
                log.exception("scheduling pass failed")
            await self.pause_after(started)

    def housekeeping(self) -> None:
        self.state.store.mark_alive(self.state.clock())  # (at most every ALIVE_EVERY_S)
        now = self.state.monotonic()
        if self._housekept_at is not None and now - self._housekept_at < HOUSEKEEPING_EVERY_S:
            return
        self._housekept_at = now
        gone = self.state.store.trim_events(self.state.clock())
        if gone:
            log.info("events log: %d rows past their retention removed", gone)

    def forecast_if_due(self) -> None:
        """Start a forecast in a thread when one is due and none is under way."""
        now = self.state.monotonic()
        last = self._forecast_at
        changed = self._forecast_order != self.state.queue_order
        if self._forecasting or (last is not None and now - last < (FORECAST_GAP_S if changed
                                                                     else FORECAST_EVERY_S)):
            return
        self._forecast_at, self._forecast_order = now, list(self.state.queue_order)
        pending = self.waiting()
        if not pending:
            self.state.forecasts = {}
            return
        self._forecasting = True
        self.state.spawn(self._forecast(self.snapshot_for(pending)), "forecast")

    async def _forecast(self, snap: scheduler.Snapshot) -> None:
        try:
            starts = await asyncio.to_thread(forecast.forecast, snap, self.limits.settings.max_time_s,
                                             history=self.histories(), calibration=self.calibration.copy())
            self.state.forecasts = {job: start.json(snap.now) for job, start in starts.items()}
            self.stream.publish_queue_order(starts=True)
            self._keep_first(starts, snap.now)
        except Exception:
            log.exception("start forecast failed")
        finally:
            self._forecasting = False

    def _keep_first(self, starts: dict[int, forecast.Start], now: float) -> None:
        """Each job's first forecast after its submit, kept (store, ``first_forecasts``)
        to score the forecast against its start: history, the metrics; and its simulated
        start, for the calibration to learn from."""
        new = {job: (s.at, s.early, s.late) for job, s in starts.items()
               if job not in self.first_forecasts and job in self.state.jobs
               and self.state.jobs[job].state == JobState.PENDING}
        self.state.store.set_first_forecasts(new)
        self.first_forecasts.update({job: values[0] for job, values in new.items()})
        self._keep_simulated({job: starts[job] for job in new}, now)
        for job in [j for j in self.first_forecasts if j not in self.state.jobs]:
            del self.first_forecasts[job]  # ended without starting
        for job in [j for j in self.first_simulated if j not in self.state.jobs]:
            del self.first_simulated[job]

    def _keep_simulated(self, starts: dict[int, forecast.Start], now: float) -> None:
        for job, start in starts.items():
            # a start on the pass of now is the scheduler's decision: nothing to learn
            if start.simulated is not None and start.simulated > now and job not in self.first_simulated:
                self.first_simulated[job] = (now, start.simulated)

    def job_started(self, job: Job) -> None:
        """A job started: the calibration learns how its wait compared with the simulated one."""
        first = self.first_simulated.pop(job.id, None)
        if first is not None and job.started_at is not None:
            made, simulated = first
            self.calibration.learn(simulated - made, job.started_at - made)

    def forecast_one(self, job: Job) -> forecast.Start | None:
        """The forecast for one job (waiting, or about to be submitted: id -1) now, on
        the loop: each run stops once it started."""
        pending = [j for j in self.waiting() if j.id != job.id] + [job]
        snap = self.snapshot_for(pending)
        starts = forecast.forecast(snap, self.limits.settings.max_time_s, only=job.id,
                                   history=self.histories(), calibration=self.calibration)
        if job.id in self.state.jobs:
            self._keep_simulated(starts, snap.now)
        return starts.get(job.id)

    @staticmethod
    async def pause_after(started: float) -> None:
        """A pass over a long queue takes a while: give submits, launches and exits at
        least as long before the next one (a short queue's pass costs ~1 ms: no delay)."""
        await asyncio.sleep(min(time.perf_counter() - started, MAX_PASS_PAUSE_S))

    def expire_leases(self) -> None:
        """Jobs on a node silent for longer than the lease are lost: requeue them.

        A short drop costs nobody their job (the node is only ``unknown``); when the node
        comes back after the lease, reconcile stops the stale copies.
        """
        now = self.state.monotonic()
        for view in self.state.nodes.values():
            if view.silent_since is None or now - view.silent_since < self.state.config.node_lease:
                continue
            for job in [j for j in self.state.jobs.values()
                        if view.name in job_nodes(j) and j.state.holds_gpus]:
                self.transitions.requeue(job, f"lost with node {view.name} (silent for "
                                              f"{now - view.silent_since:.0f}s); requeued")

    def pass_is_pointless(self) -> bool:
        """Only submits since the last pass, and no GPU could take any job: skip the pass.
        The new jobs get their waiting reasons at the next periodic pass."""
        return not self.state.capacity_changed and not self.state.any_gpu_offers()

    def waiting(self) -> list[Job]:
        """The jobs a pass considers: pending, not held, not a pool's (a list of the
        caller's own, from the one kept while the job table is unchanged)."""
        return list(self._jobs_lists()[0])

    def _jobs_lists(self) -> tuple[list[Job], list[Job]]:
        """The waiting jobs (see ``waiting``) and those holding GPUs on the lab's own cards,
        in the table's order, from what the job table keeps up to date (``JobTable.waiting``,
        its index of holders): not a walk over every unfinished job (14,000 at 500 nodes).
        Kept while the table is the same one at the same ``JobTable.version`` (any job set,
        popped or deleted bumps it; jobs are frozen, so none changes otherwise)."""
        jobs = self.state.jobs
        kept = self._jobs_kept
        if kept is None or kept[0] is not jobs or kept[1] != jobs.version:
            waiting = list(jobs.waiting().values())
            holding = [j for j in jobs.holding_in_order() if j.pool is None]
            kept = self._jobs_kept = (jobs, jobs.version, waiting, holding)
        return kept[2], kept[3]

    async def pass_now(self) -> None:
        """One pass, as the loop runs it. Over a long queue (``THREADED_FROM`` waiting jobs
        or more) the pure scheduler decides in a thread of its own while the loop goes on
        answering submits, exits and probes (the thread gives the loop the interpreter every
        few milliseconds), so no request waits behind a whole pass; its decisions are then
        applied only where nothing they were made from changed meanwhile
        (``_still_valid``), and a pass follows for the rest. A short queue's pass (~1 ms)
        runs on the loop as ``schedule_pass``."""
        pending = self.waiting()
        if len(pending) < self.threaded_from:
            self.schedule_pass(pending)
            return
        seen = dict.copy(self.state.jobs)  # the Job objects decided about (replaced on change)
        snapshot = self.snapshot_for(pending)
        decisions = await asyncio.to_thread(self._decide, snapshot)
        if not self.apply(decisions, Seen(seen, {v.reading.uuid: v for v in snapshot.gpus})):
            self.state.wake()  # something changed under the pass: decide again for it

    def _decide(self, snapshot: scheduler.Snapshot) -> list[scheduler.Decision]:
        with self._deciding:  # one pass at a time: ``plan`` may ask on the loop meanwhile
            return scheduler.schedule(snapshot)

    def schedule_pass(self, pending: list[Job] | None = None) -> None:
        """Decide for every waiting job, on the loop; the Wait decisions, in the order they
        come, are the queue's order (``HeadState.queue_order``)."""
        pending = self.waiting() if pending is None else pending
        if not pending:
            self._new_order([])
            self.waiting_requests = {} if self.keep_waiting else None
            return
        self.apply(self._decide(self.snapshot_for(pending)))

    def _keep_waiting(self, decisions: list[scheduler.Decision]) -> None:
        """The requests of the jobs ``decisions`` keep waiting (``waiting_requests``)."""
        views, wait = self.pending_views, scheduler.Wait
        waiting: dict[str, scheduler.PendingJob] = {}
        named = False
        for d in decisions:
            if type(d) is wait:
                view = views[d.job_id][1]
                waiting.setdefault(view.request_key, view)
                named = named or bool(view.after) or view.reservation is not None
        self.waiting_requests, self.waiting_named = waiting, named

    def apply(self, decisions: list[scheduler.Decision], seen: Seen | None = None) -> bool:
        """What the decisions do: a ``Start`` is launched, a ``Preempt`` stops its victim, a
        ``Fail`` ends its job, a ``Wait`` keeps its new reason. ``seen``: the decisions were
        made off the loop from what it holds; each is applied only if still valid then
        (False: some were not)."""
        reasons: dict[int, str] = {}
        wait = scheduler.Wait
        self._new_order([d.job_id for d in decisions if type(d) is wait])
        started: dict[str, set] = {}  # GPU -> (job, placement) this pass's starts added
        all_applied = True
        jobs, holds = self.state.jobs, self.holds
        for decision in decisions:
            if seen is not None and not self._still_valid(decision, seen, started):
                all_applied = False
                continue
            job = jobs[decision.job_id]
            if type(decision) is wait:  # most decisions of a long queue: its reason, kept or new
                if job.reason != decision.reason:
                    reasons[job.id] = decision.reason
                    job = jobs[job.id] = job.with_reason(decision.reason)
                    self.stream.publish_job(job)
                if decision.holds:
                    holds[job.id] = decision.holds
                elif holds:
                    holds.pop(job.id, None)
                continue
            if isinstance(decision, scheduler.Start):
                if decision.scavenger:  # its user is past their quota: it runs preemptible
                    job = self.transitions.make_scavenger(job)
                self.transitions.begin_launch(job, decision.placements)
            elif isinstance(decision, scheduler.Preempt):
                self.limits.preempt(job, decision.reason)
            elif isinstance(decision, scheduler.Fail):
                self.transitions.finish(job, JobState.FAILED, None, decision.reason)
            if not isinstance(decision, scheduler.Preempt):
                self.holds.pop(job.id, None)
        self.state.store.set_reasons(reasons)
        if self.keep_waiting:
            if all_applied:
                self._keep_waiting(decisions)
            else:
                self.waiting_requests = None
        if self.holds:  # a job cancelled, held or sent to a pool meanwhile holds nothing
            self.holds = {job_id: cards for job_id, cards in self.holds.items()
                          if (job := self.state.jobs.get(job_id)) is not None
                          and job.state == JobState.PENDING and not job.held_by and not job.pooled}
        return all_applied

    def _still_valid(self, decision: scheduler.Decision, seen: Seen,
                     started: dict[str, set]) -> bool:
        """Whether a decision made off the loop still holds: its job is the very object
        decided about (any change to a job replaces it: cancelled, held, ended, requeued),
        and a Start's cards are still in service, held by the same jobs as then (plus this
        pass's earlier starts) and not taken further by processes of others."""
        state = self.state
        job = state.jobs.get(decision.job_id)
        if job is None or job is not seen.jobs.get(decision.job_id):
            return False
        if not isinstance(decision, scheduler.Start):
            return True
        for p in decision.placements:
            live, then = state.gpus.get(p.gpu_uuid), seen.gpus.get(p.gpu_uuid)
            if live is None or then is None or state.blocked(live) is not None \
                    or live.unmanaged_used_mb > then.unmanaged_used_mb:
                return False
            if set(state.jobs.held(p.gpu_uuid)) != set(then.placements) | started.get(p.gpu_uuid, set()):
                return False
        for p in decision.placements:
            started.setdefault(p.gpu_uuid, set()).add((decision.job_id, p))
        return True

    def _new_order(self, order: list[int]) -> None:
        if self.state.set_queue_order(order) and self.stream.subscribers and not self._order_due:
            self._order_due = True
            self.state.spawn(self._publish_order(), "queue-order")

    async def _publish_order(self) -> None:
        await asyncio.sleep(QUEUE_ORDER_EVERY_S)
        self._order_due = False
        self.stream.publish_queue_order()

    def snapshot_for(self, pending: list[Job]) -> scheduler.Snapshot:
        """Everything a pass looks at, from memory (the store only for old dependencies)."""
        state = self.state
        holding = self._jobs_lists()[1]
        named = {dep for j in pending for dep in j.spec.after}
        ended = state.store.job_outcomes([d for d in named if d not in state.jobs]) if named else {}
        now = state.clock()
        estimates: dict[tuple, scheduler.Estimate | None] = {}  # jobs alike share one (see estimate)

        def estimate(job: Job) -> scheduler.Estimate | None:
            key = (job.user, job.spec.gpu_count, job.spec.gpu_mem_mb, job.spec.time_limit_s is None)
            try:
                return estimates[key]
            except KeyError:
                got = estimates[key] = self.estimate(job)
                return got

        return scheduler.Snapshot(
            now=now, bookings=self.bookings.for_pass(now),
            gpus=tuple(state.gpu_views()),
            queue=self._pending_queue(pending),
            running=self._running(holding, estimate),
            users=self.shares.shares(),
            finished={job: outcome for job, (outcome, _) in ended.items()},
            never_ran=frozenset(job for job, (_, ran) in ended.items() if not ran),
            topologies=self.topologies(),
            config=state.settings.config,
            holds={j.id: self.holds[j.id] for j in pending if j.id in self.holds} if self.holds else {},
            power_budgets=self.budgets(),
        )

    def topologies(self) -> dict[str, dict]:
        return {name: view.topo.get("links", {}) for name, view in self.state.nodes.items()}

    def budgets(self) -> dict[str, float]:
        return {n.name: float(n.power_budget_w) for n in self.state.config.nodes if n.power_budget_w}

    def learn_from_store(self) -> None:
        """A head that starts again knows how long jobs ran before it stopped: the store's
        latest ended jobs are learned as their ends were (``job_ended``), oldest first, so
        the estimates and forecasts after a restart read the runs they read before it."""
        ended = (JobState.SUCCEEDED, JobState.TIMEOUT)
        for job, _ in self.state.store.ended_jobs(states=ended, limit=LEARNED_AT_START):
            self.job_ended(job)

    def job_ended(self, job: Job) -> None:
        """Remember how long a job ran: one without --time that succeeded in its user's
        like runs (a failure says nothing of how long such work runs), one with --time
        that succeeded or reached it by the share of it used."""
        if job.started_at is None or job.ended_at is None:
            return
        ran, limit = job.ended_at - job.started_at, job.spec.time_limit_s
        if limit is None and job.state is JobState.SUCCEEDED:
            key = (job.user, job.spec.gpu_count, job.spec.gpu_mem_mb)
            self.history.setdefault(key, deque(maxlen=HISTORY_RUNS)).append(ran)
        elif limit and job.state in (JobState.SUCCEEDED, JobState.TIMEOUT):
            self.time_shares.append(min(1.0, ran / limit))

    def histories(self) -> forecast.History:
        """What the head saw of run lengths until now, for a forecast in a thread."""
        return forecast.History({key: tuple(runs) for key, runs in self.history.items()},
                                tuple(self.time_shares))

    def estimate(self, job: Job) -> scheduler.Estimate | None:
        """How long a running job without --time is expected to hold its cards."""
        if job.spec.time_limit_s is not None:
            return None
        history = self.history.get((job.user, job.spec.gpu_count, job.spec.gpu_mem_mb), ())
        return scheduler.run_estimate(None, self.limits.settings.max_time_s, tuple(history))

    def _running(self, holding: list[Job], estimate: Callable[[Job], scheduler.Estimate | None]
                 ) -> tuple[scheduler.RunningJob, ...]:
        """The jobs holding GPUs as the scheduler sees them. A job's view is kept while it is
        the same ``Job`` object (frozen: any change to a job replaces it) and its estimate
        is equal: 4,000 running jobs are not rebuilt for every pass."""
        kept, views = self.running_views, {}
        for j in holding:
            guess = estimate(j)
            seen = kept.get(j.id)
            if seen is None or seen[0] is not j or seen[1] != guess:
                seen = (j, guess, scheduler.RunningJob(
                    j.id, j.user, j.placements, j.started_at or j.submitted_at, j.spec.time_limit_s,
                    j.spec.service, j.spec.array_id, j.spec.preemptible, guess))
            views[j.id] = seen
        self.running_views = views  # only jobs still holding GPUs are kept
        return tuple(view for _, _, view in views.values())

    def _pending_queue(self, pending: list[Job]) -> tuple[scheduler.PendingJob, ...]:
        """The waiting jobs as the scheduler sees them. A job's view is made once and kept
        while its spec stays the same object and its submit time the same (a new reason
        keeps them): building 10,000 views costs more than the pass that reads them."""
        kept, views = self.pending_views, {}
        for job in pending:
            seen = kept.get(job.id)
            if seen is None or seen[0] is not job.spec or seen[1].submitted_at != job.submitted_at:
                seen = (job.spec, pending_job(job))
            views[job.id] = seen
        self.pending_views = views  # only jobs still waiting are kept
        return tuple(view for _, view in views.values())

    def plan(self, user: str, spec: JobSpec) -> PlanView:
        """Where a job would go now, or why it would wait: the submit form's preview."""
        probe = Job(id=-1, user=user, spec=spec, submitted_at=self.state.clock())
        decisions = self._decide(self.snapshot_for(self.waiting() + [probe]))
        victims = [d.job_id for d in decisions if isinstance(d, scheduler.Preempt) and d.for_job == -1]
        for decision in decisions:
            if decision.job_id != -1 or isinstance(decision, scheduler.Preempt):
                continue  # (a Preempt names its victim)
            if isinstance(decision, scheduler.Start):
                return {"decision": "start", "gpus": [
                    {"node": p.node, "index": p.gpu_index, "uuid": p.gpu_uuid,
                     "memory_mb": p.memory_mb, "exclusive": p.exclusive}
                    for p in decision.placements]}
            if victims:  # it would start once they yielded: one pass and their grace
                return {"decision": "preempt", "reason": decision.reason, "preempts": victims}
            start = self.forecast_one(probe)
            return {"decision": "wait", "reason": decision.reason,
                    "starts": None if start is None else start.json(self.state.clock())}
        return {"decision": "wait", "reason": "not considered"}
