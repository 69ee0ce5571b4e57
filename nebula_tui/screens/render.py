"""How data looks on screen: bars, states, temperatures, node cards, job and GPU facts.

Pure functions from the head's plain dicts to Rich ``Text`` and strings; colours come from
``look.LOOK`` (roles such as ok or warn, never colour names), so one state is one colour on
every screen and in both themes. No I/O and no widgets. ``now()`` is the clock every "ago"
and "elapsed" reads (snapshot tests fix it with ``set_clock``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence

from rich.text import Text

from ..model import NOT_AVAILABLE, format_mb
from ..units import duration_coarse
from ..units import duration_short as duration
from ..views import booking_state, node_power, power_draw_text, short_model
from ..wire import BookingView, GpuWire, JobWire, NodeWire, PoolWire
from .look import LOOK

_EIGHTHS = " ▏▎▍▌▋▊▉"
_clock: Callable[[], float] = time.time


def now() -> float:
    """The time every relative time on screen is measured from."""
    return _clock()


def set_clock(clock: Callable[[], float] | None) -> None:
    """Measure from ``clock`` instead of the wall clock (None: the wall clock again)."""
    global _clock
    _clock = clock or time.time


# ------------------------------------------------------------------------- bars
def bar(fraction: float | None, width: int, style: str) -> Text:
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


def fill_bar(fraction: float | None, width: int) -> Text:
    """A bar coloured by how full it is (memory, quota): the same on every screen."""
    return bar(fraction, width, LOOK.fill(fraction))


def state_text(state: str | None) -> Text:
    """A job, GPU, node or slice state in its role's colour."""
    return Text(state or NOT_AVAILABLE, style=LOOK.state(state))


status_cell = state_text


# ------------------------------------------------------------------------- GPUs
def memory_text(gpu: GpuWire) -> str:
    """"6 GB / 24 GB": used of total, as nvidia-smi would say it ("N/A" for no reading)."""
    return f"{format_mb(gpu.get('memory_used_mb'))} / {format_mb(gpu.get('total_memory_mb'))}"


def memory_fraction(gpu: GpuWire) -> float | None:
    used, total = gpu.get("memory_used_mb"), gpu.get("total_memory_mb")
    if used is None or not total:
        return None
    return used / total


def util_fraction(gpu: GpuWire) -> float | None:
    util = gpu.get("utilization_pct")
    return None if util is None else min(max(util, 0.0), 100.0) / 100


def memory_cell(gpu: GpuWire, width: int = 10) -> Text:
    text = fill_bar(memory_fraction(gpu), width)
    text.append(f" {memory_text(gpu)}")
    return text


def util_cell(gpu: GpuWire, width: int = 6) -> Text:
    frac = util_fraction(gpu)
    text = bar(frac, width, LOOK.role("info"))
    text.append(f" {NOT_AVAILABLE}" if frac is None else f" {frac * 100:3.0f}%")
    return text


def temp_text(temp_c: float | None) -> Text:
    return Text(NOT_AVAILABLE if temp_c is None else f"{temp_c:.0f}°C", style=LOOK.temperature(temp_c))


def power_text(gpu: GpuWire) -> str:
    """"62/400 W": the draw against the card's limit (the draw alone when no limit is known)."""
    power, limit = gpu.get("power_w"), gpu.get("power_limit_w")
    if power is None:
        return NOT_AVAILABLE
    return f"{power:.0f}/{limit:.0f} W" if limit else f"{power:.0f} W"


def free_slice_mb(gpu: GpuWire) -> int:
    """What the card can still give a new job (its free slice; 0 when taken or blocked)."""
    return sum(s["memory_mb"] or 0 for s in gpu.get("slices", ()) if s["state"] == "free")


def is_free(gpu: GpuWire) -> bool:
    """Nothing of ours on it, nobody else's memory, in service: a whole card to take."""
    return gpu.get("status") == "idle" and not gpu.get("jobs") and free_slice_mb(gpu) > 0


def fits_text(gpu: GpuWire) -> str:
    """"4G×4 8G×2 16G×1": how many more jobs of the common sizes the head would place on
    the card (its ``fits``: the scheduler's own rule, worked out there) ("-": none)."""
    parts = [f"{size}×{n}" for size, n in (gpu.get("fits") or {}).items() if n]
    return " ".join(parts) or "-"


def holders_text(gpu: GpuWire, jobs: Mapping[int, JobWire], ids: Iterable[int] | None = None) -> str:
    """Who holds the card: "alice:7 bob:9 (preemptible)" (user:job), then memory others
    hold ("+1.2 GB unmanaged"); "-" when nobody."""
    ids = list(gpu.get("jobs") or ()) if ids is None else list(ids)
    parts = [(f"{jobs[j]['user']}:{j}" + (" (preemptible)" if jobs[j].get("preemptible") else ""))
             if j in jobs else f"job {j}" for j in ids]
    unmanaged = gpu.get("unmanaged_used_mb") or 0
    if unmanaged:
        parts.append(f"+{format_mb(unmanaged)} unmanaged")
    return " ".join(parts) or "-"


def gpu_label(gpu: GpuWire) -> str:
    return f"{gpu['node']}:{gpu['index']}"


# ------------------------------------------------------------------------- sparklines
_SPARKS = "▁▂▃▄▅▆▇█"


def sparkline(values: Iterable[float | None], width: int, lo: float | None = None,
              hi: float | None = None) -> str:
    """The last ``width`` values as one line of block characters (gaps as spaces). With no
    fixed range the values' own range is used, and a flat line is drawn flat (lowest step)."""
    tail = list(values)[-width:]
    known = [v for v in tail if v is not None]
    if not known:
        return " " * width
    lo = min(known) if lo is None else lo
    hi = max(known) if hi is None else hi
    span = hi - lo
    out = []
    for v in tail:
        if v is None:
            out.append(" ")
        elif span <= 0:
            out.append(_SPARKS[0])
        else:
            step = int((min(max(v, lo), hi) - lo) / span * (len(_SPARKS) - 1) + 0.5)
            out.append(_SPARKS[step])
    return "".join(out).rjust(width)


# ------------------------------------------------------------------------- node cards
#: Cells of a node card's model column.
CARD_MODEL = 15


def card_model(name: str) -> str:
    """The model as a card has room for: its short name, its first words dropped until it
    fits (the number that tells cards apart comes last: "AMD Instinct MI210" -> "Instinct
    MI210"), and cut with "…" only when a single word is still too long."""
    words = short_model(name).split()
    while len(words) > 1 and len(" ".join(words)) > CARD_MODEL:
        words.pop(0)
    model = " ".join(words)
    return model if len(model) <= CARD_MODEL else model[:CARD_MODEL - 1] + "…"


def gpu_line(gpu: GpuWire, holders: str) -> Text:
    """One GPU of a node card: index, model, memory bar, utilisation, temperature, and who
    holds it, or "free" (a card to take), or its state when out of service."""
    line = Text(f"{gpu['index']:>2} ")
    line.append(f"{card_model(gpu['model']):<{CARD_MODEL}} ")
    line.append_text(fill_bar(memory_fraction(gpu), 6))
    line.append(f" {memory_text(gpu):<15}")
    util = gpu.get("utilization_pct")
    line.append(f"{NOT_AVAILABLE} " if util is None else f"{min(max(util, 0), 100):3.0f}%", style=LOOK.role("info"))
    line.append(" ")
    line.append_text(temp_text(gpu.get("temperature_c")))
    status = gpu.get("status")
    if status not in ("idle", "busy"):
        line.append(f"  {status}", style=LOOK.state(status))
    elif is_free(gpu):
        line.append("  free", style=LOOK.role("free"))
    elif holders != "-":
        line.append(f"  {holders}", style=LOOK.role("info"))
    return line


def node_power_text(node: NodeWire, gpus: Sequence[GpuWire]) -> Text:
    """What a node draws against its power budget ("412/600 W"), coloured as a bar by how
    near the budget it is (warn from 70%, bad from 90%); its draw alone without one."""
    draw, budget = node_power(node, gpus)
    text = power_draw_text(draw, budget)
    if not budget or draw is None:
        return Text(text, style="dim" if draw is None else "")
    return Text(text, style=LOOK.fill(draw / budget))


def node_card(node: NodeWire, gpus: Sequence[GpuWire], holders: Callable[[GpuWire], str]) -> Text:
    """One node's card: a title line (state, free cards, health), then one line per GPU."""
    state = node.get("state", "unknown")
    title = Text(node["name"], style="bold")
    title.append("  ")
    title.append(state, style=LOOK.state(state))
    free = sum(1 for g in gpus if is_free(g))
    if gpus:
        title.append(f"  {free}/{len(gpus)} free", style=LOOK.role("free") if free else "dim")
    health = next((g.get("health_score") for g in gpus if g.get("health_score") is not None), None)
    if health is not None and health < 1:
        title.append(f"  health {health:.2f}", style=LOOK.role("ok" if health >= 0.8 else "warn"))
    if node.get("power_budget_w"):
        title.append("  ")
        title.append_text(node_power_text(node, gpus))
    if node.get("reason"):
        title.append(f"  {node['reason']}", style="dim")
    lines = [title]
    lines += [gpu_line(g, holders(g)) for g in sorted(gpus, key=lambda g: g["index"])]
    if not gpus:
        lines.append(Text(" no GPUs reported", style="dim"))
    return Text("\n").join(lines)


def pool_card(pool: PoolWire) -> Text:
    """One pool's card: its name and kind, what the head last saw of it (the head's own
    ``line`` when it does not answer), ours there, and its nodes."""
    title = Text(pool["name"], style="bold")
    where = f"Slurm {pool['version']}" if pool.get("version") else "Slurm"
    if pool.get("partition"):
        where += f" · partition {pool['partition']}"
    title.append(f"  pool · {where}", style="dim")
    if not pool.get("reachable"):
        state = "unreachable" if pool.get("unreachable_since") is not None else "connecting"
        title.append("  ")
        title.append(state, style=LOOK.state(state))
        return Text("\n").join([title, Text(f" {pool['line']}", style="dim")])
    idle, total = pool.get("gpus_idle"), pool.get("gpus_total") or 0
    title.append(f"  {'?' if idle is None else idle}/{total} idle",
                 style=LOOK.role("free") if idle else "dim")
    lines = [title, Text(f" ours: {pool['running']} running, {pool['pending']} pending"
                         f" (at most {pool['max_jobs']})")]
    parts = pool.get("partitions") or []
    if len(parts) > 1:
        lines.append(Text(" " + ", ".join(
            f"{p['name']} {'?' if p['gpus_idle'] is None else p['gpus_idle']}/{p['gpus']} idle"
            for p in parts)))
    nodes = pool.get("nodes") or []
    if nodes:
        lines.append(Text(" " + ", ".join(
            f"{n['name']} {n['state']} {'?' if n.get('gpus_used') is None else n['gpus_used']}"
            f"/{n['gpus']}" for n in nodes), style="dim"))
    return Text("\n").join(lines)


# ------------------------------------------------------------------------- jobs
def job_state(job: JobWire) -> str:
    """The job's state in one word as people see it (held, cancelling, evicting, stopping
    too): the head's ``phase`` (``views.job_phase``), never worked out here."""
    return job["phase"]


def job_where(job: JobWire) -> str:
    """Where a job runs (node:index, …), or for a waiting job why it waits."""
    if job["gpus"]:
        return ", ".join(f"{g['node']}:{g['index']}" for g in job["gpus"])
    if job.get("held"):
        return f"held by {job.get('held_by') or 'someone'}"
    if job["state"] == "pending" and (reason := job.get("reason")):
        return reason
    return job_size(job)


def job_size(job: JobWire) -> str:
    size = format_mb(job["gpu_mem_mb"]) if job.get("gpu_mem_mb") else "whole"
    return f"{job['gpu_count']}x {size}"


def ago(t: float | None, at: float | None = None) -> str:
    """"12s", "5m", "3h", "2d" since ``t``."""
    if t is None:
        return "-"
    return duration_coarse((at or now()) - t)


def run_seconds(job: JobWire, at: float | None = None) -> float | None:
    """How long the job has run (to its end, or to now while it runs); None before it starts."""
    start = job.get("started_at")
    if start is None:
        return None
    return (job.get("ended_at") or at or now()) - start


def elapsed_text(job: JobWire, at: float | None = None) -> str:
    """What a row says of a job's time: its run time once started, else how long it waited."""
    ran = run_seconds(job, at)
    if ran is not None:
        return duration(ran)
    return duration((job.get("ended_at") or at or now()) - job["submitted_at"])


def exit_text(job: JobWire) -> str:
    code = job.get("exit_code")
    return "-" if code is None else str(code)


def job_summary(job: JobWire, at: float | None = None) -> str:
    """"job 7 “train” of alice, running for 12m on node01:0": a job named for a question."""
    name = f" “{job['name']}”" if job.get("name") else ""
    state = job_state(job)
    if state == "running" and job.get("started_at"):
        how = f"running for {duration(run_seconds(job, at))} on {job_where(job)}"
    elif state == "pending":
        how = f"waiting for {duration((at or now()) - job['submitted_at'])}"
    else:
        how = state
    return f"job {job['id']}{name} of {job['user']}, {how}"


def clock(t: float | None) -> str:
    return "-" if t is None else time.strftime("%H:%M:%S", time.localtime(t))


def day_clock(t: float | None, at: float | None = None) -> str:
    """The time of day for today, with the date before it for older times."""
    if t is None:
        return "-"
    same_day = time.localtime(t)[:3] == time.localtime(at or now())[:3]
    return time.strftime("%H:%M:%S" if same_day else "%m-%d %H:%M", time.localtime(t))


def booking_line(b: BookingView) -> str:
    """"deadline node02:0-3 Fri 09:00 – Fri 19:00 for alice,bob (under way)"."""
    return f"{b['name']} {b['gpus']} {b['when']} for {','.join(b['users'])} ({booking_state(b)})"


def bookings_count(bookings: Sequence[BookingView]) -> str:
    """"bookings: 1 under way, 2 ahead" (or "")."""
    active = sum(1 for b in bookings if b.get("active"))
    text = ", ".join(p for p in (active and f"{active} under way", len(bookings) > active and
                                 f"{len(bookings) - active} ahead") if p)
    return f"bookings: {text}" if text else ""
