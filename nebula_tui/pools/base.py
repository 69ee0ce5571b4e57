"""What every pool kind offers the head: the interface and the plain data it answers with.

A pool is a batch cluster the head reaches over SSH; it runs a job of ours as one of its
own, named by a token the head writes in its store first (``PoolSubmission.token``), so a
head restarted between that write and the cluster's answer finds the job by its token
(``find``) instead of submitting it twice. ``poll`` answers every job of ours the cluster
still knows, in one round trip; ``capacity`` what the cluster has. A Kubernetes pool
(Jobs with ``nvidia.com/gpu``, Volcano PodGroups for gangs) would be one more module
with these five calls.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from ..model import Job, JobState


class PoolUnavailable(Exception):
    """The pool's login node cannot be reached now; ``str()`` says why, in one line."""


class PoolRefusal(Exception):
    """The pool refused a request (its scheduler said no); ``str()`` is one line."""


class PoolNotAuthorised(PoolRefusal):
    """``user: submitter``: this user's account on the cluster refused the head's key."""


@dataclass(frozen=True)
class PoolSubmission:
    """One attempt of one job, as the head asks a pool to run it."""

    job: Job
    account: str  # the cluster account it runs as
    token: str  # names this submission there (Slurm: its --comment)
    gpus_per_node: int
    shards_per_node: int = 0  # >0: GPU shards instead of whole GPUs (--gpu-mem)


@dataclass(frozen=True)
class RemoteJob:
    """One of our jobs as the pool reports it."""

    remote_id: str
    token: str
    waiting: bool
    running: bool
    reason: str = ""  # the pool's own words for why it waits ("Resources")
    nodes: tuple[str, ...] = ()
    started_at: float | None = None
    ended_at: float | None = None
    #: once it ended: how it ends here and why; ``preempted``: the pool took it back (the
    #: job is requeued or fails as it asked)
    end: tuple[JobState, str] | None = None
    exit_code: int | None = None
    preempted: bool = False
    elapsed_s: float | None = None  # from the cluster's accounting, when it keeps it


@dataclass(frozen=True)
class PoolNode:
    name: str
    state: str
    gpus: int
    gpus_used: int | None
    usable: bool


@dataclass(frozen=True)
class Capacity:
    """What the pool has, as last read."""

    version: str | None
    nodes: tuple[PoolNode, ...] = ()
    #: where ended jobs' figures come from: "sacct" (the cluster's accounting) or "squeue"
    #: (its job list, while it still lists them)
    ends_from: str = "squeue"

    @property
    def gpus_total(self) -> int:
        return sum(n.gpus for n in self.nodes if n.usable)

    @property
    def gpus_idle(self) -> int | None:
        if any(n.gpus_used is None for n in self.nodes if n.usable):
            return None
        return sum(max(0, n.gpus - (n.gpus_used or 0)) for n in self.nodes if n.usable)

    @property
    def max_gpus_per_node(self) -> int:
        return max((n.gpus for n in self.nodes if n.usable), default=0)

    def nodes_with(self, gpus: int) -> int:
        return sum(1 for n in self.nodes if n.usable and n.gpus >= gpus)


@dataclass
class PollResult:
    """One poll: the jobs of ours the pool knows (by token), and its capacity."""

    jobs: dict[str, RemoteJob] = field(default_factory=dict)
    capacity: Capacity | None = None


class Pool(Protocol):
    name: str

    async def submit(self, submission: PoolSubmission) -> str:
        """Run it there; the pool's id for it. PoolUnavailable, PoolRefusal."""

    async def find(self, account: str, token: str) -> RemoteJob | None:
        """The job a submission with ``token`` made, if the pool has it (a head restarted
        mid-submit asks before submitting again)."""

    async def poll(self, accounts: set[str], ended: dict[str, str]) -> PollResult:
        """Every job of ours the pool lists (of ``accounts``), and for ``ended`` (remote id
        -> token) that it lists no longer, their ends from its accounting."""

    async def cancel(self, account: str, remote_id: str) -> None: ...

    async def logs(self, account: str, path: str, offset: int) -> tuple[str, int, int]:
        """The job's output from byte ``offset``: (text, the next offset, its size now)."""

    async def capacity(self) -> Capacity: ...

    async def close(self) -> None: ...
