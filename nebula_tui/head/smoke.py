"""The smoke test of a node just added: its first job, as the documents bring a node up.

``run(user, node)`` waits until the node is up and has reported its GPUs, asks the
scheduler — over that node's cards alone — where a 4 GB slice of the vendor's own tool
would go (the vendor's tool, ``remote/vendors.py``: ``nvidia-smi``, ``rocm-smi``, ``xpu-smi
discovery``, ``npu-smi info``), starts it there as a job of ``user`` through the normal launch, and answers its
end and its output. It is a job like any other: in the queue while it runs, in the
history after; it is never requeued elsewhere (it is about this node).
"""

from __future__ import annotations

import asyncio

from .. import scheduler, views
from ..model import MIN_SLICE_MB, JobSpec, NodeState, RequestError
from ..remote import vendors
from ..remote.ssh import NodeUnavailable
from ..waits import within
from ..wire import SmokeReply
from .access import Access
from .jobs import JobTransitions
from .state import HeadState
from .stream import Stream

#: How long the new node may take to come up and report its cards, and the job to end.
UP_TIMEOUT_S = 60.0
RUN_TIMEOUT_S = 60.0
#: The most of the job's output the answer carries.
OUTPUT_MAX = 8192


class SmokeTest:
    def __init__(self, state: HeadState, stream: Stream, jobs: JobTransitions, access: Access):
        self.state = state
        self.stream = stream
        self.transitions = jobs
        self.access = access

    async def run(self, user: str, node: str) -> SmokeReply:
        """The smoke job on ``node`` (``ended`` False when it did not end within RUN_TIMEOUT_S). Raises RequestError
        when the node does not come up, or has no card for it."""
        self.access.check_admin(user, "run a node's smoke test")
        self.state.node(node)
        views_ = await self._cards(node)
        vendor = views_[0].reading.vendor
        spec = JobSpec(command=vendors.smoke_command(vendor),
                       name=f"smoke-test {node}", gpu_mem_mb=MIN_SLICE_MB, vendor=vendor,
                       no_requeue=True)
        decision = self._where(user, spec, views_)
        if not isinstance(decision, scheduler.Start):
            raise RequestError(f"{node} has no card for its smoke test: {decision.reason}")
        state = self.state
        job = state.store.add_job(user, spec, state.clock())
        state.jobs[job.id] = job
        self.stream.publish_job(job)
        self.transitions.begin_launch(job, decision.placements)  # no pass in between: no await
        placement = decision.placements[0]
        card = next(v for v in views_ if v.uuid == placement.gpu_uuid)
        gpu, model = f"{node}:{placement.gpu_index}", views.short_model(card.reading.name)
        try:
            done = await within(RUN_TIMEOUT_S, self.transitions.wait_finished(state.jobs[job.id]))
        except asyncio.TimeoutError:
            return {"gpu": gpu, "model": model, "job": views.job_json(state.jobs.get(job.id) or job),
                    "output": "", "ended": False}
        return {"gpu": gpu, "model": model, "job": views.job_json(done),
                "output": await self._output(node, job.id), "ended": True}

    async def _cards(self, node: str) -> list:
        """The node's GPU views once it is up and has reported them (it was just added)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + UP_TIMEOUT_S
        while loop.time() < deadline:
            cards = self.state.gpu_views(node)
            if cards and self.state.nodes[node].state == NodeState.UP:
                return cards
            await asyncio.sleep(0.2)
        view = self.state.nodes[node]
        raise RequestError(f"{node} did not come up with its GPUs within {UP_TIMEOUT_S:.0f}s "
                           f"({view.state.value}{': ' + view.reason if view.reason else ''}); "
                           f"`nebula node show {node}` says more")

    def _where(self, user: str, spec: JobSpec, cards) -> scheduler.Decision:
        """The scheduler's own decision for the smoke job, over this node's cards alone."""
        state = self.state
        node = cards[0].node
        pending = scheduler.PendingJob(0, user, 1, spec.gpu_mem_mb, state.clock(), vendor=spec.vendor)
        snapshot = scheduler.Snapshot(
            now=state.clock(), gpus=tuple(cards), queue=(pending,),
            topologies={node: state.nodes[node].topo.get("links", {})},
            config=state.settings.config)
        return next(iter(scheduler.schedule(snapshot)))

    async def _output(self, node: str, job_id: int) -> str:
        try:
            reply = await self.state.links[node].request("log", job=job_id, offset=0, limit=OUTPUT_MAX)
        except (NodeUnavailable, asyncio.TimeoutError, KeyError):
            return ""
        return reply.get("data", "")
