"""A cluster for the scheduler, built from the model's frozen dataclasses: cards, waiting
jobs, what running jobs hold, and one pass over them (snapshot in, decisions out)."""

from __future__ import annotations

from nebula_tui.model import GpuReading, GpuView, Placement
from nebula_tui.scheduler import PendingJob, Snapshot, Start, schedule

GB = 1024
RTX4090_MB, H100_MB, L4_MB, LAPTOP_MB, A100_MB = 24564, 81559, 23034, 8188, 81920
NOW = 2_000_000.0


def card(node: str, index: int, total: int | None = RTX4090_MB, *, temp: float = 35.0,
         util: float = 0.0, placements=(), unmanaged: int = 0, owners=(), overuse=(),
         limit: float | None = None, draw: float | None = None, cap: str = "8.9",
         blocked: str | None = None) -> GpuView:
    """A card of ``total`` MiB on ``node`` at ``index`` (uuid ``GPU-node-index``), as the
    scheduler sees it: what it holds, what others use, its readings."""
    reading = GpuReading(index=index, uuid=f"GPU-{node}-{index}", name="card", memory_total_mb=total,
                         compute_cap=cap, temperature_c=temp, utilization_pct=util,
                         power_limit_w=limit, power_w=draw)
    return GpuView(node=node, reading=reading, placements=tuple(placements), unmanaged_used_mb=unmanaged,
                   unmanaged_procs=tuple(owners), overuse=tuple(overuse), cuda_version="12.4",
                   blocked=blocked)


def job(id: int, count: int = 1, mem: int | None = None, **kw) -> PendingJob:
    """A waiting job of ``count`` cards (``mem`` MiB each, None: whole), submitted in id order."""
    kw.setdefault("submitted_at", NOW - 1000 + id)
    kw.setdefault("user", "u")
    return PendingJob(id=id, gpu_count=count, gpu_mem_mb=mem, **kw)


def held(job_id: int, node: str, index: int, mb: int, exclusive: bool = False):
    """(job, placement): what a running job holds of a card built by ``card``."""
    return (job_id, Placement(f"GPU-{node}-{index}", node, index, mb, exclusive))


def run(gpus, queue, **kw) -> dict[int, object]:
    """One scheduling pass at ``NOW``: each job's decision, by id."""
    snapshot = Snapshot(gpus=tuple(gpus), queue=tuple(queue), now=NOW, **kw)
    return {d.job_id: d for d in schedule(snapshot)}


def on(decision) -> list[tuple[str, int]]:
    """Where a start put the job: (node, index) of each card."""
    assert isinstance(decision, Start), decision
    return [(p.node, p.gpu_index) for p in decision.placements]
