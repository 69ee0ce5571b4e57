"""What subscribers see: the snapshot they start from, and every change after it.

``subscribe`` hands a new client the snapshot (nodes, GPUs, live jobs, recent events) and
from then on puts each event in its queue; ``publish`` is the one way out for every room.
GPU events carry only what changed since the node's last one (``gpu_changes``), so the
head keeps what every subscriber holds of each node's GPUs (``published``). The protocol
is written down in ``api.py``'s docstring.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from .. import views
from ..model import GpuView, Job, JobState, NodeState
from ..wire import (ClusterStatus, EventRow, GpusEvent, GpuWire, JobEvent, LogEvent, NodeEvent, QueueEvent, QueueRow,
                    StartForecast, StreamState)
from ..node.backends import topo
from ..scheduler.slices import common_fits
from .state import HeadState, NodeView

#: Put in place of a subscriber's backlog when its (bounded) queue is full: the server then
#: sends it a fresh snapshot, and events flow again from there.
RESYNC = {"type": "resync"}


def _int_or_none(text: str | None) -> int | None:
    return int(text) if text and text.isdigit() else None


class Stream:
    def __init__(self, state: HeadState):
        self.state = state
        self.subscribers: set[asyncio.Queue] = set()
        #: What every subscriber holds of each node's GPUs (the last "gpus" event applied
        #: to the snapshot it started from): GPU events carry only the changes against it.
        self.published: dict[str, dict[str, GpuWire]] = {}  # node -> uuid -> GPU as sent

    # ---------------------------------------------------------------- subscribers
    def subscribe(self, queue: asyncio.Queue) -> StreamState:
        """A new subscriber: returns the snapshot it starts from, and puts every event
        from now on in ``queue`` (``unsubscribe`` stops that).

        "gpus" events carry changes against what subscribers already hold, so the snapshot
        must be exactly that: GPUs that changed since their node's last event (or while
        nobody listened) are first sent to the subscribers already listening, as events.
        """
        snap = self.snapshot()
        by_node: dict[str, list[GpuWire]] = {name: [] for name in self.published}
        for gpu in snap["gpus"]:
            by_node.setdefault(gpu["node"], []).append(gpu)
        for node, gpus in by_node.items():
            event = self.gpu_changes(node, gpus)
            if event["gpus"] or "gone" in event:
                self.publish(event)
            if not gpus:
                del self.published[node]
        self.subscribers.add(queue)
        return snap

    def unsubscribe(self, queue: asyncio.Queue) -> None:
        self.subscribers.discard(queue)

    def snapshot(self) -> StreamState:
        """The whole state a subscriber starts from (GPUs without the raw probe reading,
        like the stream's: `nebula gpus` has it, no subscriber shows it)."""
        status = self.status()
        heat = self.state.settings.config.temperatures
        return {**status, "jobs": self.queue_json(), "queue": self.state.queue_order,
                "starts": self.starts_json(),
                "events": self.state.store.events(30),
                "temperatures": {"hot_c": heat.hot_c, "warm_c": heat.warm_c}}

    def starts_json(self) -> dict[str, StartForecast]:
        """The start forecasts by job id, as JSON keys are: strings (clients read them back)."""
        return {str(job_id): start for job_id, start in self.state.forecasts.items()}

    def status(self) -> ClusterStatus:
        """Nodes, GPUs and their R1 summary: what `nebula status` shows, without the
        10,000 jobs of a busy queue that a snapshot also carries."""
        nodes = [n.json() for n in self.state.nodes.values()]
        gpus = self.gpus_json(raw=False)
        return {"nodes": nodes, "gpus": gpus, "summary": views.status_summary(nodes, gpus)}

    # ---------------------------------------------------------------- JSON views
    def gpus_json(self, node: str | None = None, raw: bool = True) -> list[GpuWire]:
        return [self.gpu_json(g, raw) for g in self.state.gpu_views(node)]

    def gpu_json(self, gpu: GpuView, raw: bool = True) -> GpuWire:
        node = self.state.nodes[gpu.node]
        live = self.state.gpus[gpu.uuid]
        processes = [{"pid": p.pid, "name": p.name, "used_memory_mb": p.used_memory_mb,
                      "job_id": _int_or_none(live.process_jobs.get(str(p.pid)))}
                     for p in live.processes]
        holds_service = any((job := self.state.jobs.get(job_id)) is not None and job.spec.service
                            for job_id, _ in gpu.placements)
        fits = common_fits(gpu, self.state.settings.config.service_spare_mb, holds_service)
        return views.gpu_json(gpu, node_up=node.state == NodeState.UP,
                              cuda_version=node.cuda_version,
                              nvlink=topo.nvlink_peers(node.topo, gpu.reading.index),
                              processes=processes, fits=fits, raw=raw)

    def queue_json(self) -> list[QueueRow]:
        """Every live job as the queue shows it: those holding GPUs first, then the waiting
        ones in the scheduler's order (``queue_pos``: the place in it; ``starts``: the
        last forecast of its start), then any not considered yet (submitted since the last
        pass), then held ones."""
        place = self.state.queue_place
        unplaced = len(place) + 1

        def rank(job: Job) -> tuple:
            if job.state.holds_gpus:
                return (0, 0, job.submitted_at, job.id)
            if job.held_by:
                return (2, 0, job.submitted_at, job.id)
            return (1, place.get(job.id, unplaced), job.submitted_at, job.id)
        starts = self.state.forecasts
        return [views.queue_row(j, self.state.queue_pos(j), starts.get(j.id) if j.state == JobState.PENDING else None)
                for j in sorted(self.state.jobs.values(), key=rank)]


    def publish_queue_order(self, starts: bool = False) -> None:
        """The queue's order; with ``starts`` the start forecasts too (after a new one)."""
        if self.subscribers:
            event: QueueEvent = {"type": "queue", "order": self.state.queue_order}
            if starts:
                event["starts"] = self.starts_json()
            self.publish(event)

    # ------------------------------------------------------------------ publishing
    def publish(self, event: Mapping[str, object]) -> None:
        for queue in list(self.subscribers):
            try:
                queue.put_nowait(event)
            except asyncio.QueueFull:
                self._fell_behind(queue)

    def _fell_behind(self, queue: asyncio.Queue) -> None:
        """A subscriber that cannot keep up: its backlog goes (so a stalled client costs the
        head at most one queue), RESYNC takes its place, and it gets no more events until it
        subscribes again with a fresh snapshot (the server does that on RESYNC)."""
        while not queue.empty():
            queue.get_nowait()
        queue.put_nowait(RESYNC)
        self.subscribers.discard(queue)

    def publish_event(self, row: EventRow) -> None:
        """A line of the events log the store committed (``Store.on_event``), as it is."""
        if self.subscribers:
            event: LogEvent = {"type": "event", "event": row}
            self.publish(event)

    def publish_job(self, job: Job) -> None:
        if self.subscribers:
            event: JobEvent = {"type": "job", "job": views.job_json(job)}
            self.publish(event)

    def publish_node(self, view: NodeView) -> None:
        event: NodeEvent = {"type": "node", "node": view.json()}
        self.publish(event)

    def publish_gpus(self, node: str) -> None:
        """One "gpus" event for ``node`` (after each of its probes, and after anything that
        changes what its GPUs show): what changed since its last one (see ``gpu_changes``).
        Sent even when nothing changed: the node reported, and trends take a point."""
        if self.subscribers:
            # Every node, every probe: the stream leaves out the raw reading (`nebula gpus`
            # has it), which no subscriber shows.
            event = self.gpu_changes(node, self.gpus_json(node, raw=False))
            view = self.state.nodes.get(node)
            if view is not None:  # the node reported: the Nodes screen's "Seen"
                event["seen"] = view.last_seen
            self.publish(event)

    def gpu_changes(self, node: str, gpus: list[GpuWire]) -> GpusEvent:
        """The "gpus" event that brings subscribers from what they hold of ``node``'s GPUs
        to ``gpus`` (and makes ``gpus`` what they hold):

        ``{"type": "gpus", "node": N, "gpus": {uuid: fields}, "gone": [uuid, …]}``: for a
        GPU new to subscribers (or whose set of fields changed) ``fields`` is the whole GPU
        (it has ``"uuid"``); otherwise only the fields whose value changed, and GPUs with
        none are left out. ``gone`` (only when some left) lists GPUs no longer on ``N``.
        At 1 Hz from every node this is most of the stream: utilisation, temperature and
        power, a few dozen bytes a GPU, instead of every GPU's ~700-byte descriptor.
        """
        before = self.published.get(node, {})
        changes: dict[str, Mapping[str, object]] = {}  # a whole GPU, or its changed fields

        for gpu in gpus:
            old = before.get(gpu["uuid"])
            if old is None or old.keys() != gpu.keys():
                changes[gpu["uuid"]] = gpu
            elif old != gpu:
                fields: Mapping[str, object] = old  # (the same keys as gpu's)
                changes[gpu["uuid"]] = {k: v for k, v in gpu.items() if fields[k] != v}

        now = {gpu["uuid"]: gpu for gpu in gpus}
        self.published[node] = now
        event: GpusEvent = {"type": "gpus", "node": node, "gpus": changes}

        gone = [uuid for uuid in before if uuid not in now]
        if gone:
            event["gone"] = gone
        return event
