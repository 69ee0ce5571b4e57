"""The first-fit scheduler, table-driven and by property (R3 slices, R5 reasons, R8 gangs).

Inputs are built here from the model's frozen dataclasses; the scheduler is pure, so every
case is a snapshot in and decisions out. The property tests check the decisions against
the R3/R8 rules restated independently below (``_can_host``), not against the code.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nebula_tui.model import MAX_ALLOCATIONS_PER_GPU, MIN_SLICE_MB, GpuReading, GpuView, Placement
from nebula_tui.scheduler import PendingJob, Snapshot, Start, Wait, schedule

GB = 1024
RTX4090_MB = 24564  # what nvidia-smi reports for a "24 GB" card: a little under 24 GiB
A100_80_MB = 81920


def gpu(node: str, index: int, total_mb: int | None = RTX4090_MB, *, unmanaged: int = 0,
        blocked: str | None = None, placements=()) -> GpuView:
    reading = GpuReading(index=index, uuid=f"GPU-{node}-{index}", name="test card",
                         memory_total_mb=total_mb)
    return GpuView(node=node, reading=reading, blocked=blocked,
                   unmanaged_used_mb=unmanaged, placements=tuple(placements))


def jobs(*asks: tuple[int, int | None]) -> tuple[PendingJob, ...]:
    """(gpu_count, gpu_mem_mb) per job, submitted one second apart in the given order."""
    return tuple(PendingJob(id=i + 1, user="u", gpu_count=count, gpu_mem_mb=mem,
                            submitted_at=1000.0 + i)
                 for i, (count, mem) in enumerate(asks))


def run(gpus, queue):
    return schedule(Snapshot(gpus=tuple(gpus), queue=tuple(queue)))


def where(decision) -> list[tuple[str, int, int, bool]]:
    """A Start as (node, index, reserved MiB, exclusive) per GPU; [] for a Wait."""
    if isinstance(decision, Wait):
        return []
    return [(p.node, p.gpu_index, p.memory_mb, p.exclusive) for p in decision.placements]


# ------------------------------------------------------------------ table: slices (R3)
CASES = [
    pytest.param(  # 10+10 GB share a 24 GB card; the 4 GB left is a fragment, never offered
        [gpu("n1", 0)], jobs((1, 10 * GB), (1, 10 * GB), (1, 10 * GB)),
        [[("n1", 0, 10 * GB, False)], [("n1", 0, 10 * GB, False)], []],
        id="two-10G-share-third-waits"),
    pytest.param(  # with a second card, slices spread: no whole-card job waits for it
        [gpu("n1", 0), gpu("n1", 1)], jobs((1, 10 * GB), (1, 10 * GB), (1, 10 * GB)),
        [[("n1", 0, 10 * GB, False)], [("n1", 1, 10 * GB, False)], [("n1", 0, 10 * GB, False)]],
        id="slices-spread-over-idle-cards"),
    pytest.param(  # 3 x 8 GiB = 24576 MiB > 24564 MiB: the third 8 GB slice does not fit
        [gpu("n1", 0)], jobs((1, 8 * GB), (1, 8 * GB), (1, 8 * GB)),
        [[("n1", 0, 8 * GB, False)], [("n1", 0, 8 * GB, False)], []],
        id="three-8G-do-not-fit-a-24G-card"),
    pytest.param(  # 13 GB is more than half of 24 GB: the whole card, exclusively
        [gpu("n1", 0)], jobs((1, 13 * GB)),
        [[("n1", 0, RTX4090_MB, True)]],
        id="over-half-takes-whole-card"),
    pytest.param(  # 24 GB is the 4090's nominal size (24564 MiB): the whole card
        [gpu("n1", 0)], jobs((1, 24 * GB)),
        [[("n1", 0, RTX4090_MB, True)]],
        id="nominal-size-fits-whole"),
    pytest.param(  # ... but not a GB more
        [gpu("n1", 0)], jobs((1, 25 * GB)),
        [[]],
        id="over-nominal-size-waits"),
    pytest.param(  # exactly half of the nominal size is still a slice; two do not fit
        [gpu("n1", 0)], jobs((1, 12 * GB), (1, 12 * GB)),
        [[("n1", 0, 12 * GB, False)], []],
        id="exactly-half-is-a-slice"),
    pytest.param(  # under 4 GB is rounded up to the 4 GB minimum slice
        [gpu("n1", 0)], jobs((1, 1 * GB), (1, 3 * GB + 512)),
        [[("n1", 0, MIN_SLICE_MB, False)], [("n1", 0, MIN_SLICE_MB, False)]],
        id="small-requests-round-up-to-4G"),
    pytest.param(  # at most 4 allocations per GPU: packing (a whole-card job waits for the
        # other card), the 5th 4 GB job goes to the next card
        [gpu("n1", 0, A100_80_MB), gpu("n1", 1, A100_80_MB)], jobs(*[(1, 4 * GB)] * 5, (1, None)),
        [[("n1", 0, 4 * GB, False)]] * 4 + [[("n1", 1, 4 * GB, False)], []],
        id="max-4-allocations-per-gpu"),
    pytest.param(  # ... and waits when there is no next card
        [gpu("n1", 0, A100_80_MB)], jobs(*[(1, 4 * GB)] * 5),
        [[("n1", 0, 4 * GB, False)]] * 4 + [[]],
        id="fifth-allocation-waits"),
    pytest.param(  # a card holding a slice is not "whole" any more
        [gpu("n1", 0), gpu("n1", 1)], jobs((1, 4 * GB), (1, None)),
        [[("n1", 0, 4 * GB, False)], [("n1", 1, RTX4090_MB, True)]],
        id="whole-card-skips-shared-card"),
    pytest.param(  # an exclusive card offers nothing more, not even 4 GB
        [gpu("n1", 0)], jobs((1, None), (1, 4 * GB)),
        [[("n1", 0, RTX4090_MB, True)], []],
        id="exclusive-card-is-alone"),
    pytest.param(  # a hand-run process holding 1 MiB is enough to refuse a whole card
        [gpu("n1", 0, unmanaged=1), gpu("n1", 1)], jobs((1, None)),
        [[("n1", 1, RTX4090_MB, True)]],
        id="whole-card-needs-no-unmanaged-memory"),
    pytest.param(  # unmanaged memory counts as used: 24564 - 6000 - 10240 = 8324 < 10240
        [gpu("n1", 0, unmanaged=6000), gpu("n1", 1)], jobs(*[(1, 10 * GB)] * 4),
        [[("n1", 0, 10 * GB, False)], [("n1", 1, 10 * GB, False)], [("n1", 1, 10 * GB, False)], []],
        id="unmanaged-memory-counts-as-used"),
    pytest.param(  # 24564 - 20564 = 4000 MiB left: a fragment under 4 GB offers nothing
        [gpu("n1", 0, unmanaged=20564)], jobs((1, 1 * GB)),
        [[]],
        id="fragment-under-4G-offers-nothing"),
    pytest.param(  # ... but exactly 4 GB left is offered
        [gpu("n1", 0, unmanaged=RTX4090_MB - MIN_SLICE_MB)], jobs((1, 1 * GB)),
        [[("n1", 0, MIN_SLICE_MB, False)]],
        id="exactly-4G-left-is-offered"),
    pytest.param(  # a blocked GPU (drained or unknown node) is never used
        [gpu("n1", 0, blocked="node n1 is drained"), gpu("n2", 0)], jobs((1, 4 * GB), (1, 4 * GB)),
        [[("n2", 0, 4 * GB, False)], [("n2", 0, 4 * GB, False)]],
        id="blocked-gpu-never-used"),
    pytest.param(  # a GPU whose memory size is unknown ([N/A]) cannot be promised
        [gpu("n1", 0, None), gpu("n1", 1)], jobs((1, 4 * GB)),
        [[("n1", 1, 4 * GB, False)]],
        id="unknown-total-never-used"),
    pytest.param(  # R8: a 2-GPU gang never gets 1; n2 has 2 and takes it
        [gpu("n1", 0), gpu("n2", 0), gpu("n2", 1)], jobs((2, None)),
        [[("n2", 0, RTX4090_MB, True), ("n2", 1, RTX4090_MB, True)]],
        id="gang-on-one-node"),
    pytest.param(  # one free GPU on each of two nodes is not 2 GPUs on one node
        [gpu("n1", 0), gpu("n2", 0)], jobs((2, None)),
        [[]],
        id="gang-never-split-across-nodes"),
    pytest.param(  # first come, first served: a waiting gang does not stop a later job
        [gpu("n1", 0)], jobs((2, None), (1, None)),
        [[], [("n1", 0, RTX4090_MB, True)]],
        id="later-job-runs-past-waiting-gang"),
    pytest.param(  # a request bigger than the card never fits
        [gpu("n1", 0)], jobs((1, 30 * GB)),
        [[]],
        id="bigger-than-card-waits"),
]


@pytest.mark.parametrize(("gpus", "queue", "expected"), CASES)
def test_first_fit(gpus, queue, expected):
    decisions = run(gpus, queue)
    assert [d.job_id for d in decisions] == [j.id for j in queue]
    assert [where(d) for d in decisions] == expected


def test_queue_order_is_submit_time_then_id():
    # Job 2 was submitted first, so it gets the only card although its id is higher.
    queue = (PendingJob(1, "a", 1, None, submitted_at=20.0),
             PendingJob(2, "b", 1, None, submitted_at=10.0),
             PendingJob(3, "c", 1, None, submitted_at=10.0))
    decisions = run([gpu("n1", 0)], queue)
    assert [(type(d).__name__, d.job_id) for d in decisions] == [
        ("Start", 2), ("Wait", 3), ("Wait", 1)]


def test_existing_placements_are_respected():
    held = Placement("GPU-n1-0", "n1", 0, 16 * GB, False)
    decisions = run([gpu("n1", 0, placements=[(99, held)]), gpu("n1", 1)], jobs((1, 10 * GB)))
    assert where(decisions[0]) == [("n1", 1, 10 * GB, False)]


def test_first_fit_order_of_gpus_on_a_node():
    # The allocation order is the order the GPUs are listed in: it becomes CUDA_VISIBLE_DEVICES.
    gpus = [gpu("n1", 3), gpu("n1", 1), gpu("n1", 2)]
    (start,) = run(gpus, jobs((2, None)))
    assert [p.gpu_index for p in start.placements] == [3, 1]


def test_whole_card_reservation_does_not_count_memory_others_hold():
    (start,) = run([gpu("n1", 0, unmanaged=2 * GB)], jobs((1, 13 * GB)))
    (p,) = start.placements
    assert p.exclusive
    assert p.memory_mb + 2 * GB <= RTX4090_MB


# ------------------------------------------------------------------ table: reasons (R5)
REASONS = [
    pytest.param(
        [gpu("node01", 0, A100_80_MB, unmanaged=20 * GB), gpu("node02", 0, A100_80_MB),
         gpu("node02", 1, A100_80_MB, unmanaged=20 * GB)],
        (2, 70 * GB),
        "needs 2 GPUs with ≥70 GB free on one node; best now: node02 has 1; node02:1 with 60 GB "
        "free (processes not started by NebulaGrid hold 20 GB)",
        id="gang-best-node"),
    pytest.param(  # the node with the most fitting GPUs is named, not the first one
        [gpu("n1", 0), gpu("n1", 1, unmanaged=1), gpu("n2", 0), gpu("n2", 1), gpu("n2", 2, unmanaged=1)],
        (3, None),
        "needs 3 whole GPUs on one node; best now: n2 has 2; n2:2 in use (processes not started by "
        "NebulaGrid hold 1 MB)",
        id="gang-whole-most-fitting-node"),
    pytest.param(  # no node could ever hold it: say so, not "best now", and hint at --nodes
        [gpu("n1", 0), gpu("n2", 0)], (2, None),
        "needs 2 whole GPUs on one node; the largest node has 1 such GPU "
        "(--nodes lets a job span nodes)",
        id="gang-whole-larger-than-any-node"),
    pytest.param(
        [gpu("n1", 0, unmanaged=100)], (1, None),
        "needs a whole GPU; none is free now: n1:0 in use (processes not started by NebulaGrid "
        "hold 100 MB)",
        id="whole-none-free"),
    pytest.param(
        [gpu("n1", 0, unmanaged=20 * GB)], (1, 8 * GB),
        "needs a GPU with ≥8 GB free; none is free now: n1:0 with 4.0 GB free (processes not "
        "started by NebulaGrid hold 20 GB)",
        id="slice-none-free"),
    pytest.param(
        [gpu("n1", 0, blocked="node n1 is drained")], (1, 8 * GB),
        "needs a GPU with ≥8 GB free; no GPU takes new work now (node n1 is drained)",
        id="all-blocked"),
    pytest.param(
        [], (1, None),
        "needs a whole GPU; no GPU is registered yet (no node has answered)",
        id="no-gpus"),
    pytest.param(
        [], (3, 4 * GB + 512),
        "needs 3 GPUs with ≥4.5 GB free on one node; no GPU is registered yet (no node has answered)",
        id="no-gpus-gang-fractional-size"),
]


@pytest.mark.parametrize(("gpus", "ask", "reason"), REASONS)
def test_waiting_reason_sentences(gpus, ask, reason):
    (decision,) = run(gpus, jobs(ask))
    assert decision == Wait(1, reason)


# ------------------------------------------------------------------ properties
def _can_host(view: GpuView, gpu_mem_mb: int | None) -> bool:
    """R3 restated: may this GPU, as it is now, take one GPU's share of this request?"""
    total = view.reading.memory_total_mb
    if view.blocked or not total:
        return False
    nominal = -(-total // GB) * GB  # the size it is sold as: rounded up to a whole GB
    if gpu_mem_mb is None or 2 * gpu_mem_mb > nominal:  # whole card
        return not view.placements and view.unmanaged_used_mb + (gpu_mem_mb or nominal) <= nominal
    if any(p.exclusive for _, p in view.placements) or len(view.placements) >= 4:
        return False
    free = total - view.unmanaged_used_mb - sum(p.memory_mb for _, p in view.placements)
    return free >= max(gpu_mem_mb, MIN_SLICE_MB)


@st.composite
def clusters(draw) -> list[GpuView]:
    views = []
    for n in range(draw(st.integers(1, 5))):
        for i in range(draw(st.integers(1, 8))):
            total = draw(st.integers(8 * GB, 80 * GB))
            unmanaged = draw(st.one_of(st.just(0), st.integers(0, total)))
            blocked = draw(st.sampled_from([None, None, None, "node unknown (missed 3 probes)"]))
            views.append(gpu(f"node{n:02d}", i, total, unmanaged=unmanaged, blocked=blocked))
    return views


queues = st.lists(
    st.tuples(st.integers(1, 4), st.one_of(st.none(), st.integers(1 * GB, 80 * GB))),
    min_size=1, max_size=30,
).map(lambda asks: jobs(*asks))


@settings(max_examples=150, deadline=None)
@given(clusters(), queues)
def test_decisions_keep_the_rules(gpus, queue):
    decisions = run(gpus, queue)
    assert run(gpus, queue) == decisions  # same input, same decisions
    assert sorted(d.job_id for d in decisions) == sorted(j.id for j in queue)
    by_id = {j.id: j for j in queue}
    state = {g.uuid: g for g in gpus}
    # Replay in the scheduler's order (submit time), checking each decision against the
    # state left by the decisions before it.
    for decision in decisions:
        job = by_id[decision.job_id]
        if isinstance(decision, Wait):
            if decision.reason.startswith("held for job "):
                continue  # a reservation keeps it off cards it could take now
            assert decision.reason.startswith("needs ")
            per_node: dict[str, int] = {}
            for view in state.values():
                per_node[view.node] = per_node.get(view.node, 0) + _can_host(view, job.gpu_mem_mb)
            assert max(per_node.values()) < job.gpu_count, "first fit left a placeable job waiting"
            continue
        assert isinstance(decision, Start)
        assert len(decision.placements) == job.gpu_count
        assert len({p.gpu_uuid for p in decision.placements}) == job.gpu_count
        assert len({p.node for p in decision.placements}) == 1
        for p in decision.placements:
            view = state[p.gpu_uuid]
            assert view.blocked is None
            assert (p.node, p.gpu_index) == (view.node, view.reading.index)
            assert _can_host(view, job.gpu_mem_mb)
            state[p.gpu_uuid] = replace(view, placements=view.placements + ((job.id, p),))
    for view in state.values():
        total = view.reading.memory_total_mb
        held = [p for _, p in view.placements]
        assert len(held) <= MAX_ALLOCATIONS_PER_GPU
        # Memory is never promised twice, exclusive or not: others' usage stays theirs.
        assert sum(p.memory_mb for p in held) + view.unmanaged_used_mb <= total
        if any(p.exclusive for p in held):
            assert len(held) == 1
            assert held[0].memory_mb == total - view.unmanaged_used_mb
        else:
            assert all(p.memory_mb >= MIN_SLICE_MB for p in held)


@settings(max_examples=50, deadline=None)
@given(clusters(), queues)
def test_blocked_gpus_never_used(gpus, queue):
    blocked = {g.uuid for g in gpus if g.blocked}
    for decision in run(gpus, queue):
        if isinstance(decision, Start):
            assert not blocked & {p.gpu_uuid for p in decision.placements}


# ------------------------------------------------------------------ best fit for whole cards
NV12 = {f"GPU{a}": {f"GPU{b}": "NV12" for b in range(4) if b != a} for a in range(4)}


def test_a_small_gang_leaves_the_only_four_card_machine_to_a_four_card_gang():
    """The lab month's lesson: 2-card jobs went to the NVLinked A100s (the best links),
    the one machine a 4-card job can use, while a pair that reports no links (the AMD and
    Ascend nodes) stayed idle. A 2-card job now takes the pair it fills, and the 4-card job
    behind it starts in the same pass."""
    gpus = [gpu("a100", i, A100_80_MB) for i in range(4)] + [gpu("mi210", i, 65520) for i in range(2)]
    decisions = schedule(Snapshot(gpus=tuple(gpus), queue=jobs((2, None), (4, None)),
                                  topologies={"a100": NV12}))
    assert [where(d) for d in decisions] == [
        [("mi210", 0, 65520, True), ("mi210", 1, 65520, True)],
        [("a100", i, A100_80_MB, True) for i in range(4)]]


def test_one_card_takes_the_last_free_card_of_a_node_before_opening_a_pair():
    """Listed first and idle, n1's pair would be broken up by a 1-card job while n2 has a
    free card beside a busy one; the 2-card job behind it would then wait."""
    busy = Placement(node="n2", gpu_index=0, gpu_uuid="GPU-n2-0", memory_mb=RTX4090_MB, exclusive=True)
    gpus = [gpu("n1", 0), gpu("n1", 1), gpu("n2", 0, placements=[(99, busy)]), gpu("n2", 1)]
    decisions = run(gpus, jobs((1, None), (2, None)))
    assert [where(d) for d in decisions] == [
        [("n2", 1, RTX4090_MB, True)],
        [("n1", 0, RTX4090_MB, True), ("n1", 1, RTX4090_MB, True)]]


def test_best_fit_weighs_nothing_when_set_to_zero():
    """``scheduler.weights.fit: 0``: the listing order and the links decide, as before."""
    from nebula_tui.scheduler.snapshot import SchedulerConfig
    gpus = [gpu("a100", i, A100_80_MB) for i in range(4)] + [gpu("mi210", i, 65520) for i in range(2)]
    decisions = schedule(Snapshot(gpus=tuple(gpus), queue=jobs((2, None)), topologies={"a100": NV12},
                                  config=SchedulerConfig(w_fit=0.0)))
    assert [node for node, *_ in where(decisions[0])] == ["a100", "a100"]


def test_best_fit_never_fills_a_node_under_suspicion_first():
    """A throttling card lowers its node's health score to 0.85 (a 0.3 health term): the
    1-card job that best fit would put on that node's last free card goes to the healthy
    pair instead, as it did before best fit."""
    from dataclasses import replace
    busy = Placement(node="n2", gpu_index=0, gpu_uuid="GPU-n2-0", memory_mb=RTX4090_MB, exclusive=True)
    suspect = [replace(g, health_score=0.85) for g in (gpu("n2", 0, placements=[(99, busy)]), gpu("n2", 1))]
    decisions = run([gpu("n1", 0), gpu("n1", 1), *suspect], jobs((1, None)))
    assert where(decisions[0]) == [("n1", 0, RTX4090_MB, True)]


def test_best_fit_counts_a_mig_cards_instances_not_the_card_beside_them():
    """An A100 in MIG mode takes no work; its two 3g.40gb instances are the node's devices.
    A 1-card job leaves one of them free, as it leaves one card of a free pair: the card
    itself is no third card that makes the MIG node look fuller, so the listing order
    decides, as it did before best fit (the nvidia job of test_vendors_e2e)."""
    parent = gpu("m", 0, A100_80_MB, blocked="MIG mode is on: jobs get its MIG instances")
    instances = [GpuView(node="m", reading=GpuReading(index=i, uuid=f"MIG-m-{i}", name="A100 3g.40gb",
                                                      memory_total_mb=40192, parent_uuid="GPU-m-0"))
                 for i in (1, 2)]
    decisions = run([gpu("n1", 0), gpu("n1", 1), parent, *instances], jobs((1, None)))
    assert where(decisions[0]) == [("n1", 0, RTX4090_MB, True)]
