"""What a set of cards costs a request (R10's penalty, lower is better), and the best
k of one node's cards under it.

A set's score adds up: its hottest, busiest card (:func:`cards.thermal_penalty`), its least
healthy card, for slices the packing term of each card (:meth:`SetScoring.share_term`), for
whole cards how many of its node's cards it leaves free (:meth:`SetScoring.fit_term`), the
node's power budget (inf past it, R27) and the weakest link between its cards (topology,
R9). :class:`SetScoring` is a part of :class:`placement.World`: it reads the world's
``config``, ``packing``, ``power`` (per node with a budget: [budget W, W counted now]),
``ranks``, ``by_node`` and ``takers``, and keeps only its own memo of pair link terms. The
search (which sets there are, kept per node between starts) is ``placement.py``'s; the
arithmetic here is what ``test_scheduler_fastpath`` compares with a plain search.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping
from typing import Any
from math import comb

from ..model import MAX_ALLOCATIONS_PER_GPU
from .cards import Card, Shape
from .snapshot import SchedulerConfig
from .topology import BEST_RANK, UNKNOWN_RANK, best_subset, set_links, topology_penalty

#: one node's cards a request fits, each with what it would take there (MiB, exclusive)
Fitting = list[tuple[Card, tuple[int, bool]]]


class SetScoring:
    """The scores of one world's sets (mixed into :class:`placement.World`)."""

    # What the world it is mixed into holds (placement.World sets them; declared, not set here)
    config: SchedulerConfig
    packing: bool
    ranks: Mapping[str, Mapping[tuple[int, int], float]]
    by_node: dict[str, list[Card]]
    takers: dict[str, list[Card]]
    power: dict[str, list[float]]

    def __init__(self) -> None:
        #: node, and (link table, cards) -> pair link terms
        self._pair_memo: dict[object, dict[tuple[int, int], float]] = {}

    def share_term(self, card: Card, got: tuple[int, bool]) -> float:
        """A slice's term for one card (a set takes the mean over its cards).

        Packing (the waiting whole-card jobs need every wholly free card): a card holding
        none of our jobs costs ``w_pack`` more than the hottest, busiest card can, so any
        shared card that fits comes first. Otherwise each of our jobs on the card counts a
        quarter of ``w_load`` (the utilisation read may not show jobs placed since): the
        coolest, least shared card that fits. Either way the card the request fills best
        wins ties, so a 13 GB job takes a 24 GB card whole before it opens an 80 GB one.
        """
        total = card.total
        assert total  # a card a share fits has a size
        left = (total - card.reserved - card.unmanaged - got[0]) / total
        config = self.config
        if self.packing:
            fresh = config.w_pack + max(0.0, config.w_hot) + max(0.0, config.w_load)
            return fresh * (not card.allocs) + 1e-4 * left
        return config.w_load * len(card.allocs) / MAX_ALLOCATIONS_PER_GPU + 1e-4 * left

    def fit_term(self, shape: Shape, node: str) -> float:
        """Best fit, for whole-card requests (no ``--gpu-mem``): ``w_fit`` × the share of the
        node's cards that take work a start on it leaves wholly free. A card that takes none
        (one in MIG mode, whose instances are the devices; one in maintenance) is not
        counted: two free MIG instances are as open as a free pair. Every set of k whole
        cards on a node leaves the same number, so the term ranks nodes, never sets on one
        node: a 1-card job takes the last free card of a node before it opens a pair, and a
        2-card job takes a pair before it breaks the only four-card machine, so the gangs
        that need a machine's free cards together still find them. A node whose health
        score is below 1 gets the most the term can cost. (Slices have their own term.)"""
        if shape.gpu_mem_mb is not None or not self.config.w_fit:
            return 0.0
        cards = self.by_node[node]
        if min(c.health for c in cards) < 1.0:
            # Packing onto a node under suspicion (throttling, errors) would let the fit
            # outweigh its health term: such a node is never the one filled first.
            return self.config.w_fit
        takers = self.takers[node]
        free = sum(1 for c in takers if not c.allocs and not c.unmanaged)
        return self.config.w_fit * max(0, free - shape.gpu_count) / max(1, len(takers))

    def powered(self, value: float, power: list[float], extra: float) -> float:
        """``value`` with R27's term for a start that adds ``extra`` W to a node whose
        (budget, counted) is ``power``: inf past the budget, else ``w_power`` × the share
        of the budget counted after it (nodes with headroom first)."""
        budget, counted = power
        if counted + extra > budget:
            return math.inf
        return value + self.config.w_power * (counted + extra) / budget if budget > 0 else value

    def scores_bounded(self) -> bool:
        """Whether no score term can be negative: the searches' bounds hold only then."""
        config = self.config
        return min(config.w_hot, config.w_load, config.w_pack, config.w_health, config.w_topology,
                   config.w_power, config.w_fit) >= 0

    def best_on_node(self, shape: Shape, feasible: Fitting, k: int) -> tuple[float, Fitting]:
        """(score, [(card, fit)…]) of the best k of one node's feasible cards; the score is
        inf when no k of them fit the node's power budget together."""
        config = self.config
        if k == 1:
            best_score, best_i = math.inf, 0
            fits: dict[str, float] = {}
            for i, (card, got) in enumerate(feasible):
                fit = fits.get(card.node)
                if fit is None:
                    fit = fits[card.node] = self.fit_term(shape, card.node)
                value = self.solo_score(shape, card, got, fit)
                if value < best_score:
                    best_score, best_i = value, i
            return best_score, [feasible[best_i]]
        n = len(feasible)
        if k < n and comb(n, k) <= config.max_combinations:
            node = feasible[0][0].node
            if all(c.node == node for c, _ in feasible):
                if k == 2:
                    return self._best_pair(shape, feasible, node)
                if self.scores_bounded():
                    return self._best_pruned(shape, feasible, k)
        score = self._set_scorer(shape, feasible)
        combo = best_subset(len(feasible), k, score, config.max_combinations)
        return score(combo), [feasible[i] for i in combo]

    def _best_pair(self, shape: Shape, feasible: Fitting, node: str) -> tuple[float, Fitting]:
        """:meth:`best_on_node` for two of one node's cards (the commonest gang): every
        pair in best_subset's order, scored with :meth:`_set_scorer`'s arithmetic on plain
        locals, the link term of each pair of the node's cards worked out once per pass."""
        config = self.config
        w_health = config.w_health
        links = self._pair_links(node)
        cards = [c for c, _ in feasible]
        thermal = [c.thermal for c in cards]
        health = [c.health for c in cards]
        index = [c.index for c in cards]
        pack = shape.slice
        if pack:
            share = [self.share_term(c, f) for c, f in feasible]
        fit = self.fit_term(shape, node)
        power = self.power.get(node)
        if power is not None:
            extra = [c.extra_watts() for c in cards]
        n = len(cards)
        best, best_score = (0, 1), math.inf
        for a in range(n - 1):
            t_a, h_a, i_a = thermal[a], health[a], index[a]
            for b in range(a + 1, n):
                t_b, h_b = thermal[b], health[b]
                value = t_a if t_a >= t_b else t_b  # max([t_a, t_b])
                value += w_health * (1.0 - (h_a if h_a <= h_b else h_b))  # min([h_a, h_b])
                if pack:
                    value += (share[a] + share[b]) / 2
                if fit:
                    value += fit
                if power is not None:
                    value = self.powered(value, power, extra[a] + extra[b])
                value += links[i_a, index[b]]
                if value < best_score:
                    best, best_score = (a, b), value
        return best_score, [feasible[best[0]], feasible[best[1]]]

    def _best_pruned(self, shape: Shape, feasible: Fitting, k: int) -> tuple[float, Fitting]:
        """:meth:`best_on_node` for k >= 3 of one node's cards: best_subset's exhaustive
        search, in its order, scored by :meth:`_set_scorer`, that drops every combination
        whose first cards already cannot beat the best so far. As cards join a set its
        hottest card only gets hotter and its least healthy only less healthy, and the
        packing, fit, power and topology terms are never negative (weights are not), so the
        first two terms of a prefix bound every set that grows from it; and a prefix that
        already needs more power than its node has left grows into nothing."""
        w_health = self.config.w_health
        score = self._set_scorer(shape, feasible)
        thermal = [c.thermal for c, _ in feasible]
        health = [c.health for c, _ in feasible]
        power = self.power.get(feasible[0][0].node)
        budget, counted = (math.inf, 0.0) if power is None else power
        extra = [c.extra_watts() for c, _ in feasible]
        n = len(feasible)
        best: list[Any] = [math.inf, None]  # the best score so far and its combination
        combo: list[int] = []

        def grow(start: int, hottest: float, frailest: float, watts: float) -> None:
            if hottest + w_health * (1.0 - frailest) >= best[0] or counted + watts > budget:
                return  # nothing grown from here beats the best (or fits the budget)
            depth = len(combo)
            if depth == k:
                value = score(tuple(combo))
                if value < best[0]:
                    best[0], best[1] = value, tuple(combo)
                return
            for i in range(start, n - (k - depth) + 1):
                combo.append(i)
                t, h = thermal[i], health[i]
                grow(i + 1, t if depth == 0 or t > hottest else hottest,
                     h if depth == 0 or h < frailest else frailest, watts + extra[i])
                combo.pop()

        grow(0, -math.inf, math.inf, 0.0)
        if best[1] is None:
            return math.inf, []
        return best[0], [feasible[i] for i in best[1]]

    def _pair_links(self, node: str) -> dict[tuple[int, int], float]:
        """(index, index) -> the weighted topology term of a two-card set on ``node``;
        nodes built alike (one link table, the same models at the same indexes) share one."""
        links = self._pair_memo.get(node)
        if links is None:
            table = self.ranks.get(node) or None
            cards = self.by_node[node]
            alike = (id(table), tuple([(c.index, c.model) for c in cards]))
            links = self._pair_memo.get(alike)
            if links is None:
                links = self._pair_memo[alike] = {}
                w_topology = self.config.w_topology
                for a in cards:
                    for b in cards:
                        if a is not b:
                            rank = UNKNOWN_RANK if table is None else table.get((a.index, b.index), UNKNOWN_RANK)
                            weakest = rank if rank < BEST_RANK else BEST_RANK
                            links[a.index, b.index] = w_topology * topology_penalty(
                                weakest, a.model != b.model, rank / 1)
            self._pair_memo[node] = links
        return links

    def _set_scorer(self, shape: Shape, feasible: Fitting) -> Callable[[tuple[int, ...]], float]:
        """``combo -> set_score(shape, [feasible[i] for i in combo])`` for one node's cards,
        with each card's terms worked out once (the same arithmetic, in the same order)."""
        cards = [c for c, _ in feasible]
        node = cards[0].node
        if any(c.node != node for c in cards):
            return lambda combo: self.set_score(shape, [feasible[i] for i in combo])
        config = self.config
        w_health, w_topology = config.w_health, config.w_topology
        thermal = [c.thermal for c in cards]
        health = [c.health for c in cards]
        index = [c.index for c in cards]
        model = [c.model for c in cards]
        table = self.ranks.get(node, {})
        pack = shape.slice
        if pack:
            share = [self.share_term(c, f) for c, f in feasible]
        fit = self.fit_term(shape, node)
        power = self.power.get(node)
        extra = [c.extra_watts() for c in cards]

        def score(combo: tuple[int, ...]) -> float:
            value = max([thermal[i] for i in combo])
            value += w_health * (1.0 - min([health[i] for i in combo]))
            size = len(combo)
            if pack:
                value += sum([share[i] for i in combo]) / size
            if fit:
                value += fit
            if power is not None:
                value = self.powered(value, power, sum([extra[i] for i in combo]))
            if size > 1:
                weakest: float = BEST_RANK
                total: float = 0
                pairs = 0
                for a, b in itertools.combinations(combo, 2):
                    rank = table.get((index[a], index[b]), UNKNOWN_RANK)
                    if rank < weakest:
                        weakest = rank
                    total += rank
                    pairs += 1
                mixed = len({model[i] for i in combo}) > 1
                value += w_topology * topology_penalty(weakest, mixed, total / pairs)
            return value

        return score

    def solo_score(self, shape: Shape, card: Card, got: tuple[int, bool], fit: float) -> float:
        """:meth:`set_score` of a one-card set, without building one; ``fit`` is
        :meth:`fit_term` of the card's node."""
        value = card.base  # thermal + w_health × (1 − health)
        if shape.gpu_mem_mb is not None:
            value += self.share_term(card, got)
        if fit:
            value += fit
        power = self.power.get(card.node)
        if power is not None:
            value = self.powered(value, power, card.extra_watts())
        return value

    def set_score(self, shape: Shape, chosen: Fitting) -> float:
        """The R10 penalty of a set (lower is better; inf past a node's power budget); see
        :class:`SchedulerConfig`."""
        config = self.config
        cards = [c for c, _ in chosen]
        value = max(c.thermal for c in cards)
        value += config.w_health * (1.0 - min(c.health for c in cards))
        if shape.slice:
            value += sum([self.share_term(c, f) for c, f in chosen]) / len(cards)
        for node in dict.fromkeys(c.node for c in cards):
            value += self.fit_term(shape, node)
            power = self.power.get(node)
            if power is not None:
                value = self.powered(value, power, sum([c.extra_watts() for c in cards if c.node == node]))
        if len(cards) > 1:
            weakest, mean = set_links([(c.node, c.index) for c in cards], self.ranks)
            mixed = len({c.model for c in cards}) > 1
            value += config.w_topology * topology_penalty(weakest, mixed, mean)
        return value
