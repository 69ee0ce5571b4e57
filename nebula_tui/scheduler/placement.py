"""Gang placement (R8) scored by load, health and topology (R9, R10) over one pass's cards.

:class:`World` is the pass's own, mutable view of every card: each start is applied to it
before the next job is looked at, so two jobs of one pass never get the same memory.
:meth:`World.search` finds the best set for a request or says how close the cluster came.
It caches per (request shape, node) and recomputes a node only after a start changed it, so
a long queue behind a full cluster costs little.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ..model import GpuView, Placement
from .filters import Filter, parse_version
from .slices import fit
from .snapshot import SchedulerConfig
from .topology import best_subset, rank_table, set_links, topology_penalty


class Card:
    """One GPU as the pass sees it: static facts plus our allocations, updated per start."""

    __slots__ = ("uuid", "node", "index", "order", "total", "unmanaged", "blocked", "health",
                 "model", "vendor", "capability", "cuda", "thermal", "allocs", "reserved",
                 "exclusive", "service")

    def __init__(self, view: GpuView, order: int, services: frozenset[int],
                 config: SchedulerConfig) -> None:
        reading = view.reading
        self.uuid = reading.uuid
        self.node = view.node
        self.index = reading.index
        self.order = order
        self.total = reading.memory_total_mb
        self.unmanaged = max(0, view.unmanaged_used_mb)
        self.blocked = view.blocked or ("GPU in maintenance" if view.maintenance else None)
        self.health = 1.0 if view.health_score is None else view.health_score
        self.model = reading.name
        self.vendor = (reading.vendor or "nvidia").lower()
        self.capability = parse_version(reading.compute_cap)
        self.cuda = parse_version(view.cuda_version)
        self.thermal = thermal_penalty(reading.utilization_pct, reading.temperature_c, config)
        self.allocs: list[tuple[int, Placement]] = list(view.placements)
        self.reserved = sum(p.memory_mb for _, p in self.allocs)
        self.exclusive = any(p.exclusive for _, p in self.allocs)
        self.service = any(job in services for job, _ in self.allocs)

    def copy(self) -> Card:
        other = object.__new__(Card)
        for name in Card.__slots__:
            setattr(other, name, getattr(self, name))
        other.allocs = list(self.allocs)
        return other

    def fit(self, gpu_mem_mb: int | None, service_job: bool, spare_mb: int):
        keep = spare_mb if (self.service or service_job) else 0
        return fit(self.total, self.unmanaged, self.reserved, len(self.allocs), self.exclusive,
                   gpu_mem_mb, keep)

    def add(self, job_id: int, placement: Placement, service: bool) -> None:
        self.allocs.append((job_id, placement))
        self.reserved += placement.memory_mb
        self.exclusive = self.exclusive or placement.exclusive
        self.service = self.service or service

    def drop(self, job_ids: set[int]) -> None:
        self.allocs = [(j, p) for j, p in self.allocs if j not in job_ids]
        self.reserved = sum(p.memory_mb for _, p in self.allocs)
        self.exclusive = any(p.exclusive for _, p in self.allocs)


def thermal_penalty(util_pct: float | None, temp_c: float | None, config: SchedulerConfig) -> float:
    """R10's first term: ``w_hot`` if hotter than ``hot_c``, plus ``w_load`` × load (0…1).

    Load is the larger of utilisation (in ``util_step_pct`` steps) and warmth (0 at
    ``warm_c``, 1 at ``hot_c``). A missing reading counts as idle and cool.
    """
    util = min(100.0, max(0.0, util_pct or 0.0))
    step = config.util_step_pct
    if step > 0:
        util = math.floor(util / step) * step
    load = util / 100.0
    hot = False
    if temp_c is not None:
        span = max(1e-9, config.hot_c - config.warm_c)
        load = max(load, min(1.0, max(0.0, (temp_c - config.warm_c) / span)))
        hot = temp_c > config.hot_c
    return config.w_hot * hot + config.w_load * load


@dataclass(frozen=True)
class Shape:
    """A request as placement sees it; jobs with equal shapes get equal answers."""

    gpu_count: int
    gpu_mem_mb: int | None
    service: bool
    max_nodes: int
    filter: Filter

    @property
    def slice(self) -> bool:
        return self.gpu_mem_mb is not None


@dataclass
class Found:
    cards: list[Card]
    fits: list[tuple[int, bool]]
    score: float

    def placements(self) -> tuple[Placement, ...]:
        return tuple(Placement(c.uuid, c.node, c.index, mb, exclusive)
                     for c, (mb, exclusive) in zip(self.cards, self.fits))


@dataclass
class _Index:
    """One request's heap of (score, node order, node version, node, chosen set)."""

    cursor: int
    heap: list = field(default_factory=list)


@dataclass
class Missed:
    """No set fits now; how many cards fit per node (for "best now: node01 has 1")."""

    counts: dict[str, int] = field(default_factory=dict)


class World:
    """Every card of the pass, grouped by node in listing order, with a per-node cache."""

    def __init__(self, cards: list[Card], ranks: Mapping[str, Mapping[tuple[int, int], int]],
                 config: SchedulerConfig) -> None:
        self.cards = cards
        self.ranks = ranks
        self.config = config
        self.by_node: dict[str, list[Card]] = {}
        for card in cards:
            self.by_node.setdefault(card.node, []).append(card)
        self.by_uuid = {c.uuid: c for c in cards}
        self.version = dict.fromkeys(self.by_node, 0)
        #: per node, cards holding none of our allocations (a quick bound for whole cards)
        self.empty = {node: sum(1 for c in cards if not c.allocs) for node, cards in self.by_node.items()}
        self._changes: list[str] = []  # nodes changed by starts, in order
        self._eligible: dict[tuple, dict[str, list[Card]]] = {}
        self._index: dict[tuple, _Index] = {}
        self._feasible_cache: dict[tuple, dict[str, tuple[int, list]]] = {}

    @classmethod
    def build(cls, views: Sequence[GpuView], topologies: Mapping[str, Mapping], services: Iterable[int],
              config: SchedulerConfig) -> World:
        services = frozenset(services)
        cards = [Card(v, i, services, config) for i, v in enumerate(views)]
        ranks = {node: rank_table(links) for node, links in topologies.items()}
        return cls(cards, ranks, config)

    def future(self, ended: set[int]) -> World:
        """This world once the jobs in ``ended`` have released their cards (no cache)."""
        cards = []
        for card in self.cards:
            if any(j in ended for j, _ in card.allocs):
                card = card.copy()  # cards nobody leaves are shared: a future world only reads
                card.drop(ended)
            cards.append(card)
        return World(cards, self.ranks, self.config)

    def holders(self) -> set[int]:
        return {j for c in self.cards for j, _ in c.allocs}

    def apply(self, job_id: int, found: Found, service: bool) -> tuple[Placement, ...]:
        placements = found.placements()
        for card, placement in zip(found.cards, placements):
            if not card.allocs:
                self.empty[card.node] -= 1
            card.add(job_id, placement, service)
            self.version[card.node] += 1
            self._changes.append(card.node)
        return placements

    # ------------------------------------------------------------ which cards may serve
    def eligible(self, shape: Shape) -> dict[str, list[Card]]:
        """Per node, the cards that pass the filters, are not blocked, are healthy enough,
        and could hold one GPU's share of the request when empty of our jobs."""
        key = (shape.filter, shape.gpu_mem_mb, shape.service)
        found = self._eligible.get(key)
        if found is None:
            found = {}
            for node, cards in self.by_node.items():
                usable = [c for c in cards if self.hardware_ok(c, shape) and not c.blocked
                          and c.health >= self.config.min_health_score]
                if usable:
                    found[node] = usable
            self._eligible[key] = found
        return found

    def hardware_ok(self, card: Card, shape: Shape) -> bool:
        f = shape.filter
        if f.vendor and card.vendor != f.vendor:
            return False
        if f.arch and not f.arch.accepts(card.capability):
            return False
        if f.cuda and (card.cuda is None or card.cuda < f.cuda):
            return False
        keep = self.config.service_spare_mb if shape.service else 0
        return fit(card.total, 0, 0, 0, False, shape.gpu_mem_mb, keep) is not None

    # ------------------------------------------------------------ the search
    def search(self, shape: Shape, excluded: frozenset[str] = frozenset(), token: object = None
               ) -> Found | Missed:
        """The best set for ``shape``, never touching ``excluded`` cards (a reservation).

        ``token`` names ``excluded`` for the cache (None: nothing excluded). One node is
        always preferred; several only when ``max_nodes`` allows and no node suffices.
        Per (shape, token) a heap holds each node's best set; a start marks its node
        changed, and only changed nodes are looked at again.
        """
        k = shape.gpu_count
        eligible = self.eligible(shape)
        index = self._index.get((shape, token))
        if index is None:
            index = _Index(cursor=len(self._changes))
            whole = shape.gpu_mem_mb is None
            for node, cards in eligible.items():
                if len(cards) >= k and not (whole and self.empty[node] < k):
                    self._push(index, shape, node, cards, excluded, token)
            self._index[(shape, token)] = index
        if index.cursor < len(self._changes):
            for node in dict.fromkeys(self._changes[index.cursor:]):
                cards = eligible.get(node)
                if cards is not None and len(cards) >= k:
                    self._push(index, shape, node, cards, excluded, token)
            index.cursor = len(self._changes)
        heap = index.heap
        while heap:
            score, _, version, node, chosen = heap[0]
            if version == self.version[node]:
                return Found([c for c, _ in chosen], [f for _, f in chosen], score)
            heapq.heappop(heap)  # superseded by the entry pushed when the node changed
        per_node = {node: self._feasible(shape, node, cards, excluded, token)
                    for node, cards in eligible.items()}
        if shape.max_nodes > 1:
            found = self._across_nodes(shape, per_node)
            if found is not None:
                return found
        return Missed({node: len(f) for node, f in per_node.items()})

    def _feasible(self, shape: Shape, node: str, cards: list[Card], excluded: frozenset[str],
                  token: object) -> list:
        """[(card, fit)] of the node's cards that can take one share of ``shape`` now.

        Shared by every shape of one request class (gang size does not change a card's fit)
        and kept until a start changes the node.
        """
        per_class = self._feasible_cache.setdefault(
            (shape.filter, shape.gpu_mem_mb, shape.service, token), {})
        version = self.version[node]
        cached = per_class.get(node)
        if cached is not None and cached[0] == version:
            return cached[1]
        mem, service = shape.gpu_mem_mb, shape.service
        feasible = []
        if mem is None:  # whole cards: empty of ours and of anyone else's memory
            for card in cards:
                if not card.allocs and not card.unmanaged and card.uuid not in excluded:
                    feasible.append((card, (card.total, True)))
        else:
            spare = self.config.service_spare_mb
            for card in cards:
                if card.uuid in excluded:
                    continue
                got = card.fit(mem, service, spare)
                if got is not None:
                    feasible.append((card, got))
        per_class[node] = (version, feasible)
        return feasible

    def _push(self, index: _Index, shape: Shape, node: str, cards: list[Card],
              excluded: frozenset[str], token: object) -> None:
        feasible = self._feasible(shape, node, cards, excluded, token)
        if len(feasible) >= shape.gpu_count:
            score, chosen = self.best_on_node(shape, feasible, shape.gpu_count)
            heapq.heappush(index.heap, (score, cards[0].order, self.version[node], node, chosen))

    def best_on_node(self, shape: Shape, feasible: list, k: int) -> tuple[float, list]:
        """(score, [(card, fit)…]) of the best k of one node's feasible cards."""
        config = self.config
        ranks = self.ranks

        def score(combo: tuple[int, ...]) -> float:
            chosen = [feasible[i] for i in combo]
            return self.set_score(shape, chosen, ranks, config)

        if k == 1:
            best_score, best_i = math.inf, 0
            for i, (card, got) in enumerate(feasible):
                value = self.solo_score(shape, card, got)
                if value < best_score:
                    best_score, best_i = value, i
            return best_score, [feasible[best_i]]
        combo = best_subset(len(feasible), k, score, config.max_combinations)
        return score(combo), [feasible[i] for i in combo]

    def solo_score(self, shape: Shape, card: Card, got: tuple[int, bool]) -> float:
        """:meth:`set_score` of a one-card set, without building one."""
        config = self.config
        value = card.thermal + config.w_health * (1.0 - card.health)
        if shape.gpu_mem_mb is not None:
            left = (card.total - card.reserved - card.unmanaged - got[0]) / card.total
            value += config.w_pack * (not card.allocs) + 1e-4 * left
        return value

    @staticmethod
    def set_score(shape: Shape, chosen: list, ranks, config: SchedulerConfig) -> float:
        """The R10 penalty of a set (lower is better); see :class:`SchedulerConfig`."""
        cards = [c for c, _ in chosen]
        value = max(c.thermal for c in cards)
        value += config.w_health * (1.0 - min(c.health for c in cards))
        if shape.slice:
            fresh = sum(1 for c in cards if not c.allocs) / len(cards)
            # Best fit breaks ties: the fuller card keeps the emptier one whole for later.
            left = sum((c.total - c.reserved - c.unmanaged - f[0]) / c.total
                       for c, f in chosen) / len(cards)
            value += config.w_pack * fresh + 1e-4 * left
        if len(cards) > 1:
            weakest, mean = set_links([(c.node, c.index) for c in cards], ranks)
            mixed = len({c.model for c in cards}) > 1
            value += config.w_topology * topology_penalty(weakest, mixed, mean)
        return value

    def _across_nodes(self, shape: Shape, per_node: dict[str, list]) -> Found | None:
        """Fewest nodes first (R8): take from the nodes with the most fitting cards."""
        k = shape.gpu_count
        order = {node: cards[0].order for node, cards in self.by_node.items()}
        nodes = sorted((n for n, f in per_node.items() if f), key=lambda n: (-len(per_node[n]), order[n]))
        taken, need = [], k
        for node in nodes:
            if need == 0:
                break
            take = min(need, len(per_node[node]))
            taken.append((node, take))
            need -= take
        if need or len(taken) > shape.max_nodes:
            return None
        chosen = []
        for node, take in taken:
            chosen += self.best_on_node(shape, per_node[node], take)[1]
        score = self.set_score(shape, chosen, self.ranks, self.config)
        return Found([c for c, _ in chosen], [f for _, f in chosen], score)
