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

from test_scheduler_promises import GB, card, job, run
from test_store import HOUR, SPEC, T0, db_path, store  # noqa: F401 (fixtures)


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

    from inprocess import up_engine
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
