"""First-fit gang placement: the first node that has every GPU a job needs gets it.

Replaceable by design: :func:`place` takes the GPUs as the pass currently sees them and
returns placements or the reason there are none; it knows nothing of queues or users.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from ..model import GpuView, Placement, format_mb
from .slices import fits


def place(gpus: Sequence[GpuView], gpu_count: int, gpu_mem_mb: int | None) -> tuple[tuple[Placement, ...], str]:
    """Choose ``gpu_count`` GPUs on one node (R8: all or none).

    Returns (placements, "") on success, or ((), reason) where the reason says what is
    needed and the best that exists now (R5).
    """
    by_node: dict[str, list[Placement]] = defaultdict(list)
    for gpu in gpus:
        ask = fits(gpu, gpu_mem_mb)
        if ask is None:
            continue
        by_node[gpu.node].append(
            Placement(gpu.uuid, gpu.node, gpu.reading.index, ask.memory_mb, ask.exclusive)
        )
    for node in sorted(by_node, key=_node_order(gpus)):
        fitting = by_node[node]
        if len(fitting) >= gpu_count:
            return tuple(fitting[:gpu_count]), ""
    return (), _waiting_reason(gpus, by_node, gpu_count, gpu_mem_mb)


def _node_order(gpus: Sequence[GpuView]):
    first_seen = {}
    for gpu in gpus:
        first_seen.setdefault(gpu.node, len(first_seen))
    return first_seen.__getitem__


def _waiting_reason(gpus, by_node, gpu_count: int, gpu_mem_mb: int | None) -> str:
    what = "a whole GPU" if gpu_mem_mb is None else f"a GPU with ≥{format_mb(gpu_mem_mb)} free"
    if gpu_count > 1:
        what = (f"{gpu_count} whole GPUs" if gpu_mem_mb is None
                else f"{gpu_count} GPUs with ≥{format_mb(gpu_mem_mb)} free")
        what += " on one node"
    if not gpus:
        return f"needs {what}; no GPU is registered yet (no node has answered)"
    if all(g.blocked for g in gpus):
        return f"needs {what}; no GPU takes new work now ({gpus[0].blocked})"
    if not by_node:
        return f"needs {what}; none is free now"
    best = max(by_node, key=lambda n: len(by_node[n]))
    return f"needs {what}; best now: {best} has {len(by_node[best])}"
