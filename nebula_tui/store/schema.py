"""The store's tables: made where missing, and the columns added since a table's first
release added to an older database. The store (``base.py``) calls ``create_tables`` in the
transaction that opens a database for writing."""

from __future__ import annotations

import sqlite_utils


def create_tables(db: sqlite_utils.Database) -> None:
    """The tables, indexes and later columns that are missing."""
    db["meta"].create({"key": str, "value": str}, pk="key", if_not_exists=True)
    db["nodes"].create(
        {"name": str, "host": str, "port": int, "state": str, "reason": str,
         "last_seen": float, "info": str},
        pk="name", if_not_exists=True,
    )
    db["gpus"].create(
        {"uuid": str, "node": str, "idx": int, "model": str, "vendor": str,
         "total_mb": int, "compute_cap": str, "pci_bus_id": str,
         "driver_version": str, "cuda_version": str, "status": str,
         "registered_at": float},
        pk="uuid", if_not_exists=True,
    )
    db["users"].create(
        {"name": str, "jobs_finished": int, "gpu_hours": float, "created_at": float},
        pk="name", if_not_exists=True,
    )
    db["jobs"].create(
        {"id": int, "user": str, "name": str, "spec": str, "state": str,
         "reason": str, "node": str, "submitted_at": float, "started_at": float,
         "ended_at": float, "exit_code": int},
        pk="id", if_not_exists=True,
    )
    db["allocations"].create(
        {"id": int, "job_id": int, "gpu_uuid": str, "node": str, "gpu_index": int,
         "memory_mb": int, "exclusive": int, "created_at": float,
         "released_at": float},
        pk="id", foreign_keys=[("job_id", "jobs", "id")], if_not_exists=True,
    )
    db["events"].create(
        {"id": int, "t": float, "kind": str, "message": str, "job_id": int,
         "node": str, "gpu": str, "user": str},
        pk="id", if_not_exists=True,
    )
    # Every launch token this store ever issued: a session or exit with another token
    # is not this store's to stop or to record (another head's copy of this store,
    # or a launch made after the backup this database was restored from).
    db["launches"].create({"token": str, "job_id": int, "attempt": int, "t": float},
                          pk="token", if_not_exists=True)
    # A job sent to a pool: the intent (written before the pool is asked), the token
    # that names it there, and the pool's id for it once the pool answered.
    db["pool_jobs"].create(
        {"job_id": int, "pool": str, "account": str, "token": str, "remote_id": str,
         "log_path": str, "sent_at": float, "note": str},
        pk="job_id", if_not_exists=True)
    # Cards booked for some users through a window (``nebula reserve``): the cards
    # as JSON [uuid, node, index] triples, the users as a JSON list; ``ended_at`` is
    # set when it is deleted early; ``broken`` says why it can no longer be honoured.
    db["bookings"].create(
        {"name": str, "cards": str, "users": str, "start": float, "end": float,
         "created_by": str, "created_at": float, "ended_at": float, "broken": str},
        pk="name", if_not_exists=True)
    # What each user booked, one row per booking made: the month allowance
    # (limits.booking_gpu_hours) counts these, whatever became of the booking's name.
    if "booked" not in db.table_names():
        db["booked"].create({"user": str, "start": float, "gpu_hours": float, "t": float})
        db.execute("INSERT INTO booked (user, start, gpu_hours, t) SELECT created_by, start, "
                   "json_array_length(cards) * (end - start) / 3600.0, created_at FROM bookings")
    db["telemetry"].create(
        {"gpu": str, "t": float, "temperature_c": float, "utilization_pct": float,
         "memory_used_mb": float, "power_w": float, "fan_pct": float,
         "sm_clock_mhz": float, "mem_clock_mhz": float, "bucket_s": float},
        if_not_exists=True,
    )
    add_missing_columns(db)
    db["telemetry"].create_index(["gpu", "t"], if_not_exists=True)
    db["jobs"].create_index(["state"], if_not_exists=True)
    db["allocations"].create_index(["released_at"], if_not_exists=True)
    db["allocations"].create_index(["job_id"], if_not_exists=True)
    db["launches"].create_index(["job_id"], if_not_exists=True)
    db["jobs"].create_index(["ended_at"], if_not_exists=True)


# Columns added after the first release of a table: (table, column, type, default).
LATER_COLUMNS = (
    ("jobs", "held_by", str, None),
    ("jobs", "cancel_by", str, None),
    ("jobs", "cancel_at", float, None),
    ("jobs", "attempt", int, 0),
    ("jobs", "gpu_hours", float, 0.0),
    ("users", "quota_gpu_hours", float, None),
    ("gpus", "status_reason", str, None),
    ("nodes", "drained", int, 0),
    ("nodes", "drain_reason", str, None),
    ("jobs", "workdir_used", str, None),
    # ``<head>.<attempt>.<nonce>``: names one launch on the nodes; NULL while pending
    ("jobs", "launch_token", str, None),
    # What a job's cards did while it held them (telemetry), summed over its runs:
    # GPU-hours with samples, those busy (x utilisation) and those idle, memory used.
    ("jobs", "sampled_gpu_hours", float, 0.0),
    ("jobs", "busy_gpu_hours", float, 0.0),
    ("jobs", "idle_gpu_hours", float, 0.0),
    ("jobs", "mem_used_mb_mean", float, None),
    ("jobs", "mem_used_mb_peak", float, None),
    ("telemetry", "span_s", float, None),  # the seconds a row stands for (its weight)
    # A stop of the head's own (time limit, memory guard, idleness, requeue) under way:
    # the state it ends in, why, whether it is requeued instead, and when SIGKILL is
    # due (the head's clock), so a restarted head ends it then (NULL: no stop)
    ("jobs", "stop_ends", str, None),
    ("jobs", "stop_why", str, None),
    ("jobs", "stop_requeue", int, 0),
    ("jobs", "stop_kill_at", float, None),
    # the pool a job was sent to (head/pools.py), NULL while it is the lab's
    ("jobs", "pool", str, None),
    # what fraction of its GPU-hours a job is charged (a preemptible job's
    # ``scheduler.preemptible_charge`` when it was submitted), and how many times a
    # normal job's need stopped and requeued it
    ("jobs", "charge", float, 1.0),
    ("jobs", "preemptions", int, 0),
    # the first start forecast the head made for a job after its submit (head/forecast.py):
    # the expected start and its interval, kept to score the forecast against the start
    ("jobs", "forecast_at", float, None),
    ("jobs", "forecast_early", float, None),
    ("jobs", "forecast_late", float, None),
    # 1: it runs as preemptible work because its user was past their quota
    # (``scheduler.quota_mode: scavenge``): its hours are the report's over-quota hours
    ("jobs", "over_quota", int, 0),
)


def add_missing_columns(db: sqlite_utils.Database) -> None:
    for table, column, kind, default in LATER_COLUMNS:
        if column not in db[table].columns_dict:
            db[table].add_column(column, kind, not_null_default=default)
