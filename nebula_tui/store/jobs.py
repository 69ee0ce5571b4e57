"""The store: the only module that speaks SQL. SQLite in WAL mode through sqlite-utils.

Every state change is one ``BEGIN IMMEDIATE`` transaction; a submit is committed with
``synchronous=FULL`` so an acknowledged job id survives even a crash of the machine. Only the head
service (``nebula serve``) opens the store for writing.

A change writes its line of the events log in the same transaction, at the time the caller
gives (the head's clock); once committed, each line goes to ``on_event`` (the head's
stream publishes it), so what subscribers see and what ``events`` returns are the same.

Job ids are never handed out twice, even when the database goes back in time (restored from
a backup, or its WAL deleted after a crash): besides the database, the highest id ever
handed out is kept in a file of its own next to it (``job-ids``, written and fsync'd before
a submit commits), and new ids continue above both. Ids stay short numbers users can type;
a job's launches are told apart on the nodes by a launch token that also holds a random
nonce (``launch_token``), so even a collision there is refused, never adopted.

A home that had a database never starts over an empty one without a word: the head's id
(``head_token``, which names its job directories on the nodes) is also kept in a file beside
the database (``<db>.head-id``), so a database that went missing, was emptied or cannot be
read is refused (``DatabaseDamaged``), and one of another head is refused too. Only an
explicit ``start_over`` (``nebula backup --start-empty``) makes an empty one, with that id,
so the nodes' job directories stay this head's and their jobs are taken in again.

Why one module: it is the only one that speaks SQL, so every query of the project and
the schema they share are here.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import sqlite3
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import sqlite_utils

from ..model import (WAITING_FOR_SCHEDULER, Cancelling, Ended, Job, JobSpec, JobState, Launching,
                     Pending, Placement, Running, Stopping, spec_fields)

FINISHED_SQL = ", ".join(f"'{s.value}'" for s in JobState if s.finished)
#: A job that counts towards its user's fair share (R6): finished after it ran (one
#: cancelled while it waited, or failed because its --after job failed, used nothing).
COUNTED_SQL = f"state IN ({FINISHED_SQL}) AND (started_at IS NOT NULL OR gpu_hours > 0)"
#: For accounting, a card below this utilisation is idle (its GPU-hours are "held idle").
IDLE_UTIL_PCT = 5.0
#: The seconds a telemetry row stands for when it does not say (rows from before ``span_s``).
DEFAULT_SPAN_S = 30.0


#: A job's allocations as ``Job.placements`` shows them: the cards it holds, or once it
#: ended, the cards it held at its end (released in the same transaction that ended it).
#: what clears a job's stop under way (``Store.record_stop``)
_NO_STOP = "stop_ends = NULL, stop_why = NULL, stop_requeue = 0, stop_kill_at = NULL"
#: jobs submitted without --preemptible (the spec is the job's JSON)
_NOT_PREEMPTIBLE = "AND NOT COALESCE(json_extract(spec, '$.preemptible'), 0) "
_HELD = "(a.released_at IS NULL OR a.released_at = (SELECT ended_at FROM jobs WHERE id = a.job_id))"


class StaleDecision(Exception):
    """A scheduling decision about a job that changed meanwhile (e.g. cancelled)."""


class DatabaseDamaged(Exception):
    """The database cannot be opened as this home's: missing, emptied, not readable as
    SQLite, or another head's. ``str()`` names the file and what is wrong in one sentence;
    the caller adds the way out (a backup to restore)."""


class StoreUnavailable(Exception):
    """A change could not be written (the disk is full, or failing): nothing of it was.
    ``str()`` is one sentence for users, naming the database and what is wrong."""


def _why(err: BaseException) -> str:
    text = str(err)
    if "full" in text or getattr(err, "errno", None) == 28:
        return "the disk is full"
    if "I/O" in text or isinstance(err, OSError):
        return f"the disk failed ({text})"
    if "locked" in text or "busy" in text:
        return "it is locked by another program"
    return text


class IdFloor:
    """The highest job id ever handed out, in a small file beside the database.

    Each submit rewrites it in place before its commit (one short write, no new disk blocks:
    a full disk cannot stop it once it exists), so it is never behind what a client was
    told. A crash of the head leaves that write in the kernel's cache; a crash of the machine
    may not, so every ``BLOCK`` ids a reservation above them is also forced to the disk, and
    a file last written before the machine's latest boot is read as that reservation.
    Backups of the database should leave this file out.
    """

    BLOCK = 64

    def __init__(self, path: Path):
        self.path = path
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        self._file = os.fdopen(fd, "r+b", buffering=0)
        self._boot = _boot_id()
        fields = self._file.read(200).decode("ascii", "replace").split()
        exact, reserved = (int(f) if f.isdigit() else 0 for f in (fields + ["", ""])[:2])
        same_boot = self._boot and fields[2:3] == [self._boot]
        self.value = exact if same_boot else max(exact, reserved)
        self._reserved = max(exact, reserved)
        self.write(self.value)

    def write(self, value: int) -> None:
        sync = value >= self._reserved
        if sync:
            self._reserved = value + self.BLOCK
        line = f"{value} {self._reserved} {self._boot or '-'}"
        os.pwrite(self._file.fileno(), f"{line:<120}\n".encode(), 0)
        if sync:
            os.fdatasync(self._file.fileno())
        self.value = value

    def close(self) -> None:
        self._file.close()


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def head_id_file(db: Path) -> Path:
    """Beside the database: the id of the head whose database it is (see the module's doc)."""
    return db.with_name(db.name + ".head-id")


def read_head_id(db: Path) -> str | None:
    try:
        text = head_id_file(db).read_text(encoding="ascii", errors="replace").strip()
    except FileNotFoundError:
        return None
    return text or None


def _write_head_id(db: Path, head: str) -> None:
    """Written once, when the database is made (or first opened by a version that keeps
    it): through a temporary file, synced, so it is whole or absent."""
    final = head_id_file(db)
    temporary = final.with_name(final.name + ".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, f"{head}\n".encode("ascii"))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, final)


class Store:
    """Durable state of the cluster: nodes, GPUs, jobs, allocations, users, events."""

    def __init__(self, path: str | Path, readonly: bool = False, start_over: bool = False):
        """``readonly``: a second connection that only reads (WAL lets it read while the
        head writes), for long queries the head runs in a thread of their own.
        ``start_over``: make an empty database where this home's is missing or empty, with
        the head's id kept beside it (an admin's explicit recovery); without it, a home that
        had a database refuses to start over (``DatabaseDamaged``)."""
        self.path = Path(path)
        had = None if readonly else self._refuse_a_lost_database(start_over)
        # The id file is the writer's alone (a reader never hands out an id).
        self.ids = None if readonly else IdFloor(self.path.with_name("job-ids"))
        try:
            self._open(readonly, had, start_over)
        except BaseException:
            self.close()
            raise

    def _refuse_a_lost_database(self, start_over: bool) -> str | None:
        """The head id this home's database had (None: it never had one), after checking
        that the file is still there to open: SQLite would take a missing or empty file
        for a new database."""
        had = read_head_id(self.path)
        if had is None:
            return None
        size = self.path.stat().st_size if self.path.exists() else None
        if start_over:
            if size:
                raise DatabaseDamaged(f"{self.path} is not empty: set it aside before starting "
                                      "over")
            return had
        if size is None:
            raise DatabaseDamaged(f"{self.path} is missing, but this home had a database "
                                  f"(head {had})")
        if size == 0:
            raise DatabaseDamaged(f"{self.path} is empty (0 bytes), but this home had a "
                                  f"database (head {had})")
        return had

    def _open(self, readonly: bool, had: str | None, start_over: bool) -> None:
        if readonly:
            conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=30,
                                   isolation_level=None)
        else:
            conn = sqlite3.connect(str(self.path), timeout=30, isolation_level=None)
        self.db = sqlite_utils.Database(conn)
        self._columns: list[str] | None = None
        #: told every events-log line once its transaction committed (the head publishes them)
        self.on_event: Callable[[dict], None] | None = None
        self._written: list[dict] = []  # lines of the transaction under way
        try:
            self.db.execute("PRAGMA busy_timeout=30000")
            if readonly:
                self.db.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
                return
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.execute("PRAGMA foreign_keys=ON")
            found = self._meta("head_token") if "meta" in self.db.table_names() else None
            if had and found != had and not (start_over and found is None):
                raise DatabaseDamaged(
                    f"{self.path} has no head id: it is not the database this home had (head "
                    f"{had})" if found is None else f"{self.path} is another head's database "
                    f"(head {found}; this home's is {had})")
            self._create_schema(had)
            self._next_id = self._first_free_id()
        except sqlite3.DatabaseError as err:
            if isinstance(err, sqlite3.OperationalError):
                raise  # locked, or the disk failed: not the file's content
            raise DatabaseDamaged(f"{self.path} cannot be read as a database ({err})") from None
        if had is None:
            try:
                _write_head_id(self.path, self.head_token)
            except OSError as err:
                raise self._unavailable(err, "the head cannot start") from None

    def close(self) -> None:
        if getattr(self, "db", None) is not None:
            self.db.close()
        if getattr(self, "ids", None) is not None:
            self.ids.close()

    def _first_free_id(self) -> int:
        """Above every id the database, its own record and the id file know of. When the
        file is ahead of the database, the database lost jobs (restored from a backup, or
        its WAL deleted): that is said in the events, and ``lost_ids`` names them."""
        newest = self.db.execute("SELECT MAX(id) FROM jobs").fetchone()[0] or 0
        recorded = max(newest, int(self._meta("job_id_floor") or 0))
        self.lost_ids = range(recorded + 1, self.ids.value + 1)
        if self.lost_ids:
            with self.transaction():
                self._set_meta("restore_pending", "1")
                self._event(time.time(), "store", f"the database knows jobs up to {recorded}, but "
                            f"ids up to {self.ids.value} were handed out (restored from a backup, "
                            f"or its WAL lost?); new jobs start at {self.ids.value + 1}, and "
                            "nothing is scheduled until every node has told what ran meanwhile")
        return max(recorded, self.ids.value) + 1

    def raise_id_floor(self, job_id: int) -> None:
        """A node reports a job of this store with this id (a whole home restored, id file
        and all): never hand it out again."""
        if job_id >= self._next_id:
            with self.transaction():
                self._set_meta("job_id_floor", str(job_id))
                self.ids.write(max(self.ids.value, job_id))
                self._event(time.time(), "store", f"a node knows job {job_id} of this store, "
                            f"which the database does not; new jobs start at {job_id + 1}")
            self._next_id = job_id + 1

    def _set_meta(self, key: str, value: str) -> None:
        self.db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", [key, value])

    @contextlib.contextmanager
    def transaction(self, durable: bool = False) -> Iterator[sqlite_utils.Database]:
        """One state change: all of it is written, or none of it.

        In WAL mode every commit survives a crash of the head process. ``durable`` also
        waits for the disk (fsync), so it survives a crash of the machine: used for what a
        client was told (a submit's job id), not for the many transitions after it.
        """
        try:
            if durable:
                self.db.execute("PRAGMA synchronous=FULL")
            try:
                self.db.execute("BEGIN IMMEDIATE")
                try:
                    yield self.db
                except BaseException:
                    with contextlib.suppress(sqlite3.Error):
                        self.db.execute("ROLLBACK")
                    raise
                self.db.execute("COMMIT")
            finally:
                if durable:
                    self.db.execute("PRAGMA synchronous=NORMAL")
        except (sqlite3.OperationalError, OSError) as err:
            self._written = []
            with contextlib.suppress(sqlite3.Error):
                if self.db.conn.in_transaction:  # a failed COMMIT leaves it open
                    self.db.execute("ROLLBACK")
            raise self._unavailable(err) from err
        except BaseException:
            self._written = []  # rolled back: none of its lines happened
            raise
        written, self._written = self._written, []
        if self.on_event is not None:
            for event in written:
                self.on_event(event)

    # ----------------------------------------------------------------- schema
    def _create_schema(self, head: str | None = None) -> None:
        """The tables (those missing); a new database's head id is ``head`` when given."""
        db = self.db
        with self.transaction():
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
            db["telemetry"].create(
                {"gpu": str, "t": float, "temperature_c": float, "utilization_pct": float,
                 "memory_used_mb": float, "power_w": float, "fan_pct": float,
                 "sm_clock_mhz": float, "mem_clock_mhz": float, "bucket_s": float},
                if_not_exists=True,
            )
            self._add_missing_columns()
            db["telemetry"].create_index(["gpu", "t"], if_not_exists=True)
            db["jobs"].create_index(["state"], if_not_exists=True)
            db["allocations"].create_index(["released_at"], if_not_exists=True)
            db["allocations"].create_index(["job_id"], if_not_exists=True)
            db["launches"].create_index(["job_id"], if_not_exists=True)
            db["jobs"].create_index(["ended_at"], if_not_exists=True)
            if not self._meta("head_token"):
                db["meta"].insert({"key": "head_token", "value": head or uuid.uuid4().hex[:12]},
                                  replace=True)

    # Columns added after the first release of a table: (table, column, type, default).
    _LATER_COLUMNS = (
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
    )

    def _add_missing_columns(self) -> None:
        for table, column, kind, default in self._LATER_COLUMNS:
            if column not in self.db[table].columns_dict:
                self.db[table].add_column(column, kind, not_null_default=default)

    def _meta(self, key: str) -> str | None:
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", [key]).fetchone()
        return row[0] if row else None

    @property
    def head_token(self) -> str:
        """A random id of this store; tells this head's job directories from older ones."""
        return self._meta("head_token") or ""

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

    def sync_to_disk(self) -> None:
        """Wait until every transaction committed so far is on the disk, as a durable one's
        commit waits (it syncs the WAL): the head's group commit calls it from a thread, once
        for all the submits committed meanwhile. A commit already checkpointed into the
        database was synced by the checkpoint. ``StoreUnavailable`` when the disk fails."""
        for path in (self.path.with_name(self.path.name + "-wal"), self.path):
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                continue  # no WAL (yet): nothing is committed but in the database
            except OSError as err:
                raise self._unavailable(err) from err
            try:
                os.fsync(fd)
                return
            except OSError as err:
                raise self._unavailable(err, "the jobs just submitted may be lost if the machine "
                                        "crashes now") from err
            finally:
                os.close(fd)

    def _unavailable(self, err: BaseException, kept: str = "nothing of this change was kept"
                     ) -> StoreUnavailable:
        return StoreUnavailable(f"the head could not write its database ({self.path}): "
                                f"{_why(err)}; {kept}")

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

    def _ensure_user(self, user: str, t: float) -> None:
        self.db.execute(
            "INSERT OR IGNORE INTO users (name, jobs_finished, gpu_hours, created_at) "
            "VALUES (?, 0, 0.0, ?)", [user, t])

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
            self.db.conn.executemany(
                "INSERT INTO allocations (job_id, gpu_uuid, node, gpu_index, memory_mb, "
                "exclusive, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                [(job_id, p.gpu_uuid, p.node, p.gpu_index, p.memory_mb, int(p.exclusive), t)
                 for p in placements])
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
            self.db.conn.executemany(
                "INSERT INTO allocations (job_id, gpu_uuid, node, gpu_index, memory_mb, "
                "exclusive, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                [(job.id, p.gpu_uuid, p.node, p.gpu_index, p.memory_mb, int(p.exclusive), t)
                 for p in placements])
            self.db.execute("INSERT OR IGNORE INTO launches (token, job_id, attempt, t) "
                            "VALUES (?, ?, ?, ?)", [token, job.id, job.attempt, t])
            self._event(t, "reconcile", f"job {job.id} ran on {node} after the backup this "
                        "database was restored from: taken in again", job_id=job.id, node=node)
            if job.id >= self._next_id:
                self._set_meta("job_id_floor", str(job.id))
                self.ids.write(max(self.ids.value, job.id))
        self._next_id = max(self._next_id, job.id + 1)

    @property
    def restore_pending(self) -> bool:
        """The database was found older than its id file, and not every node has yet told
        what ran since (``restore_done`` clears it): the head schedules nothing till then."""
        return self._meta("restore_pending") == "1"

    def mark_restored(self, source: str) -> None:
        """An admin put this database in place (a backup, or an empty one): nothing is
        scheduled until every node has told what it ran meanwhile, which is taken in
        (``restore_pending``), so no job the database knew as waiting, or not at all, runs
        a second time."""
        with self.transaction():
            self._set_meta("restore_pending", "1")
            self._event(time.time(), "store", f"the database was restored from {source}; "
                        "nothing is scheduled until every node has told what ran since")

    def backup_to(self, target: Path) -> None:
        """A copy of the database as it is now, whole, at ``target`` (a new file, in one
        piece: no WAL beside it), by SQLite's online backup: the head's writes go on."""
        copy = sqlite3.connect(str(target), isolation_level=None)
        try:
            self.db.conn.backup(copy)
            copy.execute("PRAGMA journal_mode=DELETE")
        finally:
            copy.close()

    def check(self) -> None:
        """``DatabaseDamaged`` unless SQLite's quick check finds every page sound (it reads
        the whole file: a second or so per 100 MB)."""
        try:
            found = self.db.execute("PRAGMA quick_check(1)").fetchone()
        except sqlite3.DatabaseError as err:
            found = (str(err),)
        if found != ("ok",):
            raise DatabaseDamaged(f"{self.path} is damaged ({found[0]})")

    def damage(self, err: BaseException) -> DatabaseDamaged | None:
        """What ``err``, raised by a read of the store, says of its file: a page that cannot
        be read (``DatabaseDamaged``), or None (anything else: a lock, a failing disk)."""
        if isinstance(err, sqlite3.DatabaseError) and not isinstance(err, sqlite3.OperationalError):
            return DatabaseDamaged(f"{self.path} cannot be read ({err})")
        return None

    def summary(self) -> dict:
        """What a backup holds, to choose one: its head's id and its jobs."""
        states = dict(self.db.execute("SELECT state, COUNT(*) FROM jobs GROUP BY state").fetchall())
        return {"head": self.head_token, "jobs": sum(states.values()),
                "newest_job": self.db.execute("SELECT MAX(id) FROM jobs").fetchone()[0],
                "running": states.get("running", 0), "waiting": states.get("pending", 0)}

    def restore_done(self) -> None:
        with self.transaction():
            self.db.execute("DELETE FROM meta WHERE key = 'restore_pending'")
            self._event(time.time(), "store", "every node has told what ran since the backup; "
                        "scheduling goes on")

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
            self.db.conn.executemany(
                "INSERT INTO allocations (job_id, gpu_uuid, node, gpu_index, memory_mb, "
                "exclusive, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                [(job_id, p.gpu_uuid, p.node, p.gpu_index, p.memory_mb, int(p.exclusive), t)
                 for p in placements])
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
        where, params = _filters((("user = ?", user), ("ended_at >= ?", since),
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
        for chunk in _chunks(job_ids, 500):
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
        for chunk in _chunks(job_ids, 500):
            for job_id, state, ran in self.db.execute(
                    f"SELECT id, state, started_at IS NOT NULL OR gpu_hours > 0 FROM jobs "
                    f"WHERE id IN ({','.join('?' * len(chunk))})", chunk):
                found[job_id] = (state, bool(ran))
        return found

    def job_states(self, job_ids: list[int]) -> dict[int, str]:
        found: dict[int, str] = {}
        for chunk in _chunks(job_ids, 500):
            found.update(self.db.execute(
                f"SELECT id, state FROM jobs WHERE id IN ({','.join('?' * len(chunk))})", chunk).fetchall())
        return found

    # ----------------------------------------------------------------- events
    EVENT_FIELDS = ("t", "kind", "message", "job_id", "node", "gpu", "user")

    def add_event(self, t: float, kind: str, message: str, **refs) -> None:
        """A line of the events log on its own (a change with no other row to write)."""
        with self.transaction():
            self._event(t, kind, message, **refs)

    def _event(self, t: float, kind: str, message: str, job_id: int | None = None,
               node: str | None = None, gpu: str | None = None, user: str | None = None) -> None:
        row = (t, kind, message, job_id, node, gpu, user)
        self.db.execute(f"INSERT INTO events ({', '.join(self.EVENT_FIELDS)}) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?)", row)
        self._written.append(dict(zip(self.EVENT_FIELDS, row)))

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
        where, params = _filters((("kind = ?", kind), ("node = ?", node), ("job_id = ?", job_id),
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


def _filters(pairs) -> tuple[list[str], list]:
    """The clauses of the (clause, value) ``pairs`` whose value is given, and those values,
    one for each ``?`` of its clause (a filter left out, None, matches everything)."""
    given = [(clause, value) for clause, value in pairs if value is not None]
    return [clause for clause, _ in given], [v for clause, value in given for v in [value] * clause.count("?")]


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


def _chunks(items: list, size: int):
    for start in range(0, len(items), size):
        yield items[start:start + size]
