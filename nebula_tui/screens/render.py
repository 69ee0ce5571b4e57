"""How data looks on screen: bars, temperature colours, table cells, in-place table sync.

Pure functions from the head's plain dicts to Rich ``Text`` and cell tuples; no I/O and no
widgets, except ``sync_table`` which rewrites a DataTable's changed cells only.
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Iterable

from rich.text import Text
from textual.widgets import DataTable

from ..model import format_mb
from ..views import short_model

_EIGHTHS = " ▏▎▍▌▋▊▉"

#: Temperature thresholds (°C): below COOL green, below HOT yellow, from HOT red (R19: >75 is hot).
TEMP_COOL_C = 60
TEMP_HOT_C = 75


def bar(fraction: float | None, width: int, style: str = "green") -> Text:
    """A horizontal bar ``width`` cells wide filled to ``fraction`` (eighth-cell steps);
    an unknown fraction is a dim row of dots."""
    if fraction is None:
        return Text("·" * width, style="dim")
    fraction = min(max(fraction, 0.0), 1.0)
    eighths = round(fraction * width * 8)
    full, part = divmod(eighths, 8)
    filled = "█" * full + (_EIGHTHS[part] if part else "")
    text = Text(filled, style=style)
    text.append("░" * (width - len(filled)), style="dim")
    return text


def load_style(fraction: float | None) -> str:
    """Bar colour by how full: green, then yellow above 70%, red above 90%."""
    if fraction is None or fraction < 0.7:
        return "green"
    return "yellow" if fraction < 0.9 else "red"


def temp_style(temp_c: float | None) -> str:
    if temp_c is None:
        return "dim"
    if temp_c < TEMP_COOL_C:
        return "green"
    return "yellow" if temp_c < TEMP_HOT_C else "bold red"


def temp_text(temp_c: float | None) -> Text:
    return Text("N/A" if temp_c is None else f"{temp_c:.0f}°C", style=temp_style(temp_c))


def memory_text(gpu: dict) -> str:
    """"6 GB / 24 GB": used of total, as nvidia-smi would say it."""
    return f"{format_mb(gpu.get('memory_used_mb'))} / {format_mb(gpu.get('total_memory_mb'))}"


def memory_fraction(gpu: dict) -> float | None:
    used, total = gpu.get("memory_used_mb"), gpu.get("total_memory_mb")
    if used is None or not total:
        return None
    return used / total


def util_fraction(gpu: dict) -> float | None:
    util = gpu.get("utilization_pct")
    return None if util is None else min(max(util, 0.0), 100.0) / 100


def memory_cell(gpu: dict, width: int = 10) -> Text:
    frac = memory_fraction(gpu)
    text = bar(frac, width, load_style(frac))
    text.append(f" {memory_text(gpu)}")
    return text


def util_cell(gpu: dict, width: int = 6) -> Text:
    frac = util_fraction(gpu)
    text = bar(frac, width, "cyan")
    text.append(" N/A" if frac is None else f" {frac * 100:3.0f}%")
    return text


STATUS_STYLE = {"idle": "green", "busy": "yellow", "maintenance": "bold red",
                "unreachable": "red", "up": "green", "drained": "yellow", "unknown": "red",
                "down": "bold red", "connecting": "dim",
                "running": "green", "launching": "cyan", "pending": "yellow",
                "succeeded": "green", "failed": "red", "cancelled": "dim", "timeout": "red"}


def status_cell(status: str) -> Text:
    return Text(status, style=STATUS_STYLE.get(status, ""))


# ------------------------------------------------------------------------- sparklines
_SPARKS = "▁▂▃▄▅▆▇█"


def sparkline(values: Iterable[float | None], width: int, lo: float | None = None,
              hi: float | None = None) -> str:
    """The last ``width`` values as one line of block characters (gaps as spaces)."""
    tail = list(values)[-width:]
    known = [v for v in tail if v is not None]
    if not known:
        return " " * width
    lo = min(known) if lo is None else lo
    hi = max(known) if hi is None else hi
    span = (hi - lo) or 1.0
    out = []
    for v in tail:
        if v is None:
            out.append(" ")
        else:
            step = int((min(max(v, lo), hi) - lo) / span * (len(_SPARKS) - 1) + 0.5)
            out.append(_SPARKS[step])
    return "".join(out).rjust(width)


# ------------------------------------------------------------------------- node cards
def node_card(node: dict, gpus: list[dict], holders: dict[str, list[int]]) -> Text:
    """One node's card: a title line, then one line per GPU with memory and utilisation
    bars and a coloured temperature."""
    state = node.get("state", "unknown")
    title = Text(node["name"], style="bold")
    title.append("  ")
    title.append(state, style=STATUS_STYLE.get(state, ""))
    if node.get("reason"):
        title.append(f" ({node['reason']})", style="dim")
    health = next((g.get("health_score") for g in gpus if g.get("health_score") is not None), None)
    if health is not None:
        title.append(f"  health {health:.2f}", style="green" if health >= 0.8 else "yellow")
    lines = [title]
    for gpu in sorted(gpus, key=lambda g: g["index"]):
        line = Text(f" {gpu['index']} ")
        line.append(f"{short_model(gpu['model'])[:15]:<15} ")
        line.append_text(memory_cell(gpu, 8))
        line.append("  ")
        line.append_text(util_cell(gpu, 5))
        line.append("  ")
        line.append_text(temp_text(gpu.get("temperature_c")))
        jobs = holders.get(gpu["uuid"], [])
        if jobs:
            line.append("  jobs " + ",".join(map(str, jobs)), style="cyan")
        elif gpu.get("status") not in ("idle", "busy"):
            line.append(f"  {gpu.get('status')}", style=STATUS_STYLE.get(gpu.get("status"), ""))
        lines.append(line)
    if not gpus:
        lines.append(Text(" no GPUs reported", style="dim"))
    return Text("\n").join(lines)


# ------------------------------------------------------------------------- jobs
def job_where(job: dict) -> str:
    """Where a job runs (node:index, …), or for a waiting job why it waits."""
    if job["gpus"]:
        return ", ".join(f"{g['node']}:{g['index']}" for g in job["gpus"])
    if job.get("held"):
        return f"held by {job.get('held_by') or 'someone'}"
    if job["state"] == "pending" and job.get("reason"):
        return job["reason"]
    return job_size(job)


def job_cells_overview(job: dict) -> tuple:
    """One row of the overview's queue: id, user, name, state, where (or why it waits)."""
    return (str(job["id"]), job["user"], job["name"] or "-", job_state(job), job_where(job))


def job_size(job: dict) -> str:
    size = format_mb(job["gpu_mem_mb"]) if job.get("gpu_mem_mb") else "whole"
    return f"{job['gpu_count']}x {size}"


def job_state(job: dict) -> str:
    return "held" if job.get("held") and job["state"] == "pending" else job["state"]


def ago(t: float | None, now: float | None = None) -> str:
    """"12s", "5m", "3h", "2d" since ``t``."""
    if t is None:
        return "-"
    s = max(0, (now or time.time()) - t)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{s // size:.0f}{unit}"
    return f"{s:.0f}s"


def clock(t: float | None) -> str:
    return "-" if t is None else time.strftime("%H:%M:%S", time.localtime(t))


# ------------------------------------------------------------------------- tables
#: Above this many rows to drop at once, a table is cleared and refilled instead.
BULK_REMOVE = 50


def set_columns(table: DataTable, columns, title: str) -> DataTable:
    """Give a fresh table its (key, label) columns and its border title."""
    for key, label in columns:
        table.add_column(label, key=key)
    table.border_title = title
    return table


def sync_table(table: DataTable, shown: dict[Hashable, tuple], rows: dict[str, tuple]) -> bool:
    """Make ``table`` show ``rows`` (key -> cells): add new rows, drop gone ones, and rewrite
    only the cells that changed. ``shown`` is what the table holds now; it is updated.
    Returns whether rows were added or removed (the caller may need to re-sort)."""
    changed = False
    gone = [k for k in shown if k not in rows]
    if len(gone) > BULK_REMOVE:
        # DataTable.remove_row re-indexes every row: thousands of removals one by one cost
        # minutes, a clear and re-add costs milliseconds.
        table.clear()
        shown.clear()
        gone = []
    for key in gone:
        table.remove_row(key)
        del shown[key]
        changed = True
    columns = list(table.columns)
    for key, cells in rows.items():
        old = shown.get(key)
        if old is None:
            table.add_row(*cells, key=key)
            changed = True
        elif old != cells:
            update_cells(table, key, columns, old, cells)
        shown[key] = cells
    return changed


def _width(cell) -> int:
    return cell.cell_len if isinstance(cell, Text) else len(str(cell))


def update_cells(table: DataTable, key: str, columns: list, old: tuple, new: tuple) -> None:
    """Rewrite the cells of one row that changed; columns are re-measured only when a cell
    grew (re-measuring costs a pass over every row)."""
    for column, before, after in zip(columns, old, new):
        if before != after:
            table.update_cell(key, column, after, update_width=_width(after) > _width(before))


def selected_key(table: DataTable) -> str | None:
    """The row key under the table's cursor, or None for an empty table."""
    if table.row_count == 0:
        return None
    try:
        return table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
    except Exception:  # cursor out of range after rows went away
        return None
