"""The shapes that travel between the head and its clients, as types both ends import (as
``remote/protocol.py`` types the node's wire): what the head sends (a job, a queue row, a
job's page, an ended job, a GPU, a node, the status and its summary, a start forecast, a
plan, a pool, a user's row, a booking, ``why``'s answers, a log's piece, a GPU's samples, a
node shown, the doctor's checks, a reload's changes, the report, the replies that carry them,
named ``<Op>Reply`` (``REPLIES``: op -> its reply), and the event stream's snapshot and
events), and the requests as a client sends them (a submit: ``cli.jobs.submit_request``,
read by ``head.requests.spec_from_request``).

They are ``TypedDict``s: on the wire a shape is still the plain JSON object it always was, so
nothing about the protocol changes. ``views`` builds each one and mypy checks it there (and
in the head's rooms that put them in replies); the CLI's text and the TUI's screens read
them by these names. ``tests/unit/test_wire.py`` and ``tests/lab/test_e2e.py`` hold a real
head's answers to them, keys and types. Plain data only: this module imports nothing of the
package.

The requests besides submit are typed here too (``JobRequest``, ``LogsRequest``…, one per op
in ``REQUESTS``): each handler in ``head/ops/`` takes its op's type, and each call a client
makes builds its fields with it (``**JobRequest(job=…)``), so that a field renamed at one end
is a mypy error or a failing ``test_wire`` at the other.

Why one module: it is the one contract both ends import, each shape beside the shapes it
nests and the reply that carries it; split, a client would import half a wire and the
head the other half.
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


# ----------------------------------------------------------------- pools, users, bookings
class PoolNodeView(TypedDict):
    """A node of a pool's cluster as its last poll read it (``pools.base.PoolNode``)."""

    name: str
    state: str
    gpus: int
    gpus_used: int | None
    usable: bool
    partitions: list[str]


class PoolPartitionView(TypedDict):
    """A partition's GPUs (``pools.base.PartitionGpus``; None: the cluster does not say)."""

    name: str
    gpus: int
    gpus_idle: int | None


class PoolAuthorize(TypedDict):
    """``nebula pool authorize``'s view (``pools.authorize.authorize_view``): the key line a
    submitter adds (None: one account logs in, or no key yet) and its comment."""

    pool: str
    host: str
    port: int
    per_submitter: bool
    account: str | None
    address: str | None
    line: str | None
    comment: str | None


class PoolWire(TypedDict):
    """One pool as ``status``, the stream and the TUI show it (``pools.status.pool_view``):
    what its last poll read, whether it answers, our jobs there, and ``line``, the head's
    sentence for it."""

    name: str
    kind: str
    host: str
    version: str | None
    partition: str | None
    reachable: bool
    degraded_since: float | None
    unreachable_since: float | None
    reason: str
    troubled: dict[str, str]
    gpus_total: int | None
    gpus_idle: int | None
    nodes: list[PoolNodeView]
    partitions: list[PoolPartitionView]
    running: int
    pending: int
    max_jobs: int
    burst_after_s: float | None
    ends_from: str | None
    line: str
    authorize: PoolAuthorize | None


class UserRow(TypedDict):
    """A user as ``users`` lists them (``head.shares.Shares.users_json``): the store's row
    (all time), this month's figures, their fair-share weight and monthly quota."""

    name: str
    jobs_finished: int
    gpu_hours: float
    created_at: float
    #: their own quota, else nodes.yaml's ``scheduler.quota_gpu_hours`` (never none: the
    #: Users screen and ``nebula users`` print it as a number)
    quota_gpu_hours: float
    running_jobs: int
    month_jobs: int
    month_efficiency_pct: float | None
    month_idle_gpu_hours: float
    month_mean_wait_s: float | None
    weight: float
    month_gpu_hours: float


class BookingView(TypedDict):
    """A booking (reservation) as clients see it (``head.bookings.Bookings.json``): its
    cards as a label (``gpus``) and by uuid, who may use them, its window and ``when`` in
    words, whether it is on now, and why it can no longer be honoured (``broken``)."""

    name: str
    gpus: str
    uuids: list[str]
    users: list[str]
    start: float
    end: float
    created_by: str
    active: bool
    broken: str | None
    gpu_hours: float
    when: str


class StatusView(ClusterStatus):
    """``Engine.status``: the cluster's status and each pool's (``head.pools`` words it)."""

    pools: list[PoolWire]


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

    users: list[UserRow]
    pools: list[PoolWire]
    bookings: list[BookingView]


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


class UserEvent(TypedDict):
    """A user's row after their figures moved (``head.shares``, at most every few seconds)."""

    type: Literal["user"]
    user: UserRow


class PoolEvent(TypedDict):
    """A pool's view after its poll changed it (``head.pools``)."""

    type: Literal["pool"]
    pool: PoolWire


class BookingsEvent(TypedDict):
    """The live bookings after one was made, ended, broke, or its window opened or ended."""

    type: Literal["bookings"]
    bookings: list[BookingView]


#: every event a subscriber reads after the snapshot: what ``head.stream.Stream`` publishes
#: itself, and the users', pools' and bookings' rooms' events
StreamEvent = (JobEvent | NodeEvent | LogEvent | QueueEvent | GpusEvent | TickEvent
               | UserEvent | PoolEvent | BookingsEvent)


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
    pools: list[PoolWire]


class PingReply(TypedDict):
    """``ping``: the head's process and who it takes the caller for (the socket's peer)."""

    pid: int
    user: str


class NodeReply(TypedDict):
    """``drain`` and ``resume``: the node as it is now."""

    node: NodeWire


class GpuReply(TypedDict):
    """``gpu_resume``: the GPU back in service."""

    gpu: GpuWire


class NodeKeyReply(TypedDict):
    """``node_key``: the fingerprint of the host key the would-be node offers."""

    fingerprint: str


class AttachInfoReply(TypedDict):
    """``attach_info``: the command line that attaches a terminal to the job."""

    argv: list[str]


class EventsReply(TypedDict):
    events: list[EventRow]


class NoReply(TypedDict):
    """``quota`` and ``shutdown``: nothing but ``"ok": true``."""


class UsersReply(TypedDict):
    users: list[UserRow]


class BookingsReply(TypedDict):
    """``reserve`` with ``list``: the bookings under way or ahead."""

    bookings: list[BookingView]


class BookingReply(TypedDict):
    """``reserve`` with ``delete``: the booking as it ended."""

    booking: BookingView


class BookingMade(BookingReply):
    """``reserve`` that books: the booking, and ``note`` naming the jobs that may still hold
    its cards when it starts ("" when none)."""

    note: str


ReserveReply = BookingsReply | BookingReply | BookingMade


class LogPart(TypedDict):
    """One rank's piece of a job's log: from which node, the text read, where the next
    read starts, and the log's size there as it was read (None: the node did not say)."""

    rank: int
    node: str
    data: str
    offset: int
    size: int | None


class LogsReply(TypedDict):
    """``logs``: the first asked rank's piece (``data``, ``offset``, ``size``) and every
    asked rank's (``parts``), the job's state, and ``ended`` (that log will not grow)."""

    data: str
    offset: int
    size: int | None
    parts: list[LogPart]
    state: str
    ended: bool


class TelemetrySample(TypedDict):
    """A GPU's recorded reading (``store.telemetry``; older than a day, a 10-minute mean)."""

    t: float
    temperature_c: float | None
    utilization_pct: float | None
    memory_used_mb: float | None
    power_w: float | None
    fan_pct: float | None
    sm_clock_mhz: float | None
    mem_clock_mhz: float | None


class GpuHistoryReply(TypedDict):
    """``history``: the GPU (its uuid) and its samples, oldest first."""

    gpu: str
    samples: list[TelemetrySample]


class NodeFacts(TypedDict):
    """What a node's nodelet said of itself when it connected (None: not heard from yet)."""

    hostname: str | None
    python: str | None
    uid: int | None
    node_dir: str | None


class ShownNode(NodeWire):
    """A node as ``node_show`` answers (``head.nodes.Fleet.show``): the node, the whole of
    its reason, its drain's reason, its failed connection tries and since when it is silent
    (Unix s), its health, CUDA, facts and platform, its GPUs, its jobs and latest events."""

    detail: str
    drain_reason: str
    failed_attempts: int
    silent_since: float | None
    health_score: float
    cuda_version: str | None
    facts: NodeFacts
    platform: dict[str, Any]
    gpus: list[GpuWire]
    jobs: list[int]
    events: list[EventRow]


class NodeShowReply(TypedDict):
    node: ShownNode


class ReloadReply(TypedDict):
    """``reload``, and ``node_add`` and ``node_remove`` (which reload the cluster file they
    edit): the nodes added, removed, drained and resumed by the file, the sections it
    changed that apply now, and those that need a restart."""

    added: list[str]
    removed: list[str]
    drained: list[str]
    resumed: list[str]
    sections: list[str]
    restart_for: list[str]


class SmokeReply(TypedDict):
    """``node_smoke``: the smoke job as it is, on which card (``node:index``) of which model,
    its output, and whether it ended (False: not within the head's wait)."""

    job: JobWire
    gpu: str
    model: str
    output: str
    ended: bool


class DoctorCheck(TypedDict):
    """One of a node's checks (``head.doctor.line``): its name, ``status`` (ok, fail, warn,
    skip), what was found, and the fix ("" when none)."""

    check: str
    status: Literal["ok", "fail", "warn", "skip"]
    text: str
    fix: str


class DoctorReply(TypedDict):
    """``doctor``: each node's checks, and whether none failed."""

    nodes: dict[str, list[DoctorCheck]]
    passed: bool


class ReportUserRow(TypedDict):
    """A user's month in the report (and the Users screen's month figures): the jobs that
    ended then, their GPU-hours (within and over the quota), efficiency, idle GPU-hours and
    mean wait."""

    month: str
    user: str
    jobs: int
    gpu_hours: float
    in_quota_gpu_hours: float
    over_quota_gpu_hours: float
    efficiency_pct: float | None
    idle_gpu_hours: float
    mean_wait_s: float | None


class ReportNodeRow(TypedDict):
    """A node's (or, ``node`` "cluster", the whole cluster's) month or day: its cards'
    GPU-hours available and held by jobs, that as a percentage, and their mean utilisation."""

    period: str
    node: str
    gpus: int
    available_gpu_hours: float
    allocated_gpu_hours: float
    allocated_pct: float | None
    util_pct: float | None


class ReportBookingRow(TypedDict):
    """A booking overlapping the report's period: its GPU-hours then, and those its users'
    jobs held on its cards."""

    name: str
    users: list[str]
    created_by: str
    start: float
    end: float
    booked_gpu_hours: float
    used_gpu_hours: float
    used_pct: float | None


class Report(TypedDict):
    """The accounting report of [since, until) (``head.accounting``)."""

    since: float
    until: float
    users: list[ReportUserRow]
    nodes: list[ReportNodeRow]
    days: list[ReportNodeRow]
    bookings: list[ReportBookingRow]


class ReportReply(TypedDict):
    report: Report


# ----------------------------------------------------------------- why
class Standing(TypedDict):
    """A user's fair share in figures (``head.shares.Shares.standing``): their weight and
    its rank among the users' (1: first), the GPU-hours it comes from, this month's hours in
    and over their quota, and the sentence a submit of theirs is refused with (None: none)."""

    user: str
    weight: float
    rank: int
    users: int
    half_life_s: float | None
    runs_counted: int
    decayed_gpu_hours: float
    held_gpu_hours: float
    month_gpu_hours: float
    quota_gpu_hours: float
    in_quota_gpu_hours: float
    over_quota_gpu_hours: float
    refusal: str | None


class WhyJobRow(TypedDict):
    """A job a ``why`` answer names (one ahead, one holding the cards, a user's own): its
    request, cards (``node:index``), when its --time ends it, its last start forecast."""

    id: int
    user: str
    state: str
    gpu_count: int
    gpu_mem_mb: int | None
    gpus: list[str]
    time_limit_s: float | None
    ends_by: float | None
    starts: StartForecast | None


class WhyWaitingRow(WhyJobRow):
    """A user's waiting job: its place in the queue and the scheduler's reason."""

    queue_pos: int | None
    reason: str | None


class WhySooner(TypedDict):
    """A change that starts the job sooner (the flag as typed) and its forecast; a pool
    with room for it now names the pool and its idle GPUs (its start is not forecast)."""

    change: str
    starts: StartForecast | None
    pool: NotRequired[str]
    gpus_idle: NotRequired[int]


class WhyJob(TypedDict):
    """``why`` for a job (``head.why.Why.job``): its place, the rule that holds it
    (``head.why.RULES``) and the reason, its user's standing, its forecast (and first in the
    queue's, once forecast), the jobs ahead and holding its cards, and changes that start
    it sooner."""

    job: int
    user: str
    state: str
    queue_pos: int | None
    waiting: int
    rule: str
    reason: str
    share: Standing
    now: float
    starts: StartForecast | None
    ahead: list[WhyJobRow]
    holding: list[WhyJobRow]
    sooner: list[WhySooner]
    first_in_queue: NotRequired[StartForecast | None]


class WhyUser(TypedDict):
    """``why`` for a user (``head.why.Why.user``): their standing and their live jobs."""

    share: Standing
    running: list[WhyJobRow]
    waiting: list[WhyWaitingRow]


class WhyReply(TypedDict):
    why: WhyJob | WhyUser


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


# ----------------------------------------------------------------- the other requests
# What a client sends for each op besides ``submit`` (beside ``"op"``). The head checks every
# field whatever its type here (a client may send anything: each handler in ``head/ops/``
# refuses a bad field in one line naming it); these say what a client that means well sends,
# and are what the handlers and the CLI's and TUI's calls name. ``total=False``: a field left
# out takes the head's default (``tests/unit/test_wire.py`` holds the two ends to them).
class NoFields(TypedDict):
    """``ping``, ``status``, ``gpus``, ``queue``, ``users``, ``reload``, ``shutdown``."""


class JobRequest(TypedDict):
    """``cancel``, ``requeue``, ``hold``, ``release``, ``job``, ``attach_info``: one job, by id
    (text of digits is taken too, as a shell passes it)."""

    job: int | str


class WaitRequest(JobRequest, total=False):
    """``wait``: ask again after ``within`` seconds if it has not ended (None: the head's)."""

    within: float | None


class LogsRequest(JobRequest, total=False):
    """``logs``: from byte ``offset`` of one node's log (``rank``; None: the first), or from
    ``offsets``, one per rank; of run ``attempt`` (None: the latest)."""

    offset: int
    rank: int | None
    offsets: list[int] | None
    attempt: int | None


class AttachRequest(JobRequest, total=False):
    """``attach``: the connection becomes a terminal on the job's rank ``rank``."""

    rank: int
    cols: int
    rows: int
    term: str | None


class WhyRequest(TypedDict, total=False):
    """``why``: a user's standing when ``user`` is given, else the job's answer."""

    job: int | str
    user: str


class GpuHistoryRequest(TypedDict, total=False):
    """``history``: one GPU's telemetry (uuid, or ``node:index``) over ``since`` seconds."""

    gpu: str
    since: float


class GpuResumeRequest(TypedDict, total=False):
    gpu: str
    force: bool


class NodeRequest(TypedDict):
    """``resume``, ``node_smoke``, ``node_remove``, ``node_show``: one node, by name."""

    node: str


class DrainRequest(NodeRequest, total=False):
    reason: str | None


class NodeKeyRequest(TypedDict, total=False):
    """``node_key``: the host key a node's sshd offers (port: 22 when left out)."""

    host: str
    port: int


class NodeAddRequest(NodeKeyRequest, total=False):
    """``node_add``: the node's name, where it answers, the login (None: the config's), and
    the host key's fingerprint as ``node_key`` gave it (``trust``)."""

    node: str
    user: str | None
    identity: str | None
    trust: str


class DoctorRequest(TypedDict, total=False):
    """``doctor``: these nodes (none: every one)."""

    nodes: list[str]


class EventsRequest(TypedDict, total=False):
    """``events``: the newest ``limit``, of one ``kind``, node, job or user, since (Unix s)."""

    limit: int
    kind: str | None
    node: str | None
    job: int | str | None
    user: str | None
    since: float | None


class ReportRequest(TypedDict):
    """``report``: use over [since, until), Unix seconds."""

    since: float
    until: float


class JobHistoryRequest(TypedDict, total=False):
    """``job_history``: ended jobs of ``user`` on ``node`` in [since, until), of one ended
    state or a list of them, the newest ``limit``."""

    user: str | None
    node: str | None
    since: float | None
    until: float | None
    state: str | list[str] | None
    limit: int


class QuotaRequest(TypedDict):
    """``quota``: a user's GPU-hours a month."""

    user: str
    hours: float


class ReserveRequest(TypedDict, total=False):
    """``reserve``: ``list`` lists the bookings, ``delete`` ends one by name; anything else
    books: from ``start`` for ``duration_s``, cards by place (``gpus``: ``node02:0-3``) or
    by count and size, for ``users`` (the asker when left out), named ``name`` (one made up
    when None)."""

    list: bool
    delete: str
    name: str | None
    start: float
    duration_s: float
    users: list[str]
    gpus: str
    gpu_count: int
    gpu_mem_mb: int | None


#: what each op's request holds (``subscribe`` holds nothing but its op)
REQUESTS: dict[str, type] = {
    "submit": SubmitRequest, "plan": SubmitRequest, "wait": WaitRequest, "logs": LogsRequest,
    **dict.fromkeys(("cancel", "requeue", "hold", "release", "job", "attach_info"), JobRequest),
    "attach": AttachRequest, "why": WhyRequest, "history": GpuHistoryRequest,
    "gpu_resume": GpuResumeRequest, "drain": DrainRequest,
    **dict.fromkeys(("resume", "node_smoke", "node_remove", "node_show"), NodeRequest),
    "node_key": NodeKeyRequest, "node_add": NodeAddRequest, "doctor": DoctorRequest,
    "events": EventsRequest, "report": ReportRequest, "job_history": JobHistoryRequest,
    "quota": QuotaRequest, "reserve": ReserveRequest,
    **dict.fromkeys(("ping", "status", "gpus", "queue", "users", "reload", "shutdown", "subscribe"), NoFields),
}


#: what each op replies (beside ``"ok": true``): each handler in ``head/ops/`` returns its
#: op's type, and each call a client makes names it (``client.call("logs", LogsReply, …)``)
#: and reads the reply as it (``subscribe`` answers with the stream: ``StreamSnapshot``,
#: then ``StreamEvent``s; ``attach`` makes the connection a terminal)
REPLIES: dict[str, Any] = {
    "submit": SubmitReply, "plan": PlanView, "wait": WaitReply, "logs": LogsReply,
    **dict.fromkeys(("cancel", "requeue", "hold", "release"), JobReply),
    "job": JobDetailReply, "queue": QueueReply, "attach_info": AttachInfoReply, "why": WhyReply,
    "ping": PingReply, "status": StatusReply, "gpus": GpusReply, "history": GpuHistoryReply,
    "gpu_resume": GpuReply, "drain": NodeReply, "resume": NodeReply, "node_key": NodeKeyReply,
    **dict.fromkeys(("node_add", "node_remove", "reload"), ReloadReply),
    "node_smoke": SmokeReply, "node_show": NodeShowReply, "doctor": DoctorReply,
    "events": EventsReply, "shutdown": NoReply, "report": ReportReply, "job_history": HistoryReply,
    "users": UsersReply, "quota": NoReply, "reserve": ReserveReply,
}
