"""Messages the app's workers post; handlers on the app fold them into ``Cluster`` state.

The ``events`` worker group reads the head's subscription stream and posts one of these per
event it reads. Screens never get these directly: the app updates its ``Cluster`` and tells
the visible screen what changed (``ClusterScreen.cluster_changed``).
"""

from __future__ import annotations

from textual.message import Message

from ..wire import BookingView, EventRow, GpusEvent, JobWire, NodeWire, PoolWire, StartForecast, StreamSnapshot, UserRow


class StreamMessage(Message):
    """What the ``events`` worker posts: the app folds each kind (``screens/folding.py``)."""


class SnapshotArrived(StreamMessage):
    """The stream (re)started: the whole state of the head (nodes, GPUs, queue, events)."""

    def __init__(self, snapshot: StreamSnapshot) -> None:
        super().__init__()
        self.snapshot = snapshot


class JobChanged(StreamMessage):
    """One job changed; a finished one (succeeded/failed/cancelled) leaves the queue."""

    def __init__(self, job: JobWire) -> None:
        super().__init__()
        self.job = job


class GpusChanged(StreamMessage):
    """Fresh readings arrived: ``events``, the stream's "gpus" events (each the changes to
    one node's GPUs, see ``api``; every node about once a second), in stream order.

    Telemetry is batched: the ``events`` worker collects these events and posts this
    message a moment after starting a new batch, so 125 nodes reporting each second cost a
    few messages, not 125. A batch is never folded into a newer snapshot than its own.
    """

    def __init__(self, events: list[GpusEvent]) -> None:
        super().__init__()
        self.events = events


class NodeChanged(StreamMessage):
    """One node's state changed (up, unreachable, drained…)."""

    def __init__(self, node: NodeWire) -> None:
        super().__init__()
        self.node = node


class EventLogged(StreamMessage):
    """A line of the head's events log, as the head recorded it."""

    def __init__(self, event: EventRow) -> None:
        super().__init__()
        self.event = event


class UserChanged(StreamMessage):
    """One user's figures moved: their row, as the ``users`` request has it."""

    def __init__(self, user: UserRow) -> None:
        super().__init__()
        self.user = user


class BookingsChanged(StreamMessage):
    """The bookings not yet over, after one was made, ended or broken."""

    def __init__(self, bookings: list[BookingView]) -> None:
        super().__init__()
        self.bookings = bookings


class QueueOrdered(StreamMessage):
    """The scheduler's new order of the waiting jobs (their ids), and its start forecasts
    when they came with it (job id -> ``starts``)."""

    def __init__(self, order: list[int], starts: dict[str, StartForecast] | None = None) -> None:
        super().__init__()
        self.order = order
        self.starts = starts


class StreamLost(StreamMessage):
    """The event stream broke (or never opened); the worker retries after ``retry_s``."""

    def __init__(self, reason: str, retry_s: float) -> None:
        super().__init__()
        self.reason = reason
        self.retry_s = retry_s


class PoolChanged(StreamMessage):
    """One pool's view after a poll that changed it (as the snapshot's ``pools`` has it)."""

    def __init__(self, pool: PoolWire) -> None:
        super().__init__()
        self.pool = pool
