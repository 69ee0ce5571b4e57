"""The scheduler's rules, one table per rule (R3, R5–R11, R14, R25), snapshot in, decisions out.

Every case builds a cluster from the model's frozen dataclasses and asserts the decisions
users would see: where each job goes, or the sentence it waits with.
"""

from __future__ import annotations

import pytest

from nebula_tui.config.settings import scheduler_settings
from nebula_tui.model import MIN_SLICE_MB, GpuReading, GpuView, Placement, card_share, charged_gpu_hours
from nebula_tui.scheduler import (Fail, PendingJob, RunningJob, SchedulerConfig, Snapshot, Start,
                                  UserShare, Wait, fairshare, schedule)
from nebula_tui.scheduler import estimates
from nebula_tui.units import in_time
from nebula_tui.scheduler.topology import link_rank, topology_penalty

GB = 1024
RTX4090_MB = 24564  # nvidia-smi's "24 GB" 4090: a little under 24 GiB
RTX3090_MB = 24576  # the 3090 reports exactly 24 GiB
LAPTOP_MB = 8188
A100_MB = 81920
NOW = 1_000_000.0


def card(node: str, index: int, total: int | None = RTX4090_MB, *, name: str = "RTX 4090",
         cap: str | None = "8.9", cuda: str | None = "12.4", vendor: str = "nvidia",
         temp: float | None = 35.0, util: float | None = 0.0, health: float = 1.0,
         blocked: str | None = None, unmanaged: int = 0, placements=()) -> GpuView:
    reading = GpuReading(index=index, uuid=f"GPU-{node}-{index}", name=name, memory_total_mb=total,
                         compute_cap=cap, vendor=vendor, temperature_c=temp, utilization_pct=util)
    return GpuView(node=node, reading=reading, blocked=blocked, placements=tuple(placements),
                   unmanaged_used_mb=unmanaged, health_score=health, cuda_version=cuda)


def job(id: int, count: int = 1, mem: int | None = None, **kw) -> PendingJob:
    kw.setdefault("submitted_at", NOW - 1000 + id)
    kw.setdefault("user", "u")
    return PendingJob(id=id, gpu_count=count, gpu_mem_mb=mem, **kw)


def run(gpus, queue, **kw) -> dict[int, object]:
    snapshot = Snapshot(gpus=tuple(gpus), queue=tuple(queue), now=kw.pop("now", NOW), **kw)
    decisions = schedule(snapshot)
    assert schedule(snapshot) == decisions  # deterministic
    return {d.job_id: d for d in decisions}


def on(decision) -> list[tuple[str, int]]:
    assert isinstance(decision, Start), decision
    return [(p.node, p.gpu_index) for p in decision.placements]


def held(job_id: int, node: str, index: int, mb: int, exclusive: bool = False):
    return (job_id, Placement(f"GPU-{node}-{index}", node, index, mb, exclusive))


# ------------------------------------------------------------------ R3 slices
def test_three_8g_slices_do_not_fit_a_4090_but_fit_a_3090():
    # 3 × 8192 = 24576 MiB: more than a 4090's 24564 MiB, exactly a 3090's 24576 MiB.
    queue = [job(1, mem=8 * GB), job(2, mem=8 * GB), job(3, mem=8 * GB)]
    got = run([card("n1", 0)], queue)
    assert on(got[1]) == on(got[2]) == [("n1", 0)]
    assert got[3] == Wait(3, "needs a GPU with ≥8 GB free; none is free now: behind jobs 1, 2 in "
                             "fair-share order, which took n1:0; n1:0 reserved for it, estimated "
                             "start in ~24 h (jobs 1, 2 have no --time: end estimated from the default)")
    got = run([card("n1", 0, RTX3090_MB, name="RTX 3090")], queue)
    assert all(on(got[i]) == [("n1", 0)] for i in (1, 2, 3))


def test_slices_pack_onto_a_shared_card_while_whole_card_jobs_wait():
    # R3 exists because an 8 GB job leaves 16 GB idle: while a whole-card job waits for the
    # only wholly free card, the slice fills the shared card, though it shows load.
    busy = card("n1", 0, util=60.0, temp=57.0, placements=[held(9, "n1", 0, 10 * GB)])
    got = run([busy, card("n1", 1)], [job(1, mem=10 * GB), job(2)])
    assert on(got[1]) == [("n1", 0)] and on(got[2]) == [("n1", 1)]
    # With no whole-card job waiting, it goes to the idle, cool card instead.
    got = run([busy, card("n1", 1)], [job(1, mem=10 * GB)])
    assert on(got[1]) == [("n1", 1)]


def test_small_jobs_spread_to_the_coolest_card_when_no_whole_card_job_waits():
    """The reproduction: three 6 GB jobs were stacked on one card running at 100% and 77 °C
    while an identical card sat idle and cool."""
    hot = card("n1", 0, util=100.0, temp=77.0, placements=[held(9, "n1", 0, 6 * GB)])
    got = run([hot, card("n1", 1)], [job(1, mem=6 * GB), job(2, mem=6 * GB), job(3, mem=6 * GB)])
    assert [on(got[i]) for i in (1, 2, 3)] == [[("n1", 1)]] * 3
    # Two idle cards and no reading yet of the jobs this pass places: they alternate.
    got = run([card("n1", 0), card("n1", 1)], [job(i, mem=6 * GB) for i in (1, 2, 3, 4)])
    assert [on(got[i])[0][1] for i in (1, 2, 3, 4)] == [0, 1, 0, 1]


def test_packing_only_keeps_the_whole_cards_the_queue_needs():
    # Three idle cards and one whole-card job: two cards are more than it needs, so the
    # first slices spread, until only the card the whole job needs is left wholly free;
    # the job after it then packs.
    gpus = [card("n1", i) for i in range(3)]
    queue = [job(1, mem=4 * GB), job(2, mem=4 * GB), job(3, mem=4 * GB), job(4, submitted_at=NOW)]
    got = run(gpus, queue)
    assert [on(got[i])[0][1] for i in (1, 2, 3)] == [0, 1, 0]
    assert on(got[4]) == [("n1", 2)]


def test_a_service_slice_fills_a_shared_card_even_while_no_whole_card_job_waits():
    """With no whole-card job waiting, a slice spreads to the coolest, least shared card. A
    service has no end, though: on an idle card it would break that card (and its node's
    pair) for the month, so it fills a card already shared. A slice with --time spreads."""
    shared = held(60, "n1", 0, 8 * GB)
    gpus = [card("n1", 0, placements=[shared]), card("n1", 1), card("n2", 0), card("n2", 1)]
    running = (RunningJob(60, "x", (shared[1],), NOW, time_limit_s=3600),)
    got = run(gpus, [job(1, mem=4 * GB, service=True)], running=running)
    assert on(got[1]) == [("n1", 0)]
    got = run(gpus, [job(1, mem=4 * GB, time_limit_s=3600)], running=running)
    assert on(got[1]) != [("n1", 0)]


def test_whole_card_reservation_is_what_is_really_free():
    got = run([card("n1", 0, unmanaged=2 * GB)], [job(1, mem=13 * GB)])
    (p,) = got[1].placements
    assert p.exclusive and p.memory_mb == RTX4090_MB - 2 * GB


# ------------------------------------------------------------------ R14 services
def test_service_card_keeps_its_spare_and_is_never_taken_whole():
    spare = SchedulerConfig().service_spare_mb
    gpus = [card("n1", 0)]
    queue = [job(1, mem=8 * GB, service=True), job(2, mem=10 * GB), job(3, mem=4 * GB),
             job(4, mem=None)]
    got = run(gpus, queue)
    assert on(got[1]) == on(got[2]) == [("n1", 0)]
    # 24564 - 8192 - 10240 = 6132 MiB free, but 2048 stay spare: 4084 < 4096.
    assert RTX4090_MB - 8 * GB - 10 * GB - spare < MIN_SLICE_MB <= RTX4090_MB - 8 * GB - 10 * GB
    assert isinstance(got[3], Wait) and isinstance(got[4], Wait)
    # Without the service the same 4 GB slice fits.
    got = run(gpus, [job(1, mem=8 * GB), job(2, mem=10 * GB), job(3, mem=4 * GB)])
    assert on(got[3]) == [("n1", 0)]


def test_running_service_protects_its_card():
    service = held(7, "n1", 0, 8 * GB)
    gpus = [card("n1", 0, placements=[service])]
    running = (RunningJob(7, "svc", (service[1],), NOW - 60, service=True),)
    got = run(gpus, [job(1, mem=11 * GB), job(2, mem=4 * GB), job(3, mem=None)], running=running)
    assert on(got[1]) == [("n1", 0)]
    # 24564 - 8192 - 11264 = 5108 MiB free would hold 4 GB, but 2048 of it is the spare.
    assert got[2] == Wait(2, "needs a GPU with ≥4 GB free; none is free now: behind job 1 in "
                             "fair-share order, which took n1:0; n1:0 reserved for it, estimated "
                             "start in ~24 h (jobs 1, 7 have no --time: end estimated from the default)")
    assert got[3] == Wait(3, "needs a whole GPU; none is free now: n1:0 held by jobs 1, 7")  # never whole
    got = run(gpus, [job(1, mem=11 * GB), job(2, mem=4 * GB)])  # the same card, no service
    assert on(got[2]) == [("n1", 0)]


def test_service_slice_itself_needs_room_for_its_spare():
    gpus = [card("n1", 0, unmanaged=RTX4090_MB - 9000)]  # 9000 MiB really free
    got = run(gpus, [job(1, mem=8 * GB, service=True)])
    assert isinstance(got[1], Wait)
    got = run(gpus, [job(1, mem=8 * GB)])
    assert on(got[1]) == [("n1", 0)]


def test_a_service_as_big_as_its_card_cannot_keep_its_spare_there():
    """An 8 GB service took an 8 GB card whole, leaving no 2 GB spare: a card that cannot
    keep the spare beside the service cannot host it (a bigger one can, whole or not)."""
    small = [card("n1", 0, 8 * GB, name="RTX 4060")]
    assert isinstance(run(small, [job(1, mem=8 * GB, service=True)])[1], Wait)
    assert on(run(small, [job(1, mem=8 * GB)])[1]) == [("n1", 0)]  # not a service: it fits
    got = run([card("n1", 0)], [job(1, mem=16 * GB, service=True)])  # 16 + 2 of a 24 GB card
    assert on(got[1]) == [("n1", 0)]
    assert isinstance(run([card("n1", 0)], [job(1, mem=23 * GB, service=True)])[1], Wait)


# ------------------------------------------------------------------ R11 filters
MIXED = [card("ada", 0, cap="8.9", cuda="12.4"), card("amp", 0, A100_MB, name="A100", cap="8.0",
                                                       cuda="12.10"),
         card("bw", 0, 32 * GB, name="RTX 5090", cap="12.0", cuda="12.8")]

FILTERS = [
    pytest.param(dict(arch="sm_89"), "ada", id="arch-exact"),
    pytest.param(dict(arch="sm_80"), "amp", id="arch-exact-ampere"),
    pytest.param(dict(arch=">=sm_90"), "bw", id="arch-minimum-only-blackwell"),
    pytest.param(dict(arch="sm_120"), "bw", id="arch-sm120-is-12.0"),
    pytest.param(dict(cuda="12.9"), "amp", id="cuda-12.10-is-newer-than-12.9"),
    pytest.param(dict(cuda="12.8", arch=">=sm_89"), "bw", id="cuda-and-arch"),
    pytest.param(dict(vendor="nvidia", arch="sm_89"), "ada", id="vendor"),
]


@pytest.mark.parametrize(("flags", "node"), FILTERS)
def test_filters_choose_the_matching_card(flags, node):
    got = run(MIXED, [job(1, **flags)])
    assert on(got[1]) == [(node, 0)]


FILTER_REASONS = [
    pytest.param(dict(arch="sm_90"),
                 "needs a whole GPU (sm_90); no GPU with sm_90 in the cluster (here: sm_80, sm_89, sm_120)",
                 id="no-such-arch"),
    pytest.param(dict(arch=">=sm_130"),
                 "needs a whole GPU (sm_130 or newer); no GPU with sm_130 or newer in the cluster "
                 "(here: sm_80, sm_89, sm_120)", id="no-newer-arch"),
    pytest.param(dict(cuda="13.0"), "needs CUDA ≥13.0; drivers here support up to 12.10", id="cuda"),
    pytest.param(dict(vendor="intel"), "needs a whole GPU (intel); no intel GPU in the cluster",
                 id="vendor"),
    pytest.param(dict(mem=100 * GB), "needs a GPU with ≥100 GB free; the largest card here has 80 GB",
                 id="bigger-than-any-card"),
]


@pytest.mark.parametrize(("flags", "reason"), FILTER_REASONS)
def test_filters_say_what_is_missing(flags, reason):
    mem = flags.pop("mem", None)
    got = run(MIXED, [job(1, mem=mem, **flags)])
    assert got[1] == Wait(1, reason)


@pytest.mark.parametrize(("flags", "reason"), [
    (dict(arch="ampere"), "--arch 'ampere' is not an architecture like sm_89, '>=sm_80' or gfx90a"),
    (dict(cuda="twelve"), "--cuda 'twelve' is not a version like 12.1"),
])
def test_bad_requests_fail(flags, reason):
    assert run(MIXED, [job(1, **flags)])[1] == Fail(1, reason)


def test_blocked_and_unhealthy_cards_are_never_used():
    gpus = [card("node03", 0, blocked="node03 is drained"), card("node04", 0, health=0.1),
            card("node05", 0, blocked="GPU in maintenance")]
    got = run(gpus, [job(1)])
    assert got[1] == Wait(1, "needs a whole GPU; no GPU takes new work now (node03 is drained, "
                             "node04's health score is 0.10, below 0.25, GPU in maintenance)")
    got = run(gpus + [card("node06", 0)], [job(1), job(2)])
    assert on(got[1]) == [("node06", 0)]
    assert got[2] == Wait(2, "needs a whole GPU; none is free now: behind job 1 in fair-share "
                             "order, which took node06:0; node06:0 reserved for it, estimated start "
                             "in ~24 h (job 1 has no --time: end estimated from the default)")


# ------------------------------------------------------------------ R10 scoring
SCORING = [
    pytest.param([card("a", 0, temp=80.0), card("b", 0, temp=40.0)], 1, [("b", 0)], id="hot-loses"),
    pytest.param([card("a", 0, util=90.0), card("b", 0, util=0.0)], 1, [("b", 0)], id="busy-loses"),
    pytest.param([card("a", 0, util=3.0), card("b", 0, util=0.0)], 1, [("a", 0)],
                 id="reading-noise-does-not-decide"),
    pytest.param([card("a", 0, health=0.6), card("b", 0)], 1, [("b", 0)], id="health"),
    pytest.param([card("a", 0, health=0.6), card("b", 0, temp=80.0)], 1, [("a", 0)],
                 id="cool-beats-health"),
    pytest.param(  # health before topology: a NVLink pair on a sick node loses to plain PCIe
        [card("a", 0, health=0.7), card("a", 1, health=0.7), card("b", 0), card("b", 1)], 2,
        [("b", 0), ("b", 1)], id="health-beats-topology"),
]

TOPOS = {"a": {"GPU0": {"GPU1": "NV4"}, "GPU1": {"GPU0": "NV4"}},
         "b": {"GPU0": {"GPU1": "SYS"}, "GPU1": {"GPU0": "SYS"}}}


@pytest.mark.parametrize(("gpus", "count", "expected"), SCORING)
def test_scoring_order(gpus, count, expected):
    got = run(gpus, [job(1, count)], topologies=TOPOS)
    assert on(got[1]) == expected


def test_topology_prefers_the_strongest_weakest_link():
    gpus = [card("n", i) for i in range(4)]
    links = {"GPU0": {"GPU1": "PHB", "GPU2": "PHB", "GPU3": "PHB"},
             "GPU1": {"GPU0": "PHB", "GPU2": "PHB", "GPU3": "PHB"},
             "GPU2": {"GPU0": "PHB", "GPU1": "PHB", "GPU3": "NV12"},
             "GPU3": {"GPU0": "PHB", "GPU1": "PHB", "GPU2": "NV12"}}
    got = run(gpus, [job(1, 2)], topologies={"n": links})
    assert on(got[1]) == [("n", 2), ("n", 3)]


def test_a_4090_with_a_laptop_card_runs_at_the_slower_link():
    # The demo's node01: two 4090s on the CPU's host bridge (x16), a laptop-class 4060 off
    # the chipset (x8, across the interconnect). A pair goes to the two 4090s; a mixed pair
    # is judged by its weakest link, then penalised for mixing models.
    gpus = [card("node01", 0), card("node01", 1), card("node01", 2, LAPTOP_MB, name="RTX 4060 Laptop")]
    links = {f"GPU{i}": {f"GPU{j}": ("PHB" if max(i, j) < 2 else "SYS") for j in range(3) if j != i}
             for i in range(3)}
    got = run(gpus, [job(1, 2)], topologies={"node01": links})
    assert on(got[1]) == [("node01", 0), ("node01", 1)]
    # With one 4090 busy, the only pair is mixed: it still starts (a slower set beats none).
    busy = [card("node01", 0, placements=[held(9, "node01", 0, RTX4090_MB, True)])] + gpus[1:]
    got = run(busy, [job(1, 2)], topologies={"node01": links})
    assert on(got[1]) == [("node01", 1), ("node01", 2)]
    # The penalty orders: same-model PHB < mixed PHB < same-model SYS.
    phb, sys = link_rank("PHB"), link_rank("SYS")
    assert topology_penalty(phb, False, phb) < topology_penalty(phb, True, phb) < topology_penalty(sys, False, sys)


def test_link_rank_order():
    codes = ["NV18", "NV12", "NV4", "NV1", "PIX", "PXB", "PHB", "NODE", "SYS", "???"]
    ranks = [link_rank(c) for c in codes]
    assert ranks == sorted(ranks, reverse=True) and len(set(ranks)) == len(ranks)
    assert link_rank("SOC") == link_rank("SYS")


# ------------------------------------------------------------------ R8 gangs
A100S = lambda node, n: [card(node, i, A100_MB, name="A100", cap="8.0") for i in range(n)]  # noqa: E731


def test_four_24g_cards_across_nodes_only_with_nodes():
    gpus = A100S("n1", 2) + A100S("n2", 2)
    got = run(gpus, [job(1, 4, 24 * GB)])
    assert got[1] == Wait(1, "needs 4 GPUs with ≥24 GB free on one node; the largest node has 2 "
                             "such GPUs (--nodes lets a job span nodes)")
    got = run(gpus, [job(1, 4, 24 * GB, max_nodes=2)])
    assert on(got[1]) == [("n1", 0), ("n1", 1), ("n2", 0), ("n2", 1)]


def test_gang_prefers_fewest_nodes():
    gpus = A100S("n1", 2) + A100S("n2", 4) + A100S("n3", 2)
    got = run(gpus, [job(1, 4, 24 * GB, max_nodes=3)])
    assert {n for n, _ in on(got[1])} == {"n2"}
    gpus = A100S("n1", 1) + A100S("n2", 3) + A100S("n3", 2)
    got = run(gpus, [job(1, 5, 24 * GB, max_nodes=2)])
    assert sorted({n for n, _ in on(got[1])}) == ["n2", "n3"]
    got = run(gpus, [job(1, 6, 24 * GB, max_nodes=2)])
    assert got[1] == Wait(1, "needs 6 GPUs with ≥24 GB free on at most 2 nodes; 2 nodes have at "
                             "most 5 such GPUs together")


def test_gang_is_all_or_nothing():
    gpus = A100S("n1", 3)
    busy = [card("n1", 0, A100_MB, name="A100", cap="8.0", unmanaged=70 * GB)] + gpus[1:]
    got = run(busy, [job(1, 3, 24 * GB), job(2, 1, 24 * GB)])
    assert got[1] == Wait(1, "needs 3 GPUs with ≥24 GB free on one node; best now: n1 has 2; n1:0 "
                             "with 10 GB free (processes not started by NebulaGrid hold 70 GB)")
    assert on(got[2]) == [("n1", 1)]


# ------------------------------------------------------------------ R6 order
def test_fair_share_lowest_weight_first_then_priority_jumps():
    users = {"alice": UserShare("alice", 1.5), "bob": UserShare("bob", 1.0)}
    queue = [job(1, user="alice", submitted_at=10.0), job(2, user="bob", submitted_at=20.0),
             job(3, user="carol", submitted_at=30.0, priority=5), job(4, user="dave", submitted_at=5.0)]
    got = run([card("n1", 0)], queue, users=users)
    assert isinstance(got[3], Start)  # priority first
    decisions = schedule(Snapshot(gpus=(card("n1", 0),), queue=tuple(queue), users=users, now=NOW))
    # dave (missing user: weight 1.0) submitted before bob (1.0), alice (1.5) last.
    assert [d.job_id for d in decisions] == [3, 4, 2, 1]


def test_quota_refusal_keeps_the_user_waiting():
    text = fairshare.quota_refusal("alice", 2012.5, 2000, ["root", "bob"])
    users = {"alice": UserShare("alice", 1.0, refusal=text)}
    got = run([card("n1", 0)], [job(1, user="alice"), job(2, user="bob")], users=users,
              config=SchedulerConfig(quota_mode="refuse"))
    assert got[1] == Wait(1, text) and isinstance(got[2], Start)
    # scavenge (the default): no refusal; the in-quota job gets the card, alice's waits for an idle one
    got = run([card("n1", 0)], [job(1, user="alice"), job(2, user="bob")], users=users)
    assert got[1].reason.startswith("over quota: runs only on idle cards; ") and isinstance(got[2], Start)


# ------------------------------------------------------------------ R25 reservation, backfill
def test_backfill_only_before_the_reservation():
    blocker = [held(50, "n1", i, RTX4090_MB, True) for i in range(3)]
    gpus = [card("n1", i, placements=[blocker[i]]) for i in range(3)] + [card("n1", 3)]
    running = (RunningJob(50, "x", tuple(p for _, p in blocker), NOW - 3600, time_limit_s=7200),)
    queue = [job(1, 4), job(2), job(3, time_limit_s=7200), job(4, time_limit_s=1800), job(5)]
    got = run(gpus, queue, running=running)
    assert got[1] == Wait(1, "needs 4 whole GPUs on one node; best now: n1 has 1; n1:0-2 held by "
                             "job 50; n1:0-3 reserved for it, estimated start in ~60 min")
    held_for = "held for job 1 (n1:0-3 reserved for it; estimated start in ~60 min)"
    assert got[2] == Wait(2, held_for)  # no --time: never backfills
    assert got[3] == Wait(3, held_for)  # would end in 2 h, after the reservation starts
    assert on(got[4]) == [("n1", 3)]  # ends in 30 min, before it: backfilled
    # Job 5 asks what job 2 asked: the same answer (a refusal in a pass is final).
    assert got[5] == Wait(5, held_for)


def test_reservation_keeps_a_free_card_from_a_longer_job():
    blocker = [held(50, "n1", i, RTX4090_MB, True) for i in range(3)]
    gpus = [card("n1", i, placements=[blocker[i]]) for i in range(3)] + [card("n1", 3)]
    running = (RunningJob(50, "x", tuple(p for _, p in blocker), NOW - 3600, time_limit_s=7200),)
    got = run(gpus, [job(1, 4), job(2, time_limit_s=7200), job(3)], running=running)
    assert got[2] == Wait(2, "held for job 1 (n1:0-3 reserved for it; estimated start in ~60 min)")
    assert got[3] == Wait(3, "held for job 1 (n1:0-3 reserved for it; estimated start in ~60 min)")


def test_a_running_job_without_time_limit_still_gives_a_reservation_by_its_estimate():
    """No --time no longer means no reservation (a gang behind a service starved): the
    running job's end is estimated (estimates.py) and the reason says from what; a short
    job may still use the held card, one without --time may not."""
    blocker = [held(50, "n1", i, RTX4090_MB, True) for i in range(3)]
    gpus = [card("n1", i, placements=[blocker[i]]) for i in range(3)] + [card("n1", 3)]
    running = (RunningJob(50, "x", tuple(p for _, p in blocker), NOW - 3600),)
    got = run(gpus, [job(1, 4), job(2), job(3, time_limit_s=3600)], running=running)
    assert got[1] == Wait(1, "needs 4 whole GPUs on one node; best now: n1 has 1; n1:0-2 held by job 50; "
                             "n1:0-3 reserved for it, estimated start in ~23 h (job 50 has no --time: "
                             "end estimated from the default)")
    assert got[2].reason.startswith("held for job 1 (n1:0-3 reserved for it")
    assert on(got[3]) == [("n1", 3)]
    # The lab's max_time, where it has one, is the estimate, and the reason says so.
    estimate = estimates.run_estimate(None, max_time_s=2 * 3600)
    running = (RunningJob(50, "x", tuple(p for _, p in blocker), NOW - 3600, estimate=estimate),)
    got = run(gpus, [job(1, 4)], running=running)
    assert got[1].reason.endswith("estimated start in ~60 min (job 50 has no --time: end estimated "
                                  "from limits.max_time)")


def _gang_lab(busy_big: int = 0):
    """A lab whose one 4-card A100 machine alone holds 4-card gangs, beside three 2-card
    ones; the first ``busy_big`` A100s held by job 60 for an hour."""
    held_big = [held(60, "big", i, A100_MB, True) for i in range(busy_big)]
    gpus = [card("big", i, A100_MB, name="A100", placements=held_big[i:i + 1]) for i in range(4)]
    gpus += [card(f"p{n}", i) for n in (1, 2, 3) for i in range(2)]
    running = (RunningJob(60, "x", tuple(p for _, p in held_big), NOW, time_limit_s=3600),) if busy_big else ()
    return gpus, running


def test_a_service_never_takes_the_only_machine_that_holds_the_lab_s_gangs():
    """The built-in month's one 4-GPU service took the demo lab's only 4-GPU machine on
    day 21 and held it to the month's end: every 4-GPU job after it never ran (95 jobs).
    A service that only that machine can hold waits and says how it can run there; a
    training job of the same size starts; an admin's --priority lets it in."""
    gpus, _ = _gang_lab()
    got = run(gpus, [job(1, 4, service=True), job(2, 4, time_limit_s=3600)])
    assert got[1] == Wait(1, "a service would hold big with no end, the only machine with more than 2 GPUs, "
                             "so no job that needs it could run; it runs there in a booking (`nebula "
                             "reserve`, then --reservation) or submitted with an admin's --priority")
    assert on(got[2]) == [("big", i) for i in range(4)]
    got = run(gpus, [job(1, 4, service=True, priority=5)])
    assert on(got[1]) == [("big", i) for i in range(4)]
    # Smaller services go to the other machines, and wait for them rather than take big
    # (with services allowed all the cards: scheduler.service_share has its own test).
    got = run(gpus, [job(1, 2, service=True), job(2, 2, service=True), job(3, 2, service=True),
                     job(4, 1, service=True)], config=SchedulerConfig(service_share=1.0))
    assert sorted(node for i in (1, 2, 3) for node, _ in on(got[i])) == ["p1", "p1", "p2", "p2", "p3", "p3"]
    assert got[4] == Wait(4, "needs a whole GPU; only big has it free now, and a service would hold big with "
                             "no end, the only machine with more than 2 GPUs, so no job that needs it could "
                             "run; it waits for another machine")
    # A lab of machines alike has no such machine, nor one of two machines: the service starts.
    alike = [card(n, i) for n in ("a", "b", "c", "d", "e") for i in range(4)]
    assert on(run(alike, [job(1, 4, service=True)])[1]) == [("a", i) for i in range(4)]
    assert on(run(gpus[:6], [job(1, 4, service=True)])[1]) == [("big", i) for i in range(4)]


def test_services_hold_at_most_half_the_cards_so_work_that_ends_keeps_some():
    """The concentrated month: its second 2-card service took the last two whole cards
    outside the gang machine for the month's last five days, and the 1-card jobs that came
    after waited p95 893 min (slurm-like, which left that service waiting: 320). Services
    together hold at most half the lab's cards (scheduler.service_share); past it a whole
    card service waits and says why, a job that ends starts, and a service slice may
    still fill a card a service holds. The first service always may start."""
    svc = lambda jid, node, i, mb=RTX4090_MB, excl=True: (jid, Placement(f"GPU-{node}-{i}", node, i, mb, excl))
    two = [svc(50, "n1", 0), svc(50, "n1", 1), svc(51, "n2", 0), svc(51, "n2", 1)]
    lab = [card(n, i, placements=[p for p in two if p[1].node == n and p[1].gpu_index == i])
           for n in ("n1", "n2", "n3", "n4") for i in range(2)]
    running = (RunningJob(50, "a", tuple(p for _, p in two[:2]), NOW - 60, service=True),
               RunningJob(51, "b", tuple(p for _, p in two[2:]), NOW - 60, service=True))
    queue = [job(1, 2, service=True), job(2, 2, time_limit_s=3600), job(3, 1, service=True)]
    got = run(lab, queue, running=running)
    says = ("services hold 4 of the lab's 8 cards, the most they may (50%, scheduler.service_share), so "
            "work that ends keeps cards to run on; it waits for a service to end")
    assert got[1] == Wait(1, says) and got[3] == Wait(3, says)
    assert {node for node, _ in on(got[2])} <= {"n3", "n4"}
    # Under the bound (one service holds two cards), the same service starts.
    assert len(on(run(lab, queue, running=running[:1])[1])) == 2
    # At the bound a service slice fills a card a service already holds, and only that.
    sliced = [svc(50, "n1", 0), svc(50, "n1", 1), svc(51, "n2", 0, 8 * GB, False), svc(52, "n3", 0)]
    lab = [card(n, i, placements=[p for p in sliced if p[1].node == n and p[1].gpu_index == i])
           for n in ("n1", "n2", "n3", "n4") for i in range(2)]
    running = (RunningJob(50, "a", (sliced[0][1], sliced[1][1]), NOW - 60, service=True),
               RunningJob(51, "b", (sliced[2][1],), NOW - 60, service=True),
               RunningJob(52, "c", (sliced[3][1],), NOW - 60, service=True))
    got = run(lab, [job(1, mem=4 * GB, service=True), job(2, mem=4 * GB, service=True, submitted_at=NOW),
                    job(3, service=True)], running=running)
    assert on(got[1]) == on(got[2]) == [("n2", 0)] and isinstance(got[3], Wait)
    # 1 (no bound) lets it in; a lab's first service starts even where half is no card.
    assert len(on(run(lab, [job(1, 2, service=True)], running=running,
                      config=SchedulerConfig(service_share=1.0))[1])) == 2
    assert on(run([card("n1", 0)], [job(1, service=True)])[1]) == [("n1", 0)]
    assert scheduler_settings({"service_share": 0.75}).config.service_share == 0.75
    with pytest.raises(ValueError, match="service_share must be a fraction"):
        scheduler_settings({"service_share": 0})


def test_a_job_without_time_takes_another_machine_before_the_gang_machine():
    """Best fit alone sends a 1-card job to big's last free card; without --time it would
    hold it for as long as it likes, so it takes a card of a pair instead. With --time
    best fit decides as before."""
    gpus, running = _gang_lab(busy_big=3)
    assert on(run(gpus, [job(1)], running=running)[1]) == [("p1", 0)]
    assert on(run(gpus, [job(1, service=True)], running=running)[1]) == [("p1", 0)]
    assert on(run(gpus, [job(1, time_limit_s=600)], running=running)[1]) == [("big", 3)]


def test_a_slice_fills_a_shared_card_before_it_breaks_an_idle_card_of_the_gang_machine():
    """With no whole-card job waiting, a slice goes to the coolest, least shared card: an
    idle A100 of big, the only machine that holds a 4-card job, which then waits for the
    slice to end. It fills the card already shared on p1 instead, or takes an idle card of
    another machine; big only when nothing else fits it."""
    gpus, _ = _gang_lab()
    shared = held(60, "p1", 0, 8 * GB)
    whole = [held(61, f"p{n}", i, RTX4090_MB, True) for n, i in ((1, 1), (2, 0), (2, 1), (3, 0), (3, 1))]
    pairs = [card("p1", 0, placements=[shared])] + [card(h[1].node, h[1].gpu_index, placements=[h]) for h in whole]
    running = (RunningJob(60, "x", (shared[1],), NOW, time_limit_s=3600),
               RunningJob(61, "y", tuple(p for _, p in whole), NOW, time_limit_s=3600))
    got = run(gpus[:4] + pairs, [job(1, 1, 8 * GB, time_limit_s=3600)], running=running)
    assert on(got[1]) == [("p1", 0)]
    free_pair = gpus[:4] + pairs[:1] + [card("p1", 1)] + pairs[2:]
    got = run(free_pair, [job(1, 1, 8 * GB, time_limit_s=3600)], running=running[:1] + (
        RunningJob(61, "y", tuple(p for _, p in whole[1:]), NOW, time_limit_s=3600),))
    assert on(got[1])[0][0] == "p1"
    # Nothing else fits 16 GB now: big it is. An admin's --priority job decides as before.
    got = run(gpus[:4] + pairs, [job(1, 1, 16 * GB, time_limit_s=3600), job(2, 1, 8 * GB, priority=2)],
              running=running)
    assert on(got[1])[0][0] == "big" and on(got[2])[0][0] == "big"


def test_a_gang_that_waited_gang_age_goes_first_and_its_reservation_holds_off_new_small_work():
    """Fair share alone puts a lighter user's new 1-card job before a heavier user's 4-card
    job: each time a card of the one 4-card machine frees, the small job takes it before the
    gang's turn (and its reservation) comes, so the gang waits as long as small work comes.
    Past scheduler.gang_age the gang goes first: its reservation holds big, and the small
    job runs there only if its --time ends before the reservation starts."""
    gpus, running = _gang_lab(busy_big=1)  # big:0 held for another hour
    pairs = [held(61, f"p{n}", i, RTX4090_MB, True) for n in (1, 2, 3) for i in range(2)]
    gpus = gpus[:4] + [card(f"p{n}", i, placements=[pairs[2 * (n - 1) + i]]) for n in (1, 2, 3) for i in range(2)]
    running += (RunningJob(61, "y", tuple(p for _, p in pairs), NOW, time_limit_s=86400),)
    users = {"heavy": UserShare("heavy", 3.0), "light": UserShare("light", 1.0)}
    gang = job(1, 4, user="heavy", time_limit_s=3600, submitted_at=NOW - 7 * 3600)
    small = job(2, user="light", time_limit_s=2 * 3600, submitted_at=NOW - 60)
    got = run(gpus, [gang, small], running=running, users=users)
    assert got[1].reason.endswith("big:0-3 reserved for it, estimated start in ~60 min")
    assert got[2] == Wait(2, "held for job 1 (big:0-3 reserved for it; estimated start in ~60 min)")
    # a short job still backfills before the reservation
    quick = job(3, user="light", time_limit_s=1800, submitted_at=NOW - 30)
    assert on(run(gpus, [gang, quick], running=running, users=users)[3]) == [("big", 1)]
    # Before gang_age, or with ageing off, fair share decides: the small job takes big:1.
    young = job(1, 4, user="heavy", time_limit_s=3600, submitted_at=NOW - 3 * 3600)
    assert on(run(gpus, [young, small], running=running, users=users)[2]) == [("big", 1)]
    off = SchedulerConfig(gang_age_s=None)
    assert on(run(gpus, [gang, small], running=running, users=users, config=off)[2]) == [("big", 1)]
    # Aged gangs go oldest first, after an admin's --priority and before everything else.
    older = job(4, 2, user="light", submitted_at=NOW - 9 * 3600)
    raised = job(5, user="light", priority=3)
    order = [d.job_id for d in schedule(Snapshot(gpus=tuple(gpus), queue=(small, gang, raised, older),
                                                 running=running, users=users, now=NOW))]
    assert order == [5, 4, 1, 2]
    # nodes.yaml: scheduler.gang_age, a duration; 0 or never turns ageing off
    assert scheduler_settings({"gang_age": "2h"}).config.gang_age_s == 7200
    assert scheduler_settings({"gang_age": 0}).config.gang_age_s is None
    assert SchedulerConfig().gang_age_s == 4 * 3600


def test_reservation_goes_to_the_cards_that_free_up_first():
    soon = held(50, "a", 0, RTX4090_MB, True)
    late = held(51, "b", 0, RTX4090_MB, True)
    gpus = [card("a", 0, placements=[soon]), card("b", 0, placements=[late])]
    running = (RunningJob(50, "x", (soon[1],), NOW, time_limit_s=3 * 3600),
               RunningJob(51, "x", (late[1],), NOW, time_limit_s=600))
    got = run(gpus, [job(1), job(2)], running=running)
    assert got[1] == Wait(1, "needs a whole GPU; none is free now: a:0 held by job 50; b:0 held by "
                             "job 51; b:0 reserved for it, estimated start in ~10 min")


# ------------------------------------------------------------------ R25 --after
AFTER = [
    pytest.param({}, (), (), "does-not-exist",
                 Fail(1, "job 5 (--after) does not exist; this job will not run"), id="unknown"),
    pytest.param({5: "failed"}, (), (), "failed",
                 Fail(1, "job 5 (--after) failed; this job will not run"), id="failed"),
    pytest.param({5: "cancelled"}, (), (), "cancelled",
                 Fail(1, "job 5 (--after) was cancelled; this job will not run"), id="cancelled"),
    pytest.param({}, (5,), (), "running", Wait(1, "waits for job 5 (--after) to finish"), id="running"),
    pytest.param({}, (), (5,), "pending", Wait(1, "waits for job 5 (--after) to finish"), id="pending"),
]


@pytest.mark.parametrize(("finished", "running_ids", "queued", "_", "expected"), AFTER)
def test_after(finished, running_ids, queued, _, expected):
    gpus = [card("n1", 0), card("n1", 1), card("n1", 2)]
    running = tuple(RunningJob(i, "u", (), NOW) for i in running_ids)
    queue = [job(1, after=(5,))] + [job(i, mem=4 * GB, arch="sm_75") for i in queued]
    got = run(gpus, queue, finished=finished, running=running)
    assert got[1] == expected


def test_after_succeeded_starts_and_failures_cascade():
    gpus = [card("n1", 0)]
    got = run(gpus, [job(1, after=(5,))], finished={5: "succeeded"})
    assert isinstance(got[1], Start)
    got = run(gpus, [job(1, after=(2,)), job(2, after=(3,)), job(3, arch="bogus")])
    assert isinstance(got[3], Fail)
    assert got[2].reason.startswith("job 3 (--after) cannot run: --arch 'bogus'")
    assert isinstance(got[1], Fail) and got[1].reason.startswith("job 2 (--after) cannot run")
    got = run(gpus, [job(1, after=(2,)), job(2, after=(1,))])
    assert isinstance(got[1], Fail) and isinstance(got[2], Fail) and "cycle" in got[1].reason


def test_job_started_in_the_same_pass_is_still_running_for_after():
    got = run([card("n1", 0), card("n1", 1)], [job(1), job(2, after=(1,))])
    assert isinstance(got[1], Start)
    assert got[2] == Wait(2, "waits for job 1 (--after) to finish")


# ------------------------------------------------------------------ R5 sentence parts
@pytest.mark.parametrize(("seconds", "text"), [
    (0, "in under a minute"), (59, "in under a minute"), (1500, "in ~25 min"), (5399, "in ~90 min"),
    (7200, "in ~2 h"), (3 * 86400, "in ~3 days"),
])
def test_relative_times(seconds, text):
    assert in_time(seconds) == text


def test_drained_node_named_when_it_is_the_only_fit():
    gpus = [card("node01", 0, LAPTOP_MB, name="laptop"), card("node03", 0, A100_MB, name="A100",
                                                              blocked="node03 is drained")]
    got = run(gpus, [job(1, mem=40 * GB)])
    assert got[1] == Wait(1, "needs a GPU with ≥40 GB free; no GPU takes new work now (node03 is drained)")


# ------------------------------------------------------------------ R6/R7 arithmetic
def test_user_weight():
    assert fairshare.user_weight([], 0.0, NOW, None) == 1.0
    # 10 GPU-hours finished (0.2) + 5 held now (0.1); nothing per job
    w = fairshare.user_weight([(NOW, 4.0), (NOW, 6.0)], 5.0, NOW, None)
    assert w == pytest.approx(1.3)
    week = fairshare.DEFAULT_HALF_LIFE_S
    decayed = fairshare.user_weight([(NOW - week, 10.0)], 0.0, NOW, week)
    assert decayed == pytest.approx(1.0 + 0.2 / 2)
    assert fairshare.user_weight([(NOW - 10 * week, 10.0)], 0.0, NOW) < 1.001


def test_quota_refusal_sentence():
    assert fairshare.quota_refusal("alice", 1999.9, 2000, ["root"]) is None
    assert fairshare.quota_refusal("alice", 2012.5, 2000, ["root", "bob"]) == (
        "alice has used 2012.5 of 2000 GPU-hours this month; an admin (root, bob) can raise the "
        "quota with `nebula quota alice 3000`")
    assert fairshare.quota_refusal("carl", 2000, 2000, []).endswith(
        "an admin can raise the quota with `nebula quota carl 3000`")


def test_slice_counts_its_gigabytes_against_the_reference_card():
    assert card_share(6 * GB, False) == 0.25  # of the 24 GB reference
    assert card_share(6 * GB, True) == 1.0  # a whole card, whatever its size
    assert card_share(40 * GB, False) == 1.0  # never more than a card
    assert card_share(6 * GB, False, 12 * GB) == 0.5
    assert charged_gpu_hours([(6 * GB, False), (80 * GB, True)], 7200) == 2.5
    assert charged_gpu_hours([(6 * GB, False)], 7200, charge=0.25) == 0.125
