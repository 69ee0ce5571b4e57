"""A lab month in virtual time: the head's own ``Engine`` — its submit, queue order, fair
share with its half-life, slices, gangs, backfill reservations, service spare, time limits
and quotas, each exactly as ``nebula serve`` runs them — driven by a clock that jumps from
event to event instead of waiting.

Only the nodes are played: each is a link that answers a launch at once and reports the
job's exit when its recorded duration is over (or at once when the head signals it: a
stopped job, as at a time limit, checkpoints and exits on SIGUSR1). Probes report every
card empty and cool, so what decides is the head's bookkeeping, not readings. A change
to the scheduler or to the head's rooms changes the replay: nothing here decides.

One turn: the clock jumps to the next event (a submit, an exit, a time limit due); the
events of that moment are handed to the head; the spawned launch tasks run; then one
scheduling pass, phases as ``Scheduling.run`` has them (exits the store could not take,
time limits, the pass). A pass with nothing new is skipped, as the head skips it; so is one
after submits alone while no waiting job's request fits any card
(``Replay._only_waits``): it could only have kept every job waiting, and a month
whose queue grows without end has thousands of them. Its store
has no writer but this head, so the users' finished runs fair share weighs are read from
it once and then kept by the ends (``Shares.usage_kept``), not read again each virtual
minute.
"""

from __future__ import annotations

import asyncio
import heapq
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config.cluster import ClusterConfig
from ..model import Job, JobSpec, JobState, NodeState, RequestError, UnfitRequest
from ..month.records import Outcome, Request
from ..scheduler import NothingFits
from ..store import Store
from . import forecast
from .engine import Engine
from .scheduling import pending_job

#: the head's Xid/idle/probe machinery never fires in a replay: cards read as idle and cool
_IDLE_DEVICE = {"memory_used_mb": 0, "utilization_pct": 0.0, "temperature_c": 35.0, "power_w": 30.0}

#: passes at one virtual instant past which a replay is a loop, not a cascade (per job
#: replayed, at least this many): every job starts at most a few times in an instant, and a
#: preemption's exit comes a grace later. Decisions that undo each other pass after pass
#: would otherwise hold the clock still and never end.
MAX_PASSES_PER_INSTANT = 1000


class ReplayStalled(RuntimeError):
    """The scheduler went on passing without the virtual clock moving (a loop)."""


@dataclass
class _Clock:
    now: float

    def __call__(self) -> float:
        return self.now


class _SimNode:
    """One node's link: launches run for their job's duration; signals end them now."""

    def __init__(self, replay: Replay, name: str):
        self.replay = replay
        self.name = name
        self.requests = 0

    async def request(self, op: str, timeout: float | None = None, **fields) -> dict:
        self.requests += 1
        if op == "launch":
            self.replay.launched(self.name, int(fields["job"]), str(fields["token"]))
        elif op in ("signal", "cancel"):
            self.replay.stopped(self.name, int(fields["job"]))
        return {"ok": True, "sessions": [], "jobs": {}}

    async def close(self) -> None:
        pass


@dataclass(order=True)
class _Event:
    at: float
    seq: int
    kind: str = field(compare=False)  # "submit" | "exit"
    data: tuple = field(compare=False)


class Replay:
    """Replays ``requests`` on the cards of ``devices`` (node -> the probe's device dicts)
    under ``config``, which names those nodes, with ``links`` (node -> its ``topo -m``
    matrix, where known). ``run`` returns one outcome per request."""

    def __init__(self, config: ClusterConfig, devices: dict[str, list[dict]],
                 requests: Iterable[Request], start: float, horizon_s: float,
                 links: dict[str, dict] | None = None, folder: Path | None = None,
                 forecasts: bool = False):
        self.config = config
        self.devices = devices
        self.links = links or {}
        self.requests = sorted(requests, key=lambda r: (r.submit_s, r.key))
        self.start = start
        self.horizon_s = horizon_s
        self.folder = folder
        self.clock = _Clock(start)
        self.events: list[_Event] = []
        self._seq = 0
        self.outcomes = {r.key: Outcome(r.key) for r in self.requests}
        self.by_job: dict[int, Request] = {}
        #: (job, node) -> the exit event's token, while its part runs there
        self.running: dict[tuple[int, str], str] = {}
        #: job -> when it was first launched (a preempted or requeued job starts again)
        self.first_launch: dict[int, float] = {}
        self.passes = 0
        #: passes not run: only submits came, and no waiting job's request fits any cards
        #: (``Replay._only_waits``), so they could only have kept every job waiting
        self.skipped = 0
        #: skip those passes (off: every event has its pass, what the skip is checked against)
        self.skip_waits = True
        self._fits: NothingFits | None = None  # the cards the waiting requests were last searched on
        #: forecast each job's start at its submit, as the head would (``Outcome.forecast``;
        #: ``nebula simulate`` scores them): a forecast per submit costs a long month time
        self.forecasts = forecasts

    # ---------------------------------------------------------------- the nodes' side
    def _push(self, at: float, kind: str, data: tuple) -> None:
        self._seq += 1
        heapq.heappush(self.events, _Event(at, self._seq, kind, data))

    def launched(self, node: str, job_id: int, token: str) -> None:
        request = self.by_job.get(job_id)
        if request is None:
            return
        self.running[(job_id, node)] = token
        self.first_launch.setdefault(job_id, self.clock.now)
        self._push(self.clock.now + request.duration_s, "exit", (node, job_id, token, 0))

    def stopped(self, node: str, job_id: int) -> None:
        """SIGUSR1 (a time limit), a cancel or a kill: the part ends now, code 143."""
        token = self.running.get((job_id, node))
        if token is not None:
            self._push(self.clock.now, "exit", (node, job_id, token, 143))

    # ---------------------------------------------------------------------- the run
    def run(self) -> dict[int, Outcome]:
        if self.folder is not None:
            return asyncio.run(self._run(self.folder))
        # The replay's store is the head's own, in memory's file system where there is
        # one: its commits are the head's, its syncs to a disk would be only waiting.
        shm = Path("/dev/shm")
        where = shm if shm.is_dir() and os.access(shm, os.W_OK) else None
        with tempfile.TemporaryDirectory(prefix="nebula-replay-", dir=where) as folder:
            return asyncio.run(self._run(Path(folder)))

    async def _run(self, folder: Path) -> dict[int, Outcome]:
        store = Store(folder / "state.db")
        engine = Engine(self.config, store, clock=self.clock)
        engine.state.monotonic = self.clock  # time limits and leases count virtual seconds
        engine.shares.usage_kept = True  # its store has no other writer: read it once
        engine.scheduling.keep_waiting = self.skip_waits  # a pass that could only keep jobs waiting is skipped
        try:
            self._bring_up(engine)
            for request in self.requests:
                self._push(self.start + request.submit_s, "submit", (request,))
            end = self.start + self.horizon_s
            instant, passes_here = self.clock.now, 0
            bound = max(MAX_PASSES_PER_INSTANT, 2 * len(self.requests))
            while self.events:
                due = engine.limits.next_due()
                at = self.events[0].at
                if due is not None and self.clock.now + due < at:
                    at = self.clock.now + max(due, 0.0)
                if at > end:
                    break
                self.clock.now = max(self.clock.now, at)
                changed, submitted = self._take_events(engine)
                await _settle()
                engine.transitions.retry_exits()
                engine.limits.check()
                await _settle()
                if changed and submitted is not None and not engine.state.capacity_changed \
                        and self._only_waits(engine, submitted):
                    self.skipped += 1  # it could only have kept every job waiting
                elif changed or engine.state.capacity_changed:
                    engine.state.capacity_changed = False
                    engine.scheduling.schedule_pass()
                    self.passes += 1
                    await _settle()
                    passes_here = passes_here + 1 if self.clock.now == instant else 1
                    instant = self.clock.now
                    if passes_here > bound:
                        raise ReplayStalled(
                            f"the replay stopped at day {(instant - self.start) / 86400:.1f}: {passes_here} "
                            "scheduling passes without time moving (decisions undoing each other); "
                            "please report it with the trace (--save-trace)")
            self.clock.now = max(self.clock.now, end)
            self._collect(engine)
        finally:
            await engine.stop()
            store.close()
        return self.outcomes

    def _only_waits(self, engine: Engine, submitted: list[Job]) -> bool:
        """Whether a pass now could decide nothing but waits, when only ``submitted`` came
        since the last one (nothing ended, no card changed). True when no waiting job's
        request fits any cards as they are (``scheduler.NothingFits``), none holds cards it
        preempted for, and no job names a dependency or a booking (time alone can fail
        those). A skipped pass changes no job; its waiting reasons come with the next pass.
        Fair share's weights are looked at as the pass would have (they are recomputed at
        most once a minute from the first look after one), so the next pass orders alike."""
        scheduling, state = engine.scheduling, engine.state
        waiting = scheduling.waiting_requests
        if waiting is None or scheduling.waiting_named or scheduling.holds:
            return False
        for job in submitted:
            if job.spec.after or job.spec.reservation is not None:
                scheduling.waiting_requests = None  # known again after the next pass
                return False
            if job.state == JobState.PENDING and not job.held_by and not job.pooled:
                view = pending_job(job)
                waiting.setdefault(view.request_key, view)
        if engine.bookings.for_pass(state.clock()):
            return False
        gpus = tuple(state.gpu_views())
        fits = self._fits
        if fits is None or len(fits.gpus) != len(gpus) or any(a is not b for a, b in zip(fits.gpus, gpus)):
            holders = [j for j in state.jobs.holders() if j.state.holds_gpus and j.pool is None]
            fits = self._fits = NothingFits(gpus, scheduling.topologies(), {j.id for j in holders if j.spec.service},
                                            {j.id for j in holders if j.spec.preemptible},
                                            state.settings.config, scheduling.budgets())
        if any(fits.fits(job) for job in waiting.values()):
            return False
        engine.shares.shares()
        return True

    def _bring_up(self, engine: Engine) -> None:
        for node in self.config.nodes:
            engine.links[node.name] = _SimNode(self, node.name)
            hello: dict[str, Any] = {"type": "hello", "hostname": node.name, "smi_table": "CUDA Version: 12.4"}
            if node.name in self.links:
                hello["links"] = self.links[node.name]
            engine.on_node_message(node.name, hello)
            devices = [{**d, **_IDLE_DEVICE} for d in self.devices.get(node.name, [])]
            engine.on_node_message(node.name, {"type": "probe", "t": self.clock.now, "error": "",
                                               "devices": devices, "processes": []})
            engine.on_node_state(node.name, NodeState.UP, "")

    def _take_events(self, engine: Engine) -> tuple[bool, list[Job] | None]:
        """Hand the head every event due now: whether any was, and the jobs submitted
        when nothing else was taken (None: something else was)."""
        taken = False
        submitted: list[Job] | None = []
        while self.events and self.events[0].at <= self.clock.now:
            event = heapq.heappop(self.events)
            taken = True
            if event.kind == "submit":
                job = self._submit(engine, event.data[0])
                if job is not None and submitted is not None:
                    submitted.append(job)
            else:
                submitted = None
                node, job_id, token, code = event.data
                if self.running.get((job_id, node)) != token:
                    # that part was stopped (its exit sent) already, or this is an earlier
                    # attempt's end: the live attempt's token stays
                    continue
                del self.running[(job_id, node)]
                engine.on_node_message(node, {"type": "exit", "job": job_id, "token": token,
                                              "code": code})
        return taken, submitted

    def _submit(self, engine: Engine, request: Request) -> Job | None:
        spec = JobSpec(command=("true",), name=f"r{request.key}", gpu_count=request.gpus,
                       gpu_mem_mb=request.gpu_mem_mb, nodes=request.nodes,
                       time_limit_s=request.time_limit_s, service=request.service,
                       preemptible=request.preemptible)
        try:
            job = engine.submit(request.user, spec, durable=False, wake=False)
        except RequestError as err:
            self.outcomes[request.key].refused = str(err)
            self.outcomes[request.key].unfit = isinstance(err, UnfitRequest)
            return None
        self.by_job[job.id] = request
        if self.forecasts:
            self._forecast(engine, job, request)
        return job

    def _forecast(self, engine: Engine, job, request: Request) -> None:
        """The head's start forecast for the job just submitted, kept to score it."""
        start = engine.scheduling.forecast_one(job)
        if start is None:
            return
        rel = lambda t: None if t is None else t - self.start  # noqa: E731
        if start.at is None:  # "not within 7 days": its interval is from the horizon on
            at = self.clock.now + forecast.HORIZON_S
            self.outcomes[request.key].forecast = (at - self.start, at - self.start, None)
            return
        self.outcomes[request.key].forecast = (start.at - self.start, rel(start.early), rel(start.late))

    def _collect(self, engine: Engine) -> None:
        """Each request's outcome, from the head's own store."""
        charged = engine.store.charged_hours(list(self.by_job))
        held = engine.store.held_spans()
        for job_id, request in self.by_job.items():
            job = engine.jobs.get(job_id) or engine.store.job(job_id)
            outcome = self.outcomes[request.key]
            outcome.state = job.state.value if job.state.finished else None
            outcome.runs = job.attempt + (1 if job.started_at is not None else 0)
            outcome.started_s = None if job.started_at is None else job.started_at - self.start
            first = self.first_launch.get(job_id)
            outcome.first_started_s = None if first is None else first - self.start
            outcome.ended_s = None if job.ended_at is None else job.ended_at - self.start
            outcome.placements = tuple((p.node, p.gpu_uuid, p.memory_mb, p.exclusive)
                                       for p in job.placements)
            outcome.charged_gpu_hours = charged.get(job_id) or 0.0
            outcome.held = tuple((uuid, since - self.start, None if until is None else until - self.start)
                                 for uuid, since, until in held.get(job_id, ()))


async def _settle() -> None:
    """Let the tasks the head spawned (launches, acks, stops) run until none is ready."""
    for _ in range(4):
        await asyncio.sleep(0)
