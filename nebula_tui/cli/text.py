"""The CLI's text: what ``nebula status``, ``queue``, ``gpus``, ``node``, ``doctor`` and ``job``
print, from the head's JSON (``views`` builds that JSON and holds the words the TUI shares).

Pure functions on plain data; nothing here does I/O. The TUI draws its own screens and never
imports this module.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from ..forecasts import first_start, starts_text
from ..model import FINISHED_STATES, NOT_AVAILABLE, fmt, format_mb
from ..printable import printable
from ..units import MIB_PER_GIB, duration_exact
from ..views import (command_line, doctor_lines, gpu_list, node_power, power_draw_text, preemptible_text,
                     running_idle_text, short_model, workdir_text)
from ..wire import DoctorReply, EndedJobDetail, GpuWire, HistoryJob, JobDetail, QueueRow, ShownNode


def status_text(summary: Mapping[str, Any]) -> str:
    """R1, exactly:  Cluster Overview / Nodes / GPUs / Total VRAM / Node Details."""
    parts = [f"{summary['idle']} idle", f"{summary['busy']} busy",
             f"{summary['maintenance']} maintenance"]
    if summary.get("unreachable"):
        parts.append(f"{summary['unreachable']} unreachable")
    lines = [
        "Cluster Overview:",
        f"  Nodes: {summary['nodes']}",
        f"  GPUs: {summary['gpus']} ({', '.join(parts)})",
        f"  Total VRAM: {round(summary['total_vram_mb'] / MIB_PER_GIB)} GB "
        f"(free: {round(summary['free_vram_mb'] / MIB_PER_GIB)} GB)",
        "Node Details:",
    ]
    for node in summary["node_details"]:
        models = ", ".join(f"{printable(m)} x{n}" for m, n in node["models"].items()) or "no GPUs"
        load = f"load {node['load_pct']}%" if node["load_pct"] is not None else f"load {NOT_AVAILABLE}"
        reason = printable(node["reason"])
        state = "" if node["state"] == "up" else f" [{node['state']}: {reason}]" if reason else f" [{node['state']}]"
        if node["state"] == "up" and reason:  # up, but a vendor tool said something
            state = f" ({reason})"
        lines.append(f"  {printable(node['name'])}: {models}, {load}{state}")
    if summary.get("pools"):  # each pool's line as the head wrote it (head/pools.py)
        lines.append("Pools:")
        lines += [f"  {printable(pool['line'])}" for pool in summary["pools"]]
    return "\n".join(lines)


def table(header: Sequence[str], rows: Iterable[Sequence[object]], right: Collection[int] = ()) -> str:
    """Plain columns, each as wide as its widest cell: nothing is ever cut, and the lines
    stay easy to read in a terminal and to split in a script. ``right``: column numbers
    aligned to the right (numbers)."""
    cells = [list(header)] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return "\n".join(
        "  ".join(c.rjust(w) if i in right else c.ljust(w)
                  for i, (c, w) in enumerate(zip(row, widths))).rstrip()
        for row in cells)


def queue_text(jobs: Sequence[QueueRow | HistoryJob], now: float | None = None, expand: bool = False) -> str:
    """`nebula queue`: running jobs first, then waiting ones with their reasons; a running
    job its GPUs left idle says so. An array's live tasks are one line unless ``expand``;
    with ``--all``, ended jobs (``job_history``'s rows) come first, an ended task on a line
    of its own (it is no task left to run)."""
    if not jobs:
        return "No jobs in the queue."
    arrays: dict[int, list[QueueRow | HistoryJob]] = {}
    for j in jobs:
        if (array_id := j.get("array_id")) is not None and not expand and j["state"] not in FINISHED_STATES:
            arrays.setdefault(array_id, []).append(j)
    rows = []
    for j in jobs:
        array = None if expand or j["state"] in FINISHED_STATES else j.get("array_id")
        if array is not None:
            tasks = arrays.pop(array, None)
            if tasks is None:  # its line is there already
                continue
            running = sum(1 for t in tasks if t["state"] in ("running", "launching"))
            rows.append((f"{array}_*", j["user"], j["name"] or "-", "array", f"{running} running",
                         starts_text(first_start(tasks), time.time() if now is None else now) or "-",
                         f"array of {len(tasks)} tasks left ({tasks[0].get('array') or ''}): "
                         f"{running} running, {len(tasks) - running} waiting; "
                         "`nebula queue --expand` lists them"))
            continue
        where = gpu_list(j["gpus"]) or (
            f"{j['gpu_count']}x{format_mb(j['gpu_mem_mb']) if j['gpu_mem_mb'] else 'whole'}")
        # A running job's reason is what it does before its command (pulling an image).
        detail = (j["reason"] or "") if j["state"] == "pending" or j["reason"] else command_line(j)
        if now is not None and (idle := running_idle_text(j, now)):
            detail = f"{idle} · {detail}"
        if tag := preemptible_text(j):
            detail = f"{tag} · {detail}"
        ident = str(j["id"]) if j.get("array_id") is None else f"{j['array_id']}_{j['array_index']}"
        # the word the TUI shows too (held, stopping…: ``job_phase``); a row from elsewhere
        # (a pool's) may carry only its state
        row: Mapping[str, Any] = j  # (an ended job, from --all, has no forecast)
        starts = starts_text(row.get("starts"), time.time() if now is None else now) or "-"
        rows.append((ident, j["user"], j["name"] or "-", j.get("phase") or j["state"], where, starts, detail))
    return table(("ID", "USER", "NAME", "STATE", "GPUS", "STARTS", "REASON / COMMAND"), rows, right={0})


def gpus_text(gpus: Sequence[GpuWire]) -> str:
    """`nebula gpus`: one card a line, with what it holds and how it runs."""
    if not gpus:
        return "No GPUs reported yet."
    rows = [(f"{g['node']}:{g['index']}", short_model(g["model"]),
             f"{format_mb(g['memory_used_mb'])} / {format_mb(g['total_memory_mb'])}",
             fmt(g["utilization_pct"], "%"), fmt(g["temperature_c"], "C"), fmt(g["power_w"], "W"),
             g["status"], ",".join(map(str, g["jobs"])) or "-")
            for g in gpus]
    return table(("GPU", "MODEL", "MEMORY", "UTIL", "TEMP", "POWER", "STATUS", "JOBS"), rows,
                 right={2, 3, 4, 5})


def node_text(node: ShownNode) -> str:
    """`nebula node show`: the node, the whole of why it is in its state, its cards, jobs
    and latest events."""
    facts = node.get("facts") or {}
    lines = [f"{node['name']}  {node['host']}:{node['port']}  {node['state']}"
             + (f" (drained: {node['drain_reason']})" if node.get("drained") and node.get("drain_reason") else ""),
             f"  host: {facts.get('hostname') or NOT_AVAILABLE}, python {facts.get('python') or NOT_AVAILABLE}, "
             f"CUDA {node.get('cuda_version') or NOT_AVAILABLE}, health score {node['health_score']:g}"]
    if node["state"] not in ("up", "drained") or node.get("detail"):
        lines.append(f"  why: {node['detail'] or NOT_AVAILABLE}" if "\n" not in (node["detail"] or "")
                     else "  why:\n" + "\n".join(f"    {l}" for l in node["detail"].splitlines()))
    if node.get("failed_attempts"):
        lines.append(f"  failed connection attempts since it was last up: {node['failed_attempts']}")
    lines += [f"  {line}" for line in platform_lines(node.get("platform") or {})]
    lines += [f"  {g['node']}:{g['index']} ({short_model(g['model'])}): {g['cuda_gap']}"
              for g in node["gpus"] if g.get("cuda_gap")]
    draw, budget = node_power(node, node["gpus"])
    if budget:
        share = f" ({draw / budget:.0%})" if draw is not None else ""
        lines.append(f"  power: {power_draw_text(draw, budget)} of its budget{share}")
    lines.append(f"  jobs: {', '.join(map(str, node['jobs'])) or 'none'}")
    if node["gpus"]:
        lines += ["", gpus_text(node["gpus"])]
    if node["events"]:
        lines += ["", "Latest events:"] + [
            f"  {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(e['t']))}  {e['message']}"
            for e in node["events"]]
    return "\n".join(lines)


def platform_lines(platform: Mapping[str, Any]) -> list[str]:
    """What is different about a node's kind of machine, for its page: a WSL2 node's GPUs
    are served by the Windows driver, and that changes what NebulaGrid can see there."""
    if platform.get("kind") != "wsl2":
        return []
    return [f"WSL2 (kernel {platform.get('release') or NOT_AVAILABLE}): the Windows driver serves "
            "its GPUs through /usr/lib/wsl/lib" + ("" if platform.get("dev_nvidia") else
                                                    ", no /dev/nvidia*"),
            "  GPU health comes from NVML alone: Windows keeps the Xid errors, its kernel log has none",
            "  per-process GPU memory reads N/A there: the memory guard cannot judge its jobs",
            "  containers get every GPU of the node or none: a container job takes them all"]


def doctor_text(reply: DoctorReply) -> str:
    lines = []
    for node, checks in reply["nodes"].items():
        lines += [node] + [f"  {line}" for line in doctor_lines(checks)]
    failed = sum(c["status"] == "fail" for checks in reply["nodes"].values() for c in checks)
    warned = sum(c["status"] == "warn" for checks in reply["nodes"].values() for c in checks)
    warnings = f"{warned} warning{'s' if warned != 1 else ''}"
    lines.append(f"{failed} check{'s' if failed != 1 else ''} failed" + (f", {warnings}" if warned else "")
                 if failed else f"Every check passed with {warnings}" if warned else "Every check passed")
    return "\n".join(lines)


def job_text(job: JobDetail | EndedJobDetail) -> str:
    """`nebula job N`: the job in full as text (`--json` gives every field): its state and
    why, what it asked for, where it runs and the environment its command gets there."""

    def when(t: float) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))

    command = command_line(job)
    state = job.get("phase") or job["state"]
    reason = job.get("reason") or ""
    asks = f"{job['gpu_count']} GPU" + ("s" if job["gpu_count"] != 1 else "")
    if job.get("gpu_mem_mb"):
        asks += f", {format_mb(job['gpu_mem_mb'])} each"
    lines = [f"job {job['id']}  {job.get('name') or '-'}  {job['user']}  {state}"
             + (f": {reason}" if reason and reason != job["state"] else ""),
             f"  command:   {command}",
             f"  asks:      {asks}",
             f"  workdir:   {workdir_text(job)}",
             f"  limit:     {duration_exact(job.get('time_limit_s'))}"]
    for key in ("output", "error"):
        if job.get(key) and (key == "output" or job[key] != job.get("output")):
            lines.append(f"  {key + ':':<10} {job[key]}")
    if job.get("pool"):  # sent to a batch cluster: its place there reads pool:node
        lines.append(f"  pool:      {job['pool']}")
    if job.get("image"):
        lines.append(f"  image:     {job['image']}" + "".join(
            f"\n  mount:     {m}" for m in job.get("data_mounts") or ()))
    asked = {**job, "nodelist": ",".join(job.get("nodelist") or ()), "exclude": ",".join(job.get("exclude") or ()),
             "export": " ".join(f"{k}={shlex.quote(v)}" for k, v in (job.get("export") or {}).items())}
    for key in ("conda", "venv", "nodelist", "exclude", "export"):
        if asked.get(key):
            lines.append(f"  {key + ':':<10} {asked[key]}")
    if job.get("queue_pos"):
        lines.append(f"  queue:     position {job['queue_pos']}")
    lines.append(f"  submitted: {when(job['submitted_at'])}")
    if started := job.get("started_at"):
        lines.append(f"  started:   {when(started)}")
    if ended_at := job.get("ended_at"):
        code = "" if job.get("exit_code") is None else f", exit code {job['exit_code']}"
        lines.append(f"  ended:     {when(ended_at)}{code}")
    ended: Mapping[str, Any] = job
    if ended.get("gpu_hours") is not None:  # an ended job: what its run cost and did
        load = ended["mean_util_pct"]
        lines.append(f"  used:      {ended['gpu_hours']:.2f} GPU-hours"
                     + (f", {load:g}% mean load" if load is not None else ""))
    for g in job.get("gpus") or ():
        kind = "whole card" if g["exclusive"] else f"{format_mb(g['memory_mb'])} slice"
        lines.append(f"  gpu:       {g['node']}:{g['index']}  {kind}  {g['uuid']}")
    environment = job.get("environment") or {}
    for rank, (node, env) in enumerate(environment.items()):
        lines.append(f"  environment on {node}" + (f" (rank {rank})" if len(environment) > 1 else "") + ":")
        lines += [f"    {k}={v}" for k, v in env.items()]
    return "\n".join(lines)
