"""Preemptible (scavenger) jobs around one pass: they never delay a normal job.

A pass with preemptible jobs running or waiting is two walks of ``queue.py``'s pass:

1. the normal jobs, over a view of the cards where every preemptible job's allocation is
   gone (its cards free, for placement and for the R25 reservation alike). A start that
   lands on cards a preemptible job holds is not a start yet: the normal job waits with
   "would preempt job 41 (preemptible) — starting now", and each such preemptible job gets a
   :class:`Preempt` (the head stops it as it stops a job at its time limit: SIGUSR1, the
   grace, SIGKILL, requeued). The cards stay the normal job's for the rest of the walk, and
   the next pass after the preemptible job let go of them starts it;
   Bookings (``queue.py``'s ``bars``) hold in both walks; a preemptible job of another
   user on the cards of a booking whose window has begun gets a :class:`Preempt` too;
2. the preemptible jobs, over the real cards plus what the first walk started or claimed,
   in the same order rules among themselves (a user's fair share orders them but never
   keeps them off a free card), and without the quota's refusal when
   ``SchedulerConfig.preemptible_in_quota`` is off.

The cards a normal job preempted for stay its own until it starts (``Snapshot.holds``,
which the head keeps from each ``Wait.holds``): before the first walk, each such job, in
queue order, is placed over the real cards where only its own held cards lose their
preemptible jobs and every other job's held cards are taken; only the preemptible jobs on
its held cards yield (elsewhere it was placed beside them, as they are). So a normal job that comes
first in a later pass (a lighter user's, an admin's ``--priority`` one) cannot take them
during the victims' grace, nor a requeued preemptible job once they are free, and the
preemptor does not move on to other preemptible jobs' cards; a job that no longer fits
there (a held card left service) goes through the first walk as any other.

With ``quota_mode: scavenge`` a job of a user past their quota is one of the second walk's
too (never refused there): it runs only on cards no normal job wants, its ``Start`` says
``scavenger`` (the head makes it preemptible, charged as one), and while it waits its
reason begins :data:`OVER_QUOTA`.

A normal job's decision is thus the one it would get with no preemptible job anywhere, so
no normal job is ever preempted and none waits for a preemptible one
(``tests/unit/test_preemption.py`` checks both over random queues). An admin's ``--priority``
job comes first in the first walk, so it too starts at once by preempting.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import replace

from ..model import GpuView, Placement
from . import admission, queue
from .cards import Found
from .placement import Links, World
from .reasons import join_ids
from .snapshot import Decision, PendingJob, Preempt, RunningJob, SchedulerConfig, Snapshot, Start, UserShare, Wait


#: how a waiting job of a user past their quota is told so (quota_mode scavenge)
OVER_QUOTA = "over quota: runs only on idle cards"


def schedule(snapshot: Snapshot) -> list[Decision]:
    """The pass's decisions (``queue.schedule``'s), with preemptible jobs kept apart."""
    scavengers = {r.id for r in snapshot.running if r.preemptible}
    scavenge = snapshot.config.quota_mode == "scavenge"
    over = {name for name, share in snapshot.users.items()
            if share is not None and share.refusal} if scavenge else set()
    normal = tuple(j for j in snapshot.queue if not j.preemptible and j.user not in over)
    holds = {j.id: snapshot.holds[j.id] for j in normal if snapshot.holds.get(j.id)} if snapshot.holds else {}
    if not scavengers and not holds and not any(j.preemptible or j.user in over for j in snapshot.queue):
        return queue.schedule(snapshot)
    spare = tuple(j for j in snapshot.queue if j.preemptible or j.user in over)
    holders: dict[str, list[int]] = {}
    for view in snapshot.gpus:
        for job_id, _ in view.placements:
            if job_id in scavengers:
                holders.setdefault(view.uuid, []).append(job_id)
    jobs = {j.id: j for j in normal}
    held = _held_first(snapshot, holds, jobs, scavengers)
    from_hold = {d.job_id for d in held}
    first = queue.schedule(replace(
        snapshot, gpus=_with(tuple(_without(view, scavengers) for view in snapshot.gpus),
                             [_claim(jobs[d.job_id], d.placements, snapshot.now) for d in held]),
        queue=tuple(j for j in normal if j.id not in from_hold) if from_hold else normal,
        running=tuple(r for r in snapshot.running if not r.preemptible)
        + tuple(_claim(jobs[d.job_id], d.placements, snapshot.now) for d in held),
        waiting_elsewhere=snapshot.waiting_elsewhere | {j.id for j in spare} | from_hold))
    decisions: list[Decision] = []
    preempts = _booked_out(snapshot, holders)
    claimed: list[RunningJob] = []  # normal jobs' starts, and the cards they preempt for
    waiting: set[int] = set()
    wait = Wait
    for decision in held + first:
        if type(decision) is wait:  # most decisions of a long queue
            waiting.add(decision.job_id)
        elif isinstance(decision, Start):
            job = jobs[decision.job_id]
            claimed.append(_claim(job, decision.placements, snapshot.now))
            # A held job was placed beside the preemptible jobs of every card but its held
            # ones: only those yield (preempting the rest, which it fits beside, sent their
            # requeued copies back onto its freed cards, pass after pass at one instant).
            mine = {p.gpu_uuid for p in holds[job.id]} if job.id in from_hold else None
            victims = sorted({v for p in decision.placements if mine is None or p.gpu_uuid in mine
                              for v in holders.get(p.gpu_uuid, ())})
            if victims:
                for victim in victims:
                    preempts.setdefault(victim, Preempt(victim, job.id, job.user))
                decision = Wait(job.id, f"would preempt {join_ids(victims)} (preemptible) — starting now",
                                decision.placements)
                waiting.add(job.id)
        decisions.append(decision)
    if not spare:
        return decisions + list(preempts.values())
    taken = _with(snapshot.gpus, claimed)
    users = snapshot.users
    if not snapshot.config.preemptible_in_quota or scavenge:
        users = {name: share and UserShare(share.name, share.weight) for name, share in users.items()}
    second = queue.schedule(replace(
        snapshot, gpus=taken, queue=spare, running=snapshot.running + tuple(claimed), users=users,
        waiting_elsewhere=snapshot.waiting_elsewhere | waiting))
    if over:
        second = _over_quota_all(second, {j.id: j for j in spare}, over)
    return decisions + second + list(preempts.values())


class NothingFits:
    """The cards as a pass would see them, asked whether a request could start anywhere.

    A pass starts a job only where its request fits, and preempts only where a normal job
    fits once every preemptible job is gone; every other rule of the pass (reservations,
    bookings, the scarce machines, packing, the order) only keeps jobs off cards. So when
    no waiting job's request fits these cards with the preemptible jobs' allocations gone,
    a pass over them decides nothing but waits — unless it fails a job (a request that
    cannot be read, an --after that can no longer come true, a booking gone), which the
    caller rules out. Each distinct request is searched once while the cards stay these."""

    def __init__(self, gpus: tuple[GpuView, ...], topologies: Mapping[str, Links], services: Collection[int],
                 preemptible: set[int], config: SchedulerConfig, budgets: Mapping[str, float] | None = None) -> None:
        self.gpus = gpus
        self.world = World.build(tuple(_without(view, preemptible) for view in gpus), topologies, services,
                                 config, budgets)
        self._unfit: set[str] = set()  # request keys that fit nowhere

    def fits(self, job: PendingJob) -> bool:
        """Whether ``job``'s request fits some cards now (or cannot be read: a pass fails it)."""
        key = job.request_key
        if key in self._unfit:
            return False
        shape = admission.shape_of(job)
        if isinstance(shape, str) or isinstance(self.world.search(shape), Found):
            return True
        self._unfit.add(key)
        return False


def _claim(job: PendingJob, placements: tuple[Placement, ...], now: float) -> RunningJob:
    """A normal job's start, or the cards it waits for, as a running job on them."""
    return RunningJob(job.id, job.user, placements, now, job.time_limit_s, job.service, job.array_id)


def _held_first(snapshot: Snapshot, holds: dict[int, tuple[Placement, ...]], jobs: dict[int, PendingJob],
                scavengers: set[int]) -> list[Start]:
    """The jobs cards are held for, each (in queue order) placed over the real cards where
    its own held cards lose their preemptible jobs and the other held cards are taken:
    the starts found (on those cards, or on cards free now). A job that fits there no longer
    is left out, for the first walk."""
    if not holds:
        return []
    claims = {job_id: _claim(jobs[job_id], cards, snapshot.now) for job_id, cards in holds.items()}
    found: list[Start] = []
    others = frozenset(j.id for j in snapshot.queue)
    for job in queue.order([jobs[job_id] for job_id in holds], snapshot.users, snapshot.now,
                           snapshot.config.gang_age_s):
        mine = {p.gpu_uuid for p in holds[job.id]}
        rest = [claim for job_id, claim in claims.items() if job_id != job.id]
        yielding = {job_id for view in snapshot.gpus if view.uuid in mine
                    for job_id, _ in view.placements if job_id in scavengers}
        gpus = tuple(_without(view, scavengers) if view.uuid in mine else view for view in snapshot.gpus)
        decision = queue.schedule(replace(
            snapshot, gpus=_with(gpus, rest), queue=(job,),
            running=tuple(r for r in snapshot.running if r.id not in yielding) + tuple(rest),
            waiting_elsewhere=snapshot.waiting_elsewhere | (others - {job.id})))[0]
        if isinstance(decision, Start):
            claims[job.id] = _claim(job, decision.placements, snapshot.now)
            found.append(decision)
        else:
            del claims[job.id]
    return found


def _over_quota_all(decisions: list[Decision], jobs: dict[int, PendingJob], over: set[str]) -> list[Decision]:
    """The second walk's decisions, those of users past their quota as ``_over_quota``
    makes them: a wait's sentence made once per distinct reason (a long queue's over-quota
    jobs wait for a few reasons, pass after pass)."""
    said: dict[str, str] = {}
    wait = Wait
    out: list[Decision] = []
    append = out.append
    for d in decisions:
        job = jobs[d.job_id]
        if job.user not in over:
            append(d)
        elif type(d) is wait:
            text = said.get(d.reason)
            if text is None:
                text = said[d.reason] = f"{OVER_QUOTA}; {d.reason}"
            append(Wait(d.job_id, text))
        else:
            append(_over_quota(d, job))
    return out


def _over_quota(decision: Decision, job: PendingJob) -> Decision:
    """A decision for a job of a user past their quota: a start as a scavenger, a wait
    that says why it waits for idle cards."""
    if isinstance(decision, Start):
        return Start(decision.job_id, decision.placements, scavenger=not job.preemptible)
    if isinstance(decision, Wait):
        return Wait(decision.job_id, f"{OVER_QUOTA}; {decision.reason}")
    return decision


def _booked_out(snapshot: Snapshot, holders: dict[str, list[int]]) -> dict[int, Preempt]:
    """The preemptible jobs on the cards of a booking whose window has begun, other than
    its users': each is stopped (they may use booked cards only before the window)."""
    owners = {r.id: r.user for r in snapshot.running}
    found: dict[int, Preempt] = {}
    for booking in snapshot.bookings:
        if booking.start <= snapshot.now < booking.end:
            for uuid in booking.uuids:
                for job_id in holders.get(uuid, ()):
                    if owners.get(job_id) not in booking.users:
                        found.setdefault(job_id, Preempt(job_id, None, booking.name))
    return found


def _without(view: GpuView, jobs: set[int]) -> GpuView:
    """The card as a normal job sees it: the preemptible jobs' allocations gone."""
    if not any(job_id in jobs for job_id, _ in view.placements):
        return view
    return replace(view, placements=tuple(p for p in view.placements if p[0] not in jobs),
                   overuse=tuple(o for o in view.overuse if o[0] not in jobs))


def _with(views: tuple[GpuView, ...], claimed: list[RunningJob]) -> tuple[GpuView, ...]:
    """The cards with the first walk's starts and claims on them, for the second."""
    extra: dict[str, list[tuple[int, Placement]]] = {}
    for job in claimed:
        for placement in job.placements:
            extra.setdefault(placement.gpu_uuid, []).append((job.id, placement))
    if not extra:
        return views
    return tuple(replace(v, placements=v.placements + tuple(extra[v.uuid])) if v.uuid in extra else v
                 for v in views)
