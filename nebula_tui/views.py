"""What the head publishes and both clients word alike: the JSON of jobs, GPUs and nodes
(``job_json``, ``gpu_json``, ``status_summary``), a job's phase, and the few words the CLI
and the TUI share (idle, preemptible, power, a booking's state, a command line).

Pure functions on plain data. The head service builds these dicts from its state; the CLI
words them in ``cli/text.py``, the TUI draws them in ``screens/``. Nothing here does I/O.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from enum import Enum
from typing import Any, TypeVar

from .model import (LOCAL_POOL, NOT_AVAILABLE, Cancelling, Evicting, GpuView, Job, JobState,
                    Stopping, holding, stdio_path)
from .scheduler.filters import cuda_gap
from .scheduler.slices import offered_mb
from .units import duration_text
from .wire import (DoctorCheck, EndedJobDetail, GpuSlice, GpuWire, HistoryJob, JobDetail, JobWire, NodeDetail, NodeWire,
                   PlacedCard, QueueRow, StartForecast, StatusSummary)

#: a job in any of the shapes that carry one (a queue row, a job's page, an ended job)
J = TypeVar("J", bound=JobWire)


class JobPhase(str, Enum):
    """A job's state in one word as people see it (``job_json``'s ``phase``), the words of
    every screen, the CLI and the tests' fixed head: its stored state, or a hold, a cancel,
    an eviction or the head's own stop under way. ``screens/look.py`` gives each a style."""

    PENDING = "pending"
    HELD = "held"
    LAUNCHING = "launching"
    RUNNING = "running"
    CANCELLING = "cancelling"
    EVICTING = "evicting"
    STOPPING = "stopping"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMEOUT = "timeout"


def job_phase(job: Job) -> str:
    """Its :class:`JobPhase`'s word, on every screen and in every list."""
    if job.held_by and job.state == JobState.PENDING:
        return JobPhase.HELD.value
    if isinstance(job.status, Cancelling):
        return JobPhase.CANCELLING.value
    if isinstance(job.status, Evicting):
        return JobPhase.EVICTING.value
    if isinstance(job.status, Stopping):
        return JobPhase.STOPPING.value
    return JobPhase(job.state.value).value


#: How much of a job's command a list of jobs shows (the queue, the history, the event
#: stream and its snapshot), and of its data mounts: a command may be 256 KB, and a hundred
#: of them made every TUI's snapshot 25 MB. ``job`` shows them whole.
LISTED_COMMAND_CHARS = 1024


def listed(job: J) -> J:
    """``job`` (as ``job_json``) as a list shows it: its command cut after
    LISTED_COMMAND_CHARS characters, the last word saying how much more there is, and its
    data mounts that fit in as many (then how many more)."""
    command, mounts = job["command"], job["data_mounts"]
    size = sum(len(word) for word in command)
    if size <= LISTED_COMMAND_CHARS and sum(len(m) for m in mounts) <= LISTED_COMMAND_CHARS:
        return job
    kept: list[str] = []
    for word in command:
        room = LISTED_COMMAND_CHARS - sum(len(w) for w in kept)
        if room <= 0:
            break
        kept.append(word[:room])
    if size > LISTED_COMMAND_CHARS:
        kept[-1] += (f"… ({size - LISTED_COMMAND_CHARS:,} more characters; "
                     f"`nebula job {job.get('id')}` shows all of it)")
    shown: list[str] = []
    for mount in mounts:
        if sum(len(m) for m in shown) + len(mount) > LISTED_COMMAND_CHARS:
            shown.append(f"… ({len(mounts) - len(shown)} more)")
            break
        shown.append(mount)
    short = job.copy()
    short["command"], short["data_mounts"] = kept, shown
    return short


def job_json(job: Job) -> JobWire:
    """A job as clients see it. ``state`` is the stored state; ``phase`` is what clients
    show (``job_phase``): also "held", "cancelling", "evicting" or "stopping", with ``cancel_by``/``cancel_since``,
    ``evicting`` or ``stopping`` (why)."""
    status = job.status
    return {
        "id": job.id, "user": job.user, "name": job.spec.name, "state": job.state.value,
        "reason": job.reason, "node": job.node, "command": list(job.spec.command),
        "shell": job.spec.shell, "gpu_count": job.spec.gpu_count, "nodes": job.spec.nodes,
        "gpu_mem_mb": job.spec.gpu_mem_mb, "workdir": job.spec.workdir,
        "submitted_at": job.submitted_at, "started_at": job.started_at,
        "ended_at": job.ended_at, "exit_code": job.exit_code, "held": bool(job.held_by),
        "held_by": job.held_by, "attempt": job.attempt, "phase": job_phase(job),
        "cancel_by": status.by if isinstance(status, Cancelling) else None,
        "cancel_since": status.since if isinstance(status, Cancelling) else None,
        "evicting": status.why if isinstance(status, Evicting) else None,
        "image": job.spec.image, "runtime": job.spec.runtime,
        "data_mounts": list(job.spec.data_mounts), "conda": job.spec.conda,
        "venv": job.spec.venv, "submit_dir": job.spec.submit_dir, "warmup": job.spec.warmup,
        "workdir_used": job.workdir_used, "interactive": job.spec.interactive,
        "stopping": status.why if isinstance(status, Stopping) else None,
        "idle_since": getattr(holding(status), "idle_since", None),
        "idle_unknown": getattr(holding(status), "idle_unknown", False),
        "array_id": job.spec.array_id, "array_index": job.spec.array_index,
        "array": job.spec.array.text if job.spec.array else None, "after": list(job.spec.after),
        "after_type": job.spec.after_type,
        "time_limit_s": job.spec.time_limit_s, "vendor": job.spec.vendor,
        "output": stdio_path(job, job.spec.output), "error": stdio_path(job, job.spec.error or job.spec.output),
        "arch": job.spec.arch, "cuda": job.spec.cuda,
        "nodelist": list(job.spec.nodelist), "exclude": list(job.spec.exclude),
        "export": dict(job.spec.export_env),
        "pool": job.pool or (job.spec.pool if job.spec.pool != LOCAL_POOL else None),
        "preemptible": job.spec.preemptible, "preemptions": job.preemptions,
        "gpus": placed_cards(job),
    }


def queue_row(job: Job, queue_pos: int | None, starts: StartForecast | None) -> QueueRow:
    """A live job as ``queue`` lists it: ``job_json`` with its place among the waiting and
    its last start forecast."""
    return {**job_json(job), "queue_pos": queue_pos, "starts": starts}


def job_detail(shown: JobWire, queue_pos: int | None, starts: StartForecast | None,
               environment: dict[str, dict[str, str]]) -> JobDetail:
    """A job as ``job`` answers: ``shown`` with its place, forecast and environment."""
    return {**shown, "queue_pos": queue_pos, "starts": starts, "environment": environment}


def ended_job_detail(shown: HistoryJob, queue_pos: int | None, starts: StartForecast | None,
                     environment: dict[str, dict[str, str]]) -> EndedJobDetail:
    """An ended job as ``job`` answers: its history row with the same extras."""
    return {**shown, "queue_pos": queue_pos, "starts": starts, "environment": environment}


def history_json(job: Job, usage: Mapping[str, Any]) -> HistoryJob:
    """An ended job as ``job_history`` answers: ``job_json`` plus its wait and run time
    (of its last run, when it was requeued), the GPU-hours charged (all runs), and what
    its cards did while it held them (telemetry; None without samples): mean utilisation,
    GPU-hours held while its cards idled, mean and peak memory used per card; the head's
    first start forecast for it (``forecast``) and its start less that (``forecast_error_s``)."""
    started = job.started_at
    # (an ended job has its end; one read before it was written counts as ending at once)
    ended = job.ended_at if job.ended_at is not None else (started or job.submitted_at)
    sampled = usage.get("sampled_gpu_hours") or 0.0
    return {
        **job_json(job),
        "wait_s": round((started if started is not None else ended) - job.submitted_at, 3),
        "run_s": round(ended - started, 3) if started is not None else 0.0,
        "gpu_hours": round(usage.get("gpu_hours") or 0.0, 9),
        "mean_util_pct": round(100 * usage["busy_gpu_hours"] / sampled, 1) if sampled else None,
        "idle_gpu_hours": round(usage.get("idle_gpu_hours") or 0.0, 9) if sampled else None,
        "mem_used_mb_mean": _rounded(usage.get("mem_used_mb_mean")),
        "mem_used_mb_peak": _rounded(usage.get("mem_used_mb_peak")),
        # the head's first start forecast for it, and how far its start was from it
        "forecast": None if usage.get("forecast_at") is None else {
            "start_at": usage["forecast_at"], "early": usage.get("forecast_early"),
            "late": usage.get("forecast_late")},
        "forecast_error_s": None if usage.get("forecast_at") is None or started is None
        else round(started - usage["forecast_at"], 3),
    }


def _rounded(value: float | None) -> int | None:
    return None if value is None else round(value)


def gpu_status(gpu: GpuView, node_up: bool) -> str:
    if gpu.reading.lost and node_up:
        return "lost"
    if gpu.maintenance:
        return "maintenance"
    if not node_up:
        return "unreachable"
    return "busy" if gpu.placements or gpu.unmanaged_used_mb else "idle"


def gpu_json(gpu: GpuView, *, node_up: bool, cuda_version: str | None,
             nvlink: list[dict[str, Any]], processes: list[dict[str, Any]], fits: dict[str, int] | None = None,
             raw: bool = True) -> GpuWire:
    """The R2 descriptor plus live readings; each slice names the job holding it;
    ``fits``: how many more jobs of the common sizes the scheduler would place on it
    (``scheduler.slices.common_fits``: clients show it, never work it out again).
    ``raw``: with the probe's whole reading as it came (``reading``), for ``nebula gpus``."""
    r = gpu.reading
    slices: list[GpuSlice] = [{"id": n, "memory_mb": p.memory_mb, "state": "allocated", "job": job_id,
                               "exclusive": p.exclusive}
                              for n, (job_id, p) in enumerate(gpu.placements, start=1)]
    spare = offered_mb(gpu)
    if spare:
        slices.append({"id": len(slices) + 1, "memory_mb": spare, "state": "free", "job": None,
                       "exclusive": False})
    out: GpuWire = {
        "uuid": r.uuid, "node": gpu.node, "index": r.index, "model": r.name,
        "vendor": r.vendor, "total_memory_mb": r.memory_total_mb,
        "compute_capability": compute_capability(r.compute_cap), "pci_bus_id": r.pci_bus_id,
        "nvlink": nvlink, "status": gpu_status(gpu, node_up), "blocked": gpu.blocked,
        "driver_version": r.driver_version, "cuda_version": cuda_version, "slices": slices,
        # a card newer than what the node's CUDA can serve: why, and what to install
        "cuda_gap": cuda_gap(r.compute_cap, cuda_version) if r.vendor == "nvidia" else None,
        "jobs": sorted({job_id for job_id, _ in gpu.placements}),
        "memory_used_mb": r.memory_used_mb, "utilization_pct": r.utilization_pct,
        "temperature_c": r.temperature_c, "power_w": r.power_w,
        "power_limit_w": r.power_limit_w,
        "unmanaged_used_mb": gpu.unmanaged_used_mb,
        "health_score": round(gpu.health_score, 3),
        "processes": processes,
        "fits": fits or {},
    }
    if raw:
        out["reading"] = asdict(r)
    return out


def compute_capability(cc: str | None) -> str | None:
    """nvidia-smi's "8.9" as the sm_89 name users pass to ``--arch``."""
    if not cc:
        return None
    if cc.startswith("gfx"):  # AMD's target is already the name --arch takes
        return cc
    major, _, minor = cc.partition(".")
    return f"sm_{major}{minor}" if major.isdigit() else None


def short_model(name: str) -> str:
    """"NVIDIA GeForce RTX 4060 Laptop GPU" -> "RTX 4060 Laptop", "Intel(R) Arc(TM) A770
    Graphics" -> "Intel Arc A770", as people say them (R1)."""
    name = name.replace("(R)", "").replace("(TM)", "")
    for prefix in ("NVIDIA ", "GeForce "):
        name = name.removeprefix(prefix)
    return name.removesuffix(" GPU").removesuffix(" Graphics").strip()


def status_summary(nodes: Sequence[NodeWire], gpus: Sequence[GpuWire]) -> StatusSummary:
    """The numbers of R1, from node and GPU dicts as the head publishes them (each GPU
    counted under its ``gpu_status``; "lost" is counted, and shown by none yet)."""
    counts = {"idle": 0, "busy": 0, "maintenance": 0, "unreachable": 0, "lost": 0}
    total = free = 0
    for g in gpus:
        counts[g["status"]] = counts.get(g["status"], 0) + 1
        total += g["total_memory_mb"] or 0
        free += sum(s["memory_mb"] or 0 for s in g["slices"] if s["state"] == "free")
    by_node: dict[str, list[GpuWire]] = {}
    for g in gpus:
        by_node.setdefault(g["node"], []).append(g)
    details: list[NodeDetail] = []
    for node in nodes:
        mine = by_node.get(node["name"], [])
        models: dict[str, int] = {}
        for g in mine:
            models[short_model(g["model"])] = models.get(short_model(g["model"]), 0) + 1
        utils = [g["utilization_pct"] for g in mine if g["utilization_pct"] is not None]
        details.append({
            "name": node["name"], "state": node["state"], "reason": node.get("reason") or "",
            "models": models, "load_pct": round(sum(utils) / len(utils)) if utils else None,
        })
    return {"nodes": len(nodes), "gpus": len(gpus), "idle": counts["idle"], "busy": counts["busy"],
            "maintenance": counts["maintenance"], "unreachable": counts["unreachable"],
            "lost": counts["lost"], "total_vram_mb": total, "free_vram_mb": free, "node_details": details}


def placed_cards(job: Job) -> list[PlacedCard]:
    """The cards (or slices) a job holds, as clients see them."""
    return [{"uuid": p.gpu_uuid, "node": p.node, "index": p.gpu_index,
             "memory_mb": p.memory_mb, "exclusive": p.exclusive} for p in job.placements]


def gpu_list(gpus: Sequence[PlacedCard | GpuWire]) -> str:
    """A job's cards, node by node: "node01:0,1 node02:3"."""
    by_node: dict[str, list[str]] = {}
    for g in gpus:
        by_node.setdefault(g["node"], []).append(str(g["index"]))
    return " ".join(f"{node}:{','.join(indices)}" for node, indices in by_node.items())


def node_power(node: NodeWire, gpus: Sequence[GpuWire]) -> tuple[float | None, int | None]:
    """(what the node draws now: its cards' power summed, None when no card reads any; its
    nodes.yaml ``power_budget_w``, None when it has none)."""
    read = [w for g in gpus if (w := g.get("power_w")) is not None]
    return (sum(read) if read else None), node.get("power_budget_w")


def power_draw_text(draw: float | None, budget: int | None) -> str:
    """"412/600 W" (draw against budget), "412 W" (no budget), "N/A/600 W" (no reading)."""
    shown = NOT_AVAILABLE if draw is None else f"{draw:.0f}"
    return f"{shown}/{budget} W" if budget else (NOT_AVAILABLE if draw is None else f"{shown} W")


def idle_text(seconds: float, gpus: int) -> str:
    """"idle 3 h on 2 GPUs": a running job whose GPUs read ~0% that long (head/limits.py)."""
    return f"idle {duration_text(seconds)} on {gpus} GPU{'s' * (gpus != 1)}"


#: a running job whose cards report no utilisation (head/limits.py's ``idleness``)
IDLE_UNKNOWN_TEXT = "idle unknown (no utilisation reading)"


def running_idle_text(job: JobWire, now: float) -> str:
    """What ``nebula queue`` and the TUI say of a running job's idleness: "idle 3 h on 2
    GPUs", "idle unknown (no utilisation reading)", or "" (in use, or not running)."""
    if job.get("state") != "running":
        return ""
    if (since := job.get("idle_since")) is not None:
        return idle_text(max(0.0, now - since), len(job["gpus"]))
    return IDLE_UNKNOWN_TEXT if job.get("idle_unknown") else ""


def preemptible_text(job: JobWire) -> str:
    """"preemptible", "preemptible, preempted 2 times" (the queue's tag), or "" for a normal job."""
    times = job.get("preemptions") or 0
    return ("" if not job.get("preemptible") else
            f"preemptible, preempted {times} time{'s' * (times != 1)}" if times else "preemptible")


#: The most of a tool's output a reason shows (a card of the TUI, a line of `nebula events`);
#: the whole of it stays in the detail view.
REASON_MAX = 160
#: The head's own sentences (a host key's fix names two paths) are only flattened to one
#: line, and cut only when absurdly long.
SENTENCE_MAX = 600


def one_line(text: str, limit: int = REASON_MAX) -> str:
    """``text`` as one line of at most ``limit`` characters: line breaks, tabs and other
    control characters become spaces, runs of blanks one space, and a longer text is cut
    at a word with "…" (the whole of it belongs in a detail view)."""
    flat = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    if len(flat) <= limit:
        return flat
    cut = flat[:limit - 1]
    if " " in cut[limit // 2:]:
        cut = cut[:cut.rindex(" ")]
    return cut + "…"


#: How a doctor's check reads: passed, failed, worth knowing, not needed on this node.
DOCTOR_MARKS = {"ok": "✓", "fail": "✗", "warn": "!", "skip": "-"}


def doctor_lines(checks: Sequence[DoctorCheck]) -> list[str]:
    """One node's checks (``nebula doctor``, the TUI's node page), one line each: the mark,
    the check, what was found and, when it is not fine, the fix."""
    width = max((len(c["check"] or "") for c in checks), default=0)
    return [f"{DOCTOR_MARKS.get(c['status'] or '', '?')} {c['check']:<{width}}  {c['text']}"
            + (f" — fix: {c['fix']}" if c.get("fix") and c["status"] in ("fail", "warn") else "")
            for c in checks]


def command_line(job: JobWire) -> str:
    """A job's command as one could type it again: shell text as given, an argv quoted
    (``sh -c 'for i in 1 2; do …'``)."""
    return job["command"][0] if job.get("shell") else shlex.join(job["command"])


def month_start(now: float, back: int = 0) -> float:
    """The first moment of the calendar month (local time) ``back`` months before the one
    ``now`` falls in: the month of quotas (R7), of reports and of the Users screen."""
    t = time.localtime(now)
    months = t.tm_year * 12 + t.tm_mon - 1 - back
    return time.mktime((months // 12, months % 12 + 1, 1, 0, 0, 0, 0, 0, -1))


def workdir_text(job: JobWire) -> str:
    """Where the job runs, as `nebula job` and the TUI's job page say it: the folder its
    node settled on once it started, else the one asked for, else its user's home."""
    return job.get("workdir_used") or job.get("workdir") or "$HOME"


def booking_state(booking: Mapping[str, object]) -> str:

    """A booking's state in words, as `nebula reservations` and the TUI both say it:
    "broken: <why>", "under way" or "ahead" (``active``: the head's reading at its clock)."""
    if booking.get("broken"):
        return f"broken: {booking['broken']}"
    return "under way" if booking.get("active") else "ahead"
