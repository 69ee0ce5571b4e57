"""The store's jobs: a job's life from submit to end, each step one transaction (held,
cancel asked, the head's stop, requeued, placed with its launch token, running, ended and
charged), and jobs read back as ``model.Job`` with their allocations.
"""

from __future__ import annotations

import contextlib
import json
import secrets
from dataclasses import replace

from ..model import (DEFAULT_CHARGE_REFERENCE_MB, WAITING_FOR_SCHEDULER, Cancelling, Ended, Job, JobSpec,
                     JobState, Launching, Pending, Placement, Running, Stopping, ended_text, spec_fields)
from .accounting import Accounting
from .base import StaleDecision, chunks, filters

#: what clears a job's stop under way (``Store.record_stop``)
_NO_STOP = "stop_ends = NULL, stop_why = NULL, stop_requeue = 0, stop_kill_at = NULL"
#: A job's allocations as ``Job.placements`` shows them: the cards it holds, or once it
#: ended, the cards it held at its end (released in the same transaction that ended it).
_HELD = "(a.released_at IS NULL OR a.released_at = (SELECT ended_at FROM jobs WHERE id = a.job_id))"


class Jobs(Accounting):
    """The ``jobs``, ``allocations`` and ``launches`` tables. A run's end charges it, so
    jobs build on accounting."""

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
            # last: a failed commit leaves a gap, never a reuse; not durable: its reservation
            # reaches the disk with the group commit's sync, off the head's loop
            self.ids.write(ids[-1], wait=durable)
        self._next_id = ids[-1] + 1
        # What was written, without reading it back (a submit's second query): a new job
        # is pending, attempt 0, exactly as ``job`` would read it.
        return [Job(id=job_id, user=user, spec=spec, submitted_at=t, status=Pending(WAITING_FOR_SCHEDULER))
                for job_id, spec in zip(ids, specs)]

    def make_scavenger(self, job: Job, charge: float, t: float) -> None:
        """A job of a user past their quota starts as preemptible work: its spec says so
        (it is preempted, and requeued, as one) and its hours are charged at ``charge``."""
        with self.transaction():
            self.db.execute("UPDATE jobs SET spec = ?, charge = ?, over_quota = 1 WHERE id = ?",
                            [json.dumps(spec_fields(job.spec)), charge, job.id])
            self._event(t, "quota", f"job {job.id} of {job.user} runs as preemptible work on idle "
                                    f"cards: its user is past their quota", job_id=job.id, user=job.user)

    def charge_in_full(self, job: Job, t: float, why: str) -> None:
        """A preemptible job that no longer runs as one (its pool's scavenger QOS or
        partition left behind): its spec says so and its hours are charged in full."""
        with self.transaction():
            self.db.execute("UPDATE jobs SET spec = ?, charge = 1.0 WHERE id = ?",
                            [json.dumps(spec_fields(job.spec)), job.id])
            self._event(t, "pool", why, job_id=job.id, user=job.user)

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

    def move_kill_at(self, job_id: int, kill_at: float) -> None:
        """A stop under way is killed at ``kill_at`` instead (its SIGUSR1 went late)."""
        with self.transaction():
            self.db.execute("UPDATE jobs SET stop_kill_at = ? WHERE id = ? AND stop_ends IS NOT NULL",
                            [kill_at, job_id])

    def clear_stop(self, job_id: int) -> None:
        """The stop was not heard (its nodes are away): the job runs on as it was."""
        with self.transaction():
            self.db.execute(f"UPDATE jobs SET {_NO_STOP} WHERE id = ?", [job_id])

    def requeue(self, job_id: int, reason: str, t: float,
                reference_mb: int = DEFAULT_CHARGE_REFERENCE_MB) -> float:
        """Back to pending, its allocation released (lost node, isolated GPU); returns the
        GPU-hours its run was charged (a slice against the ``reference_mb`` card)."""
        held = 0.0
        with self.transaction():
            row = self.db.execute("SELECT user, started_at FROM jobs WHERE id = ?", [job_id]).fetchone()
            if row is not None:  # the GPU time it held until now is still charged (R7)
                held = self._charge_run(job_id, row[1], t, reference_mb=reference_mb)
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

    def set_first_forecasts(self, forecasts: dict[int, tuple]) -> None:
        """Keep each waiting job's first start forecast (expected, early, late; Unix
        seconds or None): a job that has one keeps it."""
        if not forecasts:
            return
        with self.transaction():
            self.db.conn.executemany(
                "UPDATE jobs SET forecast_at = ?, forecast_early = ?, forecast_late = ? "
                "WHERE id = ? AND state = 'pending' AND forecast_at IS NULL",
                [(*values, job_id) for job_id, values in forecasts.items()])

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
                # (an older attempt's end, told first by its node, is not this one's)
                "UPDATE jobs SET state = 'running', node = ?, reason = '', started_at = ?, "
                "ended_at = NULL, exit_code = NULL, "
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
                   reason: str = "", ended_at: float | None = None,
                   gpus: int | None = None,
                   reference_mb: int = DEFAULT_CHARGE_REFERENCE_MB) -> float | None:
        """End a job, release its GPUs and charge its user, in one transaction; returns the
        GPU-hours charged now (None: no such job, or it had ended already). ``ended_at``:
        when it ended, if not at ``t`` (a pool's job, as the pool says); the line is at ``t``.
        ``gpus``: its allocation's cards as the pool's accounting says (charged, not asked).
        ``reference_mb``: the card a slice is charged against (``scheduler.charge_reference``)."""
        end = t if ended_at is None else ended_at
        with self.transaction():
            row = self.db.execute(
                "SELECT user, started_at, state FROM jobs WHERE id = ?", [job_id]
            ).fetchone()
            if row is None or JobState(row[2]).finished:
                return None
            user, started_at, _ = row
            gpu_hours = self._charge_run(job_id, started_at, end, gpus, reference_mb)
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
            message = f"job {job_id} {ended_text(state.value, reason, detail)}"
            self._event(t, "end", message, job_id=job_id, user=user)
        return gpu_hours

    # ----------------------------------------------------------- read back
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

    def held_spans(self) -> dict[int, list[tuple[str, float, float | None]]]:
        """Job -> (gpu uuid, allocated at, released at; None: held now) of every card of
        every launch it had (a month's replay: the runs a preemption ended count too)."""
        found: dict[int, list[tuple[str, float, float | None]]] = {}
        for job_id, uuid, since, until in self.db.execute(
                "SELECT job_id, gpu_uuid, created_at, released_at FROM allocations ORDER BY id"):
            found.setdefault(job_id, []).append((uuid, since, until))
        return found

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


def spec_of(fields: dict) -> JobSpec:
    """A JobSpec from its JSON form (as stored, and as a launch record keeps it)."""
    fields = dict(fields)
    fields["command"] = tuple(fields["command"])
    fields["after"] = tuple(fields.get("after", ()))
    fields["data_mounts"] = tuple(fields.get("data_mounts", ()))
    for key in ("nodelist", "exclude"):
        fields[key] = tuple(fields.get(key, ()))
    fields["export_env"] = tuple(tuple(pair) for pair in fields.get("export_env", ()))
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
