"""When each waiting job will start: the head's own scheduler run forward in virtual time
from a frozen snapshot of now.

Pure: ``forecast(snapshot, …)`` reads only the :class:`scheduler.Snapshot` a pass would
see (nodes as they are, running jobs, the waiting queue, bookings, preemptible work,
fair-share weights) and returns a :class:`Start` per waiting job. It runs the scheduler
once, with every job ending when it is *expected* to: a loop of passes of the real
``scheduler.schedule``, the decisions of one pass applied (a start takes its cards until
its end, a preemption frees the victim's cards and requeues it), then the clock jumps to
the next end or booking edge. That gives each job its *simulated* start.

What is assumed, and why a forecast moves: nobody new submits (a job submitted later with
a better standing goes ahead), jobs end at estimates, and fair-share weights grow only by
the GPU-hours the run's jobs hold (no decay, no admin's change).
What that costs on this cluster is measured: :class:`Calibration` learns, from each job
that started, how its wait compared with its simulated wait, and the forecast's interval
is the simulated wait stretched by what it learned.

How long a job runs is :func:`run_length`'s one answer, so the estimate can be changed in
one place.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from .. import scheduler
from ..model import charged_gpu_hours
from ..scheduler import fairshare
from ..wire import StartForecast

#: a forecast looks this far ahead; a job not started by then is "not within 7 days"
HORIZON_S = 7 * 86400.0
#: the most passes one run of the forecast makes (bounds its CPU on a pathological queue)
MAX_PASSES = 4000
#: a job without --time and without the cluster's max_time: the longest it may run
UNBOUNDED_LATE_S = HORIZON_S
#: a job without --time, max_time or history: what the expected run assumes (the median
#: GPU job of the public traces runs ~20 min, Philly's mean ~1.7 h); the scheduler's own
#: default (a day) is a bound for its reservations, not an expectation
UNTIMED_POINT_S = 3600.0
#: the share of its --time a job is expected to use: users ask for 1.5 to 4 times what
#: their jobs run
POINT_SHARE = 0.4
#: ends within this share of the wait so far (at least MIN_STEP_S) share one pass
STEP_SHARE = 0.05
MIN_STEP_S = 60.0
#: a preempted job yields its cards after its grace; the forecast waits this long for it
PREEMPT_GRACE_S = 60.0


#: a job's estimate is read from its like runs (or, with --time, the shares of it used)
#: once at least this many of them ran longer than it has so far
MIN_TAIL = 5


@dataclass(frozen=True)
class History:
    """How long jobs ran, as the head saw them end (what a job's expected run is read
    from), and how long those running now have run so far.

    ``like``: (user, GPUs, memory asked) -> its recent runs without --time (the history
    ``scheduler.estimates`` also reads); ``shares``: the share of its --time each recent
    job with one used. ``going_like``, ``going_shares``: the same of the jobs running now,
    so far (runs not yet ended: ``seeing`` fills them from a snapshot)."""

    like: Mapping[tuple, Sequence[float]] = field(default_factory=dict)
    shares: Sequence[float] = ()
    going_like: Mapping[tuple, Sequence[float]] = field(default_factory=dict)
    going_shares: Sequence[float] = ()

    def seeing(self, snap: scheduler.Snapshot) -> History:
        """This history with ``snap``'s running jobs' runs so far."""
        like: dict[tuple, list[float]] = {}
        shares = []
        for job in snap.running:
            ran = max(0.0, snap.now - job.started_at)
            if job.time_limit_s:
                shares.append(ran / job.time_limit_s)
            elif job.time_limit_s is None and not job.service:
                like.setdefault(_key(job), []).append(ran)
        return replace(self, going_like=like, going_shares=tuple(shares))


def residual(runs: Sequence[float], elapsed: float, going: Sequence[float] = ()) -> float | None:
    """How much longer a job that has run ``elapsed`` runs, by ``runs`` (how long like
    jobs ran) and ``going`` (how long like jobs still running have run so far): the median
    of its residual life, L − elapsed, over the like runs L longer than it — a
    heavy-tailed run that has gone long is likely to go on long. The runs still going
    count as the product-limit (Kaplan–Meier) estimate counts a run not yet ended, so the
    long runs not yet over do not make it short. None when fewer than ``MIN_TAIL`` ended
    runs were longer, or when the median lies past the longest of them."""
    ended = sorted(r for r in runs if r > elapsed)
    if len(ended) < MIN_TAIL:
        return None
    still = sorted(g for g in going if g > elapsed)
    at_risk, survival, leaving = len(ended) + len(still), 1.0, 0
    for run in ended:
        while leaving < len(still) and still[leaving] < run:
            leaving += 1
            at_risk -= 1
        survival *= 1.0 - 1.0 / at_risk
        at_risk -= 1
        if survival <= 0.5:
            return run - elapsed
    return None


def remaining(time_limit_s: float | None, elapsed: float, like: Sequence[float], past: History,
              max_time_s: float | None, service: bool = False, key: tuple | None = None) -> float:
    """How much longer a job that has run ``elapsed`` seconds (0: one not started) is
    expected to run: the one place a job's run in the forecast is decided. ``like``: its
    user's like runs without --time (``key`` names them in ``past.going_like``).

    With a --time: the residual life (``residual``) of the shares of their --time the
    lab's recent jobs used, at most what is left of the limit; with too few of them, a
    share (``POINT_SHARE``) of the limit, and once past that half-way to it. Without one:
    the residual life of its like runs; with too few of those, their median (else
    ``UNTIMED_POINT_S``), and once past that as long again as it ran
    (``estimates.expected_end``). A service without like runs runs until it is stopped.
    Never past the cluster's max_time (else the horizon)."""
    if time_limit_s is not None:
        left = max(0.0, time_limit_s - elapsed)
        share = residual(past.shares, elapsed / time_limit_s, past.going_shares) if time_limit_s > 0 else None
        if share is not None:
            return min(left, share * time_limit_s)
        point = POINT_SHARE * time_limit_s - elapsed
        return point if point > 0 else 0.5 * left
    late = max(0.0, (max_time_s or UNBOUNDED_LATE_S) - elapsed)
    if service and not like:
        return late
    rest = residual(like, elapsed, past.going_like.get(key, ()) if key else ())
    if rest is None:
        point = statistics.median(like) if like else UNTIMED_POINT_S
        rest = point - elapsed if elapsed < point else elapsed
    return min(rest, late)


def run_length(time_limit_s: float | None, runs: Sequence[float], max_time_s: float | None,
               kind: str, service: bool = False, past: History | None = None,
               key: tuple | None = None) -> float:
    """How long a job runs from its start: ``kind`` "point" the expected run
    (``remaining`` from 0), "late" the longest it may (its --time, else the cluster's
    max_time, else the horizon). ``runs``: its user's like runs without --time."""
    if kind == "late":
        return time_limit_s if time_limit_s is not None else (max_time_s or UNBOUNDED_LATE_S)
    return remaining(time_limit_s, 0.0, runs, past or History(), max_time_s, service, key)


def end_of(job: scheduler.RunningJob, now: float, max_time_s: float | None,
           runs: Sequence[float] = (), past: History | None = None) -> float:
    """When a running job is expected to end: now + ``remaining`` after what it ran."""
    return now + remaining(job.time_limit_s, max(0.0, now - job.started_at), runs, past or History(),
                           max_time_s, job.service, _key(job))


def _key(job: scheduler.RunningJob) -> tuple:
    """A running job's (user, GPUs, memory asked): the key of its user's history."""
    first = job.placements[0] if job.placements else None
    mem = None if first is None or first.exclusive else first.memory_mb
    return (job.user, len(job.placements), mem)


#: the calibration learns from the latest this many started jobs' first forecasts …
CALIBRATION_RUNS = 200
#: … and is used once it holds this many (before: ``DEFAULT_FACTORS``)
CALIBRATION_MIN = 20
#: waits are compared padded by this much (the scored waits' floor, 10 min): a job forecast
#: to start now that waited an hour counts, and a one-minute wait's ratio does not swing
PAD_S = 600.0
#: the interval: these quantiles of the ratio of the actual to the simulated (padded) wait
INTERVAL_QUANTILES = (0.1, 0.9)
#: (early, late) factors before the head has seen enough starts: a little narrower than the
#: lab months of docs/lab-month.md had learned by their end (0.54–0.66, 6.3–6.9)
DEFAULT_FACTORS = (0.5, 4.0)


class Calibration:
    """What the head learned of its own forecasts: for each of the latest started jobs that
    were forecast to wait, (actual wait + PAD_S) ÷ (simulated wait + PAD_S), both from when
    the forecast was made.

    The simulation knows no job not yet submitted (a user with a lighter fair share who
    submits later goes ahead) and ends jobs at estimates; the ratio measures what that
    costs on this cluster. The interval is the simulated wait stretched by its quantiles
    (``INTERVAL_QUANTILES``), so that it holds that share of starts on this cluster's own
    past. The expected start stays the simulated one: on the lab months, stretching it by
    the median ratio made it no better (docs/lab-month.md)."""

    def __init__(self, pairs: Iterable[tuple[float, float]] = ()) -> None:
        self.ratios: deque[float] = deque(maxlen=CALIBRATION_RUNS)
        for simulated, actual in pairs:
            self.learn(simulated, actual)

    def copy(self) -> Calibration:
        """A copy to read in a thread while the head's own learns on."""
        other = Calibration()
        other.ratios.extend(self.ratios)
        return other

    def learn(self, simulated_wait_s: float, actual_wait_s: float) -> None:
        self.ratios.append((max(0.0, actual_wait_s) + PAD_S) / (max(0.0, simulated_wait_s) + PAD_S))

    def factors(self) -> tuple[float, float]:
        """(early, late) factors of the padded wait."""
        if len(self.ratios) < CALIBRATION_MIN:
            return DEFAULT_FACTORS
        ratios = sorted(self.ratios)
        lo, hi = INTERVAL_QUANTILES
        return min(1.0, _quantile(ratios, lo)), max(1.0, _quantile(ratios, hi))

    def apply(self, now: float, simulated: float) -> tuple[float, float]:
        """The interval (early, late) around the simulated start ``simulated``."""
        padded = max(0.0, simulated - now) + PAD_S
        low, high = self.factors()
        return now + max(0.0, low * padded - PAD_S), now + high * padded - PAD_S


def _quantile(ordered: Sequence[float], q: float) -> float:
    k = (len(ordered) - 1) * q
    f = int(k)
    c = min(f + 1, len(ordered) - 1)
    return ordered[f] + (ordered[c] - ordered[f]) * (k - f)


@dataclass(frozen=True)
class Start:
    """A waiting job's forecast: ``at`` the expected start, ``early``…``late`` its interval
    (None: not within the horizon); ``after`` the job whose (estimated) end it waits for,
    when that job has no --time; ``node`` where it starts in the expected run."""

    at: float | None
    early: float | None
    late: float | None
    after: int | None = None
    node: str | None = None
    #: the start the scheduler's run gave, before the calibration: what it learns from
    simulated: float | None = None

    def json(self, now: float) -> StartForecast:
        return {"start_at": self.at, "early": self.early, "late": self.late,
                "after_job": self.after, "node": self.node, "made_at": now,
                "simulated_at": self.simulated, "within_s": HORIZON_S}


@dataclass
class _Run:
    """One run's result: each job's start time, the untimed job it waited for, its node."""

    starts: dict[int, float]
    after: dict[int, int]
    node: dict[int, str]


def simulate(snap: scheduler.Snapshot, length: Callable[[scheduler.PendingJob], float],
             end: Callable[[scheduler.RunningJob], float], horizon_s: float = HORIZON_S,
             stop_after: int | None = None, schedule=scheduler.schedule,
             step_share: float = STEP_SHARE,
             estimate: Callable[[scheduler.PendingJob], scheduler.Estimate] | None = None) -> _Run:
    """Run the scheduler forward from ``snap``: ``end`` gives each running job's end,
    ``length`` each waiting job's run once started (``estimate``: the scheduler's estimate
    of one without --time, which its reservations read once it runs). Stops when the queue is empty, at the
    horizon, or once job ``stop_after`` started."""
    now, stop = snap.now, snap.now + horizon_s
    running = {r.id: r for r in snap.running}
    ends = {r.id: end(r) for r in running.values()}
    untimed = {r.id for r in running.values() if r.time_limit_s is None}
    gpus = {g.uuid: g for g in snap.gpus}
    queue = {j.id: j for j in snap.queue}
    finished = dict(snap.finished)
    run = _Run({}, {}, {})
    edges = sorted({t for b in snap.bookings for t in (b.start, b.end) if t > now})
    freed_by: int | None = None
    holds = dict(snap.holds)  # the cards preempted for a job stay its own, as in the head
    # Fair share moves as the run goes: each user's weight grows by the GPU-hours their jobs
    # hold in it, as the head's does (a heavy user's waiting jobs fall back as theirs run).
    users = dict(snap.users)
    cards = {r.id: _cards(r, snap.config) for r in running.values()}
    for _ in range(MAX_PASSES):
        if not queue or now > stop:
            break
        view = replace(snap, now=now, gpus=tuple(gpus.values()), queue=tuple(queue.values()),
                       running=tuple(running.values()), finished=finished, users=users,
                       bookings=tuple(b for b in snap.bookings if b.end > now), holds=dict(holds))
        preempted = False
        for decision in schedule(view):
            if isinstance(decision, scheduler.Wait):
                if decision.holds:
                    holds[decision.job_id] = decision.holds
                else:
                    holds.pop(decision.job_id, None)
            if isinstance(decision, scheduler.Start):
                holds.pop(decision.job_id, None)
                job = queue.pop(decision.job_id)
                run.starts[job.id] = now
                run.node[job.id] = decision.placements[0].node if decision.placements else ""
                if freed_by is not None:
                    run.after[job.id] = freed_by
                running[job.id] = scheduler.RunningJob(
                    job.id, job.user, decision.placements, now, job.time_limit_s, job.service,
                    job.array_id, job.preemptible,
                    estimate(job) if estimate and job.time_limit_s is None else None)
                ends[job.id] = now + length(job)
                cards[job.id] = _cards(running[job.id], snap.config)
                if job.time_limit_s is None:
                    untimed.add(job.id)
                for p in decision.placements:
                    g = gpus[p.gpu_uuid]
                    gpus[p.gpu_uuid] = replace(g, placements=g.placements + ((job.id, p),))
            elif isinstance(decision, scheduler.Fail):
                queue.pop(decision.job_id, None)
            elif isinstance(decision, scheduler.Preempt):
                victim = running.get(decision.job_id)
                if victim is not None:  # it yields after its grace and waits again
                    ends[victim.id] = min(ends[victim.id], now + PREEMPT_GRACE_S)
                    preempted = True
        if stop_after is not None and stop_after in run.starts:
            break
        upcoming = [t for t in ends.values() if t > now] + [t for t in edges if t > now]
        if not upcoming:
            break
        # Ends close together share one pass: the further out, the coarser (a start hours
        # away is forecast to within STEP_SHARE of its wait, and a pass costs ~10 ms).
        first = min(upcoming)
        step = max(MIN_STEP_S, step_share * (first - snap.now))
        before, now = now, max(t for t in upcoming if t <= first + step)
        users = _charged(users, running.values(), cards, now - before)
        done = [job for job, t in ends.items() if t <= now]
        freed_by = next((job for job in done if job in untimed), None)
        for job_id in done:
            gone = running.pop(job_id)
            del ends[job_id]
            finished[job_id] = "succeeded"
            for p in gone.placements:
                g = gpus[p.gpu_uuid]
                gpus[p.gpu_uuid] = replace(g, placements=tuple(x for x in g.placements if x[0] != job_id),
                                           overuse=tuple(x for x in g.overuse if x[0] != job_id))
            if preempted and gone.preemptible:
                pending = scheduler.PendingJob(gone.id, gone.user, len(gone.placements),
                                               _slice_mb(gone), snap.now,
                                               max_nodes=len({p.node for p in gone.placements}),
                                               time_limit_s=gone.time_limit_s, preemptible=True)
                queue[gone.id] = pending
    return run


def _cards(job: scheduler.RunningJob, config: scheduler.SchedulerConfig) -> float:
    """The GPU-hours a running job is charged per hour it holds its cards, as the head
    charges it (``model.charged_gpu_hours``, with the lab's reference card and charge)."""
    return charged_gpu_hours([(p.memory_mb, p.exclusive) for p in job.placements], 3600.0,
                             config.charge_reference_mb, config.preemptible_charge if job.preemptible else 1.0)


def _charged(users: Mapping[str, scheduler.UserShare], running: Iterable[scheduler.RunningJob],
             cards: Mapping[int, float], seconds: float) -> dict[str, scheduler.UserShare]:
    """The users' fair-share standing after their running jobs held their cards ``seconds``
    longer (``fairshare.user_weight``: each GPU-hour adds ``PER_GPU_HOUR``)."""
    hours: dict[str, float] = {}
    for job in running:
        hours[job.user] = hours.get(job.user, 0.0) + cards.get(job.id, 0.0) * seconds / 3600.0
    now = dict(users)
    for user, used in hours.items():
        share = now.get(user) or scheduler.UserShare(user)
        now[user] = replace(share, weight=share.weight + fairshare.PER_GPU_HOUR * used)
    return now


def _slice_mb(job: scheduler.RunningJob) -> int | None:
    first = job.placements[0] if job.placements else None
    return None if first is None or first.exclusive else first.memory_mb


def forecast(snap: scheduler.Snapshot, max_time_s: float | None = None,
             horizon_s: float = HORIZON_S, only: int | None = None,
             schedule=scheduler.schedule,
             history: History | Mapping[tuple, Sequence[float]] | None = None,
             calibration: Calibration | None = None) -> dict[int, Start]:
    """Each waiting job's :class:`Start` (or only job ``only``'s: the run stops once it
    started). One run of the scheduler with every job ending when it is expected to
    gives each job its simulated start, the expected one; ``calibration`` (the head's,
    learned from its past forecasts; else its defaults) the interval around it.
    ``history``: (user, GPUs, memory asked) -> how long their recent jobs without --time
    ran (``Scheduling.history``), for the estimate of such a job."""
    known = (history if isinstance(history, History) else History(history or {})).seeing(snap)
    calibration = calibration or Calibration()

    def past(job: scheduler.PendingJob) -> tuple[float, ...]:
        return tuple(known.like.get((job.user, job.gpu_count, job.gpu_mem_mb), ()))

    def estimate(job: scheduler.PendingJob) -> scheduler.Estimate:
        return scheduler.run_estimate(job.time_limit_s, max_time_s, past(job))
    point = simulate(
        snap, lambda job: run_length(job.time_limit_s, past(job), max_time_s, "point", job.service, known,
                               (job.user, job.gpu_count, job.gpu_mem_mb)),
        lambda job: end_of(job, snap.now, max_time_s, known.like.get(_key(job), ()), known),
        horizon_s, only, schedule, STEP_SHARE, estimate)
    result = {}
    for job in snap.queue:
        if only is not None and job.id != only:
            continue
        simulated = point.starts.get(job.id)
        if simulated is None:
            result[job.id] = Start(None, None, None)
            continue
        # a start on the pass of now is the scheduler's own decision, not a forecast
        early, late = (calibration.apply(snap.now, simulated) if simulated > snap.now
                       else (simulated, simulated))
        result[job.id] = Start(simulated, early, late, point.after.get(job.id), point.node.get(job.id),
                               simulated)
    return result
