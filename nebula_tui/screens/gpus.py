"""Every GPU in one sortable, filterable table; Enter opens one GPU's details.

Every GPU is a row of a ``RowTable`` keyed by uuid: only the rows on screen are computed
and painted. Telemetry reaches the table at most once a second: the visible rows are
recomputed and only the lines that changed are repainted (re-sorting first when the order
follows a live reading). The detail screen adds the R2 descriptor, slices and who holds
them, processes, and R18 history curves (``history`` requests, worker group ``history``).
"""

from __future__ import annotations

from collections.abc import Hashable

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import DataTable, Input, Static

from ..api import ApiError
from ..model import format_mb
from ..views import short_model
from .base import TELEMETRY_EVERY_S, ClusterScreen, OpMissing
from .keys import GPU_DETAIL_KEYS, GPUS_KEYS
from .render import (clock, memory_cell, set_columns, sparkline, status_cell, sync_table, temp_text,
                     util_cell)
from .rowtable import RowTable

# The facts people look for first come first: they must fit in 80 columns.
GPU_COLUMNS = (("gpu", "GPU"), ("model", "Model"), ("memory", "Memory"), ("util", "Util"),
               ("temp", "Temp"), ("jobs", "Jobs"), ("status", "Status"), ("trend", "Util trend"),
               ("power", "Power"))


def gpu_label(gpu: dict) -> str:
    return f"{gpu['node']}:{gpu['index']}"


def _num(value, missing: float) -> float:
    return missing if value is None else value


#: Sort orders the ``s`` key cycles through: (name, key on a GPU dict).
SORTS = (
    ("node", lambda g: (g["node"], g["index"])),
    ("free memory", lambda g: (-(_num(g.get("total_memory_mb"), 0) - _num(g.get("memory_used_mb"), 0)),
                               g["node"], g["index"])),
    ("utilisation", lambda g: (-_num(g.get("utilization_pct"), -1), g["node"], g["index"])),
    ("temperature", lambda g: (-_num(g.get("temperature_c"), -1), g["node"], g["index"])),
    ("status", lambda g: (g.get("status", ""), g["node"], g["index"])),
)


def gpu_row(gpu: dict, holders: list[int], trend) -> tuple:
    power = gpu.get("power_w")
    return (gpu_label(gpu), short_model(gpu["model"]), memory_cell(gpu, 6), util_cell(gpu, 5),
            temp_text(gpu.get("temperature_c")), ",".join(map(str, holders)) or "-",
            status_cell(gpu.get("status", "")), sparkline(trend or (), 10, 0, 100),
            "N/A" if power is None else f"{power:.0f} W")


def gpu_matches(gpu: dict, holders: list[int], needle: str) -> bool:
    """Case-insensitive substring match on what the row shows in words."""
    if not needle:
        return True
    hay = " ".join([gpu_label(gpu), gpu["model"], short_model(gpu["model"]), gpu.get("status", ""),
                    gpu.get("uuid", ""), *(f"job{j} {j}" for j in holders)]).lower()
    return needle.lower() in hay


class GpusScreen(ClusterScreen):
    SCREEN_TITLE = "GPUs"
    KEYS = GPUS_KEYS
    # The table has the focus from the start: Textual's default, the first focusable widget,
    # is the hidden filter, which took the digits typed while the screen was mounting.
    AUTO_FOCUS = "#gpu-table"

    def __init__(self) -> None:
        super().__init__()
        self.sort_index = 0
        self.needle = ""
        self._telemetry: set[str] = set()  # nodes whose readings changed since the last tick
        self._listed = -1  # the cluster's counts_version when the rows were last listed

    def compose_body(self) -> ComposeResult:
        with Vertical(id="body"):
            yield Input(placeholder="filter: node, model, status, job id…", id="gpu-filter")
            yield RowTable(GPU_COLUMNS, self._cells, id="gpu-table")

    def on_mount(self) -> None:
        self.query_one("#gpu-table", RowTable).focus()
        self.set_interval(TELEMETRY_EVERY_S, self._tick)

    def cluster_changed(self, change: str, key: object = None) -> None:
        if change == "gpus":
            self._telemetry.add(str(key))  # readings of one node: shown at the next tick
        elif change in ("all", "job", "node"):
            self.later()

    def _tick(self) -> None:
        """Once a second at most, fresh readings: re-sort and re-filter when the order or
        the filter depends on them, then recompute the visible rows of the nodes whose
        readings changed and repaint those whose cells did."""
        if not self._telemetry or not self.is_current:
            return
        nodes, self._telemetry = self._telemetry, set()
        if self.sort_index or self.needle or self._listed != self.cluster.counts_version:
            self.render_all()  # the order, the filter's matches or the set of GPUs moved
        else:
            by_node = self.cluster.by_node
            self.query_one("#gpu-table", RowTable).refresh_rows(
                {uuid for node in nodes for uuid in by_node.get(node, ())})

    def _cells(self, uuid: str) -> tuple:
        gpu = self.cluster.gpus.get(uuid)
        if gpu is None:  # its node just re-reported: gone until the next render_all
            return ("-",) * len(GPU_COLUMNS)
        return gpu_row(gpu, self.cluster.holders_of(uuid), self.cluster.util_trend.get(uuid))

    def render_all(self) -> None:
        self._listed = self.cluster.counts_version
        name, order = SORTS[self.sort_index]
        gpus = sorted(self.cluster.gpus.values(), key=order)
        shown = [g["uuid"] for g in gpus
                 if gpu_matches(g, self.cluster.holders_of(g["uuid"]), self.needle)]
        table = self.query_one("#gpu-table", RowTable)
        table.show(shown)
        table.refresh_rows()
        where = f" · filter “{self.needle}”" if self.needle else ""
        table.border_title = f"GPUs {len(shown)}/{len(gpus)} · sorted by {name}{where}"

    # ------------------------------------------------------------------ actions
    def action_cycle_sort(self) -> None:
        self.sort_index = (self.sort_index + 1) % len(SORTS)
        self.render_all()

    def action_filter(self) -> None:
        box = self.query_one("#gpu-filter", Input)
        box.add_class("shown")
        box.focus()

    def action_clear_filter(self) -> None:
        box = self.query_one("#gpu-filter", Input)
        box.value = ""
        box.remove_class("shown")
        self.query_one("#gpu-table", RowTable).focus()

    @on(Input.Changed, "#gpu-filter")
    def _filter_changed(self, event: Input.Changed) -> None:
        self.needle = event.value.strip()
        self.render_all()

    @on(Input.Submitted, "#gpu-filter")
    def _filter_done(self) -> None:
        self.query_one("#gpu-table", RowTable).focus()

    def action_open_gpu(self) -> None:
        key = self.query_one("#gpu-table", RowTable).cursor_key
        if key:
            self.app.push_screen(GpuDetailScreen(key))

    @on(RowTable.Selected, "#gpu-table")
    def _selected(self, event: RowTable.Selected) -> None:
        self.app.push_screen(GpuDetailScreen(event.key))


# ============================================================================ detail
#: History curves: (sample field, label, unit, fixed low, fixed high).
CURVES = (
    ("temperature_c", "Temperature", "°C", None, None),
    ("utilization_pct", "Utilisation", "%", 0, 100),
    ("memory_used_mb", "Memory used", "MB", 0, None),
    ("power_w", "Power", "W", 0, None),
    ("fan_pct", "Fan", "%", 0, 100),
    ("sm_clock_mhz", "SM clock", "MHz", None, None),
    ("mem_clock_mhz", "Mem clock", "MHz", None, None),
)

#: How far back the curves reach, and how often they reload (R18 samples every 30 s).
HISTORY_SPAN_S = 3 * 3600
HISTORY_RELOAD_S = 30.0


def descriptor_text(gpu: dict) -> Text:
    """The R2 descriptor, one field a line."""
    nvlink = ", ".join(str(p.get("peer", p)) if isinstance(p, dict) else str(p)
                       for p in gpu.get("nvlink") or []) or "none"
    fields = (
        ("UUID", gpu["uuid"]), ("Node", f"{gpu['node']} (GPU {gpu['index']})"),
        ("Model", gpu["model"]), ("Vendor", gpu.get("vendor") or "N/A"),
        ("Memory", format_mb(gpu.get("total_memory_mb"))),
        ("Arch", gpu.get("compute_capability") or "N/A"),
        ("PCI bus", gpu.get("pci_bus_id") or "N/A"), ("NVLink", nvlink),
        ("Driver", gpu.get("driver_version") or "N/A"),
        ("CUDA (max)", gpu.get("cuda_version") or "N/A"),
        ("Status", gpu.get("status", "N/A") + (f" ({gpu['blocked']})" if gpu.get("blocked") else "")),
    )
    return Text("\n").join(Text.assemble((f"{k:<11}", "bold"), str(v)) for k, v in fields)


def curves_text(samples: list[dict], width: int) -> Text:
    """One sparkline per R18 metric with its latest, lowest and highest value."""
    if not samples:
        return Text("No samples recorded yet (the head records one every 30 s).", style="dim")
    lines = []
    for field, label, unit, lo, hi in CURVES:
        values = [s.get(field) for s in samples]
        known = [v for v in values if v is not None]
        line = Text(f"{label:<12}", style="bold")
        line.append(sparkline(values, width, lo, hi), style="cyan")
        if known:
            line.append(f" {known[-1]:.0f}{unit}  (min {min(known):.0f}, max {max(known):.0f})")
        else:
            line.append(" N/A", style="dim")
        lines.append(line)
    first, last = samples[0].get("t"), samples[-1].get("t")
    lines.append(Text(f"{len(samples)} samples, {clock(first)} – {clock(last)}", style="dim"))
    return Text("\n").join(lines)


class GpuDetailScreen(ClusterScreen):
    SCREEN_TITLE = "GPU"
    KEYS = GPU_DETAIL_KEYS

    def __init__(self, uuid: str) -> None:
        super().__init__()
        self.uuid = uuid
        self.samples: list[dict] = []
        self.history_note = "Loading history…"
        self._shown_slices: dict[Hashable, tuple] = {}
        self._shown_procs: dict[Hashable, tuple] = {}

    def compose_body(self) -> ComposeResult:
        with VerticalScroll(id="gpu-detail"):
            with Horizontal(id="gpu-top"):
                yield Static("", id="gpu-descriptor")
                with Vertical(id="gpu-tables"):
                    yield DataTable(id="gpu-slices", cursor_type="row")
                    yield DataTable(id="gpu-procs", cursor_type="row")
            yield Static(self.history_note, id="gpu-history")

    def on_mount(self) -> None:
        set_columns(self.query_one("#gpu-slices", DataTable),
                    (("id", "Slice"), ("mem", "Memory"), ("state", "State"), ("job", "Held by")), "Slices")
        set_columns(self.query_one("#gpu-procs", DataTable),
                    (("pid", "PID"), ("name", "Process"), ("mem", "Memory"), ("owner", "Owner")), "Processes")
        self.query_one("#gpu-history").border_title = "History (R18)"
        self.load_history()
        self.set_interval(HISTORY_RELOAD_S, self.load_history)

    def cluster_changed(self, change: str, key: object = None) -> None:
        gpu = self.cluster.gpus.get(self.uuid)
        if change in ("all", "job") or (change == "gpus" and gpu and gpu["node"] == key):
            self.render_all()

    def render_all(self) -> None:
        gpu = self.cluster.gpus.get(self.uuid)
        if gpu is None:
            self.query_one("#gpu-descriptor", Static).update(f"No GPU {self.uuid} on this head.")
            return
        box = self.query_one("#gpu-descriptor", Static)
        box.border_title = f"GPU {gpu_label(gpu)} · {short_model(gpu['model'])}"
        box.update(descriptor_text(gpu))
        jobs = self.cluster.jobs
        slices = {}
        for s in gpu.get("slices", []):
            job = jobs.get(s.get("job")) if s.get("job") is not None else None
            holder = "-" if s.get("job") is None else (
                f"job {s['job']} ({job['user']}{', ' + job['name'] if job and job['name'] else ''})"
                if job else f"job {s['job']}")
            size = format_mb(s["memory_mb"]) + (" (whole)" if s.get("exclusive") else "")
            slices[str(s["id"])] = (str(s["id"]), size, status_cell(s["state"]), holder)
        sync_table(self.query_one("#gpu-slices", DataTable), self._shown_slices, slices)
        procs = {}
        for p in gpu.get("processes", []):
            owner = f"job {p['job_id']}" if p.get("job_id") is not None else (
                "ours" if p.get("managed") else "?")
            procs[str(p["pid"])] = (str(p["pid"]), p.get("name") or "N/A",
                                    format_mb(p.get("used_memory_mb")), owner)
        table = self.query_one("#gpu-procs", DataTable)
        sync_table(table, self._shown_procs, procs)
        unmanaged = gpu.get("unmanaged_used_mb") or 0
        table.border_subtitle = (f"unmanaged: {format_mb(unmanaged)}" if unmanaged
                                 else "no unmanaged memory")

    @work(exclusive=True, group="history")
    async def load_history(self) -> None:
        """The ``history`` group: one ``history`` request at a time for this GPU."""
        box = self.query_one("#gpu-history", Static)
        try:
            reply = await self.app.call("history", gpu=self.uuid, since=HISTORY_SPAN_S)
        except OpMissing:
            box.update(Text("History is not available on this service (no 'history' request).",
                            style="yellow"))
            return
        except ApiError as err:
            box.update(Text(f"Cannot load history: {err}", style="red"))
            return
        self.samples = reply.get("samples", [])
        width = max(10, box.size.width - 40 if box.size.width else 40)
        box.update(curves_text(self.samples, min(width, 120)))

    def action_load_history(self) -> None:
        self.load_history()
