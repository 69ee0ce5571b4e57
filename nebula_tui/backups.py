"""Backups of the head's database, kept beside it, and the two ways back from a lost one.

A backup is a whole copy made by SQLite's online backup (``Store.backup_to``) while the head
runs, checked page by page before it counts, in ``<home>/backups/state-<UTC time>.db``;
the newest ``KEEP`` are kept. The head makes one when the newest is ``EVERY_S`` old (so at
its first start too) and one at each clean stop; ``nebula backup`` makes one now.

With the head stopped, ``restore`` puts a backup in place and ``start_empty`` an empty
database with the head's id; either way the database set aside is kept (renamed, never
deleted), and the store is marked restored: the head schedules nothing until every node
has told what it ran since (``Store.mark_restored``), and takes those jobs in, so a job the
backup knew as waiting, or not at all, never runs twice. What a lost database loses is
docs/survival.md's.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .store import DatabaseDamaged, Store, head_id_file, read_head_id

#: backups kept (the oldest goes when a new one is made)
KEEP = 5
#: the head makes a backup when its newest is this old
EVERY_S = 3600.0
PREFIX, SUFFIX = "state-", ".db"


#: files of the home the head writes besides the database (with its -wal and -shm)
HEAD_FILES = ("job-ids",)


class BackupError(Exception):
    """A backup could not be made, found or put in place; ``str()`` is one sentence."""


@dataclass(frozen=True)
class Backup:
    path: Path
    taken_at: float  # the file's modification time: when its copy was finished
    size: int

    @property
    def name(self) -> str:
        return self.path.name


class Backups:
    """The backups of the database at ``db`` (``<its folder>/backups``)."""

    def __init__(self, db: Path, keep: int = KEEP):
        self.db = Path(db)
        self.folder = self.db.parent / "backups"
        self.keep = keep

    # ------------------------------------------------------------ whose files
    def _give_back(self, *paths: Path) -> None:
        """Make ``paths`` the home's owner's (the service account's) when root made them:
        a backup made or restored as root must stay the head's to open."""
        if os.geteuid() != 0:
            return
        try:
            home = self.db.parent.stat()
        except OSError:
            return
        for path in paths:
            with contextlib.suppress(FileNotFoundError):
                if path.lstat().st_uid != home.st_uid or path.lstat().st_gid != home.st_gid:
                    os.chown(path, home.st_uid, home.st_gid, follow_symlinks=False)

    def _head_files(self) -> list[Path]:
        """The database, its WAL and shared memory, the head's id and id floor, the backups'
        folder: what the head opens for writing."""
        return [self.db.with_name(self.db.name + s) for s in ("", "-wal", "-shm")] + [head_id_file(self.db)] + \
            [self.db.with_name(name) for name in HEAD_FILES] + [self.folder]

    def unusable(self, *more: Path) -> str | None:
        """One sentence when the head (this account) cannot open a file of its home (and
        ``more``, such as its lock) — a database restored or a backup made as root and left
        root's —, with the way out; None when all are its to open."""
        for path in [*self._head_files(), *more]:
            try:
                st = path.stat()
            except FileNotFoundError:
                continue
            except OSError as err:
                return f"cannot look at {path}: {err.strerror}"
            if os.access(path, os.R_OK | os.W_OK | (os.X_OK if path.is_dir() else 0)):
                continue
            me, owner = _user(os.geteuid()), _user(st.st_uid)
            return (f"{path} is {owner}'s ({st.st_mode & 0o777:04o}) and this head runs as {me}, "
                    f"who cannot open it; give the home back: chown -R {me} {self.db.parent} "
                    "(a backup made or restored as root?)")
        return None

    # ---------------------------------------------------------------- making them
    def make(self, store: Store | None = None) -> Backup:
        """A backup now, from ``store`` (the head's own connection, on its loop or after
        it stopped) or from a read-only connection of its own; the oldest beyond ``keep``
        go, but only once the new one is whole and sound."""
        self.folder.mkdir(mode=0o700, exist_ok=True)
        final = self._new_name()
        partial = final.with_name(final.name + ".partial")
        partial.unlink(missing_ok=True)
        try:
            os.close(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))  # not umask's
            source = store or Store(self.db, readonly=True)
            try:
                source.backup_to(partial)
            finally:
                if store is None:
                    source.close()
            copy = Store(partial, readonly=True)
            try:
                copy.check()
            finally:
                copy.close()
            _sync(partial)
            self._give_back(self.folder, partial)
            os.replace(partial, final)
            _sync(self.folder)
        except (OSError, DatabaseDamaged) as err:
            partial.unlink(missing_ok=True)
            raise BackupError(f"no backup made of {self.db}: {_text(err)}") from None
        except Exception as err:  # sqlite3's own (a locked or failing disk)
            partial.unlink(missing_ok=True)
            raise BackupError(f"no backup made of {self.db}: {err}") from None
        for old in self.list()[self.keep:]:
            old.path.unlink(missing_ok=True)
        stat = final.stat()
        return Backup(final, stat.st_mtime, stat.st_size)

    def _new_name(self) -> Path:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        path, n = self.folder / f"{PREFIX}{stamp}{SUFFIX}", 1
        while path.exists():  # two in one second
            n += 1
            path = self.folder / f"{PREFIX}{stamp}-{n}{SUFFIX}"
        return path

    def due(self, now: float | None = None) -> bool:
        """Whether the newest backup is ``EVERY_S`` old (or there is none)."""
        found = self.list()
        return not found or (now or time.time()) - found[0].taken_at >= EVERY_S

    # ------------------------------------------------------------- reading them
    def list(self) -> list[Backup]:
        """Every backup, newest first."""
        found = []
        try:
            for entry in os.scandir(self.folder):
                if entry.name.startswith(PREFIX) and entry.name.endswith(SUFFIX) and entry.is_file():
                    stat = entry.stat()
                    found.append(Backup(Path(entry.path), stat.st_mtime, stat.st_size))
        except FileNotFoundError:
            pass
        except OSError as err:
            raise BackupError(f"cannot read {self.folder}: {_text(err)}; run it as the head's account, "
                              f"or give the folder back: chown -R {_user(os.geteuid())} {self.folder}") from None
        return sorted(found, key=lambda b: (b.taken_at, b.name), reverse=True)

    def find(self, name: str) -> Backup:
        """A backup by its name (as ``list`` shows it), ``latest``, or a file's path (a copy
        kept elsewhere, when the home was lost with its backups)."""
        if "/" in name and Path(name).expanduser().is_file():
            path = Path(name).expanduser().resolve()
            stat = path.stat()
            return Backup(path, stat.st_mtime, stat.st_size)
        found = self.list()
        if not found:
            raise BackupError(f"there is no backup in {self.folder}")
        if name == "latest":
            return found[0]
        for backup in found:
            if name in (backup.name, str(backup.path)):
                return backup
        raise BackupError(f"no backup named {name!r} in {self.folder}; `nebula backup --list` "
                          "shows them")

    @staticmethod
    def summary(backup: Backup) -> dict:
        """What a backup holds (``Store.summary``), or ``{"damaged": why}``."""
        try:
            store = Store(backup.path, readonly=True)
        except DatabaseDamaged as err:
            return {"damaged": str(err)}
        except Exception as err:  # sqlite3's own: a file this account may not open
            return {"damaged": f"cannot open it ({_text(err)}; {_user(_uid(backup.path))}'s)"}
        try:
            return store.summary()
        except Exception as err:  # a page of it cannot be read
            return {"damaged": str(store.damage(err) or err)}
        finally:
            store.close()

    def way_out(self) -> str:
        """What an admin can do about a lost or damaged database, in one clause."""
        found = self.list()
        empty = ("start from an empty database that takes in the jobs the nodes still run: "
                 "`nebula backup --start-empty`")
        if not found:
            return f"there is no backup to restore; {empty}"
        taken = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(found[0].taken_at))
        return (f"restore a backup with `nebula backup --restore latest` ({len(found)} kept, "
                f"the newest from {taken}; `nebula backup --list` shows them), or {empty}")

    # ------------------------------------------------------ putting one in place
    def restore(self, name: str) -> str:
        """Put the backup ``name`` in place of the database (the head stopped: call it
        within ``head_stopped``); returns what was done, for the admin."""
        backup = self.find(name)
        had = read_head_id(self.db)
        found = self.summary(backup)
        if "damaged" in found:
            raise BackupError(f"backup {backup.name} cannot be used: {found['damaged']}")
        if had and found["head"] != had:
            raise BackupError(f"backup {backup.name} is another head's database (head "
                              f"{found['head']}; this home's is {had})")
        checked = Store(backup.path, readonly=True)
        try:
            checked.check()
        except DatabaseDamaged as err:
            raise BackupError(f"backup {backup.name} cannot be used: {err}") from None
        finally:
            checked.close()
        aside = self._set_aside()
        partial = self.db.with_name(self.db.name + ".restoring")
        partial.unlink(missing_ok=True)
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with open(backup.path, "rb") as source, open(fd, "wb") as target:
            while chunk := source.read(1 << 20):
                target.write(chunk)
        _sync(partial)
        self._give_back(partial)
        os.replace(partial, self.db)
        _sync(self.db.parent)
        self._mark_restored(Store(self.db), f"backup {backup.name}")
        return (f"restored backup {backup.name} ({found['jobs']} jobs){aside}; at its start "
                "the head takes in what the nodes ran since, before it schedules anything")

    def start_empty(self) -> str:
        """An empty database in place of the database, with the head's id (head stopped)."""
        if read_head_id(self.db) is None:
            raise BackupError(f"{head_id_file(self.db)} is missing: without the head's id the "
                              "nodes' jobs cannot be told from other heads'; restore a backup "
                              "(`nebula backup --list`)")
        aside = self._set_aside()
        self._mark_restored(Store(self.db, start_over=True), "an empty database")
        return (f"started an empty database{aside}; at its start the head takes in the jobs "
                "the nodes run or ran, before it schedules anything; waiting jobs, the "
                "history and quotas are not in it")

    def _mark_restored(self, store: Store, source: str) -> None:
        try:
            store.mark_restored(source)
        finally:
            store.close()
            self._give_back(*self._head_files())

    def _set_aside(self) -> str:
        """Rename the database and its WAL out of the way (kept: nothing is deleted);
        returns a clause saying where they went."""
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        base, n = f"{self.db.name}.set-aside-{stamp}", 1
        while any(self.db.with_name(base + s).exists() for s in ("", "-wal", "-shm")):
            n += 1  # one set aside in this second already: never write over it
            base = f"{self.db.name}.set-aside-{stamp}-{n}"
        moved = []
        for suffix in ("", "-wal", "-shm"):
            path = self.db.with_name(self.db.name + suffix)
            if path.exists():
                target = self.db.with_name(base + suffix)
                os.replace(path, target)
                moved.append(target)
        return f"; the database it replaced is kept as {moved[0]}" if moved else ""


@contextlib.contextmanager
def head_stopped(lock: Path) -> Iterator[None]:
    """Hold the head's lock (``nebula serve`` takes it), so none starts meanwhile;
    ``BackupError`` when a head runs."""
    try:
        handle = open(lock, "a+")
    except OSError as err:
        raise BackupError(f"cannot open {lock}: {err.strerror}") from None
    with handle:
        if os.geteuid() == 0:  # root made it: it stays the head's to open
            with contextlib.suppress(OSError):
                home = lock.parent.stat()
                os.chown(lock, home.st_uid, home.st_gid)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            pid = handle.read().strip()
            how = f"`kill {pid}`" if pid.isdigit() else "SIGTERM to its `nebula serve`"
            raise BackupError(f"the head is running{f' (pid {pid})' if pid else ''} and keeps its "
                              f"database open: stop it first — {how} (it stops cleanly; the jobs on "
                              "the nodes run on), or `sudo systemctl stop nebula` where systemd runs "
                              "it — then run this again") from None
        yield


def _uid(path: Path) -> int:
    try:
        return path.stat().st_uid
    except OSError:
        return -1


def _user(uid: int) -> str:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        return f"uid {uid}"


def _sync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _text(err: BaseException) -> str:
    if isinstance(err, OSError) and err.strerror:
        return f"{err.strerror} ({err.filename})" if err.filename else err.strerror
    return str(err)
