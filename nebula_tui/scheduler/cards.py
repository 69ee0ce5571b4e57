"""One pass's cards and requests as placement sees them: :class:`Card` (a GPU's static
facts plus the allocations the pass has made on it), the load and heat term of its score
(:func:`thermal_penalty`), :class:`Shape` (a request; equal shapes get equal answers) and
:class:`Found` (the cards a search chose)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..model import DEFAULT_VENDOR, GpuView, Placement
from .filters import Filter, parse_version
from .slices import fit
from .snapshot import SchedulerConfig

#: What a card's readings make of it, worked out once per pass for cards alike: its vendor,
#: compute capability, CUDA, thermal penalty, hardware class and the unchanging score terms.
Version = tuple[int, ...] | None
#: a card's hardware class: (vendor, compute capability, CUDA, memory MiB); cards of one
#: class pass the same filters and fit an empty-card request alike
Hardware = tuple[str, Version, Version, int | None]
Known = tuple[str, Version, Version, float, Hardware, float]


class Card:
    """One GPU as the pass sees it: static facts plus our allocations, updated per start."""

    __slots__ = ("uuid", "node", "index", "order", "total", "unmanaged", "blocked", "health",
                 "model", "vendor", "capability", "cuda", "thermal", "allocs", "reserved",
                 "exclusive", "service", "hw", "bit", "spot", "base", "state", "foreign", "first",
                 "over_by", "owners", "watts", "draw", "services")

    def __init__(self, view: GpuView, order: int, services: frozenset[int],
                 config: SchedulerConfig, memo: dict[tuple[object, ...], Known] | None = None) -> None:
        reading = view.reading
        self.uuid = reading.uuid
        self.node = view.node
        self.index = reading.index
        self.order = order
        self.total = reading.memory_total_mb
        #: memory held by processes we did not start, and (over_by) by our jobs beyond
        #: their reservations; ``unmanaged`` is both: what fits look at (the memory guard)
        self.foreign = max(0, view.unmanaged_used_mb)
        self.over_by = tuple((job, mb) for job, mb in view.overuse if mb > 0)
        self.unmanaged = self.foreign + sum(mb for _, mb in self.over_by)
        self.owners = view.unmanaged_procs  # (pid, user, MiB), for the reasons
        #: R27: what a busy card counts against its node's power budget, and what it draws now
        self.watts = reading.power_limit_w or view.power_peak_w or 0.0
        self.draw = reading.power_w or 0.0
        self.blocked = view.blocked or ("GPU in maintenance" if view.maintenance else None)
        self.health = 1.0 if view.health_score is None else view.health_score
        self.model = reading.name
        if memo is None:
            memo = {}
        # Readings repeat across a cluster (one driver, idle cards): work each out once per pass.
        facts = (reading.compute_cap, view.cuda_version, reading.utilization_pct,
                 reading.temperature_c, reading.vendor, self.total, self.health)
        known = memo.get(facts)
        if known is None:
            vendor = (reading.vendor or DEFAULT_VENDOR).lower()
            capability, cuda = parse_version(reading.compute_cap), parse_version(view.cuda_version)
            thermal = thermal_penalty(reading.utilization_pct, reading.temperature_c, config)
            # what the filters and an empty card's fit depend on: cards alike answer alike
            hw = (vendor, capability, cuda, self.total)
            # the score's terms of this card that no start changes (see SetScoring.solo_score)
            base = thermal + config.w_health * (1.0 - self.health)
            known = (vendor, capability, cuda, thermal, hw, base)
            memo[facts] = known
        self.vendor, self.capability, self.cuda, self.thermal, self.hw, self.base = known
        self.allocs: list[tuple[int, Placement]] = list(view.placements)
        self.reserved, self.exclusive, self.service = 0, False, False
        self.services: tuple[int, ...] = ()  # the services it holds (their spare, R14)
        for job, placement in self.allocs:
            self.reserved += placement.memory_mb
            self.exclusive = self.exclusive or placement.exclusive
            if job in services:
                self.service = True
                self.services += (job,)
        self.first = self.state_key()  # its state when the pass began
        self.bit = 0  # this card's bit among its node's cards (set by World)
        self.spot = -1  # its place among its node's takers, -1 if it takes no work (World)
        self.state = -1  # what its fit depends on, as a small number (set by World)

    def copy(self) -> Card:
        """The card as it is, with its own list of allocations. Written out, slot by slot:
        a reservation over a full cluster copies every card, and a loop of getattr/setattr
        over the slots cost most of it (test_scheduler_fastpath checks every slot is here)."""
        o = object.__new__(Card)
        o.uuid, o.node, o.index, o.order, o.total = self.uuid, self.node, self.index, self.order, self.total
        o.unmanaged, o.blocked, o.health, o.model = self.unmanaged, self.blocked, self.health, self.model
        o.vendor, o.capability, o.cuda, o.thermal = self.vendor, self.capability, self.cuda, self.thermal
        o.allocs, o.reserved, o.exclusive = list(self.allocs), self.reserved, self.exclusive
        o.service, o.hw, o.bit, o.spot, o.base = self.service, self.hw, self.bit, self.spot, self.base
        o.state, o.foreign, o.first, o.over_by = self.state, self.foreign, self.first, self.over_by
        o.owners, o.watts, o.draw, o.services = self.owners, self.watts, self.draw, self.services
        return o

    def fit(self, gpu_mem_mb: int | None, service_job: bool, spare_mb: int) -> tuple[int, bool] | None:
        keep = spare_mb if (self.service or service_job) else 0
        return fit(self.total, self.unmanaged, self.reserved, len(self.allocs), self.exclusive,
                   gpu_mem_mb, keep)

    def state_key(self) -> tuple[object, ...]:
        """What a request's fit on this card and the changing part of its score depend on."""
        return (self.total, self.unmanaged, self.reserved, len(self.allocs), self.exclusive,
                self.service)

    def add(self, job_id: int, placement: Placement, service: bool) -> None:
        self.allocs.append((job_id, placement))
        self.reserved += placement.memory_mb
        self.exclusive = self.exclusive or placement.exclusive
        if service:
            self.service = True
            self.services += (job_id,)

    def drop(self, job_ids: set[int]) -> None:
        allocs = self.allocs = [(j, p) for j, p in self.allocs if j not in job_ids]
        if allocs:
            self.reserved = sum(p.memory_mb for _, p in allocs)
            self.exclusive = any(p.exclusive for _, p in allocs)
        else:  # the common case of a future world: every job on the card has ended
            self.reserved, self.exclusive = 0, False
        if self.over_by:
            self.over_by = tuple((j, mb) for j, mb in self.over_by if j not in job_ids)
            self.unmanaged = self.foreign + sum(mb for _, mb in self.over_by)

    def extra_watts(self) -> float:
        """What a start here adds to its node's power draw as the budget counts it (R27):
        a card that holds none of our jobs counts at its draw now, one that does at its
        power limit (or its peak)."""
        return 0.0 if self.allocs else max(0.0, self.watts - self.draw)


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
