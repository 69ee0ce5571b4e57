"""The head's event stream on the TUI's side: which message each event becomes
(``message_of``), and how each message is folded into the client's ``Cluster``
(``fold``), saying what changed, so the app only tells the screens.

Pure of widgets: ``fold`` changes the ``Cluster`` it is given and returns a ``Folded``
(the changes a screen redraws for, whether the look's temperatures moved, the connection's
new state); the app does the telling, the restyling and the garbage collector's freeze.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..client.cluster import Cluster
from .look import LOOK
from .messages import (BookingsChanged, EventLogged, GpusChanged, JobChanged, NodeChanged, PoolChanged,
                       QueueOrdered, SnapshotArrived, StreamLost, StreamMessage, UserChanged)

#: A stream event's ``type`` -> its message ("gpus" events are batched by the app, and a
#: snapshot resets that batch, so both are the app's to post).
MESSAGES: dict[str, Callable[[Any], StreamMessage]] = {
    "job": lambda e: JobChanged(e["job"]),
    "node": lambda e: NodeChanged(e["node"]),
    "event": lambda e: EventLogged(e["event"]),
    "user": lambda e: UserChanged(e["user"]),
    "queue": lambda e: QueueOrdered(e["order"], e.get("starts")),
    "pool": lambda e: PoolChanged(e["pool"]),
    "bookings": lambda e: BookingsChanged(e["bookings"]),
}


def message_of(event: dict[str, Any]) -> StreamMessage | None:
    """The message of a stream event of a kind in :data:`MESSAGES` (read as its
    ``wire.StreamEvent``, as the head sends it); None for any other."""
    make = MESSAGES.get(event.get("type"))  # type: ignore[arg-type]
    return make(event) if make is not None else None


@dataclass
class Folded:
    """What a folded message changed: ``changes`` (a change's kind and key, as
    ``ClusterScreen.cluster_changed`` takes them), whether the temperatures' thresholds moved
    (every screen restyles), and the connection's new state, if it has one."""

    changes: list[tuple[str, object]] = field(default_factory=list)
    restyle: bool = False
    #: (what the title bar says, whether the stream is lost)
    connection: tuple[str, bool] | None = None
    #: a whole new state arrived (the app freezes it out of the garbage collector's way)
    snapshot: bool = False


def _snapshot(cluster: Cluster, m: SnapshotArrived) -> Folded:
    cluster.apply_snapshot(m.snapshot)
    return Folded([("all", None)], restyle=LOOK.use_temperatures(m.snapshot.get("temperatures")),
                  connection=("connected", False), snapshot=True)


def _job(cluster: Cluster, m: JobChanged) -> Folded:
    before = cluster.apply_job(m.job)
    live = cluster.live_fields_only(before, m.job)
    return Folded([("job-live" if live else "job", m.job["id"])])


def _gpus(cluster: Cluster, m: GpusChanged) -> Folded:
    changed: dict[str, None] = {}
    for event in m.events:
        if cluster.apply_gpus(event["node"], event["gpus"], event.get("gone", ()), event.get("seen")):
            changed[event["node"]] = None
    return Folded([("gpus", node) for node in changed])  # readings that did not move cost nothing


def _node(cluster: Cluster, m: NodeChanged) -> Folded:
    cluster.apply_node(m.node)
    return Folded([("node", m.node["name"])])


def _event(cluster: Cluster, m: EventLogged) -> Folded:
    cluster.apply_event(m.event)
    return Folded([("event", None)])


def _user(cluster: Cluster, m: UserChanged) -> Folded:
    cluster.apply_user(m.user)
    return Folded([("user", m.user["name"])])


def _pool(cluster: Cluster, m: PoolChanged) -> Folded:
    cluster.apply_pool(m.pool)
    return Folded([("pool", m.pool["name"])])


def _bookings(cluster: Cluster, m: BookingsChanged) -> Folded:
    cluster.apply_bookings(m.bookings)
    return Folded([("bookings", None)])


def _queue(cluster: Cluster, m: QueueOrdered) -> Folded:
    cluster.apply_queue(m.order, m.starts)
    return Folded([("queue", None)])


def _lost(cluster: Cluster, m: StreamLost) -> Folded:
    cluster.connected = False
    return Folded(connection=(f"disconnected — retrying in {m.retry_s:g}s ({m.reason})", True))


_FOLDS: dict[type, Callable[[Cluster, Any], Folded]] = {
    SnapshotArrived: _snapshot, JobChanged: _job, GpusChanged: _gpus, NodeChanged: _node,
    EventLogged: _event, UserChanged: _user, PoolChanged: _pool, BookingsChanged: _bookings,
    QueueOrdered: _queue, StreamLost: _lost,
}


def fold(cluster: Cluster, message: StreamMessage) -> Folded:
    """Fold ``message`` into ``cluster``; what it changed."""
    return _FOLDS[type(message)](cluster, message)
