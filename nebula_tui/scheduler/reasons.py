"""R5: the sentences a waiting job carries — what it needs, the best there is, what blocks.

Times are relative to the pass's ``now`` ("in ~25 min"): the scheduler has no clock and a
user reads the reason now, not at a wall-clock time in some other time zone.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ..model import format_mb
from .placement import Card, Shape


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


def in_time(seconds: float) -> str:
    """0 -> "in under a minute", 1500 -> "in ~25 min", 7200 -> "in ~2 h", … "in ~3 days"."""
    if seconds < 60:
        return "in under a minute"
    if seconds < 90 * 60:
        return f"in ~{round(seconds / 60)} min"
    if seconds < 48 * 3600:
        return f"in ~{round(seconds / 3600)} h"
    return f"in ~{round(seconds / 86400)} days"


def cards_text(cards: Iterable[Card]) -> str:
    """"node02:0-3", "node01:0,2 + node02:1" (ranges of indices per node, listing order)."""
    by_node: dict[str, list[int]] = {}
    for card in cards:
        by_node.setdefault(card.node, []).append(card.index)
    parts = []
    for node, indices in by_node.items():
        indices = sorted(indices)
        runs, start = [], indices[0]
        for prev, cur in zip(indices, indices[1:] + [None]):
            if cur != prev + 1:
                runs.append(f"{start}" if start == prev else f"{start}-{prev}")
                start = cur
        parts.append(f"{node}:{','.join(runs)}")
    return " + ".join(parts)


def join_ids(ids: list[int]) -> str:
    return f"job {ids[0]}" if len(ids) == 1 else "jobs " + ", ".join(str(i) for i in ids)


def blocked_text(what: str, pool: Iterable[Card], usable: Mapping[str, list],
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
