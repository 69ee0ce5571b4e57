"""What clients show: JSON shapes of jobs, GPUs and nodes, and the R1 status text.

Pure functions on plain data. The head service builds these dicts from its state; the CLI
and the TUI render them. Nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import asdict

from .model import MIB_PER_GIB, Cancelling, Evicting, GpuView, Job, Stopping, format_mb, holding
from .printable import printable
from .scheduler.slices import offered_mb
from .units import duration_text


def job_phase(job: Job) -> str:
    """Its state in one word, a cancel, an eviction or the head's own stop under way included."""
    if isinstance(job.status, Cancelling):
        return "cancelling"
    if isinstance(job.status, Evicting):
        return "evicting"
    if isinstance(job.status, Stopping):
        return "stopping"
    return job.state.value


def job_json(job: Job) -> dict:
    """A job as clients see it. ``state`` is the stored state; ``phase`` says also
    "cancelling", "evicting" or "stopping", with ``cancel_by``/``cancel_since``,
    ``evicting`` or ``stopping`` (why)."""
    status = job.status
    return {
        "id": job.id, "user": job.user, "name": job.spec.name, "state": job.state.value,
        "reason": job.reason, "node": job.node, "command": list(job.spec.command),
        "shell": job.spec.shell, "gpu_count": job.spec.gpu_count,
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
        "array_id": job.spec.array_id, "array_index": job.spec.array_index,
        "array": job.spec.array, "after": list(job.spec.after), "after_type": job.spec.after_type,
        "time_limit_s": job.spec.time_limit_s,
        "gpus": [{"uuid": p.gpu_uuid, "node": p.node, "index": p.gpu_index,
                  "memory_mb": p.memory_mb, "exclusive": p.exclusive} for p in job.placements],
    }


def gpu_status(gpu: GpuView, node_up: bool) -> str:
    if gpu.maintenance:
        return "maintenance"
    if not node_up:
        return "unreachable"
    return "busy" if gpu.placements or gpu.unmanaged_used_mb else "idle"


def gpu_json(gpu: GpuView, *, node_up: bool, cuda_version: str | None,
             nvlink: list[dict], processes: list[dict], raw: bool = True) -> dict:
    """The R2 descriptor plus live readings; each slice names the job holding it.
    ``raw``: with the probe's whole reading as it came (``reading``), for ``nebula gpus``."""
    r = gpu.reading
    slices = [{"id": n, "memory_mb": p.memory_mb, "state": "allocated", "job": job_id,
               "exclusive": p.exclusive}
              for n, (job_id, p) in enumerate(gpu.placements, start=1)]
    spare = offered_mb(gpu)
    if spare:
        slices.append({"id": len(slices) + 1, "memory_mb": spare, "state": "free", "job": None,
                       "exclusive": False})
    out = {
        "uuid": r.uuid, "node": gpu.node, "index": r.index, "model": r.name,
        "vendor": r.vendor, "total_memory_mb": r.memory_total_mb,
        "compute_capability": compute_capability(r.compute_cap), "pci_bus_id": r.pci_bus_id,
        "nvlink": nvlink, "status": gpu_status(gpu, node_up), "blocked": gpu.blocked,
        "driver_version": r.driver_version, "cuda_version": cuda_version, "slices": slices,
        "jobs": sorted({job_id for job_id, _ in gpu.placements}),
        "memory_used_mb": r.memory_used_mb, "utilization_pct": r.utilization_pct,
        "temperature_c": r.temperature_c, "power_w": r.power_w,
        "power_limit_w": r.power_limit_w,
        "unmanaged_used_mb": gpu.unmanaged_used_mb,
        "health_score": round(gpu.health_score, 3),
        "processes": processes,
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


def status_summary(nodes: list[dict], gpus: list[dict]) -> dict:
    """The numbers of R1, from node and GPU dicts as the head publishes them."""
    counts = {"idle": 0, "busy": 0, "maintenance": 0, "unreachable": 0}
    total = free = 0
    for g in gpus:
        counts[g["status"]] = counts.get(g["status"], 0) + 1
        total += g["total_memory_mb"] or 0
        free += sum(s["memory_mb"] for s in g["slices"] if s["state"] == "free")
    by_node: dict[str, list[dict]] = {}
    for g in gpus:
        by_node.setdefault(g["node"], []).append(g)
    details = []
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
    return {"nodes": len(nodes), "gpus": len(gpus), **counts,
            "total_vram_mb": total, "free_vram_mb": free, "node_details": details}


def status_text(summary: dict) -> str:
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
        load = f"load {node['load_pct']}%" if node["load_pct"] is not None else "load N/A"
        reason = printable(node["reason"])
        state = "" if node["state"] == "up" else f" [{node['state']}: {reason}]" if reason else f" [{node['state']}]"
        if node["state"] == "up" and reason:  # up, but a vendor tool said something
            state = f" ({reason})"
        lines.append(f"  {printable(node['name'])}: {models}, {load}{state}")
    return "\n".join(lines)


def idle_text(seconds: float, gpus: int) -> str:
    """"idle 3 h on 2 GPUs": a running job whose GPUs read ~0% that long (head/limits.py)."""
    return f"idle {duration_text(seconds)} on {gpus} GPU{'s' * (gpus != 1)}"


def queue_text(jobs: list[dict], now: float | None = None, expand: bool = False) -> str:
    """`nebula queue`: running jobs first, then waiting ones with their reasons; a running
    job its GPUs left idle says so. An array's tasks are one line unless ``expand``."""
    if not jobs:
        return "No jobs in the queue."
    lines = [f"{'ID':>5}  {'USER':<10} {'NAME':<16} {'STATE':<10} {'GPUS':<22} REASON / COMMAND"]
    arrays: dict[int, list[dict]] = {}
    for j in jobs:
        if j.get("array_id") is not None and not expand:
            arrays.setdefault(j["array_id"], []).append(j)
    shown: set[int] = set()
    for j in jobs:
        array = j.get("array_id") if not expand else None
        if array is not None:
            if array in shown:
                continue
            shown.add(array)
            tasks = arrays[array]
            running = sum(1 for t in tasks if t["state"] in ("running", "launching"))
            detail = (f"array of {len(tasks)} tasks left ({tasks[0].get('array') or ''}): {running} running, "
                      f"{len(tasks) - running} waiting; `nebula queue --expand` lists them")
            lines.append(f"{str(array) + '_*':>5}  {printable(j['user'])[:10]:<10} "
                         f"{printable(j['name'] or '-')[:16]:<16} {'array':<10} "
                         f"{f'{running} running'[:22]:<22} {printable(detail)}")
            continue
        where = ", ".join(f"{g['node']}:{g['index']}" for g in j["gpus"]) or (
            f"{j['gpu_count']}x{format_mb(j['gpu_mem_mb']) if j['gpu_mem_mb'] else 'whole'}")
        # A running job's reason is what it does before its command (pulling an image).
        detail = j["reason"] if j["state"] == "pending" or j["reason"] else " ".join(j["command"])
        if now is not None and j.get("idle_since") is not None:
            detail = f"{idle_text(max(0.0, now - j['idle_since']), len(j['gpus']))} · {detail}"
        ident = str(j["id"]) if j.get("array_id") is None else f"{j['array_id']}_{j['array_index']}"
        lines.append(f"{ident:>5}  {printable(j['user'])[:10]:<10} {printable(j['name'] or '-')[:16]:<16} "
                     f"{j['state']:<10} {where[:22]:<22} {printable(detail)}")
    return "\n".join(lines)
