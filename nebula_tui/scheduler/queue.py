"""One scheduling pass: order the queue, then start, hold or fail each job (R5–R8, R25).

Pure: the pass gets a frozen :class:`Snapshot` and returns one decision per pending job,
in the order the jobs were considered. The engine applies them.

The order (:func:`order`): admin priority (higher first), then fair-share weight (lower
first), then submit time, then id. Walking it, each job is

1. failed when it can never run: a bad ``--arch``/``--cuda``, or an ``--after`` job that
   failed, was cancelled, does not exist, or will itself never run;
2. kept waiting while an ``--after`` job is still pending or running, or while its user is
   refused (the quota sentence from ``UserShare.refusal``);
3. kept waiting, without holding anything, when no card in the cluster could ever serve it
   (no sm_120 anywhere, drivers too old, node drained…);
4. started on the best set of cards free now — except cards reserved for an earlier job,
   which it may use only when its ``--time`` ends before that reservation starts;
5. otherwise waiting; the first such job gets the reservation (R25): the cards it will get
   earliest, estimated from running jobs' start + ``--time`` (a job without ``--time``
   never ends, so a job waiting on one gets no reservation).

Every start is applied to the pass's view of the cards before the next job is considered.
A request refused once stays refused for the rest of the pass (a start only takes cards),
so a long queue of jobs that cannot start costs one dictionary look-up each.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ..model import format_mb
from .fairshare import order_key
from .filters import make_filter, sm_name, version_text
from .placement import Card, Found, Shape, World
from .reasons import best_now, cards_text, in_time, join_ids, needs
from .slices import fit
from .snapshot import Decision, Fail, PendingJob, Snapshot, Start, Wait


def order(queue: Sequence[PendingJob], users=None) -> list[PendingJob]:
    """The order jobs are considered in: priority, fair-share weight, submit time, id."""
    users = users or {}

    def weight(user: str) -> float:
        share = users.get(user)
        return 1.0 if share is None else share.weight

    return sorted(queue, key=lambda j: order_key(j.priority, weight(j.user), j.submitted_at, j.id))


@dataclass(frozen=True)
class Reservation:
    """Cards held for the first blocked job from ``start`` (``math.inf``: unknown)."""

    job_id: int
    start: float
    uuids: frozenset[str]
    text: str  # "node02:0-3"


def schedule(snapshot: Snapshot) -> list[Decision]:
    """Decide, for every pending job, to start it, let it wait (with why), or fail it."""
    return _Pass(snapshot).run()


class _Pass:
    def __init__(self, snapshot: Snapshot) -> None:
        self.snap = snapshot
        self.config = snapshot.config
        self.now = snapshot.now
        services = {r.id for r in snapshot.running if r.service}
        self.world = World.build(snapshot.gpus, snapshot.topologies, services, self.config)
        self.ends: dict[int, float | None] = {r.id: r.ends_at for r in snapshot.running}
        self.running_ids = set(self.ends) | self.world.holders()
        self.queue = {j.id: j for j in snapshot.queue}
        self.node_order = {node: cards[0].order for node, cards in self.world.by_node.items()}
        self.shapes: dict[tuple, Shape | str] = {}
        self.static: dict[Shape, str | None] = {}
        self.fates: dict[int, tuple[str, str]] = {}
        self.refused: dict[tuple[Shape, bool], str] = {}
        self.reservation: Reservation | None = None
        self.reservation_tried = False

    def run(self) -> list[Decision]:
        decisions: list[Decision] = []
        for job in order(self.snap.queue, self.snap.users):
            decisions.append(self.decide(job))
        return decisions

    # ------------------------------------------------------------ one job
    def decide(self, job: PendingJob) -> Decision:
        fate, why = self.fate(job.id)
        if fate == "fail":
            return Fail(job.id, why)
        if fate == "wait":
            return Wait(job.id, why)
        share = self.snap.users.get(job.user)
        if share is not None and share.refusal:
            return Wait(job.id, share.refusal)
        shape = self.shape(job)
        assert isinstance(shape, Shape)
        impossible = self.impossible(shape)
        if impossible:
            return Wait(job.id, impossible)
        res = self.reservation
        may_use = res is None or (job.time_limit_s is not None
                                  and self.now + job.time_limit_s <= res.start)
        for key in ((shape, may_use), (shape, True)):
            if key in self.refused:
                return Wait(job.id, self.refused[key])
        if may_use:
            found = self.world.search(shape)
        else:
            found = self.world.search(shape, res.uuids, ("reserved", res.job_id))
        if isinstance(found, Found):
            return self.start(job, found)
        if not may_use and isinstance(self.world.search(shape), Found):
            reason = f"held for job {res.job_id} (reserved {res.text} from {self.when(res.start)})"
            self.refused[(shape, False)] = reason
            return Wait(job.id, reason)
        reason = f"needs {needs(shape)}; {best_now(found.counts, shape, self.node_order)}"
        self.refused[(shape, True)] = reason
        if not self.reservation_tried:
            self.reservation_tried = True
            self.reservation = self.reserve(job, shape)
            if self.reservation and math.isfinite(self.reservation.start):
                reason += (f"; {self.reservation.text} reserved for it from "
                           f"{self.when(self.reservation.start)}")
        return Wait(job.id, reason)

    def start(self, job: PendingJob, found: Found) -> Start:
        placements = self.world.apply(job.id, found, job.service)
        self.running_ids.add(job.id)
        self.ends[job.id] = None if job.time_limit_s is None else self.now + job.time_limit_s
        return Start(job.id, placements)

    def when(self, start: float) -> str:
        if not math.isfinite(start):
            return "when running jobs end (they have no --time)"
        return in_time(max(0.0, start - self.now))

    # ------------------------------------------------------------ requests
    def shape(self, job: PendingJob) -> Shape | str:
        """The job's request, or the sentence saying why it cannot be understood."""
        key = (job.gpu_count, job.gpu_mem_mb, job.service, job.max_nodes, job.vendor, job.arch, job.cuda)
        shape = self.shapes.get(key)
        if shape is None:
            if job.gpu_count < 1:
                shape = f"asks for {job.gpu_count} GPUs; a job needs at least 1"
            elif job.gpu_mem_mb is not None and job.gpu_mem_mb < 1:
                shape = f"asks for {job.gpu_mem_mb} MiB per GPU"
            else:
                try:
                    shape = Shape(job.gpu_count, job.gpu_mem_mb, job.service,
                                  max(1, job.max_nodes), make_filter(job.vendor, job.arch, job.cuda))
                except ValueError as err:
                    shape = str(err)
            self.shapes[key] = shape
        return shape

    def fate(self, job_id: int, visiting: frozenset[int] = frozenset()) -> tuple[str, str]:
        """("ok" | "wait" | "fail", why) from the job's own request and its --after chain."""
        if job_id in self.fates:
            return self.fates[job_id]
        job = self.queue[job_id]
        shape = self.shape(job)
        if isinstance(shape, str):
            result = ("fail", shape)
        else:
            failed, waiting = [], []
            for dep in job.after:
                state = self.snap.finished.get(dep)
                if dep == job_id or dep in visiting:
                    failed.append(f"--after job {dep} waits for this job (a cycle)")
                elif state is not None:
                    if state != "succeeded":
                        done = "was cancelled" if state == "cancelled" else state
                        failed.append(f"job {dep} (--after) {done}")
                elif dep in self.running_ids:
                    waiting.append(dep)
                elif dep in self.queue:
                    dep_fate, dep_why = self.fate(dep, visiting | {job_id})
                    if dep_fate == "fail":
                        failed.append(f"job {dep} (--after) cannot run: {dep_why}")
                    else:
                        waiting.append(dep)
                else:
                    failed.append(f"job {dep} (--after) does not exist")
            if failed:
                result = ("fail", failed[0] + "; this job will not run")
            elif waiting:
                result = ("wait", f"waits for {join_ids(waiting)} (--after) to finish")
            else:
                result = ("ok", "")
        if not visiting or result[0] != "fail" or "cycle" not in result[1]:
            self.fates[job_id] = result
        return result

    def impossible(self, shape: Shape) -> str | None:
        """Why no card of the cluster, as it is configured now, could ever serve ``shape``."""
        if shape not in self.static:
            self.static[shape] = self._impossible(shape)
        return self.static[shape]

    def _impossible(self, shape: Shape) -> str | None:
        what = needs(shape)
        pool: list[Card] = self.world.cards
        if not pool:
            return f"needs {what}; no GPU is registered yet (no node has answered)"
        f = shape.filter
        if f.vendor:
            pool = [c for c in pool if c.vendor == f.vendor]
            if not pool:
                return f"needs {what}; no {f.vendor} GPU in the cluster"
        if f.arch:
            kept = [c for c in pool if f.arch.accepts(c.capability)]
            if not kept:
                here = sorted({c.capability for c in pool if c.capability})
                listed = f" (here: {', '.join(sm_name(c) for c in here)})" if here else ""
                return f"needs {what}; no GPU with {f.arch.text} in the cluster{listed}"
            pool = kept
        if f.cuda:
            kept = [c for c in pool if c.cuda is not None and c.cuda >= f.cuda]
            if not kept:
                known = [c.cuda for c in pool if c.cuda is not None]
                if not known:
                    return f"needs CUDA ≥{version_text(f.cuda)}; no driver here reported its CUDA version"
                return (f"needs CUDA ≥{version_text(f.cuda)}; drivers here support up to "
                        f"{version_text(max(known))}")
            pool = kept
        spare = self.config.service_spare_mb if shape.service else 0
        kept = [c for c in pool if fit(c.total, 0, 0, 0, False, shape.gpu_mem_mb, spare) is not None]
        if not kept:
            largest = max((c.total or 0 for c in pool), default=0)
            extra = f" (a service keeps {format_mb(spare)} spare)" if spare else ""
            return f"needs {what}; the largest card here has {format_mb(largest)}{extra}"
        pool = kept
        counts: dict[str, int] = {}
        for card in pool:
            counts[card.node] = counts.get(card.node, 0) + 1
        k, span = shape.gpu_count, shape.max_nodes
        if sum(sorted(counts.values(), reverse=True)[:span]) < k:
            if span <= 1:
                most = max(counts.values())
                return (f"needs {what}; the largest node has {most} such GPU{'s' * (most != 1)}"
                        + (" (--nodes lets a job span nodes)" if sum(counts.values()) >= k else ""))
            top = sum(sorted(counts.values(), reverse=True)[:span])
            return f"needs {what}; {span} nodes have at most {top} such GPUs together"
        usable = self.world.eligible(shape)
        sizes = sorted((len(v) for v in usable.values()), reverse=True)
        if sum(sizes[:span]) >= k:
            return None
        blocks: list[str] = []
        for card in pool:
            if card.blocked:
                why = card.blocked
            elif card.health < self.config.min_health_score:
                why = (f"{card.node}'s health score is {card.health:.2f}, "
                       f"below {self.config.min_health_score:.2f}")
            else:
                continue
            if why not in blocks:
                blocks.append(why)
        shown = ", ".join(blocks[:3]) + (", …" if len(blocks) > 3 else "")
        if not usable:
            return f"needs {what}; no GPU takes new work now ({shown})"
        best = max(usable, key=lambda n: (len(usable[n]), -self.node_order[n]))
        return f"needs {what}; best usable: {best} has {len(usable[best])} ({shown})"

    # ------------------------------------------------------------ R25 reservation
    def reserve(self, job: PendingJob, shape: Shape) -> Reservation | None:
        """The cards ``job`` gets earliest, from running jobs' start + --time; None if never."""
        holders = self.world.holders()
        ends = sorted({e for j in holders if (e := self.ends.get(j)) is not None})
        if not ends:
            return None

        def attempt(t: float):
            ended = {j for j in holders if (e := self.ends.get(j)) is not None and e <= t}
            return self.world.future(ended).search(shape)

        if not isinstance(attempt(ends[-1]), Found):
            return None
        lo, hi = 0, len(ends) - 1
        while lo < hi:  # a start only ever needs more cards free: feasibility grows with t
            mid = (lo + hi) // 2
            if isinstance(attempt(ends[mid]), Found):
                hi = mid
            else:
                lo = mid + 1
        found = attempt(ends[lo])
        assert isinstance(found, Found)
        return Reservation(job.id, max(self.now, ends[lo]), frozenset(c.uuid for c in found.cards),
                           cards_text(found.cards))
