"""What the TUI knows of the cluster: plain dicts as the head published them.

One ``Cluster`` lives on the app; the stream handlers fold events into it and every screen
renders from it. Pure: no widgets, no I/O. Each ``apply_*`` returns what changed so screens
can update just that.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any, cast

from ..model import FINISHED_STATES
from ..scheduler import fairshare
from ..wire import (BookingView, EventRow, GpuWire, JobWire, NodeWire, PoolWire, StartForecast, StreamSnapshot,
                    UserRow)

FINISHED = FINISHED_STATES

#: Events kept for the ticker and the job screens' state history.
EVENTS_KEPT = 500
#: Utilisation readings kept per GPU for the GPU table's trend column.
TREND_KEPT = 12
#: GPU fields the cluster-wide counts (R1: idle/busy/…, total and free VRAM) depend on.
#: A running job's fields that its cards' readings move (idleness) and that no screen
#: orders, filters or counts jobs by: a job event changing only these repaints the rows
#: on screen ("job-live"), never re-orders 10,000 jobs.
LIVE_JOB_FIELDS = frozenset({"idle_since", "idle_unknown"})
COUNTED_FIELDS = frozenset({"status", "total_memory_mb", "slices"})


class LiveJob(JobWire):
    """A live job as the TUI holds it: a queue row (``wire.QueueRow``) from the snapshot,
    then as its latest "job" event has it, with its ``starts`` put on."""

    starts: StartForecast | None


class Cluster:
    def __init__(self) -> None:
        self.nodes: dict[str, NodeWire] = {}
        #: GPUs as ``wire.GpuWire``, each change merged into a new dict (``apply_gpus``)
        self.gpus: dict[str, GpuWire] = {}
        #: live jobs only (pending, launching, running)
        self.jobs: dict[int, LiveJob] = {}
        self.finished: dict[int, JobWire] = {}  # jobs seen finishing while we watched
        self.events: deque[EventRow] = deque(maxlen=EVENTS_KEPT)
        self.users: dict[str, UserRow] = {}  # user name -> their row of the ``users`` request
        self.pools: dict[str, PoolWire] = {}  # pool name -> its view (``pools/status.py``)
        self.bookings: list[BookingView] = []  # bookings not yet over, as ``reservations`` lists them
        self.queue_order: list[int] = []  # waiting jobs, as the scheduler orders them
        self.starts: dict[int, StartForecast] = {}  # waiting job -> the head's start forecast
        self.by_node: dict[str, dict[str, GpuWire]] = {}  # node -> uuid -> GPU (same dicts)
        self.placed: dict[str, set[int]] = {}  # GPU uuid -> live jobs placed there
        self.util_trend: dict[str, deque[float | None]] = {}  # GPU uuid -> recent utilisation readings
        self.connected = False
        self.version = 0  # bumped on every change; cheap "anything new?" for timers
        self.counts_version = 0  # bumped when GPUs come or go, or change a COUNTED_FIELDS value

    # ------------------------------------------------------------------ folding
    def apply_snapshot(self, snap: StreamSnapshot) -> None:
        self.nodes = {n["name"]: n for n in snap.get("nodes", [])}
        self.gpus = {g["uuid"]: g for g in snap.get("gpus", [])}
        self.jobs = {j["id"]: j for j in snap.get("jobs", []) if j["state"] not in FINISHED}
        self.events = deque(snap.get("events", []), maxlen=EVENTS_KEPT)
        self.users = {u["name"]: u for u in snap.get("users", [])}
        self.pools = {p["name"]: p for p in snap.get("pools", [])}
        self.bookings = list(snap.get("bookings", []))
        self.queue_order = list(snap.get("queue", []))
        self._forecasts(snap.get("starts"))
        self.by_node = {}
        for uuid, gpu in self.gpus.items():
            self.by_node.setdefault(gpu["node"], {})[uuid] = gpu
        self.placed = {}
        for job in self.jobs.values():
            self._place(job, add=True)
        self.connected = True
        self.version += 1
        self.counts_version += 1

    def apply_job(self, job: JobWire) -> LiveJob | None:
        """Fold one job; returns the job as it was before (None when new to us)."""
        before = self.jobs.get(job["id"])
        if before is not None:
            self._place(before, add=False)
        if job["state"] in FINISHED:
            self.jobs.pop(job["id"], None)
            self.finished[job["id"]] = job
        else:
            live = cast(LiveJob, job)  # (the event's own dict: its forecast comes apart)
            live.setdefault("starts", self.starts.get(job["id"]))
            self.jobs[job["id"]] = live
            self._place(job, add=True)
        self.version += 1
        return before

    @staticmethod
    def live_fields_only(before: Mapping[str, Any] | None, job: Mapping[str, Any]) -> bool:
        """Whether ``job`` differs from ``before`` in ``LIVE_JOB_FIELDS`` alone."""
        if before is None:
            return False
        return all(before.get(key) == job.get(key) for key in before.keys() | job.keys()
                   if key not in LIVE_JOB_FIELDS)

    def _place(self, job: JobWire, *, add: bool) -> None:
        for p in job["gpus"]:
            if add:
                self.placed.setdefault(p["uuid"], set()).add(job["id"])
            else:
                self.placed.get(p["uuid"], set()).discard(job["id"])

    def apply_gpus(self, node: str, changes: Mapping[str, Mapping[str, Any]] | list[GpuWire],
                   gone: Iterable[str] = (), seen: float | None = None) -> bool:
        """Fold one "gpus" event of ``node`` (see ``api``): ``changes`` maps a GPU's uuid to
        the whole GPU (it has "uuid") or to the fields that changed; ``gone`` lists GPUs no
        longer on ``node``. Every GPU of the node takes a trend point (the node reported).
        Returns whether anything a screen shows of the node's GPUs changed (a value, a GPU
        come or gone, or a trend line's shape): when not, nothing needs redrawing.

        A changed GPU is a new dict (screens may hold the old one); unchanged GPUs, most
        of an idle cluster, cost a trend point each. A head older than this stream sends
        ``changes`` as a list: every GPU of the node, whole.
        """
        if seen is not None and node in self.nodes:  # when the head last heard from it
            self.nodes[node] = {**self.nodes[node], "last_seen": seen}
        mine = self.by_node.setdefault(node, {})
        if isinstance(changes, list):
            gone = [uuid for uuid in mine if uuid not in {g["uuid"] for g in changes}]
            changes = {g["uuid"]: g for g in changes}
        changed = False
        for uuid in gone:
            gpu = self.gpus.get(uuid)
            if gpu is not None and gpu["node"] == node:  # (not when it moved to another node)
                del self.gpus[uuid]
                self.util_trend.pop(uuid, None)
                changed = True
                self.counts_version += 1
            mine.pop(uuid, None)
        for uuid, fields in changes.items():
            before = self.gpus.get(uuid)
            if "uuid" in fields:  # a whole GPU
                gpu = cast(GpuWire, fields)
                if before is not None and before["node"] != node:  # it moved here
                    self.by_node.get(before["node"], {}).pop(uuid, None)
                self.counts_version += 1
            elif before is not None:
                gpu = cast(GpuWire, {**before, **fields})
                if not COUNTED_FIELDS.isdisjoint(fields):
                    self.counts_version += 1
            else:  # a change to a GPU this stream never sent: cannot merge it
                continue
            self.gpus[uuid] = mine[uuid] = gpu
            changed = True
        for uuid, gpu in mine.items():
            util = gpu.get("utilization_pct")
            trend = self.util_trend.get(uuid)
            if trend is None:  # (not setdefault: 1,000 readings a second, one deque each)
                trend = self.util_trend[uuid] = deque(maxlen=TREND_KEPT)
            if not changed and (len(trend) < TREND_KEPT or trend.count(util) != TREND_KEPT):
                changed = True  # the trend line moves, though the reading did not
            trend.append(util)
        if changed:
            self.version += 1
        return changed

    def apply_node(self, node: NodeWire) -> None:
        self.nodes[node["name"]] = node
        self.version += 1

    def apply_event(self, event: EventRow) -> None:
        """A line of the head's events log (every change has its own, at the head's time)."""
        self.events.append(event)
        self.version += 1

    def apply_pool(self, pool: PoolWire) -> None:
        self.pools[pool["name"]] = pool
        self.version += 1

    def pool_nodes(self) -> dict[str, dict[str, Any]]:
        """Every pool's nodes as rows of the Nodes screen, keyed ``pool:node`` (a name no
        lab node can have), each with its ``pool``."""
        return {f"{name}:{n['name']}": {**n, "name": f"{name}:{n['name']}", "pool": name}
                for name, pool in self.pools.items() for n in pool.get("nodes") or ()}

    def apply_queue(self, order: list[int], starts: dict[str, StartForecast] | None = None) -> None:
        self.queue_order = list(order)
        self._forecasts(starts)
        self.version += 1

    def _forecasts(self, starts: dict[str, StartForecast] | None) -> None:
        """The head's start forecasts (job id, as JSON writes it -> ``starts``), put on
        the waiting jobs as their ``starts``."""
        if starts is None:
            return
        self.starts = {int(job): start for job, start in starts.items()}
        for job_id, job in self.jobs.items():
            job["starts"] = self.starts.get(job_id) if job["state"] == "pending" else None

    def apply_user(self, row: UserRow) -> None:
        """A user's row (weight, GPU-hours, quota, jobs) as the ``users`` request has it."""
        self.users[row["name"]] = row
        self.version += 1

    def apply_bookings(self, bookings: list[BookingView]) -> None:
        self.bookings = list(bookings)
        self.version += 1

    # ------------------------------------------------------------------ views
    def bookings_of(self, uuid: str) -> list[BookingView]:
        """The bookings (under way or ahead) that hold this GPU."""
        return [b for b in self.bookings if uuid in b.get("uuids", ())]

    def job(self, job_id: int) -> JobWire | None:
        return self.jobs.get(job_id) or self.finished.get(job_id)

    def holders_of(self, uuid: str) -> list[int]:
        """Ids of the live jobs placed on one GPU (from GPU and job events both, whichever
        arrived first)."""
        gpu = self.gpus.get(uuid)
        ids = {j for j in (gpu.get("jobs", ()) if gpu else ()) if j in self.jobs} | self.placed.get(uuid, set())
        return sorted(ids)

    def holders(self) -> dict[str, list[int]]:
        """GPU uuid -> ``holders_of`` it, for every GPU."""
        return {u: self.holders_of(u) for u in self.gpus}

    def node_gpus(self, node: str) -> list[GpuWire]:
        return list(self.by_node.get(node, {}).values())

    def job_events(self, job_id: int) -> list[EventRow]:
        return [e for e in self.events if e.get("job_id") == job_id]


def user_weight(row: Mapping[str, Any]) -> float:
    """A user's fair-share weight: the service's figure, else R6 from their usage."""
    if isinstance(row.get("weight"), (int, float)):
        return float(row["weight"])
    return fairshare.BASE_WEIGHT + fairshare.PER_GPU_HOUR * (row.get("gpu_hours") or 0.0)
