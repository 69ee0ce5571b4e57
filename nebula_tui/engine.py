"""The head service's loop: events in → scheduler → launches and store → events out.

Phases, each one function:
  1. ``on_node_message`` / ``on_node_state``: probes, job starts and exits, reachability
     arrive from the node links and update the in-memory view (GPU readings) or the
     store (job transitions, one transaction each).
  2. ``schedule_pass``: a pure scheduler pass over a snapshot; runs at once after any
     event that may let a job start (event-driven), and every ``PERIODIC_PASS_S`` anyway.
  3. ``_launch``: writes the intent (allocation + ``launching``) and asks the node to
     create the job's tmux session; the job is ``running`` when the node confirms.
  4. ``publish``: every change goes out to subscribed clients (TUI, ``--wait``).
"""

from __future__ import annotations

import asyncio
import contextlib
import grp
import logging
import os
import pwd
import re
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from . import node_admin, scheduler, views
from .scheduler import fairshare
from .scheduler.slices import offered_mb
from .settings import SchedulerSettings
from .config import ClusterConfig
from .health_monitor import HealthMonitor
from .model import (ConfigError, GpuProcess, GpuReading, GpuView, Job, JobSpec, JobState, NodeState,
                    Placement, RequestError)
from .remote import launcher
from .remote.backends import nvidia, topo
from .remote.ssh import NodeLink, NodeUnavailable
from .store import StaleDecision, Store

log = logging.getLogger(__name__)

PERIODIC_PASS_S = 3.0
MAX_PASS_PAUSE_S = 0.2
SHARES_TTL_S = 60.0
TELEMETRY_EVERY_S = 30.0
TELEMETRY_COMPACT_EVERY_S = 3600.0
ACK_BATCH_S = 0.1
_CUDA_VERSION = re.compile(r"CUDA Version:\s*([\d.]+)")
CANCEL_GRACE_S = 10.0


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
    silent_since: float | None = None  # when it stopped answering (for the node lease)
    cuda_version: str | None = None
    topo: dict = field(default_factory=dict)
    hello: dict = field(default_factory=dict)

    def json(self) -> dict:
        return {"name": self.name, "host": self.host, "port": self.port,
                "state": NodeState.DRAINED.value if self.drained and self.state == NodeState.UP
                else self.state.value,
                "reason": self.drain_reason if self.drained and self.state == NodeState.UP
                else self.reason,
                "drained": self.drained, "last_seen": self.last_seen,
                "hostname": self.hello.get("hostname")}


@dataclass
class GpuLive:
    """What the head knows of one GPU between probes."""

    node: str
    reading: GpuReading
    processes: list[GpuProcess] = field(default_factory=list)
    unmanaged_used_mb: int = 0
    maintenance: bool = False
    process_jobs: dict[str, str] = field(default_factory=dict)  # pid -> our job id


class JobTable(dict):
    """Every unfinished job by id, and which of them hold which GPU (``holding``).

    The index follows every ``table[id] = job``, ``pop`` and ``del``, so one node's GPU
    views (built on each of its probes) need not walk 10,000 jobs for their holders. Other
    ways of changing a dict would leave the index behind: they raise TypeError.
    """

    def __init__(self, jobs: Iterable[Job] = ()) -> None:
        super().__init__()
        self.holding: dict[str, dict[int, Placement]] = {}  # GPU uuid -> job id -> placement
        for job in jobs:
            self[job.id] = job

    def __setitem__(self, job_id: int, job: Job) -> None:
        before = self.get(job_id)
        if before is not None:
            self._index(before, add=False)
        super().__setitem__(job_id, job)
        self._index(job, add=True)

    def __delitem__(self, job_id: int) -> None:
        self._index(self[job_id], add=False)
        super().__delitem__(job_id)

    def pop(self, job_id: int, *default):
        if job_id in self:
            self._index(self[job_id], add=False)
        return super().pop(job_id, *default)

    def _unsupported(self, *args, **kwargs):
        raise TypeError("JobTable: set, pop or del one job at a time (the GPU index follows those)")

    update = setdefault = popitem = clear = __ior__ = _unsupported

    def _index(self, job: Job, *, add: bool) -> None:
        if not job.state.holds_gpus:
            return
        for p in job.placements:
            if add:
                self.holding.setdefault(p.gpu_uuid, {})[job.id] = p
            else:
                held = self.holding.get(p.gpu_uuid, {})
                held.pop(job.id, None)
                if not held:
                    self.holding.pop(p.gpu_uuid, None)

    def held(self, uuid: str) -> tuple[tuple[int, Placement], ...]:
        """(job id, placement) of every job holding GPU ``uuid``, by job id."""
        return tuple(sorted(self.holding.get(uuid, {}).items()))


def _int_or_none(text: str | None) -> int | None:
    return int(text) if text and text.isdigit() else None


def job_nodes(job: Job) -> list[str]:
    """The nodes a job holds GPUs on, the first (rank 0) first."""
    return list(dict.fromkeys(p.node for p in job.placements))


def month_start(now: float) -> float:
    """The first moment of the calendar month (local time) that ``now`` falls in (R7)."""
    t = time.localtime(now)
    return time.mktime((t.tm_year, t.tm_mon, 1, 0, 0, 0, 0, 0, -1))


def _pending(job: Job) -> scheduler.PendingJob:
    s = job.spec
    return scheduler.PendingJob(
        job.id, job.user, s.gpu_count, s.gpu_mem_mb, job.submitted_at, arch=s.arch, cuda=s.cuda,
        vendor=s.vendor, max_nodes=s.nodes, priority=s.priority, after=tuple(s.after),
        time_limit_s=s.time_limit_s, service=s.service)


def _group_members(group: str) -> set[str]:
    """Users in a Unix group: its listed members and those for whom it is the primary group."""
    try:
        entry = grp.getgrnam(group)
    except KeyError:
        return set()
    return set(entry.gr_mem) | {p.pw_name for p in pwd.getpwall() if p.pw_gid == entry.gr_gid}


class Engine:
    def __init__(self, config: ClusterConfig, store: Store, clock=time.time):
        self.config = config
        self.store = store
        self.clock = clock
        self.owner = pwd.getpwuid(os.getuid()).pw_name  # the account the service runs as
        self.nodes = {n.name: NodeView(n.name, n.host, n.port, drained=n.drained)
                      for n in config.nodes}
        self.gpus: dict[str, GpuLive] = {}
        self.jobs = JobTable()  # every job not yet finished
        self.links: dict[str, NodeLink] = {}
        self.subscribers: set[asyncio.Queue] = set()
        # What every subscriber holds of each node's GPUs (the last "gpus" event applied to
        # the snapshot it started from): GPU events carry only the changes against it.
        self._published: dict[str, dict[str, dict]] = {}  # node -> uuid -> GPU as sent
        self._finished_waiters: dict[int, list[asyncio.Future]] = defaultdict(list)
        self._wake = asyncio.Event()
        self._cancelling: set[int] = set()
        self._acks: dict[str, list[int]] = {}
        self._telemetry_at: dict[str, float] = {}
        self._capacity_changed = True  # something may let a job start since the last pass
        self._shares: dict[str, scheduler.UserShare] | None = None
        self._shares_at = 0.0
        self._node_exits: dict[int, dict[str, int | None]] = {}  # gangs: exits so far per node
        self._launched: dict[int, set[str]] = {}  # gangs: nodes that confirmed the launch
        #: the scheduler's view of each waiting job, kept while its spec is the same object
        self._pending_views: dict[int, tuple[JobSpec, scheduler.PendingJob]] = {}
        self.settings = config.scheduler or SchedulerSettings()
        self._compacted_at = 0.0
        self._tasks: set[asyncio.Task] = set()
        self._scheduler_task: asyncio.Task | None = None
        self.health = HealthMonitor(self)  # R16/R17/R19: Xid policies, isolation, health score

    # ------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        active = (JobState.PENDING, JobState.LAUNCHING, JobState.RUNNING)
        self.jobs = JobTable(self.store.jobs(states=active))
        self._cancelling = self.store.cancel_requested()
        self._register_known_gpus()
        stored = {row["name"]: row for row in self.store.nodes()}
        for node in self.config.nodes:
            self.store.upsert_node(node.name, node.host, node.port, NodeState.CONNECTING.value)
            if node.name in stored and stored[node.name].get("drained"):
                # An admin's drain outlives restarts; the config only gives the first state.
                view = self.nodes[node.name]
                view.drained, view.drain_reason = True, stored[node.name].get("drain_reason") or ""
            link = NodeLink(node, self.config, self.on_node_message, self.on_node_state)
            self.links[node.name] = link
            link.start()
        self._scheduler_task = asyncio.create_task(self._scheduler_loop(), name="scheduler")

    def _register_known_gpus(self) -> None:
        """GPUs the store knows stay visible (as unreachable) until their node answers."""
        for row in self.store.gpus():
            if row["node"] not in self.nodes:
                continue
            reading = GpuReading(index=row["idx"], uuid=row["uuid"], name=row["model"],
                                 pci_bus_id=row["pci_bus_id"], memory_total_mb=row["total_mb"],
                                 driver_version=row["driver_version"],
                                 compute_cap=row["compute_cap"], vendor=row["vendor"] or "nvidia")
            self.gpus[row["uuid"]] = GpuLive(row["node"], reading,
                                             maintenance=row["status"] == "maintenance")
            if row["status"] == "maintenance":
                self.health.adopt(row["uuid"], row.get("status_reason"))
            self.nodes[row["node"]].cuda_version = row["cuda_version"]

    async def stop(self) -> None:
        if self._scheduler_task:
            self._scheduler_task.cancel()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*(link.close() for link in self.links.values()),
                             return_exceptions=True)

    def _spawn(self, coro, name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------- phase 1: events
    def on_node_state(self, node: str, state: NodeState, reason: str) -> None:
        view = self.nodes[node]
        if state == NodeState.UP:
            view.silent_since = None
        elif view.silent_since is None:
            view.silent_since = self.clock()
        view.state, view.reason = state, reason
        self.store.upsert_node(node, view.host, view.port, state.value, reason, view.last_seen)
        self.store.add_event("node", f"{node} is {state.value}" + (f": {reason}" if reason else ""),
                             node=node)
        self.publish({"type": "node", "node": view.json()})
        self.publish_gpus(node)
        if state == NodeState.UP:
            self._spawn(self._reconcile(node), f"reconcile-{node}")
        self.wake()

    def on_node_message(self, node: str, message: dict) -> None:
        handler = {"hello": self._on_hello, "probe": self._on_probe,
                   "started": self._on_started, "exit": self._on_exit,
                   "kmsg": self.health.on_kernel_message}.get(message.get("type"))
        if handler is None:
            return
        try:
            handler(node, message)
        except Exception:  # a strange message must never take the head down
            log.exception("could not handle %s from %s", message.get("type"), node)

    def _on_hello(self, node: str, message: dict) -> None:
        view = self.nodes[node]
        view.hello = message
        match = _CUDA_VERSION.search(message.get("smi_table") or "")
        view.cuda_version = match.group(1) if match else None
        if message.get("topo"):
            with contextlib.suppress(ValueError):
                view.topo = topo.parse_topo(message["topo"])

    def _on_probe(self, node: str, message: dict) -> None:
        view = self.nodes[node]
        view.last_seen = message.get("t") or self.clock()
        problem = f"probe: {message['error']}" if message.get("error") else ""
        try:
            readings = nvidia.parse_query_gpu(message.get("gpu_csv", ""), nvidia.QUERY_GPU_FIELDS)
            processes = nvidia.parse_query_apps(message.get("apps_csv", ""),
                                                nvidia.QUERY_APPS_FIELDS)
        except ValueError as err:
            readings, processes = [], []
            problem = f"probe output not understood: {err}"
        if problem != view.reason:  # shown until a good probe clears it
            view.reason = problem
            self.publish({"type": "node", "node": view.json()})
        if not readings:
            return
        ours = set(message.get("pid_jobs", {}))
        new_gpus = []
        for reading in readings:
            if not reading.uuid:
                continue
            procs = [p for p in processes if p.gpu_uuid == reading.uuid]
            unmanaged = sum(p.used_memory_mb or 0 for p in procs if str(p.pid) not in ours)
            live = self.gpus.get(reading.uuid)
            if live is None or live.reading.memory_total_mb != reading.memory_total_mb \
                    or live.node != node:
                new_gpus.append(reading)
            changed = live is None or live.unmanaged_used_mb != unmanaged
            self.gpus[reading.uuid] = GpuLive(node, reading, procs, unmanaged,
                                              live.maintenance if live else False,
                                              message.get("pid_jobs", {}))
            if changed:
                self.wake()
        if new_gpus:
            self.store.register_gpus(node, [self._descriptor(node, r) for r in new_gpus],
                                     self.clock())
        self._record_telemetry(node, readings)
        self.health.on_probe(node, readings, message.get("pid_jobs", {}))
        self.publish_gpus(node)

    def _record_telemetry(self, node: str, readings: list[GpuReading]) -> None:
        """R18: at most one sample per GPU every TELEMETRY_EVERY_S, whatever the probe rate."""
        now = self.clock()
        if now - self._telemetry_at.get(node, 0.0) < TELEMETRY_EVERY_S:
            return
        self._telemetry_at[node] = now
        self.store.record_telemetry([
            {"gpu": r.uuid, "t": now, "temperature_c": r.temperature_c,
             "utilization_pct": r.utilization_pct, "memory_used_mb": r.memory_used_mb,
             "power_w": r.power_w, "fan_pct": r.fan_pct, "sm_clock_mhz": r.sm_clock_mhz,
             "mem_clock_mhz": r.mem_clock_mhz} for r in readings if r.uuid])
        if now - self._compacted_at > TELEMETRY_COMPACT_EVERY_S:
            self._compacted_at = now
            self.store.compact_telemetry(now)

    def _descriptor(self, node: str, r: GpuReading) -> dict:
        return {"uuid": r.uuid, "idx": r.index, "model": r.name, "vendor": r.vendor,
                "total_mb": r.memory_total_mb, "compute_cap": r.compute_cap,
                "pci_bus_id": r.pci_bus_id, "driver_version": r.driver_version,
                "cuda_version": self.nodes[node].cuda_version}

    def _on_started(self, node: str, message: dict) -> None:
        job = self._job_from_node(node, message)
        if job and job.state == JobState.LAUNCHING:
            self._mark_running(job)

    def _on_exit(self, node: str, message: dict) -> None:
        job = self._job_from_node(node, message)
        if job is None:
            if self._ours(message.get("token")):
                # Ours but already finished (the head crashed before its ack): ack it now.
                with contextlib.suppress(TypeError, ValueError):
                    self._ack_soon(node, int(message.get("job")))
            return
        self._ack_soon(node, job.id)
        if self.health.takes_exit(job, message.get("code")):  # evicted from an isolated GPU
            return
        exits = self._node_exits.setdefault(job.id, {})
        exits[node] = message.get("code")
        if set(exits) < set(job_nodes(job)):
            return  # a gang ends when every node's part has ended
        codes = [exits[n] for n in job_nodes(job)]
        code = next((c for c in codes if c != 0), 0)
        if job.id in self._cancelling:
            state, reason = JobState.CANCELLED, "cancelled"
        elif code == 0:
            state, reason = JobState.SUCCEEDED, ""
        elif code is None:
            state, reason = JobState.FAILED, "its tmux session ended without an exit code (killed?)"
        else:
            state, reason = JobState.FAILED, ""
        self._finish(job, state, code, reason)

    def token(self, job: Job) -> str:
        """Names one launch of one job: this head's store, and the attempt (requeues)."""
        return f"{self.store.head_token}.{job.attempt}"

    def _ours(self, token: object) -> bool:
        return isinstance(token, str) and token.split(".")[0] == self.store.head_token

    def _job_from_node(self, node: str, message: dict) -> Job | None:
        try:
            job = self.jobs.get(int(message.get("job")))
        except (TypeError, ValueError):
            return None
        if job is None or message.get("token") != self.token(job):
            return None  # another head's job directory, or an earlier attempt of this job
        return job if node in job_nodes(job) and job.state.holds_gpus else None

    def _ack_soon(self, node: str, job_id: int) -> None:
        """Tell the node its job's exit is recorded; acks of one moment go as one request."""
        batch = self._acks.setdefault(node, [])
        batch.append(job_id)
        if len(batch) == 1:
            self._spawn(self._send_acks(node), f"ack-{node}")

    async def _send_acks(self, node: str) -> None:
        await asyncio.sleep(ACK_BATCH_S)
        jobs = self._acks.pop(node, [])
        # Unacked exits are reported again when the node reconnects, and ignored then.
        with contextlib.suppress(NodeUnavailable, asyncio.TimeoutError):
            await self.links[node].request("ack", jobs=jobs)

    async def _reconcile(self, node: str) -> None:
        """After (re)connecting, make the node and the store agree (R23).

        Launch intents the node never saw are carried out (the session name makes that
        idempotent); cancels it missed are sent again; sessions of ours whose job is no
        longer this node's (declared lost and requeued meanwhile) are stopped, so no job
        runs twice. Exits the node recorded while we were away arrive as exit messages.
        """
        for job in list(self.jobs.values()):
            if node in job_nodes(job) and job.state == JobState.LAUNCHING:
                await self._launch(job, only=node)
            if node in job_nodes(job) and job.id in self._cancelling:
                self._spawn(self._cancel_on_node(job, only=node), f"cancel-{job.id}")
        try:
            listing = await self.links[node].request("list")
        except (NodeUnavailable, asyncio.TimeoutError):
            return
        sessions = set(listing.get("sessions", []))
        for name, info in listing.get("jobs", {}).items():
            job_id = int(name)
            current = self.jobs.get(job_id)
            if (self._ours(info.get("token")) and f"nebula-{job_id}" in sessions
                    and (current is None or node not in job_nodes(current)
                         or info.get("token") != self.token(current))):
                log.warning("stopping stale session of job %s on %s", job_id, node)
                self.store.add_event("reconcile", f"stopped a stale copy of job {job_id} on {node}",
                                     job_id=job_id, node=node)
                self._spawn(self._stop_stale(node, job_id), f"stale-{job_id}")

    async def _stop_stale(self, node: str, job_id: int) -> None:
        with contextlib.suppress(NodeUnavailable, asyncio.TimeoutError):
            await self.links[node].request("cancel", timeout=CANCEL_GRACE_S + 30, job=job_id,
                                           grace=CANCEL_GRACE_S)

    # ---------------------------------------------------- phase 2: scheduling
    def wake(self, capacity: bool = True) -> None:
        """Ask for a pass soon. ``capacity`` False: only the queue grew (a submit), which
        cannot start anything while every GPU is taken (see ``_pass_is_pointless``)."""
        if capacity:
            self._capacity_changed = True
        self._wake.set()

    def _pass_is_pointless(self) -> bool:
        """Only submits since the last pass, and no GPU could take any job: skip the pass.
        The new jobs get their waiting reasons at the next periodic pass."""
        if self._capacity_changed:
            return False
        return not any(gpu.blocked is None and (not gpu.placements or offered_mb(gpu))
                       for gpu in self.gpu_views())

    async def _scheduler_loop(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), PERIODIC_PASS_S)
            except asyncio.TimeoutError:
                self._capacity_changed = True  # the periodic pass always runs
            self._wake.clear()
            started = time.perf_counter()
            try:
                self.expire_leases()
                if self._pass_is_pointless():
                    continue
                self._capacity_changed = False
                self.schedule_pass()
            except Exception:
                log.exception("scheduling pass failed")
            # A pass over a long queue takes a while: give submits, launches and exits at
            # least as long before the next one, so they arrive in batches instead of each
            # paying for a pass of its own (a short queue's pass costs ~1 ms: no delay).
            await asyncio.sleep(min(time.perf_counter() - started, MAX_PASS_PAUSE_S))

    def expire_leases(self) -> None:
        """Jobs on a node silent for longer than the lease are lost: requeue them.

        A short drop costs nobody their job (the node is only ``unknown``); when the node
        comes back after the lease, reconcile stops the stale copies.
        """
        now = self.clock()
        for view in self.nodes.values():
            if view.silent_since is None or now - view.silent_since < self.config.node_lease:
                continue
            for job in [j for j in self.jobs.values() if view.name in job_nodes(j) and j.state.holds_gpus]:
                self.requeue(job, f"lost with node {view.name} (silent for "
                                  f"{now - view.silent_since:.0f}s); requeued")

    def requeue(self, job: Job, reason: str) -> None:
        """Put a job that held GPUs back in the queue (its allocation released)."""
        self.store.requeue(job.id, reason, self.clock())
        held_on = job_nodes(job)
        self._cancelling.discard(job.id)
        job = replace(job, state=JobState.PENDING, node=None, placements=(), reason=reason,
                      started_at=None, attempt=job.attempt + 1)
        self.jobs[job.id] = job
        self._node_exits.pop(job.id, None)
        self._launched.pop(job.id, None)
        self.publish_job(job)
        for node in held_on:
            self.publish_gpus(node)
        self.wake()

    def gpu_views(self, node: str | None = None) -> list[GpuView]:
        """Every GPU (or only ``node``'s: one node's readings are published once per probe,
        and building all 1,000 views of a big cluster for each would cost the head a core;
        who holds each GPU comes from the jobs' index, not a walk over every job)."""
        return [GpuView(node=live.node, reading=live.reading, blocked=self._blocked(live),
                        maintenance=live.maintenance, placements=self.jobs.held(uuid),
                        unmanaged_used_mb=live.unmanaged_used_mb,
                        cuda_version=self.nodes[live.node].cuda_version,
                        health_score=self.health.score(live.node))
                for uuid, live in sorted(((u, g) for u, g in self.gpus.items()
                                          if node is None or g.node == node),
                                         key=lambda kv: (kv[1].node, kv[1].reading.index))]

    def _blocked(self, live: GpuLive) -> str | None:
        node = self.nodes[live.node]
        if node.drained:
            return f"node {node.name} is drained"
        if node.state != NodeState.UP:
            return f"node {node.name} is {node.state.value}"
        if live.maintenance:
            why = self.health.reason(live.reading.uuid)
            return f"GPU in maintenance: {why}" if why else "GPU in maintenance"
        return None

    def schedule_pass(self) -> None:
        pending = [j for j in self.jobs.values() if j.state == JobState.PENDING and not j.held_by]
        if not pending:
            return
        reasons: dict[int, str] = {}
        for decision in scheduler.schedule(self._snapshot_for(pending)):
            job = self.jobs[decision.job_id]
            if isinstance(decision, scheduler.Start):
                self._begin_launch(job, decision.placements)
            elif isinstance(decision, scheduler.Fail):
                self._finish(job, JobState.FAILED, None, decision.reason)
            elif job.reason != decision.reason:
                reasons[job.id] = decision.reason
                self.jobs[job.id] = replace(job, reason=decision.reason)
                self.publish_job(self.jobs[job.id])
        self.store.set_reasons(reasons)

    def _snapshot_for(self, pending: list[Job]) -> scheduler.Snapshot:
        """Everything a pass looks at, from memory (the store only for old dependencies)."""
        holding = [j for j in self.jobs.values() if j.state.holds_gpus]
        named = {dep for j in pending for dep in j.spec.after}
        finished = self.store.job_states([d for d in named if d not in self.jobs]) if named else {}
        return scheduler.Snapshot(
            now=self.clock(),
            gpus=tuple(self.gpu_views()),
            queue=self._pending_queue(pending),
            running=tuple(scheduler.RunningJob(j.id, j.user, j.placements, j.started_at or j.submitted_at,
                                               j.spec.time_limit_s, j.spec.service) for j in holding),
            users=self.shares(),
            finished=finished,
            topologies={name: view.topo.get("links", {}) for name, view in self.nodes.items()},
            config=self.settings.config,
        )

    def _pending_queue(self, pending: list[Job]) -> tuple[scheduler.PendingJob, ...]:
        """The waiting jobs as the scheduler sees them. A job's view is made once and kept
        while its spec stays the same object and its submit time the same (a new reason
        keeps them): building 10,000 views costs more than the pass that reads them."""
        kept, views = self._pending_views, {}
        for job in pending:
            seen = kept.get(job.id)
            if seen is None or seen[0] is not job.spec or seen[1].submitted_at != job.submitted_at:
                seen = (job.spec, _pending(job))
            views[job.id] = seen
        self._pending_views = views  # only jobs still waiting are kept
        return tuple(view for _, view in views.values())

    def shares(self) -> dict[str, scheduler.UserShare]:
        """R6 weights and R7 quota standing per user; recomputed when a job ends, at most
        once a minute otherwise (so a pass costs no SQL)."""
        now = self.clock()
        if self._shares is not None and now - self._shares_at < SHARES_TTL_S:
            return self._shares
        half_life = self.settings.half_life_s
        since = now - 10 * half_life if half_life else 0.0
        finished = self.store.finished_usage(since)
        month = self.store.usage_since(month_start(now))
        held: dict[str, float] = defaultdict(float)
        for job in self.jobs.values():
            if job.state.holds_gpus and job.started_at:
                held[job.user] += self._held_hours(job, now)
        shares = {}
        for user in set(finished) | set(month) | set(held):
            refusal = self.quota_refusal(user, month.get(user, 0.0) + held.get(user, 0.0))
            shares[user] = scheduler.UserShare(
                user, fairshare.user_weight(finished.get(user, []), held.get(user, 0.0), now, half_life),
                refusal)
        self._shares, self._shares_at = shares, now
        return shares

    def _held_hours(self, job: Job, now: float) -> float:
        fractions = [fairshare.gpu_fraction(p.memory_mb, self._total_mb(p.gpu_uuid), p.exclusive)
                     for p in job.placements]
        return fairshare.gpu_hours(fractions, now - (job.started_at or now))

    def _total_mb(self, gpu: str) -> int | None:
        live = self.gpus.get(gpu)
        return live.reading.memory_total_mb if live else None

    def quota_refusal(self, user: str, month_hours: float) -> str | None:
        quota = self._quotas().get(user, self.settings.quota_gpu_hours)
        admins = sorted({"root", self.owner, *self.config.admins})
        return fairshare.quota_refusal(user, month_hours, quota, admins)

    def _quotas(self) -> dict[str, float]:
        return {u["name"]: u["quota_gpu_hours"] for u in self.store.users()
                if u.get("quota_gpu_hours") is not None}

    # ------------------------------------------------------ phase 3: launches
    def _begin_launch(self, job: Job, placements: tuple[Placement, ...]) -> None:
        try:
            self.store.start_launching(job.id, placements, self.clock())
        except StaleDecision:
            return  # the job changed since the snapshot (cancelled): nothing to launch
        job = replace(job, state=JobState.LAUNCHING, node=placements[0].node,
                      placements=placements, reason="")
        self.jobs[job.id] = job
        self.publish_job(job)
        for node in job_nodes(job):
            self.publish_gpus(node)
        self._spawn(self._launch(job), f"launch-{job.id}")

    async def _launch(self, job: Job, only: str | None = None) -> None:
        """Start the job's tmux session on each of its nodes (or only on ``only``).

        The job is running once every node has confirmed; a node that is away keeps the
        intent in the store, and reconcile launches its part when it is back.
        """
        nodes = job_nodes(job)
        replies = await asyncio.gather(*(self._launch_on(job, node, nodes) for node in nodes
                                         if only is None or node == only), return_exceptions=True)
        current = self.jobs.get(job.id)
        if current is None or current.state != JobState.LAUNCHING:
            return
        failed = [r for r in replies if isinstance(r, dict) and not r.get("ok")]
        if failed:
            self._finish(current, JobState.FAILED, None, f"launch failed: {failed[0].get('error')}")
            return
        confirmed = self._launched.setdefault(job.id, set())
        confirmed.update(r["node"] for r in replies if isinstance(r, dict))
        if confirmed >= set(nodes):
            self._launched.pop(job.id, None)
            self._mark_running(current)

    async def _launch_on(self, job: Job, node: str, nodes: list[str]) -> dict | None:
        mine = tuple(p for p in job.placements if p.node == node)
        extra = None
        if len(nodes) > 1:
            master = self.config.node(nodes[0])
            extra = launcher.gang_environment(job, node, master.host, nodes,
                                              self.config.node(node).env_dict.get("NCCL_SOCKET_IFNAME"))
        script = launcher.run_script(job, mine, self._run_as(job, node), extra)
        try:
            reply = await self.links[node].request("launch", job=job.id, token=self.token(job),
                                                   script=script)
        except (NodeUnavailable, asyncio.TimeoutError) as err:
            log.warning("launch of job %s on %s deferred: %s", job.id, node, err)
            return None
        return {**reply, "node": node}

    def _run_as(self, job: Job, node_name: str) -> tuple[str, ...]:
        """With ``run_as: submitter``, the prefix that runs the job as its owner on the node.

        A nodelet running as root switches with runuser; any other login user needs a
        sudoers rule allowing ``sudo -n -u USER`` (README, "Jobs run as their owner").
        """
        node = self.config.node(node_name)
        if self.config.run_as != "submitter" or job.user == node.user:
            return ()
        if self.nodes[node_name].hello.get("uid") == 0:
            return ("runuser", "-u", job.user, "--")
        return ("sudo", "-n", "-u", job.user, "--")

    def _mark_running(self, job: Job) -> None:
        now = self.clock()
        self.store.mark_running(job.id, now)
        job = replace(job, state=JobState.RUNNING, started_at=now)
        self.jobs[job.id] = job
        self.publish_job(job)

    def _finish(self, job: Job, state: JobState, code: int | None, reason: str) -> None:
        now = self.clock()
        self.store.finish_job(job.id, state, now, exit_code=code, reason=reason)
        self.jobs.pop(job.id, None)
        self._node_exits.pop(job.id, None)
        self._shares = None  # its hours now count towards its user's weight
        self._cancelling.discard(job.id)
        done = replace(job, state=state, exit_code=code, reason=reason, ended_at=now)
        self.publish_job(done)
        for node in job_nodes(job):
            self.publish_gpus(node)
        for waiter in self._finished_waiters.pop(job.id, []):
            if not waiter.done():
                waiter.set_result(done)
        self.wake()

    # ------------------------------------------------------ client requests
    def submit(self, user: str, spec: JobSpec) -> Job:
        """Accept a job, or refuse it in one sentence (quota, priority, dependencies)."""
        if spec.priority > 0 and not self.is_admin(user):
            raise RequestError(f"only an admin ({self._admins_text()}) may raise a job's priority")
        missing = [d for d in spec.after if d not in self.jobs and self.store.job(d) is None]
        if missing:
            raise RequestError(f"--after names no job {missing[0]}; `nebula queue` lists the jobs")
        share = self.shares().get(user)
        if share is not None and share.refusal:
            raise RequestError(share.refusal)
        job = self.store.add_job(user, spec, self.clock())
        self.jobs[job.id] = job
        self.publish_job(job)
        self.wake(capacity=False)
        return job

    def job(self, job_id: int) -> Job:
        job = self.jobs.get(job_id) or self.store.job(job_id)
        if job is None:
            raise RequestError(f"no job {job_id}; `nebula queue` lists the jobs")
        return job

    def is_admin(self, user: str) -> bool:
        """Admins: root, the service's own account, the config's admins and admin_group."""
        if user in ("root", self.owner) or user in self.config.admins:
            return True
        group = self.config.admin_group
        return bool(group) and user in _group_members(group)

    def may_manage(self, user: str, job: Job) -> bool:
        return user == job.user or self.is_admin(user)

    def _admins_text(self) -> str:
        names = ", ".join(sorted({"root", self.owner, *self.config.admins}))
        return names + (f", group {self.config.admin_group}" if self.config.admin_group else "")

    def _check_may_manage(self, user: str, job: Job, verb: str) -> None:
        if not self.may_manage(user, job):
            raise RequestError(f"job {job.id} belongs to {job.user}; only they or an admin "
                               f"({self._admins_text()}) may {verb} it")

    def _check_admin(self, user: str, what: str) -> None:
        if not self.is_admin(user):
            raise RequestError(f"only an admin ({self._admins_text()}) may {what}")

    def set_held(self, user: str, job_id: int, hold: bool) -> Job:
        job = self.job(job_id)
        self._check_may_manage(user, job, "hold" if hold else "release")
        if job.state != JobState.PENDING:
            raise RequestError(f"job {job_id} is {job.state.value}; only waiting jobs can be "
                               f"{'held' if hold else 'released'}")
        self.store.set_held(job.id, user if hold else None, user, self.clock())
        job = replace(job, held_by=user if hold else None,
                      reason=f"held by {user}; `nebula release {job.id}` lets it run" if hold
                      else "waiting for the scheduler")
        self.jobs[job.id] = job
        self.publish_job(job)
        self.wake()
        return job

    def set_drained(self, user: str, node: str, drained: bool, reason: str = "") -> NodeView:
        self._check_admin(user, "drain or resume nodes")
        view = self.nodes.get(node)
        if view is None:
            raise RequestError(f"no node {node}; known: {', '.join(self.nodes)}")
        self.store.set_drained(node, drained, reason, user, self.clock())
        view.drained, view.drain_reason = drained, reason if drained else ""
        self.publish({"type": "node", "node": view.json()})
        self.publish_gpus(node)
        self.wake()
        return view

    def plan(self, user: str, spec: JobSpec) -> dict:
        """Where a job would go now, or why it would wait: the submit form's preview."""
        probe = Job(id=-1, user=user, spec=spec, state=JobState.PENDING, submitted_at=self.clock())
        pending = [j for j in self.jobs.values() if j.state == JobState.PENDING and not j.held_by]
        for decision in scheduler.schedule(self._snapshot_for(pending + [probe])):
            if decision.job_id != -1:
                continue
            if isinstance(decision, scheduler.Start):
                return {"decision": "start", "gpus": [
                    {"node": p.node, "index": p.gpu_index, "uuid": p.gpu_uuid,
                     "memory_mb": p.memory_mb, "exclusive": p.exclusive}
                    for p in decision.placements]}
            return {"decision": "wait", "reason": decision.reason}
        return {"decision": "wait", "reason": "not considered"}

    def attach_argv(self, user: str, job_id: int) -> list[str]:
        """The ssh command that attaches a terminal to the job's tmux session (R13)."""
        job = self.job(job_id)
        self._check_may_manage(user, job, "attach to")
        if not job.state.holds_gpus or not job.node:
            raise RequestError(f"job {job_id} is {job.state.value}; only a running job has a session")
        node = self.config.node(job.node)
        argv = ["ssh", "-t", "-p", str(node.port), "-o", f"UserKnownHostsFile={node.known_hosts}",
                "-o", "StrictHostKeyChecking=yes"]
        if node.identity:
            argv += ["-i", node.identity]
        return argv + [f"{node.user}@{node.host}", f"tmux -L nebula attach -t =nebula-{job.id}"]

    def history(self, gpu: str, since_s: float) -> list[dict]:
        if gpu not in self.gpus:
            raise RequestError(f"no GPU {gpu}; `nebula gpus` lists them (uuid, or node:index)")
        return self.store.telemetry(gpu, self.clock() - since_s)

    def resolve_gpu(self, name: str) -> str:
        """A GPU named by uuid or as node:index."""
        if name in self.gpus:
            return name
        node, _, index = name.partition(":")
        for uuid, live in self.gpus.items():
            if live.node == node and str(live.reading.index) == index:
                return uuid
        raise RequestError(f"no GPU {name}; name it by uuid or as node:index (e.g. node01:0)")

    async def cancel(self, user: str, job_id: int) -> Job:
        job = self.job(job_id)
        self._check_may_manage(user, job, "cancel")
        if job.state.finished:
            raise RequestError(f"job {job_id} already {job.state.value}")
        if job.state == JobState.PENDING:
            if user != job.user:
                self.store.add_event("admin", f"{user} cancelled job {job_id} of {job.user}",
                                     job_id=job_id, user=user)
            self._finish(job, JobState.CANCELLED, None, f"cancelled by {user}")
            return self.job(job_id)
        self._cancelling.add(job.id)
        self.store.request_cancel(job.id, user, self.clock(), audit=user != job.user)
        self._spawn(self._cancel_on_node(job), f"cancel-{job.id}")
        return job

    async def _cancel_on_node(self, job: Job, only: str | None = None) -> None:
        for node in job_nodes(job):
            if only is not None and node != only:
                continue
            try:
                await self.links[node].request("cancel", timeout=CANCEL_GRACE_S + 30,
                                               job=job.id, grace=CANCEL_GRACE_S)
            except (NodeUnavailable, asyncio.TimeoutError) as err:
                log.warning("cancel of job %s on %s waits for the node: %s", job.id, node, err)

    async def wait_finished(self, job_id: int) -> Job:
        job = self.job(job_id)
        if job.state.finished:
            return job
        future = asyncio.get_running_loop().create_future()
        self._finished_waiters[job_id].append(future)
        return await future

    async def read_log(self, user: str, job_id: int, offset: int) -> dict:
        job = self.job(job_id)
        self._check_may_manage(user, job, "read the log of")
        if not job.node:
            return {"data": "", "offset": offset, "state": job.state.value}
        try:
            reply = await self.links[job.node].request("log", job=job.id, offset=offset)
        except (NodeUnavailable, asyncio.TimeoutError) as err:
            raise RequestError(f"cannot read the log of job {job_id}: {err}") from None
        return {"data": reply.get("data", ""), "offset": reply.get("offset", offset),
                "state": self.job(job_id).state.value}

    # ------------------------------------------------------- phase 4: publish
    def subscribe(self, queue: asyncio.Queue) -> dict:
        """A new subscriber: returns the snapshot it starts from, and puts every event
        from now on in ``queue`` (``unsubscribe`` stops that).

        "gpus" events carry changes against what subscribers already hold, so the snapshot
        must be exactly that: GPUs that changed since their node's last event (or while
        nobody listened) are first sent to the subscribers already listening, as events.
        """
        snap = self.snapshot()
        by_node: dict[str, list[dict]] = {name: [] for name in self._published}
        for gpu in snap["gpus"]:
            by_node.setdefault(gpu["node"], []).append(gpu)
        for node, gpus in by_node.items():
            event = self._gpu_changes(node, gpus)
            if event["gpus"] or "gone" in event:
                self.publish(event)
            if not gpus:
                del self._published[node]
        self.subscribers.add(queue)
        return snap

    def unsubscribe(self, queue: asyncio.Queue) -> None:
        self.subscribers.discard(queue)

    def snapshot(self) -> dict:
        """The whole state a subscriber starts from (GPUs without the raw probe reading,
        like the stream's: `nebula gpus` has it, no subscriber shows it)."""
        nodes = [n.json() for n in self.nodes.values()]
        gpus = self.gpus_json(raw=False)
        return {"nodes": nodes, "gpus": gpus, "jobs": self.queue_json(),
                "summary": views.status_summary(nodes, gpus),
                "events": self.store.events(30)}

    def gpus_json(self, node: str | None = None, raw: bool = True) -> list[dict]:
        return [self._gpu_json(g, raw) for g in self.gpu_views(node)]

    def _gpu_json(self, gpu: GpuView, raw: bool = True) -> dict:
        node = self.nodes[gpu.node]
        live = self.gpus[gpu.uuid]
        processes = [{"pid": p.pid, "name": p.name, "used_memory_mb": p.used_memory_mb,
                      "job_id": _int_or_none(live.process_jobs.get(str(p.pid)))}
                     for p in live.processes]
        return views.gpu_json(gpu, node_up=node.state == NodeState.UP,
                              cuda_version=node.cuda_version,
                              nvlink=topo.nvlink_peers(node.topo, gpu.reading.index),
                              processes=processes, raw=raw)

    def users_json(self) -> list[dict]:
        running: dict[str, int] = defaultdict(int)
        for job in self.jobs.values():
            if job.state.holds_gpus:
                running[job.user] += 1
        shares = self.shares()
        month = self.store.usage_since(month_start(self.clock()))
        rows = []
        for row in self.store.users():
            name = row["name"]
            rows.append({**row, "running_jobs": running.get(name, 0),
                         "weight": round(shares[name].weight, 4) if name in shares else 1.0,
                         "month_gpu_hours": round(month.get(name, 0.0), 4),
                         "quota_gpu_hours": self.settings.quota_gpu_hours
                         if row.get("quota_gpu_hours") is None else row["quota_gpu_hours"]})
        return rows

    async def node_key(self, user: str, host: str, port: int) -> str:
        """The fingerprint of the host key a would-be node presents (the trust step)."""
        self._check_admin(user, "add nodes")
        try:
            return (await node_admin.read_host_key(host, port))[1]
        except node_admin.NodeAdminError as err:
            raise RequestError(str(err)) from None

    async def add_node(self, user: str, name: str, host: str, port: int, login: str | None,
                       identity: str | None, trust: str) -> dict:
        """R21: add a node to the cluster file, trusting the host key the admin confirmed."""
        self._check_admin(user, "add nodes")
        if self.config.path is None:
            raise RequestError("this service was started without a cluster file")
        try:
            key_line, fingerprint = await node_admin.read_host_key(host, port)
            node_admin.add_node(self.config.path, name, host, port, login, identity, key_line,
                                fingerprint, trust)
        except node_admin.NodeAdminError as err:
            raise RequestError(str(err)) from None
        return await self.reload(user)

    async def remove_node(self, user: str, name: str) -> dict:
        self._check_admin(user, "remove nodes")
        if name not in self.nodes:
            raise RequestError(f"no node {name}; known: {', '.join(self.nodes)}")
        if any(name in job_nodes(j) for j in self.jobs.values()):
            raise RequestError(f"{name} still holds jobs; drain it (nebula node drain {name}) "
                               "and remove it once they ended")
        try:
            node_admin.remove_node(self.config.path, name)
        except node_admin.NodeAdminError as err:
            raise RequestError(str(err)) from None
        return await self.reload(user)

    async def reload(self, user: str) -> dict:
        """Read nodes.yaml again: start links to added nodes, stop those of removed ones.

        A node that still holds jobs cannot be removed (drain it and let them finish).
        Raises RequestError with the reason; the running config is kept then.
        """
        from .config import load_config

        self._check_admin(user, "reload the cluster file")
        if self.config.path is None:
            raise RequestError("this service was started without a cluster file")
        try:
            new = load_config(self.config.path)
        except ConfigError as err:
            raise RequestError(str(err)) from None
        names = {n.name for n in new.nodes}
        removed = [name for name in self.nodes if name not in names]
        busy = [n for n in removed if any(n in job_nodes(j) for j in self.jobs.values())]
        if busy:
            raise RequestError(f"{busy[0]} still holds jobs; drain it (nebula node drain {busy[0]}) "
                               "and remove it once they ended")
        self.config = new
        for name in removed:
            await self.links.pop(name).close()
            del self.nodes[name]
            for uuid in [u for u, live in self.gpus.items() if live.node == name]:
                del self.gpus[uuid]
            self.publish_gpus(name)  # its GPUs are gone from subscribers' views too
            self.store.add_event("admin", f"node {name} removed by {user}", node=name, user=user)
        added = [n for n in new.nodes if n.name not in self.nodes]
        for node in added:
            self.nodes[node.name] = NodeView(node.name, node.host, node.port, drained=node.drained)
            self.store.upsert_node(node.name, node.host, node.port, NodeState.CONNECTING.value)
            self.store.add_event("admin", f"node {node.name} added by {user}", node=node.name, user=user)
            link = NodeLink(node, self.config, self.on_node_message, self.on_node_state)
            self.links[node.name] = link
            link.start()
        for name in removed + [n.name for n in added]:
            self.publish({"type": "node", "node": self.nodes[name].json() if name in self.nodes
                          else {"name": name, "state": "removed"}})
        self.wake()
        return {"added": [n.name for n in added], "removed": removed}

    def set_quota(self, user: str, name: str, hours: float) -> None:
        self._check_admin(user, "set quotas")
        self.store.set_quota(name, hours, user, self.clock())
        self._shares = None
        self.wake()

    def queue_json(self) -> list[dict]:
        order = {JobState.RUNNING: 0, JobState.LAUNCHING: 0, JobState.PENDING: 1}
        jobs = sorted(self.jobs.values(), key=lambda j: (order.get(j.state, 2), j.submitted_at, j.id))
        return [views.job_json(j) for j in jobs]

    def publish(self, event: dict) -> None:
        for queue in list(self.subscribers):
            queue.put_nowait(event)

    def publish_job(self, job: Job) -> None:
        if self.subscribers:
            self.publish({"type": "job", "job": views.job_json(job)})

    def publish_gpus(self, node: str) -> None:
        """One "gpus" event for ``node`` (after each of its probes, and after anything that
        changes what its GPUs show): what changed since its last one (see ``_gpu_changes``).
        Sent even when nothing changed: the node reported, and trends take a point."""
        if self.subscribers:
            # Every node, every probe: the stream leaves out the raw reading (`nebula gpus`
            # has it), which no subscriber shows.
            self.publish(self._gpu_changes(node, self.gpus_json(node, raw=False)))

    def _gpu_changes(self, node: str, gpus: list[dict]) -> dict:
        """The "gpus" event that brings subscribers from what they hold of ``node``'s GPUs
        to ``gpus`` (and makes ``gpus`` what they hold):

        ``{"type": "gpus", "node": N, "gpus": {uuid: fields}, "gone": [uuid, …]}``: for a
        GPU new to subscribers (or whose set of fields changed) ``fields`` is the whole GPU
        (it has ``"uuid"``); otherwise only the fields whose value changed, and GPUs with
        none are left out. ``gone`` (only when some left) lists GPUs no longer on ``N``.
        At 1 Hz from every node this is most of the stream: utilisation, temperature and
        power, a few dozen bytes a GPU, instead of every GPU's ~700-byte descriptor.
        """
        before = self._published.get(node, {})
        changes: dict[str, dict] = {}
        for gpu in gpus:
            old = before.get(gpu["uuid"])
            if old is None or old.keys() != gpu.keys():
                changes[gpu["uuid"]] = gpu
            elif old != gpu:
                changes[gpu["uuid"]] = {k: v for k, v in gpu.items() if old[k] != v}
        now = {gpu["uuid"]: gpu for gpu in gpus}
        self._published[node] = now
        event = {"type": "gpus", "node": node, "gpus": changes}
        gone = [uuid for uuid in before if uuid not in now]
        if gone:
            event["gone"] = gone
        return event
