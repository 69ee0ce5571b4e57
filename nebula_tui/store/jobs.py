"""The store's rows of the cluster: nodes and GPUs, jobs and their allocations, pools,
telemetry, users, bookings, accounting and the events log, each as SQL on the database that
``base.py`` opens.

Why one module: for one step only; each kind of row gets a part of its own next.
"""

from __future__ import annotations

import contextlib
import json
import secrets
from dataclasses import replace

from ..model import (WAITING_FOR_SCHEDULER, Cancelling, Ended, Job, JobSpec, JobState, Launching,
                     Pending, Placement, Running, Stopping, spec_fields)
from .base import StaleDecision, StoreBase, chunks, filters

FINISHED_SQL = ", ".join(f"'{s.value}'" for s in JobState if s.finished)
#: A job that counts towards its user's fair share (R6): finished after it ran (one
#: cancelled while it waited, or failed because its --after job failed, used nothing).
COUNTED_SQL = f"state IN ({FINISHED_SQL}) AND (started_at IS NOT NULL OR gpu_hours > 0)"
#: For accounting, a card below this utilisation is idle (its GPU-hours are "held idle").
IDLE_UTIL_PCT = 5.0
#: The seconds a telemetry row stands for when it does not say (rows from before ``span_s``).
DEFAULT_SPAN_S = 30.0

#: what clears a job's stop under way (``Store.record_stop``)
_NO_STOP = "stop_ends = NULL, stop_why = NULL, stop_requeue = 0, stop_kill_at = NULL"
#: jobs submitted without --preemptible (the spec is the job's JSON)
_NOT_PREEMPTIBLE = "AND NOT COALESCE(json_extract(spec, '$.preemptible'), 0) "
#: A job's allocations as ``Job.placements`` shows them: the cards it holds, or once it
#: ended, the cards it held at its end (released in the same transaction that ended it).
_HELD = "(a.released_at IS NULL OR a.released_at = (SELECT ended_at FROM jobs WHERE id = a.job_id))"


class Store(StoreBase):
    """Durable state of the cluster: nodes, GPUs, jobs, allocations, users, events."""

    # ------------------------------------------------------------------ nodes
    def upsert_node(self, name: str, host: str, port: int, state: str, reason: str = "",
                    last_seen: float | None = None, info: dict | None = None) -> None:
        row = {"name": name, "host": host, "port": port, "state": state, "reason": reason}
        if last_seen is not None:
            row["last_seen"] = last_seen
        if info is not None:
            row["info"] = json.dumps(info)
        with self.transaction():
            self.db["nodes"].upsert(row, pk="name")

    def nodes(self) -> list[dict]:
        return [dict(r) for r in self.db["nodes"].rows_where(order_by="name")]

    def set_drained(self, name: str, drained: bool, reason: str, by: str, t: float) -> None:
        """An admin's drain or resume of a node; it outlives restarts of the head."""
        with self.transaction():
            self.db.execute("UPDATE nodes SET drained = ?, drain_reason = ? WHERE name = ?",
                            [int(drained), reason if drained else None, name])
            what = f"drained by {by}" + (f": {reason}" if reason else "") if drained else f"resumed by {by}"
            self._event(t, "admin", f"node {name} {what}", node=name, user=by)

    def register_gpus(self, node: str, descriptors: list[dict], t: float) -> None:
        """Record the GPUs a node reported (R2 descriptor fields), keeping their status."""
        with self.transaction():
            for d in descriptors:
                existing = self._gpu_status(d["uuid"])
                row = {**d, "node": node, "status": existing or "ok"}
                if existing is None:
                    row["registered_at"] = t
                self.db["gpus"].upsert(row, pk="uuid")

    def set_gpu_status(self, gpu_uuid: str, status: str, reason: str | None = None) -> None:
        """``maintenance`` (with why) or ``ok``: kept so a restart does not undo isolation."""
        with self.transaction():
            self.db.execute("UPDATE gpus SET status = ?, status_reason = ? WHERE uuid = ?",
                            [status, reason, gpu_uuid])

    def _gpu_status(self, gpu_uuid: str) -> str | None:
        row = self.db.execute("SELECT status FROM gpus WHERE uuid = ?", [gpu_uuid]).fetchone()
        return row[0] if row else None

    def gpus(self) -> list[dict]:
        return [dict(r) for r in self.db["gpus"].rows_where(order_by="node, idx")]

    # ------------------------------------------------------------------- jobs
    def add_job(self, user: str, spec: JobSpec, t: float, durable: bool = True,
                charge: float = 1.0) -> Job:
        """Store a submitted job as pending; the id is durable once this returns (with
        ``durable`` False: once ``sync_to_disk`` returned after it). ``charge``: the
        fraction of its GPU-hours it will be charged."""
        return self._add_jobs(user, [spec], t, f"job {self._next_id} submitted by {user}",
                              durable, charge)[0]

    def add_array(self, user: str, spec: JobSpec, indices: tuple[int, ...], limit: int | None,
                  t: float, durable: bool = True, charge: float = 1.0) -> list[Job]:
        """Store an array's tasks as pending jobs in one transaction: each task is a job of
        its own (ids one after the other) whose spec names its array (the first task's id),
        its index and the limit of tasks running at once."""
        first = self._next_id
        tasks = [replace(spec, array_id=first, array_index=i, array_limit=limit) for i in indices]
        return self._add_jobs(user, tasks, t, f"array job {first} ({len(tasks)} tasks, {spec.array}) "
                                              f"submitted by {user}", durable, charge)

    def _add_jobs(self, user: str, specs: list[JobSpec], t: float, message: str,
                  durable: bool, charge: float = 1.0) -> list[Job]:
        """Pending jobs with the next free ids, and their submit line, in one transaction."""
        ids = range(self._next_id, self._next_id + len(specs))
        with self.transaction(durable=durable):
            self._ensure_user(user, t)
            # Plain SQL on the hot paths: sqlite-utils' insert inspects the table each call.
            self.db.conn.executemany(
                "INSERT INTO jobs (id, user, name, spec, state, reason, submitted_at, charge) "
                "VALUES (?, ?, ?, ?, 'pending', ?, ?, ?)",
                [[job_id, user, spec.name, json.dumps(spec_fields(spec)), WAITING_FOR_SCHEDULER, t, charge]
                 for job_id, spec in zip(ids, specs)])
            self._set_meta("job_id_floor", str(ids[-1]))
            self._event(t, "submit", message, job_id=ids[0], user=user)
            self.ids.write(ids[-1])  # last: a failed commit leaves a gap, never a reuse
        self._next_id = ids[-1] + 1
        # What was written, without reading it back (a submit's second query): a new job
        # is pending, attempt 0, exactly as ``job`` would read it.
        return [Job(id=job_id, user=user, spec=spec, submitted_at=t, status=Pending(WAITING_FOR_SCHEDULER))
                for job_id, spec in zip(ids, specs)]

    def set_held(self, job_id: int, held_by: str | None, by: str, t: float) -> None:
        """Hold a pending job (it is not scheduled until released) or release it."""
        with self.transaction():
            self.db.execute("UPDATE jobs SET held_by = ? WHERE id = ? AND state = 'pending'",
                            [held_by, job_id])
            what = "held" if held_by else "released"
            self._event(t, "hold", f"job {job_id} {what} by {by}", job_id=job_id, user=by)

    def request_cancel(self, job_id: int, by: str, t: float, audit: bool = False) -> None:
        """Remember that a running job is to be cancelled (the node may be away)."""
        with self.transaction():
            self.db.execute("UPDATE jobs SET cancel_by = ?, cancel_at = ? WHERE id = ?",
                            [by, t, job_id])
            self._event(t, "admin" if audit else "cancel", f"job {job_id} cancel requested by {by}",
                        job_id=job_id, user=by)

    def record_stop(self, job_id: int, ends: JobState, why: str, requeue: bool,
                    kill_at: float, preempted_at: float | None = None) -> None:
        """Remember a stop of the head's own that sent SIGUSR1 (or is about to): how the
        job ends and when it is killed, for a head that restarts meanwhile. A preemption
        (``preempted_at``: when) also counts one more and writes its line."""
        with self.transaction():
            self.db.execute("UPDATE jobs SET stop_ends = ?, stop_why = ?, stop_requeue = ?, "
                            "stop_kill_at = ?, preemptions = preemptions + ? WHERE id = ?",
                            [ends.value, why, int(requeue), kill_at, int(preempted_at is not None), job_id])
            if preempted_at is not None:
                self._event(preempted_at, "preempt", f"job {job_id} {why}", job_id=job_id)

    def clear_stop(self, job_id: int) -> None:
        """The stop was not heard (its nodes are away): the job runs on as it was."""
        with self.transaction():
            self.db.execute(f"UPDATE jobs SET {_NO_STOP} WHERE id = ?", [job_id])

    def requeue(self, job_id: int, reason: str, t: float) -> float:
        """Back to pending, its allocation released (lost node, isolated GPU); returns the
        GPU-hours its run was charged."""
        held = 0.0
        with self.transaction():
            row = self.db.execute("SELECT user, started_at FROM jobs WHERE id = ?", [job_id]).fetchone()
            if row is not None:  # the GPU time it held until now is still charged (R7)
                held = self._charge_run(job_id, row[1], t)
                self.db.execute("UPDATE users SET gpu_hours = gpu_hours + ? WHERE name = ?",
                                [held, row[0]])
            self.db.execute(
                "UPDATE allocations SET released_at = ? WHERE job_id = ? AND released_at IS NULL",
                [t, job_id])
            self.db.execute(
                "UPDATE jobs SET state = 'pending', node = NULL, started_at = NULL, reason = ?, "
                f"cancel_by = NULL, cancel_at = NULL, {_NO_STOP}, attempt = attempt + 1, "
                "launch_token = NULL WHERE id = ? AND state IN ('launching', 'running')",
                [reason, job_id])
            self._event(t, "requeue", f"job {job_id} {reason}", job_id=job_id)
        return held

    def set_reasons(self, reasons: dict[int, str]) -> None:
        """Update the waiting reasons of pending jobs (only those that changed)."""
        if not reasons:
            return
        with self.transaction():
            self.db.conn.executemany(
                "UPDATE jobs SET reason = ? WHERE id = ? AND state = 'pending'",
                [(reason, job_id) for job_id, reason in reasons.items()],
            )

    def start_launching(self, job_id: int, placements: tuple[Placement, ...], t: float) -> str:
        """Write a job's allocation and mark it launching, in one transaction; returns the
        launch's token.

        This is the launch intent: after a crash the head finds it and either adopts the
        tmux session it created or creates it, never twice. The token's nonce is new for
        every launch, so no other launch (another store, a store restored from a backup
        that hands out this id again) can ever be taken for this one.
        """
        with self.transaction():
            still_pending = self.db.execute(
                "UPDATE jobs SET state = 'launching', node = ?, reason = '', "
                "launch_token = ? || '.' || attempt || '.' || ? "
                "WHERE id = ? AND state = 'pending'",
                [placements[0].node, self.head_token, secrets.token_hex(8), job_id]).rowcount
            if not still_pending:
                raise StaleDecision(f"job {job_id} is no longer pending")
            self._allocate(job_id, placements, t)
            node = placements[0].node
            gpus = ", ".join(f"{p.node}:{p.gpu_index}" for p in placements)
            self._event(t, "place", f"job {job_id} placed on {gpus}", job_id=job_id, node=node)
            token, attempt = self.db.execute(
                "SELECT launch_token, attempt FROM jobs WHERE id = ?", [job_id]).fetchone()
            self.db.execute("INSERT INTO launches (token, job_id, attempt, t) VALUES (?, ?, ?, ?)",
                            [token, job_id, attempt, t])
            return token

    def adopt_launch(self, job: Job, node: str, t: float) -> None:
        """A launch a node ran that this store does not know: it was restored from an
        older backup (``job`` is what the launch's record on the node says, running, with
        its token and placements). The job (again, when its id was lost with the backup),
        its allocation and its token are written, in one transaction."""
        token, placements = job.launch_token, job.placements
        with self.transaction():
            self._ensure_user(job.user, t)
            self.db.execute(
                "INSERT OR IGNORE INTO jobs (id, user, name, spec, state, reason, submitted_at) "
                "VALUES (?, ?, ?, ?, 'pending', '', ?)",
                [job.id, job.user, job.spec.name, json.dumps(spec_fields(job.spec)), job.submitted_at])
            self.db.execute("UPDATE allocations SET released_at = ? WHERE job_id = ? "
                            "AND released_at IS NULL", [t, job.id])
            self.db.execute(
                "UPDATE jobs SET state = 'running', node = ?, reason = '', started_at = ?, "
                f"attempt = ?, launch_token = ?, cancel_by = NULL, cancel_at = NULL, {_NO_STOP} "
                "WHERE id = ?",
                [placements[0].node, job.started_at, job.attempt, token, job.id])
            self._allocate(job.id, placements, t)
            self.db.execute("INSERT OR IGNORE INTO launches (token, job_id, attempt, t) "
                            "VALUES (?, ?, ?, ?)", [token, job.id, job.attempt, t])
            self._event(t, "reconcile", f"job {job.id} ran on {node} after the backup this "
                        "database was restored from: taken in again", job_id=job.id, node=node)
            if job.id >= self._next_id:
                self._set_meta("job_id_floor", str(job.id))
                self.ids.write(max(self.ids.value, job.id))
        self._next_id = max(self._next_id, job.id + 1)

    def issued(self, token: object) -> bool:
        """Whether this store issued this launch token (see ``start_launching``)."""
        return isinstance(token, str) and self.db.execute(
            "SELECT 1 FROM launches WHERE token = ?", [token]).fetchone() is not None

    def set_workdir_used(self, job_id: int, workdir: str) -> None:
        with self.transaction():
            self.db.execute("UPDATE jobs SET workdir_used = ? WHERE id = ?", [workdir, job_id])

    def mark_running(self, job_id: int, t: float) -> None:
        with self.transaction():
            changed = self.db.execute(
                "UPDATE jobs SET state = 'running', started_at = ? "
                "WHERE id = ? AND state = 'launching'", [t, job_id],
            ).rowcount
            if changed:
                self._event(t, "start", f"job {job_id} started", job_id=job_id)

    def finish_job(self, job_id: int, state: JobState, t: float, exit_code: int | None = None,
                   reason: str = "", ended_at: float | None = None) -> float | None:
        """End a job, release its GPUs and charge its user, in one transaction; returns the
        GPU-hours charged now (None: no such job, or it had ended already). ``ended_at``:
        when it ended, if not at ``t`` (a pool's job, as the pool says); the line is at ``t``."""
        end = t if ended_at is None else ended_at
        with self.transaction():
            row = self.db.execute(
                "SELECT user, started_at, state FROM jobs WHERE id = ?", [job_id]
            ).fetchone()
            if row is None or JobState(row[2]).finished:
                return None
            user, started_at, _ = row
            gpu_hours = self._charge_run(job_id, started_at, end)
            ran = started_at is not None or bool(self.db.execute(
                "SELECT gpu_hours > 0 FROM jobs WHERE id = ?", [job_id]).fetchone()[0])
            self.db.execute(
                f"UPDATE jobs SET state = ?, ended_at = ?, exit_code = ?, reason = ?, {_NO_STOP} "
                "WHERE id = ?",
                [state.value, end, exit_code, reason, job_id],
            )
            self.db.execute(
                "UPDATE allocations SET released_at = ? WHERE job_id = ? AND released_at IS NULL",
                [end, job_id],
            )
            self.db.execute(
                "UPDATE users SET jobs_finished = jobs_finished + ?, gpu_hours = gpu_hours + ? "
                "WHERE name = ?", [int(ran), gpu_hours, user],
            )
            detail = f" with exit code {exit_code}" if exit_code is not None else ""
            message = f"job {job_id} {state.value}{detail}" + (f": {reason}" if reason else "")
            self._event(t, "end", message, job_id=job_id, user=user)
        return gpu_hours

    def _charge_run(self, job_id: int, started_at: float | None, t: float) -> float:
        """Charge the job's run that ends at ``t`` (a requeue ends one too) its GPU-hours
        times its ``charge``, and add what its cards did meanwhile (whole hours), from
        telemetry; returns the GPU-hours charged."""
        hours = self._gpu_hours(job_id, started_at, t)
        charge = self.db.execute("SELECT charge FROM jobs WHERE id = ?", [job_id]).fetchone()
        charged = hours * (1.0 if charge is None or charge[0] is None else charge[0])
        usage = self._run_usage(job_id, started_at, t) if hours > 0 else None
        if usage is None:
            self.db.execute("UPDATE jobs SET gpu_hours = gpu_hours + ? WHERE id = ?", [charged, job_id])
            return charged
        busy, idle, mem_mean, mem_peak = usage
        sampled, old_mean, old_peak = self.db.execute(
            "SELECT sampled_gpu_hours, mem_used_mb_mean, mem_used_mb_peak FROM jobs WHERE id = ?",
            [job_id]).fetchone()
        if mem_mean is not None and old_mean is not None and sampled:
            mem_mean = (old_mean * sampled + mem_mean * hours) / (sampled + hours)
        peaks = [v for v in (old_peak, mem_peak) if v is not None]
        self.db.execute(
            "UPDATE jobs SET gpu_hours = gpu_hours + ?, sampled_gpu_hours = sampled_gpu_hours + ?, "
            "busy_gpu_hours = busy_gpu_hours + ?, idle_gpu_hours = idle_gpu_hours + ?, "
            "mem_used_mb_mean = ?, mem_used_mb_peak = ? WHERE id = ?",
            [charged, hours, busy * hours, idle * hours, old_mean if mem_mean is None else mem_mean,
             max(peaks) if peaks else None, job_id])
        return charged

    def _run_usage(self, job_id: int, started_at: float,
                   t: float) -> tuple[float, float, float | None, float | None] | None:
        """Telemetry of the cards a job holds now, between ``started_at`` and ``t``: the
        busy fraction (mean utilisation), the idle fraction (time below IDLE_UTIL_PCT),
        mean and peak memory used; each sample weighs the seconds it stands for (a
        10-minute average weighs 20 samples of 30 s). None when no sample has a utilisation."""
        weight = f"COALESCE(t.span_s, NULLIF(t.bucket_s, 0), {DEFAULT_SPAN_S})"
        weighed, busy, idle, mem_weight, mem, peak = self.db.execute(
            f"SELECT SUM(CASE WHEN t.utilization_pct IS NULL THEN 0 ELSE {weight} END), "
            f"SUM({weight} * t.utilization_pct), "
            f"SUM(CASE WHEN t.utilization_pct < ? THEN {weight} ELSE 0 END), "
            f"SUM(CASE WHEN t.memory_used_mb IS NULL THEN 0 ELSE {weight} END), "
            f"SUM({weight} * t.memory_used_mb), MAX(t.memory_used_mb) "
            "FROM allocations a JOIN telemetry t ON t.gpu = a.gpu_uuid "
            "WHERE a.job_id = ? AND a.released_at IS NULL AND t.t >= ? AND t.t <= ?",
            [IDLE_UTIL_PCT, job_id, started_at, t]).fetchone()
        if not weighed:
            return None
        return (busy / weighed / 100, idle / weighed, mem / mem_weight if mem_weight else None, peak)

    def _gpu_hours(self, job_id: int, started_at: float | None, t: float) -> float:
        """R7: whole-card hours; a slice counts its fraction of the card's memory."""
        if started_at is None:
            return 0.0
        rows = self.db.execute(
            "SELECT a.memory_mb, a.exclusive, g.total_mb FROM allocations a "
            "LEFT JOIN gpus g ON g.uuid = a.gpu_uuid "
            "WHERE a.job_id = ? AND a.released_at IS NULL", [job_id],
        ).fetchall()
        hours = max(0.0, t - started_at) / 3600
        share = sum(1.0 if excl or not total else min(1.0, mem / total)
                    for mem, excl, total in rows)
        return hours * share

    # ------------------------------------------------------------------ pools
    def send_to_pool(self, job_id: int, pool: str, account: str, token: str, log_path: str,
                     reason: str, t: float) -> None:
        """The intent of sending a waiting job to a pool, before the pool is asked: the job
        is the pool's from now on, and ``token`` names the submission there (a head that
        restarts before the pool's answer finds the job by it). StaleDecision when the job
        no longer waits (cancelled, or placed here meanwhile)."""
        with self.transaction():
            changed = self.db.execute(
                "UPDATE jobs SET pool = ?, reason = ? WHERE id = ? AND state = 'pending' "
                "AND held_by IS NULL", [pool, reason, job_id]).rowcount
            if not changed:
                raise StaleDecision(f"job {job_id} is no longer waiting")
            self.db.execute(
                "INSERT OR REPLACE INTO pool_jobs (job_id, pool, account, token, remote_id, "
                "log_path, sent_at, note) VALUES (?, ?, ?, ?, NULL, ?, ?, '')",
                [job_id, pool, account, token, log_path, t])
            attempt = self.db.execute("SELECT attempt FROM jobs WHERE id = ?", [job_id]).fetchone()[0]
            self.db.execute("INSERT OR IGNORE INTO launches (token, job_id, attempt, t) "
                            "VALUES (?, ?, ?, ?)", [token, job_id, attempt, t])
            self._event(t, "pool", f"job {job_id} {reason}", job_id=job_id)

    def pool_submitted(self, job_id: int, remote_id: str, log_path: str, t: float) -> None:
        """The pool took the job as ``remote_id``; its output goes to ``log_path`` there."""
        with self.transaction():
            self.db.execute("UPDATE pool_jobs SET remote_id = ?, log_path = ? WHERE job_id = ?",
                            [remote_id, log_path, job_id])
            pool = self.db.execute("SELECT pool FROM pool_jobs WHERE job_id = ?", [job_id]).fetchone()
            self._event(t, "pool", f"job {job_id} is job {remote_id} in pool {pool[0] if pool else '?'}",
                        job_id=job_id)

    def pool_jobs(self) -> dict[int, dict]:
        """Job id -> its pool row, for every job sent to a pool that has not ended."""
        rows = self.db.execute(
            "SELECT p.job_id, p.pool, p.account, p.token, p.remote_id, p.log_path, p.sent_at "
            "FROM pool_jobs p JOIN jobs j ON j.id = p.job_id "
            "WHERE j.state IN ('pending', 'launching', 'running')").fetchall()
        keys = ("job_id", "pool", "account", "token", "remote_id", "log_path", "sent_at")
        return {r[0]: dict(zip(keys, r)) for r in rows}

    def leave_pool(self, job_id: int, t: float, why: str) -> None:
        """The pool let the job go without ending it (preempted, not requeued there): it
        waits here again as the lab's, and a later send gives it a new token."""
        with self.transaction():
            self.db.execute("UPDATE jobs SET pool = NULL WHERE id = ?", [job_id])
            self.db.execute("DELETE FROM pool_jobs WHERE job_id = ?", [job_id])
            self._event(t, "pool", f"job {job_id} {why}", job_id=job_id)

    def pool_job(self, job_id: int) -> dict | None:
        """A job's pool row, ended or not."""
        row = self.db.execute(
            "SELECT job_id, pool, account, token, remote_id, log_path, sent_at FROM pool_jobs "
            "WHERE job_id = ?", [job_id]).fetchone()
        keys = ("job_id", "pool", "account", "token", "remote_id", "log_path", "sent_at")
        return dict(zip(keys, row)) if row else None

    def pool_running(self, job_id: int, placements: tuple[Placement, ...], started_at: float,
                     t: float) -> None:
        """A pool job started there (its nodes' GPUs as ``placements``, ``pool:node``)."""
        with self.transaction():
            changed = self.db.execute(
                "UPDATE jobs SET state = 'running', node = ?, reason = '', started_at = ?, "
                "launch_token = (SELECT token FROM pool_jobs WHERE job_id = ?) "
                "WHERE id = ? AND state = 'pending'",
                [placements[0].node, started_at, job_id, job_id]).rowcount
            if not changed:
                return
            self._allocate(job_id, placements, t)
            nodes = ", ".join(dict.fromkeys(p.node for p in placements))
            self._event(t, "start", f"job {job_id} started on {nodes}", job_id=job_id,
                        node=placements[0].node)

    def job(self, job_id: int) -> Job | None:
        row = self.db.execute("SELECT * FROM jobs WHERE id = ?", [job_id]).fetchone()
        if row is None:
            return None
        return self._job_from_row(dict(zip(self._job_columns(), row)))

    def jobs(self, states: tuple[JobState, ...] | None = None, limit: int | None = None) -> list[Job]:
        """Jobs in submit order, optionally only in some states or only the newest ``limit``."""
        sql = "SELECT * FROM jobs"
        params: list = []
        if states:
            sql += f" WHERE state IN ({','.join('?' * len(states))})"
            params = [s.value for s in states]
        if limit:
            sql = f"SELECT * FROM ({sql} ORDER BY id DESC LIMIT {int(limit)})"
        sql += " ORDER BY id"
        columns = self._job_columns()
        rows = [dict(zip(columns, r)) for r in self.db.execute(sql, params).fetchall()]
        allocations = self._allocations_by_job([r["id"] for r in rows])
        return [self._job_from_row(r, allocations.get(r["id"], ())) for r in rows]

    #: What accounting keeps of a job besides the job itself (see ``_charge_run``).
    USAGE_COLUMNS = ("gpu_hours", "sampled_gpu_hours", "busy_gpu_hours", "idle_gpu_hours",
                     "mem_used_mb_mean", "mem_used_mb_peak")

    def ended_jobs(self, *, user: str | None = None, since: float | None = None,
                   until: float | None = None, states: tuple[JobState, ...] = (),
                   node: str | None = None, job_id: int | None = None,
                   limit: int = 1000) -> list[tuple[Job, dict]]:
        """Ended jobs that match (ended in [since, until), on ``node`` at their end), the
        newest ``limit`` of them, oldest first; each with its USAGE_COLUMNS."""
        finished = states or tuple(s for s in JobState if s.finished)
        # "+state": walk the ended_at index newest first, not every ended job by state
        where, params = filters((("user = ?", user), ("ended_at >= ?", since),
                                  ("ended_at < ?", until), ("id = ?", job_id),
                                  ("EXISTS (SELECT 1 FROM allocations a WHERE a.job_id = jobs.id "
                                   "AND a.node = ? AND a.released_at = jobs.ended_at)", node)))
        where += ["ended_at IS NOT NULL", f"+state IN ({','.join('?' * len(finished))})"]
        params += [s.value for s in finished]
        rows = self.db.execute(
            f"SELECT * FROM (SELECT * FROM jobs WHERE {' AND '.join(where)} "
            f"ORDER BY ended_at DESC, id DESC LIMIT {int(limit)}) ORDER BY ended_at, id",
            params).fetchall()
        columns = self._job_columns()
        rows = [dict(zip(columns, r)) for r in rows]
        allocations = self._allocations_by_job([r["id"] for r in rows])
        return [(self._job_from_row(r, allocations.get(r["id"], ())),
                 {c: r.get(c) for c in self.USAGE_COLUMNS}) for r in rows]

    def _job_columns(self) -> list[str]:
        if self._columns is None:
            self._columns = [c.name for c in self.db["jobs"].columns]
        return self._columns

    def _allocations_by_job(self, job_ids: list[int]) -> dict[int, tuple[Placement, ...]]:
        found: dict[int, list[Placement]] = {}
        for chunk in chunks(job_ids, 500):
            for job_id, p in self._placements(
                f"job_id IN ({','.join('?' * len(chunk))}) AND {_HELD}", chunk
            ):
                found.setdefault(job_id, []).append(p)
        return {k: tuple(v) for k, v in found.items()}

    def _placements(self, where: str, params: list) -> list[tuple[int, Placement]]:
        rows = self.db.execute(
            "SELECT job_id, gpu_uuid, node, gpu_index, memory_mb, exclusive "
            f"FROM allocations a WHERE {where} ORDER BY id", params,
        ).fetchall()
        return [(r[0], Placement(r[1], r[2], r[3], r[4], bool(r[5]))) for r in rows]

    def last_nodes(self, job_id: int) -> list[str]:
        """The nodes of the job's last launch (its allocations written together), rank 0
        first: where its logs are once it ended."""
        rows = self.db.execute(
            "SELECT node FROM allocations WHERE job_id = ? AND created_at = "
            "(SELECT MAX(created_at) FROM allocations WHERE job_id = ?) ORDER BY id",
            [job_id, job_id]).fetchall()
        return list(dict.fromkeys(r[0] for r in rows))

    def attempt_nodes(self, job_id: int) -> dict[int, list[str]]:
        """Attempt (0 the first) -> the nodes of its last launch, rank 0 first: where each
        attempt's log is. A launch and its allocations are written at one time."""
        rows = self.db.execute(
            "SELECT l.attempt, l.t, a.node FROM launches l JOIN allocations a "
            "ON a.job_id = l.job_id AND a.created_at = l.t WHERE l.job_id = ? "
            "ORDER BY l.attempt, l.t, a.id", [job_id]).fetchall()
        found: dict[int, tuple[float, list[str]]] = {}
        for attempt, t, node in rows:
            launch = found.get(attempt)
            if launch is None or launch[0] != t:  # a later launch of the attempt replaces it
                launch = found[attempt] = (t, [])
            if node not in launch[1]:
                launch[1].append(node)
        return {attempt: nodes for attempt, (_, nodes) in found.items()}

    def active_placements(self) -> list[tuple[int, Placement]]:
        """Every (job id, placement) not yet released."""
        return self._placements("released_at IS NULL", [])

    def _job_from_row(self, row: dict, placements: tuple[Placement, ...] | None = None) -> Job:
        if placements is None:
            placements = tuple(p for _, p in self._placements(f"job_id = ? AND {_HELD}", [row["id"]]))
        return Job(id=row["id"], user=row["user"], spec=spec_of(json.loads(row["spec"])),
                   submitted_at=row["submitted_at"], status=_status(row, placements),
                   attempt=row.get("attempt") or 0, workdir_used=row.get("workdir_used"),
                   pool=row.get("pool"),
                   preemptions=row.get("preemptions") or 0)

    # -------------------------------------------------------------- telemetry
    TELEMETRY_FIELDS = ("temperature_c", "utilization_pct", "memory_used_mb", "power_w",
                        "fan_pct", "sm_clock_mhz", "mem_clock_mhz")

    def record_telemetry(self, rows: list[dict]) -> None:
        """R18: one sample per GPU (``gpu``, ``t``, the TELEMETRY_FIELDS and ``span_s``, the
        seconds the sample stands for: what accounting weighs it by)."""
        if not rows:
            return
        columns = ("gpu", "t", *self.TELEMETRY_FIELDS, "span_s")
        with self.transaction():
            self.db.conn.executemany(
                f"INSERT INTO telemetry ({', '.join(columns)}, bucket_s) "
                f"VALUES ({', '.join('?' * len(columns))}, 0)",
                [tuple(row.get(c) for c in columns) for row in rows])

    def telemetry(self, gpu: str, since: float) -> list[dict]:
        columns = ("t", *self.TELEMETRY_FIELDS)
        rows = self.db.execute(
            f"SELECT {', '.join(columns)} FROM telemetry WHERE gpu = ? AND t >= ? ORDER BY t",
            [gpu, since]).fetchall()
        return [dict(zip(columns, r)) for r in rows]

    def compact_telemetry(self, now: float, raw_for_s: float = 86400, keep_for_s: float = 31 * 86400,
                          bucket_s: float = 600) -> None:
        """Retention: raw samples for a day, then 10-minute averages for a month."""
        cutoff = now - raw_for_s
        averages = ", ".join(f"AVG({f})" for f in self.TELEMETRY_FIELDS)
        with self.transaction():
            self.db.execute(
                f"INSERT INTO telemetry (gpu, t, {', '.join(self.TELEMETRY_FIELDS)}, bucket_s, span_s) "
                f"SELECT gpu, CAST(t / ? AS INTEGER) * ? + ? / 2, {averages}, ?, "
                "SUM(COALESCE(span_s, ?)) "
                "FROM telemetry WHERE t < ? AND bucket_s = 0 GROUP BY gpu, CAST(t / ? AS INTEGER)",
                [bucket_s, bucket_s, bucket_s, bucket_s, DEFAULT_SPAN_S, cutoff, bucket_s])
            self.db.execute("DELETE FROM telemetry WHERE t < ? AND bucket_s = 0", [cutoff])
            self.db.execute("DELETE FROM telemetry WHERE t < ?", [now - keep_for_s])

    # ------------------------------------------------------------------ users
    def users(self) -> list[dict]:
        return [dict(r) for r in self.db["users"].rows_where(order_by="name")]

    def set_quota(self, user: str, hours: float, by: str, t: float) -> None:
        with self.transaction():
            self._ensure_user(user, t)
            self.db.execute("UPDATE users SET quota_gpu_hours = ? WHERE name = ?", [hours, user])
            self._event(t, "admin", f"quota of {user} set to {hours:g} GPU-hours a month by {by}",
                        user=by)

    # --------------------------------------------------------------- bookings
    BOOKING_FIELDS = ("name", "cards", "users", "start", "end", "created_by", "created_at", "ended_at",
                      "broken")

    def add_booking(self, name: str, cards: list[tuple[str, str, int]], users: list[str], start: float,
                    end: float, by: str, t: float, message: str) -> None:
        """A new booking and its line (kind ``booking``), in one transaction; a name in use
        by a booking not yet over is refused (``ValueError``), an old one's row replaced."""
        with self.transaction():
            row = self.db.execute("SELECT end, ended_at FROM bookings WHERE name = ?", [name]).fetchone()
            if row is not None and (row[1] is None and row[0] > t):
                raise ValueError(f"a booking named {name} exists already; `nebula reservations` lists them")
            self.db.execute("DELETE FROM bookings WHERE name = ?", [name])
            self.db.execute(f"INSERT INTO bookings ({', '.join(self.BOOKING_FIELDS)}) "
                            "VALUES (?, ?, ?, ?, ?, ?, ?, NULL, NULL)",
                            [name, json.dumps(cards), json.dumps(users), start, end, by, t])
            self._event(t, "booking", message, user=by)

    def end_booking(self, name: str, by: str, t: float, message: str) -> None:
        """A booking ended early (``nebula reserve --delete``), with its line."""
        with self.transaction():
            self.db.execute("UPDATE bookings SET ended_at = ? WHERE name = ?", [t, name])
            self._event(t, "booking", message, user=by)

    def break_booking(self, name: str, why: str | None, t: float, message: str) -> None:
        """Why a booking can no longer be honoured (None: it can again), with its line."""
        with self.transaction():
            self.db.execute("UPDATE bookings SET broken = ? WHERE name = ?", [why, name])
            self._event(t, "booking", message)

    def bookings(self, since: float | None = None) -> list[dict]:
        """Bookings whose window (to its early end, if any) reaches past ``since`` (None: all),
        by start; ``cards`` and ``users`` as lists."""
        sql = f"SELECT {', '.join(self.BOOKING_FIELDS)} FROM bookings"
        params: list = []
        if since is not None:
            sql += " WHERE COALESCE(MIN(ended_at, end), end) > ?"
            params.append(since)
        found = []
        for row in self.db.execute(sql + " ORDER BY start, name", params):
            booking = dict(zip(self.BOOKING_FIELDS, row))
            booking["cards"] = [tuple(c) for c in json.loads(booking["cards"])]
            booking["users"] = json.loads(booking["users"])
            found.append(booking)
        return found

    def booked_use(self, uuids: list[str], users: list[str], since: float, until: float) -> float:
        """GPU-hours ``users``' jobs held on the cards ``uuids`` within [since, until) (a
        slice counts its share of the card): what a booking was used for."""
        if not uuids or not users:
            return 0.0
        rows = self.db.execute(
            "SELECT MAX(a.created_at, ?), MIN(COALESCE(a.released_at, ?), ?), "
            "CASE WHEN a.exclusive OR g.total_mb IS NULL OR g.total_mb = 0 THEN 1.0 "
            "ELSE MIN(1.0, CAST(a.memory_mb AS REAL) / g.total_mb) END "
            "FROM allocations a JOIN jobs j ON j.id = a.job_id LEFT JOIN gpus g ON g.uuid = a.gpu_uuid "
            f"WHERE a.gpu_uuid IN ({','.join('?' * len(uuids))}) AND j.user IN ({','.join('?' * len(users))}) "
            "AND a.created_at < ? AND (a.released_at IS NULL OR a.released_at > ?)",
            [since, until, until, *uuids, *users, until, since]).fetchall()
        return sum(max(0.0, end - begin) * share for begin, end, share in rows) / 3600

    # ------------------------------------------------------------- accounting
    def user_months(self, since: float, until: float) -> list[dict]:
        """Per user and calendar month (local time) of the jobs that ended in [since,
        until): how many, GPU-hours charged, sampled, busy and idle GPU-hours, and the
        sum and count of the waits of those that started."""
        rows = self.db.execute(
            "SELECT user, strftime('%Y-%m', ended_at, 'unixepoch', 'localtime') AS month, "
            "COUNT(*), SUM(gpu_hours), SUM(sampled_gpu_hours), SUM(busy_gpu_hours), "
            "SUM(idle_gpu_hours), SUM(started_at - submitted_at), COUNT(started_at) "
            "FROM jobs WHERE ended_at >= ? AND ended_at < ? GROUP BY user, month "
            "ORDER BY month, user", [since, until]).fetchall()
        keys = ("user", "month", "jobs", "gpu_hours", "sampled_gpu_hours", "busy_gpu_hours",
                "idle_gpu_hours", "wait_s_sum", "started")
        return [dict(zip(keys, r)) for r in rows]

    def held_between(self, since: float, until: float) -> list[tuple[str, float, float | None, float]]:
        """(node, from, to or None while held, share of a card) of every allocation held
        at some time in [since, until); a slice counts its share of the card (R7)."""
        return self.db.execute(
            "SELECT a.node, a.created_at, a.released_at, "
            "CASE WHEN a.exclusive OR g.total_mb IS NULL OR g.total_mb = 0 THEN 1.0 "
            "ELSE MIN(1.0, CAST(a.memory_mb AS REAL) / g.total_mb) END "
            "FROM allocations a LEFT JOIN gpus g ON g.uuid = a.gpu_uuid "
            "WHERE a.created_at < ? AND (a.released_at IS NULL OR a.released_at >= ?)",
            [until, since]).fetchall()

    #: Telemetry is summed per quarter hour (every time zone's offset is a multiple of it),
    #: and the caller puts each quarter in its local day: cheaper than a date per sample.
    QUARTER_S = 900

    def utilisation_by_quarter(self, since: float, until: float) -> list[tuple[str, float, float, float]]:
        """(node, start of the quarter hour, seconds sampled, busy seconds) of every node's
        cards in [since, until), from telemetry (a sample weighs its span)."""
        weight = f"COALESCE(t.span_s, NULLIF(t.bucket_s, 0), {DEFAULT_SPAN_S})"
        return self.db.execute(
            f"SELECT g.node, CAST(t.t / {self.QUARTER_S} AS INTEGER) * {self.QUARTER_S} AS q, "
            f"SUM({weight}), SUM({weight} * t.utilization_pct / 100.0) "
            "FROM telemetry t JOIN gpus g ON g.uuid = t.gpu "
            "WHERE t.t >= ? AND t.t < ? AND t.utilization_pct IS NOT NULL "
            "GROUP BY g.node, q", [since, until]).fetchall()

    def ended_counts(self) -> dict[str, int]:
        """How many jobs ended in each end state, ever."""
        finished = [s.value for s in JobState if s.finished]
        return dict(self.db.execute(
            f"SELECT state, COUNT(*) FROM jobs WHERE state IN ({','.join('?' * len(finished))}) "
            "GROUP BY state", finished).fetchall())

    def usage_since(self, since: float, preemptible: bool = True) -> dict[str, float]:
        """GPU-hours per user charged to jobs that ended since ``since`` or still hold or
        wait (a requeued job keeps what it was charged); without ``preemptible``, those of
        preemptible jobs left out (a quota they do not count against)."""
        rows = self.db.execute(
            "SELECT user, SUM(gpu_hours) FROM jobs WHERE (ended_at >= ? OR ended_at IS NULL) "
            f"{'' if preemptible else _NOT_PREEMPTIBLE}GROUP BY user", [since]).fetchall()
        return {user: hours or 0.0 for user, hours in rows}

    def finished_usage(self, since: float) -> dict[str, list[tuple[float, float]]]:
        """(ended_at, gpu_hours) of every job each user finished since ``since`` after it
        ran (R6): one cancelled while it waited, or failed because its --after job failed,
        used nothing and counts nothing."""
        found: dict[str, list[tuple[float, float]]] = {}
        for user, ended_at, hours in self.db.execute(
                f"SELECT user, ended_at, gpu_hours FROM jobs WHERE ended_at >= ? AND {COUNTED_SQL} "
                "ORDER BY ended_at", [since]):
            found.setdefault(user, []).append((ended_at, hours or 0.0))
        return found

    def counted_run(self, job_id: int) -> tuple[float, float] | None:
        """(ended_at, gpu_hours) of one job as ``finished_usage`` lists it, or None when it
        does not count (not finished, or finished without having run)."""
        row = self.db.execute(f"SELECT ended_at, gpu_hours FROM jobs WHERE id = ? AND {COUNTED_SQL}",
                              [job_id]).fetchone()
        return (row[0], row[1] or 0.0) if row else None

    def job_outcomes(self, job_ids: list[int]) -> dict[int, tuple[str, bool]]:
        """(state, whether it ever ran) of each of these jobs, for --after."""
        found: dict[int, tuple[str, bool]] = {}
        for chunk in chunks(job_ids, 500):
            for job_id, state, ran in self.db.execute(
                    f"SELECT id, state, started_at IS NOT NULL OR gpu_hours > 0 FROM jobs "
                    f"WHERE id IN ({','.join('?' * len(chunk))})", chunk):
                found[job_id] = (state, bool(ran))
        return found

    def job_states(self, job_ids: list[int]) -> dict[int, str]:
        found: dict[int, str] = {}
        for chunk in chunks(job_ids, 500):
            found.update(self.db.execute(
                f"SELECT id, state FROM jobs WHERE id IN ({','.join('?' * len(chunk))})", chunk).fetchall())
        return found

    # ----------------------------------------------------------------- events
    def add_event(self, t: float, kind: str, message: str, **refs) -> None:
        """A line of the events log on its own (a change with no other row to write)."""
        with self.transaction():
            self._event(t, kind, message, **refs)

    #: the events log keeps this long, and at most this many rows (the newest)
    EVENTS_KEEP_S = 90 * 86400.0
    EVENTS_KEEP_ROWS = 1_000_000

    def trim_events(self, now: float) -> int:
        """Retention of the events log: older than EVENTS_KEEP_S, or beyond the newest
        EVENTS_KEEP_ROWS, goes. Returns how many rows went."""
        with self.transaction():
            # Rows are added in time order: the scan from the oldest stops at the first to keep.
            first_kept = self.db.execute(
                "SELECT id FROM events WHERE t >= ? ORDER BY id LIMIT 1",
                [now - self.EVENTS_KEEP_S]).fetchone()
            gone = self.db.execute("DELETE FROM events WHERE id < ?",
                                   [first_kept[0] if first_kept else 1 << 62]).rowcount
            newest = self.db.execute("SELECT MAX(id) FROM events").fetchone()[0] or 0
            gone += self.db.execute("DELETE FROM events WHERE id <= ?",
                                    [newest - self.EVENTS_KEEP_ROWS]).rowcount
        return gone

    def events(self, limit: int = 50, *, kind: str | None = None, node: str | None = None,
               job_id: int | None = None, user: str | None = None,
               since: float | None = None) -> list[dict]:
        """The newest ``limit`` events that match, oldest first; ``user``'s are those they
        did and those of their jobs (a job's start or placement names no user)."""
        where, params = filters((("kind = ?", kind), ("node = ?", node), ("job_id = ?", job_id),
                                  ("(user = ? OR job_id IN (SELECT id FROM jobs WHERE user = ?))", user),
                                  ("t >= ?", since)))
        rows = self.db.execute(
            f"SELECT {', '.join(self.EVENT_FIELDS)} FROM events "
            f"{'WHERE ' + ' AND '.join(where) if where else ''} ORDER BY id DESC LIMIT ?",
            [*params, limit],
        ).fetchall()
        return [dict(zip(self.EVENT_FIELDS, r)) for r in reversed(rows)]


def spec_of(fields: dict) -> JobSpec:
    """A JobSpec from its JSON form (as stored, and as a launch record keeps it)."""
    fields = dict(fields)
    fields["command"] = tuple(fields["command"])
    fields["after"] = tuple(fields.get("after", ()))
    fields["data_mounts"] = tuple(fields.get("data_mounts", ()))
    return JobSpec(**fields)


def _status(row: dict, placements: tuple[Placement, ...]):
    """A job's status from its row and its allocations (held now, or held at its end)."""
    state = JobState(row["state"])
    if state == JobState.PENDING:
        return Pending(row["reason"] or "", row.get("held_by"))
    if state.finished:
        return Ended(state, row["ended_at"], row["exit_code"], row["reason"] or "",
                     row["started_at"], row["node"], placements)
    token = row.get("launch_token") or ""
    held = (Launching(placements, token=token) if state == JobState.LAUNCHING
            else Running(placements, row["started_at"], token=token))
    if row.get("cancel_by"):
        return Cancelling(held, row["cancel_by"], row.get("cancel_at") or row["submitted_at"])
    if row.get("stop_ends"):
        with contextlib.suppress(ValueError):
            return Stopping(held, JobState(row["stop_ends"]), row.get("stop_why") or "",
                            bool(row.get("stop_requeue")), row.get("stop_kill_at"))
    return held
