"""One scheduling pass: order the queue, then start, hold or fail each job (R5–R8, R25).

Pure: the pass gets a frozen :class:`Snapshot` and returns one decision per pending job,
in the order the jobs were considered. The engine applies them.

The order (:func:`order`): admin priority (higher first), then fair-share weight (lower
first), then submit time, then id — except that a gang (2 or more cards) that has waited
``SchedulerConfig.gang_age_s`` comes right after the raised jobs, oldest first, so its
reservation is made before newer small work can take its cards. Walking it, each job is

1. failed when it can never run: a bad ``--arch``/``--cuda``, or an ``--after`` condition
   that can no longer come true (``ok``: the job failed, was cancelled, timed out, does
   not exist or will itself never run; ``notok``: it succeeded; ``started``: it ended
   without starting);
2. kept waiting while an ``--after`` job has not reached its condition, while its user
   is refused (the quota sentence from ``UserShare.refusal``), or while its array already
   runs as many tasks as its ``%N`` allows;
3. kept waiting, without holding anything, when no card in the cluster could ever serve it
   (no sm_120 anywhere, drivers too old, node drained…);
4. started on the best set of cards free now — except cards reserved for an earlier job,
   which it may use only when its ``--time`` ends before that reservation starts;
5. otherwise waiting, with what blocks the cards nearest to fitting (a job ahead in this
   pass, memory and who holds it, a service's spare, the 4-share limit, a power budget);
   each of the first :data:`RESERVATIONS` such requests, in queue order, gets a
   reservation (R25): the cards it will get earliest and no earlier reservation holds,
   from running jobs' start + ``--time`` — or, for a job without one, the estimate of
   ``estimates.py`` (max_time, its user's history, a stated default), which the
   reason names. A later job may use reserved cards only when its ``--time`` ends
   before that reservation starts.

Before each slice is placed the pass decides how (``World.set_packing``): while the
waiting whole-card jobs need every wholly free card there is, slices fill shared cards;
otherwise they go to the coolest, least shared card. Either way a slice breaks an idle card
of the lab's scarce gang machines (:meth:`_Pass._scarce`) only when no other card fits it.
Services together hold at most ``SchedulerConfig.service_share`` of the cards
(:meth:`_Pass.service_held`), so work that ends always has cards to run on.
Every start is applied to the pass's
view of the cards before the next job is considered. A request refused once stays refused
for the rest of the pass (a start only takes cards), so a long queue of jobs that cannot
start costs one dictionary look-up each.

Why one module: a pass is one walk over the queue whose steps share its state (the
world, the reservation, the refusals it remembers); the rules that stand alone are
``reasons.py``, ``admission.py``, ``fairshare.py``, and what a placement costs is
``placement.py``'s.
"""

from __future__ import annotations

import enum
import gc
import math
from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from operator import attrgetter, itemgetter
from typing import Final, Literal, NamedTuple

from ..model import takes_whole_card
from ..units import in_time
from . import admission
from .cards import Card, Found, Hardware, Shape
from .filters import Filter
from .estimates import expected_end, run_estimate
from .fairshare import order_key
from .placement import Missed, World
from .reasons import (best_now, blocked_text, blocker, blocker_rank, blockers_text, cards_text,
                      join_ids, memory_rank, needs)
from .snapshot import Decision, Fail, PendingJob, Snapshot, Start, UserShare, Wait


def order(queue: Sequence[PendingJob], users: Mapping[str, UserShare | None] | None = None, now: float | None = None,
          gang_age_s: float | None = None) -> list[PendingJob]:
    """The order jobs are considered in: priority, fair-share weight, submit time, id.

    That is ``fairshare.order_key``. A long queue is not sorted on tuples: jobs are grouped
    by their user's weight (a few dozen users own thousands of jobs), each group is sorted
    by submit time (each sort is stable and starts in id order), and the groups are joined
    lightest first. The few jobs an admin raised (or lowered) are sorted apart on the whole
    key and put before (or after) the rest.

    A gang (2 or more cards, not preemptible, of ordinary priority) that has waited
    ``gang_age_s`` by ``now`` is aged: it goes after the raised jobs and before every
    other, oldest first. Fair share alone would keep a heavy user's 4-card job behind
    every lighter user's new 1-card job, and each of those takes a card of the gang's
    machine as soon as one frees, before the gang's turn (and its reservation) comes; aged,
    its reservation is made first and newer small work only backfills around it.
    """
    users = users or {}
    weights = {name: 1.0 if share is None else share.weight for name, share in users.items()}
    by_user: dict[str, list[PendingJob]] = {}
    special = []  # jobs with a priority
    aged = []  # gangs that waited gang_age_s
    oldest = None if gang_age_s is None or now is None else now - gang_age_s
    for job in sorted(queue, key=_ID):  # each user's jobs, in id order
        if job.priority:
            special.append(job)
            continue
        if oldest is not None and job.gpu_count > 1 and job.submitted_at <= oldest and not job.preemptible:
            aged.append(job)
            continue
        mine = by_user.get(job.user)
        if mine is None:
            by_user[job.user] = [job]
        else:
            mine.append(job)
    groups: dict[float, list[PendingJob]] = {}
    mixed = set()  # weights shared by several users: their jobs are no longer in id order
    for user, mine in by_user.items():
        weight = weights.get(user, 1.0)
        group = groups.get(weight)
        if group is None:
            groups[weight] = mine
        else:
            group += mine
            mixed.add(weight)
    special.sort(key=lambda j: order_key(j.priority, weights.get(j.user, 1.0), j.submitted_at, j.id))
    jobs = [job for job in special if job.priority > 0]
    aged.sort(key=_SUBMITTED)  # stable: ties stay in id order
    jobs += aged
    for weight in sorted(groups):
        group = groups[weight]
        if weight in mixed:
            group.sort(key=_ID)
        group.sort(key=_SUBMITTED)
        jobs += group
    jobs += [job for job in special if job.priority < 0]
    return jobs


_ID, _SUBMITTED = attrgetter("id"), attrgetter("submitted_at")



#: how many blocked requests of one pass get a reservation, in queue order (Slurm's
#: sched/backfill tests up to bf_max_job_test = 100 jobs; a lab's queue of distinct
#: shapes is far shorter, and each costs a bisection)
RESERVATIONS = 16


@dataclass(frozen=True)
class Reservation:
    """Cards held for a blocked job from ``start`` (``math.inf``: unknown)."""

    job_id: int
    start: float
    uuids: frozenset[str]
    text: str  # "node02:0-3"
    #: how the start was estimated where a job it waits for has no --time ("" otherwise)
    basis: str = ""


def schedule(snapshot: Snapshot) -> list[Decision]:
    """Decide, for every pending job, to start it, let it wait (with why), or fail it."""
    # A pass makes a great many short-lived objects and leaves no garbage it needs back
    # during the pass; the cyclic collector would walk every object of the process (the
    # whole head, in the service) several times per pass. It runs again afterwards.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _Pass(snapshot).run()
    finally:
        if collecting:
            gc.enable()


class _Unknown(enum.Enum):
    """Not worked out yet (a cache's answer may itself be None)."""

    UNKNOWN = 0


_UNKNOWN: Final = _Unknown.UNKNOWN
#: the cards bookings keep a job off, named for the search's cache (Bars.token)
Token = tuple[object, ...]
#: which reservations' cards a refused request was kept off (their numbers: ``()`` for
#: none), and with bookings, their token too: the key of ``_Request.refused``
RefusalKey = tuple[int, ...] | tuple[tuple[int, ...], Token]
#: why no card could serve a request, as admission words it: ("what" | "plain", the end)
Refused = tuple[str, str]


class _Sized(NamedTuple):
    """The hardware classes that pass a request's filters and could hold one share when
    empty, each node's count of such cards (most first), and their total."""

    kept: frozenset[Hardware]
    counts: list[int]
    total: int


_KEY = attrgetter("request_key")
_FIRST = itemgetter(0)
#: how many of the nearest blocked cards a waiting reason puts in words (cards blocked
#: alike are named together, and two kinds of blocker are shown)
_PHRASED = 8
#: how many usable cards a waiting reason looks at, at most (every card of a lab of 3–20
#: machines; a 1,000-card cluster's passes stay fast)
_SCANNED = 256
#: --after's words in reasons: (what the job waits for, the flag as written)
_AFTER_WAIT = {"ok": "to finish", "any": "to end", "notok": "to end", "started": "to start"}
_AFTER_FLAG = {"ok": "--after", "any": "--after any", "notok": "--after notok",
               "started": "--after started"}
_ENDED = {"cancelled": "was cancelled", "timeout": "ran out of time", "failed": "failed"}


class _Request:
    """One distinct request of the pass (jobs with equal shapes share it) and what the pass
    learned about it: why it can never run, and why it was refused (by ``may_use``).
    ``quick``: the reason every job of the request now waits with, whatever its --time
    (None while that depends on the job, or nothing is known yet)."""

    __slots__ = ("shape", "impossible", "refused", "quick")

    def __init__(self, shape: Shape | str) -> None:
        self.shape = shape
        self.impossible: str | None | Literal[_Unknown.UNKNOWN] = _UNKNOWN
        self.refused: dict[RefusalKey, str] = {}
        self.quick: str | None = None

    def judged(self, impossible: str | None) -> None:
        self.impossible = impossible
        self.quick = impossible or None

    def refuse(self, may_use: RefusalKey, reason: str) -> None:
        """Record that jobs kept off the reservations numbered in ``may_use`` (``()``: none)
        cannot start (with bookings: ``(may_use, the bookings' token)``)."""
        self.refused[may_use] = reason
        # refused[()] (every card) also answers jobs kept off reserved cards, unless they
        # have their own sentence
        self.quick = None if any(key != () for key in self.refused) else self.refused.get(())


@dataclass(frozen=True)
class Bars:
    """What bookings keep one job off (:meth:`_Pass.bars`): the cards, a token naming
    them for the search's cache (None: nothing), the sentences that say so, and the cards
    of active bookings it is one of the users of (tried first)."""

    excluded: frozenset[str] = frozenset()
    token: Token | None = None
    texts: tuple[str, ...] = ()
    own: frozenset[str] = frozenset()


_NO_BARS = Bars()


class _Pass:
    world_class = World  # the tests' straightforward reference pass swaps in its own

    def __init__(self, snapshot: Snapshot) -> None:
        self.snap = snapshot
        self.config = snapshot.config
        self.now = snapshot.now
        services = {r.id for r in snapshot.running if r.service}
        self.world = self.world_class.build(snapshot.gpus, snapshot.topologies, services, self.config,
                                            snapshot.power_budgets)
        #: each running job's end by its --time or, without one, by its estimate
        self.ends: dict[int, float | None] = {
            r.id: expected_end(r.started_at, self.now, r.estimate or run_estimate(r.time_limit_s))
            for r in snapshot.running}
        #: running jobs without --time -> what their end is estimated from
        self.basis: dict[int, str] = {r.id: (r.estimate or run_estimate(None)).basis
                                      for r in snapshot.running if r.time_limit_s is None}
        self.holding = self.world.holders()  # jobs holding cards, those started by the pass too
        self.running_ids = set(self.ends) | self.holding
        self.queue = dict(zip(map(_ID, snapshot.queue), snapshot.queue))
        self.node_order = {node: cards[0].order for node, cards in self.world.by_node.items()}
        self.requests: dict[str, _Request] = {}  # by PendingJob.request_key
        self.by_shape: dict[Shape, _Request] = {}  # equal shapes share one request
        self.fates: dict[int, tuple[str, str]] = {}
        #: what each filter's hardware classes are, and each (filter, memory, service)'s
        #: sized classes and counts (:meth:`_hardware`, :meth:`_sized`); ``_counted``:
        #: counts by the classes kept (and nodes: -w/-x), shared by filters that keep alike
        self._by_filter: dict[Filter, Refused | frozenset[Hardware]] = {}
        self._by_size: dict[tuple[Filter, int | None, bool], Refused | _Sized] = {}
        self._counted: dict[object, _Sized] = {}
        self.reservations: list[Reservation] = []
        self.reserved: frozenset[str] = frozenset()  # every reservation's cards
        self.reservations_tried = 0
        self._avoids: dict[tuple[float | None, int], tuple[int, ...]] = {}  # (--time, reservations) -> avoids
        self._timeline: tuple[list[float], list[int], list[float]] | None = None  # see timeline()
        self.ahead: set[int] = set()  # jobs this pass started, in the order it did
        #: per array, how many of its tasks hold cards (those this pass started too)
        self.array_running = Counter(r.array_id for r in snapshot.running if r.array_id is not None)
        #: (memory, service, filter, node or None, world's changes) -> blockers' text
        self._blockers: dict[tuple[int | None, bool, Filter, str | None, int], str] = {}
        #: (memory, service) -> card state (Card.state, or a state_key: Card.first) -> memory_rank
        self._ranks: dict[tuple[int | None, bool],
                          dict[int | tuple[object, ...], tuple[int, float] | None]] = {}
        self.whole_keys: set[str] = set()
        self.whole_demand = self._whole_demand()
        self.bookings = tuple(b for b in snapshot.bookings if b.end > self.now)
        self._bars: dict[tuple[str, str | None, tuple[bool, ...]], Bars] = {}
        #: the lab's scarcest machines (:meth:`_scarce`), their cards, and the most cards
        #: any other machine has
        self.scarce, self.scarce_cards, self.scarce_rest = self._scarce()

    def run(self) -> list[Decision]:
        jobs = order(self.snap.queue, self.snap.users, self.now, self.config.gang_age_s)
        get, request = self.requests.get, self.request  # each job's request: alike share one
        refusing = {name for name, share in self.snap.users.items() if share is not None and share.refusal}
        decisions: list[Decision] = []
        append, decide = decisions.append, self.decide
        quick_ok = not self.bookings  # with bookings, what a job may use depends on it
        for job in jobs:
            req = get(job.request_key) or request(job)
            # The common cases first, inline: a job without --after whose request was already
            # refused in this pass (a start only takes cards) waits with the same sentence,
            # and so does one no card of the cluster could ever serve.
            if quick_ok and not job.after and job.array_id is None and job.user not in refusing:
                quick = req.quick
                if quick is not None:
                    append(Wait(job.id, quick))
                    continue
                refused = req.refused
                if refused:  # the reason may depend on which reserved cards the job may use
                    reason = refused.get(self.avoids(job))
                    if reason is not None:
                        append(Wait(job.id, reason))
                        continue
            append(decide(job, req))
        return decisions

    def _whole_demand(self) -> int:
        """How many whole cards the waiting jobs that take cards whole ask for, all told
        (those no card could ever serve left out): while they need every wholly free card
        there is, slices pack onto shared cards."""
        queue = self.snap.queue
        counts = Counter(map(_KEY, queue))
        demand = 0
        for key, job in dict(zip(map(_KEY, queue), queue)).items():
            shape = self.request(job).shape
            if isinstance(shape, str) or self.impossible(shape):
                continue
            mem = shape.gpu_mem_mb
            sized = self._sized(shape)  # (what a possible request is)
            if mem is not None and isinstance(sized, _Sized) and not any(
                    hw[3] is not None and takes_whole_card(hw[3], mem) for hw in sized.kept):
                continue
            self.whole_keys.add(key)
            demand += counts[key] * shape.gpu_count
        return demand

    def _scarce(self) -> tuple[tuple[str, ...], frozenset[str], int]:
        """The machines that alone can hold the lab's largest gangs: those with the most
        cards, when they are at most a quarter of the machines and have more than any other
        (the demo lab's one 4-card machine of six; not a lab of 20 alike, nor two); their
        cards; and the most cards any other machine has (0: no machine is scarce)."""
        sizes = {node: len(cards) for node, cards in self.world.by_node.items()}
        top = max(sizes.values(), default=0)
        scarce = tuple(node for node, n in sizes.items() if n == top)
        rest = max((n for n in sizes.values() if n < top), default=0)
        if top < 2 or not rest or 4 * len(scarce) > len(sizes):
            return (), frozenset(), 0
        return scarce, frozenset(c.uuid for node in scarce for c in self.world.by_node[node]), rest

    @staticmethod
    def keeps_off(job: PendingJob) -> bool:
        """Whether the scarce machines' rule applies: not to preemptible work (it yields),
        a job an admin raised, one that runs in a booking, or a gang that may span nodes
        (it takes the fewest, whichever they are)."""
        return not job.preemptible and job.priority <= 0 and job.reservation is None and job.max_nodes == 1

    def keep_off_scarce(self, job: PendingJob, shape: Shape, bars: Bars,
                        avoid: tuple[int, ...]) -> Decision | None:
        """A job without --time (a service, most of all) holds its cards with no end the
        plan can count on: on the only machines that hold the lab's largest gangs it would keep
        them from ever draining (the built-in month's one 4-GPU service held the demo
        lab's only 4-GPU machine for its last nine days, and every 4-GPU job submitted
        after it never ran). Such a job starts elsewhere when another card fits it now. A
        service never takes those machines: one only they can hold waits, saying how it
        runs there (in a booking, or submitted with an admin's --priority); another waits
        for another machine. None: decide as for any job."""
        found = self.search(shape, bars.excluded | self.scarce_cards, ("scarce", bars.token), avoid)
        if isinstance(found, Found):
            return self.start(job, found)
        only_there = shape.gpu_mem_mb is None and shape.gpu_count > self.scarce_rest
        if not job.service or not only_there and not isinstance(
                self.search(shape, bars.excluded, bars.token, avoid), Found):
            return None  # a job without --time may go there; nothing fits the service now anyway
        names = ", ".join(self.scarce)
        one = len(self.scarce) == 1
        text = (f"a service would hold {names} with no end, {'the only machine' if one else 'the only machines'} "
                f"with more than {self.scarce_rest} GPUs, so no job that needs {'it' if one else 'them'} "
                "could run")
        if only_there:
            return Wait(job.id, f"{text}; it runs there in a booking (`nebula reserve`, then "
                                "--reservation) or submitted with an admin's --priority")
        return Wait(job.id, f"needs {needs(shape)}; only {names} {'has' if one else 'have'} it free now, "
                            f"and {text}; it waits for another machine")

    def service_held(self, job: PendingJob, shape: Shape, bars: Bars,
                     avoid: tuple[int, ...]) -> Decision | None:
        """A service holds its cards with no end: the concentrated month's second 2-card
        service took the last two whole cards outside the gang machine for its last five
        days, and the 1-card jobs that came after waited p95 893 min where slurm-like's
        (which left that service waiting) waited 320. So services together hold at most
        ``service_share`` of the lab's cards; past it a service only fills a card a service
        already holds (a slice), or waits for one to end. The first service always may
        start (a small lab's only service is never refused). None: decide as for any job."""
        takers = [c for cards in self.world.takers.values() for c in cards]
        held = frozenset(c.uuid for c in takers if c.service)
        room = math.floor(self.config.service_share * len(takers)) - len(held)
        if not held or room >= shape.gpu_count:
            return None
        if shape.gpu_mem_mb is not None:  # a slice may still share a card a service holds
            others = frozenset(c.uuid for c in takers if not c.service)
            found = self.search(shape, bars.excluded | others, ("services", bars.token, held), avoid)
            if isinstance(found, Found):
                return self.start(job, found)
        return Wait(job.id, f"services hold {len(held)} of the lab's {len(takers)} cards, the most they may "
                            f"({self.config.service_share:.0%}, scheduler.service_share), so work that ends "
                            "keeps cards to run on; it waits for a service to end")

    def scarce_idle(self) -> frozenset[str]:
        """The scarce machines' cards that hold nothing now. A slice breaks such a card
        for the lab's largest gangs (a 4-card job needs all four of the one 4-card
        machine whole), so a slice takes any other card that fits it first — one already
        shared, or a card of another machine — and one of these only when none does."""
        return frozenset(c.uuid for node in self.scarce for c in self.world.by_node[node]
                         if not c.allocs)

    # ------------------------------------------------------------ one job
    def decide(self, job: PendingJob, req: _Request | None = None) -> Decision:
        if req is None:
            req = self.request(job)
        shape = req.shape
        if job.after:
            fate, why = self.fate(job.id)
            if fate == "fail":
                return Fail(job.id, why + "; this job will not run")
            if fate == "wait":
                return Wait(job.id, why)
        # the fate of a job without --after is its request's alone (with --after, fate
        # has failed a request that cannot be understood)
        if isinstance(shape, str):
            return Fail(job.id, shape)
        share = self.snap.users.get(job.user)
        if share is not None and share.refusal:
            return Wait(job.id, share.refusal)
        if job.array_id is not None and job.array_limit is not None \
                and self.array_running[job.array_id] >= job.array_limit:
            return Wait(job.id, f"array {job.array_id} runs at most {job.array_limit} tasks at once "
                                f"(%{job.array_limit}); waits for one of them to end")
        impossible = req.impossible
        if impossible is _UNKNOWN:
            impossible = self._impossible(shape)
            req.judged(impossible)
        if impossible:
            return Wait(job.id, impossible)
        bars = self.bars(job) if self.bookings else _NO_BARS
        if job.reservation is not None:
            booked = self.booked_for(job, bars)
            if not isinstance(booked, Bars):
                return booked
            bars = booked
        avoid = self.avoids(job)
        if shape.gpu_mem_mb is not None:
            # A slice without an end holds its card for as long as it likes: it fills a shared
            # card even while no whole-card job waits, or it would break a whole card for good.
            demand = self.whole_demand
            self.world.set_packing(job.service or demand > 0 and self.world.whole_free <= demand)
        if job.service and self.config.service_share < 1 and self.keeps_off(job):
            held = self.service_held(job, shape, bars, avoid)
            if held is not None:
                return held
        if self.scarce and job.time_limit_s is None and self.keeps_off(job):
            kept = self.keep_off_scarce(job, shape, bars, avoid)
            if kept is not None:
                return kept
        key: RefusalKey = avoid if bars.token is None else (avoid, bars.token)
        refused = req.refused
        if refused:
            reason = refused.get(key) or refused.get(() if bars.token is None else ((), bars.token))
            if reason is not None:
                return Wait(job.id, reason)
        if shape.gpu_mem_mb is not None:
            if self.scarce and self.keeps_off(job):
                idle = self.scarce_idle()
                if idle:  # a card elsewhere (a shared one first, when packing) before one of these
                    found = self.search(shape, bars.excluded | idle, ("scarce idle", bars.token, idle), avoid)
                    if isinstance(found, Found):
                        return self.start(job, found)
        if bars.own:  # its own booking's cards first, so the others stay for everyone
            found = self.search(shape, bars.excluded | self.others(bars.own), ("own", bars.token, bars.own),
                                avoid)
            if isinstance(found, Found):
                return self.start(job, found)
        found = self.search(shape, bars.excluded, bars.token, avoid)
        if isinstance(found, Found):
            return self.start(job, found)
        if avoid and isinstance(self.search(shape, bars.excluded, bars.token), Found):
            holder = self.reservations[avoid[0]]
            reason = f"held for job {holder.job_id} ({holder.text} reserved for it; {self.estimate(holder)})"
            req.refuse(key, reason)
            return Wait(job.id, reason)
        if bars.token is not None and isinstance(self.search(shape, frozenset(), None, avoid),
                                                 Found):
            reason = "; ".join(bars.texts)
            if any(b.start > self.now and b.name in bars.token for b in self.bookings):
                reason += " (a job whose --time ends before then may use them now)"
            req.refuse(key, reason)
            return Wait(job.id, reason)
        f = shape.filter
        if (f.nodes is not None or f.excluded) and isinstance(self.search(
                replace(shape, filter=replace(f, nodes=None, excluded=frozenset())),
                bars.excluded, bars.token, avoid), Found):
            reason = (f"needs {needs(shape)}; held by -w/-x alone: other nodes have "
                      "what it needs free now")
            req.refuse(key, reason)
            return Wait(job.id, reason)

        reason = f"needs {needs(shape)}; {best_now(found.counts, shape, self.node_order)}"
        why = self.blockers(shape, found.counts)
        if why:
            reason += f": {why}" if reason.endswith("none is free now") else f"; {why}"
        req.refuse(() if bars.token is None else ((), bars.token), reason)
        if self.reservations_tried < RESERVATIONS:
            self.reservations_tried += 1
            res = self.reserve(job, shape)
            if res is not None:
                self.reservations.append(res)
                self.reserved = self.reserved | res.uuids
                if math.isfinite(res.start):
                    reason += f"; {res.text} reserved for it, {self.estimate(res)}"
        return Wait(job.id, reason)

    def avoids(self, job: PendingJob) -> tuple[int, ...]:
        """The reservations whose cards ``job`` may not use: those that start before its
        --time would end (all of them, for a job without one)."""
        if not self.reservations:
            return ()
        # asked for every job the quick path meets once reservations exist: the answer
        # depends on its --time alone until the next reservation, so it is kept per --time
        limit = job.time_limit_s
        key = (limit, len(self.reservations))
        got = self._avoids.get(key)
        if got is None:
            if limit is None:
                got = tuple(range(len(self.reservations)))
            else:
                ends = self.now + limit
                got = tuple(i for i, res in enumerate(self.reservations) if ends > res.start)
            self._avoids[key] = got
        return got

    def search(self, shape: Shape, excluded: frozenset[str], token: object, avoid: tuple[int, ...] = ()
               ) -> Found | Missed:
        """``World.search`` without the ``excluded`` cards (named by ``token``; None:
        none) nor the cards of the reservations numbered in ``avoid``."""
        if avoid:
            held = frozenset[str]().union(*(self.reservations[i].uuids for i in avoid))
            excluded, token = excluded | held, (("reserved", avoid), token)
        return self.world.search(shape) if token is None else self.world.search(shape, excluded, token)

    # ------------------------------------------------------------ bookings
    def bars(self, job: PendingJob) -> Bars:
        """What the bookings keep ``job`` off now. Inside a booking's window its cards are
        its users' (and those of jobs that name it); before it, they take a job whose
        --time ends before it starts, or a preemptible one (stopped when it starts)."""
        now = self.now
        clear = tuple(b.start > now and (job.preemptible or (job.time_limit_s is not None
                                                                 and now + job.time_limit_s <= b.start))
                      for b in self.bookings)
        key = (job.user, job.reservation, clear)
        got = self._bars.get(key)
        if got is None:
            excluded: set[str] = set()
            own: set[str] = set()
            names: list[str] = []
            texts: list[str] = []
            for booking, ok in zip(self.bookings, clear):
                if booking.start <= now and (job.user in booking.users or job.reservation == booking.name):
                    own |= booking.uuids
                elif not ok:
                    excluded |= booking.uuids
                    names.append(booking.name)
                    texts.append(booking.text)
            own -= excluded  # a card of its booking that a later booking needs before it ends
            got = self._bars[key] = Bars(frozenset(excluded), ("booked", *names) if names else None,
                                         tuple(texts), frozenset(own))
        return got

    def booked_for(self, job: PendingJob, bars: Bars) -> Bars | Decision:
        """A job that names its booking (--reservation) runs on its cards only, in its window."""
        booking = next((b for b in self.bookings if b.name == job.reservation), None)
        if booking is None:
            return Fail(job.id, f"booking {job.reservation} has ended or was deleted "
                                "(--reservation); this job will not run")
        if booking.start > self.now:
            return Wait(job.id, f"waits for its booking: {booking.text}")
        return Bars(bars.excluded | self.others(booking.uuids), ("only", booking.name, bars.token),
                    bars.texts, frozenset())

    def others(self, uuids: frozenset[str]) -> frozenset[str]:
        return frozenset(c.uuid for c in self.world.cards if c.uuid not in uuids)

    def start(self, job: PendingJob, found: Found) -> Start:
        placements = self.world.apply(job.id, found, job.service)
        self.running_ids.add(job.id)
        self.holding.add(job.id)
        self.ahead.add(job.id)
        if job.array_id is not None:
            self.array_running[job.array_id] += 1
        if job.request_key in self.whole_keys:
            self.whole_demand = max(0, self.whole_demand - job.gpu_count)
        estimate = run_estimate(job.time_limit_s)
        end = self.ends[job.id] = self.now + estimate.seconds
        self._on_timeline(job.id, end)
        if job.time_limit_s is None:
            self.basis[job.id] = estimate.basis
        return Start(job.id, placements)

    def estimate(self, res: Reservation) -> str:
        """"estimated start in ~25 min" (and, where a job it waits for has no --time,
        what that job's end was estimated from)."""
        text = f"estimated start {in_time(max(0.0, res.start - self.now))}"
        return f"{text} ({res.basis})" if res.basis else text

    def blockers(self, shape: Shape, counts: Mapping[str, int]) -> str:
        """What blocks the cards nearest to fitting ``shape`` now: on the node that came
        closest when some cards fit, else anywhere (:func:`reasons.blocker`).

        Only the nearest few cards are put in words. How near a card came depends on its
        state alone (Card.state) unless a job of this pass holds it or its node has a
        power budget, so cards alike are ranked once per request class. A cluster of more
        than ``_SCANNED`` usable cards is looked at in listing order up to that many: its
        reasons name real blockers, not always the nearest.
        """
        best = [n for n, c in counts.items() if c]
        node = None
        if best:
            order = self.node_order
            node = min(best, key=lambda n: (-counts[n], order[n]))
        world = self.world
        key = (shape.gpu_mem_mb, shape.service, shape.filter, node, world.changes())
        text = self._blockers.get(key)
        if text is not None:
            return text
        eligible = world.eligible(shape)
        pools = [eligible.get(node, [])] if node is not None else eligible.values()
        spare, power, ahead, touched = self.config.service_spare_mb, world.power, self.ahead, world.touched
        by_state = self._ranks.setdefault((shape.gpu_mem_mb, shape.service), {})
        ranked: list[tuple[tuple[float, ...], Card]] = []
        left = _SCANNED
        for cards in pools:
            if left <= 0:
                break
            if len(cards) > left:
                cards = cards[:left]
            left -= len(cards)
            for card in cards:
                rank: tuple[float, ...] | None
                if card.node in power:
                    rank = blocker_rank(card, shape, spare, power[card.node])
                else:  # what memory_rank says of a state, asked once per state
                    kind = by_state.get(card.state, _UNKNOWN)
                    if kind is _UNKNOWN:
                        kind = by_state[card.state] = memory_rank(card.state_key(), shape, spare)
                    rank = None
                    if kind is not None:
                        if card.uuid in touched:  # did jobs of this pass take what it had?
                            before = by_state.get(card.first, _UNKNOWN)
                            if before is _UNKNOWN:
                                before = by_state[card.first] = memory_rank(card.first, shape, spare)
                            if before is None:
                                kind = (0, 0)
                        rank = kind + (card.order,)
                if rank is not None:
                    ranked.append((rank, card))
        ranked.sort(key=_FIRST)
        # (a card with a rank has a blocker: both read the same rule)
        found = [(card, why[1]) for _, card in ranked[:_PHRASED]
                 if (why := blocker(card, shape, spare, power.get(card.node))) is not None]
        text = self._blockers[key] = blockers_text(found, ahead)
        return text

    # ------------------------------------------------------------ requests
    def request(self, job: PendingJob) -> _Request:
        key = job.request_key
        req = self.requests.get(key)
        if req is None:
            shape = admission.shape_of(job)
            if isinstance(shape, Shape):
                req = self.by_shape.get(shape)
                if req is None:
                    req = self.by_shape[shape] = _Request(shape)
            else:
                req = _Request(shape)
            self.requests[key] = req
        return req

    def shape(self, job: PendingJob) -> Shape | str:
        """The job's request, or the sentence saying why it cannot be understood."""
        return self.request(job).shape

    def fate(self, job_id: int, visiting: frozenset[int] = frozenset()) -> tuple[str, str]:
        """("ok" | "wait" | "fail", why) from the job's own request and its --after chain;
        ``why`` of a failure is the cause alone (decide adds what follows from it)."""
        if job_id in self.fates:
            return self.fates[job_id]
        job = self.queue[job_id]
        shape = self.shape(job)
        kind = job.after_type
        flag = _AFTER_FLAG.get(kind, "--after")
        if isinstance(shape, str):
            result = ("fail", shape)
        elif kind not in _AFTER_WAIT:
            result = ("fail", f"--after {kind}: is not a kind of dependency (ok, any, notok, started)")
        else:
            failed, waiting = [], []
            for dep in job.after:
                state = self.snap.finished.get(dep)
                if dep == job_id or dep in visiting:
                    failed.append(f"--after job {dep} waits for this job (a cycle)")
                elif state is not None:
                    why = self._ended(kind, state, dep not in self.snap.never_ran)
                    if why:
                        failed.append(f"job {dep} ({flag}) {why}")
                elif dep in self.running_ids:
                    if kind != "started":
                        waiting.append(dep)
                elif dep in self.queue:
                    dep_fate, dep_why = self.fate(dep, visiting | {job_id})
                    if dep_fate == "fail" and kind in ("ok", "started"):
                        failed.append(f"job {dep} ({flag}) cannot run: {dep_why}")
                    else:  # it will start, or end (failing, for any and notok)
                        waiting.append(dep)
                elif dep in self.snap.waiting_elsewhere:  # the other stage's (preemption.py)
                    waiting.append(dep)
                else:
                    failed.append(f"job {dep} ({flag}) does not exist")
            if failed:
                result = ("fail", failed[0])
            elif waiting:
                result = ("wait", f"waits for {join_ids(waiting)} ({flag}) {_AFTER_WAIT[kind]}")
            else:
                result = ("ok", "")
        if not visiting or result[0] != "fail" or "cycle" not in result[1]:
            self.fates[job_id] = result
        return result

    @staticmethod
    def _ended(kind: str, state: str, ran: bool) -> str | None:
        """Why an ended dependency's ``state`` fails a ``kind`` of --after (None: met)."""
        if kind == "ok" and state != "succeeded":
            return _ENDED.get(state, state)
        if kind == "notok" and state == "succeeded":
            return "succeeded"
        if kind == "started" and not ran:
            return f"{_ENDED.get(state, state)} without starting"
        return None

    def impossible(self, shape: Shape) -> str | None:
        """Why no card of the cluster, as it is configured now, could ever serve ``shape``."""
        req = self.by_shape.get(shape)
        if req is None:
            req = self.by_shape[shape] = _Request(shape)
        impossible = req.impossible
        if impossible is _UNKNOWN:
            impossible = self._impossible(shape)
            req.judged(impossible)
        return impossible

    def _hardware(self, f: Filter) -> Refused | frozenset[Hardware]:
        """The hardware classes ``f`` accepts, or ("what"|"plain", the sentence's end).

        Filters look only at a card's class (vendor, capability, CUDA, memory), so each
        distinct filter is judged once per pass over the classes, not the cards.
        """
        got = self._by_filter.get(f)
        if got is None:
            got = self._by_filter[f] = admission.judge_hardware(f, self.world.classes)
        return got

    def _sized(self, shape: Shape) -> Refused | _Sized:
        """(classes, sorted node counts desc, total) of cards that pass the filters and could
        hold one share when empty, or ("what", the sentence's end) when none could."""
        key = (shape.filter, shape.gpu_mem_mb, shape.service)
        got = self._by_size.get(key)
        if got is None:
            got = self._by_size[key] = self._judge_size(shape)
        return got

    def _judge_size(self, shape: Shape) -> Refused | _Sized:
        classes = self._hardware(shape.filter)
        if isinstance(classes, tuple):
            return classes
        kept = admission.judge_size(shape, classes, self.config.service_spare_mb)
        if isinstance(kept, tuple):
            return kept
        f = shape.filter  # filters that keep the same classes (and nodes: -w/-x) count the same
        key = kept if f.nodes is None and not f.excluded else (kept, f.nodes, f.excluded)
        got = self._counted.get(key)
        if got is None:
            counts = []
            for node, on_node in self.world.node_hw.items():
                count = sum(n for hw, n in on_node.items() if hw in kept) if f.node_ok(node) else 0
                if count:
                    counts.append(count)
            counts.sort(reverse=True)
            got = self._counted[key] = _Sized(kept, counts, sum(counts))
        return got

    def _impossible(self, shape: Shape) -> str | None:
        why = self._impossible_on(shape)
        f = shape.filter
        if why and (f.nodes is not None or f.excluded) and self._impossible_on(
                replace(shape, filter=replace(f, nodes=None, excluded=frozenset()))) is None:
            why += "; held by -w/-x alone: other nodes could take it"
        return why

    def _impossible_on(self, shape: Shape) -> str | None:
        sized = self._sized(shape)
        if not isinstance(sized, _Sized):
            kind, text = sized
            return text if kind == "plain" else f"needs {needs(shape)}; {text}"
        kept, counts, total = sized
        why = admission.judge_count(shape, counts)
        if why:
            return why
        span, k = shape.max_nodes, shape.gpu_count
        usable = self.world.eligibility(shape)
        if sum(usable.sizes[:span]) >= k:
            return None
        pool = [card for card in self.world.cards if card.hw in kept and shape.filter.node_ok(card.node)]
        return blocked_text(needs(shape), pool, usable.cards, self.node_order,
                            self.config.min_health_score)

    # ------------------------------------------------------------ R25 reservation
    def reserve(self, job: PendingJob, shape: Shape) -> Reservation | None:
        """The cards ``job`` gets earliest, from running jobs' start + --time; None if never.

        Feasibility only grows with time (ending jobs only free cards and power), so the
        earliest end time at which the job fits is found by bisection. Each card's own
        earliest time is computed once (:meth:`World.ready_times`), so a probe is a count
        per node; only the answer builds that future world and searches it for the cards.
        Power budgets are not in those counts: where a node has one, each probe of the
        bisection searches that future world instead.
        """
        ends, by_end, holders_ends = self.timeline()
        if not ends:
            return None
        taken = self.reserved  # cards an earlier reservation holds are not this one's
        k, span = shape.gpu_count, shape.max_nodes
        if job.service and job.time_limit_s is None and self.scarce and self.keeps_off(job):
            # never there (keep_off_scarce)
            taken = taken | self.scarce_cards

        def ended_by(t: float) -> set[int]:
            return set(by_end[:bisect_right(holders_ends, t)])

        token = ("reserved", len(self.reservations), taken is not self.reserved) if taken else None

        def searched(t: float, nodes: Collection[str] | None = None) -> Found | Missed:
            future = self.world.future(ended_by(t), nodes)
            return future.search(shape, taken, token) if token else future.search(shape)

        def found_by(t: float) -> bool:
            return isinstance(searched(t), Found)

        if self.world.power:
            fits_by = found_by
        else:
            ready_by_node = self.world.ready_times(shape, self.ends, taken)
            ready = list(ready_by_node.values())

            def fits_by(t: float) -> bool:
                counts = sorted((bisect_right(times, t) for times in ready), reverse=True)
                return sum(counts[:span]) >= k

        def earliest(fits_by: Callable[[float], bool]) -> int | None:
            """The index of the first end by which ``fits_by`` (None: never)."""
            if not fits_by(ends[-1]):
                return None
            lo, hi = 0, len(ends) - 1
            while lo < hi:  # a start only ever needs more cards free: feasibility grows with t
                mid = (lo + hi) // 2
                if fits_by(ends[mid]):
                    hi = mid
                else:
                    lo = mid + 1
            return lo

        if not self.world.power and span == 1 and k >= 1:
            # On one node, it fits by t once some node has k cards ready by t: the earliest
            # end at or after the soonest k-th ready time (what the bisection finds)
            soonest = min((times[k - 1] for times in ready if len(times) >= k), default=math.inf)
            lo = bisect_left(ends, soonest)
            if lo == len(ends):
                return None
        else:
            first = earliest(fits_by)
            if first is None:
                return None
            lo = first
        t = ends[lo]
        nodes: set[str] | None = None
        if not self.world.power:
            # The future world needs only the nodes the search there can choose: those with k
            # cards free by then, and for a job that may span nodes, the ones it would take
            # (most such cards first, then listing order; see World._across_nodes).
            counts = {node: bisect_right(times, t) for node, times in ready_by_node.items()}
            nodes = {node for node, count in counts.items() if count >= k}
            if span > 1 and not nodes:
                order = self.node_order
                nodes.update(sorted((n for n, c in counts.items() if c),
                                    key=lambda n: (-counts[n], order[n]))[:span])
        found = searched(t, nodes)
        if not isinstance(found, Found) and nodes is not None:
            # The counts said it fits by t and the search there disagrees (as they did
            # when a card's ready time overlooked memory a job held beyond its placements,
            # and an assertion here failed whole passes at 500 nodes): the search decides,
            # bisecting again over searched future worlds, as with power budgets.
            first = earliest(found_by)
            if first is None:
                return None
            t = ends[first]

            found = searched(t)
        assert isinstance(found, Found)
        return self.reservation(job, t, found)

    def timeline(self) -> tuple[list[float], list[int], list[float]]:
        """The distinct ends of the jobs holding cards, sorted; those jobs in the order of
        their ends; and those ends, one per job. Made at the first reservation and kept up
        to date by each start after it (a job's end is fixed once it holds cards)."""
        if self._timeline is None:
            pairs = sorted((e, j) for j in self.holding if (e := self.ends.get(j)) is not None)
            self._timeline = (sorted({e for e, _ in pairs}), [j for _, j in pairs], [e for e, _ in pairs])
        return self._timeline

    def _on_timeline(self, job_id: int, end: float) -> None:
        """A job this pass started, put on the timeline (once there is one)."""
        if self._timeline is None:
            return
        ends, by_end, holders_ends = self._timeline
        at = bisect_right(ends, end)
        if not at or ends[at - 1] != end:
            ends.insert(at, end)
        at = bisect_right(holders_ends, end)  # ended_by takes every job up to a time: ties in any order
        by_end.insert(at, job_id)
        holders_ends.insert(at, end)

    def reservation(self, job: PendingJob, t: float, found: Found) -> Reservation:
        """``found`` held for ``job`` from ``t``, naming the estimate of each job on those
        cards now that has no --time."""
        uuids = frozenset(c.uuid for c in found.cards)
        waited: dict[str, set[int]] = {}
        for card in self.world.cards:
            if card.uuid in uuids:
                for j, _ in card.allocs:
                    if j in self.basis:
                        waited.setdefault(self.basis[j], set()).add(j)
        basis = "; ".join(f"{join_ids(sorted(ids))} {'has' if len(ids) == 1 else 'have'} no --time: "
                          f"end estimated from {what}" for what, ids in sorted(waited.items()))
        return Reservation(job.id, max(self.now, t), uuids, cards_text(found.cards), basis)
