"""What every family of the head's requests shares: the context a handler answers in (the
engine, the per-user limit on hold/release toggles, how to stop the service), what a user
may see of a job, and the shape of a handler (``Handler``: caller's context, Unix user,
request -> the reply's fields, or a ``RequestError`` that becomes a one-line refusal)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ... import views
from ...model import RequestError
from ...wire import JobWire
from ..engine import Engine

#: a job in any shape that carries one (``views.J``)
J = TypeVar("J", bound=JobWire)

TOGGLES_PER_S = 10.0
TOGGLE_BURST = 100


class RateLimit:
    """A token bucket per user: ``burst`` at once, then ``per_s`` a second."""

    def __init__(self, per_s: float, burst: int):
        self.per_s, self.burst = per_s, burst
        self._buckets: dict[str, tuple[float, float]] = {}  # user -> (tokens, when)

    def check(self, user: str, what: str) -> None:
        now = time.monotonic()
        tokens, when = self._buckets.get(user, (float(self.burst), now))
        tokens = min(self.burst, tokens + (now - when) * self.per_s)
        if tokens < 1:
            raise RequestError(f"too many requests to {what} from {user}: at most "
                               f"{self.per_s:g} a second; try again in a moment")
        self._buckets[user] = (tokens - 1, now)


@dataclass
class Served:
    """What a handler answers with: the engine, and the server's own state."""

    engine: Engine
    #: called (soon, on the loop) when an admin asks the service to stop
    on_shutdown: Callable[[], None] | None = None
    #: hold and release toggles per user (each writes an event): 1,500 a second once
    toggles: RateLimit = field(default_factory=lambda: RateLimit(TOGGLES_PER_S, TOGGLE_BURST))

    def seen_by(self, user: str, listing: bool = False) -> Callable[[J], J]:
        """What ``user`` sees of a job (as views.job_json): another user's command line only
        as an admin, or with ``cluster.commands_visible_to: everyone`` (it can hold a
        password, as ``TOKEN=hunter2`` once did); in a ``listing`` (many jobs), only the
        start of a long command (``views.listed``)."""
        everyone = self.engine.access.sees_commands_of_all(user)

        def seen(job: J) -> J:
            if everyone or job["user"] == user:
                return views.listed(job) if listing else job
            hidden = job.copy()
            hidden["command"] = [f"(hidden: only {job['user']} and admins see it)"]
            return hidden
        return seen


#: A request's handler: (context, the caller's Unix user, the request) -> the reply's fields
#: (most of them as ``wire`` types them: ``SubmitReply``, ``QueueReply``…). Each handler names
#: its request's type in ``wire`` (``wire.REQUESTS``); the table holds them all, so the
#: request is the parsed JSON object here, whose fields the handler checks.
Handler = Callable[[Served, str, Any], Awaitable[Mapping[str, Any]]]

