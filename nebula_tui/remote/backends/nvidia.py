"""The head's face of the nvidia-smi parsers: the same readings as model values.

``nvidia_smi`` (shipped to the nodes) yields vendor-neutral dicts; these wrappers give
``GpuReading``/``GpuProcess`` for callers on the head (tests, the simulated lab's checks).
"""

from __future__ import annotations

from collections.abc import Sequence

from ...model import GpuProcess, GpuReading

from ..readings import gpu_process, gpu_reading
from ...node.backends.nvidia_smi import (  # noqa: F401  (re-exported)
    QUERY_APPS_FIELDS,
    QUERY_GPU_FIELDS,
    ParseError,
    parse_plain_table,
    query_apps_argv,
    query_gpu_argv,
)
from ...node.backends.nvidia_smi import parse_query_apps_lines, parse_query_gpu_lines


def parse_query_gpu_report(text: str, fields: Sequence[str] | None = None
                           ) -> tuple[list[GpuReading], list[str]]:
    """Like :func:`parse_query_gpu`, also returning warnings (GPUs the driver lost)."""
    devices, warnings = parse_query_gpu_lines(text.splitlines(), fields)
    return [gpu_reading(d) for d in devices], warnings


def parse_query_gpu(text: str, fields: Sequence[str] | None = None) -> list[GpuReading]:
    """``--query-gpu`` CSV output (with or without header and units) as readings, one per
    GPU (a ``-l`` loop's latest sample of each). Raises ParseError when a row's value count
    differs from the field list."""
    return parse_query_gpu_report(text, fields)[0]


def parse_query_apps(text: str, fields: Sequence[str] | None = None) -> list[GpuProcess]:
    """``--query-compute-apps`` CSV output; header only (or nothing) = no processes."""
    return [p for p in map(gpu_process, parse_query_apps_lines(text.splitlines(), fields)) if p]
