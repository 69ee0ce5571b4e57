"""The store on a real SQLite file: job lifecycle, GPU-hour charging, durability, rollback."""

from __future__ import annotations

import sqlite3

import pytest

from nebula_tui.model import JobState, Launching, Pending, Placement, Running, Stopping
from nebula_tui.store import Store
from support.stores import CARD_MB, HOUR, SLICES, SPEC, T0

def user_row(store: Store, name: str) -> dict:
    (row,) = [u for u in store.users() if u["name"] == name]
    return row


def count(store: Store, table: str) -> int:
    return store.db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


def run_job(store: Store, placements=SLICES, hours: float = 2.0, code: int = 0) -> int:
    job = store.add_job("alice", SPEC, T0)
    store.start_launching(job.id, placements, T0 + 1)
    store.mark_running(job.id, T0 + 2)
    store.finish_job(job.id, JobState.SUCCEEDED if code == 0 else JobState.FAILED,
                     T0 + 2 + hours * HOUR, exit_code=code)
    return job.id


def test_round_trip(store):
    job = store.add_job("alice", SPEC, T0)
    assert job.state is JobState.PENDING and job.spec == SPEC and job.user == "alice"
    assert job.submitted_at == T0 and job.placements == ()

    store.start_launching(job.id, SLICES, T0 + 1)
    launching = store.job(job.id)
    assert launching.state is JobState.LAUNCHING
    assert launching.node == "node01"
    assert launching.placements == SLICES  # same order, same fields
    assert launching.reason == ""
    assert sorted(p.gpu_uuid for _, p in store.active_placements()) == ["GPU-a", "GPU-b"]

    store.mark_running(job.id, T0 + 2)
    running = store.job(job.id)
    assert running.state is JobState.RUNNING and running.started_at == T0 + 2

    store.finish_job(job.id, JobState.FAILED, T0 + 100, exit_code=3, reason="exit code 3")
    done = store.job(job.id)
    assert (done.state, done.exit_code, done.ended_at, done.reason) == (
        JobState.FAILED, 3, T0 + 100, "exit code 3")
    assert done.placements == SLICES  # the cards it held, no longer held by anyone
    assert store.active_placements() == []
    assert [e["kind"] for e in store.events() if e["job_id"] == job.id] == [
        "submit", "place", "start", "end"]


def test_jobs_listing_filters_by_state(store):
    a = store.add_job("alice", SPEC, T0)
    b = store.add_job("bob", SPEC, T0 + 1)
    store.start_launching(b.id, SLICES, T0 + 2)
    assert [j.id for j in store.jobs()] == [a.id, b.id]
    assert [j.id for j in store.jobs((JobState.PENDING,))] == [a.id]
    (launching,) = store.jobs((JobState.LAUNCHING, JobState.RUNNING))
    assert launching.placements == SLICES
    assert [j.id for j in store.jobs(limit=1)] == [b.id]


def test_finish_charges_gpu_hours_by_share(store):
    run_job(store, hours=2.0)
    alice = user_row(store, "alice")
    # 2 h x (8192/24576 of one card + one whole card) = 2 x 4/3
    assert alice["gpu_hours"] == pytest.approx(2.0 * (1 / 3 + 1))
    assert alice["jobs_finished"] == 1


def test_slice_on_unregistered_gpu_counts_its_gigabytes_too(store):
    # A slice is charged against the 24 GB reference card, not its own: a card of unknown
    # size charges an 8 GB slice what any other card does.
    run_job(store, placements=(Placement("GPU-unknown", "node09", 0, 8192, False),), hours=1.0)
    assert user_row(store, "alice")["gpu_hours"] == pytest.approx(1 / 3)


def test_charges_accumulate_per_user(store):
    run_job(store, placements=SLICES[:1], hours=3.0)
    run_job(store, placements=SLICES[1:], hours=0.5)
    alice = user_row(store, "alice")
    assert alice["gpu_hours"] == pytest.approx(3.0 / 3 + 0.5)
    assert alice["jobs_finished"] == 2


def test_cancel_before_start_charges_nothing(store):
    job = store.add_job("bob", SPEC, T0)
    store.finish_job(job.id, JobState.CANCELLED, T0 + 50, reason="cancelled by bob")
    assert store.job(job.id).state is JobState.CANCELLED
    assert user_row(store, "bob")["gpu_hours"] == 0.0


def test_finishing_twice_is_a_no_op(store):
    job_id = run_job(store, hours=1.0)
    before = (store.job(job_id), user_row(store, "alice"), count(store, "events"))
    store.finish_job(job_id, JobState.CANCELLED, T0 + 10 * HOUR, exit_code=None, reason="again")
    assert (store.job(job_id), user_row(store, "alice"), count(store, "events")) == before


def test_committed_state_is_seen_by_a_second_store(store, db_path):
    job_id = run_job(store, hours=1.0)
    pending = store.add_job("carol", SPEC, T0 + 5)
    other = Store(db_path)  # as after a restart of the head, while the first is still open
    try:
        assert other.job(job_id) == store.job(job_id)
        assert other.job(pending.id).state is JobState.PENDING
        assert other.head_token == store.head_token != ""
        assert user_row(other, "alice") == user_row(store, "alice")
        assert [g["uuid"] for g in other.gpus()] == ["GPU-a", "GPU-b"]
    finally:
        other.close()
    store.close()
    reopened = Store(db_path)
    try:
        assert reopened.job(pending.id).spec == SPEC
    finally:
        reopened.close()


def test_plain_sqlite_reader_sees_commits(store, db_path):
    job = store.add_job("alice", SPEC, T0)
    with sqlite3.connect(db_path) as conn:
        assert conn.execute("SELECT state FROM jobs WHERE id = ?", [job.id]).fetchone() == ("pending",)


def test_journal_mode_is_wal(store, db_path):
    assert store.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    with sqlite3.connect(db_path) as conn:  # persistent: a fresh connection sees it too
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_failed_transaction_leaves_nothing(store):
    jobs_before, events_before = count(store, "jobs"), count(store, "events")
    with pytest.raises(RuntimeError, match="boom"):
        with store.transaction() as db:
            db["jobs"].insert({"user": "mallory", "name": "x", "spec": "{}", "state": "pending",
                               "reason": "", "submitted_at": T0})
            db["events"].insert({"t": T0, "kind": "submit", "message": "half done"})
            raise RuntimeError("boom")
    assert (count(store, "jobs"), count(store, "events")) == (jobs_before, events_before)
    # The connection is usable afterwards (no transaction left open).
    job = store.add_job("alice", SPEC, T0)
    assert store.job(job.id).state is JobState.PENDING


def test_register_gpus_keeps_status_and_first_registration(store):
    store.db.execute("UPDATE gpus SET status = 'maintenance' WHERE uuid = 'GPU-a'")
    store.register_gpus("node01", [{"uuid": "GPU-a", "idx": 0, "model": "RTX 4090",
                                    "total_mb": CARD_MB}], T0 + 999)
    (gpu_a,) = [g for g in store.gpus() if g["uuid"] == "GPU-a"]
    assert gpu_a["status"] == "maintenance"
    assert gpu_a["registered_at"] == T0


def test_mark_running_after_finish_changes_nothing(store):
    job = store.add_job("bob", SPEC, T0)
    store.finish_job(job.id, JobState.CANCELLED, T0 + 1, reason="cancelled by bob")
    events_before = count(store, "events")
    store.mark_running(job.id, T0 + 2)
    assert store.job(job.id).state is JobState.CANCELLED
    assert count(store, "events") == events_before


def test_gpu_maintenance_outlives_a_restart(store, db_path):
    store.register_gpus("n1", [{"uuid": "GPU-a", "idx": 0, "model": "x", "total_mb": 24576}], 1.0)
    store.set_gpu_status("GPU-a", "maintenance", "Xid 79 twice within 10 min")
    reopened = Store(db_path)
    row = next(g for g in reopened.gpus() if g["uuid"] == "GPU-a")
    assert row["status"] == "maintenance" and row["status_reason"].startswith("Xid 79")
    # A node reporting the GPU again keeps its status.
    reopened.register_gpus("n1", [{"uuid": "GPU-a", "idx": 0, "model": "x", "total_mb": 24576}], 2.0)
    assert next(g for g in reopened.gpus() if g["uuid"] == "GPU-a")["status"] == "maintenance"
    reopened.set_gpu_status("GPU-a", "ok")
    assert next(g for g in Store(db_path).gpus() if g["uuid"] == "GPU-a")["status"] == "ok"


def test_a_stop_under_way_outlives_a_restart_until_its_job_ends_or_is_requeued(store, db_path):
    job = store.add_job("alice", SPEC, T0)
    store.start_launching(job.id, SLICES, T0 + 1)
    store.mark_running(job.id, T0 + 2)
    store.record_stop(job.id, JobState.TIMEOUT, "stopped at its time limit (--time 1 h)", False, T0 + 90)
    status = Store(db_path).job(job.id).status
    assert isinstance(status, Stopping) and isinstance(status.holding, Running)
    assert (status.ends, status.why, status.requeue, status.kill_at) == (
        JobState.TIMEOUT, "stopped at its time limit (--time 1 h)", False, T0 + 90)
    store.move_kill_at(job.id, T0 + 120)  # its SIGUSR1 went late: a whole grace from then
    assert Store(db_path).job(job.id).status.kill_at == T0 + 120
    store.clear_stop(job.id)  # not heard: it runs on as it was
    assert isinstance(Store(db_path).job(job.id).status, Running)
    store.move_kill_at(job.id, T0 + 130)  # a stop no longer under way is not brought back
    assert isinstance(Store(db_path).job(job.id).status, Running)
    store.record_stop(job.id, JobState.PENDING, "requeued by alice", True, T0 + 95)
    assert Store(db_path).job(job.id).status.requeue
    store.requeue(job.id, "requeued by alice", T0 + 96)
    assert isinstance(Store(db_path).job(job.id).status, Pending)
    store.start_launching(job.id, SLICES, T0 + 97)  # the next attempt starts with no stop
    assert isinstance(Store(db_path).job(job.id).status, Launching)


def test_each_attempt_keeps_the_nodes_it_ran_on(store):
    """Where each run's log is: a requeue starts the next attempt, maybe elsewhere."""
    job = store.add_job("alice", SPEC, T0)
    assert store.attempt_nodes(job.id) == {}
    store.start_launching(job.id, SLICES, T0 + 1)
    store.mark_running(job.id, T0 + 2)
    store.requeue(job.id, "requeued by alice", T0 + 3)
    gang = (Placement("GPU-c", "node02", 0, CARD_MB, True), Placement("GPU-a", "node01", 0, CARD_MB, True))
    store.start_launching(job.id, gang, T0 + 4)
    assert store.attempt_nodes(job.id) == {0: ["node01"], 1: ["node02", "node01"]}
    assert store.last_nodes(job.id) == ["node02", "node01"]


def test_a_card_at_the_idle_limit_is_idle_for_accounting_as_for_the_idle_limit(store):
    """Accounting counted a card idle below 5 %, the idle-job limit at or below it: a job
    at exactly 5 % was idle for one and busy for the other."""
    from nebula_tui.head.limits import IDLE, idleness
    from nebula_tui.model import IDLE_UTIL_PCT

    job = store.add_job("alice", SPEC, T0)
    store.start_launching(job.id, SLICES, T0 + 1)
    store.mark_running(job.id, T0 + 2)
    store.record_telemetry([{"gpu": gpu, "t": T0 + 2 + 30 * i, "utilization_pct": IDLE_UTIL_PCT,
                             "span_s": 30.0} for gpu in ("GPU-a", "GPU-b") for i in range(10)])
    store.finish_job(job.id, JobState.SUCCEEDED, T0 + 302, exit_code=0)
    held, idle = store.db.execute("SELECT gpu_hours, idle_gpu_hours FROM jobs WHERE id = ?",
                                  [job.id]).fetchone()
    assert held > 0 and idle == pytest.approx(held)
    assert idleness([IDLE_UTIL_PCT, IDLE_UTIL_PCT]) == IDLE
