"""The queue keeps its promises: one table per rule, then properties (hypothesis).

Nominal sizes, the memory guard's free memory, placement that spreads or packs, reasons
that name the blocker, --after kinds, array throttles, power budgets, backfill windows,
refusal at submit and the precision of fair-share figures — snapshot in, decisions out.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nebula_tui.model import nominal_mb
from nebula_tui.model import takes_whole_card as whole
from nebula_tui.scheduler import (Fail, RunningJob, Start, Wait, admission,
                                  fairshare)
from nebula_tui.scheduler.slices import fit
from support.scheduling import (A100_MB, GB, H100_MB, L4_MB, LAPTOP_MB, NOW, RTX4090_MB, card, held, job, on,
                                run)




# ------------------------------------------------------------------ nominal sizes (R3)
@pytest.mark.parametrize(("total", "request_gb", "takes_whole", "fits_empty"), [
    (RTX4090_MB, 24, True, True),    # the documents' own example
    (RTX4090_MB, 25, True, False),
    (RTX4090_MB, 12, False, True),   # half of the nominal 24 GB is a slice
    (RTX4090_MB, 13, True, True),
    (H100_MB, 80, True, True),       # 81559 MiB is sold as 80 GB
    (H100_MB, 40, False, True),
    (LAPTOP_MB, 8, True, True),
    (LAPTOP_MB, 4, False, True),
    (L4_MB, 23, True, True),         # 23034 MiB rounds up to 23 GB, not to 24
    (L4_MB, 24, True, False),
    (A100_MB, 80, True, True),
    (A100_MB, 81, True, False),
])
def test_nominal_sizes(total, request_gb, takes_whole, fits_empty):
    mem = request_gb * GB
    assert whole(total, mem) is takes_whole
    assert (fit(total, 0, 0, 0, False, mem) is not None) is fits_empty
    assert nominal_mb(total) - total < GB
    got = run([card("n", 0, total)], [job(1, mem=mem)])[1]
    assert isinstance(got, Start) is fits_empty
    if fits_empty:
        (p,) = got.placements
        assert p.exclusive is takes_whole and p.memory_mb == (total if takes_whole else max(mem, 4 * GB))


def test_a_whole_card_request_fits_what_others_leave_of_its_nominal_size():
    # 24 GB nominal less 1 GB held by someone's process: 23 GB fits, 24 GB no longer does
    busy = card("n", 0, unmanaged=GB, owners=[(77, "carl", GB)])
    assert isinstance(run([busy], [job(1, mem=23 * GB)])[1], Start)
    got = run([busy], [job(1, mem=24 * GB)])[1]
    assert got == Wait(1, "needs a GPU with ≥24 GB free; none is free now: n:0 with 23 GB free "
                          "(pid 77 of carl holds 1 GB)")


# ------------------------------------------------------------------ the memory guard
def test_memory_a_job_holds_beyond_its_reservation_is_not_offered():
    # The case: job 9 reserved 4 GB and really holds 20 GB of a 24 GB card.
    over = card("n", 0, placements=[held(9, "n", 0, 4 * GB)], overuse=[(9, 16 * GB)])
    got = run([over], [job(1, mem=8 * GB)])
    assert got[1] == Wait(1, "needs a GPU with ≥8 GB free; none is free now: n:0 with 4.0 GB free "
                             "(job 9 reserves 4 GB, job 9 holds 16 GB more than it reserved)")
    # It goes to a card that can really hold it instead.
    got = run([over, card("n", 1)], [job(1, mem=8 * GB)])
    assert on(got[1]) == [("n", 1)]


def test_reasons_name_unmanaged_owners_and_the_most_a_card_shares():
    full = card("n", 0, A100_MB, placements=[held(i, "n", 0, 4 * GB) for i in (5, 6, 7, 8)])
    taken = card("n", 1, placements=[held(3, "n", 1, RTX4090_MB, True)])
    hogged = card("n", 2, unmanaged=22 * GB, owners=[(4242, "alice", 22 * GB)])
    got = run([full, taken, hogged], [job(1, mem=4 * GB)])
    assert got[1] == Wait(1, "needs a GPU with ≥4 GB free; none is free now: n:2 with 2.0 GB free "
                             "(pid 4242 of alice holds 22 GB); n:0 at 4 jobs, the most a card shares; …")
    got = run([taken], [job(1, mem=4 * GB)])
    assert got[1].reason.endswith("none is free now: n:1 whole to job 3")


def test_reasons_name_a_service_spare():
    service = held(7, "n", 0, 8 * GB)
    gpus = [card("n", 0, placements=[service, held(8, "n", 0, 10 * GB)])]
    running = (RunningJob(7, "svc", (service[1],), NOW - 60, service=True),)
    got = run(gpus, [job(1, mem=4 * GB)], running=running)
    assert got[1] == Wait(1, "needs a GPU with ≥4 GB free; none is free now: n:0 with 6.0 GB free, "
                             "2 GB of it kept spare beside the service of job 7; n:0 reserved for "
                             "it, estimated start in ~24 h (job 7 has no --time: end estimated from "
                             "the default)")


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2**32))
def test_the_guard_never_over_promises(seed):
    """After a pass, no card's reservations plus what others hold plus what our jobs hold
    beyond their reservations exceed its memory, whatever over-use the probes reported."""
    rnd = random.Random(seed)
    gpus, next_id = [], 100
    for i in range(rnd.randint(1, 6)):
        total = rnd.choice([RTX4090_MB, H100_MB, LAPTOP_MB, 40 * GB])
        placements, overuse, used = [], [], 0
        for _ in range(rnd.randint(0, 3)):
            mb = rnd.choice([4 * GB, 6 * GB])
            if used + mb <= total // 2:
                placements.append(held(next_id, "n", i, mb))
                if rnd.random() < 0.5:
                    overuse.append((next_id, rnd.randint(1, total // 3)))
                used += mb
                next_id += 1
        unmanaged = rnd.choice([0, 0, 1000, 5000])
        gpus.append(card("n", i, total, placements=placements, overuse=overuse, unmanaged=unmanaged))
    queue = [job(j, mem=rnd.choice([None, 4 * GB, 6 * GB, 10 * GB, 20 * GB])) for j in range(1, 12)]
    decisions = run(gpus, queue)
    for view in gpus:
        total = view.reading.memory_total_mb
        new = [p for d in decisions.values() if isinstance(d, Start) for p in d.placements
               if p.gpu_uuid == view.uuid]
        if not new:
            continue
        over = sum(mb for _, mb in view.overuse)
        promised = sum(p.memory_mb for _, p in view.placements) + sum(p.memory_mb for p in new)
        assert promised + view.unmanaged_used_mb + over <= total


# ------------------------------------------------------------------ placement (R10)
def test_cool_and_lightly_loaded_first_even_for_a_slice_that_could_share():
    hot = card("n", 0, util=100.0, temp=77.0, placements=[held(9, "n", 0, 6 * GB)])
    got = run([hot, card("n", 1)], [job(i, mem=6 * GB) for i in (1, 2, 3)])
    assert all(on(got[i]) == [("n", 1)] for i in (1, 2, 3))


def test_packing_keeps_the_card_a_waiting_whole_card_job_needs():
    hot = card("n", 0, util=100.0, temp=77.0, placements=[held(9, "n", 0, 6 * GB)])
    got = run([hot, card("n", 1)], [job(1, mem=6 * GB), job(2, count=1)])
    assert on(got[1]) == [("n", 0)] and on(got[2]) == [("n", 1)]


# ------------------------------------------------------------------ reasons (R5)
def test_reservation_reason_gives_an_estimated_start_that_reads_well():
    blocker = held(50, "n", 0, RTX4090_MB, True)
    gpus = [card("n", 0, placements=[blocker])]
    running = (RunningJob(50, "x", (blocker[1],), NOW - 3570, time_limit_s=3600),)
    got = run(gpus, [job(1), job(2)], running=running)
    assert got[1] == Wait(1, "needs a whole GPU; none is free now: n:0 held by job 50; n:0 reserved "
                             "for it, estimated start in under a minute")
    # job 2 has no --time, so it may not use the card; but it could not start anyway
    assert got[2] == Wait(2, "needs a whole GPU; none is free now: n:0 held by job 50")
    got = run(gpus + [card("n", 1)], [job(1, count=2), job(2), job(3, time_limit_s=10.0)], running=running)
    assert got[2] == Wait(2, "held for job 1 (n:0-1 reserved for it; estimated start in under a minute)")
    assert isinstance(got[3], Start)  # ends before the reservation starts


def test_failure_chains_say_once_that_the_job_will_not_run():
    got = run([card("n", 0)], [job(1, after=(2,)), job(2, after=(3,)), job(3, arch="bogus")])
    assert got[1].reason.count("this job will not run") == 1
    assert got[1] == Fail(1, "job 2 (--after) cannot run: job 3 (--after) cannot run: --arch 'bogus' "
                             "is not an architecture like sm_89, '>=sm_80' or gfx90a; this job will not run")


# ------------------------------------------------------------------ --after kinds (R25)
AFTER_KINDS = [
    # (kind, the dependency: finished state or "running"/"pending", ran?, decision)
    ("ok", "succeeded", True, "start"),
    ("ok", "failed", True, "fail:job 5 (--after) failed; this job will not run"),
    ("ok", "timeout", True, "fail:job 5 (--after) ran out of time; this job will not run"),
    ("ok", "running", True, "wait:waits for job 5 (--after) to finish"),
    ("any", "failed", True, "start"),
    ("any", "cancelled", False, "start"),
    ("any", "running", True, "wait:waits for job 5 (--after any) to end"),
    ("any", "pending", False, "wait:waits for job 5 (--after any) to end"),
    ("notok", "failed", True, "start"),
    ("notok", "cancelled", False, "start"),
    ("notok", "succeeded", True, "fail:job 5 (--after notok) succeeded; this job will not run"),
    ("notok", "running", True, "wait:waits for job 5 (--after notok) to end"),
    ("started", "running", True, "start"),
    ("started", "succeeded", True, "start"),
    ("started", "failed", True, "start"),
    ("started", "cancelled", False,
     "fail:job 5 (--after started) was cancelled without starting; this job will not run"),
    ("started", "pending", False, "wait:waits for job 5 (--after started) to start"),
]


@pytest.mark.parametrize(("kind", "dep", "ran", "expected"), AFTER_KINDS)
def test_after_kinds(kind, dep, ran, expected):
    gpus = [card("n", 0), card("n", 1)]
    finished, running, queue = {}, (), [job(1, after=(5,), after_type=kind)]
    if dep == "running":
        running = (RunningJob(5, "u", (), NOW),)
    elif dep == "pending":
        queue.append(job(5, arch="sm_75"))  # can never start here: it stays pending
    else:
        finished = {5: dep}
    got = run(gpus, queue, finished=finished, running=running,
              never_ran=frozenset() if ran else frozenset({5}))[1]
    verdict, _, reason = expected.partition(":")
    if verdict == "start":
        assert isinstance(got, Start)
    else:
        assert got == (Fail if verdict == "fail" else Wait)(1, reason)


def test_a_job_failing_for_good_fails_ok_and_started_dependents_but_not_any():
    queue = [job(1, after=(3,)), job(2, after=(3,), after_type="any"), job(3, arch="bogus")]
    got = run([card("n", 0)], queue)
    assert isinstance(got[1], Fail) and got[2] == Wait(2, "waits for job 3 (--after any) to end")


# ------------------------------------------------------------------ arrays
def test_array_throttle_counts_running_tasks_and_those_this_pass_starts():
    gpus = [card("n", i) for i in range(8)]
    running = (RunningJob(90, "u", (), NOW, array_id=90),)
    queue = [job(i, mem=4 * GB, array_id=90, array_limit=3) for i in range(91, 97)]
    got = run(gpus, queue, running=running)
    assert sum(isinstance(d, Start) for d in got.values()) == 2
    assert got[96] == Wait(96, "array 90 runs at most 3 tasks at once (%3); waits for one of them to end")


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 6), st.integers(0, 5), st.integers(1, 30), st.integers(1, 12))
def test_an_array_never_runs_more_than_its_limit(limit, running_now, tasks, cards):
    running = tuple(RunningJob(1000 + i, "u", (), NOW, array_id=7) for i in range(running_now))
    queue = [job(i, mem=4 * GB, array_id=7, array_limit=limit) for i in range(1, tasks + 1)]
    queue += [job(100 + i, mem=4 * GB) for i in range(3)]  # others are not throttled by it
    got = run([card("n", i, H100_MB) for i in range(cards)], queue, running=running)
    started = [d.job_id for d in got.values() if isinstance(d, Start)]
    array_started = sum(1 for j in started if j < 100)
    assert running_now + array_started <= max(limit, running_now)
    assert array_started == min(max(0, limit - running_now), tasks, 4 * cards)


# ------------------------------------------------------------------ power budget (R27)
def test_power_budget_caps_a_node_and_headroom_is_preferred():
    # node a: 1000 W budget, three 450 W cards idle at 20 W each (60 W counted): one start
    # adds 430 W, a second one 430 W more (920 W); the third would pass the budget.
    a = [card("a", i, limit=450.0, draw=20.0) for i in range(3)]
    got = run(a, [job(1), job(2), job(3)], power_budgets={"a": 1000.0})
    assert [isinstance(got[i], Start) for i in (1, 2, 3)] == [True, True, False]
    assert got[3] == Wait(3, "needs a whole GPU; none is free now: behind jobs 1, 2 in fair-share "
                             "order, which took a:0-1; a:2 needing 450 W with 80 W of a's 1000 W "
                             "power budget left; a:0 reserved for it, estimated start in ~24 h "
                             "(job 1 has no --time: end estimated from the default)")
    # With a second node of the same cards, the start goes where it leaves more headroom.
    b = [card("b", i, limit=450.0, draw=20.0) for i in range(3)]
    got = run(a + b, [job(1), job(2)], power_budgets={"a": 1000.0, "b": 2000.0})
    assert on(got[1]) == [("b", 0)] and on(got[2]) == [("b", 1)]


def test_a_slice_on_a_card_already_busy_adds_no_power():
    busy = card("a", 0, H100_MB, limit=700.0, draw=650.0, placements=[held(9, "a", 0, 8 * GB)])
    got = run([busy, card("a", 1, H100_MB, limit=700.0, draw=60.0)], [job(1, mem=8 * GB)],
              power_budgets={"a": 800.0})
    assert on(got[1]) == [("a", 0)]  # the idle card would add 640 W: past the budget


@settings(max_examples=120, deadline=None)
@given(st.integers(0, 2**32))
def test_power_is_never_pushed_past_a_budget(seed):
    rnd = random.Random(seed)
    gpus, budgets = [], {}
    for n in range(rnd.randint(1, 3)):
        node = f"n{n}"
        budgets[node] = rnd.choice([500.0, 1000.0, 2000.0])
        for i in range(rnd.randint(1, 6)):
            placements = [held(500 + n * 10 + i, node, i, 8 * GB)] if rnd.random() < 0.3 else []
            gpus.append(card(node, i, H100_MB, limit=rnd.choice([300.0, 450.0, 700.0]),
                             draw=rnd.choice([20.0, 60.0, 300.0]), placements=placements))
    queue = [job(j, count=rnd.choice([1, 1, 2, 3]), mem=rnd.choice([None, 8 * GB])) for j in range(1, 15)]
    got = run(gpus, queue, power_budgets=budgets)
    for node, budget in budgets.items():
        before = after = 0.0
        for view in (g for g in gpus if g.node == node):
            busy_before = bool(view.placements)
            busy_after = busy_before or any(p.gpu_uuid == view.uuid for d in got.values()
                                            if isinstance(d, Start) for p in d.placements)
            limit, draw = view.reading.power_limit_w, view.reading.power_w
            before += limit if busy_before else draw
            after += limit if busy_after else draw
        assert after <= max(budget, before)


# ------------------------------------------------------------------ backfill windows (R25)
@pytest.mark.parametrize(("limit_s", "backfills"), [
    (None, False),       # no --time: it might never end
    (600.0, True),       # ends well before the reservation starts in ~30 min
    (1800.0, True),      # ends exactly when it starts
    (1801.0, False),     # a second past it
    (7200.0, False),
])
def test_backfill_window(limit_s, backfills):
    blockers = [held(50, "n", i, RTX4090_MB, True) for i in range(2)]
    gpus = [card("n", i, placements=[blockers[i]]) for i in range(2)] + [card("n", 2)]
    running = (RunningJob(50, "x", tuple(p for _, p in blockers), NOW - 1800, time_limit_s=3600),)
    got = run(gpus, [job(1, count=3), job(2, time_limit_s=limit_s)], running=running)
    assert "n:0-2 reserved for it, estimated start in ~30 min" in got[1].reason
    assert isinstance(got[2], Start) is backfills


# ------------------------------------------------------------------ refusal at submit
LAB = [card("node01", 0), card("node01", 1), card("node02", 0, LAPTOP_MB, cap="8.9"),
       card("node03", 0, A100_MB, cap="8.0", blocked="node node03 is drained"),
       card("node03", 1, A100_MB, cap="8.0", blocked="node node03 is unknown")]


@pytest.mark.parametrize(("ask", "refusal"), [
    (dict(mem=8 * 1024 * GB), "this job could never start here: needs a GPU with ≥8192 GB free; "
                              "the largest card here has 80 GB"),
    (dict(count=64), "this job could never start here: needs 64 whole GPUs on one node; the "
                     "largest node has 2 such GPUs"),
    (dict(count=64, max_nodes=3), "this job could never start here: needs 64 whole GPUs on at most "
                                  "3 nodes; 3 nodes have at most 5 such GPUs together"),
    (dict(arch="sm_120"), "this job could never start here: needs a whole GPU (sm_120); no GPU with "
                          "sm_120 in the cluster (here: sm_80, sm_89)"),
    (dict(count=3), "this job could never start here: needs 3 whole GPUs on one node; the largest "
                    "node has 2 such GPUs (--nodes lets a job span nodes)"),
    (dict(mem=70 * GB), None),  # only the drained node's A100s hold it: it may wait for them
    (dict(count=2, mem=40 * GB), None),
    (dict(arch="sm_80"), None),
    (dict(cuda="13.0"), "this job could never start here: needs CUDA ≥13.0; drivers here support up "
                        "to 12.4"),
    (dict(arch="ampere"), "--arch 'ampere' is not an architecture like sm_89, '>=sm_80' or gfx90a"),
])
def test_refusal_at_submit(ask, refusal):
    mem = ask.pop("mem", None)
    count = ask.pop("count", 1)
    assert admission.refusal(job(1, count, mem, **ask), LAB) == refusal


def test_nothing_is_refused_for_hardware_while_a_node_never_reported():
    assert admission.refusal(job(1, mem=8 * 1024 * GB), LAB, partial=True) is None
    assert admission.refusal(job(1, mem=8 * 1024 * GB), []) is None


@pytest.mark.parametrize(("asked", "default", "maximum", "expected"), [
    (None, None, None, (None, None)),
    (600.0, None, None, (600.0, None)),
    (None, 3600.0, None, (3600.0, None)),
    (None, None, 86400.0, (86400.0, None)),
    (7200.0, 3600.0, 86400.0, (7200.0, None)),
    (3 * 86400.0, None, 2 * 86400.0,
     (None, "--time 3d is longer than this cluster allows (max_time 2d); ask for at most that")),
])
def test_time_limits_default_and_maximum(asked, default, maximum, expected):
    assert admission.time_limit(asked, default, maximum) == expected


# ------------------------------------------------------------------ fair share and quota
@pytest.mark.parametrize(("hours", "text"), [
    (0, "0"), (0.004, "0.004"), (0.01, "0.01"), (0.0104, "0.0104"), (0.25, "0.25"), (12.345, "12.3"),
    (1999.9, "1999.9"), (2012.5, "2012.5"), (2000.0, "2000"),
])
def test_hours_are_shown_with_enough_precision_to_be_true(hours, text):
    assert fairshare.hours_text(hours) == text


def test_a_tiny_quota_reads_truly():
    assert fairshare.quota_refusal("ann", 0.0104, 0.01, []).startswith(
        "ann has used 0.0104 of 0.01 GPU-hours this month")


def test_queue_order_is_kept_for_arrays_and_after_kinds():
    # the queue's own order does not depend on the new fields: arrays are jobs like others
    queue = [job(i, mem=4 * GB, array_id=1 if i % 2 else None, array_limit=2) for i in range(1, 9)]
    shuffled = list(queue)
    random.Random(3).shuffle(shuffled)
    gpus = [card("n", 0, H100_MB)]
    assert Counter(type(d) for d in run(gpus, queue).values()) == Counter(
        type(d) for d in run(gpus, shuffled).values())
    assert run(gpus, queue) == run(gpus, [replace(j) for j in shuffled])


# ------------------------------------------------------------------ properties of the rules above
@settings(max_examples=300, deadline=None)
@given(st.integers(8000, 200 * GB), st.integers(1, 256 * GB))
def test_nominal_sizes_hold_for_every_card_and_request(total, mem):
    """A card is sold as its memory rounded up to a whole GB; a request over half of that
    takes it whole, and fits an empty card exactly when it is at most that size."""
    nominal = nominal_mb(total)
    assert nominal % GB == 0 and 0 <= nominal - total < GB
    assert whole(total, mem) is (2 * mem > nominal)
    got = run([card("n", 0, total)], [job(1, mem=mem)])[1]
    assert isinstance(got, Start) is (mem <= nominal), got
    if isinstance(got, Start):
        (p,) = got.placements
        assert p.exclusive is whole(total, mem)
        assert p.memory_mb == (total if p.exclusive else max(mem, 4 * GB))


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2**32))
def test_a_job_backfilled_onto_reserved_cards_always_ends_before_the_reservation(seed):
    """R25's window: the first job waits for every card of node n, held by jobs whose
    --time ends at known moments; any later job the pass puts on n's cards has a --time
    that ends by the moment the last of those ends (else it could delay the first job for
    ever). Node m's cards are nobody's reservation."""
    rnd = random.Random(seed)
    count = rnd.randint(2, 6)
    busy = rnd.sample(range(count), rnd.randint(1, count - 1))
    gpus, running, ends = [], [], []
    for i in range(count):
        placements = []
        if i in busy:
            job_id, limit = 100 + i, rnd.choice([600.0, 1800.0, 3600.0, 7200.0])
            started = NOW - rnd.uniform(0, limit - 60)
            placements = [held(job_id, "n", i, RTX4090_MB, True)]
            running.append(RunningJob(job_id, "x", (placements[0][1],), started, time_limit_s=limit))
            ends.append(started + limit)
        gpus.append(card("n", i, placements=placements))
    gpus += [card("m", i) for i in range(rnd.randint(0, count - 1))]  # too few for job 1
    queue = [job(1, count=count)] + [
        job(j, count=rnd.choice([1, 1, 2]), mem=rnd.choice([None, 4 * GB, 8 * GB]),
            time_limit_s=rnd.choice([None, 60.0, 300.0, 1200.0, 3000.0, 7200.0, 86400.0]))
        for j in range(2, rnd.randint(3, 12))]
    got = run(gpus, queue, running=tuple(running))
    assert not isinstance(got[1], Start)  # some of its cards are busy
    reservation_starts = max(ends)
    by_id = {j.id: j for j in queue}
    for decision in got.values():
        if isinstance(decision, Start) and any(p.node == "n" for p in decision.placements):
            limit = by_id[decision.job_id].time_limit_s
            assert limit is not None and NOW + limit <= reservation_starts + 1, (decision, limit)
