"""Gang placement (R8): the best set of cards for a request over one pass's cards, by the
scores of ``scoring.py`` (load, health, topology: R9, R10).

:class:`World` is the pass's own, mutable view of every card: each start is applied to it
before the next job is looked at, so two jobs of one pass never get the same memory.
:meth:`World.search` finds the best set for a request or says how close the cluster came.
It shares work between requests (one sorted board of nodes per request class, read by
every filter; cards alike are filtered once) and between starts (a node, or a card, is
worked out again only after a start changed it), so a long queue behind a full cluster
costs little. The tests compare it with a straightforward search over every card
(``test_scheduler_fastpath``).

Why one module: the search and its caches are one thing. Each start changes a node, and
every cache here (each node's fits, best sets, boards, eligibility, misses) is keyed and
dropped by that same change; apart, the rule of when each is stale would be split too.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar, overload

from ..model import GpuView, Placement
from .cards import Card, Found, Hardware, Known, Shape
from .filters import Filter
from .scoring import Fitting, SetScoring
from .slices import fit
from .snapshot import SchedulerConfig
from .topology import rank_table

#: what a card can give one share of a request: (MiB, exclusive)
Fit = tuple[int, bool]
#: a node's best set for a request class: (score, [(card, fit)]), or None when none fits
Best = tuple[float, Fitting] | None
#: where a best set is kept: the node (all its takers allowed) or (node, allowed mask)
Slot = str | tuple[str, int]
#: slot -> (the node's version it was worked out at, its best set)
BestCache = dict[Slot, tuple[int, Best]]
#: a request class as the search's index knows it: (eligibility sig, memory, service,
#: gang size, the token of the excluded cards or None)
IndexKey = tuple[int, int | None, bool, int, object]
#: (memory, service, gang size): one board, one best cache
ClassKey = tuple[int | None, bool, int]
#: a node's NVLink/PCIe matrix as its agent reports it (row -> column -> link code)
Links = Mapping[str, Mapping[str, str]]
#: one node's pair ranks (topology.rank_table)
RankTable = dict[tuple[int, int], float]
_T = TypeVar("_T")


class _Fits:
    """What one node's takers can give one (memory, service) request now, by their place
    among the takers: ``pairs`` (card, fit) or None, ``scores`` the one-card score (inf when
    it does not fit). A start lists the places it changed in ``dirty``; only those are
    worked out again. ``feasible``: the pairs that fit, in order (made when asked for);
    ``mask``: their bits."""

    __slots__ = ("pairs", "scores", "dirty", "feasible", "mask")

    def __init__(self, size: int) -> None:
        self.pairs: list[tuple[Card, tuple[int, bool]] | None] = [None] * size
        self.scores: list[float] = [math.inf] * size
        self.dirty: list[int] = list(range(size))
        self.feasible: Fitting | None = None
        self.mask = 0  # the bits (Card.bit) of the cards that fit


class _Board:
    """Every node's best set for one (memory, service, gang size) request class, best first.

    Shared by every filter and reservation that allows all of a node's takers (most of
    them, on most nodes): after a start, the changed node is worked out and re-sorted once
    per class, not once per filter. ``entries``: (score, node order, node), sorted.

    A gang's best set costs far more to work out than a bound on its score, and a search
    needs only the first node it may use. On a ``lazy`` board a node's entry may hold a
    lower bound instead (the node is then in ``loose``); a bound that comes first is
    replaced by the node's score before it is believed (:meth:`World._top`).
    """

    __slots__ = ("entries", "where", "cursor", "cache", "lazy", "loose")

    def __init__(self, cursor: int, cache: BestCache, lazy: bool) -> None:
        self.entries: list[tuple[float, int, str]] = []
        self.where: dict[str, tuple[float, int, str]] = {}  # node -> its entry
        self.cursor = cursor  # how many of the world's changes the board has seen
        self.cache = cache  # slot -> (node version, (score, chosen) | None)
        self.lazy = lazy
        self.loose: set[str] = set()


@dataclass
class _Index:
    """How one request class (cards selected, memory, service, gang size, exclusion) reads
    the board: ``full`` nodes allow all their takers (their best is the board's);
    ``partial`` nodes allow only some, as (node, allowed mask, cache slot), each worked
    out on its own."""

    full: frozenset[str]
    covers_board: bool  # full holds every node of the board: its first entry is the best
    partial: list[tuple[str, int, Slot]]


@dataclass
class Missed:
    """No set fits now; how many cards fit per node (for "best now: node01 has 1")."""

    counts: dict[str, int] = field(default_factory=dict)


@dataclass
class Eligibility:
    """Which cards may ever serve one (filter, memory, service) request class.

    ``cards``: per node, the usable cards in listing order; ``masks``: the same cards as a
    bit mask of their positions on the node (:attr:`Card.bit`); ``sig``: equal for request
    classes that select exactly the same cards, so they share one search (``--arch '>=sm_80'``
    on a cluster of Ampere and newer selects what no ``--arch`` selects); ``sizes``: each
    node's count of such cards, most first.
    """

    cards: dict[str, list[Card]]
    masks: dict[str, int]
    sig: int
    sizes: list[int]  # how many such cards each node has, most first


class LazyRanks(dict[str, RankTable]):
    """node -> ``rank_table(links)``, worked out the first time a node is asked for (only
    nodes a gang is scored on need one), and once per distinct matrix: nodes built alike
    share one read-only table."""

    def __init__(self, topologies: Mapping[str, Links]) -> None:
        super().__init__()
        self.topologies = topologies
        self._alike: dict[tuple[tuple[str, tuple[tuple[str, str], ...]], ...], RankTable] = {}

    @overload
    def get(self, node: str, default: None = None, /) -> RankTable | None: ...
    @overload
    def get(self, node: str, default: RankTable, /) -> RankTable: ...
    @overload
    def get(self, node: str, default: _T, /) -> RankTable | _T: ...

    def get(self, node: str, default: object = None, /) -> object:
        table = dict.get(self, node)
        if table is None:
            links = self.topologies.get(node)
            if links is None:
                return default
            content = tuple([(row, tuple(cells.items())) for row, cells in links.items()])
            table = self._alike.get(content)
            if table is None:
                table = self._alike[content] = rank_table(links)
            self[node] = table
        return table

    def __missing__(self, node: str) -> RankTable:
        table = self.get(node)
        if table is None:
            raise KeyError(node)
        return table

    def __contains__(self, node: object) -> bool:
        return dict.__contains__(self, node) or node in self.topologies


class World(SetScoring):
    """Every card of the pass, grouped by node in listing order, with per-node caches.

    Cost model: a pass asks for many request shapes, each over every node. Work is shared
    at three levels, each recomputed for a node only after a start changed that node:

    * per (node, memory, service): the node's cards that can take one share now
      (``_fits``); the hardware filter is a bit mask over them, computed once per
      hardware class (vendor, capability, CUDA, memory) rather than per card;
    * per (node, memory, service, gang size, allowed cards): the node's best set
      (``_best``), shared by every filter that allows the same cards there;
    * per (memory, service, gang size): every node's best set over all its takers, kept
      sorted (:class:`_Board`); a request reads the first node it may use whole, and works
      out on their own only the nodes it may use in part (mixed hardware, a reservation).
    """

    def __init__(self, cards: list[Card], ranks: Mapping[str, Mapping[tuple[int, int], float]],
                 config: SchedulerConfig, states: dict[tuple[object, ...], int] | None = None,
                 budgets: Mapping[str, float] | None = None, packing: bool = False) -> None:
        super().__init__()
        self.cards = cards
        self.ranks = ranks
        self.config = config
        #: whether slices fill shared cards first (whole cards are scarce) or go to the
        #: coolest, least shared card (see :meth:`set_packing`)
        self.packing = packing
        #: R27: per node with a power budget, (budget W, W counted now); see Card.extra_watts
        self.budgets = dict(budgets or {})
        self.power: dict[str, list[float]] = {}
        self.by_node: dict[str, list[Card]] = {}
        for card in cards:
            self.by_node.setdefault(card.node, []).append(card)
        self.by_uuid = {c.uuid: c for c in cards}
        self.version = dict.fromkeys(self.by_node, 0)
        #: per node, cards holding none of our allocations (a quick bound for whole cards)
        self.empty = {node: sum(1 for c in cards if not c.allocs) for node, cards in self.by_node.items()}
        #: one card of each hardware class (what the filters and the empty-card fit look at)
        self.classes: dict[Hardware, Card] = {}
        #: per node, the cards that take new work (not blocked, healthy enough), their mask,
        #: and their hardware classes (one on most nodes)
        self.takers: dict[str, list[Card]] = {}
        self.takers_mask: dict[str, int] = {}
        self.takers_hw: dict[str, tuple[Hardware, ...]] = {}
        #: per node, how many of its cards (all of them) are of each hardware class
        self.node_hw: dict[str, dict[Hardware, int]] = {}
        #: card state (Card.state_key) -> a number naming it: cheap to hash per card and
        #: request class. Shared with this world's futures, which share unchanged cards.
        self._states: dict[tuple[object, ...], int] = {} if states is None else states
        floor = config.min_health_score
        states, by_class = self._states, self.classes
        for node, node_cards in self.by_node.items():
            takers: list[Card] = []
            mask = 0
            for position, card in enumerate(node_cards):
                card.bit = 1 << position
                card.spot = -1
                key = card.state_key()  # _state_number, inline: every card of every future world
                state = states.get(key)
                if state is None:
                    state = states[key] = len(states)
                card.state = state
                if card.hw not in by_class:
                    by_class[card.hw] = card
                if not card.blocked and card.health >= floor:
                    card.spot = len(takers)
                    takers.append(card)
                    mask |= card.bit
            self.takers[node] = takers
            self.takers_mask[node] = mask
            self.takers_hw[node] = tuple(dict.fromkeys(c.hw for c in takers))
            classes: dict[Hardware, int] = {}
            for card in node_cards:
                classes[card.hw] = classes.get(card.hw, 0) + 1
            self.node_hw[node] = classes
        for node, budget in self.budgets.items():
            if node in self.by_node:
                self.power[node] = [budget, sum(c.watts if c.allocs else c.draw for c in self.by_node[node])]
        #: cards that take new work and are wholly free (no job of ours, nobody's memory)
        self.whole_free = sum(1 for takers in self.takers.values() for c in takers
                              if not c.allocs and not c.unmanaged)
        self._changes: list[str] = []  # nodes changed by starts, in order
        self.touched: set[str] = set()  # cards changed by starts (their uuids)
        self._eligible: dict[tuple[Filter, int | None, bool], Eligibility] = {}
        self._by_classes: dict[frozenset[Hardware], Eligibility] = {}  # accepted hardware classes
        self._by_shape: dict[int, tuple[Shape, Eligibility]] = {}
        self._sigs: dict[tuple[tuple[str, ...], tuple[int, ...]], int] = {}
        self._index: dict[IndexKey, _Index] = {}
        self._boards: dict[ClassKey, _Board] = {}
        self._fits: dict[tuple[str, int | None, bool], _Fits] = {}  # (node, memory, service)
        self._node_fits: dict[str, list[_Fits]] = {node: [] for node in self.by_node}
        self._best: dict[ClassKey, BestCache] = {}
        self._excluded: dict[object, dict[str, int]] = {}
        #: (eligibility sig, memory, service, token) -> (changes seen, counts); see _counts
        self._missed: dict[tuple[int, int | None, bool, object], tuple[int, dict[str, int]]] = {}
        self.node_order = {node: node_cards[0].order for node, node_cards in self.by_node.items()}
        #: (memory, service) -> card state (Card.state) -> _answer
        self._answers: dict[tuple[int | None, bool], dict[int, tuple[Fit | None, float]]] = {}
        #: ready_times' answers: (eligibility, memory, service) -> node -> (version, times),
        #: for the ``ends`` mapping they were worked out from
        self._ready_kept: dict[tuple[int, int | None, bool], dict[str, tuple[int, list[float]]]] = {}
        self._ready_for: object = None

    @classmethod
    def build(cls, views: Sequence[GpuView], topologies: Mapping[str, Links], services: Iterable[int],
              config: SchedulerConfig, budgets: Mapping[str, float] | None = None) -> World:
        held = frozenset(services)
        memo: dict[tuple[object, ...], Known] = {}
        cards = [Card(v, i, held, config, memo) for i, v in enumerate(views)]
        return cls(cards, LazyRanks(topologies), config, budgets=budgets)

    def set_packing(self, packing: bool) -> None:
        """Slices fill shared cards first (``packing``) or spread to the coolest, least
        shared cards. The pass decides before each search; scores kept for the other way
        are dropped (it changes a few times a pass at most)."""
        if packing == self.packing:
            return
        self.packing = packing
        self._fits.clear()
        for kept in self._node_fits.values():
            kept.clear()
        self._boards.clear()
        self._best.clear()
        self._answers.clear()

    def future(self, ended: set[int], nodes: Collection[str] | None = None) -> World:
        """This world once the jobs in ``ended`` have released their cards (no cache),
        of only ``nodes`` when given (each node's answers depend on its own cards alone)."""
        cards = []
        kept = self.cards if nodes is None else [c for node in self.by_node if node in nodes
                                                 for c in self.by_node[node]]
        for card in kept:
            if card.allocs and any(j in ended for j, _ in card.allocs):
                card = card.copy()  # cards nobody leaves are shared: a future world only reads
                card.drop(ended)
            cards.append(card)
        return type(self)(cards, self.ranks, self.config, self._states, self.budgets, self.packing)

    def _state_number(self, card: Card) -> int:
        key = card.state_key()
        number = self._states.get(key)
        if number is None:
            number = self._states[key] = len(self._states)
        return number

    def changes(self) -> int:
        """How many cards starts have changed so far (a cheap version of the whole world)."""
        return len(self._changes)

    def holders(self) -> set[int]:
        return {j for c in self.cards for j, _ in c.allocs}

    def apply(self, job_id: int, found: Found, service: bool) -> tuple[Placement, ...]:
        placements = found.placements()
        for card, placement in zip(found.cards, placements):
            extra = card.extra_watts()
            if not card.allocs:
                self.empty[card.node] -= 1
                if not card.unmanaged and card.spot >= 0:
                    self.whole_free -= 1
            card.add(job_id, placement, service)
            card.state = self._state_number(card)
            self.touched.add(card.uuid)
            power = self.power.get(card.node)
            if power is not None and extra:
                power[1] += extra  # every card of the node now has less headroom
                for fits in self._node_fits[card.node]:
                    fits.dirty = list(range(len(self.takers[card.node])))
            else:
                for fits in self._node_fits[card.node]:
                    fits.dirty.append(card.spot)
            self.version[card.node] += 1
            self._changes.append(card.node)
        return placements

    # ------------------------------------------------------------ which cards may serve
    def eligible(self, shape: Shape) -> dict[str, list[Card]]:
        """Per node, the cards that pass the filters, are not blocked, are healthy enough,
        and could hold one GPU's share of the request when empty of our jobs."""
        return self.eligibility(shape).cards

    def eligibility(self, shape: Shape) -> Eligibility:
        seen = self._by_shape.get(id(shape))  # the entry holds the shape: its id stays its own
        if seen is not None and seen[0] is shape:
            return seen[1]
        key = (shape.filter, shape.gpu_mem_mb, shape.service)
        found = self._eligible.get(key)
        if found is not None:
            self._by_shape[id(shape)] = (shape, found)
        else:
            ok = {hw: self.hardware_ok(card, shape) for hw, card in self.classes.items()}
            # request classes that accept the same hardware classes select the same cards
            accepted = frozenset(hw for hw, yes in ok.items() if yes)
            f = shape.filter
            if f.nodes is not None or f.excluded:  # -w/-x: its own choice of nodes
                found = self._select(ok, f.node_ok)
            else:
                found = self._by_classes.get(accepted)
                if found is None:
                    found = self._by_classes[accepted] = self._select(ok)
            self._eligible[key] = found
            self._by_shape[id(shape)] = (shape, found)
        return found

    def _select(self, ok: Mapping[Hardware, bool], node_ok: Callable[[str], bool] | None = None) -> Eligibility:
        """The cards of the hardware classes ``ok`` accepts, node by node (only on the
        nodes ``node_ok`` accepts, when given: -w/-x)."""
        cards: dict[str, list[Card]] = {}
        masks: dict[str, int] = {}
        for node, classes in self.takers_hw.items():
            if node_ok is not None and not node_ok(node):
                continue
            passed = [ok[hw] for hw in classes]
            if all(passed):  # the common case: every card of the node (one shared list)
                if classes:
                    cards[node] = self.takers[node]
                    masks[node] = self.takers_mask[node]
            elif any(passed):
                usable = [c for c in self.takers[node] if ok[c.hw]]
                cards[node] = usable
                masks[node] = sum(c.bit for c in usable)
        # two tuples, not one pair per node: fewer objects for the garbage collector
        sig = self._sigs.setdefault((tuple(masks), tuple(masks.values())), len(self._sigs))
        return Eligibility(cards, masks, sig, sorted(map(len, cards.values()), reverse=True))

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
        The best node is the first on the class's board that the request may use whole,
        unless a node it may use only in part (a mixed node, a reservation) does better.
        """
        elig = self.eligibility(shape)
        skip = self._excluded_bits(excluded, token)
        board = self._board(shape)
        key = (elig.sig, shape.gpu_mem_mb, shape.service, shape.gpu_count, token)
        index = self._index.get(key)
        if index is None:
            index = self._index[key] = self._make_index(shape, elig, skip, board, key)
        best = self._top(shape, board, None if index.covers_board else index.full)
        cache = board.cache
        found = None if best is None else cache[best[2]][1]
        if index.partial:
            version, order = self.version, self.node_order
            for node, allowed, slot in index.partial:
                cached = cache.get(slot)
                got = cached[1] if cached is not None and cached[0] == version[node] else \
                    self._best_for(shape, node, allowed, cache, slot)
                if got is not None and (best is None or (got[0], order[node]) < best[:2]):
                    best, found = (got[0], order[node], node), got
        if found is not None:
            chosen = found[1]
            return Found([c for c, _ in chosen], [f for _, f in chosen], found[0])
        counts = self._counts(shape, elig, skip, token)
        if shape.max_nodes > 1:
            # _across_nodes takes the nodes with the most such cards first: it needs no others
            order = self.node_order
            top = sorted((n for n, c in counts.items() if c), key=lambda n: (-counts[n], order[n]))
            across = self._across_nodes(shape, self._per_node(shape, top[:shape.max_nodes], elig.masks, skip))
            if across is not None:
                return across
        return Missed(counts)

    def _counts(self, shape: Shape, elig: Eligibility, skip: Mapping[str, int], token: object
                ) -> dict[str, int]:
        """Per eligible node, how many of its allowed cards fit one share now. Requests of
        other gang sizes read the same counts; only nodes changed since they were last
        counted are counted again."""
        mem, service = shape.gpu_mem_mb, shape.service
        key = (elig.sig, mem, service, token)
        seen = self._missed.get(key)
        changes = self._changes
        if seen is None:
            nodes: Iterable[str] = elig.masks
            counts: dict[str, int] = {}
        else:
            cursor, counts = seen
            nodes = dict.fromkeys(changes[cursor:])
        masks, kept = elig.masks, self._fits
        for node in nodes:
            mask = masks.get(node)
            if mask is not None:
                allowed = mask & ~skip[node] if node in skip else mask
                fits = kept.get((node, mem, service))
                if fits is None or fits.dirty:
                    fits = self._fits_now(node, mem, service)
                counts[node] = (fits.mask & allowed).bit_count()
        self._missed[key] = (len(changes), counts)
        return dict(counts)  # the caller's own: later starts update the kept one

    def _make_index(self, shape: Shape, elig: Eligibility, skip: Mapping[str, int],
                    board: _Board, key: IndexKey) -> _Index:
        k, full_mask = shape.gpu_count, self.takers_mask
        if skip:
            # Excluded cards (reservations: a new set for each one a pass adds) lie on a few
            # nodes: the index without them, with only those nodes read again.
            plain = key[:-1] + (None,)
            base = self._index.get(plain)
            if base is None:
                base = self._index[plain] = self._make_index(shape, elig, {}, board, plain)
            masks = elig.masks
            partial: list[tuple[str, int, Slot]] = [
                (node, allowed & ~skip[node], (node, allowed & ~skip[node])) if node in skip
                else (node, allowed, slot) for node, allowed, slot in base.partial]
            full = base.full
            moved = [node for node in skip if node in full]
            if moved:
                whole = set(full)
                for node in moved:
                    allowed = masks[node] & ~skip[node]
                    if allowed != full_mask[node]:
                        whole.discard(node)
                        partial.append((node, allowed, (node, allowed)))
                full = frozenset(whole)
            return _Index(full, board.where.keys() <= full, partial)
        whole, partial = set(), []
        for node, cards in elig.cards.items():
            if len(cards) >= k:
                allowed = elig.masks[node] & ~skip[node] if node in skip else elig.masks[node]
                if allowed == full_mask[node]:
                    whole.add(node)
                else:
                    partial.append((node, allowed, (node, allowed)))
        # nodes leave a board (a start only takes cards) but never join it again
        return _Index(frozenset(whole), board.where.keys() <= whole, partial)

    def _board(self, shape: Shape) -> _Board:
        """The class's board, brought up to date with the starts since it was last read."""
        k, mem, service = shape.gpu_count, shape.gpu_mem_mb, shape.service
        board = self._boards.get((mem, service, k))
        changes = self._changes
        if board is None:
            cache = self._best.setdefault((mem, service, k), {})
            # the bound (see _entry) holds when no score term can be negative
            lazy = k > 1 and self.scores_bounded()
            board = self._boards[(mem, service, k)] = _Board(len(changes), cache, lazy)
            empty = self.empty
            for node, takers in self.takers.items():
                # whole cards: a node with fewer than k cards free of ours never gains one
                if len(takers) < k or (mem is None and empty[node] < k):
                    continue
                entry = self._entry(shape, board, node)
                if entry is not None:
                    board.entries.append(entry)
            board.entries.sort()
        elif board.cursor < len(changes):
            entries, where, loose = board.entries, board.where, board.loose
            for node in dict.fromkeys(changes[board.cursor:]):
                old = where.pop(node, None)
                if old is None:
                    continue  # not on the board: it could not hold the class, and a start only takes
                del entries[bisect_left(entries, old)]
                loose.discard(node)
                entry = self._entry(shape, board, node)
                if entry is not None:
                    insort(entries, entry)
            board.cursor = len(changes)
        return board

    def _entry(self, shape: Shape, board: _Board, node: str) -> tuple[float, int, str] | None:
        """The node's entry on ``board`` (recorded in ``where``), or None if it holds no set.

        On a lazy board, unless the node's best is already known: a bound. Every set of k
        cards scores at least as much as its hottest card's thermal term plus the health
        term of its least healthy card, so at least as much as the largest fixed score
        part (Card.base) among its cards, and so at least the k-th smallest of them.
        """
        cache = board.cache
        cached = cache.get(node)
        if cached is not None and cached[0] == self.version[node]:
            found = cached[1]
        elif board.lazy:
            k = shape.gpu_count
            feasible = self._fitting(node, shape.gpu_mem_mb, shape.service)
            if len(feasible) < k:
                return None
            board.loose.add(node)
            board.where[node] = entry = (sorted([c.base for c, _ in feasible])[k - 1],
                                         self.node_order[node], node)
            return entry
        else:
            found = self._best_for(shape, node, self.takers_mask[node], cache, node)
        if found is None:
            return None
        board.where[node] = entry = (found[0], self.node_order[node], node)
        return entry

    def _top(self, shape: Shape, board: _Board, full: frozenset[str] | None) -> tuple[float, int, str] | None:
        """The board's best entry among ``full`` nodes (None: any node), or None. A bound
        found first is replaced by the node's score, until a score comes first."""
        entries, loose = board.entries, board.loose
        while True:
            for entry in entries:
                if full is None or entry[2] in full:
                    break
            else:
                return None
            node = entry[2]
            if node not in loose:
                return entry
            loose.discard(node)
            del entries[bisect_left(entries, entry)]
            del board.where[node]
            found = self._best_for(shape, node, self.takers_mask[node], board.cache, node)
            if found is not None:
                board.where[node] = exact = (found[0], self.node_order[node], node)
                insort(entries, exact)

    def _per_node(self, shape: Shape, nodes: Iterable[str], masks: Mapping[str, int],
                  skip: Mapping[str, int]) -> dict[str, Fitting]:
        """Per node of ``nodes``, [(card, fit)] of its allowed cards that can take one share now."""
        mem, service = shape.gpu_mem_mb, shape.service
        takers = self.takers_mask
        per_node: dict[str, Fitting] = {}
        for node in nodes:
            fitting = self._fitting(node, mem, service)
            allowed = masks[node] & ~skip[node] if node in skip else masks[node]
            per_node[node] = fitting if allowed == takers[node] else \
                [pair for pair in fitting if pair[0].bit & allowed]
        return per_node

    def _excluded_bits(self, excluded: frozenset[str], token: object) -> dict[str, int]:
        """Per node, the mask of its ``excluded`` cards (cached per ``token``)."""
        if not excluded:
            return {}
        bits = self._excluded.get(token) if token is not None else None
        if bits is None:
            bits = {}
            for card in self.cards:
                if card.uuid in excluded:
                    bits[card.node] = bits.get(card.node, 0) | card.bit
            if token is not None:
                self._excluded[token] = bits
        return bits

    def _fitting(self, node: str, gpu_mem_mb: int | None, service: bool) -> Fitting:
        """[(card, fit)] of the node's takers that can take one share now."""
        fits = self._fits_now(node, gpu_mem_mb, service)
        feasible = fits.feasible
        if feasible is None:
            feasible = fits.feasible = [pair for pair in fits.pairs if pair is not None]
        return feasible

    def _fits_now(self, node: str, gpu_mem_mb: int | None, service: bool) -> _Fits:
        """The node's :class:`_Fits` for the request, with the cards starts changed redone."""
        fits = self._fits.get((node, gpu_mem_mb, service))
        if fits is None:
            fits = self._fits[(node, gpu_mem_mb, service)] = _Fits(len(self.takers[node]))
            self._node_fits[node].append(fits)
        if fits.dirty:
            takers, pairs, scores = self.takers[node], fits.pairs, fits.scores
            # Cards in the same state (size, memory held, shares, service) get the same
            # answer: the fit and the score's changing part are worked out once per state.
            answers = self._answers.get((gpu_mem_mb, service))
            if answers is None:
                answers = self._answers[(gpu_mem_mb, service)] = {}
            power = self.power.get(node)
            for spot in fits.dirty:
                card = takers[spot]
                known = answers.get(card.state)
                if known is None:
                    known = answers[card.state] = self._answer(card, gpu_mem_mb, service)
                got = known[0]
                value = math.inf
                if got is not None:
                    value = card.base + known[1]
                    if power is not None:  # the node's budget is the same for every state
                        value = self.powered(value, power, card.extra_watts())
                if got is None or value == math.inf:
                    pairs[spot], scores[spot] = None, math.inf
                    fits.mask &= ~card.bit
                else:
                    pairs[spot], scores[spot] = (card, got), value
                    fits.mask |= card.bit
            fits.dirty = []
            fits.feasible = None
        return fits

    def _answer(self, card: Card, gpu_mem_mb: int | None, service: bool) -> tuple[Fit | None, float]:
        """(fit or None, what the card's state adds to its fixed score terms) for a request."""
        if gpu_mem_mb is None:  # whole cards: empty of ours and of anyone else's memory
            # (a card of unknown size takes nothing, as slices.fit says: never eligible)
            if card.allocs or card.unmanaged or card.total is None:
                return None, 0.0
            return (card.total, True), 0.0

        got = fit(card.total, card.unmanaged, card.reserved, len(card.allocs), card.exclusive,
                  gpu_mem_mb, self.config.service_spare_mb if (card.service or service) else 0)
        if got is None:
            return None, 0.0
        return got, self.share_term(card, got)

    def _feasible(self, shape: Shape, node: str, allowed: int) -> Fitting:
        """[(card, fit)] of the node's ``allowed`` cards that can take one share of ``shape``."""
        fitting = self._fitting(node, shape.gpu_mem_mb, shape.service)
        if allowed == self.takers_mask[node]:
            return fitting
        return [pair for pair in fitting if pair[0].bit & allowed]

    def _best_for(self, shape: Shape, node: str, allowed: int, cache: BestCache, slot: Slot) -> Best:
        """The node's best set for ``shape`` among its ``allowed`` cards, or None; kept in
        ``cache`` at ``slot`` until a start changes the node."""
        k = shape.gpu_count
        if k == 1:  # best_on_node's one-card loop (the first of the lowest), on kept scores
            fits = self._fits.get((node, shape.gpu_mem_mb, shape.service))
            if fits is None or fits.dirty:
                fits = self._fits_now(node, shape.gpu_mem_mb, shape.service)
            scores = fits.scores
            if allowed != self.takers_mask[node]:
                takers = self.takers[node]
                scores = [value if takers[i].bit & allowed else math.inf for i, value in enumerate(scores)]
            fit = self.fit_term(shape, node)
            if fit:
                # the kept scores lack the node's fit term, which set_score adds before the
                # power term: worked in its place, as rounding may tie or part two cards
                # (a finite score is a card that fits: its pair is there)
                pairs = fits.pairs
                scores = [math.inf if value == math.inf or (pair := pairs[i]) is None
                          else self.solo_score(shape, *pair, fit) for i, value in enumerate(scores)]
            best = min(scores) if scores else math.inf
            chosen = None if best == math.inf else fits.pairs[scores.index(best)]
            found: Best = None if chosen is None else (best, [chosen])
        else:
            feasible = self._feasible(shape, node, allowed)
            found = self.best_on_node(shape, feasible, k) if len(feasible) >= k else None
            if found is not None and found[0] == math.inf:
                found = None  # no k of them within the node's power budget
        cache[slot] = (self.version[node], found)
        return found

    # ------------------------------------------------------------ R25: when cards free up
    def ready_times(self, shape: Shape, ends: Mapping[int, float | None],
                    excluded: frozenset[str] = frozenset()) -> dict[str, list[float]]:
        """Per node, for each card that may serve ``shape`` (not ``excluded``: another
        reservation's), the earliest time it could take one share once running jobs end
        at ``ends`` (−inf: now; inf: never), sorted (lists kept for later calls: read only).

        A card's answer at time t is :meth:`search`'s in ``future(ended by t)``: the same
        fit on the allocations left, so counting answers <= t per node tells whether that
        future world holds the request without building it.
        """
        mem, service = shape.gpu_mem_mb, shape.service
        spare = self.config.service_spare_mb
        elig = self.eligibility(shape)
        # Each of a pass's reservations asks again over every card; a node's times change
        # only when a start changes the node (a running job's end is fixed), so they are
        # kept per node version for the ``ends`` they were worked out from. Nodes holding
        # an ``excluded`` card are worked out on their own.
        if self._ready_for is not ends:
            self._ready_for = ends
            self._ready_kept.clear()
        kept = self._ready_kept.setdefault((elig.sig, mem, service), {})
        version = self.version
        by_uuid = self.by_uuid
        skipped = {by_uuid[uuid].node for uuid in excluded if uuid in by_uuid}
        out: dict[str, list[float]] = {}
        for node, cards in elig.cards.items():
            if node in skipped:
                out[node] = sorted(self._ready(card, mem, service, spare, ends) for card in cards
                                   if card.uuid not in excluded)
                continue
            seen = kept.get(node)
            if seen is None or seen[0] != version[node]:
                seen = kept[node] = (version[node],
                                     sorted(self._ready(card, mem, service, spare, ends) for card in cards))
            out[node] = seen[1]
        return out

    @staticmethod
    def _ready(card: Card, mem: int | None, service: bool, spare: int,
               ends: Mapping[int, float | None]) -> float:
        allocs = card.allocs
        if mem is None:  # a whole card: every allocation gone, nobody else's memory
            if card.foreign:
                return math.inf
            latest = -math.inf
            # and what jobs hold beyond their reservations: a job's process can hold memory
            # on a card it is not placed on (its node came back after it was requeued)
            for job, _ in (*allocs, *card.over_by):
                end = ends.get(job)
                if end is None:
                    return math.inf
                latest = max(latest, end)
            return latest
        if card.fit(mem, service, spare) is not None:
            return -math.inf
        keep = spare if (card.service or service) else 0
        for t in sorted({e for job, _ in allocs if (e := ends.get(job)) is not None}):
            left = [p for job, p in allocs if (e := ends.get(job)) is None or e > t]
            # what the jobs still there hold beyond their reservations stays held
            over = sum(mb for job, mb in card.over_by if (e := ends.get(job)) is None or e > t)
            if fit(card.total, card.foreign + over, sum(p.memory_mb for p in left), len(left),
                   any(p.exclusive for p in left), mem, keep) is not None:
                return t
        return math.inf

    def _across_nodes(self, shape: Shape, per_node: dict[str, Fitting]) -> Found | None:
        """Fewest nodes first (R8): take from the nodes with the most fitting cards."""
        k = shape.gpu_count
        order = {node: cards[0].order for node, cards in self.by_node.items()}
        nodes = sorted((n for n, f in per_node.items() if f), key=lambda n: (-len(per_node[n]), order[n]))
        taken: list[tuple[str, int]] = []
        need = k
        for node in nodes:
            if need == 0:
                break
            take = min(need, len(per_node[node]))
            taken.append((node, take))
            need -= take
        if need or len(taken) > shape.max_nodes:
            return None
        chosen: Fitting = []
        for node, take in taken:

            score, part = self.best_on_node(shape, per_node[node], take)
            if score == math.inf:
                return None  # that node cannot power its part
            chosen += part
        score = self.set_score(shape, chosen)
        return Found([c for c, _ in chosen], [f for _, f in chosen], score)
