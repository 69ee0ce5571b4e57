"""The simulated lab's CUDA driver: build ``cuda_shim.c`` into ``libcuda.so.1`` and give
each NVIDIA node its ``cuda.tsv`` (the cards the library finds).

It holds only what the warm-up calls (R27). Without a C compiler a node has no
``libcuda.so.1``, like a machine without the driver: the warm-up then says it skipped.
"""

from __future__ import annotations

from pathlib import Path

from ..model import DEFAULT_VENDOR
from . import shims

SOURCE = Path(__file__).resolve().parent / "cuda_shim.c"
LIBRARY = "libcuda.so.1"


def build() -> Path | None:
    """The library built from the current source (cached), or None without a C compiler."""
    return shims.build(SOURCE, LIBRARY)


def install(node_dir: Path, spec: dict) -> bool:
    """Give a node with NVIDIA cards its ``lib/libcuda.so.1`` and ``cuda.tsv`` unless its
    spec says ``"cuda": false``. Returns whether it has one."""
    cards = [g for g in spec.get("gpus", []) if g.get("vendor", DEFAULT_VENDOR) == "nvidia"]
    built = build() if cards and spec.get("cuda", True) is not False else None
    if built is not None:
        (node_dir / "cuda.tsv").write_text("".join(
            f"gpu\t{g['index']}\t{g['uuid']}\t{g['memory_total_mb']}\n" for g in cards))
    return shims.link(built, node_dir, LIBRARY)
