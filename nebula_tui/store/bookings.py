"""The store's bookings (``nebula reserve``): the cards booked for some users through a
window, ended early or found broken, and what the users' jobs held on them meanwhile.
"""

from __future__ import annotations

import json

from .base import StoreBase


class Bookings(StoreBase):
    """The ``bookings`` table."""

    BOOKING_FIELDS = ("name", "cards", "users", "start", "end", "created_by", "created_at", "ended_at",
                      "broken")

    def add_booking(self, name: str, cards: list[tuple[str, str, int]], users: list[str], start: float,
                    end: float, by: str, t: float, message: str) -> None:
        """A new booking and its line (kind ``booking``), in one transaction; a name in use
        by a booking not yet over is refused (``ValueError``), an old one's row replaced (its
        hours stay in ``booked``, the user's month allowance)."""
        with self.transaction():
            row = self.db.execute("SELECT end, ended_at FROM bookings WHERE name = ?", [name]).fetchone()
            if row is not None and (row[1] is None and row[0] > t):
                raise ValueError(f"a booking named {name} exists already; `nebula reservations` lists them")
            self.db.execute("DELETE FROM bookings WHERE name = ?", [name])
            self.db.execute(f"INSERT INTO bookings ({', '.join(self.BOOKING_FIELDS)}) "
                            "VALUES (?, ?, ?, ?, ?, ?, ?, NULL, NULL)",
                            [name, json.dumps(cards), json.dumps(users), start, end, by, t])
            self.db.execute("INSERT INTO booked (user, start, gpu_hours, t) VALUES (?, ?, ?, ?)",
                            [by, start, len(cards) * (end - start) / 3600, t])
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

    def booked_hours(self, user: str, since: float) -> float:
        """GPU-hours ``user`` booked in bookings starting at ``since`` or later, each counted
        in full as booked (ended early, or its name reused since, it still counts)."""
        row = self.db.execute("SELECT SUM(gpu_hours) FROM booked WHERE user = ? AND start >= ?",
                              [user, since]).fetchone()
        return row[0] or 0.0

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
