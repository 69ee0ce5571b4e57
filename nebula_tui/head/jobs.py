"""A job's life on the head: launch, running, exit, finish, requeue, cancel, acks.

Each transition is one store transaction, then the same change in the live job table,
then its events out. A launch writes the intent (allocation + ``launching``) before any
node is asked; a gang is running once every node confirmed and ends when every node's
part ended. Exits are acked to the node in batches once recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace

from ..model import Job, JobState, Placement, RequestError
from ..remote import launcher
from ..remote.ssh import NodeUnavailable
from ..store import StaleDecision
from .access import Access
from .shares import Shares
from .state import HeadState, JobTable, job_nodes
from .stream import Stream

log = logging.getLogger(__name__)

ACK_BATCH_S = 0.1
CANCEL_GRACE_S = 10.0


class JobTransitions:
    def __init__(self, state: HeadState, stream: Stream, shares: Shares, access: Access):
        self.state = state
        self.stream = stream
        self.shares = shares
        self.access = access
        #: asked before an exit ends a job: True when another room takes the exit over
        #: (a job evicted from an isolated GPU is requeued instead)
        self.exit_diverted: Callable[[Job, int | None], bool] = lambda job, code: False
        self._cancelling: set[int] = set()
        self._acks: dict[str, list[int]] = {}
        self._node_exits: dict[int, dict[str, int | None]] = {}  # gangs: exits so far per node
        self._launched: dict[int, set[str]] = {}  # gangs: nodes that confirmed the launch
        self._finished_waiters: dict[int, list[asyncio.Future]] = defaultdict(list)

    def load(self) -> None:
        """The unfinished jobs of the store become the live table (the head starts)."""
        active = (JobState.PENDING, JobState.LAUNCHING, JobState.RUNNING)
        self.state.jobs = JobTable(self.state.store.jobs(states=active))
        self._cancelling = self.state.store.cancel_requested()

    def is_cancelling(self, job_id: int) -> bool:
        return job_id in self._cancelling

    # ---------------------------------------------------------------- node reports
    def on_started(self, node: str, message: dict) -> None:
        job = self._job_from_node(node, message)
        if job and job.state == JobState.LAUNCHING:
            self.mark_running(job)

    def on_exit(self, node: str, message: dict) -> None:
        job = self._job_from_node(node, message)
        if job is None:
            if self.state.ours(message.get("token")):
                # Ours but already finished (the head crashed before its ack): ack it now.
                with contextlib.suppress(TypeError, ValueError):
                    self._ack_soon(node, int(message.get("job")))
            return
        self._ack_soon(node, job.id)
        if self.exit_diverted(job, message.get("code")):
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
        self.finish(job, state, code, reason)

    def _job_from_node(self, node: str, message: dict) -> Job | None:
        try:
            job = self.state.jobs.get(int(message.get("job")))
        except (TypeError, ValueError):
            return None
        if job is None or message.get("token") != self.state.token(job):
            return None  # another head's job directory, or an earlier attempt of this job
        return job if node in job_nodes(job) and job.state.holds_gpus else None

    def _ack_soon(self, node: str, job_id: int) -> None:
        """Tell the node its job's exit is recorded; acks of one moment go as one request."""
        batch = self._acks.setdefault(node, [])
        batch.append(job_id)
        if len(batch) == 1:
            self.state.spawn(self._send_acks(node), f"ack-{node}")

    async def _send_acks(self, node: str) -> None:
        await asyncio.sleep(ACK_BATCH_S)
        jobs = self._acks.pop(node, [])
        # Unacked exits are reported again when the node reconnects, and ignored then.
        with contextlib.suppress(NodeUnavailable, asyncio.TimeoutError):
            await self.state.links[node].request("ack", jobs=jobs)

    # ---------------------------------------------------------------------- launch
    def begin_launch(self, job: Job, placements: tuple[Placement, ...]) -> None:
        """The scheduler's Start: write the intent, then ask the nodes."""
        try:
            self.state.store.start_launching(job.id, placements, self.state.clock())
        except StaleDecision:
            return  # the job changed since the snapshot (cancelled): nothing to launch
        job = replace(job, state=JobState.LAUNCHING, node=placements[0].node,
                      placements=placements, reason="")
        self.state.jobs[job.id] = job
        self.stream.publish_job(job)
        for node in job_nodes(job):
            self.stream.publish_gpus(node)
        self.state.spawn(self.launch(job), f"launch-{job.id}")

    async def launch(self, job: Job, only: str | None = None) -> None:
        """Start the job's tmux session on each of its nodes (or only on ``only``).

        The job is running once every node has confirmed; a node that is away keeps the
        intent in the store, and reconcile launches its part when it is back.
        """
        nodes = job_nodes(job)
        replies = await asyncio.gather(*(self._launch_on(job, node, nodes) for node in nodes
                                         if only is None or node == only), return_exceptions=True)
        current = self.state.jobs.get(job.id)
        if current is None or current.state != JobState.LAUNCHING:
            return
        failed = [r for r in replies if isinstance(r, dict) and not r.get("ok")]
        if failed:
            self.finish(current, JobState.FAILED, None, f"launch failed: {failed[0].get('error')}")
            return
        confirmed = self._launched.setdefault(job.id, set())
        confirmed.update(r["node"] for r in replies if isinstance(r, dict))
        if confirmed >= set(nodes):
            self._launched.pop(job.id, None)
            self.mark_running(current)

    async def _launch_on(self, job: Job, node: str, nodes: list[str]) -> dict | None:
        config = self.state.config
        mine = tuple(p for p in job.placements if p.node == node)
        extra = None
        if len(nodes) > 1:
            master = config.node(nodes[0])
            extra = launcher.gang_environment(job, node, master.host, nodes,
                                              config.node(node).env_dict.get("NCCL_SOCKET_IFNAME"))
        script = launcher.run_script(job, mine, self._run_as(job, node), extra)
        try:
            reply = await self.state.links[node].request("launch", job=job.id,
                                                         token=self.state.token(job), script=script)
        except (NodeUnavailable, asyncio.TimeoutError) as err:
            log.warning("launch of job %s on %s deferred: %s", job.id, node, err)
            return None
        return {**reply, "node": node}

    def _run_as(self, job: Job, node_name: str) -> tuple[str, ...]:
        """With ``run_as: submitter``, the prefix that runs the job as its owner on the node.

        A nodelet running as root switches with runuser; any other login user needs a
        sudoers rule allowing ``sudo -n -u USER`` (README, "Jobs run as their owner").
        """
        config = self.state.config
        node = config.node(node_name)
        if config.run_as != "submitter" or job.user == node.user:
            return ()
        if self.state.nodes[node_name].hello.get("uid") == 0:
            return ("runuser", "-u", job.user, "--")
        return ("sudo", "-n", "-u", job.user, "--")

    def mark_running(self, job: Job) -> None:
        now = self.state.clock()
        self.state.store.mark_running(job.id, now)
        job = replace(job, state=JobState.RUNNING, started_at=now)
        self.state.jobs[job.id] = job
        self.stream.publish_job(job)

    # --------------------------------------------------------------------- the end
    def finish(self, job: Job, state: JobState, code: int | None, reason: str) -> None:
        """End a job (ended, failed, cancelled): GPUs released, its user charged."""
        now = self.state.clock()
        self.state.store.finish_job(job.id, state, now, exit_code=code, reason=reason)
        self.state.jobs.pop(job.id, None)
        self._node_exits.pop(job.id, None)
        self.shares.forget()  # its hours now count towards its user's weight
        self._cancelling.discard(job.id)
        done = replace(job, state=state, exit_code=code, reason=reason, ended_at=now)
        self.stream.publish_job(done)
        for node in job_nodes(job):
            self.stream.publish_gpus(node)
        for waiter in self._finished_waiters.pop(job.id, []):
            if not waiter.done():
                waiter.set_result(done)
        self.state.wake()

    def requeue(self, job: Job, reason: str) -> None:
        """Put a job that held GPUs back in the queue (its allocation released)."""
        self.state.store.requeue(job.id, reason, self.state.clock())
        held_on = job_nodes(job)
        self._cancelling.discard(job.id)
        job = replace(job, state=JobState.PENDING, node=None, placements=(), reason=reason,
                      started_at=None, attempt=job.attempt + 1)
        self.state.jobs[job.id] = job
        self._node_exits.pop(job.id, None)
        self._launched.pop(job.id, None)
        self.stream.publish_job(job)
        for node in held_on:
            self.stream.publish_gpus(node)
        self.state.wake()

    async def wait_finished(self, job: Job) -> Job:
        """The job once it ended (at once when it has)."""
        if job.state.finished:
            return job
        future = asyncio.get_running_loop().create_future()
        self._finished_waiters[job.id].append(future)
        return await future

    # ---------------------------------------------------------------------- cancel
    def cancel(self, user: str, job: Job) -> None:
        """A pending job ends at once; one holding GPUs is stopped on its nodes (the
        request is kept in the store until they confirm)."""
        self.access.check_may_manage(user, job, "cancel")
        if job.state.finished:
            raise RequestError(f"job {job.id} already {job.state.value}")
        if job.state == JobState.PENDING:
            if user != job.user:
                self.state.store.add_event("admin", f"{user} cancelled job {job.id} of {job.user}",
                                           job_id=job.id, user=user)
            self.finish(job, JobState.CANCELLED, None, f"cancelled by {user}")
            return
        self._cancelling.add(job.id)
        self.state.store.request_cancel(job.id, user, self.state.clock(), audit=user != job.user)
        self.state.spawn(self.cancel_on_node(job), f"cancel-{job.id}")

    async def cancel_on_node(self, job: Job, only: str | None = None) -> None:
        for node in job_nodes(job):
            if only is not None and node != only:
                continue
            try:
                await self.state.links[node].request("cancel", timeout=CANCEL_GRACE_S + 30,
                                                     job=job.id, grace=CANCEL_GRACE_S)
            except (NodeUnavailable, asyncio.TimeoutError) as err:
                log.warning("cancel of job %s on %s waits for the node: %s", job.id, node, err)
