"""What a lab would have instead, for the same jobs and cards: the two policies a replay
compares NebulaGrid's own scheduler against.

* ``spreadsheet`` — the lab before NebulaGrid: each user works on the machine the lab gave
  them (a home node), whole cards, first come first served on that machine with no
  backfill (the first job waiting blocks the ones behind it), and a job its machine can
  never hold is never run. Jobs run to their end: nobody enforces a limit.
* ``slurm_like`` — what the lab would install instead: the cards pooled, whole GPUs, the
  queue in fair-share order (usage decaying with the same half-life), EASY backfill (the
  first job that cannot start gets a reservation at the earliest time enough cards free,
  by the running jobs' time limits; a later job starts now only if it ends before that or
  leaves the reserved cards), time limits enforced.

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
        _fcfs(holdable, node_cards, horizon_s, outcomes, backfill=False, limits=False)
    return outcomes


def slurm_like(requests: Sequence[Request], cards: Sequence[Card], horizon_s: float,
               half_life_s: float | None) -> dict[int, Outcome]:
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
    _fcfs(sorted(runnable, key=lambda r: (r.submit_s, r.key)), cards, horizon_s, outcomes,
          backfill=True, limits=True, half_life_s=half_life_s)
    return outcomes


def _fcfs(requests: list[Request], cards: Sequence[Card], horizon_s: float,
          outcomes: dict[int, Outcome], backfill: bool, limits: bool,
          half_life_s: float | None = None) -> None:
    """An event loop over submits and ends; each moment, start what the policy allows."""
    free = {c.uuid for c in cards}
    card_of = {c.uuid: c for c in cards}
    ends: list[tuple[float, int, tuple[str, ...]]] = []  # (end, key, cards)
    promised: dict[int, float] = {}  # key -> when it will end at the latest (its limit)
    waiting: list[Request] = []
    usage: dict[str, tuple[float, float]] = {}  # user -> (decayed GPU-seconds, as of when)
    arrivals = list(requests)
    i, now = 0, 0.0

    def decayed(user: str) -> float:
        value, at = usage.get(user, (0.0, now))
        return value * (2 ** (-(now - at) / half_life_s) if half_life_s else 1.0)

    def choose(r: Request, pool: set[str]) -> tuple[str, ...] | None:
        by_node = defaultdict(list)
        for uuid in sorted(pool):
            if _fits(r, card_of[uuid]):
                by_node[card_of[uuid].node].append(uuid)
        nodes = sorted(by_node.values(), key=len, reverse=True)
        chosen: list[str] = []
        for group in nodes[:max(1, r.nodes)]:
            chosen += group[:r.gpus - len(chosen)]
        return tuple(chosen) if len(chosen) == r.gpus else None

    def start(r: Request, chosen: tuple[str, ...]) -> None:
        run = r.duration_s if not (limits and r.time_limit_s) else min(r.duration_s, r.time_limit_s)
        free.difference_update(chosen)
        heapq.heappush(ends, (now + run, r.key, chosen))
        promised[r.key] = now + (r.time_limit_s if limits and r.time_limit_s else math.inf)
        o = outcomes[r.key]
        o.started_s, o.runs = now, 1
        o.placements = tuple((card_of[u].node, u, card_of[u].memory_mb, True) for u in chosen)
        o.state = "timeout" if run < r.duration_s else None
        charged = decayed(r.user) + r.gpus * run  # Slurm charges usage as it runs; at start is close enough
        usage[r.user] = (charged, now)

    while True:
        next_submit = arrivals[i].submit_s if i < len(arrivals) else math.inf
        next_end = ends[0][0] if ends else math.inf
        now = min(next_submit, next_end)
        if now > horizon_s or now == math.inf:
            break
        while ends and ends[0][0] <= now:
            end, key, chosen = heapq.heappop(ends)
            free.update(chosen)
            o = outcomes[key]
            o.ended_s = end
            o.state = o.state or "succeeded"
            promised.pop(key, None)
        while i < len(arrivals) and arrivals[i].submit_s <= now:
            waiting.append(arrivals[i])
            i += 1
        if half_life_s is not None or backfill:
            waiting.sort(key=lambda r: (decayed(r.user), r.submit_s, r.key))
        blocked, shadow, reserved = False, math.inf, set()
        still = []
        for r in waiting:
            if not blocked:
                chosen = choose(r, free)
                if chosen is not None:
                    start(r, chosen)
                    continue
                blocked = True
                if backfill:  # EASY: the first job that cannot start gets a reservation
                    shadow, reserved = _reservation(r, free, ends, promised, choose)
                still.append(r)
                continue
            if not backfill:  # first come first served: everyone behind the first waits
                still.append(r)
                continue
            ends_by = now + (r.time_limit_s if r.time_limit_s else math.inf)
            chosen = choose(r, free if ends_by <= shadow else free - reserved)
            if chosen is not None:
                start(r, chosen)
                continue
            still.append(r)
        waiting = still


def _reservation(r, free, ends, promised, choose):
    """When and where the first waiting job could start, if running jobs end by their
    limits (never, for a job without one)."""
    pool = set(free)
    for end, key, chosen in sorted((promised.get(k, math.inf), k, c) for _, k, c in ends):
        if end == math.inf:
            break
        pool.update(chosen)
        got = choose(r, pool)
        if got is not None:
            return end, set(got)
    return math.inf, set()
