"""What every pool kind offers the head: the interface and the plain data it answers with.

A pool is a batch cluster the head reaches over SSH; it runs a job of ours as one of its
own, named by a token the head writes in its store first (``PoolSubmission.token``), so a
head restarted between that write and the cluster's answer finds the job by its token
(``find``) instead of submitting it twice. From then on the pool's own id for it (the
answer to ``sbatch``) is its key: ``poll`` asks each owner's account about that owner's
jobs only; ``capacity`` what the cluster has. A Kubernetes pool
(Jobs with ``nvidia.com/gpu``, Volcano PodGroups for gangs) would be one more module
with these five calls.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from ..model import Job, JobState


def sent_order(remote_id: str) -> tuple[int, str]:
    """Remote ids in the order the cluster gave them (numbers first, by value). A job's
    token is public there: of several jobs carrying one, the first sent is the head's."""
    return (int(remote_id), "") if remote_id.isdigit() else (1 << 62, remote_id)


class PoolUnavailable(Exception):
    """The pool's login node cannot be reached now; ``str()`` says why, in one line."""


class PoolDegraded(PoolUnavailable):
    """The pool answered, but not as a Slurm answers (too long, malformed): its jobs are
    left as they are and ``status`` says so; ``str()`` says what, in one line."""


class PoolSilent(PoolUnavailable):
    """The login worked, then a command did not answer in time: with ``user: submitter`` that
    account's own doing as likely as the cluster's (a member's key line, her shell's start-up
    files); ``str()`` says which command, in one line."""


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
    gpus: int | None = None  # its allocation's GPUs, from the cluster's accounting
    qos: str = ""  # the QOS it ran in, as the cluster says ("" where it does not)
    partition: str = ""  # the partition(s) it runs in or may run in, as the cluster says
    #: whether its Slurm comment still is the token it was sent with (the job may rewrite
    #: it: it is a check, never what finds the job)
    token_ok: bool = True
    #: what it asks of the pool now, its GPUs in all and its nodes (None: not said); its
    #: owner may change a waiting job's request there
    requested_gpus: int | None = None
    requested_nodes: int | None = None
    #: the runs of its id before the last one (requeued there), each (elapsed, GPUs, start),
    #: from the cluster's accounting
    earlier_runs: tuple[tuple[float, int | None, float | None], ...] = ()


@dataclass(frozen=True)
class PoolNode:
    name: str
    state: str
    gpus: int
    gpus_used: int | None
    usable: bool
    partitions: tuple[str, ...] = ()  # a node may be in several


@dataclass(frozen=True)
class PartitionGpus:
    """One partition's GPUs, as ``sinfo -O partition,gres,gresused`` counts them: each of
    its usable nodes', whatever other partitions share them."""

    name: str
    gpus: int
    idle: int | None  # None: the cluster does not say what is in use


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
        return _partition("", [n for n in self.nodes if n.usable]).idle

    @property
    def max_gpus_per_node(self) -> int:
        return max((n.gpus for n in self.nodes if n.usable), default=0)

    def nodes_with(self, gpus: int) -> int:
        return sum(1 for n in self.nodes if n.usable and n.gpus >= gpus)

    @property
    def partitions(self) -> tuple[PartitionGpus, ...]:
        """Each partition's GPUs and idle GPUs, by name (a GPU of a node in two partitions
        is idle in both: either may take it)."""
        names = sorted({p for n in self.nodes for p in n.partitions})
        return tuple(_partition(name, [n for n in self.nodes if n.usable and name in n.partitions])
                     for name in names)


def _partition(name: str, nodes: list[PoolNode]) -> PartitionGpus:
    idle = None if any(n.gpus_used is None for n in nodes) else \
        sum(max(0, n.gpus - (n.gpus_used or 0)) for n in nodes)
    return PartitionGpus(name, sum(n.gpus for n in nodes), idle)


@dataclass
class PollResult:
    """One poll: the jobs of ours the pool knows (by their owner and the Slurm id sbatch
    answered there), and its
    capacity (None when it was not read: nobody's account to read it with)."""

    #: (account, remote id) -> the job: an id is one account's answer (a member's own key
    #: line may answer sbatch with another member's id), never another account's job
    jobs: dict[tuple[str, str], RemoteJob] = field(default_factory=dict)
    capacity: Capacity | None = None
    refused: set[str] = field(default_factory=set)  # accounts whose login was refused
    #: accounts that did not answer, or not as Slurm answers: their jobs are left as they are
    troubled: dict[str, PoolUnavailable] = field(default_factory=dict)
    #: the capacity as each account read it (``user: submitter``: each owner's own)
    capacities: dict[str, Capacity] = field(default_factory=dict)


class Pool(Protocol):
    name: str

    async def submit(self, submission: PoolSubmission) -> str:
        """Run it there; the pool's id for it. PoolUnavailable, PoolRefusal."""

    async def find(self, account: str, token: str) -> RemoteJob | None:
        """The job a submission with ``token`` made, if the pool has it (a head restarted
        mid-submit asks before submitting again)."""

    async def poll(self, jobs: dict[tuple[str, str], str], poller: str | None) -> PollResult:
        """What the pool says of each of ``jobs`` ((its account, its remote id) -> its
        token), each asked in its own account, its end from that account's accounting;
        capacity read as ``poller`` (None: not read). A remote id names a job only in its
        owner's account: the answers are keyed the same way."""

    async def cancel(self, account: str, remote_id: str) -> None: ...

    async def logs(self, account: str, path: str, offset: int) -> tuple[str, int, int]:
        """The job's output from byte ``offset``: (text, the next offset, its size now)."""

    async def capacity(self) -> Capacity: ...

    async def close(self) -> None: ...
