"""Plain data shared by every layer: readings from nodes, GPUs, jobs and allocations.

Everything here is a frozen dataclass with no behaviour that does I/O, so the scheduler,
the store, the head service and the TUI can pass the same values around. A reading that a
tool could not give (``[N/A]``, ``[Not Supported]``) is ``None`` and is rendered as ``N/A``
by :func:`fmt`; one missing field never loses the whole GPU.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

MIB_PER_GIB = 1024
#: R3: no slice smaller than this is ever handed out or offered.
MIN_SLICE_MB = 4 * MIB_PER_GIB
#: R3: at most this many allocations live on one GPU at once.
MAX_ALLOCATIONS_PER_GPU = 4


class RequestError(Exception):
    """A client asked for something that cannot be done; the message says why, in one line."""


class ConfigError(Exception):
    """A config file that cannot be used. ``str(err)`` is one line: ``path:LINE: message``.

    ``path``, ``line`` and ``column`` (1-based, ``None`` when unknown) let a UI point at
    the spot; ``message`` is the text after the location.
    """

    def __init__(
        self,
        message: str,
        path: str | None = None,
        line: int | None = None,
        column: int | None = None,
    ) -> None:
        self.message = message
        self.path = path
        self.line = line
        self.column = column
        where = path or "<config>"
        if line is not None:
            where += f":{line}"
            if column is not None:
                where += f":{column}"
        super().__init__(f"{where}: {message}")


def fmt(value: object, unit: str = "") -> str:
    """Render a reading, ``None`` (not available) as ``N/A``."""
    if value is None:
        return "N/A"
    if isinstance(value, float):
        value = f"{value:.0f}"
    return f"{value}{unit}"


@dataclass(frozen=True)
class GpuReading:
    """One GPU as a vendor tool reported it at one moment (the probe's raw facts)."""

    index: int
    uuid: str
    name: str
    pci_bus_id: str | None = None
    memory_total_mb: int | None = None
    memory_used_mb: int | None = None
    utilization_pct: float | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    fan_pct: float | None = None
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    pstate: str | None = None
    driver_version: str | None = None
    compute_cap: str | None = None  # as the tool prints it: "8.9"
    vendor: str = "nvidia"


@dataclass(frozen=True)
class GpuProcess:
    """A process that holds memory on a GPU (ours or someone's hand-started python)."""

    gpu_uuid: str | None
    pid: int
    name: str | None
    used_memory_mb: int | None


class NodeState(str, enum.Enum):
    CONNECTING = "connecting"
    UP = "up"
    UNKNOWN = "unknown"  # R15: missed 3 probes; nothing new is placed there
    DOWN = "down"  # could not connect at all (unreachable, auth or host-key failure)
    DRAINED = "drained"


class JobState(str, enum.Enum):
    PENDING = "pending"  # waiting for GPUs; carries a reason
    LAUNCHING = "launching"  # allocation written, tmux session being created
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)

    @property
    def holds_gpus(self) -> bool:
        return self in (JobState.LAUNCHING, JobState.RUNNING)


@dataclass(frozen=True)
class JobSpec:
    """What a user asked for. ``gpu_mem_mb`` None means whole cards."""

    command: tuple[str, ...]
    name: str = ""
    gpu_count: int = 1
    gpu_mem_mb: int | None = None
    workdir: str | None = None
    shell: bool = False  # True: command[0] is a shell command line (``--command "…"``)
    arch: str | None = None  # --arch sm_89 (exact family) or ">=sm_80" (minimum) (R11)
    cuda: str | None = None  # --cuda 12.1: the driver must support at least this (R11)
    vendor: str | None = None  # --vendor nvidia/intel/ascend
    nodes: int = 1  # --nodes: how many nodes a gang may span (R8)
    priority: int = 0  # --priority: admins only; higher runs first (R6)
    after: tuple[int, ...] = ()  # --after: start once these jobs succeeded (R25)
    time_limit_s: float | None = None  # --time: ends by then; lets it backfill (R25)
    service: bool = False  # --service: long-running inference service (R14)
    no_requeue: bool = False  # --no-requeue: fail instead of restarting when its GPU is isolated


@dataclass(frozen=True)
class Placement:
    """One GPU given to a job: a memory reservation, or the whole card."""

    gpu_uuid: str
    node: str
    gpu_index: int
    memory_mb: int
    exclusive: bool


@dataclass(frozen=True)
class Job:
    id: int
    user: str
    spec: JobSpec
    state: JobState
    submitted_at: float
    reason: str = ""  # why it waits (pending) or why it ended (failed/cancelled)
    node: str | None = None
    placements: tuple[Placement, ...] = ()
    started_at: float | None = None
    ended_at: float | None = None
    exit_code: int | None = None
    held_by: str | None = None  # a pending job someone put on hold (not scheduled until released)
    attempt: int = 0  # how many times it was requeued; each launch of it is a new attempt


@dataclass(frozen=True)
class Slice:
    """R2: a memory reservation on a GPU, and the job holding it."""

    id: int
    memory_mb: int
    state: str  # "allocated" (a job holds it) or "free" (memory still on offer)
    job: int | None = None


@dataclass(frozen=True)
class GpuView:
    """What the scheduler and clients see of one GPU: its last reading plus our state."""

    node: str
    reading: GpuReading
    #: why no new work may go here (node drained or unknown, GPU in maintenance), or None
    blocked: str | None = None
    maintenance: bool = False
    placements: tuple[tuple[int, Placement], ...] = ()  # (job id, placement) held here now
    unmanaged_used_mb: int = 0  # memory held by processes NebulaGrid did not start
    #: the node's health score, 1.0 = healthy; throttling events lower it (R19)
    health_score: float = 1.0
    #: the highest CUDA version the node's driver supports ("12.4"), for --cuda (R11)
    cuda_version: str | None = None

    @property
    def uuid(self) -> str:
        return self.reading.uuid


_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b)?\s*$", re.IGNORECASE)
_UNIT_MB = {"": None, "k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}


def parse_size_mb(text: str) -> int:
    """Parse a memory size as users write it: 8G, 8GB, 8GiB, 8192M, 0.5T -> MiB.

    G, GB and GiB all mean 1024 MiB, the way nvidia-smi counts. A bare number is taken as
    GiB when small (<= 1024, "8" = 8 GiB) — nobody asks for 8 MiB of a GPU. Raises
    ValueError with a sentence naming what is wrong.
    """
    match = _SIZE_RE.match(str(text))
    if not match:
        raise ValueError(f"'{text}' is not a size; write it like 8G, 8GB, 8GiB or 8192M")
    number, unit, _ = match.groups()
    scale = _UNIT_MB[unit.lower()]
    if scale is None:
        scale = 1024 if float(number) <= 1024 else 1
    mb = float(number) * scale
    if mb < 1:
        raise ValueError(f"'{text}' is smaller than 1 MiB")
    return int(round(mb))


def format_mb(mb: int | None) -> str:
    """MiB -> "24 GB" / "512 MB" for people (GB meaning GiB, as everywhere here)."""
    if mb is None:
        return "N/A"
    if mb >= MIB_PER_GIB:
        gb = mb / MIB_PER_GIB
        return f"{gb:.0f} GB" if gb >= 10 or gb.is_integer() else f"{gb:.1f} GB"
    return f"{mb} MB"
