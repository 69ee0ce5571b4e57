"""GPU health on the head: kernel messages and readings in, protective actions out.

The decisions are pure and live in :mod:`nebula_tui.scheduler.health` (which Xid means
what, what counts as throttling, how a self-test is judged); this room carries them out
with the node links and the public functions of the jobs, stream and access rooms, and
records every step as an event (kinds ``xid`` and ``health``; ``nebula events`` and the
TUI show them). A GPU's maintenance lives in one place, ``GpuLive.maintenance`` (set
through ``HeadState.set_maintenance``, which keeps the store's copy).

* **Xid errors (R16).** Each probe's new kernel lines arrive as a ``kmsg`` message; the
  Xid events in them are mapped to a GPU by PCI address and decided per the policies of
  nodes.yaml's ``health.xid_policies`` (defaults in ``DEFAULT_POLICIES``).
* **Isolation (R17),** one asyncio task per GPU: the GPU goes to maintenance with its
  reason; its jobs get SIGUSR1 (checkpoint now); those still alive after
  ``health.isolation_grace`` get SIGKILL; each is requeued (``--no-requeue``: failed); the
  card is reset unless it fell off the bus; the self-test runs; the GPU is back in service
  when it passes, unless its policy says only an admin brings it back (``nebula gpu
  resume``, which runs the self-test first and refuses a card that fails it or is still
  lost; ``--force`` skips it, as an event). A failed reset or self-test keeps it out until
  an admin resumes it.
* **Lost cards.** A card the driver reports lost (NVML's GPU-is-lost or unknown error,
  nvidia-smi's "Unknown Error", gone from the tool's list, ERR! fields: ``GpuReading.lost``)
  is isolated like a bus fall (Xid 79), at once and until an admin resumes it.
* **Throttling (R19).** A card that turns hot, idle and below its base clock is one
  throttling event; events lower the node's health score, which the scheduler reads
  (``GpuView.health_score``); the score recovers by itself over hours.

Maintenance is kept in the store: after a restart of the head such a GPU stays out until
an admin resumes it, and jobs its eviction had not ended yet are evicted again (SIGUSR1, a
fresh grace) once its node reports. Not kept: the Xid history (the repeat window starts again) and
throttling events.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Callable

from ..model import Evicting, GpuReading, Job, JobState, Launching, RequestError, Running
from ..remote.backends import xid
from ..remote.protocol import KernelLines
from ..remote.readings import base_sm_clock
from ..remote.ssh import NodeUnavailable
from ..scheduler.health import (BUS_FALL_CODE, Action, decide, forget_before, is_throttling,
                                judge_selftest, thermal_slowdown)
from .access import Access
from .jobs import JobTransitions
from .state import HeadState, Maintenance, job_nodes
from .stream import Stream

log = logging.getLogger(__name__)

#: How long the node may take for a self-test (dcgmi diag -r 1 takes about a minute).
SELFTEST_TIMEOUT_S = 660.0
#: How long a reset may take.
RESET_TIMEOUT_S = 150.0
#: While waiting out the grace: how often to look whether the evicted jobs are gone.
EVICT_POLL_S = 0.2
#: Xid history older than this is dropped (longer than any sensible repeat window).
XID_HISTORY_S = 86400.0
#: One bus fall reaches the head twice — the kernel's Xid 79 line and the driver's "lost"
#: reading — in either order, a probe or two apart: within this many seconds the second
#: report is the same fall, counted once (a card never falls twice before it answers again).
SAME_FALL_S = 60.0


class HealthMonitor:
    """The head's health room; the node room calls :meth:`on_kernel_message` and
    :meth:`on_probe`, admins :meth:`resume`."""

    def __init__(self, state: HeadState, stream: Stream, jobs: JobTransitions, access: Access):
        self.state = state
        self.stream = stream
        self.transitions = jobs
        self.access = access
        settings = state.config.health
        self.policies = settings.policies
        self.grace_s = settings.isolation_grace_s
        self.selftest_command = settings.selftest_command
        # gpu -> (time, code) of its recent Xid events, for the repeat windows
        self._xids: dict[str, list[tuple[float, int | None]]] = defaultdict(list)
        self._tasks: dict[str, tuple[str, asyncio.Task]] = {}  # gpu -> (kind, pipeline)
        self._pid_jobs: dict[str, dict[str, str]] = {}  # node -> pid -> job id (last probe)
        self._throttling: set[str] = set()  # GPUs in a throttling episode now
        self._lost: set[str] = set()  # GPUs whose last probe said the driver lost them
        # gpu -> [time, its Xid line came, the driver's loss came] of its last bus fall
        self._falls: dict[str, list] = {}
        self._kmsg_errors: dict[str, str] = {}
        #: told of each GPU isolated, with why (notifications)
        self.on_isolated: Callable[[str, str], None] = lambda gpu, reason: None

    def _event(self, kind: str, message: str, gpu: str | None = None, node: str | None = None,
               job_id: int | None = None) -> None:
        if gpu and not node and gpu in self.state.gpus:
            node = self.state.gpus[gpu].node
        self.state.record(kind, message, node=node, gpu=gpu, job_id=job_id)

    # ------------------------------------------------------------- kernel log (R16)
    def on_kernel_message(self, node: str, message: KernelLines) -> None:
        """New kernel lines of ``node`` (or why they cannot be read)."""
        error = message.error
        if error != self._kmsg_errors.get(node, ""):
            self._kmsg_errors[node] = error
            if error:
                self._event("health", f"{node}: {error}; its Xid errors go unseen", node=node)
        if message.lines:
            pid_jobs = {**self._pid_jobs.get(node, {}), **message.pid_jobs}
            self.on_kernel_lines(node, list(message.lines), pid_jobs)

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
        candidates = {uuid: live for uuid, live in self.state.gpus.items() if live.node == node}
        if event.get("uuid") in candidates:
            return event["uuid"]
        for uuid, live in candidates.items():
            if live.reading.pci_bus_id and xid.pci_matches(event["pci"], live.reading.pci_bus_id):
                return uuid
        return None

    def _same_fall(self, gpu: str, now: float, report: int) -> bool:
        """Whether this report of a bus fall (``report``: 1 the kernel's Xid line, 2 the
        driver's loss) is the other half of the last fall, which then has both; else it
        opens a new fall."""
        last = self._falls.get(gpu)
        if last is not None and now - last[0] <= SAME_FALL_S and not last[report]:
            last[report] = True
            return True
        self._falls[gpu] = [now, report == 1, report == 2]
        return False

    def on_xid(self, gpu: str, event: dict, pid_jobs: dict[str, str]) -> None:
        now = self.state.clock()
        label = self.state.label(gpu)
        history = self._xids[gpu]
        if event.get("code") in (None, BUS_FALL_CODE) and self._same_fall(gpu, now, 1):
            # the driver's loss of the card told of this fall first: it is isolated already
            self._event("xid", f"{label}: Xid {event.get('code') or BUS_FALL_CODE} "
                               f"({xid.meaning(event.get('code'))}): the fall the driver reported; "
                               "counted once", gpu=gpu)
            return
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
        live = self.state.gpus.get(gpu)
        if running and not running[1].done():
            if kind == "isolate" and running[0] == "selftest":
                running[1].cancel()
            else:
                coro.close()
                return
        elif live is not None and live.maintenance is not None and kind == "selftest":
            coro.close()  # already out of service: nothing to test while it waits
            return
        # cancelled with the head's other tasks on stop
        self._tasks[gpu] = (kind, self.state.spawn(self._guarded(gpu, coro), f"health-{kind}-{gpu}"))

    async def _guarded(self, gpu: str, coro) -> None:
        try:
            await coro
        except asyncio.CancelledError:
            raise
        except Exception:  # a pipeline that breaks must leave an event, not a silent GPU
            log.exception("health pipeline of %s failed", gpu)
            self._event("health", f"{self.state.label(gpu)}: the health pipeline failed "
                                  "(see the service log); the GPU stays as it is", gpu=gpu)

    # ------------------------------------------------------------------ fail a job
    def _fail_job(self, gpu: str, action: Action, pid_jobs: dict[str, str]) -> None:
        node, label = self.state.gpus[gpu].node, self.state.label(gpu)
        job_id = pid_jobs.get(str(action.pid))
        job = self.state.jobs.get(int(job_id)) if job_id and str(job_id).isdigit() else None
        if job is None or node not in job_nodes(job) or not job.state.holds_gpus:
            self._event("xid", f"{label}: pid {action.pid} is not a process of a running "
                               "NebulaGrid job; no job failed", gpu=gpu)
            return
        meaning = xid.meaning(action.code)
        self.transitions.finish(job, JobState.FAILED, None,
                                f"Xid {action.code} ({meaning}) on {label} caused by its pid "
                                f"{action.pid}; the GPU keeps serving")
        for where in job_nodes(job):
            self.state.spawn(self.transitions.signal(where, job.id, "KILL"),
                             f"xid-kill-{job.id}-{where}")

    # ----------------------------------------------------------- pipelines (R17)
    async def _check(self, gpu: str, action: Action) -> None:
        """A self-test while the GPU keeps serving; a failure isolates it."""
        passed, sentence = await self._selftest(gpu, serving=True, record=False)
        label = self.state.label(gpu)
        if passed:
            self._event("health", f"{label} keeps serving: {sentence}", gpu=gpu)
            return
        # Out until an admin resumes it (a failed test keeps any card out): the one line
        # says the test's outcome and the way back; the test is not run a second time.
        await self._isolate(gpu, Action("isolate", True, f"Xid {action.code} "
                                        f"({xid.meaning(action.code)}) and a failed self-test "
                                        f"({sentence}): isolated; check the card, then "
                                        f"`nebula gpu resume {label}`", None, action.code),
                            tested=True)

    async def _isolate(self, gpu: str, action: Action, tested: bool = False) -> None:
        """``tested``: its self-test failed just now (``action.reason`` says so)."""
        label = self.state.label(gpu)
        admin_only = action.admin_resume or self._maintenance(gpu).admin_only
        told = self.state.gpus[gpu].maintenance
        self._set_maintenance(gpu, Maintenance(action.reason, admin_only))
        if told is None or told.reason != action.reason:  # a lost card's line is written already
            self._event("health", f"{label} in maintenance: {action.reason}", gpu=gpu)
        self.on_isolated(gpu, action.reason)
        # The cause alone ("Xid 48 (double-bit ECC error)"), for the requeued jobs' reason.
        await self._evict(gpu, f"GPU {label} was isolated ({action.reason.split(': ')[0]})")
        # A card that fell off the bus cannot be reset (and only a person can bring it back);
        # one the driver still cannot see fails any test: its maintenance line says it all.
        if tested or self.state.gpus[gpu].reading.lost:
            return
        if action.code not in (None, BUS_FALL_CODE):
            ok, detail = await self._reset(gpu)
            if not ok:
                self._keep_out(gpu, f"{action.reason}; the reset failed ({detail})")
                return
        passed, sentence = await self._selftest(gpu, record=False)  # said in the line below
        if not passed:
            self._keep_out(gpu, f"{action.reason}; {sentence}")
        elif self._maintenance(gpu).admin_only:
            self._set_maintenance(gpu, Maintenance(f"{action.reason} ({sentence})", admin_only=True))
            self._event("health", f"{label} stays in maintenance until an admin resumes it "
                                  f"(`nebula gpu resume {label}`): {sentence}", gpu=gpu)
        else:
            self._restore(gpu, f"{label} back in service: {sentence}")

    def _maintenance(self, gpu: str) -> Maintenance:
        return self.state.gpus[gpu].maintenance or Maintenance("")

    def _keep_out(self, gpu: str, why: str) -> None:
        label = self.state.label(gpu)
        advice = f"`nebula gpu resume {label}`"
        # the policy's own reason may already say how it comes back: said once
        reason = why if advice in why else f"{why}; {advice} once it is fixed"
        self._set_maintenance(gpu, Maintenance(reason, admin_only=True))
        self._event("health", f"{label} stays in maintenance: {reason}", gpu=gpu)

    def _set_maintenance(self, gpu: str, maintenance: Maintenance) -> None:
        self.state.set_maintenance(gpu, maintenance)
        self.stream.publish_gpus(self.state.gpus[gpu].node)

    def _restore(self, gpu: str, message: str) -> None:
        self.state.set_maintenance(gpu, None)
        self._event("health", message, gpu=gpu)
        self.stream.publish_gpus(self.state.gpus[gpu].node)
        self.state.wake()

    async def _evict(self, gpu: str, why: str) -> None:
        """SIGUSR1 to the GPU's jobs, SIGKILL after the grace to those still alive; each
        ends requeued (or failed with --no-requeue) — by its own exit or by the kill."""
        label = self.state.label(gpu)
        jobs = [j for j in self.state.jobs.values()
                if any(p.gpu_uuid == gpu for p in j.placements) and self.transitions.evict(j, why)]
        if not jobs:
            return
        ids = ", ".join(str(j.id) for j in jobs)
        self._event("health", f"{label}: SIGUSR1 to job{'s' if len(jobs) > 1 else ''} {ids} "
                              f"(checkpoint now); SIGKILL in {self.grace_s:g} s if still running",
                    gpu=gpu)
        await asyncio.gather(*(self.transitions.signal(where, j.id, "USR1") for j in jobs
                               for where in job_nodes(j)))
        deadline = time.monotonic() + self.grace_s
        while time.monotonic() < deadline and any(self._still_evicting(j) for j in jobs):
            await asyncio.sleep(EVICT_POLL_S)
        for job in jobs:
            if not self._still_evicting(job):
                continue  # it ended by itself (and was put back), or was cancelled
            self._event("health", f"job {job.id} still running {self.grace_s:g} s after SIGUSR1: "
                                  "SIGKILL", gpu=gpu, job_id=job.id)
            await self.transitions.put_back(job.id, kill=True)

    def _evict_left_behind(self, readings: list[GpuReading]) -> None:
        """Jobs still running on a probed GPU in maintenance are evicted. An isolation
        evicts them first, so this finds only those whose eviction a head restart cut short:
        without it they would run on, unwatched, on the card that failed."""
        for reading in readings:
            gpu, live = reading.uuid, self.state.gpus.get(reading.uuid)
            if live is None or live.maintenance is None:
                continue
            if any(isinstance(j.status, (Launching, Running))
                   and any(p.gpu_uuid == gpu for p in j.placements)
                   for j in self.state.jobs.values()):
                cause = live.maintenance.reason.split(": ")[0]
                self._start(gpu, "evict", self._evict(gpu, f"GPU {self.state.label(gpu)} was "
                                                           f"isolated ({cause})"))

    def _still_evicting(self, job: Job) -> bool:
        now = self.state.jobs.get(job.id)
        return now is not None and now.attempt == job.attempt and isinstance(now.status, Evicting)

    async def _reset(self, gpu: str) -> tuple[bool, str]:
        node, label = self.state.gpus[gpu].node, self.state.label(gpu)
        try:
            reply = await self.state.links[node].request("reset", timeout=RESET_TIMEOUT_S, gpu=gpu)
        except (NodeUnavailable, asyncio.TimeoutError) as err:
            reply = {"reset": False, "detail": f"{node} did not answer: {err or 'timeout'}"}
        ok, detail = bool(reply.get("reset")), reply.get("detail") or reply.get("error") or ""
        self._event("health", f"{label}: GPU reset {'done' if ok else 'failed'}"
                              + (f": {detail}" if detail else ""), gpu=gpu)
        return ok, detail

    async def _selftest(self, gpu: str, serving: bool = False, record: bool = True) -> tuple[bool, str]:
        """``serving``: the card keeps its jobs while it is tested (else it has none);
        ``record``: its own event line (else the caller's line says the outcome)."""
        node, label = self.state.gpus[gpu].node, self.state.label(gpu)
        try:
            reply = await self.state.links[node].request(
                "selftest", timeout=SELFTEST_TIMEOUT_S, gpu=gpu, command=self.selftest_command)
            if not reply.get("ok"):
                raise RuntimeError(reply.get("error") or "refused")
            passed, sentence = judge_selftest(reply.get("result") or {}, serving)
        except (NodeUnavailable, asyncio.TimeoutError, RuntimeError) as err:
            passed, sentence = False, f"self-test could not run on {node}: {err or 'timeout'}"
        if record:
            self._event("health", f"{label}: {sentence}", gpu=gpu)
        return passed, sentence

    # ------------------------------------------------------------- lost cards
    def _lost_or_back(self, node: str, readings: list[GpuReading]) -> None:
        """A card the driver lost (NVML's GPU-is-lost or unknown error, nvidia-smi's
        "Unknown Error", gone from the tool's list, ERR! fields) is isolated like one that
        fell off the bus (Xid 79): out of service at once, its jobs checkpointed and
        requeued, back only through ``nebula gpu resume`` — whose self-test it must pass.
        It counts as a bus fall in the Xid history, so an Xid 79 soon after isolates too."""
        for reading in readings:
            gpu = reading.uuid
            if not gpu or gpu not in self.state.gpus:
                continue
            label = self.state.label(gpu)
            if reading.lost and gpu not in self._lost:
                self._lost.add(gpu)
                now = self.state.clock()
                told = self._same_fall(gpu, now, 2) and self.state.gpus[gpu].maintenance is not None
                if not told:
                    self._xids[gpu].append((now, None))
                reason = (f"the driver lost {label} ({reading.lost}): isolated; check the slot "
                          f"and the power cable, then `nebula gpu resume {label}`")
                # Out of service before anything else runs: never offered again meanwhile.
                # One line says it all (what the driver said, what it takes) — unless its
                # Xid 79 line came first and this fall is told already.
                self._set_maintenance(gpu, Maintenance(reason, admin_only=True))
                if not told:
                    self._event("health", f"{label} in maintenance: {reason}", gpu=gpu, node=node)
                self._start(gpu, "isolate", self._isolate(gpu, Action("isolate", True, reason, None,
                                                                      BUS_FALL_CODE)))
            elif not reading.lost and gpu in self._lost:
                self._lost.discard(gpu)
                self._falls.pop(gpu, None)  # back on the bus: a next report is a new fall
                self._event("health", f"{label} answers again; it stays in maintenance until an "
                                      f"admin resumes it (`nebula gpu resume {label}` runs its "
                                      "self-test first)", gpu=gpu, node=node)

    # ------------------------------------------------------------------- admins
    async def resume(self, user: str, name: str, force: bool = False) -> str:
        """``nebula gpu resume``: an admin puts a GPU in maintenance back in service once it
        passes its self-test; a card the driver still reports lost, or one failing the
        test, is refused with the reason. ``force`` skips the test (an event says who).
        The Xid history stays: a second Xid 79 within its window after a resume isolates.
        Returns the GPU's uuid; raises RequestError (not an admin, unknown, not in
        maintenance, still lost, self-test failed)."""
        self.access.check_admin(user, "resume GPUs")
        gpu = self.state.resolve_gpu(name)
        label = self.state.label(gpu)
        live = self.state.gpus[gpu]
        if live.maintenance is None and not live.reading.lost:
            raise RequestError(f"{label} is not in maintenance")
        if live.reading.lost:  # --force too: no resume brings back a card the driver cannot see
            raise RequestError(f"{label} is still lost ({live.reading.lost}): no resume, forced or "
                               f"not, brings back a card the driver cannot see; reseat it or "
                               f"power-cycle {live.node}, and once it answers again "
                               f"`nebula gpu resume {label}`")
        if force:
            self._cancel_pipeline(gpu)
            self._restore(gpu, f"{label} resumed by {user} with --force, without a self-test")
            return gpu
        self._cancel_pipeline(gpu)  # the admin decided; a test still running no longer matters
        passed, sentence = await self._selftest(gpu)
        if not passed:
            raise RequestError(f"{label} stays in maintenance: {sentence}; fix it, or "
                               f"`nebula gpu resume --force {label}` to take the risk")
        if self.state.gpus[gpu].reading.lost:
            raise RequestError(f"{label} was lost again during its self-test "
                               f"({self.state.gpus[gpu].reading.lost})")
        self._restore(gpu, f"{label} resumed by {user}: {sentence}")
        return gpu

    def _cancel_pipeline(self, gpu: str) -> None:
        running = self._tasks.pop(gpu, None)
        if running and not running[1].done():
            running[1].cancel()

    # ------------------------------------------------------------- throttling (R19)
    def on_probe(self, node: str, readings: list[GpuReading], pid_jobs: dict[str, str]) -> None:
        """A probe's readings: throttling episodes start and end; the pid -> job map is kept
        for Xid messages that name a pid."""
        self._pid_jobs[node] = dict(pid_jobs or {})
        self._lost_or_back(node, readings)
        self._evict_left_behind(readings)
        now = self.state.clock()
        events = self.state.nodes[node].throttle_events
        changed = False
        for reading in readings:
            gpu = reading.uuid
            if not gpu:
                continue
            base = base_sm_clock(reading)
            hot = is_throttling(reading, base, self.state.settings.config.hot_c)
            if hot and gpu not in self._throttling:
                self._throttling.add(gpu)
                events.append(now)
                changed = True
                self._event("health", f"{node}:{reading.index}: suspected thermal throttling "
                            f"({_throttle_detail(reading, base)}); {node}'s health score is now "
                            f"{self.state.health_score(node):.2f}", gpu=gpu, node=node)
            elif not hot and gpu in self._throttling:
                self._throttling.discard(gpu)
                self._event("health", f"{node}:{reading.index}: throttling ended; {node}'s health "
                            f"score {self.state.health_score(node):.2f} recovers over the next hours",
                            gpu=gpu, node=node)
        if events:
            horizon = forget_before(now)
            events[:] = [t for t in events if t >= horizon]
        if changed:
            self.state.wake()


def _throttle_detail(reading: GpuReading, base: float | None) -> str:
    """What made it look like throttling, in words: the driver's reason, or the readings."""
    said = "the driver reports a thermal slowdown" if thermal_slowdown(reading) else ""
    numbers = ", ".join(part for part in (
        f"{reading.temperature_c:.0f} °C" if reading.temperature_c is not None else "",
        f"{reading.utilization_pct:.0f} % utilisation" if reading.utilization_pct is not None else "",
        f"SM clock {reading.sm_clock_mhz:.0f} MHz" + (f" below its base {base:.0f} MHz" if base else "")
        if reading.sm_clock_mhz is not None else "") if part)
    return "; ".join(part for part in (said, numbers) if part)
