"""Every GPU in one sortable, filterable table; Enter opens one GPU's page.

Every GPU is a row of a ``RowTable`` keyed by uuid: only the rows on screen are computed
and painted. Telemetry reaches the table at most once a second: the visible rows are
recomputed and only the lines that changed are repainted (re-sorting first when the order
follows a live reading). At 80 columns the columns that matter for finding a card stay
(GPU, model, free memory, utilisation, temperature, status, who holds it); the line under
the table says everything of the card under the cursor, a maintenance reason in full.

The GPU page adds the R2 descriptor, what the card can still take, who holds each slice
(user:job), every process on it (those nobody started through NebulaGrid marked as
unmanaged), and the recorded history as time-axis plots (``history`` requests, worker
group ``history``), each on a fixed scale so that a flat line is drawn flat.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.containers import Grid, Horizontal, Vertical, VerticalScroll
from textual.widgets import Static
from textual_plotext import PlotextPlot

from ..api import ApiError
from ..model import NOT_AVAILABLE, format_mb
from ..views import short_model
from ..wire import BookingView, GpuHistoryReply, GpuHistoryRequest, GpuWire, TelemetrySample
from ..units import MIB_PER_GIB
from .base import TELEMETRY_EVERY_S, ClusterScreen, OpMissing
from .look import LOOK
from .render import (booking_line, clock, fill_bar, fits_text, free_slice_mb, gpu_label, holders_text,
                     memory_cell, memory_fraction, memory_text, now, power_text,
                     sparkline, state_text, temp_text, util_cell)
from .widgets.keys import GPU_DETAIL_KEYS, GPUS_KEYS
from .widgets.rowtable import Column, RowTable, Sort

#: how far ahead a GPU's page lists its bookings
BOOKINGS_AHEAD_S = 7 * 86400.0

# The facts people look for first stay at 80 columns; the rest is left out by priority.
GPU_COLUMNS = (Column("gpu", "GPU"), Column("model", "Model", 1), Column("free", "Free"),
               Column("memory", "Memory", 4), Column("util", "Util", 2),
               Column("temp", "Temp", 1), Column("power", "Power", 5),
               Column("fits", "Fits 4G/8G/16G", 6), Column("status", "Status"),
               Column("trend", "Util trend", 7), Column("holders", "Held by", 3, flex=True))


def _num(value, missing: float) -> float:
    return missing if value is None else value


#: Sorts of the GPU columns; the first is the table's order at first.
SORTS = {
    "gpu": Sort(lambda g: (g["node"], g["index"])),
    "model": Sort(lambda g: (short_model(g["model"]), g["node"], g["index"])),
    "free": Sort(lambda g: (free_slice_mb(g), g["node"]), True),
    "memory": Sort(lambda g: _num(memory_fraction(g), -1), True),
    "util": Sort(lambda g: _num(g.get("utilization_pct"), -1), True),
    "temp": Sort(lambda g: _num(g.get("temperature_c"), -1), True),
    "power": Sort(lambda g: _num(g.get("power_w"), -1), True),
    "fits": Sort(lambda g: (g.get("fits") or {}).get("8G", 0), True),
    "status": Sort(lambda g: (g.get("status", ""), g["node"], g["index"])),
    "holders": Sort(lambda g: (len(g.get("jobs") or ()), g["node"]), True),
}
#: Sorts that do not follow live readings (a telemetry tick leaves the order as it is).
STEADY_SORTS = frozenset({"gpu", "model"})


def gpu_row(gpu: GpuWire, holders: str, trend) -> tuple:
    free = free_slice_mb(gpu)
    return (gpu_label(gpu), short_model(gpu["model"]),
            Text(format_mb(free), style=LOOK.role("free")) if free else Text("0", style="dim"),
            memory_cell(gpu, 6), util_cell(gpu, 4), temp_text(gpu.get("temperature_c")),
            power_text(gpu), fits_text(gpu), state_text(gpu.get("status")),
            sparkline(trend or (), 10, 0, 100), holders)


def gpu_text(gpu: GpuWire, holders: str) -> str:
    """What the filter matches: the row's words, the uuid and who holds the card."""
    return " ".join((gpu_label(gpu), gpu["model"], short_model(gpu["model"]),
                     gpu.get("status", ""), gpu.get("uuid", ""), holders,
                     *(f"job{j}" for j in gpu.get("jobs") or ())))


def gpu_detail_line(gpu: GpuWire, holders: str) -> Text:
    """The card under the cursor, in full: memory, power, what fits, who holds it, and a
    maintenance reason (which names the command that brings it back)."""
    text = Text(f"{gpu_label(gpu)} ", style="bold")
    text.append(f"{gpu['model']} · {memory_text(gpu)} used · ")
    free = free_slice_mb(gpu)
    text.append(f"{format_mb(free)} free for new jobs" if free else "nothing free",
                style=LOOK.role("free") if free else "dim")
    text.append(f" · fits {fits_text(gpu)} · {power_text(gpu)} · held by {holders}")
    if gpu.get("blocked") or gpu.get("status") in ("maintenance", "unreachable"):
        text.append(f"\n{gpu.get('status')}: ", style=LOOK.state(gpu.get("status")))
        text.append(gpu.get("blocked") or "its node does not answer")
    return text


class GpusScreen(ClusterScreen):
    SCREEN_TITLE = "GPUs"
    KEYS = GPUS_KEYS
    # The table has the focus from the start: Textual's default, the first focusable widget,
    # could be one that takes the digits typed while the screen was mounting.
    AUTO_FOCUS = "#gpu-table"

    def __init__(self) -> None:
        super().__init__()
        self.free_only = False
        self._telemetry: set[str] = set()  # nodes whose readings changed since the last tick
        self._listed = -1  # the cluster's counts_version when the rows were last listed

    def compose_body(self) -> ComposeResult:
        with Vertical(id="body"):
            yield RowTable(GPU_COLUMNS, self._cells, sorts=SORTS, sort="gpu", id="gpu-table")
            yield Static("", id="gpu-line")

    def on_mount(self) -> None:
        if (table := self.live_table("#gpu-table")) is not None:
            table.focus()
        self.set_interval(TELEMETRY_EVERY_S, self._tick)

    def cluster_changed(self, change: str, key: object = None) -> None:
        if change == "gpus":
            self._telemetry.add(str(key))  # readings of one node: shown at the next tick
        elif change in ("all", "job", "node", "bookings"):
            self.later()

    def _tick(self) -> None:
        """Once a second at most, fresh readings: re-sort and re-filter when the order or
        the filter depends on them, then recompute the visible rows of the nodes whose
        readings changed and repaint those whose cells did."""
        if not self._telemetry or not self.is_current:
            return
        nodes, self._telemetry = self._telemetry, set()
        table = self.query_one("#gpu-table", RowTable)
        if (table.sort_column not in STEADY_SORTS or table.needle or self.free_only
                or self._listed != self.cluster.counts_version):
            self.render_all()  # the order, the filter's matches or the set of GPUs moved
        else:
            by_node = self.cluster.by_node
            table.refresh_rows({uuid for node in nodes for uuid in by_node.get(node, ())})
            self._show_line()

    def _holders(self, gpu: GpuWire) -> str:
        held = holders_text(gpu, self.cluster.jobs, self.cluster.holders_of(gpu["uuid"]))
        booked = [b["name"] for b in self.cluster.bookings_of(gpu["uuid"]) if b.get("active")]
        return f"{held} · booked for {', '.join(booked)}" if booked else held

    def _cells(self, uuid: str) -> tuple:
        gpu = self.cluster.gpus.get(uuid)
        if gpu is None:  # its node just re-reported: gone until the next render_all
            return ("-",) * len(GPU_COLUMNS)
        return gpu_row(gpu, self._holders(gpu), self.cluster.util_trend.get(uuid))

    def render_all(self) -> None:
        self._listed = self.cluster.counts_version
        table = self.query_one("#gpu-table", RowTable)
        gpus = list(self.cluster.gpus.values())
        listed = [g for g in gpus if free_slice_mb(g)] if self.free_only else gpus
        table.present(sorted(listed, key=SORTS["gpu"].key), lambda g: g["uuid"],
                      lambda g: gpu_text(g, self._holders(g)),
                      "GPUs with free memory" if self.free_only else "GPUs", len(gpus))
        self._show_line()

    def _show_line(self) -> None:
        uuid = self.query_one("#gpu-table", RowTable).cursor_key
        gpu = self.cluster.gpus.get(uuid) if uuid else None
        self.query_one("#gpu-line", Static).update(
            gpu_detail_line(gpu, self._holders(gpu)) if gpu else "")

    @on(RowTable.Highlighted, "#gpu-table")
    def _moved(self) -> None:
        self._show_line()

    @on(RowTable.Arranged, "#gpu-table")
    def _arranged(self) -> None:
        self.render_all()

    # ------------------------------------------------------------------ actions
    def action_toggle_free(self) -> None:
        self.free_only = not self.free_only
        self.render_all()

    def filter_to(self, needle: str) -> None:
        """Show only the GPUs matching ``needle`` (``:node node01``); esc clears it."""
        table = self.query_one("#gpu-table", RowTable)
        table.set_filter(needle)
        table.focus()

    def action_open_gpu(self) -> None:
        key = self.query_one("#gpu-table", RowTable).cursor_key
        if key:
            self.tui.open_gpu(key)

    @on(RowTable.Selected, "#gpu-table")
    def _selected(self, event: RowTable.Selected) -> None:
        self.tui.open_gpu(event.key)


# ============================================================================ detail
#: History plots: (sample field, title, unit). Each has a fixed scale (see ``plot_range``).
PLOTS = (
    ("temperature_c", "Temperature", "°C"),
    ("utilization_pct", "Utilisation", "%"),
    ("memory_used_mb", "Memory used", "GB"),
    ("power_w", "Power", "W"),
)

#: Below this many columns the GPU page stacks its panels.
NARROW_WIDTH = 110

#: How far back the plots reach, and how often they reload (R18 samples every 30 s).
HISTORY_SPAN_S = 3 * 3600
HISTORY_RELOAD_S = 30.0


#: The GPU page's small tables sort like every other.
SLICE_SORTS = {"id": Sort(lambda s: s["id"]), "mem": Sort(lambda s: s["memory_mb"], True),
               "state": Sort(lambda s: s["state"]), "job": Sort(lambda s: s.get("job") or 0)}
PROC_SORTS = {"pid": Sort(lambda p: p["pid"]), "mem": Sort(lambda p: p.get("used_memory_mb") or 0, True),
              "owner": Sort(lambda p: (p.get("job_id") is None, p.get("job_id") or 0)),
              "name": Sort(lambda p: p.get("name") or "")}


def plot_range(field: str, gpu: Mapping[str, Any], values: list[float], hot_c: float) -> tuple[float, float]:
    """The y-axis of one plot (in the plotted unit), fixed by what the value can be rather
    than by the values seen, so a constant reading is a flat line where it belongs (1 MB
    of 24 GB at the bottom, not a full bar)."""
    top = max(values, default=0)
    if field == "utilization_pct":
        return 0, 100
    if field == "memory_used_mb":  # (drawn in GB)
        total = gpu.get("total_memory_mb")
        return 0, total / MIB_PER_GIB if total else max(top, 1)
    if field == "temperature_c":
        return 0, max(hot_c + 15, top + 5)
    limit = gpu.get("power_limit_w")
    return 0, float(limit or max(top * 1.25, 50))


def nvlink_text(gpu: GpuWire) -> str:
    """"GPU1 (NV12), GPU3 (NV4)", or "none"."""
    peers = []
    for peer in gpu.get("nvlink") or []:
        if isinstance(peer, dict):
            link = f" ({peer['link']})" if peer.get("link") else ""
            peers.append(f"GPU{peer.get('gpu', '?')}{link}")
        else:
            peers.append(str(peer))
    return ", ".join(peers) or "none"


def descriptor_text(gpu: GpuWire) -> Text:
    """The R2 descriptor, one field a line."""
    fields = (
        ("UUID", gpu["uuid"]), ("Node", f"{gpu['node']} (GPU {gpu['index']})"),
        ("Model", gpu["model"]), ("Vendor", gpu.get("vendor") or NOT_AVAILABLE),
        ("Memory", format_mb(gpu.get("total_memory_mb"))),
        ("Arch", gpu.get("compute_capability") or NOT_AVAILABLE),
        ("PCI bus", gpu.get("pci_bus_id") or NOT_AVAILABLE), ("NVLink", nvlink_text(gpu)),
        ("Driver", gpu.get("driver_version") or NOT_AVAILABLE),
        ("CUDA (max)", gpu.get("cuda_version") or NOT_AVAILABLE),
    )
    text = Text("\n").join(Text.assemble((f"{k:<11}", "bold"), str(v)) for k, v in fields)
    text.append("\n")
    text.append(f"{'Status':<11}", style="bold")
    text.append_text(state_text(gpu.get("status")))
    if gpu.get("blocked"):  # wraps in the box: the command at its end must stay readable
        text.append(f"\n{gpu['blocked']}", style=LOOK.state(gpu.get("status")))
    if gpu.get("cuda_gap"):  # the head's sentence: why its CUDA cannot serve it, what to install
        text.append(f"\n{gpu['cuda_gap']}", style=LOOK.role("warn"))
    return text


def live_text(gpu: GpuWire, holders: str, hot_c: float, bookings: Sequence[BookingView] = ()) -> Text:
    """The card now: memory, what fits, load, heat, power, who holds it, its bookings
    under way or in the coming week."""
    free = free_slice_mb(gpu)
    lines = [
        Text.assemble(("Memory  ", "bold"), fill_bar(memory_fraction(gpu), 12),
                      f" {memory_text(gpu)} used"),
        Text.assemble(("Free    ", "bold"), (f"{format_mb(free)} for new jobs" if free else
                                             "nothing for new jobs", LOOK.role("free") if free else "dim")),
        Text.assemble(("Fits    ", "bold"), fits_text(gpu), (" more (at most 4 jobs a card)", "dim")),
        Text.assemble(("Util    ", "bold"), util_cell(gpu, 12)),
        Text.assemble(("Temp    ", "bold"), temp_text(gpu.get("temperature_c")),
                      (f" (hot from {hot_c:.0f}°C)", "dim")),
        Text.assemble(("Power   ", "bold"), power_text(gpu)),
        Text.assemble(("Held by ", "bold"), holders),
    ]
    soon = [b for b in bookings if b["start"] < now() + BOOKINGS_AHEAD_S]
    lines += [Text.assemble(("Booked  " if n == 0 else "        ", "bold"), booking_line(b))
              for n, b in enumerate(soon)] or [Text.assemble(("Booked  ", "bold"), ("not in the coming week", "dim"))]
    return Text("\n").join(lines)


class GpuDetailScreen(ClusterScreen):
    SCREEN_TITLE = "GPU"
    KEYS = GPU_DETAIL_KEYS

    def __init__(self, uuid: str) -> None:
        super().__init__()
        self.uuid = uuid
        self.samples: list[TelemetrySample] = []

    def crumb(self) -> str:
        gpu = self.cluster.gpus.get(self.uuid)
        return f"GPU {gpu_label(gpu)}" if gpu else "GPU"

    def on_resize(self, event) -> None:
        # At 80 columns the descriptor and the card's tables go one above the other.
        self.set_class(self.size.width < NARROW_WIDTH, "narrow")

    def compose_body(self) -> ComposeResult:
        with VerticalScroll(id="gpu-detail"):
            with Horizontal(id="gpu-top"):
                yield Static("", id="gpu-descriptor")
                with Vertical(id="gpu-side"):
                    yield Static("", id="gpu-live")
                    yield RowTable((Column("id", "Slice"), Column("mem", "Memory"),
                                    Column("state", "State"), Column("job", "Held by", flex=True)),
                                   self._slice_cells, sorts=SLICE_SORTS, sort="id", id="gpu-slices")
                    yield RowTable((Column("pid", "PID"), Column("mem", "Memory"),
                                    Column("owner", "Owner"), Column("name", "Process", flex=True)),
                                   self._proc_cells, sorts=PROC_SORTS, sort="mem", id="gpu-procs")
            yield Static("Loading history…", id="gpu-history-note")
            with Grid(id="gpu-plots"):
                for field, title, unit in PLOTS:
                    yield PlotextPlot(id=f"plot-{field}", classes="gpu-plot")

    def on_mount(self) -> None:
        self.query_one("#gpu-history-note").border_title = "History"
        self.load_history()
        self.set_interval(HISTORY_RELOAD_S, self.load_history)

    def cluster_changed(self, change: str, key: object = None) -> None:
        gpu = self.cluster.gpus.get(self.uuid)
        if change in ("all", "job", "bookings") or (change == "gpus" and gpu and gpu["node"] == key):
            self.render_all()

    def _gpu(self) -> Mapping[str, Any]:
        return self.cluster.gpus.get(self.uuid) or {}

    def _slice_cells(self, key: str) -> tuple:
        s = next((s for s in self._gpu().get("slices", []) if str(s["id"]) == key), None)
        if s is None:
            return ("-",) * 4
        jobs = self.cluster.jobs
        job = jobs.get(s.get("job")) if s.get("job") is not None else None
        holder = "-" if s.get("job") is None else (
            f"{job['user']}:{s['job']}{' ' + name if (name := job.get('name')) else ''}" if job
            else f"job {s['job']}")
        size = format_mb(s["memory_mb"]) + (" (whole)" if s.get("exclusive") else "")
        return (str(s["id"]), size, state_text(s["state"]), holder)

    def _proc_cells(self, key: str) -> tuple:
        p = next((p for p in self._gpu().get("processes", []) if str(p["pid"]) == key), None)
        if p is None:
            return ("-",) * 4
        job = self.cluster.job(p["job_id"]) if p.get("job_id") is not None else None
        if p.get("job_id") is not None:
            owner = Text(f"{job['user']}:{p['job_id']}" if job else f"job {p['job_id']}",
                         style=LOOK.role("info"))
        else:
            owner = Text("unmanaged", style=LOOK.role("warn"))
        return (str(p["pid"]), format_mb(p.get("used_memory_mb")), owner, p.get("name") or NOT_AVAILABLE)

    def render_all(self) -> None:
        gpu = self.cluster.gpus.get(self.uuid)
        if gpu is None:
            self.query_one("#gpu-descriptor", Static).update(f"No GPU {self.uuid} on this head.")
            return
        box = self.query_one("#gpu-descriptor", Static)
        box.border_title = f"GPU {gpu_label(gpu)} · {short_model(gpu['model'])}"
        box.update(descriptor_text(gpu))
        holders = holders_text(gpu, self.cluster.jobs, self.cluster.holders_of(self.uuid))
        live = self.query_one("#gpu-live", Static)
        live.border_title = "Now"
        live.update(live_text(gpu, holders, LOOK.temperatures.hot_c, self.cluster.bookings_of(self.uuid)))
        slices = self.query_one("#gpu-slices", RowTable)
        slices.show(slices.arrange(gpu.get("slices", []), lambda s: str(s["id"]),
                                   lambda s: " ".join(map(str, self._slice_cells(str(s["id"]))))))
        slices.refresh_rows()
        procs = self.query_one("#gpu-procs", RowTable)
        procs.show(procs.arrange(gpu.get("processes", []), lambda p: str(p["pid"]),
                                 lambda p: " ".join(map(str, self._proc_cells(str(p["pid"]))))))
        procs.refresh_rows()
        slices.set_title("Slices", slices.row_count, len(gpu.get("slices", [])))
        procs.set_title("Processes", procs.row_count, len(gpu.get("processes", [])))
        unmanaged = gpu.get("unmanaged_used_mb") or 0
        procs.border_subtitle = (f"unmanaged: {format_mb(unmanaged)}" if unmanaged
                                 else "no unmanaged memory")

    @on(RowTable.Arranged)
    def _arranged(self) -> None:
        self.render_all()

    @work(exclusive=True, group="history")
    async def load_history(self) -> None:
        """The ``history`` group: one ``history`` request at a time for this GPU."""
        note = self.query_one("#gpu-history-note", Static)
        try:
            reply = await self.tui.call("history", GpuHistoryReply,
                                        **GpuHistoryRequest(gpu=self.uuid, since=HISTORY_SPAN_S))
        except OpMissing:
            note.update(Text("History is not available on this service (no 'history' request).",
                             style=LOOK.role("warn")))
            return
        except ApiError as err:
            note.update(Text(f"Cannot load history: {err}", style=LOOK.role("bad")))
            return
        self.samples = reply.get("samples", [])
        self.draw_history()

    def draw_history(self) -> None:
        notes = self.query("#gpu-history-note")
        if not notes:  # the page is closing under the answer
            return
        note = notes.first(Static)
        samples: list[Mapping[str, Any]] = [s for s in self.samples if s.get("t") is not None]
        if not samples:
            note.update(Text("No samples recorded yet (the head records one every 30 s).",
                             style="dim"))
            return
        first, last = samples[0]["t"], samples[-1]["t"]
        note.update(Text(f"{len(samples)} samples, {clock(first)} – {clock(last)} "
                         f"(the last {HISTORY_SPAN_S // 3600} hours at most)", style="dim"))
        gpu = self._gpu()
        span = max(last - first, 60.0)
        ticks = [first + span * n / 3 for n in range(4)]
        plots = {plot.id: plot for plot in self.query(PlotextPlot)}
        for field, title, unit in PLOTS:
            scale = 1 / MIB_PER_GIB if field == "memory_used_mb" else 1
            points = [(s["t"], s[field] * scale) for s in samples if s.get(field) is not None]
            plot = plots.get(f"plot-{field}")
            if plot is None:  # the page is closing under the answer
                return
            plt = plot.plt
            plt.clear_data()
            plt.clear_figure()
            values = [v for _, v in points]
            lo, hi = plot_range(field, gpu, values, LOOK.temperatures.hot_c)
            now_text = f"{values[-1]:.0f} {unit}" if values else NOT_AVAILABLE
            plt.title(f"{title}: {now_text}")
            if points:
                plt.plot([t for t, _ in points], values, marker="braille")
            plt.xlim(first, first + span)
            plt.ylim(lo, hi)
            plt.xticks(ticks, [clock(t)[:5] for t in ticks])
            plot.refresh()

    def action_load_history(self) -> None:
        self.load_history()
