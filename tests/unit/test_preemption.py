"""Preemptible jobs never delay a normal one, and only they are ever preempted.

Snapshot in, decisions out (the pure scheduler); the head's side — SIGUSR1, grace,
SIGKILL, requeue on the simulated lab — is tests/lab/test_preemption_lab.py's.
"""

from __future__ import annotations

import random

import pytest

from hypothesis import given, settings
from hypothesis import strategies as st

from dataclasses import replace

from nebula_tui.model import JobState, Placement, Stopping
from nebula_tui.scheduler import Preempt, RunningJob, SchedulerConfig, Start, UserShare, Wait

from support.scheduling import GB, card, held, job, run
from support.stores import HOUR, SPEC, T0


def holding(job_id: int, node: str, index: int, mb: int = 24564, exclusive: bool = True):
    return (job_id, Placement(f"GPU-{node}-{index}", node, index, mb, exclusive))


def test_a_preemptible_job_runs_on_a_free_card_whatever_its_users_share():
    users = {"heavy": UserShare("heavy", weight=50.0)}
    got = run([card("n", 0), card("n", 1)], [job(1, user="heavy", preemptible=True)], users=users)
    assert isinstance(got[1], Start)


def test_a_normal_job_preempts_the_preemptible_job_on_the_card_it_needs():
    gpus = [card("n", 0, placements=[holding(41, "n", 0)])]
    running = (RunningJob(41, "alice", (holding(41, "n", 0)[1],), 0.0, preemptible=True),)
    got = run(gpus, [job(812, user="bob")], running=running)
    assert isinstance(got[812], Wait)
    assert got[812].reason == "would preempt job 41 (preemptible) — starting now"
    assert isinstance(got[41], Preempt) and got[41].reason == "preempted for job 812 of bob"


def test_free_cards_come_before_a_preemption():
    gpus = [card("n", 0, util=100.0, placements=[holding(41, "n", 0)]), card("n", 1)]
    running = (RunningJob(41, "alice", (holding(41, "n", 0)[1],), 0.0, preemptible=True),)
    got = run(gpus, [job(7)], running=running)
    assert isinstance(got[7], Start) and got[7].placements[0].gpu_index == 1
    assert 41 not in got


def test_a_normal_job_is_never_preempted_not_even_by_an_admins_priority_job():
    gpus = [card("n", 0, placements=[holding(5, "n", 0)])]
    running = (RunningJob(5, "carol", (holding(5, "n", 0)[1],), 0.0),)
    got = run(gpus, [job(9, priority=10)], running=running)
    assert isinstance(got[9], Wait) and not any(isinstance(d, Preempt) for d in got.values())


def test_an_admins_priority_job_preempts_to_start_at_once():
    gpus = [card("n", i, placements=[holding(40 + i, "n", i)]) for i in range(2)]
    running = tuple(RunningJob(40 + i, "alice", (holding(40 + i, "n", i)[1],), 0.0, preemptible=True)
                    for i in range(2))
    got = run(gpus, [job(3, count=2, priority=5), job(2, count=2)], running=running)
    assert got[3].reason == "would preempt jobs 40, 41 (preemptible) — starting now"
    assert isinstance(got[2], Wait) and "would preempt" not in got[2].reason
    assert {d.job_id for d in got.values() if isinstance(d, Preempt)} == {40, 41}


def test_a_preemptible_job_does_not_take_cards_a_normal_job_claimed_in_the_same_pass():
    gpus = [card("n", 0, placements=[holding(41, "n", 0)])]
    running = (RunningJob(41, "alice", (holding(41, "n", 0)[1],), 0.0, preemptible=True),)
    got = run(gpus, [job(2), job(3, preemptible=True)], running=running)
    assert isinstance(got[2], Wait) and isinstance(got[41], Preempt)
    assert isinstance(got[3], Wait)


def test_the_quota_holds_preemptible_jobs_back_only_when_they_count_against_it():
    users = {"u": UserShare("u", refusal="over quota")}
    for in_quota, starts in ((True, False), (False, True)):
        config = SchedulerConfig(preemptible_in_quota=in_quota, quota_mode="refuse")
        got = run([card("n", 0)], [job(1, preemptible=True), job(2)], users=users, config=config)
        assert isinstance(got[1], Start) is starts
        assert got[2].reason == "over quota"


def test_past_the_quota_a_job_runs_on_an_idle_card_as_a_scavenger_and_yields_to_in_quota_work():
    """quota_mode scavenge (the default): no card stays idle for a quota. The over-quota
    user's job starts on the idle card as preemptible work; an in-quota job that needs
    that card preempts it; while it waits, it says why."""
    users = {"u": UserShare("u", refusal="u is past the quota")}
    got = run([card("n", 0)], [job(1)], users=users)
    assert got[1] == Start(1, got[1].placements, scavenger=True)
    gpus = [card("n", 0, placements=[holding(1, "n", 0)])]
    running = (RunningJob(1, "u", (holding(1, "n", 0)[1],), 0.0, preemptible=True),)
    got = run(gpus, [job(2, user="v"), job(3)], users=users, running=running)
    assert got[2].reason == "would preempt job 1 (preemptible) — starting now"
    assert isinstance(got[1], Preempt) and got[1].reason == "preempted for job 2 of v"
    assert got[3].reason.startswith("over quota: runs only on idle cards; ")


def test_an_after_across_the_two_kinds_waits_instead_of_failing():
    got = run([card("n", 0)], [job(1, preemptible=True), job(2, after=(1,))])
    assert isinstance(got[1], Start)
    assert isinstance(got[2], Wait) and "waits for job 1" in got[2].reason


def _random_cluster(rng: random.Random):
    """Cards (some held by normal or preemptible jobs, whole or sliced) and a queue."""
    gpus, running, next_id = [], [], 100
    for n in range(rng.randint(1, 3)):
        for i in range(rng.randint(1, 4)):
            placements = []
            for _ in range(rng.choice([0, 0, 1, 2])):
                whole = rng.random() < 0.5
                mb = 24564 if whole else rng.choice([4, 6, 8]) * GB
                if whole and placements:
                    break
                p = Placement(f"GPU-n{n}-{i}", f"n{n}", i, mb, whole)
                placements.append((next_id, p))
                running.append(RunningJob(next_id, rng.choice("ab"), (p,), 0.0,
                                          rng.choice([None, 600.0, 3600.0]),
                                          preemptible=rng.random() < 0.5))
                next_id += 1
                if whole:
                    break
            gpus.append(card(f"n{n}", i, util=rng.choice([0.0, 50.0, 100.0]), placements=placements))
    queue = [job(j, count=rng.randint(1, 3), mem=rng.choice([None, None, 6 * GB]), user=rng.choice("abc"),
                 priority=rng.choice([0, 0, 0, 5]), preemptible=rng.random() < 0.4,
                 time_limit_s=rng.choice([None, 300.0, 7200.0]), max_nodes=rng.choice([1, 2]))
             for j in range(1, rng.randint(1, 8))]
    return gpus, tuple(running), queue


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**32))
def test_no_normal_job_is_ever_preempted_nor_delayed_by_a_preemptible_one(seed):
    gpus, running, queue = _random_cluster(random.Random(seed))
    got = run(gpus, queue, running=running)
    kinds = {r.id: r.preemptible for r in running}
    for decision in got.values():
        if isinstance(decision, Preempt):
            assert kinds[decision.job_id], f"normal job {decision.job_id} preempted"
            assert decision.for_job in got and not next(j for j in queue if j.id == decision.for_job).preemptible
    # Without any preemptible job, running or waiting, each normal job would get the same
    # cards (a start, or the wait that preempts for exactly them) or the same wait.
    scavengers = {r.id for r in running if r.preemptible}
    alone_gpus = [card(g.node, g.reading.index, util=g.reading.utilization_pct,
                       placements=[p for p in g.placements if p[0] not in scavengers]) for g in gpus]
    alone = run(alone_gpus, [j for j in queue if not j.preemptible],
                running=tuple(r for r in running if not r.preemptible))
    for job_id, decision in alone.items():
        mine = got[job_id]
        if isinstance(decision, Start):
            assert isinstance(mine, Start) or mine.reason.startswith("would preempt"), mine
        else:
            assert type(mine) is type(decision) and mine.reason == decision.reason
    # No card is promised twice: every start fits beside what stays on its card.
    for decision in got.values():
        if isinstance(decision, Start):
            for p in decision.placements:
                others = [q for g in gpus if g.uuid == p.gpu_uuid for _, q in g.placements]
                assert not (p.exclusive and others) and not any(q.exclusive for q in others)


def test_when_no_waiting_request_fits_the_cards_a_pass_only_keeps_jobs_waiting():
    """``NothingFits``, which lets the replay skip a pass, never says so of a pass that would
    start, preempt or fail a job: over random clusters (cards held whole or in slices, by
    normal and preemptible jobs, with and without --time; queues of gangs, slices,
    admins' and preemptible jobs, with and without --time), whenever no waiting job's
    request fits, the pass's every decision is a wait that holds no cards."""
    from nebula_tui.scheduler import NothingFits
    seen = {True: 0, False: 0}
    for seed in range(400):
        rng = random.Random(seed)
        gpus, running, queue = _random_cluster(rng)
        if rng.random() < 0.7:  # a full lab more often: that is where no request fits
            gpus = [g if g.placements else card(g.node, g.reading.index,
                                                placements=[holding(99, g.node, g.reading.index)])
                    for g in gpus]
            running += (RunningJob(99, "c", tuple(p for g in gpus for j, p in g.placements if j == 99), 0.0),)
        fits = NothingFits(tuple(gpus), {}, (), {r.id for r in running if r.preemptible}, SchedulerConfig())
        nothing = not any(fits.fits(j) for j in queue)
        seen[nothing] += 1
        got = run(gpus, queue, running=running)
        if nothing:
            assert all(isinstance(d, Wait) and not d.holds for d in got.values()), (seed, got)
    assert seen[True] > 50 and seen[False] > 50, seen


# ------------------------------------------------------------------ what the store keeps
def test_a_preemptible_run_is_charged_its_fraction_and_its_preemptions_are_counted(store):
    whole = (Placement("GPU-a", "node01", 0, 24564, True),)
    job = store.add_job("alice", replace(SPEC, preemptible=True), T0, charge=0.25)
    store.start_launching(job.id, whole, T0 + 1)
    store.mark_running(job.id, T0 + 1)
    store.record_stop(job.id, JobState.PENDING, "preempted for job 9 of bob", True, T0 + 3, T0 + 1)
    assert store.job(job.id).preemptions == 1
    store.requeue(job.id, "preempted for job 9 of bob", T0 + 1 + 2 * HOUR)
    store.start_launching(job.id, whole, T0 + 3 * HOUR)
    store.mark_running(job.id, T0 + 3 * HOUR)
    store.finish_job(job.id, JobState.SUCCEEDED, T0 + 4 * HOUR, exit_code=0)
    assert store.job(job.id).preemptions == 1
    # 2 h + 1 h of one whole card, at a quarter
    assert store.usage_since(T0 - 1)["alice"] == pytest.approx(0.75)
    assert store.usage_since(T0 - 1, preemptible=False).get("alice", 0.0) == 0.0
    events = [e["message"] for e in store.events(kind="preempt")]
    assert events == [f"job {job.id} preempted for job 9 of bob"]


def test_the_settings_of_preemptible_jobs():
    from nebula_tui.config.settings import SettingError, scheduler_settings

    config = scheduler_settings({"preemptible_charge": 0.5, "preemptible_in_quota": False}).config
    assert (config.preemptible_charge, config.preemptible_in_quota) == (0.5, False)
    assert scheduler_settings({}).config.preemptible_charge == 0.25
    for bad, words in (({"preemptible_charge": 2}, "a fraction from 0 to 1"),
                       ({"preemptible_charge": -1}, "must be a number"),
                       ({"preemptible_in_quota": "no"}, "must be true or false")):
        with pytest.raises(SettingError, match=words):
            scheduler_settings(bad)


# ------------------------------------------------------------------ the head's pass (in process)
async def test_a_cluster_full_of_preemptible_jobs_still_runs_a_pass_for_a_normal_one(tmp_path):
    import getpass

    from support.inprocess import up_engine
    from nebula_tui.model import JobSpec

    head = up_engine(tmp_path)  # two nodes of two A100s
    me = getpass.getuser()
    try:
        spares = [head.submit(me, JobSpec(command=("sleep", "600"), gpu_count=2, preemptible=True))
                  for _ in range(2)]
        head.scheduling.schedule_pass()
        assert all(head.jobs[j.id].state.holds_gpus for j in spares)
        # Every card is held, by preemptible jobs only: a submit's pass is not skipped.
        head.state.capacity_changed = False
        assert not head.scheduling.pass_is_pointless()
        urgent = head.submit(me, JobSpec(command=("sleep", "600"), gpu_count=1))
        head.scheduling.schedule_pass()
        assert head.jobs[urgent.id].reason == (f"would preempt job {spares[0].id} (preemptible) — "
                                               "starting now")
        stopping = [j.id for j in spares if isinstance(head.jobs[j.id].status, Stopping)]
        assert stopping == [spares[0].id] and head.jobs[spares[0].id].preemptions == 1
    finally:
        await head.stop()
        head.state.store.close()


# ------------------------------------------------------------------ cards held for the preemptor
def _held_card(job_id: int, node: str, index: int):
    return holding(job_id, node, index)[1]


def test_cards_preempted_for_a_job_stay_its_own_through_the_grace():
    """Job 2 (a heavy user's) preempted job 41; during 41's grace job 3 of a lighter user
    comes first in the queue's order, yet the card stays job 2's; once 41 left it and was
    requeued, job 2 starts there, not 3 and not 41."""
    users = {"heavy": UserShare("heavy", weight=9.0), "light": UserShare("light", weight=1.0)}
    hold = {2: (_held_card(41, "n", 0),)}
    gpus = [card("n", 0, placements=[holding(41, "n", 0)])]
    running = (RunningJob(41, "spare", (holding(41, "n", 0)[1],), 0.0, preemptible=True),)
    queue = [job(2, user="heavy"), job(3, user="light")]
    got = run(gpus, queue, running=running, users=users, holds=hold)
    assert got[2].reason == "would preempt job 41 (preemptible) — starting now"
    assert got[2].holds == hold[2] and isinstance(got[41], Preempt) and got[41].for_job == 2
    assert isinstance(got[3], Wait) and "would preempt" not in got[3].reason and not got[3].holds
    # 41 left the card and waits again, preemptible
    got = run([card("n", 0)], queue + [job(41, user="spare", preemptible=True)], users=users, holds=hold)
    assert isinstance(got[2], Start) and got[2].placements[0].gpu_uuid == "GPU-n-0"
    assert isinstance(got[3], Wait) and isinstance(got[41], Wait)
    # without the hold the lighter user's job would have taken it: what the hold is for
    assert isinstance(run([card("n", 0)], queue, users=users)[3], Start)


def test_a_held_job_neither_moves_to_other_preemptible_cards_nor_waits_when_cards_come_free():
    users = {"heavy": UserShare("heavy", weight=9.0)}
    hold = {2: (_held_card(41, "n", 0),)}
    # its hold is on n:0 (41 stopping there); n:1 holds 42, cooler now: 2 stays on n:0
    gpus = [card("n", 0, util=100.0, placements=[holding(41, "n", 0)]),
            card("n", 1, placements=[holding(42, "n", 1)])]
    running = tuple(RunningJob(i, "spare", (holding(i, "n", i - 41)[1],), 0.0, preemptible=True)
                    for i in (41, 42))
    got = run(gpus, [job(2, user="heavy")], running=running, users=users, holds=hold)
    assert {d.job_id for d in got.values() if isinstance(d, Preempt)} == {41}
    assert got[2].holds[0].gpu_uuid == "GPU-n-0"
    # a card came free meanwhile: it starts there now rather than wait for 41's grace
    got = run(gpus + [card("n", 2)], [job(2, user="heavy")], running=running, users=users, holds=hold)
    assert isinstance(got[2], Start) and got[2].placements[0].gpu_uuid == "GPU-n-2"
    # its held card left service: it is placed as any other job (it preempts 42)
    gone = [card("n", 0, blocked="drained", placements=[holding(41, "n", 0)]), gpus[1]]
    got = run(gone, [job(2, user="heavy")], running=running, users=users, holds=hold)
    assert got[2].reason == "would preempt job 42 (preemptible) — starting now"


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**32))
def test_held_cards_stay_their_preemptors_whoever_comes_first_later(seed):
    """Random clusters: a pass preempts for some normal jobs (their ``Wait.holds``); then
    some victims leave their cards and wait again, and jobs of a lighter user and an
    admin's come first in the order. The next pass starts every preemptor, or keeps it
    waiting on cards still held for it; no card is promised past its size, nor an
    exclusive one twice."""
    rng = random.Random(seed)
    gpus, running, queue = _random_cluster(rng)
    first = run(gpus, queue, running=running)
    holds = {d.job_id: d.holds for d in first.values() if isinstance(d, Wait) and d.holds}
    victims = {d.job_id for d in first.values() if isinstance(d, Preempt)}
    gone = {v for v in victims if rng.random() < 0.5}
    gpus = [replace(g, placements=tuple(p for p in g.placements if p[0] not in gone)) for g in gpus]
    back = [job(v, count=len(r.placements), user="a", preemptible=True)
            for r in running if r.id in gone for v in (r.id,)]
    running = tuple(r for r in running if r.id not in gone)
    later = [job(50, count=rng.randint(1, 2), user="z"), job(51, count=1, user="z", priority=9)]
    users = {"z": UserShare("z", weight=0.01)}
    got = run(gpus, queue + back + later, running=running, users=users, holds=holds)
    for job_id in holds:
        decision = got[job_id]
        assert isinstance(decision, Start) or (isinstance(decision, Wait) and decision.holds), decision
    yielding = {d.job_id for d in got.values() if isinstance(d, Preempt)}
    total = {g.uuid: g.reading.memory_total_mb for g in gpus}
    on_card = {g.uuid: [p for _, p in g.placements] for g in gpus}
    for decision in got.values():
        for p in decision.placements if isinstance(decision, Start) else getattr(decision, "holds", ()):
            if not any(r.id == decision.job_id for r in running):
                on_card[p.gpu_uuid].append(p)
    for uuid, cards in on_card.items():
        mine = [p for p in cards if not any(q[1] is p and q[0] in yielding for g in gpus for q in g.placements)]
        if any(p.exclusive for p in mine):
            assert len(mine) == 1, (uuid, mine)
        assert sum(p.memory_mb for p in mine) <= total[uuid], (uuid, mine)


async def test_the_head_keeps_the_preempted_cards_for_the_preemptor_until_it_starts(tmp_path):
    """In the head: a heavy user's job preempts; a lighter user's job submitted during the
    grace comes first in the queue's order but never gets those cards; once the victim was
    killed and requeued, the preemptor starts on them."""
    import asyncio

    from support.inprocess import up_engine
    from nebula_tui.model import JobSpec
    from nebula_tui.store import Store

    seeded = Store(tmp_path / "state.db")  # "heavy" ran 40 GPU-hours yesterday
    old = seeded.add_job("heavy", replace(SPEC, gpu_count=4), T0)
    seeded.start_launching(old.id, tuple(Placement(f"GPU-x-{i}", "x", i, 81920, True) for i in range(4)), T0)
    seeded.mark_running(old.id, T0)
    seeded.finish_job(old.id, JobState.SUCCEEDED, T0 + 10 * HOUR, exit_code=0)
    seeded.close()
    head = up_engine(tmp_path, "health:\n  isolation_grace: 0.5s\n", clock=lambda: T0 + 12 * HOUR)
    sleep = ("sleep", "600")
    try:
        await asyncio.sleep(0.2)  # the nodes' first reconcile (they run nothing yet) is over
        other = head.submit("other", JobSpec(command=sleep, gpu_count=2))
        spare = head.submit("spare", JobSpec(command=sleep, gpu_count=2, preemptible=True))
        head.scheduling.schedule_pass()
        victim_cards = {p.gpu_uuid for p in head.jobs[spare.id].placements}
        assert head.jobs[other.id].state.holds_gpus and len(victim_cards) == 2
        heavy = head.submit("heavy", JobSpec(command=sleep, gpu_count=2))
        head.scheduling.schedule_pass()
        assert head.jobs[heavy.id].reason.startswith(f"would preempt job {spare.id} ")
        light = head.submit("light", JobSpec(command=sleep, gpu_count=2))
        shares = head.shares.shares()  # a user with no share yet weighs the least: light comes first
        assert "light" not in shares and shares["heavy"].weight > 1.0
        head.scheduling.schedule_pass()
        assert head.jobs[heavy.id].reason.startswith(f"would preempt job {spare.id} ")
        assert "would preempt" not in head.jobs[light.id].reason
        for _ in range(100):  # its grace (0.5 s), the kill, the requeue
            if head.jobs[spare.id].state == JobState.PENDING:
                break
            await asyncio.sleep(0.1)
        assert head.jobs[spare.id].state == JobState.PENDING
        head.scheduling.schedule_pass()
        assert {p.gpu_uuid for p in head.jobs[heavy.id].placements} == victim_cards
        assert head.jobs[light.id].state == head.jobs[spare.id].state == JobState.PENDING
        assert not head.scheduling.holds
    finally:
        await head.stop()
        head.state.store.close()


def test_a_held_job_that_fits_beside_another_preemptible_job_starts_without_preempting_it():
    """Job 10's hold is on n:0, free now. Slices pack onto shared cards (a whole-card job
    waits), and n:1 also holds a preemptible job with room beside it: job 10 starts, and
    nothing is preempted for it. It used to preempt that job too, whose requeued copy then
    took the held card, and so on at the same instant: the built-in month's replay never
    got past its day 24."""
    users = {"heavy": UserShare("heavy", weight=9.0)}
    hold = {10: (Placement("GPU-n-0", "n", 0, 8 * GB, False),)}
    slices = [held(1, "n", 0, 16 * GB), held(2, "n", 1, 8 * GB), held(3, "n", 1, 8 * GB)]
    gpus = [card("n", 0, 64 * GB, util=100.0, placements=slices[:1]),
            card("n", 1, 64 * GB, placements=slices[1:])]
    running = (RunningJob(1, "a", (slices[0][1],), 0.0), RunningJob(2, "a", (slices[1][1],), 0.0),
               RunningJob(3, "spare", (slices[2][1],), 0.0, preemptible=True))
    queue = [job(10, mem=8 * GB, user="heavy"), job(11, user="b")]
    got = run(gpus, queue, running=running, users=users, holds=hold)
    assert isinstance(got[10], Start), got[10]
    assert not [d for d in got.values() if isinstance(d, Preempt)]
