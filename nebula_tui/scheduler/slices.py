"""R3 memory slices: how much of a card a request takes, and whether a card can give it.

Slices are reservations, not partitions: compute is shared, memory is promised. A request
for more than half a card takes the whole card; nothing under ``MIN_SLICE_MB`` is handed
out; at most ``MAX_ALLOCATIONS_PER_GPU`` jobs share one card; a card holding an inference
service keeps ``service_spare_mb`` free and is never taken whole by anyone else (R14). Memory that processes we did
not start really hold counts as used, so "free" is what is really free.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..model import MAX_ALLOCATIONS_PER_GPU, MIN_SLICE_MB, GpuView


@dataclass(frozen=True)
class Ask:
    """What one GPU of a job needs: ``memory_mb`` reserved, or the card alone."""

    memory_mb: int
    exclusive: bool


def ask_for(total_mb: int, gpu_mem_mb: int | None) -> Ask:
    """The reservation a request turns into on a card of ``total_mb``.

    No memory given, or more than half the card, means the whole card (R3); smaller
    requests are rounded up to the 4 GB minimum slice.
    """
    if gpu_mem_mb is None or gpu_mem_mb * 2 > total_mb:
        return Ask(total_mb, True)
    return Ask(max(gpu_mem_mb, MIN_SLICE_MB), False)


def reserved_mb(gpu: GpuView) -> int:
    return sum(p.memory_mb for _, p in gpu.placements)


def free_mb(gpu: GpuView) -> int:
    """Memory nobody holds: total less our reservations less what others really use."""
    total = gpu.reading.memory_total_mb or 0
    return max(0, total - reserved_mb(gpu) - gpu.unmanaged_used_mb)


def offered_mb(gpu: GpuView, keep_mb: int = 0) -> int:
    """What this card can still offer a new slice (0 when the rest is a <4 GB fragment).

    ``keep_mb`` stays unoffered: a card holding a service keeps its spare (R14).
    """
    if gpu.blocked or any(p.exclusive for _, p in gpu.placements):
        return 0
    if len(gpu.placements) >= MAX_ALLOCATIONS_PER_GPU:
        return 0
    free = free_mb(gpu) - keep_mb
    return free if free >= MIN_SLICE_MB else 0


def fits(gpu: GpuView, gpu_mem_mb: int | None) -> Ask | None:
    """The reservation ``gpu`` can give a request, or None if it cannot."""
    total = gpu.reading.memory_total_mb
    if not total or gpu.blocked:
        return None
    ask = ask_for(total, gpu_mem_mb)
    if ask.exclusive:
        if gpu.placements:
            return None
        # A whole card with no size asked must really be empty; with a size, that much free.
        # The reservation is what is really there: others' processes keep what they hold.
        available = total - gpu.unmanaged_used_mb
        needed = gpu_mem_mb if gpu_mem_mb is not None else total
        return Ask(available, True) if available >= needed else None
    return ask if offered_mb(gpu) >= ask.memory_mb else None


def fit(total_mb: int | None, unmanaged_mb: int, reserved: int, allocations: int,
        exclusive_held: bool, gpu_mem_mb: int | None, keep_mb: int = 0) -> tuple[int, bool] | None:
    """The core R3/R14 rule on plain numbers: (reserved MiB, exclusive) or None.

    ``keep_mb`` is the service spare when the card holds, or would hold, a service.
    The whole-card reservation is what is really there (others' processes keep theirs).
    """
    if not total_mb:
        return None
    if gpu_mem_mb is None or gpu_mem_mb * 2 > total_mb:
        if allocations:
            return None
        available = total_mb - unmanaged_mb
        needed = gpu_mem_mb if gpu_mem_mb is not None else total_mb
        return (available, True) if available >= needed else None
    if exclusive_held or allocations >= MAX_ALLOCATIONS_PER_GPU:
        return None
    ask = max(gpu_mem_mb, MIN_SLICE_MB)
    free = total_mb - reserved - unmanaged_mb
    return (ask, False) if free - keep_mb >= ask else None
