"""Bookings (``nebula reserve``): cards kept for some users through a window.

Who may book: admins, and any user up to ``limits.booking_gpu_hours`` GPU-hours a month
(cards × hours of the bookings they made that start this month; 0, the default: admins
only). A booking names its cards (``node02:0-3``) or asks for a count (``--gpu-count 4
--gpu-mem 40G``: the first node with that many such cards unbooked then, in listing
order). It is refused at once when a card is unknown, taken out of service (maintenance,
lost, node drained or away) or booked for an overlapping window; jobs that would still
hold its cards when it starts (no ``--time``, or one ending after) are named in the reply.

The scheduler reads them each pass (:meth:`Bookings.for_pass`, ``scheduler.Booking``):
inside the window only its users' jobs (or those that name it) run there; before it, only
jobs whose ``--time`` ends before it starts, and preemptible jobs, which are stopped when it
starts. :meth:`Bookings.check` (each turn of the scheduling loop) says at once — an event
of kind ``booking`` and ``on_broken`` (the engine wires notifications) — when one can no
longer be honoured, and when it can again. They live in the store, so they survive
restarts; ``accounting.report`` counts their use.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

from ..model import InvalidRequest, RequestError, UnfitRequest, format_mb
from ..scheduler import Booking
from ..units import duration_text
from ..views import month_start
from ..wire import BookingMade, BookingView, ReserveReply, ReserveRequest
from .access import Access
from .state import HeadState
from .stream import Stream

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
USER_RE = re.compile(r"^[a-z_][a-z0-9_.-]{0,31}\$?$")
MAX_WINDOW_S = 31 * 86400.0
MAX_AHEAD_S = 366 * 86400.0

#: a booking as the store keeps it (``Store.bookings``): its cards as (uuid, node, index)
Row = dict[str, Any]
#: a booked card: (uuid, node, index)
Card = tuple[str, str, int]


def when_text(t: float, now: float) -> str:
    """"Fri 09:00" within the coming week, else "Fri 11 Dec 09:00" (local time)."""
    local = time.localtime(t)
    return time.strftime("%a %H:%M" if abs(t - now) < 6 * 86400 else "%a %d %b %H:%M", local)


def cards_label(cards: list[Card]) -> str:
    """"node02:0-3", "node01:1,node02:0" for people."""
    by_node: dict[str, list[int]] = {}
    for _, node, index in cards:
        by_node.setdefault(node, []).append(index)
    parts = []
    for node, indices in by_node.items():
        indices.sort()
        runs: list[str] = []
        first: int | None = indices[0]
        for a, b in zip(indices, [*indices[1:], None]):
            if b != a + 1:
                runs.append(str(first) if first == a else f"{first}-{a}")
                first = b
        parts.append(f"{node}:{','.join(runs)}")
    return ",".join(parts)


def parse_cards(text: str) -> list[tuple[str, int]]:
    """"node02:0-3" / "node01:0,2,node02:1" -> [(node, index)]; ValueError says what is wrong."""
    found: list[tuple[str, int]] = []
    node: str | None = None
    for item in text.split(","):
        item = item.strip()
        if ":" in item:
            node, item = item.split(":", 1)
        if not node or not item:
            raise ValueError(f"--gpus {text!r}: write NODE:INDEXES, e.g. node02:0-3 or node01:0,2")
        first, _, last = item.partition("-")
        if not first.isdigit() or (last and not last.isdigit()) or int(last or first) < int(first) \
                or int(last or first) - int(first) >= 64:
            raise ValueError(f"--gpus {text!r}: {item!r} is not a GPU index or range such as 0-3")
        found += [(node, i) for i in range(int(first), int(last or first) + 1)]
    if len(set(found)) != len(found):
        raise ValueError(f"--gpus {text!r} names a GPU twice")
    return found


class Bookings:
    def __init__(self, state: HeadState, access: Access, stream: Stream):
        self.state = state
        self.access = access
        self.stream = stream
        #: told (booking, why or None when it can be honoured again): the engine's notices
        self.on_broken: Callable[[Row, str | None], None] = lambda booking, why: None
        #: each live booking's name and whether it was under way when subscribers last heard
        self._told: tuple[tuple[str, bool], ...] = ()

    # ---------------------------------------------------------------- reading
    def live(self) -> list[Row]:
        """Bookings not yet over, by start."""
        return self.state.store.bookings(since=self.state.clock())

    def json(self, booking: Row, now: float | None = None) -> BookingView:
        now = self.state.clock() if now is None else now
        end = min(booking["end"], booking["ended_at"] or booking["end"])
        return {"name": booking["name"], "gpus": cards_label(booking["cards"]),
                "uuids": [c[0] for c in booking["cards"]], "users": booking["users"],
                "start": booking["start"], "end": end, "created_by": booking["created_by"],
                "active": booking["start"] <= now < end, "broken": booking["broken"],
                "gpu_hours": round(len(booking["cards"]) * (booking["end"] - booking["start"]) / 3600, 4),
                "when": f"{when_text(booking['start'], now)} – {when_text(end, now)}"}

    def list_json(self) -> list[BookingView]:
        """What subscribers get (the snapshot too): from then on :meth:`check` tells them
        when a window opens or ends."""
        now = self.state.clock()
        return [self.json(b, now) for b in self.live()]

    def for_pass(self, now: float) -> tuple[Booking, ...]:
        """The bookings as the scheduler sees them, with the sentence a job kept off hears."""
        out = []
        for b in self.live():
            end = min(b["end"], b["ended_at"] or b["end"])
            when = f"from {when_text(b['start'], now)}" if b["start"] > now else f"until {when_text(end, now)}"
            out.append(Booking(b["name"], frozenset(c[0] for c in b["cards"]), b["start"], end,
                               frozenset(b["users"]), f"{cards_label(b['cards'])} booked for {b['name']} {when}"))
        return tuple(out)

    # ---------------------------------------------------------------- changing
    def request(self, user: str, req: ReserveRequest) -> ReserveReply:
        """The ``reserve`` request: ``{"list": true}`` lists, ``{"delete": NAME}`` ends one,
        anything else makes one (``create``)."""
        if req.get("list") is True:
            return {"bookings": self.list_json()}
        if "delete" in req:
            name = req["delete"]
            if not isinstance(name, str) or not NAME_RE.match(name):
                raise InvalidRequest("--delete takes a booking's name; `nebula reservations` lists them")
            return {"booking": self.delete(user, name)}
        return self.create(user, req)

    def create(self, user: str, req: ReserveRequest) -> BookingMade:
        """Book cards from ``req`` (the ``reserve`` request); the booking's JSON and a
        ``note`` naming jobs that may still hold its cards when it starts."""
        now = self.state.clock()
        name, start, duration = req.get("name"), req.get("start"), req.get("duration_s")
        users = req.get("users") or [user]
        if not isinstance(start, (int, float)) or isinstance(start, bool) or not now - 60 <= start <= now + MAX_AHEAD_S:
            raise InvalidRequest("--start must be a time from now to a year ahead, e.g. \"2026-12-11 09:00\"")
        start = max(start, now)
        if not isinstance(duration, (int, float)) or isinstance(duration, bool) or not 60 <= duration <= MAX_WINDOW_S:
            raise InvalidRequest("--duration must be from 1 minute to 31 days, e.g. 10h")
        if not isinstance(users, list) or not 1 <= len(users) <= 64 or \
                not all(isinstance(u, str) and USER_RE.match(u) for u in users):
            raise InvalidRequest("--users must be a comma-separated list of user names, e.g. alice,bob")
        if name is None:
            name = f"{user}-{time.strftime('%m%d-%H%M', time.localtime(start))}"
        if not isinstance(name, str) or not NAME_RE.match(name):
            raise InvalidRequest("--name must be 1-64 letters, digits, dots, dashes or underscores")
        end = start + duration
        cards = self._cards(req, start, end)
        hours = len(cards) * duration / 3600
        self._check_allowance(user, hours, now)
        label = cards_label(cards)
        try:
            self.state.store.add_booking(
                name, cards, sorted(set(users)), start, end, user, now,
                f"{label} booked for {name} by {user}: {when_text(start, now)} – {when_text(end, now)}, "
                f"for {', '.join(sorted(set(users)))}")
        except ValueError as err:
            raise RequestError(str(err)) from None
        self.state.wake()
        booking = next(b for b in self.live() if b["name"] == name)
        self._publish()
        return {"booking": self.json(booking, now), "note": self._in_the_way(cards, start, set(users))}

    def delete(self, user: str, name: str) -> BookingView:
        booking = next((b for b in self.live() if b["name"] == name), None)
        if booking is None:
            raise RequestError(f"no booking named {name} is under way or ahead; `nebula reservations` lists them")
        if booking["created_by"] != user and not self.access.is_admin(user):
            raise RequestError(f"booking {name} is {booking['created_by']}'s: only they or an admin "
                               f"({self.access.admins_text()}) may end it")
        self.state.store.end_booking(name, user, self.state.clock(), f"booking {name} ended by {user}")
        self.state.wake()
        self._publish()
        return self.json({**booking, "ended_at": self.state.clock()})

    def check(self) -> None:
        """Say at once when a booking can no longer be honoured (one of its cards taken out
        of service, its node drained or away), and when it can again; and tell subscribers
        when a window opens or ends (the clock moved, nothing else did)."""
        now = self.state.clock()
        live = self.live()
        self._broken_or_whole(live, now)
        if self._told != tuple((b["name"], self.json(b, now)["active"]) for b in live):
            self._publish()

    def _broken_or_whole(self, live: list[Row], now: float) -> None:
        if not live:
            return
        blocked = {v.uuid: v.blocked or ("in maintenance" if v.maintenance else None)
                   for v in self.state.gpu_views()}
        for booking in live:
            why = None
            for uuid, node, index in booking["cards"]:
                if uuid not in blocked:
                    why = f"{node}:{index} is gone"
                elif blocked[uuid]:
                    why = f"{node}:{index}: {blocked[uuid]}"
                if why:
                    break
            if why == booking["broken"]:
                continue
            message = (f"booking {booking['name']} can no longer be honoured: {why}" if why else
                       f"booking {booking['name']} can be honoured again")
            self.state.store.break_booking(booking["name"], why, now, message)
            self.on_broken({**booking, "broken": why}, why)
            self._publish()

    # ---------------------------------------------------------------- rules
    def _cards(self, req: ReserveRequest, start: float, end: float) -> list[Card]:
        views = self.state.gpu_views()
        taken = {c[0]: b["name"] for b in self.live() for c in b["cards"]
                 if b["start"] < end and start < min(b["end"], b["ended_at"] or b["end"])}
        gpus, count = req.get("gpus"), req.get("gpu_count")
        if gpus is not None:
            if not isinstance(gpus, str) or len(gpus) > 200:
                raise InvalidRequest("--gpus must be NODE:INDEXES, e.g. node02:0-3")
            try:
                wanted = parse_cards(gpus)
            except ValueError as err:
                raise InvalidRequest(str(err)) from None
            by_place = {(v.node, v.reading.index): v for v in views}
            chosen = []
            for node, index in wanted:
                view = by_place.get((node, index))
                if view is None:
                    raise UnfitRequest(f"there is no GPU {node}:{index}; `nebula gpus` lists them")
                why = view.blocked or ("it is in maintenance" if view.maintenance else None)
                if why:
                    raise RequestError(f"{node}:{index} cannot be booked: {why}")
                if view.uuid in taken:
                    raise RequestError(f"{node}:{index} is booked for {taken[view.uuid]} in that window")
                chosen.append((view.uuid, node, index))
            return chosen
        if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= 64:
            raise InvalidRequest("give the cards: --gpus node02:0-3, or --gpu-count N [--gpu-mem 40G]")
        mem = req.get("gpu_mem_mb")
        if mem is not None and (not isinstance(mem, int) or isinstance(mem, bool) or mem < 1):
            raise InvalidRequest("--gpu-mem must be a size such as 40G")
        by_node: dict[str, list[Card]] = {}
        sizes: dict[str, int] = {}  # node -> its cards of that size, in service or not
        for v in views:
            if mem is None or (v.reading.memory_total_mb or 0) >= mem - 1024:  # 80 GB cards hold 79.6 GiB
                sizes[v.node] = sizes.get(v.node, 0) + 1
                if not (v.blocked or v.maintenance or v.uuid in taken):
                    by_node.setdefault(v.node, []).append((v.uuid, v.node, v.reading.index))
        for node, cards in by_node.items():
            if len(cards) >= count:
                return cards[:count]
        size = f" with {format_mb(mem)}" if mem else ""
        if views and max(sizes.values(), default=0) < count:  # no state of this cluster books it
            raise UnfitRequest(f"no node here has {count} GPU{'s' * (count != 1)}{size} (the most on "
                               f"one node is {max(sizes.values(), default=0)}); `nebula gpus` lists them")
        raise RequestError(f"no node has {count} GPU{'s' * (count != 1)}{size} in service and unbooked "
                           "in that window; `nebula reservations` lists the bookings")

    def _check_allowance(self, user: str, hours: float, now: float) -> None:
        if self.access.is_admin(user):
            return
        limit = self.state.config.limits.booking_gpu_hours
        if not limit:
            raise RequestError(f"only admins ({self.access.admins_text()}) may book cards here "
                               "(limits.booking_gpu_hours is 0)")
        # What was booked, not what the bookings table holds now: a name reused replaces
        # its old row there, and must not give back the hours it took.
        used = self.state.store.booked_hours(user, month_start(now))
        if used + hours > limit + 1e-9:
            raise RequestError(f"{user} may book {limit:g} GPU-hours a month (limits.booking_gpu_hours) and "
                               f"booked {used:g} this month; this one is {hours:g}; an admin may book it")

    def _in_the_way(self, cards: list[Card], start: float, users: set[str]) -> str:
        """The running jobs of others still holding these cards at ``start``."""
        uuids = {c[0] for c in cards}
        late = []
        for job in self.state.jobs.holders():
            if job.spec.preemptible or job.user in users or not any(p.gpu_uuid in uuids for p in job.placements):
                continue
            limit, began = job.spec.time_limit_s, job.started_at or self.state.clock()
            if limit is None:
                late.append(f"job {job.id} of {job.user} (no --time)")
            elif began + limit > start:
                late.append(f"job {job.id} of {job.user} (--time {duration_text(limit)})")
        if not late:
            return ""
        return ("these may still hold its cards when it starts, and are not stopped for it: "
                + ", ".join(late))

    def _publish(self) -> None:
        bookings = self.list_json()
        self._told = tuple((b["name"], b["active"]) for b in bookings)
        self.stream.publish({"type": "bookings", "bookings": bookings})
