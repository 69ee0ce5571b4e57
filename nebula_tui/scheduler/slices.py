"""R3 memory slices: how much of a card a request takes, and whether a card can give it.

Slices are reservations, not partitions: compute is shared, memory is promised. A request
for more than half a card takes the whole card; nothing under ``MIN_SLICE_MB`` is handed
out; at most ``MAX_ALLOCATIONS_PER_GPU`` jobs share one card. Memory that processes we did
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


def offered_mb(gpu: GpuView) -> int:
    """What this card can still offer a new slice (0 when the rest is a <4 GB fragment)."""
    if gpu.blocked or any(p.exclusive for _, p in gpu.placements):
        return 0
    if len(gpu.placements) >= MAX_ALLOCATIONS_PER_GPU:
        return 0
    free = free_mb(gpu)
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
