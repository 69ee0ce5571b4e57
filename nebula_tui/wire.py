"""The shapes that travel between the head and its clients, as types both ends import: a job,
a GPU and a node as the head publishes them (``views.job_json``, ``views.gpu_json``,
``NodeLive.json``), and a submit request as a client sends it (``cli.jobs.submit_request``,
read by ``head.requests.spec_from_request``).

They are ``TypedDict``s: on the wire a shape is still the plain JSON object it always was, so
nothing about the protocol changes, while mypy holds the head's builders and the clients'
readers to one list of fields (``tests/unit/test_wire.py`` holds the running code to it too).
Plain data only: this module imports nothing of the package.
"""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict


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
