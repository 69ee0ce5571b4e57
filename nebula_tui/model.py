"""Plain data shared by every layer: readings from nodes, GPUs, jobs and allocations.

Everything here is a frozen dataclass with no behaviour that does I/O, so the scheduler,
the store, the head service and the TUI can pass the same values around. A reading that a
tool could not give (``[N/A]``, ``[Not Supported]``) is ``None`` and is rendered as ``N/A``
by :func:`fmt`; one missing field never loses the whole GPU.

Why one module: it is the vocabulary every layer imports (states, views, sizes and the
limits they are judged by); split, each layer would import its pieces from several places.
"""

from __future__ import annotations

import dataclasses
import enum
import posixpath
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Self

from .units import MIB_PER_GIB, TaskArray

#: R3: no slice smaller than this is ever handed out or offered.
MIN_SLICE_MB = 4 * MIB_PER_GIB
#: R3: at most this many allocations live on one GPU at once.
MAX_ALLOCATIONS_PER_GPU = 4
#: What every client writes for a value nobody could read (a ``None``).
NOT_AVAILABLE = "N/A"
#: A card at or below this utilisation is idle (an idle card's readings wander by a few %):
#: for the idle-job limit and for accounting's GPU-hours "held idle" alike.
IDLE_UTIL_PCT = 5.0


def nominal_mb(total_mb: int) -> int:
    """The size a card is sold as: its memory rounded up to a whole GB (24564 MiB -> 24 GB,
    81559 MiB -> 80 GB, 8188 MiB -> 8 GB). Drivers keep a little for themselves, so the
    memory a card reports is a few MiB to most of a GB under the size on its box."""
    return -(-total_mb // MIB_PER_GIB) * MIB_PER_GIB


def takes_whole_card(total_mb: int, gpu_mem_mb: int | None) -> bool:
    """R3: whether a request takes a card of ``total_mb`` whole: no size given, or more than
    half of the card's *nominal* size (a 12 GB request is a slice of a 4090's 24564 MiB).
    The scheduler decides with it and the clients say it with it."""
    return gpu_mem_mb is None or gpu_mem_mb * 2 > nominal_mb(total_mb)


@dataclass(frozen=True)
class Temperatures:
    """The health policy's temperature thresholds (nodes.yaml ``scheduler.hot_c``): above
    ``hot_c`` a card is hot (the scheduler avoids it, a slow idle card is throttling, the
    TUI draws it red); above ``warm_c`` it is warm (it starts to count as load, and is
    drawn as a warning). The head publishes them; clients draw with :meth:`heat`."""

    hot_c: float = 75.0
    warm_c: float = 50.0

    def heat(self, temp_c: float | None) -> str | None:
        """"hot", "warm" or "cool"; None for no reading."""
        if temp_c is None:
            return None
        if temp_c > self.hot_c:
            return "hot"
        return "warm" if temp_c > self.warm_c else "cool"


class RequestError(Exception):
    """A client asked for something that cannot be done now (no such job, not theirs, already
    ended); the message says why, in one line. A client exits 1 on it."""


class InvalidRequest(RequestError):
    """A request that could never be valid as written (a field out of its bounds, a value of
    the wrong kind, an empty name): like a usage error the client catches itself, a client
    exits 2 on it — one rule, whichever end finds the mistake."""


class UnfitRequest(InvalidRequest):
    """A request this cluster could never serve as asked (no such card, a --time past the
    cluster's max_time): like a usage error, a client exits 2 on it."""


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


def ended_text(state: str, reason: str, detail: str = "") -> str:
    """An end in words, the reason never saying the state again: "cancelled by alice",
    "failed with exit code 1: out of memory" (``detail``: " with exit code 1"), the events
    log's and the CLI's alike ("cancelled: cancelled" said nothing twice)."""
    if not reason or reason == state:
        return state + detail
    if reason.startswith(state + " "):
        return reason + detail
    return f"{state}{detail}: {reason}"


def fmt(value: object, unit: str = "") -> str:
    """Render a reading, ``None`` (not available) as ``N/A``."""
    if value is None:
        return NOT_AVAILABLE
    if isinstance(value, float):
        value = f"{value:.0f}"
    return f"{value}{unit}"

#: the GPU vendors NebulaGrid drives, as jobs (--vendor) and readings name them
VENDORS = ("nvidia", "amd", "intel", "ascend")
#: the vendor of a card whose reading or row names none (readings before vendors were
#: told apart were all NVIDIA's); the one place this default is written
DEFAULT_VENDOR = VENDORS[0]


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
    compute_cap: str | None = None  # as the tool prints it: "8.9" (NVIDIA), "gfx90a" (AMD)
    vendor: str = DEFAULT_VENDOR
    # The rest of the vendor-neutral reading (node/backends/reading.py says what each is).
    base_sm_clock_mhz: float | None = None
    max_sm_clock_mhz: float | None = None
    max_mem_clock_mhz: float | None = None
    pcie_gen: int | None = None
    pcie_width: int | None = None
    pcie_gen_max: int | None = None
    pcie_width_max: int | None = None
    ecc_uncorrected: int | None = None
    ecc_corrected: int | None = None
    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None
    throttle_reasons: tuple[str, ...] | None = None  # active clock-event reasons; () none
    mig_mode: str | None = None
    persistence_mode: str | None = None  # "Enabled"/"Disabled" (NVIDIA)
    parent_uuid: str | None = None  # a MIG instance's GPU (R3: instances are devices)
    health: str | None = None  # the vendor's own verdict where it gives one (Ascend "OK")
    visible_env: str | None = None  # the variable that hands it to a job (CUDA_VISIBLE_DEVICES…)
    visible_id: str | None = None  # what that variable takes for it ("0", "MIG-…")
    #: why the driver cannot read the card now (GPU is lost, Unknown Error, gone from the
    #: tool's list, ERR! fields); None while it answers. A lost card is never offered.
    lost: str | None = None


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
    """A job's state as the store keeps it and clients see it (``job_json``'s "state").

    ``Job.status`` says more: a job holding GPUs may also be cancelling or evicting."""

    PENDING = "pending"  # waiting for GPUs; carries a reason
    LAUNCHING = "launching"  # allocation written, tmux session being created
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMEOUT = "timeout"  # killed at its time limit (--time)

    @property
    def finished(self) -> bool:
        return self in _FINISHED

    @property
    def holds_gpus(self) -> bool:
        return self in (JobState.LAUNCHING, JobState.RUNNING)

    @property
    def phrase(self) -> str:
        """The state in a sentence about a job: "job 7 has succeeded", "… timed out"."""
        return _PHRASES[self]


_FINISHED = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT})
_PHRASES = {JobState.PENDING: "is waiting", JobState.LAUNCHING: "is launching",
            JobState.RUNNING: "is running", JobState.SUCCEEDED: "has succeeded",
            JobState.FAILED: "has failed", JobState.CANCELLED: "was cancelled",
            JobState.TIMEOUT: "timed out"}
#: The states of an ended job as clients see them (``job_json``'s "state").
FINISHED_STATES = frozenset(s.value for s in _FINISHED)


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
    # What the job runs in (R24; checked by environments.py): a container image, the runtime
    # asked for, SRC:DST[:ro] mounts into it, or a conda env / venv activated on the node.
    image: str | None = None
    runtime: str | None = None
    data_mounts: tuple[str, ...] = ()
    conda: str | None = None
    venv: str | None = None
    #: where it was submitted from: its workdir when the node has that path and no --workdir
    submit_dir: str | None = None
    warmup: bool = False  # --warmup: wake the cards from their idle P-state first (R27)
    interactive: bool = False  # `nebula run`: the command gets a terminal; it ends the job (R33)
    notify: bool = False  # --notify: tell the owner when it ends or is requeued (mail, webhooks)
    #: what --after waits for: "ok" (success), "any" (an end), "notok" (an end without
    #: success), "started" (a start) of every job it names
    after_type: str = "ok"
    #: --array, parsed where it came in (text, from a store row or a test, here); a task
    #: also knows its array (the first task's job id), its index and its limit
    array: TaskArray | None = None
    array_id: int | None = None
    array_index: int | None = None
    array_limit: int | None = None
    #: --pool: the pool it must run in, or ``LOCAL_POOL`` (here only); None: here, or a
    #: pool whose burst_after it waited past
    pool: str | None = None
    #: --preemptible: runs on any free card whatever its user's fair share, stopped and
    #: requeued when a normal job needs the card; charged ``scheduler.preemptible_charge``
    preemptible: bool = False
    #: --reservation NAME: runs on that booking's cards only, inside its window
    reservation: str | None = None
    #: -o/-e: the files its output and error output go to on the node (relative: to its
    #: workdir), sbatch's patterns in them (``output_file`` expands them)
    output: str | None = None
    error: str | None = None
    #: -w/--nodelist: the only nodes it may run on (empty: any); -x/--exclude: never these
    nodelist: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    #: --export VAR=val: (name, value) pairs set in its environment on its node
    export_env: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.array, str):  # ValueError with a sentence when it is not one
            object.__setattr__(self, "array", TaskArray.parse(self.array))


#: sbatch's filename patterns that -o/-e take here: %j job id, %x name, %u user, %a array
#: task, %A array id (the job's own id outside an array), %% a percent sign
OUTPUT_PATTERNS = "jxuaA%"


def output_file(pattern: str, job_id: int, spec: JobSpec, user: str) -> str:
    """An -o/-e pattern with the job's values in it, as sbatch fills it (``%x-%j.out`` ->
    ``train-12.out``). A pattern is checked at submit (``OUTPUT_PATTERNS``)."""
    values = {"j": str(job_id), "x": spec.name or "", "u": user,
              "a": str(spec.array_index) if spec.array_index is not None else "4294967294",
              "A": str(spec.array_id if spec.array_id is not None else job_id), "%": "%"}
    return re.sub(r"%([%a-zA-Z])", lambda m: values.get(m.group(1), m.group(0)), pattern)


def spec_fields(spec: JobSpec) -> dict[str, Any]:
    """A JobSpec's JSON form (stored, in launch records; ``store.spec_of`` reads it back)."""
    fields = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}
    if spec.array is not None:
        fields["array"] = spec.array.text
    return fields


#: ``--pool local``: the job runs on the lab's own nodes, never in a pool
LOCAL_POOL = "local"


@dataclass(frozen=True)
class Placement:
    """One GPU given to a job: a memory reservation, or the whole card."""

    gpu_uuid: str
    node: str
    gpu_index: int
    memory_mb: int
    exclusive: bool


#: A gang's parts that ended so far: (node, exit code or None), in the order they ended.
Exits = tuple[tuple[str, "int | None"], ...]
WAITING_FOR_SCHEDULER = "waiting for the scheduler"


@dataclass(frozen=True)
class Pending:
    """Waiting for GPUs: why (the scheduler's sentence), and who holds it back, if anyone."""

    reason: str = WAITING_FOR_SCHEDULER
    held_by: str | None = None
    state: ClassVar[JobState] = JobState.PENDING


class _HoldsGpus:
    """What a launch and a run share: at least one GPU, and a gang's parts that ended."""

    placements: tuple[Placement, ...]
    exits: Exits

    def __post_init__(self) -> None:
        if not self.placements:
            raise ValueError("a job holding GPUs has at least one placement")

    def with_exit(self, node: str, code: int | None) -> Self:
        # each subclass is a dataclass; this mixin is not one itself
        return replace(self, exits=self.exits + ((node, code),))  # type: ignore[type-var]


@dataclass(frozen=True)
class Launching(_HoldsGpus):
    """The allocation is written; its nodes are creating the tmux sessions."""

    placements: tuple[Placement, ...]
    confirmed: frozenset[str] = frozenset()  # nodes whose session exists
    exits: Exits = ()  # a quick job may end before its launch is confirmed
    #: names this launch on its nodes (``<store>.<attempt>.<nonce>``, Store.start_launching);
    #: empty only for a launch written down before tokens had nonces
    token: str = ""
    state: ClassVar[JobState] = JobState.LAUNCHING


@dataclass(frozen=True)
class Running(_HoldsGpus):
    """Its sessions run on ``placements``' nodes since ``started_at``. ``doing``: what it
    does before its command, as its node says (pulling an image), else empty.
    ``idle_since``: since when its GPUs have all read ~0% (marked by head/limits.py, R30;
    None while they are in use). ``idle_unknown``: none of its GPUs reads in use, but one
    at least reports no utilisation at all (N/A), so whether it idles cannot be told."""

    placements: tuple[Placement, ...]
    started_at: float
    exits: Exits = ()  # the parts of a gang that ended so far
    doing: str = ""
    token: str = ""  # the launch that runs (as Launching's)
    idle_since: float | None = None
    idle_unknown: bool = False
    state: ClassVar[JobState] = JobState.RUNNING


Holding = Launching | Running


class _Stopping:
    """What a cancel, an eviction and the head's own stop share: the launch or run they
    stop, whose state the job keeps meanwhile."""

    holding: Holding

    def __post_init__(self) -> None:
        if not isinstance(self.holding, (Launching, Running)):
            raise ValueError(f"only a launching or running job can be stopped, not {self.holding!r}")

    @property
    def state(self) -> JobState:
        return self.holding.state


@dataclass(frozen=True)
class Cancelling(_Stopping):
    """Someone cancelled a job holding GPUs; its nodes stop it (the store keeps the
    request until they confirm)."""

    holding: Holding
    by: str
    since: float


@dataclass(frozen=True)
class Evicting(_Stopping):
    """Its GPU was isolated: it got SIGUSR1 and ends requeued (or failed, --no-requeue).
    ``stopping``: its sessions are being killed before that."""

    holding: Holding
    why: str
    stopping: bool = False


@dataclass(frozen=True)
class Stopping(_Stopping):
    """The head stops it for a reason of its own — its time limit, the memory guard,
    idleness, a requeue: it got SIGUSR1 (SIGKILL at ``kill_at``, the head's clock, after
    the grace) and, once it exited, ends as ``ends`` with ``why`` (``requeue``: goes back
    in the queue instead). The store keeps it, so a restarted head kills it on time."""

    holding: Holding
    ends: JobState
    why: str
    requeue: bool = False
    kill_at: float | None = None


@dataclass(frozen=True)
class Ended:
    """Succeeded, failed, cancelled or timed out, at ``ended_at``. ``node`` is where it
    ran (rank 0; its log is there), ``placements`` the GPUs it held at its end (released
    now; the store keeps which they were)."""

    state: JobState
    ended_at: float
    exit_code: int | None = None
    reason: str = ""
    started_at: float | None = None
    node: str | None = None
    placements: tuple[Placement, ...] = ()

    def __post_init__(self) -> None:
        if not self.state.finished:
            raise ValueError(f"an ended job is {', '.join(sorted(FINISHED_STATES))}, "
                             f"not {self.state.value}")


Status = Pending | Launching | Running | Cancelling | Evicting | Stopping | Ended


def holding(status: Status) -> Holding | None:
    """The launch or run a status holds GPUs for (also while cancelling, evicting or stopping)."""
    if isinstance(status, (Launching, Running)):
        return status
    if isinstance(status, (Cancelling, Evicting, Stopping)):
        return status.holding
    return None


def held(status: Status) -> Holding:
    """The launch or run of a status that holds GPUs (``holding``, for callers that checked
    it does); ValueError when it holds none."""
    found = holding(status)
    if found is None:
        raise ValueError(f"a {type(status).__name__.lower()} job holds no GPUs")
    return found


def launching(status: Status) -> Launching:
    """The launch of a status still launching (cancelling, evicting or stopping it too);
    ValueError for any other."""
    found = holding(status)
    if not isinstance(found, Launching):
        raise ValueError(f"a {type(status).__name__.lower()} job is not launching")
    return found


def stopping(status: Status) -> Stopping:
    """A status the head is stopping (for callers that checked it is); ValueError else."""
    if not isinstance(status, Stopping):
        raise ValueError(f"a {type(status).__name__.lower()} job is not being stopped")
    return status


def with_holding(status: Status, held: Holding) -> Status:
    """``status`` with its launch or run replaced by ``held`` (a cancel, an eviction or a
    stop stays what it is while the job starts or its parts end)."""
    if isinstance(status, (Cancelling, Evicting, Stopping)):
        return replace(status, holding=held)
    return held


@dataclass(frozen=True)
class Job:
    """A job: what was asked (``spec``) and where it stands (``status``, which carries
    exactly the data of its state). The other fields read the status."""

    id: int
    user: str
    spec: JobSpec
    submitted_at: float
    status: Status = Pending()
    attempt: int = 0  # how many times it was requeued; each launch of it is a new attempt
    #: where its command runs on the node, as the node chose it (None: not started yet)
    workdir_used: str | None = None
    #: the pool it was sent to (its place there reads ``pool:node``), None while it is ours
    pool: str | None = None
    preemptions: int = 0  # how many times a normal job's need stopped and requeued it
    state: JobState = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.status, (Pending, Launching, Running, Cancelling, Evicting, Stopping, Ended)):
            raise TypeError(f"job {self.id}: {self.status!r} is not a job status")
        object.__setattr__(self, "state", self.status.state)  # read on every pass: kept

    def with_reason(self, reason: str) -> Job:
        """This waiting job with another waiting reason (the scheduler's sentence), copied
        field by field: ``dataclasses.replace`` reads every field's definition, and a long
        queue's passes give 100,000s of jobs a new sentence."""
        status = self.status
        if not isinstance(status, Pending):
            raise ValueError(f"job {self.id} does not wait: it has no waiting reason")
        job = object.__new__(Job)
        job.__dict__.update(self.__dict__)
        job.__dict__["status"] = Pending(reason, status.held_by)
        return job

    @property
    def pooled(self) -> bool:
        """Whether a pool runs it (sent there, or asked for with --pool): never placed here."""
        return self.pool is not None or self.spec.pool not in (None, LOCAL_POOL)

    @property
    def reason(self) -> str:
        """Why it waits (pending) or why it ended; while it runs, what it does before its
        command (pulling an image), else empty."""
        if isinstance(self.status, (Pending, Ended)):
            return self.status.reason
        return self.status.doing if isinstance(self.status, Running) else ""

    @property
    def held_by(self) -> str | None:
        return self.status.held_by if isinstance(self.status, Pending) else None

    @property
    def placements(self) -> tuple[Placement, ...]:
        held = holding(self.status)
        if held is not None:
            return held.placements
        return self.status.placements if isinstance(self.status, Ended) else ()

    @property
    def node(self) -> str | None:
        """The node of its first GPU (rank 0 of a gang), or where it ran."""
        if isinstance(self.status, Ended):
            return self.status.node
        placements = self.placements
        return placements[0].node if placements else None

    @property
    def started_at(self) -> float | None:
        held = holding(self.status)
        if isinstance(held, Running):
            return held.started_at
        return self.status.started_at if isinstance(self.status, Ended) else None

    @property
    def ended_at(self) -> float | None:
        return self.status.ended_at if isinstance(self.status, Ended) else None

    @property
    def launch_token(self) -> str | None:
        """The token of the launch that holds its GPUs (None while pending or ended)."""
        held = holding(self.status)
        return held.token or None if held is not None else None

    @property
    def exit_code(self) -> int | None:
        return self.status.exit_code if isinstance(self.status, Ended) else None


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
    #: (job id, MiB) our jobs really hold here beyond their reservations (the memory guard)
    overuse: tuple[tuple[int, int], ...] = ()
    #: (pid, Unix user or None, MiB) of the processes NebulaGrid did not start, for reasons
    unmanaged_procs: tuple[tuple[int, str | None, int], ...] = ()
    #: the highest draw seen on this card lately (W): what power budgets count when the
    #: card reports no power limit (R27)
    power_peak_w: float | None = None

    @property
    def uuid(self) -> str:
        return self.reading.uuid


def format_mb(mb: int | None) -> str:
    """MiB -> "24 GB" / "512 MB" for people (GB meaning GiB, as everywhere here)."""
    if mb is None:
        return NOT_AVAILABLE
    if mb >= MIB_PER_GIB:
        gb = mb / MIB_PER_GIB
        return f"{gb:.0f} GB" if gb >= 10 or gb.is_integer() else f"{gb:.1f} GB"
    return f"{mb} MB"


def stdio_path(job: Job, pattern: str | None) -> str | None:
    """An -o/-e file as sbatch shows it (``scontrol show job``'s StdOut): the patterns
    filled, a relative name under the job's workdir where that is known."""
    if not pattern:
        return None
    path = output_file(pattern, job.id, job.spec, job.user)
    base = job.workdir_used or job.spec.workdir or job.spec.submit_dir
    return posixpath.join(base, path) if base and not path.startswith("/") else path


# ------------------------------------------------------------------ what a run is charged
#: the card a slice's gigabytes are charged against (``scheduler.charge_reference``): 24 GB,
#: the commonest card of a lab's workstations (3090, 4090, A10, L4); fixed rather than the
#: lab's median card so a charge does not move when cards are bought or retired
DEFAULT_CHARGE_REFERENCE_MB = 24 * 1024


def card_share(memory_mb: int, exclusive: bool, reference_mb: int = DEFAULT_CHARGE_REFERENCE_MB) -> float:
    """How many cards one placement is charged as: a whole card 1.0 (whatever its size),
    a slice its memory over the reference card's, at most 1.0 — not its share of the card
    it landed on (8 GB is 1/3 wherever it runs, not 0.1 of an A100 and 0.33 of a 4090)."""
    if exclusive or reference_mb <= 0:
        return 1.0
    return min(1.0, memory_mb / reference_mb)


def charged_gpu_hours(cards: Iterable[tuple[int, bool]], seconds: float,
                      reference_mb: int = DEFAULT_CHARGE_REFERENCE_MB, charge: float = 1.0) -> float:
    """The GPU-hours a run is charged: its ``cards`` ((memory MB, exclusive) each) held
    for ``seconds``, each counted as ``card_share`` says, times ``charge`` (a preemptible
    job's ``scheduler.preemptible_charge``, else 1)."""
    shares = sum(card_share(memory_mb, exclusive, reference_mb) for memory_mb, exclusive in cards)
    return shares * max(0.0, seconds) / 3600.0 * charge
