"""Job ids and the head's id, each kept in a small file beside the database.

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

Plain files, no SQL: the store (``base.py``) reads and writes them with the database.
"""

from __future__ import annotations

import os
from pathlib import Path


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

    def write(self, value: int, wait: bool = True) -> None:
        """``value`` handed out. ``wait`` False: a new reservation is forced to the disk by
        the next ``sync`` (the group commit's, before the submit is answered) instead of
        now, so no submit's commit waits for the disk on the head's loop."""
        sync = value >= self._reserved
        if sync:
            self._reserved = value + self.BLOCK
        line = f"{value} {self._reserved} {self._boot or '-'}"
        os.pwrite(self._file.fileno(), f"{line:<120}\n".encode(), 0)
        if sync and wait:
            os.fdatasync(self._file.fileno())
        elif sync:
            self._unsynced = True
        self.value = value

    _unsynced = False

    def sync(self) -> None:
        """Force a reservation written with ``wait`` False to the disk (from any thread)."""
        if self._unsynced:
            self._unsynced = False  # first: one written meanwhile is synced now or next time
            os.fdatasync(self._file.fileno())

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


def write_head_id(db: Path, head: str) -> None:
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
