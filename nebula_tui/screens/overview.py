"""The first screen: the R1 overview, a live GPU table and the job queue.

Data flow: one worker (group ``events``) reads the head service's event stream and posts a
message per event; the handlers keep plain dicts of nodes, GPUs and jobs and render them.
Table rows are keyed by GPU uuid / job id and only changed cells are rewritten.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable, Iterable

from textual import on, work
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Static

from ..api import ApiError
from ..model import format_mb
from ..views import short_model, status_summary, status_text
from .keys import OVERVIEW_KEYS, bindings

FINISHED = frozenset({"succeeded", "failed", "cancelled"})

#: Reconnect back-off: first wait, factor, longest wait (seconds).
RETRY_FIRST_S = 0.5
RETRY_FACTOR = 2.0
RETRY_MAX_S = 10.0

GPU_COLUMNS = (("node", "Node"), ("index", "GPU"), ("model", "Model"), ("memory", "Memory"),
               ("util", "Util"), ("temp", "Temp"), ("jobs", "Jobs"), ("status", "Status"))
QUEUE_COLUMNS = (("id", "ID"), ("user", "User"), ("name", "Name"), ("state", "State"),
                 ("where", "GPUs / reason"))


# ---------------------------------------------------------------------------- messages
class SnapshotArrived(Message):
    """The stream (re)started: the whole state of the head (nodes, GPUs, queue)."""

    def __init__(self, snapshot: dict) -> None:
        super().__init__()
        self.snapshot = snapshot


class JobChanged(Message):
    """One job changed; a finished one (succeeded/failed/cancelled) leaves the queue."""

    def __init__(self, job: dict) -> None:
        super().__init__()
        self.job = job


class GpusChanged(Message):
    """Fresh readings of every GPU on one node. Telemetry: a newer one for the same node
    replaces one not yet handled."""

    def __init__(self, node: str, gpus: list[dict]) -> None:
        super().__init__()
        self.node = node
        self.gpus = gpus

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, GpusChanged) and message.node == self.node


class NodeChanged(Message):
    """One node's state changed (up, unreachable, drained…)."""

    def __init__(self, node: dict) -> None:
        super().__init__()
        self.node = node


class StreamLost(Message):
    """The event stream broke (or never opened); the worker retries after ``retry_s``."""

    def __init__(self, reason: str, retry_s: float) -> None:
        super().__init__()
        self.reason = reason
        self.retry_s = retry_s


# ---------------------------------------------------------------------------- cells
def gpu_cells(gpu: dict, holders: Iterable[int]) -> tuple:
    """One GPU table row, in GPU_COLUMNS order; missing readings show as N/A."""
    util, temp = gpu.get("utilization_pct"), gpu.get("temperature_c")
    return (
        gpu["node"], str(gpu["index"]), short_model(gpu["model"]),
        f"{format_mb(gpu.get('memory_used_mb'))} / {format_mb(gpu.get('total_memory_mb'))}",
        "N/A" if util is None else f"{util:.0f}%",
        "N/A" if temp is None else f"{temp:.0f}°C",
        ",".join(str(j) for j in holders) or "-",
        gpu["status"],
    )


def job_where(job: dict) -> str:
    """Where a job runs (node:index, …), or for a waiting job why it waits."""
    if job["gpus"]:
        return ", ".join(f"{g['node']}:{g['index']}" for g in job["gpus"])
    if job["state"] == "pending" and job.get("reason"):
        return job["reason"]
    size = format_mb(job["gpu_mem_mb"]) if job.get("gpu_mem_mb") else "whole"
    return f"{job['gpu_count']}x {size}"


def job_cells(job: dict) -> tuple:
    """One queue table row, in QUEUE_COLUMNS order."""
    return (str(job["id"]), job["user"], job["name"] or "-", job["state"], job_where(job))


def sync_table(table: DataTable, shown: dict[Hashable, tuple], rows: dict[str, tuple]) -> None:
    """Make ``table`` show ``rows`` (key -> cells): add new rows, drop gone ones, and rewrite
    only the cells that changed. ``shown`` is what the table holds now; it is updated."""
    for key in [k for k in shown if k not in rows]:
        table.remove_row(key)
        del shown[key]
    columns = list(table.columns)
    for key, cells in rows.items():
        old = shown.get(key)
        if old is None:
            table.add_row(*cells, key=key)
        else:
            for column, before, after in zip(columns, old, cells):
                if before != after:
                    table.update_cell(key, column, after, update_width=True)
        shown[key] = cells


# ---------------------------------------------------------------------------- screen
class OverviewScreen(Screen):
    """R1 overview + GPUs + queue, live from the head's event stream."""

    BINDINGS = bindings(OVERVIEW_KEYS)

    def __init__(self) -> None:
        super().__init__()
        # The latest state as the head published it (plain dicts, never live objects).
        self.nodes: dict[str, dict] = {}
        self.gpus: dict[str, dict] = {}
        self.jobs: dict[int, dict] = {}
        self._shown_gpus: dict[Hashable, tuple] = {}
        self._shown_jobs: dict[Hashable, tuple] = {}

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("", id="connection")
        with Vertical(id="body"):
            yield Static("Connecting to the head service…", id="overview")
            yield DataTable(id="gpus", cursor_type="row", zebra_stripes=True)
            yield DataTable(id="queue", cursor_type="row", zebra_stripes=True)
        yield Footer()

    def on_mount(self) -> None:
        gpus = self.query_one("#gpus", DataTable)
        for key, label in GPU_COLUMNS:
            gpus.add_column(label, key=key)
        gpus.border_title = "GPUs"
        queue = self.query_one("#queue", DataTable)
        for key, label in QUEUE_COLUMNS:
            queue.add_column(label, key=key)
        queue.border_title = "Queue"
        self._set_connection("connecting…", lost=False)
        self.stream_events()

    # ------------------------------------------------------------------ worker
    @work(exclusive=True, group="events")
    async def stream_events(self) -> None:
        """The ``events`` group: at most one subscription to the head at a time.

        Reads the stream, posting one message per event; when the stream breaks it posts
        StreamLost and subscribes again with exponential back-off. Runs until cancelled
        (a new ``stream_events`` call, i.e. ``r``, replaces it).
        """
        delay = RETRY_FIRST_S
        while True:
            try:
                async for event in self.app.client.events():
                    kind = event.get("type")
                    if kind == "snapshot":
                        delay = RETRY_FIRST_S
                        self.post_message(SnapshotArrived(event))
                    elif kind == "job":
                        self.post_message(JobChanged(event["job"]))
                    elif kind == "gpus":
                        self.post_message(GpusChanged(event["node"], event["gpus"]))
                    elif kind == "node":
                        self.post_message(NodeChanged(event["node"]))
                    elif event.get("ok") is False:
                        raise ApiError(event.get("error", "subscription refused"))
                reason = "the head service closed the event stream"
            except (ApiError, OSError, ValueError, KeyError) as err:
                reason = str(err) or type(err).__name__
            self.post_message(StreamLost(reason, delay))
            await asyncio.sleep(delay)
            delay = min(delay * RETRY_FACTOR, RETRY_MAX_S)

    @work(group="actions")
    async def cancel(self, job_id: int) -> None:
        """The ``actions`` group: one-off requests; a refusal becomes a notification."""
        try:
            await self.app.client.call("cancel", job=job_id)
        except ApiError as err:
            self.notify(str(err), title=f"Cannot cancel job {job_id}", severity="error")
        else:
            self.notify(f"Job {job_id} cancelled")

    # ------------------------------------------------------------------ handlers
    @on(SnapshotArrived)
    def _snapshot(self, message: SnapshotArrived) -> None:
        snap = message.snapshot
        self.nodes = {n["name"]: n for n in snap.get("nodes", [])}
        self.gpus = {g["uuid"]: g for g in snap.get("gpus", [])}
        self.jobs = {j["id"]: j for j in snap.get("jobs", []) if j["state"] not in FINISHED}
        self._set_connection("connected", lost=False)
        self._render_all()

    @on(JobChanged)
    def _job(self, message: JobChanged) -> None:
        job = message.job
        if job["state"] in FINISHED:
            self.jobs.pop(job["id"], None)
        else:
            self.jobs[job["id"]] = job
        self._render_queue()
        self._render_gpus()  # the jobs column follows placements

    @on(GpusChanged)
    def _gpus(self, message: GpusChanged) -> None:
        fresh = {g["uuid"]: g for g in message.gpus}
        self.gpus = {u: g for u, g in self.gpus.items() if g["node"] != message.node}
        self.gpus.update(fresh)
        self._render_gpus()
        self._render_overview()

    @on(NodeChanged)
    def _node(self, message: NodeChanged) -> None:
        self.nodes[message.node["name"]] = message.node
        self._render_overview()

    @on(StreamLost)
    def _lost(self, message: StreamLost) -> None:
        self._set_connection(f"disconnected — retrying in {message.retry_s:g}s "
                             f"({message.reason})", lost=True)

    # ------------------------------------------------------------------ rendering
    def _render_all(self) -> None:
        self._render_overview()
        self._render_gpus()
        self._render_queue()

    def _render_overview(self) -> None:
        summary = status_summary(list(self.nodes.values()), list(self.gpus.values()))
        self.query_one("#overview", Static).update(status_text(summary))

    def _holders(self) -> dict[str, list[int]]:
        """GPU uuid -> ids of the live jobs placed on it (from the GPU and job events both,
        whichever arrived first)."""
        holders: dict[str, set[int]] = {}
        for uuid, gpu in self.gpus.items():
            holders[uuid] = {j for j in gpu.get("jobs", []) if j in self.jobs}
        for job in self.jobs.values():
            for placement in job["gpus"]:
                holders.setdefault(placement["uuid"], set()).add(job["id"])
        return {u: sorted(ids) for u, ids in holders.items()}

    def _render_gpus(self) -> None:
        holders = self._holders()
        ordered = sorted(self.gpus.values(), key=lambda g: (g["node"], g["index"]))
        rows = {g["uuid"]: gpu_cells(g, holders.get(g["uuid"], ())) for g in ordered}
        table = self.query_one("#gpus", DataTable)
        new = [u for u in rows if u not in self._shown_gpus]
        sync_table(table, self._shown_gpus, rows)
        if new:  # keep node/index order when GPUs appear after the first snapshot
            table.sort("node", "index", key=lambda cells: (cells[0], int(cells[1])))

    def _render_queue(self) -> None:
        rows = {str(j["id"]): job_cells(j) for j in self.jobs.values()}
        sync_table(self.query_one("#queue", DataTable), self._shown_jobs, rows)

    def _set_connection(self, state: str, *, lost: bool) -> None:
        self.app.sub_title = state
        banner = self.query_one("#connection", Static)
        banner.update(state)
        banner.set_class(lost, "lost")

    # ------------------------------------------------------------------ actions
    def action_reconnect(self) -> None:
        self._set_connection("reconnecting…", lost=False)
        self.stream_events()

    def action_cancel_job(self) -> None:
        table = self.query_one("#queue", DataTable)
        if table.row_count == 0:
            self.notify("No job selected: the queue is empty", severity="warning")
            return
        row_key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key
        self.cancel(int(row_key.value))
