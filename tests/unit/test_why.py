"""`nebula why` (head/why.py) for each kind of wait, on an in-process head (two nodes of
two A100-80GB each): the rule named, the forecast, the fair share, and the change that
starts the job sooner, tried on the forecast."""

from __future__ import annotations

import asyncio

from nebula_tui import forecasts
from nebula_tui.model import JobSpec, JobState


GB = 1024


def submit(head, user: str = "bob", **spec):
    return head.submit(user, JobSpec(command=("true",), **spec))


async def settle(head):
    head.scheduling.schedule_pass()
    await asyncio.sleep(0)
    head.scheduling.schedule_pass()  # the waiting jobs' reasons, with the starts applied
    await asyncio.sleep(0)


async def why(head, job) -> dict:
    answer = await head.why.job(head.jobs.get(job.id) or head.store.job(job.id))
    text = forecasts.why_text(answer)  # every answer renders
    assert f"Job {job.id} " in text
    return answer


async def test_fit_a_whole_card_waits_and_a_slice_would_start_now(engine):  # noqa: F811
    for _ in range(8):  # two 30 GB slices on every card: 20 GB free on each
        submit(engine, gpu_mem_mb=30 * GB, time_limit_s=7200.0)
    waiting = submit(engine, "ann", time_limit_s=3600.0)
    await settle(engine)
    answer = await why(engine, waiting)
    assert answer["rule"] == "fit" and answer["queue_pos"] == 1
    assert answer["starts"]["start_at"] > engine.clock()
    assert len(answer["holding"]) >= 1 and all(r["user"] == "bob" for r in answer["holding"])
    first = answer["sooner"][0]
    assert first["change"] == "--gpu-mem 16G" and first["starts"]["start_at"] <= engine.clock() + 60
    assert "with --gpu-mem 16G it would start now on node0" in forecasts.why_text(answer)


async def test_fair_share_the_job_ahead_takes_the_first_card_that_frees(engine):  # noqa: F811
    for limit in (1800.0, 3600.0, 7200.0, 7200.0):
        submit(engine, time_limit_s=limit)
    first = submit(engine, "carol", time_limit_s=3600.0)
    second = submit(engine, "dave", time_limit_s=3600.0)
    await settle(engine)
    answer = await why(engine, second)
    assert answer["rule"] == "fair_share", answer["reason"]
    assert [r["id"] for r in answer["ahead"]] == [first.id] and answer["queue_pos"] == 2
    assert answer["first_in_queue"]["start_at"] < answer["starts"]["start_at"]
    assert answer["share"]["user"] == "dave" and answer["share"]["weight"] >= 1.0


async def test_quota_a_user_over_quota_waits(engine):  # noqa: F811
    running = submit(engine, "ann", time_limit_s=7200.0)
    for _ in range(3):
        submit(engine, time_limit_s=7200.0)
    await settle(engine)
    engine.transitions.mark_running(engine.jobs[running.id])  # its hours count from now
    waiting = submit(engine, "ann", time_limit_s=3600.0)
    engine.set_quota(engine.owner, "ann", 0.0)
    await settle(engine)
    answer = await why(engine, waiting)
    assert answer["rule"] == "quota"
    assert answer["share"]["quota_gpu_hours"] == 0.0 and answer["share"]["refusal"]


async def test_dependency_waits_for_the_job_it_names(engine):  # noqa: F811
    running = submit(engine, time_limit_s=7200.0)
    after = submit(engine, "ann", after=(running.id,), time_limit_s=600.0)
    await settle(engine)
    answer = await why(engine, after)
    assert answer["rule"] == "dependency", answer["reason"]
    assert answer["starts"]["start_at"] >= engine.clock() + 0.25 * 7200 - 5


async def test_reservation_a_short_job_backfills_a_long_one_waits(engine):  # noqa: F811
    for _ in range(2):
        submit(engine, time_limit_s=7200.0)  # node01's two cards
    gang = submit(engine, "carol", gpu_count=4, nodes=2, time_limit_s=3600.0)  # needs all four
    late = submit(engine, "ann", time_limit_s=4 * 3600.0)
    await settle(engine)
    assert engine.jobs[gang.id].state == JobState.PENDING
    answer = await why(engine, late)
    assert answer["rule"] == "reservation", answer["reason"]
    assert any(c["change"] == "--time 1:00:00" and c["starts"]["start_at"] <= engine.clock() + 60
               for c in answer["sooner"])
    assert [r["id"] for r in answer["ahead"]] == [gang.id]
    halved = (await why(engine, gang))["sooner"]  # node02's two free cards take half of it now
    assert halved[0]["change"] == "--gpu-count 2" and halved[0]["starts"]["start_at"] <= engine.clock() + 60


async def test_blocked_a_drained_node_takes_no_new_work(engine):  # noqa: F811
    for node in ("node01", "node02"):
        engine.set_drained(engine.owner, node, True, "maintenance window")
    waiting = submit(engine, "ann", time_limit_s=600.0)
    await settle(engine)
    answer = await why(engine, waiting)
    assert answer["rule"] == "blocked", answer["reason"]
    assert answer["starts"]["start_at"] is None  # not within the forecast's horizon


async def test_held_running_and_a_user_standing(engine):  # noqa: F811
    running = submit(engine, time_limit_s=600.0)
    held = submit(engine, "ann", time_limit_s=600.0)
    engine.set_held(engine.owner, held.id, True)
    await settle(engine)
    assert (await why(engine, running))["rule"] == "running"
    answer = await why(engine, held)
    assert answer["rule"] == "held" and answer["sooner"] == []
    standing = engine.why.user("bob")
    assert [r["id"] for r in standing["running"]] == [running.id]
    assert "bob's fair share: weight" in forecasts.why_user_text(standing)
