"""What a lab would have instead, for the same jobs and cards: the two policies a replay
compares NebulaGrid's own scheduler against.

* ``spreadsheet`` — the lab before NebulaGrid: each user works on the machine the lab gave
  them (a home node), whole cards, first come first served on that machine with no
  backfill (the first job waiting blocks the ones behind it), and a job its machine can
  never hold is never run. Jobs run to their end: nobody enforces a limit.
* ``slurm_like`` — what the lab would install instead, as Slurm's defaults run it: the
  cards pooled, whole GPUs placed best fit (``select/cons_tres`` packs), the queue in
  multifactor fair-share order (usage decaying with the same half-life, then age), and
  ``sched/backfill``: each of the first ``bf_max_job_test`` (100) jobs that cannot start
  gets a reservation at the earliest time within ``bf_window`` (a day) that enough cards
  free by the running jobs' limits and no earlier reservation holds them; a job starts now
  only where it ends, by its limit, before every reservation on its cards. Time limits
  enforced; a job without one never ends by it (a partition without ``DefaultTime``).
  No scavenger QOS: the replay's settings have no quota the baseline reads.

These are baselines, deliberately simple: NebulaGrid's own policy is never re-implemented
here — it runs in ``head/replay.py`` through the head's own code.
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from .records import Outcome, Request


@dataclass(frozen=True)
class Card:
    node: str
    uuid: str
    memory_mb: int


def _fits(request: Request, card: Card) -> bool:
    return request.gpu_mem_mb is None or request.gpu_mem_mb <= card.memory_mb


def home_nodes(users: Sequence[str], nodes: Sequence[str]) -> dict[str, str]:
    """Users spread evenly over the machines, in name order (a lab hands them out so)."""
    return {user: nodes[i % len(nodes)] for i, user in enumerate(sorted(set(users)))}


def spreadsheet(requests: Sequence[Request], cards: Sequence[Card], horizon_s: float,
                homes: dict[str, str] | None = None) -> dict[int, Outcome]:
    by_node: dict[str, list[Card]] = defaultdict(list)
    for card in cards:
        by_node[card.node].append(card)
    homes = homes or home_nodes([r.user for r in requests], sorted(by_node))
    outcomes = {r.key: Outcome(r.key) for r in requests}
    for node, node_cards in by_node.items():
        mine = sorted((r for r in requests if homes.get(r.user) == node), key=lambda r: (r.submit_s, r.key))
        holdable = [r for r in mine if r.nodes == 1 or r.gpus <= len(node_cards)]
        holdable = [r for r in holdable if sum(_fits(r, c) for c in node_cards) >= r.gpus]
        for r in mine:
            if r not in holdable:
                outcomes[r.key].refused = f"{node} cannot hold it"
        _fcfs(holdable, node_cards, horizon_s, outcomes)
    return outcomes


#: Slurm's ``bf_max_job_test`` default: how many waiting jobs one backfill pass reserves for
BF_MAX_JOB_TEST = 100
#: Slurm's ``bf_window`` default (1,440 minutes): how far ahead a reservation may start
BF_WINDOW_S = 86400.0


def slurm_like(requests: Sequence[Request], cards: Sequence[Card], horizon_s: float,
               half_life_s: float | None, bf_max_job_test: int = BF_MAX_JOB_TEST) -> dict[int, Outcome]:
    outcomes = {r.key: Outcome(r.key) for r in requests}
    runnable = []
    for r in requests:
        per_node = defaultdict(int)
        for c in cards:
            per_node[c.node] += _fits(r, c)
        best = sorted(per_node.values(), reverse=True)[:max(1, r.nodes)]
        if sum(best) < r.gpus:
            outcomes[r.key].refused = "no nodes can hold it"
        else:
            runnable.append(r)
    _Backfill(cards, horizon_s, outcomes, half_life_s, bf_max_job_test).run(
        sorted(runnable, key=lambda r: (r.submit_s, r.key)))
    return outcomes


def best_fit(r: Request, pool: set[str], card_of: dict[str, Card]) -> tuple[str, ...] | None:
    """``select/cons_tres``: a one-node job goes to the node with the fewest free cards
    that still hold it (it packs, leaving whole machines for gangs); a multi-node job
    takes the fullest-free nodes, so it spans as few as it can."""
    by_node: dict[str, list[str]] = defaultdict(list)
    for uuid in sorted(pool):
        if _fits(r, card_of[uuid]):
            by_node[card_of[uuid].node].append(uuid)
    if r.nodes <= 1:
        holding = [(len(group), node) for node, group in by_node.items() if len(group) >= r.gpus]
        if not holding:
            return None
        return tuple(by_node[min(holding)[1]][:r.gpus])
    chosen: list[str] = []
    for group in sorted(by_node.values(), key=len, reverse=True)[:r.nodes]:
        chosen += group[:r.gpus - len(chosen)]
    return tuple(chosen) if len(chosen) == r.gpus else None


class _Backfill:
    """Slurm's main scheduler with ``sched/backfill``: the queue in multifactor fair-share
    order (usage decaying with the same half-life, then age), best fit, and a reservation
    for each of the first ``bf_max_job_test`` jobs that cannot start — at the earliest
    time enough cards are free by the running jobs' limits and not promised to an earlier
    reservation. A job starts now only where it ends (by its limit) before every
    reservation on the cards it takes. A job without a limit never ends by it."""

    def __init__(self, cards: Sequence[Card], horizon_s: float, outcomes: dict[int, Outcome],
                 half_life_s: float | None, bf_max_job_test: int):
        self.card_of = {c.uuid: c for c in cards}
        self.free = set(self.card_of)
        self.horizon_s = horizon_s
        self.outcomes = outcomes
        self.half_life_s = half_life_s
        self.bf_max_job_test = bf_max_job_test
        self.free_at: dict[str, float] = {}  # busy card -> when its job ends by its limit
        self.usage: dict[str, tuple[float, float]] = {}  # user -> (decayed GPU-s, as of when)
        self.now = 0.0

    def decayed(self, user: str) -> float:
        value, at = self.usage.get(user, (0.0, self.now))
        return value * (2 ** (-(self.now - at) / self.half_life_s) if self.half_life_s else 1.0)

    def run(self, arrivals: list[Request]) -> None:
        ends: list[tuple[float, int, tuple[str, ...]]] = []
        waiting: list[Request] = []
        i = 0
        while True:
            next_submit = arrivals[i].submit_s if i < len(arrivals) else math.inf
            self.now = min(next_submit, ends[0][0] if ends else math.inf)
            if self.now > self.horizon_s or self.now == math.inf:
                return
            while ends and ends[0][0] <= self.now:
                end, key, chosen = heapq.heappop(ends)
                self.free.update(chosen)
                for uuid in chosen:
                    self.free_at.pop(uuid, None)
                o = self.outcomes[key]
                o.ended_s, o.state = end, o.state or "succeeded"
            while i < len(arrivals) and arrivals[i].submit_s <= self.now:
                waiting.append(arrivals[i])
                i += 1
            usage = {user: self.decayed(user) for user in {r.user for r in waiting}}
            waiting.sort(key=lambda r: (usage[r.user], r.submit_s, r.key))
            waiting = self.schedule(waiting, ends)

    def schedule(self, waiting: list[Request], ends: list) -> list[Request]:
        reserved: dict[str, list[tuple[float, float]]] = defaultdict(list)  # card -> (from, to)
        tested, still = 0, []
        unplaceable: set[tuple] = set()  # shapes with no start in the window: same answer
        blocked: set[tuple] = set()  # shapes that cannot start now: free cards only shrink
        for r in waiting:
            shape = (r.gpus, r.gpu_mem_mb, r.nodes, r.time_limit_s)
            if self.free and shape not in blocked:
                ends_by = self.now + (r.time_limit_s or math.inf)
                pool = {u for u in self.free if all(ends_by <= start for start, _ in reserved[u])}
                chosen = best_fit(r, pool, self.card_of)
                if chosen is not None:
                    self.start(r, chosen, ends)
                    continue
                blocked.add(shape)
            still.append(r)
            if tested < self.bf_max_job_test and shape not in unplaceable:
                tested += 1
                if not self.reserve(r, reserved):
                    unplaceable.add(shape)
        return still

    def reserve(self, r: Request, reserved: dict[str, list[tuple[float, float]]]) -> bool:
        """The earliest start for ``r`` within ``bf_window`` on cards free by then (by
        limits) and promised to no earlier reservation for its whole run; held for the
        jobs behind it. False when there is none."""
        span = r.time_limit_s or math.inf
        window = self.now + BF_WINDOW_S
        times = sorted({t for t in self.free_at.values() if self.now < t <= window}
                       | {to for held in reserved.values() for _, to in held if self.now < to <= window})
        for t in [self.now] + times:
            pool = {u for u in self.card_of
                    if self.free_at.get(u, self.now) <= t
                    and all(to <= t or t + span <= start for start, to in reserved[u])}
            got = best_fit(r, pool, self.card_of)
            if got is not None:
                for uuid in got:
                    reserved[uuid].append((t, t + span))
                return True
        return False

    def start(self, r: Request, chosen: tuple[str, ...], ends: list) -> None:
        run = min(r.duration_s, r.time_limit_s) if r.time_limit_s else r.duration_s
        self.free.difference_update(chosen)
        heapq.heappush(ends, (self.now + run, r.key, chosen))
        for uuid in chosen:
            self.free_at[uuid] = self.now + (r.time_limit_s or math.inf)
        o = self.outcomes[r.key]
        o.started_s, o.runs = self.now, 1
        o.placements = tuple((self.card_of[u].node, u, self.card_of[u].memory_mb, True) for u in chosen)
        o.state = "timeout" if run < r.duration_s else None
        # Slurm charges usage as it runs; at the start is close enough
        self.usage[r.user] = (self.decayed(r.user) + r.gpus * run, self.now)


def _fcfs(requests: list[Request], cards: Sequence[Card], horizon_s: float,
          outcomes: dict[int, Outcome]) -> None:
    """First come first served on one machine's cards, no backfill: the first job waiting
    blocks the ones behind it; jobs run to their end."""
    free = {c.uuid for c in cards}
    card_of = {c.uuid: c for c in cards}
    ends: list[tuple[float, int, tuple[str, ...]]] = []  # (end, key, cards)
    waiting: list[Request] = []
    arrivals = list(requests)
    i, now = 0, 0.0
    while True:
        next_submit = arrivals[i].submit_s if i < len(arrivals) else math.inf
        now = min(next_submit, ends[0][0] if ends else math.inf)
        if now > horizon_s or now == math.inf:
            break
        while ends and ends[0][0] <= now:
            end, key, chosen = heapq.heappop(ends)
            free.update(chosen)
            outcomes[key].ended_s, outcomes[key].state = end, "succeeded"
        while i < len(arrivals) and arrivals[i].submit_s <= now:
            waiting.append(arrivals[i])
            i += 1
        while waiting:
            r = waiting[0]
            chosen = [u for u in sorted(free) if _fits(r, card_of[u])][:r.gpus]
            if len(chosen) < r.gpus:
                break
            waiting.pop(0)
            free.difference_update(chosen)
            heapq.heappush(ends, (now + r.duration_s, r.key, tuple(chosen)))
            o = outcomes[r.key]
            o.started_s, o.runs = now, 1
            o.placements = tuple((card_of[u].node, u, card_of[u].memory_mb, True) for u in chosen)
