"""The scheduler's inputs and outputs: frozen values only, built by the engine.

A pass sees one :class:`Snapshot` and returns one :class:`Decision` per pending job. Nothing
here reads a clock or a file: ``Snapshot.now`` is the engine's clock reading for the pass.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from ..model import DEFAULT_CHARGE_REFERENCE_MB, GpuView, Placement, Temperatures
from .estimates import Estimate

def _empty() -> Mapping[Any, Any]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class PendingJob:
    """A job waiting for GPUs, with everything its submit asked for (R4). Slotted: a pass
    reads a few fields of 10,000s of them, and a slot is nearer than a dict entry."""

    id: int
    user: str
    gpu_count: int
    gpu_mem_mb: int | None  # None: whole cards
    submitted_at: float
    arch: str | None = None  # "sm_89": exactly that family; ">=sm_80": that or newer (R11)
    cuda: str | None = None  # the driver must support at least this CUDA version (R11)
    vendor: str | None = None  # "nvidia" / "intel" / "ascend"; None: any
    max_nodes: int = 1  # --nodes: how many nodes the gang may span (R8)
    priority: int = 0  # admin-set; higher runs before any fair-share order (R6)
    after: tuple[int, ...] = ()  # --after: start only once all these jobs … (R25)
    #: … succeeded ("ok"), ended in any state ("any"), ended without succeeding ("notok"),
    #: or started ("started"); see AFTER_TYPES
    after_type: str = "ok"
    time_limit_s: float | None = None  # --time; None: unbounded, so it never backfills (R25)
    service: bool = False  # --service: its cards keep SchedulerConfig.service_spare_mb (R14)
    #: a task of an array (``--array 0-99%8``): the array's id, and how many of its tasks
    #: may run at once (None: no limit)
    array_id: int | None = None
    array_limit: int | None = None
    #: --preemptible: runs on any card free now, whatever its user's fair share, and is
    #: stopped (requeued) when a normal job needs its cards (``preemption.py``)
    preemptible: bool = False
    #: --reservation NAME: only that booking's cards, in its window
    reservation: str | None = None
    #: -w/--nodelist: only these nodes (empty: any); -x/--exclude: never these
    nodelist: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    #: the fields that make its request, as one string: jobs asking alike share one key,
    #: and a string keeps its hash, so a pass finds a job's request in one quick look-up
    request_key: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "request_key", repr((
            self.gpu_count, self.gpu_mem_mb, self.service, self.max_nodes, self.vendor, self.arch,
            self.cuda, self.nodelist, self.exclude)))


@dataclass(frozen=True)
class RunningJob:
    """A job holding GPUs (launching or running); its placements also appear on the GPUs."""

    id: int
    user: str
    placements: tuple[Placement, ...]
    started_at: float
    time_limit_s: float | None = None  # None: nobody knows when it ends
    service: bool = False
    array_id: int | None = None  # the array it is a task of, if any
    preemptible: bool = False  # its cards are free for normal jobs, which preempt it
    #: how long it runs when it has no --time (estimates.run_estimate; None: the default)
    estimate: Estimate | None = None

    @property
    def ends_at(self) -> float | None:
        return None if self.time_limit_s is None else self.started_at + self.time_limit_s


@dataclass(frozen=True)
class Booking:
    """Cards booked for some users through a window (``nebula reserve``): inside it they
    take only those users' jobs; before it, a job whose --time ends before ``start`` (or a
    preemptible one, stopped at ``start``)."""

    name: str
    uuids: frozenset[str]
    start: float
    end: float
    users: frozenset[str]
    #: what a job kept off these cards is told, in the head's words and time zone:
    #: "node02:0-3 booked for paper-deadline from Fri 09:00" (or "… until Fri 19:00")
    text: str


@dataclass(frozen=True)
class UserShare:
    """A user's fair-share standing (R6); ``weight`` comes from ``fairshare.user_weight``."""

    name: str
    weight: float = 1.0
    #: when set, why none of this user's jobs may start now (e.g. the R7 quota sentence)
    refusal: str | None = None


@dataclass(frozen=True)
class SchedulerConfig:
    """Scoring weights and limits; the lead exposes them in ``nodes.yaml``.

    A candidate set of GPUs gets a penalty; the lowest wins, ties go to the GPUs listed
    first. The terms, highest weight first (R10):

    * ``w_hot`` per set holding a card hotter than ``hot_c`` (same-model cards throttle hot);
    * ``w_load`` × the busiest card's load, load being the larger of its utilisation
      (in ``util_step_pct`` steps so reading noise never decides) and how far it is from
      ``warm_c`` towards ``hot_c`` (0…1);
    * for slice requests only, one of two terms (the mean over the set's cards). While
      the queue's whole-card jobs need every wholly free card there is (the pass decides
      before each start), (``w_pack`` + ``w_hot`` + ``w_load``) × the share of cards that
      hold none of our slices yet: a slice fills a card already shared, however hot, before
      it opens a fresh one, so whole cards stay whole for the jobs that need them. Otherwise
      ``w_load`` × a quarter per job of ours on the card: the
      slice goes to the coolest, least shared card (a reading may predate jobs placed
      since, so three small jobs of one pass do not stack on one card);
    * ``w_health`` × (1 − the lowest node health score in the set) (R19);
    * ``w_power`` × the share of its node's power budget counted after the start, on
      nodes with a budget (R27): nodes with headroom first; a start past the budget is
      not possible at all;
    * for whole-card requests only, ``w_fit`` × the share of the node's cards the start
      leaves wholly free (best fit): a node the job fills comes before one it would break
      up, so a machine's free cards stay together for the gangs that need them;
    * ``w_topology`` × the topology penalty (0…1): the weakest link of the set first, then
      mixed models, then the mean link (R9). Several nodes are only tried when one node
      cannot hold the gang, and then as few as possible (R8).
    """

    hot_c: float = Temperatures.hot_c
    warm_c: float = Temperatures.warm_c
    util_step_pct: float = 10.0
    w_hot: float = 6.0
    w_load: float = 4.0
    w_pack: float = 3.0
    w_health: float = 2.0
    w_power: float = 0.5
    w_topology: float = 1.0
    w_fit: float = 2.0
    #: nodes whose health score is below this take no new work (R10/R19)
    min_health_score: float = 0.25
    #: R14: memory a card holding a service always keeps free for its KV cache
    service_spare_mb: int = 2048
    #: above this many candidate sets on one node, a greedy search replaces the exhaustive one
    max_combinations: int = 256
    #: a preemptible job's GPU-hours count at this fraction in fair share (and the quota)
    preemptible_charge: float = 0.25
    #: the card a slice's gigabytes are charged against (``model.card_share``), MiB
    charge_reference_mb: int = DEFAULT_CHARGE_REFERENCE_MB
    #: whether a preemptible job's GPU-hours count against its user's quota; when not, a
    #: user over quota may still run preemptible jobs
    preemptible_in_quota: bool = True
    #: a job of a user past their quota: "scavenge" runs it on idle cards only, as a
    #: preemptible job (charged ``preemptible_charge``); "refuse" keeps it waiting
    quota_mode: str = "scavenge"
    #: a gang (a job of 2 or more cards) waiting this long goes before every job of
    #: ordinary priority, oldest first, so its reservation is made before newer small work
    #: takes the cards it needs (Slurm's age factor, bounded); None: fair share alone
    gang_age_s: float | None = 4 * 3600.0
    #: services (--service: no end) hold at most this share of the lab's cards, so work
    #: that ends always has cards to flow through (a QOS GrpTRES on services, as in
    #: Slurm); a service past it waits. 1: no bound. The first service always may start.
    service_share: float = 0.5

    @property
    def temperatures(self) -> Temperatures:
        """The thresholds as the head publishes them to every client."""
        return Temperatures(hot_c=self.hot_c, warm_c=self.warm_c)


@dataclass(frozen=True, kw_only=True)
class Snapshot:
    """Everything one pass looks at. Keyword-only, so fields can be added safely."""

    gpus: tuple[GpuView, ...]
    queue: tuple[PendingJob, ...]
    now: float = 0.0
    running: tuple[RunningJob, ...] = ()
    users: Mapping[str, UserShare] = field(default_factory=_empty)  # missing user: weight 1.0
    #: final state ("succeeded" / "failed" / "cancelled" / "timeout") of jobs some --after names
    finished: Mapping[int, str] = field(default_factory=_empty)
    #: those of them that ended without ever starting (cancelled while waiting…)
    never_ran: frozenset[int] = frozenset()
    #: R27: node -> its power budget in W (nodes without one are not limited)
    power_budgets: Mapping[str, float] = field(default_factory=_empty)
    #: node -> ``parse_topo(...)["links"]`` ({"GPU0": {"GPU1": "NV4"}})
    topologies: Mapping[str, Mapping[str, Mapping[str, str]]] = field(default_factory=_empty)
    config: SchedulerConfig = SchedulerConfig()
    #: jobs waiting that this pass does not decide (another stage of it does), which an
    #: --after may name: they count as waiting, not as missing
    waiting_elsewhere: frozenset[int] = frozenset()
    #: bookings not yet over (``nebula reserve``)
    bookings: tuple[Booking, ...] = ()
    #: waiting job -> the cards an earlier pass preempted for it (its ``Wait.holds``),
    #: kept for it through its victims' grace and requeue (``preemption.py``)
    holds: Mapping[int, tuple[Placement, ...]] = field(default_factory=_empty)


# Decisions are plain slotted records, not frozen ones: a pass makes one per pending job
# (10,000 and more), and a frozen dataclass takes twice as long to make.
@dataclass(slots=True)
class Start:
    """Run the job now on these GPUs (in ``CUDA_VISIBLE_DEVICES`` order)."""

    job_id: int
    placements: tuple[Placement, ...]
    #: its user is past their quota: it starts as a preemptible job (quota_mode scavenge)
    scavenger: bool = False


@dataclass(slots=True)
class Wait:
    """Keep the job pending; ``reason`` is the sentence users see (R5). ``holds``: the
    cards it preempts for, which the next passes keep for it (``Snapshot.holds``)."""

    job_id: int
    reason: str
    holds: tuple[Placement, ...] = ()


@dataclass(slots=True)
class Fail:
    """The job can never run (its --after job failed or does not exist, a bad --arch…)."""

    job_id: int
    reason: str


@dataclass(slots=True)
class Preempt:
    """Stop the running preemptible job ``job_id`` and requeue it: ``for_job`` of
    ``for_user`` starts on its cards once they are free (``for_job`` None: a booking
    begins there, ``for_user`` its name)."""

    job_id: int
    for_job: int | None
    for_user: str

    @property
    def reason(self) -> str:
        if self.for_job is None:
            return f"preempted: booking {self.for_user} begins on its cards"
        return f"preempted for job {self.for_job} of {self.for_user}"


Decision = Start | Wait | Fail | Preempt

#: the kinds of --after (Slurm's afterok, afterany, afternotok and after)
AFTER_TYPES = ("ok", "any", "notok", "started")
