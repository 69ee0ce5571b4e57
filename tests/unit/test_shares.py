"""Fair-share standings kept between reads of the store: a job's end adds its own run, and
the weights come out as a read of the whole window from the store gives them."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from nebula_tui.model import JobSpec, JobState, Placement
from nebula_tui.views import month_start

CARDS = [Placement(f"GPU-{n}-{i}", n, i, 81920, True) for n in ("node01", "node02") for i in range(2)]
USERS = ("alice", "bob", "carol")
ENDS = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT)



def steps(seed: int, count: int) -> list[tuple]:
    """(user, how the job went, how it ended, seconds it ran) for ``count`` jobs."""
    pick = random.Random(seed)
    return [(pick.choice(USERS), pick.choice(("ran", "waited", "requeued")), pick.choice(ENDS),
             pick.uniform(0, 1.5)) for _ in range(count)]


def from_the_store(shares) -> dict:
    """The standings as a first look computes them: everything read from the store."""
    kept = shares._usage
    shares._usage, shares._shares = None, None
    try:
        return shares.shares()
    finally:
        shares._usage, shares._shares = kept, None


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_ends_kept_in_memory_weigh_as_the_stores_window_does(engine, seed) -> None:
    head, clock = engine, [engine.state.clock()]
    began = clock[0]
    engine.state.clock = lambda: clock[0]
    shares = head.shares
    shares.shares()  # read once: the ends below are added to what was read
    for user, how, ends, seconds in steps(seed, 15):
        job = head.submit(user, JobSpec(command=("true",)))
        if how != "waited":
            head.transitions.begin_launch(head.jobs[job.id], (CARDS[job.id % len(CARDS)],))
            head.transitions.mark_running(head.jobs[job.id])
            clock[0] += seconds
            if how == "requeued":
                head.transitions.requeue(head.jobs[job.id], "lost with its node; requeued")
                clock[0] += 1
        head.transitions.finish(head.jobs[job.id], ends, 0, "")
        clock[0] += 1
        kept, read = shares.shares(), from_the_store(shares)
        assert kept.keys() == read.keys()
        for name in read:
            assert kept[name].weight == pytest.approx(read[name].weight, rel=1e-12)
            assert kept[name].refusal == read[name].refusal
        # the month's hours (quotas) too, requeued runs' among them
        month = head.state.store.usage_since(month_start(clock[0]))
        for name in set(month) | set(shares._usage.month):
            assert shares._usage.month.get(name, 0.0) == pytest.approx(month.get(name, 0.0), abs=1e-12)
    assert shares._usage.read_at == began  # every end was added, none read from the store


async def test_a_user_with_no_usage_is_over_a_zero_quota(engine) -> None:
    """A quota of 0 GPU-hours (a user an admin stopped, or ``quota_gpu_hours: 0`` for the
    lab) holds a user who has used nothing yet: the standings were only computed for users
    with usage, so such a user had none and was never over quota."""
    head = engine
    head.state.store.set_quota("dora", 0, "admin", head.state.clock())
    head.shares.forget()
    shares = head.shares.shares()
    assert "dora" in shares and shares["dora"].refusal.startswith("dora has used 0 of 0 GPU-hours this month")
    # a user with neither usage nor a quota of their own is in the standings once a job of
    # theirs waits, and the lab's quota of 0 holds them too
    head.state.settings = replace(head.state.settings, quota_gpu_hours=0.0)
    head.submit("erin", JobSpec(command=("true",)))
    head.shares.forget()
    assert head.shares.shares()["erin"].refusal.startswith("erin has used 0 of 0 GPU-hours")
