"""What each part of a job gets on its node, gathered in one place: ``plan(job, node)`` reads
the head's state — the node's facts (its hello, its nodes.yaml entry), the cards' vendors and
sizes, whom the job runs as, a gang's rendezvous — into one ``launcher.LaunchPlan``.

The launch writes the node's run script from that plan (``launcher.script``), and ``nebula
job`` shows its environment (``environments``): the page shows what the job gets.
"""

from __future__ import annotations

from ..config.nodes import NodeConfig
from ..model import Job, Placement
from ..remote import launcher
from ..remote.protocol import Hello
from .state import HeadState, job_nodes


class Launches:
    def __init__(self, state: HeadState):
        self.state = state
        #: per node: the hello and config its launcher facts were read from, and the facts
        #: node -> (the hello they were read from, (runtime, warmup) of its config, the facts)
        self._facts: dict[str, tuple[Hello, tuple[str | None, bool], launcher.NodeFacts]] = {}

    def plan(self, job: Job, node: str) -> launcher.LaunchPlan:
        """The plan of the job's part on ``node``: its cards there, their devices, the
        node's facts, whom it runs as, every variable its command gets, the log's cap."""
        mine = tuple(p for p in job.placements if p.node == node)
        readings = {p.gpu_uuid: self.state.gpus[p.gpu_uuid].reading
                    for p in mine if p.gpu_uuid in self.state.gpus}
        return launcher.launch_plan(job, mine, self._run_as(job, node), self._extra_environment(job, node, mine),
                                    self._node_facts(node), launcher.job_devices(mine, readings),
                                    log_max_mb=self.state.config.limits.log_max_mb)

    def environments(self, job: Job) -> dict[str, dict[str, str]]:
        """Each of the job's nodes -> the environment its command sees there (in a container,
        as the container has it): the very plan the node's run script is written from."""
        return {node: self.plan(job, node).seen_environment for node in job_nodes(job)}

    def _extra_environment(self, job: Job, node: str, mine: tuple[Placement, ...]) -> dict[str, str] | None:
        """What the part on ``node`` gets beyond R12's variables (None: nothing): a job of
        several GPUs its ranks' rendezvous, and on a slice the frameworks' allocator caps."""
        nodes = job_nodes(job)
        extra = {}
        if len(job.placements) > 1:
            config = self.state.config
            extra = launcher.gang_environment(job, node, config.node(nodes[0]).host, nodes,
                                              config.node(node).env_dict.get("NCCL_SOCKET_IFNAME"))
        totals = {p.gpu_uuid: self.state.total_mb(p.gpu_uuid) for p in mine}
        return {**extra, **launcher.slice_environment(mine, totals)} or None

    def _node_facts(self, node: str) -> launcher.NodeFacts:
        """The launcher's facts of ``node``, worked out once per hello and config: reading
        them parses the node's nvidia-smi table, which was a quarter of the head's CPU
        when every launch did it. A node no longer configured (an ended job's page) is
        known by its name alone."""
        view, node_config = self.state.nodes.get(node), self._config(node)
        if view is None or node_config is None:
            return launcher.NodeFacts(node)
        key = (node_config.runtime, node_config.warmup)
        known = self._facts.get(node)
        if known is None or known[0] is not view.hello or known[1] != key:
            facts = launcher.node_facts(node, view.hello, *key)
            known = self._facts[node] = (view.hello, key, facts)
        return known[2]

    def _run_as(self, job: Job, node_name: str) -> tuple[str, ...]:
        """With ``run_as: submitter``, the prefix that runs the job as its owner on the node.

        A nodelet running as root switches with runuser; any other login user needs a
        sudoers rule allowing ``sudo -n -u USER`` (docs/admin-guide.md, "Jobs run as their owner").
        """
        node, view = self._config(node_name), self.state.nodes.get(node_name)
        if self.state.config.run_as != "submitter" or node is None or job.user == node.user:
            return ()
        if view is not None and view.hello.uid == 0:
            return ("runuser", "-u", job.user, "--")
        return ("sudo", "-n", "-u", job.user, "--")

    def _config(self, node: str) -> NodeConfig | None:
        """The node's nodes.yaml entry; None once it was removed."""
        try:
            return self.state.config.node(node)
        except KeyError:
            return None
