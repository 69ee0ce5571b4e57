"""The nodes: their links, what they report, and the admins' changes to the set of them.

A node's link reports its state (``on_node_state``) and its nodelet's messages
(``on_node_message``): the hello (driver, topology), each probe (GPU readings, processes,
telemetry), job starts and exits (handed to the jobs room) and kernel lines (to the health
room). After every (re)connect the reconciler (``reconcile.py``) makes the node and the
store agree. Drain, resume, add, remove and reload change which nodes take work.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import node_admin, views
from ..config.cluster import load_config
from ..model import DEFAULT_VENDOR, ConfigError, GpuReading, NodeState, RequestError
from ..remote.protocol import Exit, Hello, KernelLines, Phase, Probe, Started, read_message
from ..remote.ssh import NodeLink
from ..store import StoreUnavailable
from ..units import duration_short
from ..wire import ReloadReply, ShownNode
from .access import Access
from .health import HealthMonitor
from .jobs import JobTransitions
from .reconcile import Reconciler
from .state import GpuLive, HeadState, Maintenance, NodeView, job_nodes
from .stream import Stream

log = logging.getLogger(__name__)

TELEMETRY_COMPACT_EVERY_S = 3600.0
#: A node that stays away is summed up in the events log this often (its retries are not).
DOWN_SUMMARY_EVERY_S = 3600.0
#: The most of a reason's full text kept for `nebula node show`.
DETAIL_MAX = 4096


class Fleet:
    def __init__(self, state: HeadState, stream: Stream, jobs: JobTransitions,
                 health: HealthMonitor, access: Access):
        self.state = state
        self.stream = stream
        self.transitions = jobs
        self.reconciler = Reconciler(state, jobs)
        self.health = health
        self.access = access
        #: told after each probe of a node (and its GPUs) was taken in: the engine wires
        #: the limits' check
        self.probed: Callable[[str, list[str]], None] = lambda node, uuids: None
        self._telemetry_at: dict[str, float] = {}
        self._compacted_at = 0.0

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Show the GPUs the store knows, and connect to every node of the config."""
        state = self.state
        self._register_known_gpus()
        stored = {row["name"]: row for row in state.store.nodes()}
        for node in state.config.nodes:
            state.store.upsert_node(node.name, node.host, node.port, NodeState.CONNECTING.value)
            if node.name in stored and stored[node.name].get("drained"):
                # An admin's drain outlives restarts; the config only gives the first state.
                view = state.nodes[node.name]
                view.drained, view.drain_reason = True, stored[node.name].get("drain_reason") or ""
            self._open_link(node)

    def _open_link(self, node) -> None:
        link = NodeLink(node, self.state.config, self.on_node_message, self.on_node_state,
                        head=self.state.store.head_token)
        self.state.links[node.name] = link
        link.start()

    async def close(self) -> None:
        await asyncio.gather(*(link.close() for link in self.state.links.values()),
                             return_exceptions=True)

    def _register_known_gpus(self) -> None:
        """GPUs the store knows stay visible (as unreachable) until their node answers; one
        it keeps in maintenance stays out until an admin resumes it, since the pipeline
        that isolated it is gone."""
        state = self.state
        for row in state.store.gpus():
            if row["node"] not in state.nodes:
                continue
            reading = GpuReading(index=row["idx"], uuid=row["uuid"], name=row["model"],
                                 pci_bus_id=row["pci_bus_id"], memory_total_mb=row["total_mb"],
                                 driver_version=row["driver_version"],
                                 compute_cap=row["compute_cap"], vendor=row["vendor"] or DEFAULT_VENDOR)
            maintenance = None
            if row["status"] == "maintenance":
                maintenance = Maintenance(row.get("status_reason")
                                          or "in maintenance before the head restarted",
                                          admin_only=True)
            state.gpus[row["uuid"]] = GpuLive(row["node"], reading, maintenance=maintenance)
            state.nodes[row["node"]].cuda_version = row["cuda_version"]

    # ------------------------------------------------------------ what nodes report
    def on_node_state(self, node: str, state: NodeState, reason: str) -> None:
        """The link's word on the node's reachability. A change of state is one event; a
        link retrying a node that stays away says so again at each attempt, which only
        counts (``failed_attempts``), summed up in the log at most once an hour and when
        the node is back. The reason shown is one line; the whole text is ``detail``."""
        view = self.state.nodes[node]
        now = self.state.clock()
        changed = state != view.state
        line = views.one_line(reason, limit=views.SENTENCE_MAX)  # the link's own words
        if changed:
            self._record(node, self._change_text(view, state, line))
            view.summarised_at = now
        if state == NodeState.UP:
            view.silent_since = None
        elif view.silent_since is None:
            view.silent_since = self.state.monotonic()
        elif now - (view.summarised_at or now) >= DOWN_SUMMARY_EVERY_S:  # (not up)
            away = self.state.monotonic() - view.silent_since
            self._record(node, f"{node} still {state.value} after {view.failed_attempts} "
                               f"attempts in {duration_short(away)}"
                               + (f": {line}" if line else ""))
            view.summarised_at = now
        view.failed_attempts = 0 if state == NodeState.UP else view.failed_attempts + 1
        detail = reason[:DETAIL_MAX] if reason != line else ""
        if not changed and (line, detail) == (view.reason, view.detail):
            return  # the same word again: nothing to store, publish or wake
        view.state, view.reason, view.detail = state, line, detail
        try:  # the store only keeps it for the record: the live view goes on without it
            self.state.store.upsert_node(node, view.host, view.port, state.value, line, view.last_seen)
        except StoreUnavailable as err:
            log.warning("%s is %s; not recorded: %s", node, state.value, err)
        self.stream.publish_node(view)
        if not changed:
            return
        self.stream.publish_gpus(node)
        if state == NodeState.UP:
            self.state.spawn(self.reconciler.reconcile(node), f"reconcile-{node}")
        self.state.wake()

    def _record(self, node: str, text: str) -> None:
        """A node's line of the events log; a store that cannot write it costs the line only."""
        try:
            self.state.record("node", text, node=node)
        except StoreUnavailable as err:
            log.warning("%s; not recorded: %s", text, err)

    def _change_text(self, view: NodeView, state: NodeState, line: str) -> str:
        text = f"{view.name} is {state.value}" + (f": {line}" if line else "")
        if state == NodeState.UP and view.failed_attempts:
            away = self.state.monotonic() - view.silent_since if view.silent_since else None
            text += (f" (after {view.failed_attempts} failed attempts"
                     + (f" in {duration_short(away)})" if away else ")"))
        return text

    def on_node_message(self, node: str, message: dict) -> None:
        """One line of ``node``'s nodelet: read once into its typed message
        (``remote/protocol.py``), which its handler takes."""
        try:
            typed = read_message(node, message)
            handlers: dict[type, Callable[[str, Any], None]] = {Hello: self._on_hello, Probe: self._on_probe,
                       Started: self.transitions.on_started, Exit: self.transitions.on_exit,
                       Phase: self.transitions.on_phase,
                       KernelLines: self.health.on_kernel_message}
            handler = handlers.get(type(typed))
            if handler is not None:
                handler(node, typed)
        except Exception:  # a strange message must never take the head down
            log.exception("could not handle %s from %s", message.get("type"), node)

    def _on_hello(self, node: str, message: Hello) -> None:
        view = self.state.nodes[node]
        view.hello = message
        # Ends the node reports from before now were not heard at once: each is charged
        # from when the node says, no earlier than the head last knew its jobs ran
        # (``JobTransitions.ended_at``).
        now = self.state.clock()
        known = max(view.last_seen or 0.0, self.state.store.alive_before or 0.0)
        view.unheard = (known, now) if known else None
        view.clock_offset = now - message.t if message.t is not None else 0.0
        # The highest job number the node holds of this store: never handed out again.
        self.state.store.raise_id_floor(message.max_job)
        view.cuda_version = message.cuda_version
        view.topo = message.topology or view.topo

    def _on_probe(self, node: str, message: Probe) -> None:
        state = self.state
        view = state.nodes[node]
        view.last_seen = state.clock()  # the head's time, like every other time it shows
        probe = message.view  # every vendor's devices, as GpuReadings
        readings, processes, problem = probe.readings, probe.processes, probe.problem
        for note in probe.notes:  # impossible readings the node clamped (R20)
            state.record("hardware", note, node=node)
        full = problem[:DETAIL_MAX]
        if full != (view.detail or view.reason):  # shown until a good probe clears it
            # One line on the card (a tool's raw output can be 500 characters of CSV);
            # the whole of it in `nebula node show`.
            line = views.one_line(problem)
            view.reason, view.detail = line, full if full != line else ""
            self.stream.publish_node(view)
        if not readings:
            return
        pid_jobs, pid_users = message.pid_jobs, message.pid_users
        # ours: jobs of this head that hold GPUs on this node (a NEBULA_JOB_ID of another
        # head's, or of a store long gone, is someone else's process like any other)
        here = {str(job) for r in readings for job in state.jobs.holding.get(r.uuid, ())}
        new_gpus = []
        for reading in readings:
            if not reading.uuid:
                continue
            procs = [p for p in processes if p.gpu_uuid == reading.uuid]
            job_used, owners = self._attribute(procs, pid_jobs, pid_users, here)
            unread = frozenset(int(pid_jobs[str(p.pid)]) for p in procs if p.used_memory_mb is None
                               and str(pid_jobs.get(str(p.pid))) in here)
            unmanaged = sum(mb for _, _, mb in owners)
            unreadable = reading.uuid in probe.unreadable
            if unreadable:  # who holds what is unknown: what our jobs did not reserve is not free
                unmanaged = self._held_beyond_reservations(reading)
            live = state.gpus.get(reading.uuid)
            if live is None or live.reading.memory_total_mb != reading.memory_total_mb \
                    or live.node != node:
                new_gpus.append(reading)
            changed = live is None or live.unmanaged_used_mb != unmanaged or live.job_used != job_used \
                or live.processes_unreadable != unreadable
            state.gpus[reading.uuid] = GpuLive(node, reading, procs, unmanaged,
                                               live.maintenance if live else None, pid_jobs,
                                               job_used, owners, unreadable, unread)
            if changed:
                state.wake()
        try:  # records only: the readings themselves are live already
            if new_gpus:
                state.store.register_gpus(node, [self._descriptor(node, r) for r in new_gpus],
                                          state.clock())
            self._record_telemetry(node, readings)
        except StoreUnavailable as err:
            log.warning("%s's readings not recorded: %s", node, err)
        self.health.on_probe(node, readings, pid_jobs)
        self.probed(node, [r.uuid for r in readings if r.uuid])
        self.stream.publish_gpus(node)

    def _held_beyond_reservations(self, reading: GpuReading) -> int:
        """The memory a card uses beyond what this head's jobs reserved on it (nothing, when
        one of them has it whole): held by someone the card's unreadable process list
        cannot name."""
        reserved = 0
        for job_id in self.state.jobs.holding.get(reading.uuid, ()):
            job = self.state.jobs.get(job_id)
            for placement in job.placements if job is not None else ():
                if placement.gpu_uuid == reading.uuid:
                    if placement.exclusive:
                        return 0
                    reserved += placement.memory_mb or 0
        return max(0, (reading.memory_used_mb or 0) - reserved)

    @staticmethod
    def _attribute(procs, pid_jobs: dict, pid_users: dict, ours: set[str]) -> tuple[dict[int, int], tuple]:
        """Each GPU process to its job (the nodelet found it below the job's tmux session or
        in the cgroup of the job's container: ``pid_jobs``; ``ours``: the ids that are this
        head's jobs here) or to its Unix owner: (MiB per job, ((pid, user, MiB), …) of the
        others)."""
        job_used: dict[int, int] = {}
        owners = []
        for proc in procs:
            mb = proc.used_memory_mb or 0
            job = pid_jobs.get(str(proc.pid))
            if job is not None and str(job) in ours:
                job_used[int(job)] = job_used.get(int(job), 0) + mb
            else:
                owners.append((proc.pid, pid_users.get(str(proc.pid)), mb))
        return job_used, tuple(owners)

    def _record_telemetry(self, node: str, readings: list[GpuReading]) -> None:
        """R18: at most one sample per GPU every ``accounting.telemetry_every`` (30 s),
        whatever the probe rate; each stands for the time since the node's previous one
        (at most twice the interval: a node that was away has no say about that time)."""
        now = self.state.clock()
        every = self.state.accounting.telemetry_every_s
        last = self._telemetry_at.get(node)
        if last is not None and now - last < every:
            return
        self._telemetry_at[node] = now
        span = every if last is None else min(now - last, 2 * every)
        self.state.store.record_telemetry([
            {"gpu": r.uuid, "t": now, "temperature_c": r.temperature_c,
             "utilization_pct": r.utilization_pct, "memory_used_mb": r.memory_used_mb,
             "power_w": r.power_w, "fan_pct": r.fan_pct, "sm_clock_mhz": r.sm_clock_mhz,
             "mem_clock_mhz": r.mem_clock_mhz, "span_s": span} for r in readings if r.uuid])
        if now - self._compacted_at > TELEMETRY_COMPACT_EVERY_S:
            self._compacted_at = now
            self.state.store.compact_telemetry(now)

    def _descriptor(self, node: str, r: GpuReading) -> dict:
        return {"uuid": r.uuid, "idx": r.index, "model": r.name, "vendor": r.vendor,
                "total_mb": r.memory_total_mb, "compute_cap": r.compute_cap,
                "pci_bus_id": r.pci_bus_id, "driver_version": r.driver_version,
                "cuda_version": self.state.nodes[node].cuda_version}

    # --------------------------------------------------------------------- one node
    def show(self, name: str) -> ShownNode:
        """`nebula node show`: the node with the whole of its reason (a tool's output, an
        error's text), its retries, host facts, GPUs, jobs and latest events."""
        view = self.state.node(name)
        state = self.state
        return {**view.json(), "detail": view.detail or view.reason,
                "drain_reason": view.drain_reason, "failed_attempts": view.failed_attempts,
                "silent_since": (None if view.silent_since is None  # a wall-clock time, as shown
                                 else state.clock() - (state.monotonic() - view.silent_since)),
                "health_score": round(state.health_score(name), 3),
                "cuda_version": view.cuda_version,
                "facts": {"hostname": view.hello.hostname, "python": view.hello.python,
                          "uid": view.hello.uid, "node_dir": view.hello.node_dir},
                "platform": view.hello.platform,
                "gpus": self.stream.gpus_json(name, raw=False),
                "jobs": sorted(j.id for j in state.jobs.values() if name in job_nodes(j)),
                "events": state.store.events(20, node=name)}

    # --------------------------------------------------------------- admins' changes
    def set_drained(self, user: str, node: str, drained: bool, reason: str = "") -> NodeView:
        self.access.check_admin(user, "drain or resume nodes")
        view = self.state.node(node)
        self.state.store.set_drained(node, drained, reason, user, self.state.clock())
        view.drained, view.drain_reason = drained, reason if drained else ""
        self.stream.publish_node(view)
        self.stream.publish_gpus(node)
        self.state.wake()
        return view

    async def node_key(self, user: str, host: str, port: int) -> str:
        """The fingerprint of the host key a would-be node presents (the trust step)."""
        self.access.check_admin(user, "add nodes")
        try:
            node_admin.check_address_free(self.state.config, host, port)
            return (await node_admin.read_host_key(host, port))[1]
        except node_admin.NodeAdminError as err:
            raise RequestError(str(err)) from None

    async def add_node(self, user: str, name: str, host: str, port: int, login: str | None,
                       identity: str | None, trust: str) -> ReloadReply:
        """R21: add a node to the cluster file, trusting the host key the admin confirmed."""
        self.access.check_admin(user, "add nodes")
        path = self._cluster_file()
        try:
            key_line, fingerprint = await node_admin.read_host_key(host, port)
            node_admin.add_node(path, name, host, port, login, identity, key_line, fingerprint, trust)
        except node_admin.NodeAdminError as err:
            raise RequestError(str(err)) from None
        except OSError as err:
            raise RequestError(node_admin.cannot_write(err, path)) from None
        return await self.reload(user)

    async def remove_node(self, user: str, name: str) -> ReloadReply:
        self.access.check_admin(user, "remove nodes")
        self.state.node(name)
        if self._holds_jobs(name):
            raise RequestError(f"{name} still holds jobs; drain it (nebula node drain {name}) "
                               "and remove it once they ended")
        path = self._cluster_file()  # (without one, removing failed on None, a traceback)
        try:
            node_admin.remove_node(path, name)
        except node_admin.NodeAdminError as err:
            raise RequestError(str(err)) from None
        except OSError as err:
            raise RequestError(node_admin.cannot_write(err, path)) from None
        return await self.reload(user)

    def _cluster_file(self) -> Path:
        """The file nodes are added to, removed from and reloaded from; a refusal when the
        service was started without one."""
        if self.state.config.path is None:
            raise RequestError("this service was started without a cluster file")
        return self.state.config.path

    def _holds_jobs(self, node: str) -> bool:
        return any(node in job_nodes(j) for j in self.state.jobs.values())

    async def reload(self, user: str) -> ReloadReply:
        """Read nodes.yaml again: start links to added nodes, stop those of removed ones.

        A node that still holds jobs cannot be removed (drain it and let them finish).
        Raises RequestError with the reason; the running config is kept then.
        """
        state = self.state
        self.access.check_admin(user, "reload the cluster file")
        path = self._cluster_file()
        try:  # in a thread: a big or hostile file must not stop the head answering
            new = await asyncio.to_thread(load_config, path)
        except ConfigError as err:
            raise RequestError(str(err)) from None
        names = {n.name for n in new.nodes}
        removed = [name for name in state.nodes if name not in names]
        busy = [n for n in removed if self._holds_jobs(n)]
        if busy:
            raise RequestError(f"{busy[0]} still holds jobs; drain it (nebula node drain {busy[0]}) "
                               "and remove it once they ended")
        old, state.config = state.config, new
        drained: list[str] = []  # what the file changed; what it left keeps an admin's drain
        resumed: list[str] = []
        for name, now in node_admin.drained_changes(old, new):
            if name in state.nodes and name not in removed:
                self.set_drained(user, name, now, f"{path.name} says so" if now else "")
                (drained if now else resumed).append(name)
        sections, restart_for = node_admin.changed_sections(old, new)
        if "scheduler" in sections:  # weights, quota, decay: the next pass uses them
            state.settings = new.scheduler
        for name in removed:
            await state.links.pop(name).close()
            del state.nodes[name]
            for uuid in [u for u, live in state.gpus.items() if live.node == name]:
                del state.gpus[uuid]
            self.stream.publish_gpus(name)  # its GPUs are gone from subscribers' views too
            state.record("admin", f"node {name} removed by {user}", node=name, user=user)
        added = [n for n in new.nodes if n.name not in state.nodes]
        for node in added:
            state.nodes[node.name] = NodeView(node.name, node.host, node.port, drained=node.drained,
                                              power_budget_w=node.power_budget_w)
            state.store.upsert_node(node.name, node.host, node.port, NodeState.CONNECTING.value)
            state.record("admin", f"node {node.name} added by {user}", node=node.name, user=user)
            self._open_link(node)
        for name in removed + [n.name for n in added]:
            self.stream.publish({"type": "node", "node": state.nodes[name].json()
                                 if name in state.nodes else {"name": name, "state": "removed"}})
        state.wake()
        return {"added": [n.name for n in added], "removed": removed, "drained": drained,
                "resumed": resumed, "sections": sections, "restart_for": restart_for}
