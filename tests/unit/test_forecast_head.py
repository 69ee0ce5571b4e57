"""The head's forecast (Scheduling.forecast_if_due, plan's ``starts``) on an in-process head:
four A100s held by jobs with a --time, a fifth job waiting."""

from __future__ import annotations

import asyncio

import pytest

from nebula_tui.head import forecast
from nebula_tui.model import JobSpec, JobState
from support.inprocess import up_engine



async def full_head(head):
    held = [head.submit("bob", JobSpec(command=("true",), time_limit_s=3600.0)) for _ in range(4)]
    waiting = head.submit("ann", JobSpec(command=("true",), time_limit_s=1800.0))
    head.scheduling.schedule_pass()
    await asyncio.sleep(0)
    assert all(head.jobs[j.id].state.holds_gpus for j in held)
    assert head.jobs[waiting.id].state == JobState.PENDING
    return held, waiting


async def forecast_made(head, done) -> None:
    """A forecast started, and waited for (it runs in a thread) until ``done()``."""
    head.scheduling.forecast_if_due()
    for _ in range(200):
        if done():
            return
        await asyncio.sleep(0.02)


async def test_the_queue_carries_each_waiting_jobs_forecast(engine):  # noqa: F811
    held, waiting = await full_head(engine)
    engine.scheduling.forecast_if_due()
    for _ in range(200):  # the forecast runs in a thread
        if engine.state.forecasts:
            break
        await asyncio.sleep(0.02)
    rows = {row["id"]: row for row in engine.queue_json()}
    starts = rows[waiting.id]["starts"]
    began = min(engine.jobs[j.id].started_at or engine.jobs[j.id].submitted_at for j in held)
    assert starts["early"] <= starts["start_at"] <= starts["late"]
    # the held jobs are expected to end at 40% of their hour: the simulated start
    assert abs(starts["simulated_at"] - (began + 0.4 * 3600.0)) < 5
    assert rows[held[0].id]["starts"] is None  # a job holding cards has no forecast


async def test_a_second_forecast_waits_for_a_change_or_the_period(engine):  # noqa: F811
    await full_head(engine)
    engine.scheduling.forecast_if_due()
    for _ in range(200):
        if not engine.scheduling._forecasting:
            break
        await asyncio.sleep(0.02)
    engine.state.forecasts = {}
    engine.scheduling.forecast_if_due()  # nothing changed: not due
    await asyncio.sleep(0.1)
    assert engine.state.forecasts == {}


async def test_the_submit_preview_says_when_it_would_start(engine):  # noqa: F811
    await full_head(engine)
    plan = engine.plan("carol", JobSpec(command=("true",), time_limit_s=600.0))
    assert plan["decision"] == "wait"
    assert plan["starts"]["start_at"] > engine.state.clock()
    assert plan["starts"]["late"] >= plan["starts"]["start_at"]


async def test_the_first_forecast_is_kept_and_scored_at_the_start(engine):  # noqa: F811
    held, waiting = await full_head(engine)
    await forecast_made(engine, lambda: engine.scheduling.first_forecasts)
    first = engine.scheduling.first_forecasts[waiting.id]
    assert first == engine.state.forecasts[waiting.id]["start_at"]
    engine.state.forecasts, engine.scheduling._forecast_at = {}, None
    engine.scheduling.forecast_if_due()  # a later forecast does not replace the first
    for _ in range(200):
        if engine.state.forecasts:
            break
        await asyncio.sleep(0.02)
    transitions = engine.transitions
    transitions.finish(engine.jobs[held[0].id], JobState.SUCCEEDED, 0, "")
    engine.scheduling.schedule_pass()
    await asyncio.sleep(0)
    transitions.mark_running(engine.jobs[waiting.id])
    samples = engine.metrics.registry.get_sample_value
    assert samples("nebula_forecast_error_seconds_count") == 1
    started = engine.jobs[waiting.id].started_at
    assert samples("nebula_forecast_error_seconds_sum") == abs(started - first)
    transitions.finish(engine.jobs[waiting.id], JobState.SUCCEEDED, 0, "")
    row = next(r for r in await engine.accounting.history(engine.owner) if r["id"] == waiting.id)
    assert row["forecast"]["start_at"] == first and row["forecast"]["late"] >= first
    assert row["forecast_error_s"] == round(started - first, 3)


async def test_a_start_teaches_the_calibration_how_its_wait_compared(engine):  # noqa: F811
    """The first simulated start of a waiting job is kept with when it was made; at its
    start the calibration learns (actual wait + pad) ÷ (simulated wait + pad)."""
    held, waiting = await full_head(engine)
    await forecast_made(engine, lambda: engine.scheduling.first_simulated)
    made, simulated = engine.scheduling.first_simulated[waiting.id]
    assert simulated > made and not engine.scheduling.calibration.ratios
    transitions = engine.transitions
    transitions.finish(engine.jobs[held[0].id], JobState.SUCCEEDED, 0, "")
    engine.scheduling.schedule_pass()
    await asyncio.sleep(0)
    transitions.mark_running(engine.jobs[waiting.id])
    started = engine.jobs[waiting.id].started_at
    pad = forecast.PAD_S
    assert list(engine.scheduling.calibration.ratios) == [
        pytest.approx((started - made + pad) / (simulated - made + pad))]
    assert waiting.id not in engine.scheduling.first_simulated


async def test_the_head_learns_the_share_of_its_time_a_job_used(engine):  # noqa: F811
    """A job with --time that succeeded or ran out of it teaches the forecast the share of
    its --time it used; a failed one does not (it says nothing of how long such work runs)."""
    held, _ = await full_head(engine)
    outcomes = (JobState.SUCCEEDED, JobState.TIMEOUT, JobState.FAILED)
    for job, state in zip(held, outcomes):
        engine.transitions.mark_running(engine.jobs[job.id])
        engine.transitions.finish(engine.jobs[job.id], state, 0, "")
    ran = [(engine.store.job(j.id).ended_at - engine.store.job(j.id).started_at) / 3600.0 for j in held[:2]]
    assert engine.scheduling.histories().shares == pytest.approx(tuple(ran), abs=1e-3)  # seconds of an hour


async def test_a_head_started_again_keeps_the_run_lengths_it_learned(tmp_path):
    """The runs the forecast (and the scheduler's estimate) learned from are the store's: a
    head started again on it knows them as the one before knew them, not from nothing."""
    first = up_engine(tmp_path)
    try:
        held, waiting = await full_head(first)
        untimed = first.submit("bob", JobSpec(command=("true",)))
        for job, state in zip(held[:2], (JobState.SUCCEEDED, JobState.TIMEOUT)):
            first.transitions.mark_running(first.jobs[job.id])
            first.transitions.finish(first.jobs[job.id], state, 0, "")
        first.scheduling.schedule_pass()
        await asyncio.sleep(0)
        first.transitions.mark_running(first.jobs[untimed.id])
        first.transitions.finish(first.jobs[untimed.id], JobState.SUCCEEDED, 0, "")
        learned = first.scheduling.histories()
        assert learned.like and len(learned.shares) == 2
    finally:
        await first.stop()
        first.state.store.close()
    again = up_engine(tmp_path)
    try:
        known = again.scheduling.histories()
        assert set(known.like) == set(learned.like)  # the store keeps times to the millisecond
        assert all(known.like[key] == pytest.approx(runs, abs=1e-3) for key, runs in learned.like.items())
        assert known.shares == pytest.approx(learned.shares, abs=1e-3)
    finally:
        await again.stop()
        again.state.store.close()
