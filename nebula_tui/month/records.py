"""The records a lab-month replay reads and writes: a job as a workload asks for it, and
what became of it under one policy (times in seconds from the workload's start)."""

from __future__ import annotations

from dataclasses import dataclass

@dataclass(frozen=True)
class Request:
    """One job of a workload, as the replay submits it."""

    key: int  # the workload's own number for it (its line)
    submit_s: float  # seconds from the start of the replay
    user: str
    gpus: int
    gpu_mem_mb: int | None  # None: whole cards
    duration_s: float
    time_limit_s: float | None = None
    nodes: int = 1
    service: bool = False
    preemptible: bool = False  # scavenger work: yields its cards to in-quota work


@dataclass
class Outcome:
    """What happened to one request in a replay (times in seconds from the start)."""

    key: int
    refused: str | None = None  # refused at submit, with the head's sentence
    #: refused because no card here could ever run it as asked (a refusal for now, such as
    #: a user over quota, is not: that job could have run, and counts as never run)
    unfit: bool = False
    started_s: float | None = None  # its last start (a requeued job starts again)
    ended_s: float | None = None
    state: str | None = None  # the head's final state, None when still waiting/running
    #: (node, gpu uuid, memory MiB, whole card) of each card of its last start
    placements: tuple[tuple[str, str, int, bool], ...] = ()
    runs: int = 0  # starts (a requeue starts again)
    #: the GPU-hours the head charged its runs that ended (``model.charged_gpu_hours``,
    #: what the quota, fair share and ``nebula report`` count)
    charged_gpu_hours: float = 0.0
    #: the head's start forecast at submit (seconds from the start): the expected start
    #: (the end of the forecast's horizon when it saw none within it), the interval's
    #: early and late ends (None: none within the horizon)
    forecast: tuple[float, float | None, float | None] | None = None
    #: its first start: what the forecast at submit foretold, and what its wait ends at
    #: (None: as ``started_s``)
    first_started_s: float | None = None
    #: (gpu uuid, from, until; None: still held) of every card of every run, the runs a
    #: preemption or a requeue ended included (empty: those of ``placements`` alone)
    held: tuple[tuple[str, float, float | None], ...] = ()
