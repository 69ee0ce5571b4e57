"""One scheduling pass: walk the queue in order and place what fits.

Pure: the pass gets a frozen snapshot and returns decisions. The engine applies them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..model import GpuView, Placement
from .placement import place


@dataclass(frozen=True)
class PendingJob:
    id: int
    user: str
    gpu_count: int
    gpu_mem_mb: int | None
    submitted_at: float


@dataclass(frozen=True)
class Snapshot:
    gpus: tuple[GpuView, ...]
    queue: tuple[PendingJob, ...]


@dataclass(frozen=True)
class Start:
    job_id: int
    placements: tuple[Placement, ...]


@dataclass(frozen=True)
class Wait:
    job_id: int
    reason: str


Decision = Start | Wait


def order(queue: tuple[PendingJob, ...]) -> list[PendingJob]:
    """The order jobs are considered in: submit time, then id (first come, first served)."""
    return sorted(queue, key=lambda j: (j.submitted_at, j.id))


def schedule(snapshot: Snapshot) -> list[Decision]:
    """Decide, for every pending job, to start it on GPUs or why it waits.

    Each start is applied to the pass's own view of the GPUs before the next job is
    considered, so two jobs of one pass never get the same memory.
    """
    gpus = {g.uuid: g for g in snapshot.gpus}
    decisions: list[Decision] = []
    # Until something starts, jobs asking the same thing get the same answer: a long queue
    # behind a full cluster costs one placement attempt per distinct request, not per job.
    refused: dict[tuple[int, int | None], str] = {}
    for job in order(snapshot.queue):
        ask = (job.gpu_count, job.gpu_mem_mb)
        if ask in refused:
            decisions.append(Wait(job.id, refused[ask]))
            continue
        placements, reason = place(tuple(gpus.values()), job.gpu_count, job.gpu_mem_mb)
        if not placements:
            refused[ask] = reason
            decisions.append(Wait(job.id, reason))
            continue
        decisions.append(Start(job.id, placements))
        refused.clear()
        for p in placements:
            held = gpus[p.gpu_uuid]
            gpus[p.gpu_uuid] = replace(held, placements=held.placements + ((job.id, p),))
    return decisions
