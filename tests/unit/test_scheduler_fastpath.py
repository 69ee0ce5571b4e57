"""The fast scheduler pass decides exactly what a straightforward one decides (hypothesis).

The pass (10k pending jobs in ≤ 100 ms, as bench/scheduler.py measures) shares work between requests and
between starts: hardware classes instead of cards, per-node and per-card caches kept until
a start changes them, heaps of node bests shared by filters that select the same cards, a
reservation found from each card's earliest free time, a sort one field at a time.

``reference_schedule`` below is the slow path those replace, written out plainly: every
search looks at every card of every node afresh, eligibility and the "can this ever run?"
check go card by card, the reservation bisects over freshly built future worlds, every
subset is scored with ``World.set_score`` on a plain ``rank_table`` per node, and the queue
is sorted by ``fairshare.order_key``. Its decision rules (``_Pass.decide``, ``fate``) are
the scheduler's own: what is compared is how the answers are computed, not the rules.
"""

from __future__ import annotations

import importlib.util
import itertools
import math
import random
from pathlib import Path

import pytest

from hypothesis import example, given, settings
from hypothesis import strategies as st

from nebula_tui.model import GpuReading, GpuView, Placement, format_mb
from nebula_tui.scheduler import (PendingJob, RunningJob, SchedulerConfig, Snapshot, UserShare,
                                  schedule)
from nebula_tui.scheduler.cards import Shape
from nebula_tui.scheduler.fairshare import order_key
from nebula_tui.scheduler.filters import Filter, sm_name, version_text
from nebula_tui.scheduler.placement import Card, Eligibility, Found, Missed, World
from nebula_tui.scheduler.queue import RESERVATIONS, _Pass, order
from nebula_tui.scheduler.reasons import blocked_text, needs
from nebula_tui.scheduler.slices import fit
from nebula_tui.scheduler.topology import best_subset, gpu_number, link_rank

GB = 1024
NOW = 100_000.0


# ------------------------------------------------------------------ the slow path
def plain_rank_table(links):
    table = {}
    for row, cells in links.items():
        i = gpu_number(row)
        if i is None:
            continue
        for col, code in cells.items():
            j = gpu_number(col)
            if j is None or j == i:
                continue
            rank = link_rank(code)
            table[(i, j)] = min(rank, table.get((i, j), rank))
            table[(j, i)] = min(rank, table.get((j, i), rank))
    return table


class PlainWorld(World):
    """Every search from scratch: no cache, no hardware class, no memo."""

    @classmethod
    def build(cls, views, topologies, services, config, budgets=None):
        services = frozenset(services)
        cards = [Card(view, i, services, config) for i, view in enumerate(views)]
        return cls(cards, {node: plain_rank_table(links) for node, links in topologies.items()}, config,
                   budgets=budgets)

    def eligibility(self, shape):
        cards = {}
        for node, node_cards in self.by_node.items():
            usable = [c for c in node_cards if self.hardware_ok(c, shape) and not c.blocked
                      and c.health >= self.config.min_health_score]
            if usable:
                cards[node] = usable
        return Eligibility(cards, {}, 0, sorted(map(len, cards.values()), reverse=True))

    def feasible_now(self, shape, cards, excluded):
        found = []
        for card in cards:
            if card.uuid in excluded:
                continue
            power = self.power.get(card.node)  # (budget, W counted now)
            if power is not None and power[1] + card.extra_watts() > power[0]:
                continue
            if shape.gpu_mem_mb is None:
                if not card.allocs and not card.unmanaged:
                    found.append((card, (card.total, True)))
            else:
                got = card.fit(shape.gpu_mem_mb, shape.service, self.config.service_spare_mb)
                if got is not None:
                    found.append((card, got))
        return found

    def best_on_node(self, shape, feasible, k):
        def score(combo):
            return self.set_score(shape, [feasible[i] for i in combo])
        if k == 1:
            values = [self.set_score(shape, [pair]) for pair in feasible]
            best = min(range(len(feasible)), key=lambda i: (values[i], i))
            return values[best], [feasible[best]]
        if k == len(feasible):
            combo = tuple(range(k))
        elif math.comb(len(feasible), k) <= self.config.max_combinations:
            combo = min(itertools.combinations(range(len(feasible)), k), key=lambda c: (score(c), c))
        else:
            combo = best_subset(len(feasible), k, score, self.config.max_combinations)
        return score(combo), [feasible[i] for i in combo]

    def search(self, shape, excluded=frozenset(), token=None):
        k = shape.gpu_count
        per_node = {node: self.feasible_now(shape, cards, excluded)
                    for node, cards in self.eligible(shape).items()}
        best = None
        for node, feasible in per_node.items():
            if len(feasible) >= k:
                score, chosen = self.best_on_node(shape, feasible, k)
                key = (score, self.by_node[node][0].order)
                if score != math.inf and (best is None or key < best[0]):
                    best = (key, chosen)
        if best is not None:
            chosen = best[1]
            return Found([c for c, _ in chosen], [f for _, f in chosen], best[0][0])
        if shape.max_nodes > 1:
            found = self._across_nodes(shape, per_node)
            if found is not None:
                return found
        return Missed({node: len(f) for node, f in per_node.items()})


def plain_key(job, weight, now, gang_age_s):
    """The queue order written out: ``order_key``, except that a gang of ordinary priority
    that waited ``gang_age_s`` comes after the raised jobs and before the rest, oldest first."""
    if gang_age_s is not None and job.priority == 0 and job.gpu_count > 1 and not job.preemptible \
            and job.submitted_at <= now - gang_age_s:
        return (0, 0, job.submitted_at, job.id)
    return (-job.priority, 1, *order_key(0, weight(job.user), job.submitted_at, job.id)[1:])


class PlainPass(_Pass):
    world_class = PlainWorld

    def run(self):
        users = self.snap.users

        def weight(user):
            share = users.get(user)
            return 1.0 if share is None else share.weight

        jobs = sorted(self.snap.queue, key=lambda j: plain_key(j, weight, self.now, self.config.gang_age_s))
        return [self.decide(job) for job in jobs]

    def _impossible(self, shape):
        what = needs(shape)
        pool = self.world.cards
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
        counts = {}
        for card in pool:
            counts[card.node] = counts.get(card.node, 0) + 1
        k, span = shape.gpu_count, shape.max_nodes
        top = sum(sorted(counts.values(), reverse=True)[:span])
        if top < k:
            if span <= 1:
                most = max(counts.values())
                return (f"needs {what}; the largest node has {most} such GPU{'s' * (most != 1)}"
                        + (" (--nodes lets a job span nodes)" if sum(counts.values()) >= k else ""))
            return f"needs {what}; {span} nodes have at most {top} such GPUs together"
        usable = self.world.eligible(shape)
        if sum(sorted((len(v) for v in usable.values()), reverse=True)[:span]) >= k:
            return None
        return blocked_text(what, pool, usable, self.node_order, self.config.min_health_score)

    def reserve(self, job, shape):
        holders = self.world.holders()
        ends = sorted({e for j in holders if (e := self.ends.get(j)) is not None})
        if not ends:
            return None

        taken = self.reserved
        if job.service and job.time_limit_s is None and self.scarce and self.keeps_off(job):
            taken = taken | self.scarce_cards  # a service never waits for the scarce machines

        def attempt(t):
            ended = {j for j in holders if (e := self.ends.get(j)) is not None and e <= t}
            future = self.world.future(ended)
            return future.search(shape, taken, ("reserved", len(self.reservations))) if taken \
                else future.search(shape)

        if not isinstance(attempt(ends[-1]), Found):
            return None
        lo, hi = 0, len(ends) - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if isinstance(attempt(ends[mid]), Found):
                hi = mid
            else:
                lo = mid + 1
        return self.reservation(job, ends[lo], attempt(ends[lo]))


def reference_schedule(snapshot: Snapshot):
    return PlainPass(snapshot).run()


# ------------------------------------------------------------------ random clusters
MODELS = [("RTX 4090", 24564, "8.9", "12.4", "PHB"), ("A100", 81920, "8.0", "12.4", "NV12"),
          ("H100", 81559, "9.0", "12.8", "NV18"), ("L4", 23034, "8.9", "12.2", "PIX"),
          ("RTX 3090", 24576, "8.6", None, "NV4")]


def make_snapshot(rnd: random.Random, nodes: int = 6, gangs_only: bool = False) -> Snapshot:
    """Up to ``nodes`` nodes of up to 8 cards, two thirds busy with --time'd jobs (so
    reservations happen), a queue mixing slices, whole cards, gangs, filters, --after and
    services (only requests for 2+ cards with ``gangs_only``)."""
    gpus, running, topologies, budgets = [], [], {}, {}
    job_id = 10_000
    for n in range(rnd.randint(1, nodes)):
        node = f"node{n:02d}"
        name, total, cap, cuda, link = rnd.choice(MODELS)
        count = rnd.choice([1, 2, 4, 8, 8])
        if rnd.random() < 0.8:  # nodes alike share one matrix; some nodes have none
            topologies[node] = {f"GPU{i}": {f"GPU{j}": link if i // 4 == j // 4 else rnd.choice(["SYS", link])
                                            for j in range(count) if j != i} for i in range(count)}
        blocked = rnd.choice([None] * 6 + ["node is drained"])
        if rnd.random() < 0.3:  # R27: some nodes have a power budget, a few cards' worth
            budgets[node] = rnd.choice([300.0, 900.0, 1500.0, 2500.0])
        for i in range(count):
            card_name, card_total = (name, total) if rnd.random() < 0.85 else ("odd", rnd.choice([8188, 40960]))
            unmanaged = rnd.choice([0] * 6 + [3000, card_total // 2])
            service = rnd.random() < 0.2
            placements, roll = [], rnd.random()
            if roll < 0.4 and not unmanaged:
                placements = [(job_id, Placement(f"G-{node}-{i}", node, i, card_total, True))]
                service = False
            elif roll < 0.7:
                free = card_total - unmanaged - (2048 if service else 0)
                for extra in range(rnd.randint(1, 4)):
                    mb = rnd.choice([4 * GB, 8 * GB, 10 * GB])
                    if 2 * mb <= card_total and free >= mb:
                        placements.append((job_id + extra, Placement(f"G-{node}-{i}", node, i, mb, False)))
                        free -= mb
            for j, (held, p) in enumerate(placements):
                running.append(RunningJob(held, "r", (p,), NOW - rnd.randint(0, 7200),
                                          time_limit_s=rnd.choice([None, 600.0, 3600.0, 14400.0]),
                                          service=service and j == 0,
                                          array_id=rnd.choice([None, None, 7, 8])))
            job_id += 10
            # the memory guard: some jobs hold more than they reserved
            overuse = tuple((held, rnd.choice([2 * GB, 6 * GB])) for held, p in placements
                            if not p.exclusive and rnd.random() < 0.15)
            owners = ((4242, rnd.choice([None, "alice"]), unmanaged),) if unmanaged and rnd.random() < 0.5 else ()
            limit = rnd.choice([None, 300.0, 450.0])
            reading = GpuReading(index=i, uuid=f"G-{node}-{i}", name=card_name, memory_total_mb=card_total,
                                 compute_cap=cap, utilization_pct=rnd.choice([None, 0.0, 60.0, 100.0]),
                                 temperature_c=rnd.choice([None, 35.0, 60.0, 80.0]), power_limit_w=limit,
                                 power_w=rnd.choice([None, 20.0, 250.0]))
            gpus.append(GpuView(node=node, reading=reading, placements=tuple(placements), blocked=blocked,
                                maintenance=rnd.random() < 0.03, unmanaged_used_mb=unmanaged,
                                health_score=rnd.choice([1.0, 1.0, 0.9, 0.2]), cuda_version=cuda,
                                overuse=overuse, unmanaged_procs=owners,
                                power_peak_w=rnd.choice([None, 200.0])))
    shapes = [(1, 8 * GB), (1, 16 * GB), (1, None), (2, None), (2, 24 * GB), (4, None), (8, None),
              (1, 4 * GB), (4, 40 * GB), (12, None), (3, 8 * GB), (2, 13 * GB), (1, 24 * GB), (1, 12 * GB)]
    if gangs_only:
        shapes = [(k, mem) for k, mem in shapes if k > 1]
    queue = []
    size = rnd.choice([5, 30, 80])
    for i in range(size):
        k, mem = rnd.choice(shapes)
        queue.append(PendingJob(
            id=i + 1, user=f"u{rnd.randrange(4)}", gpu_count=k, gpu_mem_mb=mem,
            submitted_at=NOW - rnd.choice([0, 10, rnd.uniform(0, 900)]),
            arch=rnd.choice([None] * 5 + ["sm_89", ">=sm_80", "sm_120"]),
            cuda=rnd.choice([None] * 5 + ["12.6", "12.3"]), vendor=rnd.choice([None] * 8 + ["NVIDIA"]),
            max_nodes=rnd.choice([1, 1, 2, 3]) if k > 1 else 1, priority=5 if rnd.random() < 0.05 else 0,
            after=(rnd.randint(1, size + 2),) if rnd.random() < 0.08 else (),
            after_type=rnd.choice(["ok", "ok", "any", "notok", "started"]),
            time_limit_s=rnd.choice([None, 300.0, 1800.0, 7200.0]), service=rnd.random() < 0.08,
            array_id=(array := rnd.choice([None] * 6 + [7, 8])), array_limit=rnd.choice([1, 2]) if array else None))
    users = {f"u{u}": UserShare(f"u{u}", rnd.choice([1.0, 1.2, 1.5]),
                                refusal="over quota" if u == 3 and rnd.random() < 0.3 else None)
             for u in range(4) if rnd.random() < 0.9}
    # Some passes weigh differently: a zero or negative weight turns off the searches'
    # bounds (which hold only while no score term can be negative) and reorders the sets.
    weights = rnd.choice([{}, {}, {}, {"w_pack": 0.0, "w_topology": 3.0}, {"w_topology": -1.0},
                          {"w_health": -2.0, "w_load": 0.5}, {"w_power": 4.0}, {"w_power": -1.0}])
    # the reference is one walk of the queue: over-quota users wait in it (quota_mode refuse)
    # rather than move to the preemptible walk (preemption.py, tests/unit/test_preemption.py)
    config = SchedulerConfig(max_combinations=rnd.choice([256, 256, 8]), quota_mode="refuse", **weights)
    return Snapshot(gpus=tuple(gpus), queue=tuple(queue), now=NOW, running=tuple(running), users=users,
                    finished={2: "succeeded", 3: "failed", 4: "cancelled"}, never_ran=frozenset({4}),
                    topologies=topologies, config=config, power_budgets=budgets)


@settings(max_examples=120, deadline=None)
@given(st.integers(0, 2**32))
@example(205)  # two cards whose scores tie only once the node's fit term is added
def test_fast_pass_decides_as_the_reference_does(seed):
    snap = make_snapshot(random.Random(seed))
    assert schedule(snap) == reference_schedule(snap)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32))
@example(4874)  # a gang's one-card part on a second node, picked without its fit term
def test_gangs_over_many_nodes_decide_as_the_reference_does(seed):
    """Many nodes competing for gangs: where a node's place on a board is only a bound on
    its best set's score until the set is worked out (World._top), the winner must still be
    the node the plain search picks."""
    snap = make_snapshot(random.Random(seed), nodes=24, gangs_only=True)
    assert schedule(snap) == reference_schedule(snap)


def test_the_comparison_sees_every_kind_of_answer():
    """The comparison is worth something only if such clusters produce every kind of
    decision: starts on one and on several nodes, holds for and reservations by R25, and
    the waiting reasons of R5."""
    seen = set()
    for seed in range(80):
        for d in schedule(make_snapshot(random.Random(seed))):
            reason = getattr(d, "reason", "")
            if not reason:
                seen.add("multi-node start" if len({p.node for p in d.placements}) > 1 else "start")
            for marker in ("reserved for it", "held for job", "none is free now", "no GPU with",
                           "the largest node has", "cannot run", "over quota", "fair-share order",
                           "power budget", "more than it reserved", "held by job", "whole to job",
                           "the most a card shares", "kept spare", "runs at most", "(--after any)",
                           "without starting", "(--after notok)", "estimated start"):
                if marker in reason:
                    seen.add(marker)
    assert seen >= {"start", "multi-node start", "reserved for it", "held for job", "none is free now",
                    "no GPU with", "the largest node has", "cannot run", "over quota", "fair-share order",
                    "power budget", "more than it reserved", "held by job", "whole to job",
                    "the most a card shares", "kept spare", "runs at most", "(--after any)",
                    "without starting", "(--after notok)", "estimated start"}, seen


def bench_cluster():
    """bench/scheduler.py, the cluster and queue the pass is timed on."""
    path = Path(__file__).resolve().parents[2] / "bench" / "scheduler.py"
    spec = importlib.util.spec_from_file_location("bench_scheduler", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("seed", [5, 11])
def test_many_reservations_in_one_pass_decide_as_the_reference_does(seed):
    """The bench's cluster cut to 16 nodes with 400 jobs waiting: every one of a pass's
    RESERVATIONS is taken, later jobs are kept off reserved cards by their --time, and
    many start in between (the reservation's kept ready times, timeline and closed-form
    earliest start against the reference's bisection over fresh future worlds)."""
    bench = bench_cluster()
    gpus, running, topologies = bench.cluster(seed=seed, nodes=16)
    snap = Snapshot(gpus=gpus, queue=bench.queue(400, seed=seed + 1), now=bench.NOW, running=running,
                    users=bench.USERS, topologies=topologies)
    decisions = schedule(snap)
    assert decisions == reference_schedule(snap)
    reasons = [getattr(d, "reason", "") for d in decisions]
    assert sum("reserved for it, estimated start" in r for r in reasons) >= RESERVATIONS - 4
    assert sum("held for job" in r for r in reasons) > 50
    assert sum(not r for r in reasons) > 50  # starts


def test_a_reservation_the_ready_counts_get_wrong_is_searched_for(monkeypatch):
    """Where the cards' ready times say a request fits by a time and the future world's
    search finds no set there, the reservation comes from searched future worlds, as the
    reference's does (here every card is said to be ready now: every such guess is wrong)."""
    bench = bench_cluster()
    gpus, running, topologies = bench.cluster(seed=5, nodes=16)
    snap = Snapshot(gpus=gpus, queue=bench.queue(400, seed=6), now=bench.NOW, running=running,
                    users=bench.USERS, topologies=topologies)
    expected = reference_schedule(snap)

    def ready_now(self, shape, ends, excluded=frozenset()):
        return {node: [-math.inf] * len(cards) for node, cards in self.eligible(shape).items()}

    monkeypatch.setattr(World, "ready_times", ready_now)
    assert schedule(snap) == expected


def test_memory_of_a_job_not_placed_on_a_card_keeps_it_from_a_whole_card_reservation():
    """A node back after its jobs were requeued: a job's process still holds memory on a
    card it is no longer placed on (the head counts it as that job's over-use). No end of
    a running job frees that card, so a whole-card job reserves the card of the job that
    ends (the ready times said the card was free now, and the pass failed on it)."""
    def card(i, placements, overuse=()):
        reading = GpuReading(index=i, uuid=f"G-n0-{i}", name="A100", memory_total_mb=81920,
                             compute_cap="8.0")
        return GpuView(node="n0", reading=reading, placements=placements, cuda_version="12.4",
                       overuse=overuse)

    held = Placement("G-n0-0", "n0", 0, 81920, True)
    snap = Snapshot(gpus=(card(0, ((1, held),)), card(1, (), ((99, 20 * GB),))),
                    queue=(PendingJob(id=5, user="u", gpu_count=1, gpu_mem_mb=None, submitted_at=NOW),),
                    now=NOW, running=(RunningJob(1, "u", (held,), NOW - 60, time_limit_s=3600.0),))
    whole = Shape(1, None, False, 1, Filter(None, None, None))
    world = World.build(snap.gpus, {}, (), snap.config)
    assert world.ready_times(whole, {1: NOW + 3540}) == {"n0": [NOW + 3540, math.inf]}
    decisions = schedule(snap)
    assert decisions == reference_schedule(snap)
    assert "n0:0 reserved for it" in decisions[0].reason


def test_a_card_copy_has_every_slot():
    """``Card.copy`` names each slot (a loop over them cost most of a future world)."""
    card = object.__new__(Card)
    for n, name in enumerate(Card.__slots__):
        setattr(card, name, (name, n))
    card.allocs = [(1, None)]
    copy = card.copy()
    assert [name for name in Card.__slots__ if getattr(copy, name) != getattr(card, name)] == []
    assert copy.allocs is not card.allocs


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.sampled_from("abcdef"), st.integers(0, 3),
                          st.sampled_from([0, 0, 0, 1, -1]), st.sampled_from([1, 1, 2, 4]),
                          st.booleans()), max_size=40, unique_by=lambda t: t[0]),
       st.dictionaries(st.sampled_from("abcde"), st.sampled_from([None, 1.0, 1.0, 1.5, 2.0])),
       st.sampled_from([None, 0.0, 5.0, 20.0]))
def test_queue_order_is_the_fair_share_key(rows, weights, gang_age):
    """``order`` groups jobs by weight instead of sorting on tuples: it must give
    ``order_key``'s order, ties included (users sharing a weight, equal submit times, users
    with no share, priorities either way), whatever order the queue comes in; and with
    ``gang_age`` it puts the gangs that waited that long (by now = 30) first, oldest first."""
    jobs = [PendingJob(id=i, user=user, gpu_count=count, gpu_mem_mb=None, submitted_at=float(t),
                       priority=prio, preemptible=spare) for i, user, t, prio, count, spare in rows]
    users = {name: None if w is None else UserShare(name, w) for name, w in weights.items()}

    def weight(user):
        share = users.get(user)
        return 1.0 if share is None else share.weight

    expected = sorted(jobs, key=lambda j: plain_key(j, weight, 30.0, gang_age))
    assert [j.id for j in order(tuple(jobs), users, 30.0, gang_age)] == [j.id for j in expected]
    plain = sorted(jobs, key=lambda j: order_key(j.priority, weight(j.user), j.submitted_at, j.id))
    assert [j.id for j in order(tuple(jobs), users)] == [j.id for j in plain]
