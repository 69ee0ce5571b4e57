"""The head's live view: nodes, GPUs and the unfinished jobs, and how work is started.

Every room of the head reads the cluster through one :class:`HeadState`: the config, the
store, the injected clock (never ``time.time()`` inside the head), what each node and GPU
showed last (``nodes``, ``gpus``), every job not yet ended (``jobs``, indexed by the GPUs
they hold) and the link to each node. It also owns the two ways of getting work done
later: ``wake`` (ask the scheduling loop for a pass) and ``spawn`` (a background task,
cancelled when the head stops). It imports no other room.

Why one module: every room reads and changes the same live view, and the caches kept on it
(the job table's version, each GPU's and each running job's view) are correct only
where every change to what they are made of is in sight.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, field, replace

from ..config.cluster import ClusterConfig
from ..config.reader import did_you_mean
from ..model import (GpuProcess, GpuReading, GpuView, Job, JobState, NodeState, Pending, Placement,
                     RequestError)
from ..remote.protocol import Hello
from ..remote.ssh import NodeLink
from ..scheduler import admission
from ..scheduler.health import health_score
from ..scheduler.slices import offered_mb
from ..wire import NodeWire, StartForecast
from ..store import Store
from ..waits import within

#: A refusal naming an unknown node lists the known ones up to this many.
NODES_NAMED = 12


@dataclass
class NodeView:
    name: str
    host: str
    port: int
    state: NodeState = NodeState.CONNECTING
    reason: str = ""
    drained: bool = False
    drain_reason: str = ""
    last_seen: float | None = None
    #: when it stopped answering, on the monotonic clock (the node lease): a step of the
    #: wall clock (NTP, an admin's date) must never make a short silence look long
    silent_since: float | None = None
    #: what the head did not hear of it before this connection's hello: (the last moment
    #: it still knew the node's jobs ran, the hello), the head's clock (``Nodes._on_hello``)
    unheard: tuple[float, float] | None = None
    clock_offset: float = 0.0  # the head's clock minus the node's, at its hello
    cuda_version: str | None = None
    topo: dict = field(default_factory=dict)
    hello: Hello = field(default_factory=Hello)
    #: when its GPUs started throttling episodes (R19), recent ones only; lowers its score
    throttle_events: list[float] = field(default_factory=list)
    #: what ``reason`` (one line) stands for, in full: a tool's output, an error's text
    detail: str = ""
    #: connection attempts that failed since it was last up, and when the last summary of
    #: them went to the events log (retries are summarised, never one event each)
    failed_attempts: int = 0
    summarised_at: float | None = None
    #: R27: nodes.yaml's power_budget_w (clients sum its GPUs' power_w against it)
    power_budget_w: int | None = None

    def json(self) -> NodeWire:
        """The node as clients see it."""
        return {"name": self.name, "host": self.host, "port": self.port,
                "state": NodeState.DRAINED.value if self.drained and self.state == NodeState.UP
                else self.state.value,
                "reason": self.drain_reason if self.drained and self.state == NodeState.UP
                else self.reason,
                "drained": self.drained, "last_seen": self.last_seen,
                "power_budget_w": self.power_budget_w,
                "hostname": self.hello.hostname}


@dataclass(frozen=True)
class Maintenance:
    """Why a GPU is out of service (R16/R17), and whether only an admin brings it back."""

    reason: str
    admin_only: bool = False


@dataclass(frozen=True)
class GpuLive:
    """What the head knows of one GPU between probes. Frozen: a change is a new object
    put in ``HeadState.gpus`` (a probe, an isolation), so a GPU view made from one
    (``HeadState.gpu_views``) stays right while the same object is there."""

    node: str
    reading: GpuReading
    processes: list[GpuProcess] = field(default_factory=list)
    unmanaged_used_mb: int = 0
    #: the one place a GPU's maintenance lives in memory (the store keeps a copy for restarts)
    maintenance: Maintenance | None = None
    process_jobs: dict[str, str] = field(default_factory=dict)  # pid -> our job id
    #: what each of our jobs' processes hold here (MiB), and the processes we did not
    #: start as (pid, Unix user or None, MiB): the memory guard's facts
    job_used: dict[int, int] = field(default_factory=dict)
    owners: tuple[tuple[int, str | None, int], ...] = ()
    #: the node could not read who holds what here (a process name broke its tool's table):
    #: ``job_used`` and ``owners`` are empty, ``unmanaged_used_mb`` is all our jobs did not
    #: reserve, and the memory guard does not judge this card
    processes_unreadable: bool = False
    #: our jobs whose processes here read no memory of their own (WSL2's Windows driver
    #: gives none: [N/A]): the memory guard cannot judge them on this card, and says so
    memory_unread: frozenset[int] = frozenset()

    def overuse(self, placements: tuple[tuple[int, Placement], ...]) -> tuple[tuple[int, int], ...]:
        """(job, MiB) our jobs hold here beyond their reservations on this GPU (a job
        holding it whole owns all of it; one without a reservation here reserved nothing)."""
        reserved = {job: (p.memory_mb, p.exclusive) for job, p in placements}
        over = []
        for job, used in sorted(self.job_used.items()):
            mb, exclusive = reserved.get(job, (0, False))
            if not exclusive and used > mb:
                over.append((job, used - mb))
        return tuple(over)


class JobTable(dict):
    """Every unfinished job by id, which of them hold which GPU (``holding``), and how many
    each user has (``per_user``).

    The index follows every ``table[id] = job``, ``pop`` and ``del``, so one node's GPU
    views (built on each of its probes) need not walk 10,000 jobs for their holders. Other
    ways of changing a dict would leave the index behind: they raise TypeError.
    """

    def __init__(self, jobs: Iterable[Job] = ()) -> None:
        super().__init__()
        self.holding: dict[str, dict[int, Placement]] = {}  # GPU uuid -> job id -> placement
        self.per_user: Counter[str] = Counter()
        self._on_node: dict[str, dict[int, None]] = {}  # node -> ids of the jobs placed there
        #: ``held``'s answers, each dropped when its GPU's holders change (see gpu_views)
        self._held: dict[str, tuple[tuple[int, Placement], ...]] = {}
        #: bumped by every change (set, pop, del): what is derived from the jobs alone
        #: (the waiting and holding lists a pass reads) is kept while it stays the same
        self.version = 0
        #: the jobs a pass considers (``waits``), by id in the table's order, kept up to date
        #: by every change instead of found by a walk over every job at every pass (a long
        #: queue's replay passes thousands of times over thousands of jobs); None when a job
        #: already in the table began to wait (a requeue, a release): its place in the
        #: table's order is then found again by one walk (``waiting``)
        self._waiting: dict[int, Job] | None = {}
        #: each job's place in the table's order (a count at its key's insertion)
        self._place: dict[int, int] = {}
        self._placed = 0
        for job in jobs:
            self[job.id] = job

    def __setitem__(self, job_id: int, job: Job) -> None:
        before = self.get(job_id)
        if before is not None:
            if type(before.status) is Pending and type(job.status) is Pending and before.user == job.user:
                # a waiting job's new reason or hold (most changes of a long queue's passes):
                # it holds no card either way, so the index stays as it is
                self.version += 1
                super().__setitem__(job_id, job)
                self._wait_list(job_id, job, True)
                return
            self._index(before, add=False)
        else:
            self._placed += 1
            self._place[job_id] = self._placed
        self.version += 1
        super().__setitem__(job_id, job)
        self._index(job, add=True)
        self._wait_list(job_id, job, before is not None)

    def __delitem__(self, job_id: int) -> None:
        self._index(self[job_id], add=False)
        self.version += 1
        super().__delitem__(job_id)
        self._place.pop(job_id, None)
        if self._waiting is not None:
            self._waiting.pop(job_id, None)

    def pop(self, job_id: int, *default):
        if job_id in self:
            self._index(self[job_id], add=False)
            self.version += 1
            self._place.pop(job_id, None)
            if self._waiting is not None:
                self._waiting.pop(job_id, None)
        return super().pop(job_id, *default)

    def _wait_list(self, job_id: int, job: Job, known: bool) -> None:
        """Keep ``_waiting`` after ``self[job_id] = job`` (``known``: the id was in the table)."""
        waiting = self._waiting
        if waiting is None:
            return
        if job.state == JobState.PENDING and not job.held_by and not job.pooled:
            if job_id in waiting or not known:  # in its place, or a new one at the table's end
                waiting[job_id] = job
            else:  # it waits again where the table has it: found by the next walk
                self._waiting = None
        else:
            waiting.pop(job_id, None)

    def waiting(self) -> dict[int, Job]:
        """The jobs a pass considers — pending, not held, not a pool's — by id, in the
        table's order (the caller must not change it)."""
        waiting = self._waiting
        if waiting is None:
            waiting = self._waiting = {job.id: job for job in self.values()
                                       if job.state == JobState.PENDING and not job.held_by and not job.pooled}
        return waiting

    def _unsupported(self, *args, **kwargs):
        raise TypeError("JobTable: set, pop or del one job at a time (the GPU index follows those)")

    update = setdefault = popitem = clear = __ior__ = _unsupported

    def _index(self, job: Job, *, add: bool) -> None:
        self.per_user[job.user] += 1 if add else -1
        for node in dict.fromkeys(p.node for p in job.placements):
            if add:
                self._on_node.setdefault(node, {})[job.id] = None
            else:
                here = self._on_node.get(node, {})
                here.pop(job.id, None)
                if not here:
                    self._on_node.pop(node, None)
        if not job.state.holds_gpus:
            return
        for p in job.placements:
            self._held.pop(p.gpu_uuid, None)
            if add:
                self.holding.setdefault(p.gpu_uuid, {})[job.id] = p
            else:
                held = self.holding.get(p.gpu_uuid, {})
                held.pop(job.id, None)
                if not held:
                    self.holding.pop(p.gpu_uuid, None)

    def holding_in_order(self) -> list[Job]:
        """The jobs holding GPUs, in the table's order, from the index (not a walk over
        every waiting job)."""
        ids = {job_id for held in self.holding.values() for job_id in held}
        place = self._place
        return [self[job_id] for job_id in sorted(ids, key=place.__getitem__)]

    def holders(self) -> list[Job]:
        """The jobs holding GPUs (launching or running: every job holds one at least), by
        id, from the index: a look at the running jobs need not walk 10,000 waiting ones."""
        ids = {job_id for held in self.holding.values() for job_id in held}
        return [self[job_id] for job_id in sorted(ids)]

    def on(self, node: str) -> list[Job]:
        """The jobs placed on ``node`` (those whose ``job_nodes`` name it), by id: a node's
        reconnect looks at its own jobs, not at every job of a 500-node cluster."""
        return [self[job_id] for job_id in sorted(self._on_node.get(node, ()))]

    def held(self, uuid: str) -> tuple[tuple[int, Placement], ...]:
        """(job id, placement) of every job holding GPU ``uuid``, by job id: the same
        tuple object until a job starts or stops holding it."""
        found = self._held.get(uuid)
        if found is None:
            found = self._held[uuid] = tuple(sorted(self.holding.get(uuid, {}).items()))
        return found


class GpuTable(dict):
    """Every GPU's ``GpuLive`` by uuid, and ``facts_version``: bumped whenever a card comes,
    goes or shows other facts of the kind a request is checked against (vendor, compute
    capability, memory, node), so what is derived from those alone (``HeadState.hardware``,
    asked at every submit) is kept between probes instead of rebuilt from 4,000 cards."""

    def __init__(self) -> None:
        super().__init__()
        self.facts_version = 0

    @staticmethod
    def _facts(live: GpuLive) -> tuple:
        r = live.reading
        return (live.node, r.index, r.vendor, r.compute_cap, r.memory_total_mb)

    def __setitem__(self, uuid: str, live: GpuLive) -> None:
        before = self.get(uuid)
        if before is None or self._facts(before) != self._facts(live):
            self.facts_version += 1
        super().__setitem__(uuid, live)

    def __delitem__(self, uuid: str) -> None:
        self.facts_version += 1
        super().__delitem__(uuid)

    def pop(self, uuid: str, *default):
        if uuid in self:
            self.facts_version += 1
        return super().pop(uuid, *default)

    def _unsupported(self, *args, **kwargs):
        raise TypeError("GpuTable: set, pop or del one GPU at a time (facts_version follows those)")

    update = setdefault = popitem = clear = __ior__ = _unsupported


def job_nodes(job: Job) -> list[str]:
    """The nodes a job holds GPUs on, the first (rank 0) first."""
    return list(dict.fromkeys(p.node for p in job.placements))


class HeadState:
    """The live view every room shares (see the module docstring)."""

    def __init__(self, config: ClusterConfig, store: Store, clock: Callable[[], float],
                 monotonic: Callable[[], float] = time.monotonic):
        self.config = config
        #: the ``scheduler:`` section as the head started with it (a reload keeps it)
        self.settings = config.scheduler
        #: the ``accounting:`` section (history's visibility, how often telemetry is kept)
        self.accounting = config.accounting
        self.store = store
        self.clock = clock
        #: for durations the head acts on (leases); ``clock`` is for what it records
        self.monotonic = monotonic
        self.owner = pwd.getpwuid(os.getuid()).pw_name  # the account the service runs as
        self.nodes = {n.name: NodeView(n.name, n.host, n.port, drained=n.drained,
                                       power_budget_w=n.power_budget_w)
                      for n in config.nodes}
        self.gpus = GpuTable()
        self.jobs = JobTable()  # every job not yet finished
        self.links: dict[str, NodeLink] = {}
        #: the waiting jobs in the order the last scheduling pass considered them (priority,
        #: fair share, submit time), and each one's 1-based place in it
        self.queue_order: list[int] = []
        self.queue_place: dict[int, int] = {}
        #: each waiting job's start forecast (``forecast.Start.json``), the last one made
        self.forecasts: dict[int, StartForecast] = {}
        #: something may let a job start since the scheduling loop last looked (``wake``)
        self.capacity_changed = True
        self._wake = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()
        #: the group commit (``on_disk``): the sync to the disk on its way, and the one
        #: after it, which covers every commit made while the first was under way
        self._sync: asyncio.Future | None = None
        self._hardware: dict[tuple, tuple] = {}  # a card's facts -> its class (``hardware``)
        #: ``hardware``'s last answer and what it was made from (GPU facts, nodes' CUDA)
        self._hardware_found: tuple[tuple, dict[str, dict[tuple, int]]] | None = None
        #: ``gpu_views``' kept views: uuid -> (GpuLive, holders, blocked, CUDA, health, view)
        self._views: dict[str, tuple] = {}
        #: every GPU's uuid in (node, index) order, and the ``facts_version`` it holds for
        self._order: tuple[int, list[str]] | None = None
        self._next_sync: asyncio.Future | None = None
        #: after a restore of the store: the nodes that have not yet told what ran since
        #: the backup (nothing is scheduled till they have, or till ``_restore_until``)
        self.unreconciled: set[str] = set()
        #: those of them the wait went on without: each is reconciled as if in time when it
        #: is back, and till then no new work goes on its cards (``blocked``)
        self.late_after_restore: set[str] = store.restore_late & set(self.nodes)
        self._restore_until = 0.0

    # ------------------------------------------------------------ getting work done
    def wake(self, capacity: bool = True) -> None:
        """Ask for a scheduling pass soon. ``capacity`` False: only the queue grew (a
        submit), which cannot start anything while every GPU is taken."""
        if capacity:
            self.capacity_changed = True
        self._wake.set()

    async def wait_for_wake(self, timeout: float) -> None:
        """Until someone wakes the loop, or ``timeout`` seconds (which count as a change
        of capacity: the periodic pass always runs)."""
        try:
            await within(timeout, self._wake.wait())
        except asyncio.TimeoutError:
            self.capacity_changed = True
        self._wake.clear()

    async def on_disk(self) -> None:
        """Until every store transaction committed before this call is on the disk (group
        commit): one sync, in a thread, serves every caller that came while none was under
        way; one that comes during a sync waits for the next, which starts when that one
        ends. Meanwhile the loop goes on (launches, exits, other requests), where a durable
        commit stopped it for the whole sync. ``StoreUnavailable`` when the disk fails."""
        if self._sync is None or self._sync.done():
            self._sync = asyncio.ensure_future(asyncio.to_thread(self.store.sync_to_disk))
            await asyncio.shield(self._sync)
            return
        if self._next_sync is None:
            self._next_sync = asyncio.ensure_future(self._sync_after(self._sync))
        await asyncio.shield(self._next_sync)

    async def _sync_after(self, running: asyncio.Future) -> None:
        with contextlib.suppress(Exception):
            await running  # its own callers hear how it went
        self._sync, self._next_sync = self._next_sync, None
        await asyncio.to_thread(self.store.sync_to_disk)

    def spawn(self, coro: Coroutine, name: str) -> asyncio.Task:
        """Run ``coro`` in the background; it is cancelled when the head stops."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def await_nodes_after_restore(self) -> None:
        """The store is older than what the nodes ran: hold scheduling until every node has
        been reconciled, or a node lease went by (a node away that long is lost anyway)."""
        self.unreconciled = set(self.nodes)
        self._restore_until = self.monotonic() + self.config.node_lease

    def holding_for_restore(self) -> bool:
        """Whether scheduling waits for nodes to tell what ran since a restored backup."""
        if self.unreconciled and self.monotonic() > self._restore_until:
            self.late_after_restore |= self.unreconciled
            self.unreconciled.clear()
            self.store.restore_done(self.late_after_restore)
            self.wake()
        return bool(self.unreconciled)

    def owes_restore_reconcile(self, node: str) -> bool:
        """Whether ``node`` has not yet told what it ran since the restored backup."""
        return node in self.unreconciled or node in self.late_after_restore

    def reconciled_after_restore(self, node: str) -> None:
        if node in self.late_after_restore:
            self.late_after_restore.discard(node)
            self.store.restore_late_told(node)
            self.wake()
        if node not in self.unreconciled:
            return
        self.unreconciled.discard(node)
        if not self.unreconciled:
            self.store.restore_done(self.late_after_restore)
            self.wake()

    def cancel_tasks(self) -> None:
        for task in list(self._tasks):
            task.cancel()

    def record(self, kind: str, message: str, **refs) -> None:
        """A line of the events log, at the head's time, for a change that writes nothing
        else (the store hands it to the stream once committed, like every other line)."""
        self.store.add_event(self.clock(), kind, message, **refs)

    def queue_pos(self, job: Job) -> int | None:
        """A waiting job's place in the queue (None: not waiting, or not ordered yet)."""
        return self.queue_place.get(job.id) if job.state == JobState.PENDING else None

    def set_queue_order(self, order: list[int]) -> bool:
        """The scheduler's order of the waiting jobs; False when it did not change."""
        if order == self.queue_order:
            return False
        self.queue_order = order
        self.queue_place = {job_id: n for n, job_id in enumerate(order, start=1)}
        return True

    # ----------------------------------------------------------------- jobs' tokens
    def token(self, job: Job) -> str | None:
        """Names one launch of one job: this head's store, the attempt and a nonce."""
        return job.launch_token

    def ours(self, token: object) -> bool:
        """Whether this store issued the launch token: only then is a session ours to stop
        or an exit ours to acknowledge (never another copy's, or a launch made after the
        backup this store was restored from)."""
        return self.store.issued(token)

    # ------------------------------------------------------------------------ GPUs
    def gpu_views(self, node: str | None = None) -> list[GpuView]:
        """Every GPU (or only ``node``'s: one node's readings are published once per probe,
        and building all 1,000 views of a big cluster for each would cost the head a core;
        who holds each GPU comes from the jobs' index, not a walk over every job). A view is
        given again while it is made of the same ``GpuLive`` (frozen: a probe or an isolation
        puts a new one) and holders' tuple (``JobTable.held``) and of an equal blocking
        reason, CUDA version and health score: a pass at 4,000 cards builds views only for
        the cards whose readings or jobs changed since the last one."""
        if node is None:
            order = self._order
            if order is None or order[0] != self.gpus.facts_version:
                # (node, index) are among a card's facts: the order holds until they change
                order = self._order = (self.gpus.facts_version, sorted(
                    self.gpus, key=lambda u: (self.gpus[u].node, self.gpus[u].reading.index)))
            uuids = order[1]
        else:
            uuids = sorted((u for u, g in self.gpus.items() if g.node == node),
                           key=lambda u: self.gpus[u].reading.index)
        kept, gpus, held, nodes = self._views, self.gpus, self.jobs.held, self.nodes
        health: dict[str, float] = {}
        views = []
        for uuid in uuids:
            live = gpus[uuid]
            placements = held(uuid)
            blocked = self.blocked(live)
            name = live.node
            score = health.get(name)
            if score is None:
                score = health[name] = self.health_score(name)
            cuda = nodes[name].cuda_version
            seen = kept.get(uuid)
            if seen is None or seen[0] is not live or seen[1] is not placements \
                    or seen[2] != blocked or seen[3] != cuda or seen[4] != score:
                seen = kept[uuid] = (live, placements, blocked, cuda, score,
                                     self._view(live, placements, blocked, cuda, score))
            views.append(seen[5])
        if node is None and len(kept) > len(uuids):  # cards gone from the cluster
            for uuid in [u for u in kept if u not in gpus]:
                del kept[uuid]
        return views

    def _view(self, live: GpuLive, placements: tuple[tuple[int, Placement], ...],
              blocked: str | None, cuda: str | None = None, health: float | None = None) -> GpuView:
        return GpuView(node=live.node, reading=live.reading, blocked=blocked,
                       maintenance=live.maintenance is not None, placements=placements,
                       unmanaged_used_mb=live.unmanaged_used_mb,
                       cuda_version=self.nodes[live.node].cuda_version if cuda is None else cuda,
                       health_score=self.health_score(live.node) if health is None else health,
                       overuse=live.overuse(placements) if live.job_used else (),
                       unmanaged_procs=live.owners)

    def any_gpu_offers(self) -> bool:
        """Whether some GPU could take a job now: in service and free, held by preemptible
        jobs only, or sharing with room for another slice (``offered_mb``). A view is built only for a card shared
        without an exclusive holder: a full cluster of 4,000 cards answers with none."""
        for uuid, live in self.gpus.items():
            blocked = self.blocked(live)
            if blocked is not None:
                continue
            placements = self.jobs.held(uuid)
            if not placements:
                return True
            if all(j in self.jobs and self.jobs[j].spec.preemptible for j, _ in placements):
                return True  # a normal job would preempt them (scheduler/preemption.py)
            shared = not any(p.exclusive for _, p in placements)
            if shared and offered_mb(self._view(live, placements, blocked)):
                return True
        return False

    def hardware(self) -> dict[str, dict[tuple, int]]:
        """``admission.node_hardware(self.gpu_views())`` without building the views (at
        submit: 4,000 views cost the head ~100 ms for what it needs of each card, its class).
        Kept while no card's facts and no node's CUDA version changed: a submit's cost must
        not grow with the lab (walking 4,000 cards was most of a submit at 500 nodes)."""
        key = (self.gpus.facts_version, tuple(view.cuda_version for view in self.nodes.values()))
        if self._hardware_found is not None and self._hardware_found[0] == key:
            return self._hardware_found[1]
        found: dict[str, dict[tuple, int]] = {}
        memo = self._hardware
        for live in sorted(self.gpus.values(), key=lambda g: (g.node, g.reading.index)):
            r = live.reading
            facts = (r.vendor, r.compute_cap, self.nodes[live.node].cuda_version, r.memory_total_mb)
            hw = memo.get(facts)
            if hw is None:
                hw = memo[facts] = admission.hardware(*facts)
            counts = found.setdefault(live.node, {})
            counts[hw] = counts.get(hw, 0) + 1
        self._hardware_found = (key, found)
        return found

    def blocked(self, live: GpuLive) -> str | None:
        """Why no new work may go on this card now (None: it may)."""
        node = self.nodes[live.node]
        if node.drained:
            return f"node {node.name} is drained"
        if node.state != NodeState.UP:
            return f"node {node.name} is {node.state.value}"
        if node.name in self.late_after_restore:
            return f"node {node.name} has not yet told what it ran since the restored backup"
        if live.maintenance is not None:  # its reason says what to do (a lost card's too)
            why = live.maintenance.reason
            return f"GPU in maintenance: {why}" if why else "GPU in maintenance"
        if live.reading.lost:  # resumed with --force while the driver still says so
            return f"GPU lost: {live.reading.lost}"
        if live.reading.mig_mode == "Enabled":  # R3: its MIG instances are the devices
            return "MIG mode is on: jobs get its MIG instances"
        return None

    def health_score(self, node: str) -> float:
        """The node's health score now (R19): 1.0 healthy, lower after throttling."""
        view = self.nodes.get(node)
        events = view.throttle_events if view else None
        return health_score(events, self.clock()) if events else 1.0

    def set_maintenance(self, gpu: str, maintenance: Maintenance | None) -> None:
        """Take a GPU out of service (with why), or put it back (None); the store keeps it
        so a restart of the head does not undo an isolation."""
        live = self.gpus[gpu]
        self.gpus[gpu] = replace(live, maintenance=maintenance)
        if maintenance is None:
            self.store.set_gpu_status(gpu, "ok")
        else:
            self.store.set_gpu_status(gpu, "maintenance", maintenance.reason)

    def label(self, gpu: str) -> str:
        """A GPU as people name it: ``node01:0``."""
        live = self.gpus.get(gpu)
        return f"{live.node}:{live.reading.index}" if live else gpu

    def node(self, name: str) -> NodeView:
        """The node called ``name``, else a one-line refusal that guesses the typo."""
        view = self.nodes.get(name)
        if view is not None:
            return view
        guess = did_you_mean(name, self.nodes)
        known = (f"known: {', '.join(self.nodes)}" if len(self.nodes) <= NODES_NAMED
                 else "`nebula status` lists them")
        raise RequestError(f"no node {name}{guess}; {known}" if self.nodes else f"no node {name}: "
                           "this cluster has none yet")

    def resolve_gpu(self, name: str) -> str:
        """A GPU named by uuid or as node:index."""
        if name in self.gpus:
            return name
        node, _, index = name.partition(":")
        for uuid, live in self.gpus.items():
            if live.node == node and str(live.reading.index) == index:
                return uuid
        labels = [f"{live.node}:{live.reading.index}" for live in self.gpus.values()]
        raise RequestError(f"no GPU {name}{did_you_mean(name, labels)}; name it by uuid or as "
                           "node:index (e.g. node01:0)")

    def total_mb(self, gpu: str) -> int | None:
        live = self.gpus.get(gpu)
        return live.reading.memory_total_mb if live else None
