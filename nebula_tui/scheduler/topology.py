"""R9 topology: how good a link is, how good a set of GPUs is, and the best set on a node.

Link codes are those of ``nvidia-smi topo -m``. Their order, best first:
``NV#`` (more bonded NVLinks better) > ``PIX`` > ``PXB`` > ``PHB`` > ``NODE`` > ``SYS``
(the old ``SOC`` legend is ``SYS``) > anything unknown > two different nodes. AMD's
``XGMI`` (Infinity Fabric, from ``rocm-smi --showtopo``) ranks with a 4-link NVLink bridge.
A PCIe code may carry the pair's slower end as ``PHB/g4x8`` (generation 4, 8 lanes): a
narrower or older link ranks lower on the same path, never below the next path's rank.
A set runs at its slowest link, so a set is judged by its weakest link first, then by
whether it mixes card models, then by its mean link.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable, Mapping, Sequence
from math import comb

_NV = re.compile(r"^NV(\d+)$")
_PCIE = {"SYS": 1, "SOC": 1, "NODE": 2, "PHB": 3, "PXB": 4, "PIX": 5}
UNKNOWN_RANK = 0
CROSS_NODE_RANK = -1  # GPUs on two nodes talk over the network: worse than any link
_MAX_NV = 18  # NV18 (H100 SXM) is the most bonded links a tool prints today
BEST_RANK = _PCIE["PIX"] + _MAX_NV
_SPAN = BEST_RANK - CROSS_NODE_RANK + 1


_XGMI_AS_NV = 4
_LINK = re.compile(r"^(?P<path>[A-Z]+)/G(?P<gen>\d+)X(?P<width>\d+)$")
#: GB/s per lane and direction, by PCIe generation (after line coding).
_LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}
#: The link a slower one is compared with: gen 5 x16, today's widest GPU slot.
_FULL_GBPS = 16 * _LANE_GBPS[5]


def pcie_gbps(gen: int, width: int) -> float:
    """A PCIe link's bandwidth in GB/s per direction (unknown generations as gen 1)."""
    return _LANE_GBPS.get(gen, _LANE_GBPS[1]) * width


def link_rank(code: str | None) -> float:
    """NV18 (23) … NV1 (6) > PIX 5 > PXB 4 > PHB 3 > NODE 2 > SYS/SOC 1 > unknown 0;
    XGMI 9. ``PHB/g4x8``: PHB less up to 0.9 for a link slower than gen 5 x16 (0.15 per
    halving of the bandwidth), so a path's order holds whatever the lanes."""
    if not code:
        return UNKNOWN_RANK
    code = code.strip().upper()
    match = _NV.match(code)
    if match:
        return _PCIE["PIX"] + max(1, min(int(match.group(1)), _MAX_NV))
    if code == "XGMI":
        return _PCIE["PIX"] + _XGMI_AS_NV
    link = _LINK.match(code)
    if link:
        path = _PCIE.get(link.group("path"))
        if path is None:
            return UNKNOWN_RANK
        speed = pcie_gbps(int(link.group("gen")), max(1, int(link.group("width"))))
        return path - min(0.9, 0.15 * max(0.0, math.log2(_FULL_GBPS / speed)))
    return _PCIE.get(code, UNKNOWN_RANK)


def gpu_number(name: str) -> int | None:
    """"GPU3" -> 3; anything else -> None."""
    return int(name[3:]) if name.startswith("GPU") and name[3:].isdigit() else None


def rank_table(links: Mapping[str, Mapping[str, str]]) -> dict[tuple[int, int], float]:
    """``parse_topo`` links -> {(i, j): rank} for both directions, by GPU index.

    A matrix is symmetric; where a row disagrees with its column, the weaker reading wins.
    """
    ranks: dict[str | None, float] = {}  # a matrix repeats a few codes: rank each once
    numbers: dict[str, int | None] = {}
    weakest: dict[tuple[int, int], float] = {}  # per unordered pair (low, high)
    for row, cells in links.items():
        i = gpu_number(row)
        if i is None:
            continue
        for col, code in cells.items():
            j = numbers.get(col, -1)
            if j == -1:
                j = numbers[col] = gpu_number(col)
            if j is None or j == i:
                continue
            rank = ranks.get(code)
            if rank is None:
                rank = ranks[code] = link_rank(code)
            pair = (i, j) if i < j else (j, i)
            known = weakest.get(pair)
            if known is None or rank < known:
                weakest[pair] = rank
    table: dict[tuple[int, int], float] = {}
    for (i, j), rank in weakest.items():
        table[(i, j)] = rank
        table[(j, i)] = rank
    return table


def topology_penalty(weakest: float, mixed: bool, mean: float) -> float:
    """0 (best) … <1: weakest link first, then mixed models, then the mean link."""
    return ((BEST_RANK - weakest) + 0.5 * mixed + 0.25 * (BEST_RANK - mean) / _SPAN) / _SPAN


def set_links(members: Sequence[tuple[str, int]], ranks: Mapping[str, Mapping[tuple[int, int], float]]
              ) -> tuple[float, float]:
    """(weakest rank, mean rank) over every pair of (node, gpu index) members."""
    if len(members) < 2:
        return BEST_RANK, float(BEST_RANK)
    weakest: float = BEST_RANK
    total: float = 0
    pairs = 0
    for (node_a, a), (node_b, b) in itertools.combinations(members, 2):
        rank = ranks.get(node_a, {}).get((a, b), UNKNOWN_RANK) if node_a == node_b else CROSS_NODE_RANK
        weakest = min(weakest, rank)
        total += rank
        pairs += 1
    return weakest, total / pairs


def best_subset(n: int, k: int, score: Callable[[tuple[int, ...]], float],
                max_combinations: int = 256) -> tuple[int, ...]:
    """The k of positions 0..n-1 with the lowest ``score``; ties go to the lowest positions.

    Exhaustive while C(n, k) <= ``max_combinations``; beyond, grown greedily from every
    seed (good sets of linked cards are cliques, which growing from a member finds).
    """
    if k > n or k < 1:
        raise ValueError(f"cannot choose {k} of {n}")
    if k == n:
        return tuple(range(n))
    if comb(n, k) <= max_combinations:
        # min by (score, combo): combinations come in increasing order, so on equal scores
        # the first one seen wins.
        first: tuple[int, ...] | None = None
        first_score = 0.0
        for combo in itertools.combinations(range(n), k):
            value = score(combo)
            if first is None or value < first_score:
                first, first_score = combo, value
        assert first is not None  # 1 <= k < n: there is a combination
        return first

    def ranked(combo: tuple[int, ...]) -> tuple[float, tuple[int, ...]]:
        return score(combo), combo

    best: tuple[float, tuple[int, ...]] | None = None
    for seed in range(n):
        chosen = [seed]
        while len(chosen) < k:
            options = [tuple(sorted(chosen + [c])) for c in range(n) if c not in chosen]
            picked = min(options, key=ranked)
            chosen = list(picked)
        candidate = tuple(chosen)
        key = (score(candidate), candidate)
        if best is None or key < best:
            best = key
    assert best is not None  # n >= 1 seeds
    return best[1]


def best_set(links: Mapping[str, Mapping[str, str]], k: int,
             gpus: Sequence[str] | None = None) -> list[str]:
    """The k GPUs (``"GPU0"``…) a job would get on this machine, all cards idle and alike.

    ``links`` is ``parse_topo(...)["links"]``; ``gpus`` defaults to every GPU it names.
    Raises ValueError when the machine has fewer than k GPUs.
    """
    if gpus is None:
        names = set(links) | {col for cells in links.values() for col in cells}
        gpus = [n for n in names if gpu_number(n) is not None]
    ordered = sorted(gpus, key=lambda n: (gpu_number(n) is None, gpu_number(n) or 0, n))
    if k > len(ordered):
        raise ValueError(f"the machine has {len(ordered)} GPUs; cannot choose {k}")
    ranks = {"node": rank_table(links)}
    numbers = [-1 if (i := gpu_number(n)) is None else i for n in ordered]  # -1: no index, links unknown

    def score(combo: tuple[int, ...]) -> float:
        weakest, mean = set_links([("node", numbers[i]) for i in combo], ranks)
        return topology_penalty(weakest, False, mean)

    return [ordered[i] for i in best_subset(len(ordered), k, score)]
