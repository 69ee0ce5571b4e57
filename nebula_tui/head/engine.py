"""The head: its rooms wired together, started and stopped, and the clients' requests.

The rooms, each importing only those before it (``tests/unit/test_architecture.py`` checks):

  ``state``       the live view (nodes, GPUs, jobs, links), ``wake`` and ``spawn``
  ``access``      who may do what
  ``accounting``  what ended jobs cost and did: history, reports
  ``stream``      the snapshot and the events subscribers get
  ``shares``      fair-share weights, quotas, each user's figures
  ``jobs``        a job's transitions: launch, running, exit, finish, requeue, cancel, stop
  ``stops``       the head's own stops timed: SIGUSR1, the grace, SIGKILL, even across a restart
  ``limits``      what running jobs promised: time limits, the memory guard, idle cards
  ``scheduling``  the loop: when a pass runs, what it sees, what its decisions do
  ``health``      Xid policies, isolation, throttling
  ``nodes``       node links and messages, reconcile, drain/add/remove/reload
  ``attach``      a job's tmux session relayed over the socket
  ``pools``       batch clusters behind the queue: sending, polling, their jobs' requests
  ``smoke``       a new node's first job (``nebula node add``)
  ``metrics``     Prometheus metrics (``nebula serve --metrics``)
  ``notify``      webhooks and mail when jobs end or GPUs are isolated
  ``engine``      this module; ``server`` answers the socket with it, ``serve`` runs it

A request is refused with ``RequestError`` (one line, said to the client as it is).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

from .. import views, waits
from ..config.cluster import ClusterConfig
from ..model import Job, JobSpec, JobState, Pending, RequestError, UnfitRequest
from ..remote.ssh import NodeUnavailable
from ..scheduler import admission
from ..store import Store
from ..wire import (EndedJobDetail, JobDetail, LogPart, LogsReply, PlanView, StatusView, StreamSnapshot,
                    TelemetrySample)
from .access import Access
from .accounting import Accounting
from .attach import Attach
from .bookings import Bookings
from .doctor import Doctor
from .health import HealthMonitor
from .jobs import JobTransitions
from .limits import Limits
from .metrics import Metrics
from .notify import Notifier
from .nodes import Fleet
from .pools import Pools
from .scheduling import Scheduling, pending_job
from .shares import Shares
from .smoke import SmokeTest
from .state import HeadState, job_nodes
from .stops import Stops
from .stream import Stream
from .why import Why

#: jobs one user may have waiting or running at once (an array's tasks each count): every
#: list of jobs, each TUI's snapshot among them, holds them all
MAX_LIVE_JOBS_PER_USER = 20_000


class Engine:
    def __init__(self, config: ClusterConfig, store: Store, clock=time.time):
        self.state = HeadState(config, store, clock)
        #: (what they were judged on, partial, request shape -> refusal): ``_hardware_refusal``
        self._refusals: tuple = ((None, None, None, None), False, {})
        self.access = Access(self.state)
        self.accounting = Accounting(self.state, self.access)
        self.stream = Stream(self.state)
        self.shares = Shares(self.state, self.access, self.stream, self.accounting)
        self.transitions = JobTransitions(self.state, self.stream, self.shares, self.access)
        self.stops = Stops(self.state, self.transitions)
        self.limits = Limits(self.state, self.transitions, self.stops)
        self.bookings = Bookings(self.state, self.access, self.stream)
        self.scheduling = Scheduling(self.state, self.stream, self.shares, self.transitions, self.limits,
                                     self.bookings)
        self.scheduling.learn_from_store()  # the run lengths it learned before a restart
        self.health = HealthMonitor(self.state, self.stream, self.transitions, self.access)
        store.on_event = self.stream.publish_event  # every events-log line, once committed
        self.fleet = Fleet(self.state, self.stream, self.transitions, self.health, self.access)
        self.attach = Attach(self.state, self.access)
        self.pools = Pools(self.state, self.stream, self.shares, self.transitions, self.access,
                           store.path.parent)
        self.why = Why(self.state, self.scheduling, self.shares, self.pools)
        self.smoke = SmokeTest(self.state, self.stream, self.transitions, self.access)
        self.doctor = Doctor(self.state)
        self.metrics = Metrics(self.state)  # served only with --metrics (head/serve.py)
        self.transitions.on_running = self._job_started
        self.scheduling.on_pass = self.metrics.pass_done
        self.notifier = Notifier(self.state)
        self.transitions.on_ended = self._job_ended
        self.transitions.on_requeued = self.notifier.job_requeued
        self.health.on_isolated = self.notifier.gpu_isolated
        self.bookings.on_broken = self.notifier.booking_broken
        self.fleet.probed = self.limits.on_probe  # the memory guard and idleness read each probe
        # What the node links call, what the server and tests read:
        self.on_node_message = self.fleet.on_node_message
        self.on_node_state = self.fleet.on_node_state
        self.unsubscribe = self.stream.unsubscribe
        self.snapshot, self.gpus_json = self.stream.snapshot, self.stream.gpus_json
        self.queue_json, self.users_json = self.stream.queue_json, self.shares.users_json
        self.is_admin, self.resolve_gpu = self.access.is_admin, self.state.resolve_gpu
        self.set_drained, self.set_quota = self.fleet.set_drained, self.shares.set_quota
        self.node_key, self.add_node = self.fleet.node_key, self.fleet.add_node
        self.remove_node, self.reload = self.fleet.remove_node, self.fleet.reload

    def _job_ended(self, job: Job) -> None:
        self.scheduling.job_ended(job)  # its run length: its user's history (estimates.py)
        self.notifier.job_ended(job)

    def _job_started(self, job: Job) -> None:
        self.metrics.job_started(job, self.scheduling.first_forecasts.pop(job.id, None))
        self.scheduling.job_started(job)  # the forecast's calibration learns from its wait
        self.limits.job_started(job)  # its --time counts from now, on the monotonic clock

    # the live view, as the server and tests read it
    config = property(lambda self: self.state.config)
    store = property(lambda self: self.state.store)
    clock = property(lambda self: self.state.clock)
    owner = property(lambda self: self.state.owner)
    nodes = property(lambda self: self.state.nodes)
    gpus = property(lambda self: self.state.gpus)
    jobs = property(lambda self: self.state.jobs)
    links = property(lambda self: self.state.links)

    def subscribe(self, queue: asyncio.Queue) -> StreamSnapshot:
        """A new subscriber: the stream's snapshot, with every user's row (``users``) and
        each pool's view (``pools``, as ``Pools.view_json``; a "pool" event after each poll)
        and the bookings (``bookings``)."""
        return {**self.stream.subscribe(queue), "users": self.shares.users_json(),
                "pools": self.pools.status(), "bookings": self.bookings.list_json()}

    def status(self) -> StatusView:
        """`nebula status`: nodes, GPUs and their summary (the stream's), and each pool."""
        return {**self.stream.status(), "pools": self.pools.status()}

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        if self.state.store.restore_pending:
            self.state.await_nodes_after_restore()
        self.transitions.load()
        self.stops.resume(self.state.config.health.isolation_grace_s)
        self.fleet.start()
        self.scheduling.start()
        self.pools.start()

    async def stop(self) -> None:
        self.state.store.on_event = None
        self.scheduling.stop()
        self.state.cancel_tasks()
        await self.fleet.close()
        await self.pools.close()

    # ------------------------------------------------------------ client requests
    async def submit_on_disk(self, user: str, spec: JobSpec) -> Job:
        """``submit``, returned once the job is on the disk, as a client's answer must be.
        Its commit does not wait for the disk itself: the group commit (``HeadState.on_disk``)
        syncs once for every submit that came meanwhile, off the loop, so neither the other
        clients nor the launches and exits of the moment wait for this one's sync. A job for
        a pool is refused first when the pool would refuse it (``Pools.admit``)."""
        await self.pools.admit(user, spec)
        job = self.submit(user, spec, durable=False, wake=False)
        try:
            await self.state.on_disk()
        finally:
            # Woken once the answer is due, not before: a pass started meanwhile (a long
            # one over 10,000 jobs) would hold the answer back until it ended.
            self.state.wake(capacity=False)
        return job

    def submit(self, user: str, spec: JobSpec, durable: bool = True, wake: bool = True) -> Job:
        """Accept a job (an array: all its tasks; the first is returned), or refuse it in
        one sentence: quota, priority, dependencies, a request no card here could ever
        serve or a --time past the cluster's max_time (``UnfitRequest``). ``durable``
        False: committed, but on the disk only after ``HeadState.on_disk``; ``wake`` False:
        the caller asks for the pass."""
        state = self.state
        if spec.priority > 0 and not self.access.is_admin(user):
            raise RequestError(f"only an admin ({self.access.admins_text()}) may raise a job's priority")
        if spec.reservation is not None:
            self._check_reservation(user, spec.reservation)
        missing = [d for d in spec.after if d not in state.jobs and state.store.job(d) is None]
        if missing:
            raise RequestError(f"--after names no job {missing[0]}; `nebula queue` lists the jobs")
        config = state.settings.config
        share = self.shares.shares().get(user)
        if share is not None and share.refusal and config.quota_mode == "refuse" \
                and not (spec.preemptible and not config.preemptible_in_quota):
            raise RequestError(share.refusal)  # scavenge: it runs on idle cards (preemption.py)
        spec = self._fit(user, spec)
        tasks = len(spec.array.indices) if spec.array else 1
        live = state.jobs.per_user[user]
        if live + tasks > MAX_LIVE_JOBS_PER_USER:
            # Every list of jobs (each TUI's snapshot among them) holds every live job.
            raise RequestError(f"{user} has {live:,} jobs waiting or running, and one user may have "
                               f"{MAX_LIVE_JOBS_PER_USER:,}; let some end (or cancel them) first")
        charge = config.preemptible_charge if spec.preemptible else 1.0
        if spec.array:
            jobs = state.store.add_array(user, spec, spec.array.indices, spec.array.limit, state.clock(),
                                         durable, charge)
        else:
            jobs = [state.store.add_job(user, spec, state.clock(), durable, charge)]
        for job in jobs:
            state.jobs[job.id] = job
            self.stream.publish_job(job)
            self.pools.accepted(job)
        self.shares.changed(user)
        if wake:
            state.wake(capacity=False)
        return jobs[0]

    def plan(self, user: str, spec: JobSpec) -> PlanView:
        """The submit form's preview: where the job would go now, or why it would wait; a
        request submit would refuse is refused here in the same words (not "would wait")."""
        return self.scheduling.plan(user, self._fit(user, spec))

    def _check_reservation(self, user: str, name: str) -> None:
        """--reservation names a booking not yet over whose users include ``user``."""
        booking = next((b for b in self.bookings.live() if b["name"] == name), None)
        if booking is None:
            raise RequestError(f"--reservation {name}: no such booking is under way or ahead; "
                               "`nebula reservations` lists them")
        if user not in booking["users"]:
            raise RequestError(f"--reservation {name}: the booking is for {', '.join(booking['users'])}, "
                               f"not {user}")

    def _fit(self, user: str, spec: JobSpec) -> JobSpec:
        """The spec with the cluster's default --time, or ``UnfitRequest`` when it asks for
        longer than max_time or for what no GPU known here (drained, unknown and unreachable
        nodes' included) could ever give."""
        limits = self.limits.settings
        time_limit, refusal = admission.time_limit(spec.time_limit_s, limits.default_time_s,
                                                   limits.max_time_s)
        self.pools.check(user, spec)
        names = {node.name for node in self.state.config.nodes}
        for flag, asked in (("-w/--nodelist", spec.nodelist), ("-x/--exclude", spec.exclude)):
            unknown = [n for n in asked if n not in names]
            if unknown:
                raise UnfitRequest(f"{flag}: {unknown[0]} is no node of this lab; "
                                   "`nebula nodes` lists them")
        if refusal is None and spec.pool in self.pools.pools:
            pass  # the pool's hardware, not the lab's, is what it needs (Pools.check)
        elif refusal is None:
            refusal = self._hardware_refusal(user, spec)
            if refusal is not None and spec.pool is None and self.pools.bursts_for(spec, user):
                refusal = None  # a pool it may go to after waiting can run it
        if refusal is not None:
            raise UnfitRequest(refusal)
        return spec if time_limit == spec.time_limit_s else replace(spec, time_limit_s=time_limit)

    def _hardware_refusal(self, user: str, spec: JobSpec) -> str | None:
        """``admission.refusal_on`` for the spec's request on the cards known now, kept per
        request shape until the cards' classes change: checking every node at each submit
        made a submit's cost grow with the lab."""
        hardware, config = self.state.hardware(), self.state.settings.config
        basis = (hardware, config, self.state.config, self.state.config.nodes)
        # ``hardware`` is the same object until a card's facts change; the configs are
        # replaced by a reload, a node added or removed
        if any(a is not b for a, b in zip(self._refusals[0], basis)):
            partial = any(node.name not in hardware for node in self.state.config.nodes)
            self._refusals = (basis, partial, {})
        _, partial, known = self._refusals
        key = (spec.gpu_count, spec.gpu_mem_mb, spec.service, spec.nodes, spec.vendor, spec.arch,
               spec.cuda, spec.nodelist, spec.exclude)
        if key not in known:
            if len(known) >= 1024:
                known.clear()
            probe = pending_job(Job(id=0, user=user, spec=spec, submitted_at=0.0))
            known[key] = admission.refusal_on(probe, hardware, config, partial=partial)
        return known[key]

    def job_detail(self, job_id: int, user: str | None = None) -> JobDetail | EndedJobDetail:
        """A job as ``views.job_json`` has it (one that ended as its history shows it, to
        ``user``: GPU-hours, waits, what its cards did), with what the head computes for
        it: its place in the queue (``queue_pos``), its start forecast (``starts``) and, once
        placed, the environment each
        of its nodes gives its command (``environment``: node -> variables)."""
        job = self.job(job_id)
        ended = self.accounting.ended_job(user or self.state.owner, job) if job.state.finished else None
        queue_pos = self.state.queue_pos(job)
        starts = self.state.forecasts.get(job.id) if job.state == JobState.PENDING else None
        environment = self.transitions.environments(job) if job.placements and job.pool is None else {}
        if ended is not None:
            return views.ended_job_detail(ended, queue_pos, starts, environment)
        return views.job_detail(views.job_json(job), queue_pos, starts, environment)


    def job(self, job_id: int) -> Job:
        job = self.state.jobs.get(job_id) or self.state.store.job(job_id)
        if job is None:
            raise RequestError(f"no job {job_id}; `nebula queue` lists the jobs")
        return job

    async def cancel(self, user: str, job_id: int) -> Job:
        """Cancel a job; an array's id (its first task's) cancels every task not ended."""
        job = self.job(job_id)
        if job.pooled and job.spec.array_id != job.id:
            await self.pools.cancel(user, job)
            return self.job(job_id)
        tasks = [job]
        if job.spec.array_id == job.id:
            self.access.check_may_manage(user, job, "cancel")
            tasks += sorted((j for j in self.state.jobs.values()
                             if j.spec.array_id == job.id and j.id != job.id), key=lambda j: j.id)
            tasks = [t for t in tasks if not t.state.finished]
            if not tasks:
                raise RequestError(f"array {job_id}: every task already ended")
        for task in tasks:
            task = self.job(task.id)
            if task.pooled:
                await self.pools.cancel(user, task)
            else:
                self.transitions.cancel(user, task)
        return self.job(job_id)

    async def requeue_job(self, user: str, job_id: int) -> Job:
        """``requeue``, or in its pool for a pool's job (scontrol requeue)."""
        job = self.job(job_id)
        if job.pool is not None:
            return await self.pools.requeue(user, job)
        return self.requeue(user, job_id)

    async def hold_job(self, user: str, job_id: int, hold: bool) -> Job:
        """``set_held``, or in its pool too for a job sent there (scontrol hold/release)."""
        job = self.job(job_id)
        if job.pool is not None:
            return await self.pools.hold(user, job, hold)
        return self.set_held(user, job_id, hold)

    def requeue(self, user: str, job_id: int) -> Job:
        """Stop a running job (SIGUSR1, then SIGKILL after the grace) and put it back in
        the queue as its next attempt."""
        job = self.job(job_id)
        self.access.check_may_manage(user, job, "requeue")
        if not job.state.holds_gpus:
            raise RequestError(f"job {job_id} {job.state.phrase}; only a launching or running job "
                               "can be requeued (`nebula submit` runs an ended one again)")
        if not self.stops.stop(job, JobState.PENDING, f"requeued by {user}", self.limits.grace_s,
                                     requeue=True):
            raise RequestError(f"job {job_id} is already being stopped")
        self.state.record("requeue", f"job {job_id} is requeued by {user}", job_id=job_id, node=job.node)
        return self.job(job_id)

    async def wait_finished(self, job_id: int, within: float | None = None) -> Job:
        """The job once it ended; with ``within`` (seconds), as it is then if still live."""
        try:
            return await waits.within(within, self.transitions.wait_finished(self.job(job_id)))
        except asyncio.TimeoutError:
            return self.job(job_id)

    def set_held(self, user: str, job_id: int, hold: bool) -> Job:
        job = self.job(job_id)
        self.access.check_may_manage(user, job, "hold" if hold else "release")
        if job.state != JobState.PENDING:
            raise RequestError(f"job {job_id} {job.state.phrase}; only waiting jobs can be "
                               f"{'held' if hold else 'released'}")
        self.state.store.set_held(job.id, user if hold else None, user, self.state.clock())
        job = replace(job, status=Pending(f"held by {user}; `nebula release {job.id}` lets it run",
                                          held_by=user) if hold else Pending())
        self.state.jobs[job.id] = job
        self.stream.publish_job(job)
        self.state.wake()
        return job

    def attach_argv(self, user: str, job_id: int) -> list[str]:
        """The command that attaches a terminal to the job's session through this service
        (R13): refused here as the attach itself would be."""
        if self.job(job_id).pool is not None:
            raise RequestError(f"job {job_id} runs in a pool, where the head has no terminal of "
                               f"its own; `nebula logs -f {job_id}` follows its output")
        node, _ = self.attach.target(user, job_id, 0)
        self.attach.check_room(user, node)
        return ["nebula", "attach", str(job_id)]

    def history(self, gpu: str, since_s: float) -> list[TelemetrySample]:
        if gpu not in self.state.gpus:
            raise RequestError(f"no GPU {gpu}; `nebula gpus` lists them (uuid, or node:index)")
        return self.state.store.telemetry(gpu, self.state.clock() - since_s)

    async def read_log(self, user: str, job_id: int, offset: int, rank: int | None = None,
                       offsets: list[int] | None = None, attempt: int | None = None) -> LogsReply:
        """Part of the job's output from ``offset``: rank 0's (or ``rank``'s); with
        ``offsets`` (one per rank), every rank's, as ``parts``. Of its latest attempt, or of
        ``attempt`` (1 its first run; each requeue starts the next). ``ended``: the log
        will not grow (the job ended, or that attempt did)."""
        job = self.job(job_id)
        if job.pool is not None:  # one output file there, every node's (srun) and attempt's
            return await self.pools.read_log(user, job, offsets[0] if offsets else offset)
        self.access.check_may_manage(user, job, "read the log of")
        if attempt is None:
            nodes = job_nodes(job) or self.state.store.last_nodes(job.id) or \
                ([job.node] if job.node else [])
            which: dict = {}  # the node reads its latest attempt
        else:
            nodes = self._attempt_nodes(job, attempt)
            which = {"attempt": attempt - 1}
        if rank is not None and not 0 <= rank < max(1, len(nodes)):
            raise RequestError(f"job {job_id} ran on {len(nodes)} node(s): --rank goes from 0 "
                               f"to {max(0, len(nodes) - 1)}")
        ranks = list(range(len(nodes))) if offsets is not None else [rank or 0][:len(nodes)]
        starts = list(offsets) if offsets is not None else [offset]
        parts: list[LogPart] = []
        for i, position in zip(ranks, starts + [0] * len(ranks)):
            try:
                reply = await self.state.links[nodes[i]].request("log", job=job.id, offset=position,
                                                                 **which)
            except (NodeUnavailable, asyncio.TimeoutError, KeyError) as err:
                raise RequestError(f"cannot read the log of job {job_id} on {nodes[i]}: {err}") from None
            parts.append({"rank": i, "node": nodes[i], "data": reply.get("data", ""),
                          "offset": reply.get("offset", position), "size": reply.get("size")})
        first: LogPart = parts[0] if parts else {"rank": 0, "node": "", "data": "", "offset": offset, "size": 0}
        now = self.job(job_id)
        ended = now.state.finished or (attempt is not None and attempt - 1 < now.attempt)
        return {"data": first["data"], "offset": first["offset"], "size": first["size"],
                "parts": parts, "state": now.state.value, "ended": ended}

    def _attempt_nodes(self, job: Job, attempt: int) -> list[str]:
        """The nodes of the job's ``attempt`` (1 its first), rank 0 first; a request for one
        it never had is refused with the attempts it had."""
        runs = self.state.store.attempt_nodes(job.id)
        nodes = runs.get(attempt - 1)
        if nodes is None:
            had = ", ".join(str(a + 1) for a in sorted(runs))
            raise RequestError(f"job {job.id} has no attempt {attempt}; "
                               + (f"its attempts: {had} (1 is its first run)" if had
                                  else "it has not started yet"))
        return nodes
