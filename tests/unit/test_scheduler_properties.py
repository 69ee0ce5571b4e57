"""Scheduler properties over random clusters, running jobs and queues (hypothesis).

The invariants are restated here from R3, R8, R10, R11, R14 and checked on the state that
results from applying every Start of a pass, not against the scheduler's own code.
"""

from __future__ import annotations

import random
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from nebula_tui.model import MAX_ALLOCATIONS_PER_GPU, MIN_SLICE_MB, GpuReading, GpuView, Placement
from nebula_tui.scheduler import (Fail, PendingJob, RunningJob, SchedulerConfig, Snapshot, Start,
                                  UserShare, Wait, schedule)
from nebula_tui.scheduler.filters import parse_arch, parse_version

GB = 1024
NOW = 500_000.0
CONFIG = SchedulerConfig()
CAPS = ["8.0", "8.6", "8.9", "12.0", None]
LINKS = ["NV12", "NV4", "PIX", "PHB", "SYS"]


@st.composite
def worlds(draw):
    """(gpus, running, topologies): a random cluster whose existing allocations obey R3/R14."""
    rnd = random.Random(draw(st.integers(0, 2**32)))
    gpus, running, topologies = [], [], {}
    next_job = 1000
    for n in range(draw(st.integers(1, 5))):
        node = f"node{n:02d}"
        count = rnd.randint(1, 8)
        blocked = rnd.choice([None] * 5 + ["node unknown (missed 3 probes)", f"{node} is drained"])
        health = rnd.choice([1.0, 1.0, 0.8, 0.1])
        cuda = rnd.choice(["12.4", "12.10", "11.8", None])
        topologies[node] = {f"GPU{i}": {f"GPU{j}": rnd.choice(LINKS) for j in range(count) if j != i}
                            for i in range(count)}
        for i in range(count):
            total = rnd.choice([8188, 16384, 24564, 24576, 40960, 81920, None])
            unmanaged = rnd.choice([0, 0, 0, 1, 3000, total // 2]) if total else 0
            placements = []
            if total and rnd.random() < 0.4:
                service = rnd.random() < 0.3
                if rnd.random() < 0.3 and not unmanaged:
                    placements.append((next_job, Placement(f"GPU-{node}-{i}", node, i, total - unmanaged, True)))
                    service = False
                else:
                    keep = CONFIG.service_spare_mb if service else 0
                    for _ in range(rnd.randint(1, 3)):
                        free = total - unmanaged - sum(p.memory_mb for _, p in placements) - keep
                        mb = rnd.choice([4 * GB, 6 * GB, 8 * GB])
                        if mb * 2 <= total and free >= mb:
                            placements.append((next_job + len(placements),
                                               Placement(f"GPU-{node}-{i}", node, i, mb, False)))
                for j, (job_id, p) in enumerate(placements):
                    limit = rnd.choice([None, 600.0, 7200.0])
                    running.append(RunningJob(job_id, "r", (p,), NOW - rnd.randint(0, 3600),
                                              time_limit_s=limit, service=service and j == 0))
                next_job += 10
            reading = GpuReading(index=i, uuid=f"GPU-{node}-{i}", name=rnd.choice(["A", "B"]),
                                 memory_total_mb=total, compute_cap=rnd.choice(CAPS),
                                 temperature_c=rnd.choice([None, 30.0, 60.0, 80.0]),
                                 utilization_pct=rnd.choice([None, 0.0, 50.0, 100.0]))
            gpus.append(GpuView(node=node, reading=reading, blocked=blocked,
                                maintenance=rnd.random() < 0.05, placements=tuple(placements),
                                unmanaged_used_mb=unmanaged, health_score=health, cuda_version=cuda))
    return gpus, tuple(running), topologies


@st.composite
def queues(draw):
    rnd = random.Random(draw(st.integers(0, 2**32)))
    jobs = []
    for i in range(draw(st.integers(1, 25))):
        jobs.append(PendingJob(
            id=i + 1, user=rnd.choice(["ann", "ben", "cy"]), gpu_count=rnd.choice([1, 1, 1, 2, 3, 4]),
            gpu_mem_mb=rnd.choice([None, 1 * GB, 4 * GB, 8 * GB, 13 * GB, 30 * GB]),
            submitted_at=NOW - rnd.randint(0, 1000),
            arch=rnd.choice([None, None, None, "sm_89", ">=sm_86", "sm_120"]),
            cuda=rnd.choice([None, None, "12.1", "12.9"]),
            max_nodes=rnd.choice([1, 1, 2, 3]), priority=rnd.choice([0, 0, 0, 5]),
            after=tuple(rnd.sample(range(1, 30), rnd.choice([0, 0, 0, 1]))),
            time_limit_s=rnd.choice([None, 300.0, 3600.0, 86400.0]),
            service=rnd.random() < 0.15))
    return tuple(jobs)


USERS = {"ann": UserShare("ann", 1.3), "ben": UserShare("ben", 1.0)}


def snapshot(world, queue) -> Snapshot:
    gpus, running, topologies = world
    finished = {j: "succeeded" for j in range(20, 25)} | {25: "failed"}
    return Snapshot(gpus=tuple(gpus), queue=queue, now=NOW, running=running, users=USERS,
                    finished=finished, topologies=topologies)


def applied(gpus, decisions, jobs):
    """The cards after every Start, with each allocation's job (and service flag)."""
    state = {g.uuid: g for g in gpus}
    for d in decisions:
        if isinstance(d, Start):
            for p in d.placements:
                view = state[p.gpu_uuid]
                state[p.gpu_uuid] = replace(view, placements=view.placements + ((d.job_id, p),))
    return state


@settings(max_examples=100, deadline=None)
@given(worlds(), queues())
def test_every_rule_holds_after_a_pass(world, queue):
    gpus, running, _ = world
    snap = snapshot(world, queue)
    decisions = schedule(snap)
    assert schedule(snap) == decisions  # same input, same decisions
    assert sorted(d.job_id for d in decisions) == sorted(j.id for j in queue)
    by_id = {j.id: j for j in queue}
    before = {g.uuid: g for g in gpus}
    services = {r.id for r in running if r.service} | {d.job_id for d in decisions
                                                      if isinstance(d, Start) and by_id[d.job_id].service}
    for d in decisions:
        assert d.reason.strip() if not isinstance(d, Start) else d.placements
        if not isinstance(d, Start):
            continue
        job = by_id[d.job_id]
        cards = [before[p.gpu_uuid] for p in d.placements]
        # R8: the whole gang, distinct cards, within --nodes
        assert len(d.placements) == job.gpu_count == len({p.gpu_uuid for p in d.placements})
        assert len({p.node for p in d.placements}) <= max(1, job.max_nodes)
        for p, view in zip(d.placements, cards):
            # R10: nothing on blocked, maintenance or unhealthy cards
            assert view.blocked is None and not view.maintenance
            assert view.health_score >= CONFIG.min_health_score
            assert (p.node, p.gpu_index) == (view.node, view.reading.index)
            # R11 filters
            if job.arch:
                assert parse_arch(job.arch).accepts(parse_version(view.reading.compute_cap))
            if job.cuda:
                assert parse_version(view.cuda_version) >= parse_version(job.cuda)
            # R3: over half the card is the whole card; slices at least 4 GB
            total = view.reading.memory_total_mb
            nominal = -(-total // GB) * GB  # whole and half are of the size it is sold as
            if job.gpu_mem_mb is None or 2 * job.gpu_mem_mb > nominal:
                assert p.exclusive and not view.placements
                assert p.memory_mb == total - view.unmanaged_used_mb
                assert view.unmanaged_used_mb + (job.gpu_mem_mb or nominal) <= nominal
            else:
                assert not p.exclusive and p.memory_mb == max(job.gpu_mem_mb, MIN_SLICE_MB)
        # --after: only jobs whose dependencies all succeeded start
        assert all(snap.finished.get(a) == "succeeded" for a in job.after)
    for view in applied(gpus, decisions, by_id).values():
        held = [p for _, p in view.placements]
        total = view.reading.memory_total_mb or 0
        assert len(held) <= MAX_ALLOCATIONS_PER_GPU
        assert sum(p.memory_mb for p in held) + view.unmanaged_used_mb <= total  # never over-committed
        if any(p.exclusive for p in held):
            assert len(held) == 1  # an exclusive card is never shared
        elif any(j in services for j, _ in view.placements):
            # R14: a service card keeps its spare and is never anyone's whole card
            assert total - view.unmanaged_used_mb - sum(p.memory_mb for p in held) >= CONFIG.service_spare_mb
    for d in decisions:
        if isinstance(d, Fail):
            assert by_id[d.job_id].after or by_id[d.job_id].arch or by_id[d.job_id].cuda


@settings(max_examples=60, deadline=None)
@given(worlds(), queues(), st.randoms(use_true_random=False))
def test_queue_input_order_does_not_matter(world, queue, rnd):
    shuffled = list(queue)
    rnd.shuffle(shuffled)
    assert schedule(snapshot(world, queue)) == schedule(snapshot(world, tuple(shuffled)))


@settings(max_examples=60, deadline=None)
@given(worlds(), queues())
def test_waiting_jobs_without_a_hold_really_do_not_fit(world, queue):
    """A job told "none is free now" could not start alone on the cards the jobs before it
    in the pass left: the refusal is about room, never about bookkeeping."""
    snap = snapshot(world, queue)
    by_id = {j.id: j for j in queue}
    decisions = schedule(snap)
    for n, d in enumerate(decisions):
        if isinstance(d, Wait) and "none is free now" in d.reason:
            earlier = [e for e in decisions[:n] if isinstance(e, Start)]
            gpus = tuple(applied(snap.gpus, earlier, by_id).values())
            running = snap.running + tuple(RunningJob(e.job_id, "x", e.placements, NOW,
                                                      service=by_id[e.job_id].service) for e in earlier)
            alone = replace(snap, gpus=gpus, running=running,
                            queue=(replace(by_id[d.job_id], after=(), priority=0),))
            (only,) = schedule(alone)
            assert isinstance(only, Wait), (d, only)
