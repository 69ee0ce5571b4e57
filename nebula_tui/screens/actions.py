"""What a person asks of the cluster from the TUI, as requests to the head: a job's cancel,
hold and release, a node's drain, resume and removal (each asking first where it cannot be
undone), why a job waits, and the ``:`` line (its commands run as their specs say). A part
of ``NebulaApp`` (it mixes this in): these need the app's client, its ``Cluster`` and its
screens, and nothing else of it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar, cast, overload

from rich.text import Text
from textual import work
from textual.actions import SkipAction
from textual.screen import ModalScreen

from ..api import ApiError, AsyncClient
from ..client.cluster import Cluster, LiveJob
from ..forecasts import why_text
from ..printable import printable, printable_tree
from ..views import command_line
from ..wire import (DrainRequest, JobDetailReply, JobReply, JobRequest, NodeReply, NodeRequest, NodeWire, ReloadReply,
                    WhyJob, WhyReply, WhyRequest)
from . import commandline
from .base import OpMissing
from .commandline import Command, CommandLine
from .nodes import DrainPrompt
from .render import job_summary
from .widgets.dialogs import Choice, ChoiceScreen, confirm

#: What a job action says when it worked.
DONE_VERB = {"cancel": "cancelled", "hold": "held", "release": "released"}
#: What a node action says when it worked.
NODE_DONE = {"drain": "drained", "resume": "resumed", "node_remove": "removed"}


R = TypeVar("R")
if TYPE_CHECKING:  # mixed into an App (mypy reads this part of the app with Textual's)
    from textual.app import App

    _Mixin = App[object]
else:
    _Mixin = object


class ClusterActions(_Mixin):
    """The app's requests for a person's actions (mixed into ``NebulaApp``)."""

    client: AsyncClient
    cluster: Cluster
    user: str | None

    if TYPE_CHECKING:
        def tell_screens(self, change: str, key: object = None) -> None: ...

    @overload
    async def call(self, op: str, reply: type[R], **fields: Any) -> R: ...

    @overload
    async def call(self, op: str, reply: None = None, **fields: Any) -> dict[str, Any]: ...

    async def call(self, op: str, reply: type[Any] | None = None, **fields: Any) -> Any:
        """One request to the head, its reply read as ``reply`` (the op's shape in
        ``wire``); raises ApiError (OpMissing for an op it lacks). Every string in the reply
        is made printable (other users' names and commands)."""
        try:
            return printable_tree(await self.client.call(op, **fields))
        except ApiError as err:
            if str(err).startswith("unknown request"):
                raise OpMissing(f"'{op}' is not available on this service") from None
            raise ApiError(printable(err)) from None

    @work(group="why")
    async def show_why(self, job_id: int) -> None:
        """The ``why`` group: the head's `nebula why` answer for a job, in a dialog."""
        try:
            answer = cast(WhyJob, (await self.call("why", WhyReply, **WhyRequest(job=job_id)))["why"])  # (a job's)
        except (OpMissing, ApiError) as err:
            self.notify(str(err), title=f"Cannot explain job {job_id}", severity="warning")
            return
        self.push_screen(ChoiceScreen(f"Why job {job_id}", Text(why_text(answer)),
                                      (Choice("c", "Close", None),)))

    @work(group="actions")
    async def job_action(self, op: str, job_id: int) -> None:
        """The ``actions`` group: cancel / hold / release one job; the outcome (or the
        service's refusal) becomes a notification."""
        try:
            await self.call(op, JobReply, **JobRequest(job=job_id))
        except OpMissing as err:
            self.notify(str(err), title=f"Cannot {op} job {job_id}", severity="warning")
        except ApiError as err:
            self.notify(str(err), title=f"Cannot {op} job {job_id}", severity="error")
        else:
            self.notify(f"Job {job_id} {DONE_VERB.get(op, op)}")

    def action_command_line(self) -> None:
        if isinstance(self.screen, ModalScreen):
            raise SkipAction()
        cluster = self.cluster
        suggestions = commandline.completions(
            list(cluster.jobs) + list(cluster.finished), cluster.nodes,
            [f"{g['node']}:{g['index']}" for g in cluster.gpus.values()],
            {j["user"] for j in cluster.jobs.values()} | ({self.user} if self.user else set()))

        def done(command: Command | None) -> None:
            if command is not None:
                self.run_command(command)

        self.push_screen(CommandLine(suggestions), done)

    def run_command(self, command: Command) -> None:
        """Carry out a parsed ``:`` command, as its spec says (``commandline.COMMANDS``)."""
        name, args = command
        commandline.BY_NAME[name].run(self, args)

    def find_gpu(self, name: str) -> str | None:
        """The uuid of a GPU given as node:index or uuid (None, said, when there is none)."""
        for uuid, gpu in self.cluster.gpus.items():
            if name in (uuid, f"{gpu['node']}:{gpu['index']}"):
                return uuid
        self.notify(f"no GPU '{name}' on this cluster; the GPU screen (2) lists them",
                    severity="warning")
        return None

    def known_node(self, name: str) -> bool:
        if name in self.cluster.nodes:
            return True
        known = ", ".join(sorted(self.cluster.nodes)) or "none yet"
        self.notify(f"no node '{name}'; the nodes are: {known}", severity="warning")
        return False

    @work(group="ask")
    async def ask_cancel(self, job_id: int) -> None:
        """The ``ask`` group: cancel a job once its owner said yes, naming the job."""
        job = self.cluster.jobs.get(job_id)
        if job is None:
            try:
                job = (await self.call("job", JobDetailReply, **JobRequest(job=job_id)))["job"]
            except ApiError as err:
                self.notify(str(err), title=f"Cannot cancel job {job_id}", severity="error")
                return
        if job["state"] in ("succeeded", "failed", "cancelled", "timeout"):
            self.notify(f"job {job_id} has already ended ({job['state']})", severity="warning")
            return
        body = Text(job_summary(job).capitalize() + ".\n")
        body.append(f"Command: {command_line(job)}\n", style="dim")
        body.append("Its processes are stopped; its log stays readable.")
        if await self.push_screen_wait(confirm(f"Cancel job {job_id}?", body, "Cancel the job")):
            self.job_action("cancel", job_id)

    def running_on(self, node: str) -> list[LiveJob]:
        return sorted((j for j in self.cluster.jobs.values()
                       if j["state"] in ("running", "launching")
                       and any(g["node"] == node for g in j["gpus"])), key=lambda j: j["id"])

    def _jobs_lines(self, jobs: list[LiveJob]) -> str:
        lines = [f"  {job_summary(j)}" for j in jobs[:6]]
        if len(jobs) > 6:
            lines.append(f"  … and {len(jobs) - 6} more")
        return "\n".join(lines)

    def ask_drain(self, node: str, reason: str | None = None) -> None:
        """Drain once the admin gave a reason (Esc refuses), naming the node's running jobs."""
        running = self.running_on(node)
        if running:
            body = (f"No new jobs start on {node}. Its {len(running)} running "
                    f"job{'s' if len(running) > 1 else ''} go on:\n{self._jobs_lines(running)}")
        else:
            body = f"No new jobs start on {node}; no job runs there now."

        def answered(given: str | None) -> None:
            if given is not None:
                self.node_action("drain", node, given or "drained from the TUI")

        self.push_screen(DrainPrompt(f"Drain {node}?", body, reason or ""), answered)

    @work(group="ask")
    async def ask_remove(self, node: str) -> None:
        running = self.running_on(node)
        body = (f"{node} leaves nodes.yaml and the cluster."
                + (f"\nIts {len(running)} running job{'s' if len(running) > 1 else ''}:\n"
                   f"{self._jobs_lines(running)}" if running else "\nNo job runs there now."))
        if await self.push_screen_wait(confirm(f"Remove {node}?", body, "Remove the node")):
            self.node_action("node_remove", node)

    @work(group="node-actions")
    async def node_action(self, op: str, node: str, reason: str = "") -> None:
        """The ``node-actions`` group: drain, resume or remove; a refusal becomes a
        notification. The head's answer is folded in at once (its node event follows)."""
        fields = DrainRequest(node=node, reason=reason) if op == "drain" else NodeRequest(node=node)
        now: NodeWire | None = None  # (a node removed is none)
        try:
            if op == "node_remove":
                await self.call(op, ReloadReply, **fields)
            else:
                now = (await self.call(op, NodeReply, **fields))["node"]
        except OpMissing as err:
            self.notify(str(err), title=f"Cannot {op.replace('node_', '')} {node}", severity="warning")
            return
        except ApiError as err:
            self.notify(str(err), title=f"Cannot {op.replace('node_', '')} {node}", severity="error")
            return
        if isinstance(now, dict):
            self.cluster.apply_node(now)
            self.tell_screens("node", node)
        self.notify(f"{node} {NODE_DONE.get(op, op)}")
