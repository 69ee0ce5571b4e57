"""What running jobs promised, kept: time limits, the memory guard, idle cards.

Each is one check over the running jobs, run at every turn of the scheduling loop
(:meth:`Limits.check`) and, for one node's readings, after each of its probes
(:meth:`Limits.on_probe`):

* time limits (R29): a job past its ``--time`` gets SIGUSR1 (checkpoint now), SIGKILL
  after ``health.isolation_grace``, and ends ``timeout``;
* the memory guard (R28): a job whose processes hold more than its reservation on a
  shared card (a slice) is an event and a line in its own log at once; once it has for
  ``limits.memory_grace``, ``limits.memory_overuse`` runs (``warn``: that was all;
  ``kill``: stopped, it ends ``failed``; ``requeue``: stopped and put back in the queue).
  A card whose process list the node could not read (``GpuLive.processes_unreadable``: a
  process name broke its tool's table) judges no one, and no job over-using on it is
  stopped while it stays so: a forged row must never kill another job;
* idle cards (R30): a job whose GPUs all read at most ``IDLE_UTIL_PCT`` for
  ``limits.idle_after`` is marked (``Running.idle_since``; the queue shows "idle 3 h on
  2 GPUs"), an event and a line in its log; ``limits.idle_grace`` after that warning,
  ``limits.idle_action`` runs (``warn``: nothing more; ``cancel``: stopped, it ends
  ``cancelled``). ``--service`` jobs are exempt unless ``limits.idle_services``. A card
  that reports no utilisation (N/A) makes a job that is not visibly busy ``idle_unknown``
  (shown so, never marked idle nor acted on; see ``idleness``).

Stops go through ``Stops.stop`` (head/stops.py). How long a job has run is counted on the
monotonic clock from its start (``job_started``; a job running when this head started:
from its recorded start, when first seen), and so are the guard's and idleness's graces,
so a step of the wall clock (NTP, ``date -s``) stops nobody early.
A stop once begun is the store's (``JobTransitions.stop``): a head restarted during its grace
kills the job when that grace ends and does not signal it again. What is not yet a stop is
not kept: after a restart the guard's and idleness's clocks start again, and a job past its
time limit is stopped at the first turn.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..model import IDLE_UTIL_PCT, Job, JobState, Running, format_mb
from ..units import duration_text
from ..views import idle_text
from .jobs import JobTransitions
from .stops import Stops
from .state import HeadState

#: memory a job may hold beyond its reservation before the guard speaks: a CUDA context
#: and rounding are not what it is about (the scheduler counts every MiB all the same)
MEMORY_SLACK_MB = 256


@dataclass
class Overuse:
    """A job seen holding more than it reserved: since when, and where (GPU -> used, reserved)."""

    since: float  # on the monotonic clock: a step of the wall clock is no time over
    where: dict[str, tuple[int, int]] = field(default_factory=dict)
    acted: bool = False


IDLE, BUSY, UNKNOWN = "idle", "busy", "unknown"


def idleness(utilizations: list[float | None]) -> str | None:
    """What a job's cards' utilisation readings say: ``IDLE`` (every card reads at most
    ``IDLE_UTIL_PCT``), ``BUSY`` (one reads more), ``UNKNOWN`` (none reads more, but one
    reports no utilisation, N/A: memory held or a process present says nothing about work
    done, so such a job is neither marked idle nor acted on), None (no card read yet)."""
    if not utilizations:
        return None
    if any(u is not None and u > IDLE_UTIL_PCT for u in utilizations):
        return BUSY
    return UNKNOWN if None in utilizations else IDLE


class Limits:
    def __init__(self, state: HeadState, jobs: JobTransitions, stops: Stops):
        self.state = state
        self.jobs = jobs
        self.stops = stops
        #: SIGUSR1 .. SIGKILL: the isolation grace (R17), for every stop of the head's
        self.grace_s = state.config.health.isolation_grace_s
        self.over: dict[int, Overuse] = {}
        #: (job, GPU) the guard was told it cannot judge (no per-process memory there)
        self.unjudged: set[tuple[int, str]] = set()
        #: job -> since when its cards read idle, and when it was told so (monotonic clock:
        #: ``Running.idle_since`` is the wall clock's, for people)
        self.idle_from: dict[int, float] = {}
        self.idle_warned: dict[int, float] = {}
        #: job -> (attempt, its run time when first seen running, the monotonic clock then)
        self._seen_running: dict[int, tuple[int, float, float]] = {}

    @property
    def settings(self):
        """The ``limits:`` section now (a reload of nodes.yaml may change it)."""
        return self.state.config.limits

    def running(self) -> list[Job]:
        # A pool's jobs are its scheduler's to limit (their --time went with them).
        return [j for j in self.state.jobs.holders() if isinstance(j.status, Running) and j.pool is None]

    # ------------------------------------------------------------------ each turn
    def check(self) -> None:
        """Stop the jobs past their time limit; act on over-use and idleness past their grace."""
        now = self.state.monotonic()
        running = self.running()
        for job in running:
            limit = job.spec.time_limit_s
            if limit and self.run_time(job) >= limit:
                self._time_out(job, limit)
        ids = {job.id for job in running}
        for job_id in [j for j in self._seen_running if j not in ids]:
            del self._seen_running[job_id]
        self.unjudged = {(job_id, gpu) for job_id, gpu in self.unjudged if job_id in ids}
        self._memory_actions(now)
        self._idle_actions(now, running)

    def job_started(self, job: Job) -> None:
        """A job's run began (the engine wires this to ``JobTransitions.on_running``): its
        run time counts on the monotonic clock from now."""
        now = self.state.clock()
        self._seen_running[job.id] = (job.attempt, max(0.0, now - (job.started_at or now)),
                                      self.state.monotonic())

    def run_time(self, job: Job) -> float:
        """How long a running job has run, immune to steps of the wall clock (a job already
        running when this head started counts from its recorded start, once)."""
        seen = self._seen_running.get(job.id)
        if seen is None or seen[0] != job.attempt:
            self.job_started(job)
            seen = self._seen_running[job.id]
        return seen[1] + self.state.monotonic() - seen[2]

    def next_due(self) -> float | None:
        """Seconds until the next running job reaches its time limit (None: none has one)."""
        due = [j.spec.time_limit_s - self.run_time(j) for j in self.running() if j.spec.time_limit_s]
        return max(0.0, min(due)) if due else None

    def _time_out(self, job: Job, limit: float) -> None:
        why = f"stopped at its time limit (--time {duration_text(limit)})"
        if self.stops.stop(job, JobState.TIMEOUT, why, self.grace_s):
            self._tell(job, "limit", f"job {job.id} reached its time limit (--time {duration_text(limit)}): "
                                     f"SIGUSR1 now, SIGKILL in {self.grace_s:g} s if still running")

    # ------------------------------------------------------------------ after a probe
    def on_probe(self, node: str, uuids: list[str]) -> None:
        """What one node's probe (of GPUs ``uuids``) says of the memory its jobs hold and
        of their GPUs' use. Only that node's GPUs and jobs are looked at: a big cluster's
        nodes report every second."""
        held = self.state.jobs.holding
        jobs = {job_id for uuid in uuids for job_id in held.get(uuid, ())}
        self._memory(node, uuids, self.state.monotonic())
        self._idleness(jobs)

    # ------------------------------------------------------------------ the memory guard
    def _memory(self, node: str, uuids: list[str], now: float) -> None:
        seen: dict[int, dict[str, tuple[int, int]]] = {}
        gpus = self.state.gpus
        for uuid in uuids:
            live = gpus.get(uuid)
            if live is None or live.processes_unreadable:
                continue  # unknown: no one is judged on it
            self._cannot_judge(live, uuid)
            for job_id, used in live.job_used.items():
                job = self.state.jobs.get(job_id)
                if job is None or not job.state.holds_gpus:
                    continue
                mine = [p for p in job.placements if p.gpu_uuid == uuid]
                if mine and mine[0].exclusive:
                    continue  # the whole card is its own
                reserved = mine[0].memory_mb if mine else 0
                if used > reserved + MEMORY_SLACK_MB:
                    seen.setdefault(job_id, {})[uuid] = (used, reserved)
        for job_id, over in list(self.over.items()):
            job = self.state.jobs.get(job_id)
            if job is None or not job.state.holds_gpus:
                del self.over[job_id]
                continue
            for uuid in [u for u in over.where if u in gpus and gpus[u].node == node
                         and not gpus[u].processes_unreadable and u not in seen.get(job_id, {})]:
                del over.where[uuid]
            if not over.where:  # back within its reservation everywhere
                del self.over[job_id]
                self._tell(job, "guard", f"job {job_id} is back within its memory reservation", log=True)
        action = self.settings.memory_overuse
        for job_id, where in seen.items():
            job = self.state.jobs[job_id]
            known = self.over.get(job_id)
            if known is not None:
                known.where.update(where)
                continue
            self.over[job_id] = Overuse(now, dict(where))
            then = "" if action == "warn" else (
                f"; it will be {'killed' if action == 'kill' else 'requeued'} in "
                f"{duration_text(self.settings.memory_grace_s)} unless it gives the memory back")
            self._tell(job, "guard", f"job {job_id} holds {self.where_text(where)}{then}", log=True)

    def _cannot_judge(self, live, uuid: str) -> None:
        """Jobs on a slice of a card whose driver reports no per-process memory (WSL2):
        the guard says once, in the events and the job's log, that it cannot judge them
        there — and never acts on a guess."""
        for job_id in live.memory_unread:
            job = self.state.jobs.get(job_id)
            mine = [p for p in job.placements if p.gpu_uuid == uuid] if job is not None else []
            if job is None or not mine or mine[0].exclusive or (job_id, uuid) in self.unjudged:
                continue
            self.unjudged.add((job_id, uuid))
            self._tell(job, "guard", f"the memory guard cannot judge job {job_id} on "
                                     f"{live.node}:{live.reading.index}: the driver there reports no "
                                     "per-process GPU memory (N/A), so its reservation is not "
                                     "checked", log=True)

    def where_text(self, where: dict[str, tuple[int, int]]) -> str:
        """"20 GB on node01:0, over its 4 GB reservation"."""
        parts = []
        for uuid, (used, reserved) in where.items():
            live = self.state.gpus.get(uuid)
            card = f"{live.node}:{live.reading.index}" if live else uuid
            reservation = f"its {format_mb(reserved)} reservation" if reserved else "no reservation there"
            parts.append(f"{format_mb(used)} on {card}, over {reservation}")
        return "; ".join(parts)

    def _memory_actions(self, now: float) -> None:
        action, grace = self.settings.memory_overuse, self.settings.memory_grace_s
        if action == "warn":
            return
        for job_id, over in self.over.items():
            job = self.state.jobs.get(job_id)
            if job is None or over.acted or now - over.since < grace or any(
                    self.state.gpus[u].processes_unreadable for u in over.where if u in self.state.gpus):
                continue  # not while one of its cards cannot say who holds what
            what = self.where_text(over.where)
            if action == "kill":
                why = f"killed by the memory guard: held {what} for {duration_text(now - over.since)}"
                over.acted = self.stops.stop(job, JobState.FAILED, why, self.grace_s)
            else:
                why = f"requeued by the memory guard: held {what}"
                over.acted = self.stops.stop(job, JobState.PENDING, why, self.grace_s, requeue=True)
            if over.acted:
                self._tell(job, "guard", f"job {job_id} {why}", log=True)

    # ------------------------------------------------------------------ idle cards
    def _idleness(self, job_ids: set[int]) -> None:
        settings = self.settings
        if settings.idle_after_s is None:
            return
        gpus = self.state.gpus
        for job_id in job_ids:
            job = self.state.jobs.get(job_id)
            if job is None or not isinstance(job.status, Running) \
                    or (job.spec.service and not settings.idle_services):
                continue
            looks = idleness([gpus[p.gpu_uuid].reading.utilization_pct
                              for p in job.placements if p.gpu_uuid in gpus])
            since = job.status.idle_since
            if looks == IDLE and since is None:
                self.idle_from[job.id] = self.state.monotonic()
                self.jobs.mark_idle(job, self.state.clock())
            elif looks != IDLE and since is not None:
                self.idle_warned.pop(job.id, None)
                self.idle_from.pop(job.id, None)
            if looks != IDLE:
                self.jobs.mark_idle(job, None, unknown=looks == UNKNOWN)

    def _idle_actions(self, now: float, running: list[Job]) -> None:
        after, grace = self.settings.idle_after_s, self.settings.idle_grace_s
        cancel = self.settings.idle_action == "cancel"
        for job in running:  # (running: each job's status is a Running)
            if not isinstance(job.status, Running) or job.status.idle_since is None or after is None:
                continue
            since = self.idle_from.setdefault(job.id, now)  # marked before a restart: anew
            if now - since < after:
                continue
            text = idle_text(now - since, len(job.placements))
            warned = self.idle_warned.get(job.id)
            if warned is None:
                self.idle_warned[job.id] = now
                then = f"; it will be cancelled in {duration_text(grace)} unless it uses them" if cancel else ""
                self._tell(job, "idle", f"job {job.id} is {text}{then}", log=True)
            elif cancel and now - warned >= grace and self.stops.stop(
                    job, JobState.CANCELLED, f"cancelled: {text}", self.grace_s):
                self._tell(job, "idle", f"job {job.id} cancelled: {text}", log=True)
        for job_id in [j for j in self.idle_from if j not in self.state.jobs]:
            self.idle_from.pop(job_id)
            self.idle_warned.pop(job_id, None)

    def preempt(self, job: Job, why: str) -> bool:
        """A preemptible job yields its cards (the scheduler's ``Preempt``): stopped as at
        a time limit and requeued, its line in the events log (written with the stop) and
        in its own log. False when it is already being stopped, or no longer runs."""
        if not self.stops.stop(job, JobState.PENDING, why, self.grace_s, requeue=True, preemption=True):
            return False
        self.jobs.note(job, f"job {job.id} {why}: SIGUSR1 now, SIGKILL in {self.grace_s:g} s if "
                            "still running; then it waits in the queue again")
        return True

    # ------------------------------------------------------------------ telling
    def _tell(self, job: Job, kind: str, message: str, log: bool = False) -> None:
        """A line of the events log and, with ``log`` or at a time limit, the same line in
        the job's own log on each of its nodes."""
        self.state.record(kind, message, job_id=job.id, node=job.node)
        if log or kind == "limit":
            self.jobs.note(job, message)
