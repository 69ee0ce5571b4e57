"""R5: the sentences a waiting job carries — what it needs, the best there is, what blocks.

Times are relative to the pass's ``now`` ("in ~25 min"): the scheduler has no clock and a
user reads the reason now, not at a wall-clock time in some other time zone.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any

from ..model import MAX_ALLOCATIONS_PER_GPU, MIN_SLICE_MB, format_mb, takes_whole_card
from .cards import Card, Shape
from .slices import fit


def needs(shape: Shape) -> str:
    """"a whole GPU", "2 GPUs with ≥24 GB free on one node (sm_89)"…"""
    k, mem = shape.gpu_count, shape.gpu_mem_mb
    if k == 1:
        what = "a whole GPU" if mem is None else f"a GPU with ≥{format_mb(mem)} free"
    else:
        what = f"{k} whole GPUs" if mem is None else f"{k} GPUs with ≥{format_mb(mem)} free"
        what += " on one node" if shape.max_nodes <= 1 else f" on at most {shape.max_nodes} nodes"
    return what + shape.filter.describe()


def best_now(counts: Mapping[str, int], shape: Shape, order: Mapping[str, int]) -> str:
    """"best now: node01 has 1" (the node with most fitting cards), or "none is free now"."""
    ranked = sorted((n for n, c in counts.items() if c), key=lambda n: (-counts[n], order[n]))
    if not ranked:
        return "none is free now"
    if shape.max_nodes <= 1 or shape.gpu_count == 1:
        return f"best now: {ranked[0]} has {counts[ranked[0]]}"
    shown = ranked[:shape.max_nodes]
    return "best now: " + ", ".join(f"{n} has {counts[n]}" for n in shown)


def blocker(card: Card, shape: Shape, spare_mb: int, power: list[float] | None
            ) -> tuple[tuple[float, ...], str] | None:
    """What keeps ``card`` from taking one share of ``shape`` now: (how near it came, what
    blocks it, as "held by job 4" follows "node01:0"), or None when nothing does (it fits).

    Nearest first are cards taken by jobs ahead of this one in the pass, then those short
    of memory (by how much) or held by others, then of power, then full of shares, then
    held whole. :func:`blocker_rank` is the first part alone, without the words."""
    rank = blocker_rank(card, shape, spare_mb, power)
    if rank is None:
        return None
    kind = rank[0]
    mem = shape.gpu_mem_mb
    jobs = [job for job, _ in card.allocs]
    if kind == 0:  # blockers_text names the jobs of every such card together
        return rank, BEHIND
    if kind == 1:  # only a card with a size: memory_rank judges no other
        total = card.total or 0
        if total and takes_whole_card(total, mem):
            if jobs:
                return rank, f"held by {join_ids(sorted(jobs))}"
            what = "in use" if mem is None else f"with {format_mb(total - card.unmanaged)} free"
            return rank, f"{what} ({_held_text(card)})"
        free = max(0, total - card.reserved - card.unmanaged)
        if free < max(mem or 0, MIN_SLICE_MB):
            return rank, f"with {format_mb(free)} free ({_held_text(card)})"
        beside = f"the service of {join_ids(list(card.services))}" if card.services else "a service"
        return rank, f"with {format_mb(free)} free, {format_mb(spare_mb)} of it kept spare beside {beside}"
    if kind == 2 and power is not None:  # kind 2 comes of a power budget alone
        budget, counted = power
        return rank, (f"needing {card.watts:.0f} W with {max(0.0, budget - counted):.0f} W of "
                      f"{card.node}'s {budget:.0f} W power budget left")
    if kind == 3:
        return rank, f"at {MAX_ALLOCATIONS_PER_GPU} jobs, the most a card shares"
    return rank, f"whole to {join_ids(jobs)}"


def blocker_rank(card: Card, shape: Shape, spare_mb: int, power: list[float] | None
                 ) -> tuple[float, ...] | None:
    """(kind, shortfall, listing order) of what blocks ``card`` (see :func:`blocker`):
    kind 0 taken by jobs ahead in the pass, 1 memory, 2 power, 3 shares, 4 held whole."""
    got = memory_rank(card.state_key(), shape, spare_mb)
    if got is not None:
        # the jobs this pass started took what it had at the start of the pass?
        if card.first != card.state_key() and memory_rank(card.first, shape, spare_mb) is None:
            return (0, 0, card.order)
        return got + (card.order,)
    if power is not None:
        budget, counted = power
        extra = card.extra_watts()
        if counted + extra > budget:
            return (2, counted + extra - budget, card.order)
    return None


def memory_rank(state: tuple[Any, ...], shape: Shape, spare_mb: int) -> tuple[int, float] | None:
    """(kind, shortfall) of what blocks a card in ``state`` (Card.state_key) for ``shape``
    on its memory and shares alone, or None when they let it."""
    total, held, reserved, allocations, exclusive, service = state
    mem = shape.gpu_mem_mb
    if not total:
        return None
    if takes_whole_card(total, mem):
        if allocations:
            return (1, allocations)
        if held and (mem is None or fit(total, held, 0, 0, False, mem) is None):
            return (1, held)
        return None
    if exclusive:
        return (4, 0)
    if allocations >= MAX_ALLOCATIONS_PER_GPU:
        return (3, 0)
    ask = max(mem or 0, MIN_SLICE_MB)  # a size: a whole-card request was judged above
    free = max(0, total - reserved - held)
    if free < ask:
        return (1, ask - free)
    keep = spare_mb if (service or shape.service) else 0
    if free - keep < ask:
        return (1, ask - (free - keep))
    return None


def _held_text(card: Card) -> str:
    """Who holds a card's memory: "job 4 reserves 8 GB, job 7 holds 12 GB more than it
    reserved, pid 4242 of alice holds 2 GB"."""
    parts = []
    reserving = [job for job, p in card.allocs]
    if reserving:
        verb = "reserves" if len(reserving) == 1 else "reserve"
        parts.append(f"{join_ids(reserving)} {verb} {format_mb(card.reserved)}")
    parts += [f"job {job} holds {format_mb(mb)} more than it reserved" for job, mb in card.over_by]
    named = 0
    for pid, user, mb in sorted(card.owners, key=lambda o: -o[2])[:2]:
        parts.append(f"pid {pid}{f' of {user}' if user else ''} holds {format_mb(mb)}")
        named += mb
    if card.foreign > named:
        rest = card.foreign - named
        parts.append(f"{'others' if named else 'processes'} not started by NebulaGrid hold {format_mb(rest)}")
    return ", ".join(parts) if parts else "nothing of ours"


#: what blocker() says of a card that jobs ahead in the pass took
BEHIND = "behind"


def blockers_text(found: list[tuple[Card, str]], ahead: Collection[int], shown: int = 2) -> str:
    """The nearest blockers (``found`` nearest first), cards blocked alike together:
    "behind job 3 in fair-share order, which took node01:0-1; node02:1 with 2 GB free
    (job 5 reserves 20 GB); …"."""
    groups: dict[str, list[Card]] = {}
    for card, what in found:
        groups.setdefault(what, []).append(card)
    parts = []
    for what, cards in list(groups.items())[:shown]:
        where = cards_text(cards)
        if what == BEHIND:
            jobs = sorted({job for card in cards for job, _ in card.allocs if job in ahead})
            parts.append(f"behind {join_ids(jobs)} in fair-share order, which took {where}")
        else:
            parts.append(f"{where} {what}")
    return "; ".join(parts) + ("; …" if len(groups) > shown else "")


def cards_text(cards: Iterable[Card]) -> str:
    """"node02:0-3", "node01:0,2 + node02:1" (ranges of indices per node, listing order)."""
    by_node: dict[str, list[int]] = {}
    for card in cards:
        by_node.setdefault(card.node, []).append(card.index)
    parts = []
    for node, indices in by_node.items():
        indices = sorted(indices)
        runs: list[str] = []
        start: int | None = indices[0]
        following: list[int | None] = [*indices[1:], None]
        for prev, cur in zip(indices, following):
            if cur != prev + 1:
                runs.append(f"{start}" if start == prev else f"{start}-{prev}")
                start = cur
        parts.append(f"{node}:{','.join(runs)}")
    return " + ".join(parts)


def join_ids(ids: list[int]) -> str:
    return f"job {ids[0]}" if len(ids) == 1 else "jobs " + ", ".join(str(i) for i in ids)


def blocked_text(what: str, pool: Iterable[Card], usable: Mapping[str, Collection[object]],
                 node_order: Mapping[str, int], min_health: float) -> str:
    """A request that would fit but whose cards take no new work now: say what blocks them
    (drained, unknown, maintenance, low health; the first three) and the best usable node."""
    blocks: list[str] = []
    for card in pool:
        if card.blocked:
            why = card.blocked
        elif card.health < min_health:
            why = f"{card.node}'s health score is {card.health:.2f}, below {min_health:.2f}"
        else:
            continue
        if why not in blocks:
            blocks.append(why)
    shown = ", ".join(blocks[:3]) + (", …" if len(blocks) > 3 else "")
    if not usable:
        return f"needs {what}; no GPU takes new work now ({shown})"
    best = max(usable, key=lambda n: (len(usable[n]), -node_order[n]))
    return f"needs {what}; best usable: {best} has {len(usable[best])} ({shown})"
