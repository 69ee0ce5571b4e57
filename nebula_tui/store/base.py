"""The store's database: opened (or refused), one transaction per change, its events line.

SQLite in WAL mode through sqlite-utils. Every state change is one ``BEGIN IMMEDIATE``
transaction; a submit is committed with ``synchronous=FULL`` so an acknowledged job id
survives even a crash of the machine. Only the head service (``nebula serve``) opens the
store for writing.

A change writes its line of the events log in the same transaction, at the time the caller
gives (the head's clock); once committed, each line goes to ``on_event`` (the head's
stream publishes it), so what subscribers see and what ``events`` returns are the same.

The job ids and the head's id this module keeps with the database are ``ids.py``'s; every
part of the ``Store`` (the package's ``__init__``) builds on ``StoreBase``.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import sqlite3
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import sqlite_utils

from .. import release
from ..model import Placement
from ..wire import EventRow
from .ids import IdFloor, read_head_id, write_head_id
from .schema import create_tables

#: a head marks itself alive in its store this often (seconds): a job its nodes say ended
#: while no head heard them is charged from that mark at the earliest (``head/jobs.py``)
ALIVE_EVERY_S = 30.0


class StaleDecision(Exception):
    """A scheduling decision about a job that changed meanwhile (e.g. cancelled)."""


class DatabaseDamaged(Exception):
    """The database cannot be opened as this home's: missing, emptied, not readable as
    SQLite, or another head's. ``str()`` names the file and what is wrong in one sentence;
    the caller adds the way out (a backup to restore)."""


class StoreUnavailable(Exception):
    """A change could not be written (the disk is full, or failing): nothing of it was.
    ``str()`` is one sentence for users, naming the database and what is wrong."""


class DatabaseNewer(StoreUnavailable):
    """The database was written by a newer release than the one running: an older one
    must not change it (its tables may mean what this release does not know)."""


def _why(err: BaseException) -> str:
    text = str(err)
    if "full" in text or getattr(err, "errno", None) == 28:
        return "the disk is full"
    if "I/O" in text or isinstance(err, OSError):
        return f"the disk failed ({text})"
    if "locked" in text or "busy" in text:
        return "it is locked by another program"
    return text


class StoreBase:
    """The database under every part of the store: opening it, its transactions, the meta
    rows, the id counter, its events lines, and the care of the file (backups, checks,
    restores)."""

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
        self.on_event: Callable[[EventRow], None] | None = None
        self._written: list[dict] = []  # lines of the transaction under way
        self.alive_before: float | None = None
        self._alive_marked: float | None = None  # when this head last wrote its mark
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
            self._refuse_a_newer_release()
            self._create_schema(had)
            self._next_id = self._first_free_id()
            #: the last sign of life of the head that wrote this file before this open
            #: (``mark_alive``), or None: jobs it knew ran until then at least
            self.alive_before = float(self._meta("alive_at") or 0) or None
        except sqlite3.DatabaseError as err:
            if isinstance(err, sqlite3.OperationalError):
                raise  # locked, or the disk failed: not the file's content
            raise DatabaseDamaged(f"{self.path} cannot be read as a database ({err})") from None
        if had is None:
            try:
                write_head_id(self.path, self.head_token)
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

    def mark_alive(self, t: float) -> None:
        """The head is alive at ``t``, and what it knows holds till then: the next head to
        open the file (after a crash, or from a backup) reads it as ``alive_before``. Written
        at most every ALIVE_EVERY_S; a store that cannot take it now leaves the older mark."""
        if self._alive_marked is not None and 0 <= t - self._alive_marked < ALIVE_EVERY_S:
            return
        try:
            with self.transaction():
                self._set_meta("alive_at", repr(t))
        except StoreUnavailable:
            return  # a full disk: said by what must be written
        self._alive_marked = t

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

    def _refuse_a_newer_release(self) -> None:
        written = self._meta("release") if "meta" in self.db.table_names() else None
        mine = release.running()
        if written and release.newer(mine, written):
            raise DatabaseNewer(
                f"{self.path} was written by NebulaGrid {written}, newer than this one "
                f"({mine}): install {written} or later again, or restore a backup this "
                f"release made (nebula backup --list)")

    def _create_schema(self, head: str | None = None) -> None:
        """The tables (those missing); a new database's head id is ``head`` when given; the
        release that opens it for writing is noted (an older one then refuses it)."""
        with self.transaction():
            create_tables(self.db)
            if not self._meta("head_token"):
                self.db["meta"].insert({"key": "head_token", "value": head or uuid.uuid4().hex[:12]},
                                       replace=True)
            if release.running() != "unknown":
                self._set_meta("release", release.running())

    def _meta(self, key: str) -> str | None:
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", [key]).fetchone()
        return row[0] if row else None

    @property
    def head_token(self) -> str:
        """A random id of this store; tells this head's job directories from older ones."""
        return self._meta("head_token") or ""

    def pool_key(self) -> bytes:
        """This store's secret for the tokens its pool jobs carry (made at first use, kept
        with the store and its backups, never sent anywhere): a token whose mark it makes is
        one this head issued, which nobody on a cluster can forge (``head/pool_books.py``)."""
        key = self._meta("pool_key")
        if not key:
            key = secrets.token_hex(32)
            with self.transaction(durable=True):
                self._set_meta("pool_key", key)
        return key.encode()

    def sync_to_disk(self) -> None:
        """Wait until every transaction committed so far is on the disk, as a durable one's
        commit waits (it syncs the WAL): the head's group commit calls it from a thread, once
        for all the submits committed meanwhile. A commit already checkpointed into the
        database was synced by the checkpoint. The id file's latest reservation goes first
        (``IdFloor.sync``): an answered id is never handed out again after a crash of the
        machine. ``StoreUnavailable`` when the disk fails."""
        try:
            self.ids.sync()
        except OSError as err:
            raise self._unavailable(err, "the jobs just submitted may be lost if the machine "
                                    "crashes now") from err
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

    def _allocate(self, job_id: int, placements: tuple[Placement, ...], t: float) -> None:
        """The cards a launch holds from ``t`` (a launch here, adopted, or a pool's)."""
        self.db.conn.executemany(
            "INSERT INTO allocations (job_id, gpu_uuid, node, gpu_index, memory_mb, "
            "exclusive, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
            [(job_id, p.gpu_uuid, p.node, p.gpu_index, p.memory_mb, int(p.exclusive), t)
             for p in placements])

    def _ensure_user(self, user: str, t: float) -> None:
        """The user's row, made with their first job (or quota)."""
        self.db.execute(
            "INSERT OR IGNORE INTO users (name, jobs_finished, gpu_hours, created_at) "
            "VALUES (?, 0, 0.0, ?)", [user, t])

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
            self._set_late([])  # every node is waited for again
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

    def restore_done(self, late: Iterable[str] = ()) -> None:
        """Scheduling goes on; ``late``: the nodes it went on without (``restore_late``)."""
        late = sorted(late)
        with self.transaction():
            self.db.execute("DELETE FROM meta WHERE key = 'restore_pending'")
            self._set_late(late)
            self._event(time.time(), "store", "every node has told what ran since the backup; "
                        "scheduling goes on" if not late else
                        f"{', '.join(late)} did not tell what ran since the backup within a node "
                        "lease; scheduling goes on, and each is asked when it is back")

    @property
    def restore_late(self) -> set[str]:
        """The nodes a restored store went on scheduling without: not yet asked what they ran
        since the backup (each is, when it is back; their cards take no new work till then)."""
        value = self._meta("restore_late")
        return set(value.split(",")) if value else set()

    def restore_late_told(self, node: str) -> None:
        with self.transaction():
            self._set_late(sorted(self.restore_late - {node}))

    def _set_late(self, late: list[str]) -> None:
        if late:
            self._set_meta("restore_late", ",".join(late))
        else:
            self.db.execute("DELETE FROM meta WHERE key = 'restore_late'")

    #: an events line's fields, in the table's order
    EVENT_FIELDS = ("t", "kind", "message", "job_id", "node", "gpu", "user")

    def _event(self, t: float, kind: str, message: str, job_id: int | None = None,
               node: str | None = None, gpu: str | None = None, user: str | None = None) -> None:
        """A line of the events log, in the transaction under way; ``on_event`` hears it
        once that commits."""
        row = (t, kind, message, job_id, node, gpu, user)
        self.db.execute(f"INSERT INTO events ({', '.join(self.EVENT_FIELDS)}) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?)", row)
        self._written.append(dict(zip(self.EVENT_FIELDS, row)))


def filters(pairs) -> tuple[list[str], list]:
    """The clauses of the (clause, value) ``pairs`` whose value is given, and those values,
    one for each ``?`` of its clause (a filter left out, None, matches everything)."""
    given = [(clause, value) for clause, value in pairs if value is not None]
    return [clause for clause, _ in given], [v for clause, value in given for v in [value] * clause.count("?")]


def chunks(items: list, size: int):
    """``items`` in lists of at most ``size`` (SQLite's limit on a query's ``?``)."""
    for start in range(0, len(items), size):
        yield items[start:start + size]
