"""The shapes that travel between the head and its clients, as types both ends import (as
``remote/protocol.py`` types the node's wire): what the head sends (a job, a queue row, a
job's page, an ended job, a GPU, a node, the status and its summary, a start forecast, a
plan, the replies that carry them, named ``<Op>Reply``, and the event stream's snapshot
and events), and a submit request as a client sends it (``cli.jobs.submit_request``, read
by ``head.requests.spec_from_request``).

They are ``TypedDict``s: on the wire a shape is still the plain JSON object it always was, so
nothing about the protocol changes. ``views`` builds each one and mypy checks it there (and
in the head's rooms that put them in replies); the CLI's text and the TUI's screens read
them by these names. ``tests/unit/test_wire.py`` and ``tests/lab/test_e2e.py`` hold a real
head's answers to them, keys and types. Plain data only: this module imports nothing of the
package.
"""

# (no ``from __future__ import annotations``: the annotations are evaluated when a class is
# made, so that ``NotRequired`` lands in its ``__optional_keys__``, as tests read them)
from collections.abc import Mapping
from typing import Any, Literal, NotRequired, TypedDict


class PlacedCard(TypedDict):
    """A card (or a slice of one) a job holds."""

    uuid: str
    node: str
    index: int
    memory_mb: int | None
    exclusive: bool


class JobWire(TypedDict):
    """A job as clients see it (``views.job_json``): ``state`` is the stored state, ``phase``
    the one word every client shows (``views.JobPhase``)."""

    id: int
    user: str
    name: str | None
    state: str
    reason: str | None
    node: str | None
    command: list[str]
    shell: bool
    gpu_count: int
    nodes: int
    gpu_mem_mb: int | None
    workdir: str | None
    submitted_at: float
    started_at: float | None
    ended_at: float | None
    exit_code: int | None
    held: bool
    held_by: str | None
    attempt: int
    phase: str
    cancel_by: str | None
    cancel_since: float | None
    evicting: str | None
    image: str | None
    runtime: str | None
    data_mounts: list[str]
    conda: str | None
    venv: str | None
    submit_dir: str | None
    warmup: bool
    workdir_used: str | None
    interactive: bool
    stopping: str | None
    idle_since: float | None
    idle_unknown: bool
    array_id: int | None
    array_index: int | None
    array: str | None
    after: list[int]
    after_type: str
    time_limit_s: float | None
    vendor: str | None
    output: str | None
    error: str | None
    arch: str | None
    cuda: str | None
    nodelist: list[str]
    exclude: list[str]
    export: dict[str, str]
    pool: str | None
    preemptible: bool
    preemptions: int
    gpus: list[PlacedCard]


class GpuSlice(TypedDict):
    """A share of a card: held by a job (``allocated``) or what is left of it (``free``)."""

    id: int
    memory_mb: int | None
    state: str
    job: int | None
    exclusive: bool


class GpuWire(TypedDict):
    """A GPU as clients see it (``views.gpu_json``): its descriptor, live readings, slices,
    and ``fits`` (how many more jobs of the usual sizes the scheduler would place on it)."""

    uuid: str
    node: str
    index: int
    model: str
    vendor: str
    total_memory_mb: int | None
    compute_capability: str | None
    pci_bus_id: str | None
    nvlink: list[dict[str, Any]]
    status: str
    blocked: str | None
    driver_version: str | None
    cuda_version: str | None
    slices: list[GpuSlice]
    cuda_gap: str | None
    jobs: list[int]
    memory_used_mb: int | None
    utilization_pct: float | None
    temperature_c: float | None
    power_w: float | None
    power_limit_w: float | None
    unmanaged_used_mb: int
    health_score: float
    processes: list[dict[str, Any]]
    fits: dict[str, int]
    #: the probe's whole reading as it came, for ``nebula gpus`` (``raw=True``)
    reading: NotRequired[dict[str, Any]]


class NodeWire(TypedDict):
    """A node as clients see it (``head.state.NodeLive.json``)."""

    name: str
    host: str
    port: int
    state: str
    reason: str | None
    drained: bool
    last_seen: float | None
    power_budget_w: int | None
    hostname: str | None


class StartForecast(TypedDict):
    """A waiting job's start forecast (``head.forecast.Start.json``; ``forecasts.starts_text``
    words it): the expected start and its interval (None: not within ``within_s``), the
    job without --time whose end it waits for, and the node it starts on in the run."""

    start_at: float | None
    early: float | None
    late: float | None
    after_job: int | None
    node: str | None
    made_at: float
    simulated_at: float | None
    within_s: float


class QueueRow(JobWire):
    """A live job as ``queue`` lists it (``views.queue_row``): its place among the waiting
    (None: not waiting, or not ordered yet) and its last start forecast (waiting jobs)."""

    queue_pos: int | None
    starts: StartForecast | None


class ForecastHit(TypedDict):
    """The head's first start forecast for a job that has ended (``history_json``)."""

    start_at: float
    early: float | None
    late: float | None


class HistoryJob(JobWire):
    """An ended job as ``job_history`` lists it (``views.history_json``): its wait and run
    (of its last run), GPU-hours charged, what its cards did (None without samples), and
    how its first forecast came out."""

    wait_s: float
    run_s: float
    gpu_hours: float
    mean_util_pct: float | None
    idle_gpu_hours: float | None
    mem_used_mb_mean: int | None
    mem_used_mb_peak: int | None
    forecast: ForecastHit | None
    forecast_error_s: float | None


class JobDetail(QueueRow):
    """A job as ``job`` answers (``views.job_detail``), one not ended: a queue row and the
    environment each of its nodes gives its command (node -> variables; {} unplaced)."""

    environment: dict[str, dict[str, str]]


class EndedJobDetail(HistoryJob):
    """A job as ``job`` answers once it ended: its history row and the same extras."""

    queue_pos: int | None
    starts: StartForecast | None
    environment: dict[str, dict[str, str]]


class NodeDetail(TypedDict):
    """One node's line of the status (``views.status_summary``): its cards by model."""

    name: str
    state: str
    reason: str
    models: dict[str, int]
    load_pct: int | None


class StatusSummary(TypedDict):
    """The cluster's numbers (``views.status_summary``): nodes and GPUs, GPUs by status,
    VRAM in MiB, and each node's line."""

    nodes: int
    gpus: int
    idle: int
    busy: int
    maintenance: int
    unreachable: int
    lost: int
    total_vram_mb: int
    free_vram_mb: int
    node_details: list[NodeDetail]


class ClusterStatus(TypedDict):
    """The nodes, their GPUs (without the raw reading) and the summary of both, as the
    stream has them (``head.stream.Stream.status``)."""

    nodes: list[NodeWire]
    gpus: list[GpuWire]
    summary: StatusSummary


class StatusView(ClusterStatus):
    """``Engine.status``: the cluster's status and each pool's (``head.pools`` words it)."""

    pools: list[dict[str, Any]]


class PlanView(TypedDict):
    """``plan``'s answer, the submit form's preview: ``start`` on ``gpus``, ``wait`` with
    the reason and forecast, or ``preempt`` the jobs in ``preempts`` to start."""

    decision: Literal["start", "wait", "preempt"]
    reason: NotRequired[str]
    gpus: NotRequired[list[PlacedCard]]
    preempts: NotRequired[list[int]]
    starts: NotRequired[StartForecast | None]


# ----------------------------------------------------------------- the event stream
class EventRow(TypedDict):
    """A line of the head's events log (``events``, the snapshot's latest, "event" events)."""

    t: float
    kind: str
    message: str
    job_id: int | None
    node: str | None
    gpu: str | None
    user: str | None


class TemperaturesView(TypedDict):
    """The health policy's thresholds clients colour temperatures by (``model.Temperatures``)."""

    hot_c: float
    warm_c: float


class StreamState(ClusterStatus):
    """What the stream holds (``head.stream.Stream.snapshot``): the cluster's status, every
    live job as ``queue`` lists it, the waiting ones' order and start forecasts (by job id,
    as JSON keys are strings), the latest events and the temperature thresholds."""

    jobs: list[QueueRow]
    queue: list[int]
    starts: dict[str, StartForecast]
    events: list[EventRow]
    temperatures: TemperaturesView


class StreamSnapshot(StreamState):
    """``subscribe``'s first line (beside ``"ok": true, "type": "snapshot"``), and again
    after a subscriber fell behind: the stream's state, and the users' rows, each pool's
    view and the bookings (their rooms word those)."""

    users: list[dict[str, Any]]
    pools: list[dict[str, Any]]
    bookings: list[dict[str, Any]]


class JobEvent(TypedDict):
    """A job, whole, after each change."""

    type: Literal["job"]
    job: JobWire


class NodeEvent(TypedDict):
    type: Literal["node"]
    node: NodeWire


class LogEvent(TypedDict):
    """A line the events log committed."""

    type: Literal["event"]
    event: EventRow


class QueueEvent(TypedDict):
    """The waiting jobs' order; after a forecast, the start forecasts too."""

    type: Literal["queue"]
    order: list[int]
    starts: NotRequired[dict[str, StartForecast]]


class GpusEvent(TypedDict):
    """A node's GPUs against what subscribers hold: a GPU new to them whole, else only its
    changed fields (``head.stream.Stream.gpu_changes``); ``gone``: GPUs no longer there."""

    type: Literal["gpus"]
    node: str
    gpus: dict[str, Mapping[str, Any]]
    gone: NotRequired[list[str]]
    #: when the node last reported (the Nodes screen's "Seen"), once it has
    seen: NotRequired[float | None]


class TickEvent(TypedDict):
    """A quiet stream's heartbeat."""

    type: Literal["tick"]


#: what ``head.stream.Stream`` publishes itself (the users', pools' and bookings' rooms
#: publish "user", "pool" and "bookings" events of their own words)
StreamEvent = JobEvent | NodeEvent | LogEvent | QueueEvent | GpusEvent | TickEvent


# ----------------------------------------------------------------- the replies that carry them
class JobReply(TypedDict):
    """``cancel``, ``requeue``, ``hold`` and ``release``: the job as it is now."""

    job: JobWire


class SubmitReply(TypedDict):
    """``submit``: the job (an array's first task) and how many tasks it has."""

    job: JobWire
    tasks: int


class WaitReply(TypedDict):
    """``wait``: the job, and whether it ended (else ``within`` passed first)."""

    job: JobWire
    ended: bool


class JobDetailReply(TypedDict):
    job: JobDetail | EndedJobDetail


class QueueReply(TypedDict):
    jobs: list[QueueRow]


class HistoryReply(TypedDict):
    jobs: list[HistoryJob]


class GpusReply(TypedDict):
    gpus: list[GpuWire]


class StatusReply(TypedDict):
    """``status``: the summary, the nodes, and each pool as ``head.pools`` words it."""

    summary: StatusSummary
    nodes: list[NodeWire]
    pools: list[dict[str, Any]]


class SubmitRequest(TypedDict, total=False):
    """``submit``'s fields as a client sends them (every one may be left out but
    ``command``; the head checks each: ``head.requests.spec_from_request``)."""

    command: list[str]
    shell: bool
    name: str | None
    gpu_count: int
    gpu_mem_mb: int | None
    output: str | None
    error: str | None
    workdir: str | None
    arch: str | None
    cuda: str | None
    vendor: str | None
    nodes: int
    priority: int | None
    time_limit_s: float | None
    service: bool
    no_requeue: bool
    preemptible: bool
    reservation: str | None
    nodelist: str | None  # Slurm's hostlist as typed: gpu[01-04]
    exclude: str | None
    export: list[str]
    notify: bool
    after: list[int]
    after_type: str
    array: str | None
    pool: str | None
    image: str | None
    runtime: str | None
    data_mounts: list[str]
    conda: str | None
    venv: str | None
    submit_dir: str | None
    warmup: bool
    interactive: bool
