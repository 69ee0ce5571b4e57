"""R3 memory slices: how much of a card a request takes, and whether a card can give it.

Slices are reservations, not partitions: compute is shared, memory is promised. A request
for more than half a card takes the whole card; nothing under ``MIN_SLICE_MB`` is handed
out; at most ``MAX_ALLOCATIONS_PER_GPU`` jobs share one card; a card holding an inference
service keeps ``service_spare_mb`` free and is never taken whole by anyone else (R14).

"Half a card" and "the whole card" are measured against the card's *nominal* size, its
memory rounded up to a whole GB (``model.takes_whole_card``, the one rule the clients
show too): a 4090 reports 24564 MiB and is sold as 24 GB, so ``--gpu-mem 24G`` takes it whole and
``--gpu-mem 12G`` is half of it. Slices
are fitted against the memory really there: two 12 GB slices do not fit on a 4090.

"Free" is what is really free *and* not promised (the memory guard): the card's memory less
our reservations, less what processes we did not start hold, less what our jobs hold beyond
their reservations.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..model import MAX_ALLOCATIONS_PER_GPU, MIN_SLICE_MB, GpuView, nominal_mb, takes_whole_card


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
    if gpu_mem_mb is None or takes_whole_card(total_mb, gpu_mem_mb):
        return Ask(total_mb, True)
    return Ask(max(gpu_mem_mb, MIN_SLICE_MB), False)


def reserved_mb(gpu: GpuView) -> int:
    return sum(p.memory_mb for _, p in gpu.placements)


def held_mb(gpu: GpuView) -> int:
    """Memory held on the card beyond our reservations: others' processes, and our jobs'
    use above what they reserved."""
    return gpu.unmanaged_used_mb + sum(mb for _, mb in gpu.overuse if mb > 0)


def free_mb(gpu: GpuView) -> int:
    """Memory nobody holds or was promised: total less our reservations less what is
    really held beyond them."""
    total = gpu.reading.memory_total_mb or 0
    return max(0, total - reserved_mb(gpu) - held_mb(gpu))


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
    got = fit(total, held_mb(gpu), reserved_mb(gpu), len(gpu.placements),
              any(p.exclusive for _, p in gpu.placements), gpu_mem_mb)
    return None if got is None else Ask(*got)


#: The sizes people ask for most (GB): every GPU view says how many more of each fit.
COMMON_SIZES_GB = (4, 8, 16)


def count_fit(total_mb: int | None, unmanaged_mb: int, reserved: int, allocations: int,
              exclusive_held: bool, gpu_mem_mb: int, keep_mb: int = 0) -> int:
    """How many more jobs asking ``gpu_mem_mb`` each a card takes: :func:`fit` applied job
    after job, as a pass would place them (plain numbers, as :func:`fit` takes them)."""
    count = 0
    while allocations < MAX_ALLOCATIONS_PER_GPU:
        got = fit(total_mb, unmanaged_mb, reserved, allocations, exclusive_held, gpu_mem_mb, keep_mb)
        if got is None:
            break
        count, reserved, allocations, exclusive_held = count + 1, reserved + got[0], allocations + 1, got[1]
    return count


def common_fits(gpu: GpuView, spare_mb: int, holds_service: bool) -> dict[str, int]:
    """{"4G": n, "8G": n, "16G": n}: how many more jobs of each common size the card takes
    now (``spare_mb`` kept free on a card that ``holds_service``), what the GPU views show."""
    args = (gpu.reading.memory_total_mb, held_mb(gpu), reserved_mb(gpu), len(gpu.placements),
            any(p.exclusive for _, p in gpu.placements))
    return {f"{gb}G": 0 if gpu.blocked else count_fit(*args, gb * 1024, spare_mb if holds_service else 0)
            for gb in COMMON_SIZES_GB}


def fit(total_mb: int | None, unmanaged_mb: int, reserved: int, allocations: int,
        exclusive_held: bool, gpu_mem_mb: int | None, keep_mb: int = 0) -> tuple[int, bool] | None:
    """The core R3/R14 rule on plain numbers: (reserved MiB, exclusive) or None.

    ``unmanaged_mb`` is what is held beyond our reservations (:func:`held_mb`); ``keep_mb``
    the service spare when the card holds, or would hold, a service. A whole card with no
    size asked must be empty; with a size, it fits when the size is at most the card's
    nominal size less what others hold (a 24 GB request fits an idle 4090). The whole-card
    reservation is what is really there: others' processes keep what they hold.
    """
    if not total_mb:
        return None
    if gpu_mem_mb is None or takes_whole_card(total_mb, gpu_mem_mb):
        if allocations:
            return None
        available = total_mb - unmanaged_mb
        if gpu_mem_mb is None:
            return (available, True) if not unmanaged_mb else None
        # a service asked this big takes the card whole, and still keeps its spare on it
        room = nominal_mb(total_mb) - unmanaged_mb - keep_mb
        return (available, True) if gpu_mem_mb <= room else None
    if exclusive_held or allocations >= MAX_ALLOCATIONS_PER_GPU:
        return None
    ask = max(gpu_mem_mb, MIN_SLICE_MB)
    free = total_mb - reserved - unmanaged_mb
    return (ask, False) if free - keep_mb >= ask else None
