"""GPU health on the head: kernel messages and readings in, protective actions out.

The decisions are pure and live in :mod:`nebula_tui.scheduler.health` (which Xid means
what, what counts as throttling, how a self-test is judged); this module carries them out
with the engine and the node links, and records every step as an event (kinds ``xid`` and
``health``; ``nebula events`` and the TUI show them).

* **Xid errors (R16).** Each probe's new kernel lines arrive as a ``kmsg`` message; the
  Xid events in them are mapped to a GPU by PCI address and decided per the policies of
  nodes.yaml's ``health.xid_policies`` (defaults in ``DEFAULT_POLICIES``).
* **Isolation (R17),** one asyncio task per GPU: the GPU goes to maintenance with its
  reason; its jobs get SIGUSR1 (checkpoint now); those still alive after
  ``health.isolation_grace`` get SIGKILL; each is requeued (``--no-requeue``: failed); the
  card is reset unless it fell off the bus; the self-test runs; the GPU is back in service
  when it passes, unless its policy says only an admin brings it back (``nebula gpu
  resume``). A failed reset or self-test keeps it out until an admin resumes it.
* **Throttling (R19).** A card that turns hot, idle and below its base clock is one
  throttling event; events lower the node's health score, which the scheduler reads
  (``GpuView.health_score``); the score recovers by itself over hours.

Maintenance is kept in the store: after a restart of the head such a GPU stays out until
an admin resumes it. Not kept: the Xid history (the repeat window starts again) and
throttling events.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict
from typing import TYPE_CHECKING

from .model import GpuReading, JobState, RequestError
from .remote.backends import xid
from .remote.ssh import NodeUnavailable
from .scheduler.health import (BUS_FALL_CODE, Action, decide, forget_before, health_score,
                               is_throttling, judge_selftest)
from .settings import HealthSettings

if TYPE_CHECKING:
    from .engine import Engine
    from .model import Job

log = logging.getLogger(__name__)

#: How long the node may take for a self-test (dcgmi diag -r 1 takes about a minute).
SELFTEST_TIMEOUT_S = 660.0
#: How long a reset may take.
RESET_TIMEOUT_S = 150.0
#: While waiting out the grace: how often to look whether the evicted jobs are gone.
EVICT_POLL_S = 0.2
#: Xid history older than this is dropped (longer than any sensible repeat window).
XID_HISTORY_S = 86400.0
#: Without a base clock from the driver, R19 compares with this share of the max SM clock
#: (base clocks sit between about 65 % and 90 % of the max).
BASE_CLOCK_OF_MAX = 0.8


class HealthMonitor:
    """The engine's health companion; the engine calls :meth:`on_kernel_message`,
    :meth:`on_probe`, :meth:`takes_exit`, :meth:`score`, :meth:`reason` and :meth:`resume`.
    """

    def __init__(self, engine: "Engine"):
        self.engine = engine
        settings = engine.config.health or HealthSettings()
        self.policies = settings.policies
        self.grace_s = settings.isolation_grace_s
        self.selftest_command = settings.selftest_command
        # gpu -> (time, code) of its recent Xid events, for the repeat windows
        self._xids: dict[str, list[tuple[float, int | None]]] = defaultdict(list)
        self._reasons: dict[str, str] = {}  # GPU in maintenance -> why (shown as "blocked")
        self._admin_only: set[str] = set()  # GPUs only `nebula gpu resume` brings back
        self._tasks: dict[str, tuple[str, asyncio.Task]] = {}  # gpu -> (kind, pipeline)
        self._evicting: dict[int, str] = {}  # job id -> why: "GPU node01:0 was isolated (…)"
        self._putting_back: set[int] = set()
        self._pid_jobs: dict[str, dict[str, str]] = {}  # node -> pid -> job id (last probe)
        self._base_clocks: dict[str, tuple[int, dict[str, float]]] = {}  # node -> (hello id, …)
        self._throttling: set[str] = set()  # GPUs in a throttling episode now
        self._throttle_events: dict[str, list[float]] = defaultdict(list)  # node -> times
        self._kmsg_errors: dict[str, str] = {}

    # ------------------------------------------------------------------ queries
    def score(self, node: str) -> float:
        """The node's health score now (R19): 1.0 healthy, lower after throttling."""
        events = self._throttle_events.get(node)
        return health_score(events, self.engine.clock()) if events else 1.0

    def reason(self, gpu: str) -> str | None:
        """Why a GPU is in maintenance, when this monitor put it there."""
        return self._reasons.get(gpu)

    def _label(self, gpu: str) -> str:
        live = self.engine.gpus.get(gpu)
        return f"{live.node}:{live.reading.index}" if live else gpu

    def _event(self, kind: str, message: str, gpu: str | None = None, node: str | None = None,
               job_id: int | None = None) -> None:
        if gpu and not node and gpu in self.engine.gpus:
            node = self.engine.gpus[gpu].node
        self.engine.store.add_event(kind, message, node=node, gpu=gpu, job_id=job_id)
        self.engine.publish({"type": "event", "event": {"t": time.time(), "kind": kind,
                                                        "message": message, "node": node,
                                                        "gpu": gpu, "job_id": job_id}})

    # ------------------------------------------------------------- kernel log (R16)
    def on_kernel_message(self, node: str, message: dict) -> None:
        """A ``kmsg`` message: new kernel lines of ``node`` (or why they cannot be read)."""
        error = message.get("error") or ""
        if error != self._kmsg_errors.get(node, ""):
            self._kmsg_errors[node] = error
            if error:
                self._event("health", f"{node}: {error}; its Xid errors go unseen", node=node)
        lines = message.get("lines") or []
        if lines:
            pid_jobs = {**self._pid_jobs.get(node, {}), **(message.get("pid_jobs") or {})}
            self.on_kernel_lines(node, lines, pid_jobs)

    def on_kernel_lines(self, node: str, lines: list[str],
                        pid_jobs: dict[str, str] | None = None) -> None:
        """Parse the lines, map each Xid event to a GPU of ``node`` and act on it."""
        for event in xid.parse_xid("\n".join(lines)):
            gpu = self._gpu_of(node, event)
            if gpu is None:
                self._event("xid", f"{node}: Xid {event['code']} at PCI {event['pci']}, which is "
                                   f"none of {node}'s GPUs: recorded ({event['text'][:200]})",
                            node=node)
                continue
            self.on_xid(gpu, event, pid_jobs or {})

    def _gpu_of(self, node: str, event: dict) -> str | None:
        candidates = {uuid: live for uuid, live in self.engine.gpus.items() if live.node == node}
        if event.get("uuid") in candidates:
            return event["uuid"]
        for uuid, live in candidates.items():
            if live.reading.pci_bus_id and xid.pci_matches(event["pci"], live.reading.pci_bus_id):
                return uuid
        return None

    def on_xid(self, gpu: str, event: dict, pid_jobs: dict[str, str]) -> None:
        now = self.engine.clock()
        label = self._label(gpu)
        history = self._xids[gpu]
        action = decide(event, history, now, self.policies, gpu=label)
        history.append((now, event.get("code")))
        history[:] = [(t, c) for t, c in history if now - t <= XID_HISTORY_S]
        self._event("xid", f"{label}: {action.reason}", gpu=gpu)
        if action.kind == "fail_job":
            self._fail_job(gpu, action, pid_jobs)
        elif action.kind == "selftest":
            self._start(gpu, "selftest", self._check(gpu, action))
        elif action.kind in ("isolate", "reset"):
            self._start(gpu, "isolate", self._isolate(gpu, action))

    def _start(self, gpu: str, kind: str, coro) -> None:
        """One pipeline per GPU. An isolation replaces a self-test; anything else that
        arrives meanwhile is recorded only (its event is written already)."""
        running = self._tasks.get(gpu)
        live = self.engine.gpus.get(gpu)
        if running and not running[1].done():
            if kind == "isolate" and running[0] == "selftest":
                running[1].cancel()
            else:
                coro.close()
                return
        elif live is not None and live.maintenance and kind == "selftest":
            coro.close()  # already out of service: nothing to test while it waits
            return
        task = asyncio.get_running_loop().create_task(self._guarded(gpu, coro),
                                                      name=f"health-{kind}-{gpu}")
        self._tasks[gpu] = (kind, task)
        self.engine._tasks.add(task)  # cancelled with the engine's other tasks on stop
        task.add_done_callback(self.engine._tasks.discard)

    async def _guarded(self, gpu: str, coro) -> None:
        try:
            await coro
        except asyncio.CancelledError:
            raise
        except Exception:  # a pipeline that breaks must leave an event, not a silent GPU
            log.exception("health pipeline of %s failed", gpu)
            self._event("health", f"{self._label(gpu)}: the health pipeline failed "
                                  "(see the service log); the GPU stays as it is", gpu=gpu)

    # ------------------------------------------------------------------ fail a job
    def _fail_job(self, gpu: str, action: Action, pid_jobs: dict[str, str]) -> None:
        engine = self.engine
        node, label = engine.gpus[gpu].node, self._label(gpu)
        job_id = pid_jobs.get(str(action.pid))
        job = engine.jobs.get(int(job_id)) if job_id and str(job_id).isdigit() else None
        if job is None or node not in _nodes_of(job) or not job.state.holds_gpus:
            self._event("xid", f"{label}: pid {action.pid} is not a process of a running "
                               "NebulaGrid job; no job failed", gpu=gpu)
            return
        meaning = xid.meaning(action.code)
        engine._finish(job, JobState.FAILED, None,
                       f"Xid {action.code} ({meaning}) on {label} caused by its pid "
                       f"{action.pid}; the GPU keeps serving")
        for where in _nodes_of(job):
            engine._spawn(self._signal(where, job.id, "KILL"), f"xid-kill-{job.id}-{where}")

    async def _signal(self, node: str, job_id: int, name: str) -> dict:
        try:
            return await self.engine.links[node].request("signal", job=job_id, signal=name)
        except (NodeUnavailable, asyncio.TimeoutError) as err:
            # A node that is away stops the stale session when it reconnects (reconcile).
            log.warning("SIG%s to job %s on %s not sent: %s", name, job_id, node, err)
            return {"ok": False, "error": str(err)}

    # ----------------------------------------------------------- pipelines (R17)
    async def _check(self, gpu: str, action: Action) -> None:
        """A self-test while the GPU keeps serving; a failure isolates it."""
        passed, sentence = await self._selftest(gpu)
        label = self._label(gpu)
        if passed:
            self._event("health", f"{label} keeps serving: {sentence}", gpu=gpu)
            return
        code = BUS_FALL_CODE if action.code is None else action.code
        policy = self.policies.get(code)
        admin = bool(policy and policy.admin_resume)
        tail = (f"check the card, then `nebula gpu resume {label}`" if admin
                else "its jobs are checkpointed and requeued")
        await self._isolate(gpu, Action("isolate", admin, f"Xid {action.code} "
                                        f"({xid.meaning(action.code)}) and a failed self-test: "
                                        f"isolated; {tail}", None, action.code))

    async def _isolate(self, gpu: str, action: Action) -> None:
        engine = self.engine
        live = engine.gpus[gpu]
        node, label = live.node, self._label(gpu)
        if action.admin_resume:
            self._admin_only.add(gpu)
        self._set_maintenance(gpu, action.reason)
        self._event("health", f"{label} in maintenance: {action.reason}", gpu=gpu)
        # The cause alone ("Xid 48 (double-bit ECC error)"), for the requeued jobs' reason.
        await self._evict(gpu, f"GPU {label} was isolated ({action.reason.split(': ')[0]})")
        # A card that fell off the bus cannot be reset (and only a person can bring it back).
        if action.code not in (None, BUS_FALL_CODE):
            ok, detail = await self._reset(gpu)
            if not ok:
                self._keep_out(gpu, f"{action.reason}; the reset failed ({detail})")
                return
        passed, sentence = await self._selftest(gpu)
        if not passed:
            self._keep_out(gpu, f"{action.reason}; {sentence}")
        elif gpu in self._admin_only:
            self._reasons[gpu] = f"{action.reason} ({sentence})"
            self._event("health", f"{label} stays in maintenance until an admin resumes it "
                                  f"(`nebula gpu resume {label}`): {sentence}", gpu=gpu)
            engine.publish_gpus(node)
        else:
            self._restore(gpu, f"{label} back in service: {sentence}")

    def _keep_out(self, gpu: str, why: str) -> None:
        label = self._label(gpu)
        self._admin_only.add(gpu)
        self._reasons[gpu] = f"{why}; `nebula gpu resume {label}` once it is fixed"
        self._event("health", f"{label} stays in maintenance: {self._reasons[gpu]}", gpu=gpu)
        self.engine.publish_gpus(self.engine.gpus[gpu].node)

    def _set_maintenance(self, gpu: str, reason: str) -> None:
        live = self.engine.gpus[gpu]
        live.maintenance = True
        self._reasons[gpu] = reason
        self.engine.store.set_gpu_status(gpu, "maintenance", reason)
        self.engine.publish_gpus(live.node)

    def adopt(self, gpu: str, reason: str | None) -> None:
        """A GPU the store says is in maintenance (the head restarted): it stays out until
        an admin resumes it, since the pipeline that isolated it is gone."""
        self._reasons[gpu] = reason or "in maintenance before the head restarted"
        self._admin_only.add(gpu)

    def _restore(self, gpu: str, message: str) -> None:
        live = self.engine.gpus[gpu]
        live.maintenance = False
        self.engine.store.set_gpu_status(gpu, "ok")
        self._reasons.pop(gpu, None)
        self._admin_only.discard(gpu)
        self._event("health", message, gpu=gpu)
        self.engine.publish_gpus(live.node)
        self.engine.wake()

    async def _evict(self, gpu: str, why: str) -> None:
        """SIGUSR1 to the GPU's jobs, SIGKILL after the grace to those still alive; each
        ends requeued (or failed with --no-requeue) — by its own exit or by the kill."""
        engine = self.engine
        node, label = engine.gpus[gpu].node, self._label(gpu)
        jobs = [j for j in engine.jobs.values()
                if j.state.holds_gpus and any(p.gpu_uuid == gpu for p in j.placements)]
        if not jobs:
            return
        for job in jobs:
            self._evicting[job.id] = why
        ids = ", ".join(str(j.id) for j in jobs)
        self._event("health", f"{label}: SIGUSR1 to job{'s' if len(jobs) > 1 else ''} {ids} "
                              f"(checkpoint now); SIGKILL in {self.grace_s:g} s if still running",
                    gpu=gpu)
        await asyncio.gather(*(self._signal(where, j.id, "USR1") for j in jobs
                               for where in _nodes_of(j)))
        deadline = time.monotonic() + self.grace_s
        while time.monotonic() < deadline and any(j.id in self._evicting for j in jobs):
            await asyncio.sleep(EVICT_POLL_S)
        for job in jobs:
            if job.id not in self._evicting:
                continue  # it ended by itself (takes_exit put it back)
            self._event("health", f"job {job.id} still running {self.grace_s:g} s after SIGUSR1: "
                                  "SIGKILL", gpu=gpu, job_id=job.id)
            await self._put_back(job.id, kill=True)

    def takes_exit(self, job: "Job", code: int | None) -> bool:
        """The engine asks before ending a job that exited: True when the job was being
        evicted from an isolated GPU — it is then requeued (or failed), not ended."""
        if job.id not in self._evicting:
            return False
        if job.id in self._putting_back:
            return True  # another node's part of the same gang
        detail = f"exit code {code}" if code is not None else "no exit code"
        self._event("health", f"job {job.id} ended after SIGUSR1 ({detail})", job_id=job.id)
        # A gang's other parts are stopped before it is requeued.
        self.engine._spawn(self._put_back(job.id, kill=len(_nodes_of(job)) > 1),
                           f"put-back-{job.id}")
        return True

    async def _put_back(self, job_id: int, kill: bool) -> None:
        """Requeue (or fail) an evicted job. With ``kill`` its sessions are killed first and
        awaited, so a quick relaunch of the job on the same node cannot be killed instead."""
        job = self.engine.jobs.get(job_id)
        if job_id in self._putting_back or job is None:
            return
        self._putting_back.add(job_id)
        try:
            if kill:
                await asyncio.gather(*(self._signal(n, job_id, "KILL") for n in _nodes_of(job)))
        finally:
            self._putting_back.discard(job_id)
        why = self._evicting.pop(job_id, None)
        job = self.engine.jobs.get(job_id)
        if why is None or job is None or not job.state.holds_gpus:
            return  # cancelled or ended meanwhile
        if job.spec.no_requeue:
            self.engine._finish(job, JobState.FAILED, None, f"{why}; not requeued (--no-requeue)")
        else:
            self.engine.requeue(job, f"requeued: {why}")

    async def _reset(self, gpu: str) -> tuple[bool, str]:
        node, label = self.engine.gpus[gpu].node, self._label(gpu)
        try:
            reply = await self.engine.links[node].request("reset", timeout=RESET_TIMEOUT_S, gpu=gpu)
        except (NodeUnavailable, asyncio.TimeoutError) as err:
            reply = {"reset": False, "detail": f"{node} did not answer: {err or 'timeout'}"}
        ok, detail = bool(reply.get("reset")), reply.get("detail") or reply.get("error") or ""
        self._event("health", f"{label}: GPU reset {'done' if ok else 'failed'}"
                              + (f": {detail}" if detail else ""), gpu=gpu)
        return ok, detail

    async def _selftest(self, gpu: str) -> tuple[bool, str]:
        node, label = self.engine.gpus[gpu].node, self._label(gpu)
        try:
            reply = await self.engine.links[node].request(
                "selftest", timeout=SELFTEST_TIMEOUT_S, gpu=gpu, command=self.selftest_command)
            if not reply.get("ok"):
                raise RuntimeError(reply.get("error") or "refused")
            passed, sentence = judge_selftest(reply.get("result") or {})
        except (NodeUnavailable, asyncio.TimeoutError, RuntimeError) as err:
            passed, sentence = False, f"self-test could not run on {node}: {err or 'timeout'}"
        self._event("health", f"{label}: {sentence}", gpu=gpu)
        return passed, sentence

    # ------------------------------------------------------------------- admins
    def resume(self, user: str, name: str) -> str:
        """``nebula gpu resume``: an admin puts a GPU in maintenance back in service.
        Returns the GPU's uuid; raises RequestError (not an admin, unknown, not in
        maintenance)."""
        engine = self.engine
        engine._check_admin(user, "resume GPUs")
        gpu = engine.resolve_gpu(name)
        label = self._label(gpu)
        if not engine.gpus[gpu].maintenance:
            raise RequestError(f"{label} is not in maintenance")
        running = self._tasks.pop(gpu, None)
        if running and not running[1].done():
            running[1].cancel()  # the admin decided; a test still running no longer matters
        self._xids.pop(gpu, None)  # a new Xid after a repair is a first one again
        self._restore(gpu, f"{label} resumed by {user}")
        return gpu

    # ------------------------------------------------------------- throttling (R19)
    def on_probe(self, node: str, readings: list[GpuReading], pid_jobs: dict[str, str]) -> None:
        """A probe's readings: throttling episodes start and end; the pid -> job map is kept
        for Xid messages that name a pid."""
        self._pid_jobs[node] = dict(pid_jobs or {})
        base = self._base_clock_map(node)
        now = self.engine.clock()
        changed = False
        for reading in readings:
            gpu = reading.uuid
            if not gpu:
                continue
            hot = is_throttling(reading, base.get(gpu))
            if hot and gpu not in self._throttling:
                self._throttling.add(gpu)
                self._throttle_events[node].append(now)
                changed = True
                self._event("health", f"{node}:{reading.index}: suspected thermal throttling "
                            f"({reading.temperature_c:.0f} °C at {reading.utilization_pct:.0f} % "
                            f"utilisation, SM clock {reading.sm_clock_mhz:.0f} MHz below its base "
                            f"{base[gpu]:.0f} MHz); {node}'s health score is now "
                            f"{self.score(node):.2f}", gpu=gpu, node=node)
            elif not hot and gpu in self._throttling:
                self._throttling.discard(gpu)
                self._event("health", f"{node}:{reading.index}: throttling ended; {node}'s health "
                            f"score {self.score(node):.2f} recovers over the next hours",
                            gpu=gpu, node=node)
        events = self._throttle_events.get(node)
        if events:
            horizon = forget_before(now)
            events[:] = [t for t in events if t >= horizon]
        if changed:
            self.engine.wake()

    def _base_clock_map(self, node: str) -> dict[str, float]:
        """uuid -> base SM clock (MHz), from the hello's clocks query (once per hello)."""
        hello = self.engine.nodes[node].hello
        cached = self._base_clocks.get(node)
        if cached and cached[0] == id(hello):
            return cached[1]
        clocks: dict[str, float] = {}
        for line in (hello.get("clocks_csv") or "").splitlines():
            cells = [c.strip() for c in line.split(",")]
            if len(cells) != 3 or not cells[0].startswith("GPU-"):
                continue
            base, top = _mhz(cells[1]), _mhz(cells[2])
            if base is None and top is not None:
                base = top * BASE_CLOCK_OF_MAX
            if base is not None:
                clocks[cells[0]] = base
        self._base_clocks[node] = (id(hello), clocks)
        return clocks


def _nodes_of(job: "Job") -> list[str]:
    return list(dict.fromkeys(p.node for p in job.placements))


def _mhz(text: str) -> float | None:
    with contextlib.suppress(ValueError, IndexError):
        return float(text.split()[0])
    return None  # [N/A], [Not Supported]
