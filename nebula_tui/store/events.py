"""The store's events log read back and kept in bounds; its lines are written by each change
in its own transaction (``StoreBase._event``), or alone by ``add_event``.
"""

from __future__ import annotations

from ..wire import EventRow
from .base import StoreBase, filters


class Events(StoreBase):
    """The ``events`` table: a line on its own, retention, the log as asked for."""

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
               since: float | None = None) -> list[EventRow]:
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
