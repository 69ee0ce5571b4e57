"""One job: its spec, allocation, R12 environment, state history, live log tail, attach.

Workers: ``job-load`` (the job and its lines of the head's events log, again whenever the
job changes state), ``log`` (follow mode: ``logs`` requests from the last offset, one chunk
message per answer; once the job has ended and its log is read to the end, a last line says
how it ended), ``attach`` (asks the head for the attach command; the handler suspends the
TUI and runs it).
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import subprocess
import sys
import time
from collections.abc import Mapping
from typing import Any, cast

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult, SuspendNotSupported
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.widgets import Log, Static

from ..api import ApiError
from ..client.cluster import FINISHED
from ..forecasts import starts_text
from ..model import format_mb
from ..views import workdir_text
from ..wire import (AttachInfoReply, EventRow, EventsReply, EventsRequest, JobDetailReply, JobRequest, JobWire,
                    LogsReply, LogsRequest, StartForecast)
from ..units import duration_short as duration
from .base import ClusterScreen, OpMissing
from .render import ago, clock, job_size, job_state, run_seconds, state_text
from .widgets.keys import JOB_KEYS

#: How often the log is polled while following (seconds).
LOG_POLL_S = 0.5
#: Lines kept in the log view.
LOG_MAX_LINES = 5000


class LogChunk(Message):
    """New log text of the job from byte ``offset`` on; ``state`` is the job's state then."""

    def __init__(self, data: str, state: str) -> None:
        super().__init__()
        self.data = data
        self.state = state


class JobLoaded(Message):
    """The job as the head has it, and its events log lines (oldest first)."""

    def __init__(self, job: JobWire, events: list[EventRow]) -> None:
        super().__init__()
        self.job = job
        self.events = events


class AttachReady(Message):
    """The command that attaches a terminal to the job's tmux session."""

    def __init__(self, argv: list[str]) -> None:
        super().__init__()
        self.argv = argv


def end_line(job: JobWire) -> str:
    """The log's last line once the job has ended: how, when, after how long."""
    code = job.get("exit_code")
    how = job["state"] + (f", exit code {code}" if code is not None else "")
    if job.get("reason") and job["reason"] != job["state"]:
        how += f": {job['reason']}"
    when = f" at {clock(job['ended_at'])}" if job.get("ended_at") else ""
    ran = run_seconds(job)
    after = f" after {duration(ran)}" if ran is not None else ""
    return f"── job {job['id']} ended{when}{after}: {how} ──"


def spec_text(job: JobWire) -> Text:
    state = job_state(job)
    command = job["command"][0] if job.get("shell") else shlex.join(job["command"])
    reason = job.get("reason") or ""
    lines = [
        Text.assemble(("State     ", "bold"), state_text(state),
                      (f" — {reason}" if reason and reason != job["state"] else "", "")),
        Text.assemble(("User      ", "bold"), job["user"]),
        Text.assemble(("Name      ", "bold"), job.get("name") or "-"),
        Text.assemble(("Command   ", "bold"), command),
        Text.assemble(("Asks      ", "bold"), job_size(job)),
        Text.assemble(("Workdir   ", "bold"), workdir_text(job)),
        Text.assemble(("Submitted ", "bold"), f"{clock(job['submitted_at'])} ({ago(job['submitted_at'])} ago)"),
    ]
    forecast = cast("StartForecast | None", job.get("starts"))  # (a waiting job's, from the stream)
    if state == "pending" and (starts := starts_text(forecast, time.time())):
        lines.append(Text.assemble(("Starts    ", "bold"), starts,
                                   (" (w: why, and what would start it sooner)", "dim")))
    if job.get("started_at"):
        lines.append(Text.assemble(("Started   ", "bold"), clock(job["started_at"])))
    if job.get("ended_at"):
        code = "" if job.get("exit_code") is None else f", exit code {job['exit_code']}"
        lines.append(Text.assemble(("Ended     ", "bold"), clock(job["ended_at"]) + code))
    if job.get("gpus"):
        lines.append(Text("Allocation", style="bold"))
        for g in job["gpus"]:
            kind = "whole card" if g["exclusive"] else f"{format_mb(g['memory_mb'])} slice"
            lines.append(Text(f"  {g['node']}:{g['index']}  {kind}  {g['uuid']}"))
    return Text("\n").join(lines)


def env_text(environment: dict[str, dict[str, str]], job: JobWire | None = None) -> Text:
    """What the head says each of the job's nodes gives its command (R12)."""
    if not environment:
        pool = job.get("pool") if job else None
        if pool:  # a batch cluster's nodes: their variables are its own, unseen from here
            return Text(f"Set by pool {pool}'s batch system on its nodes (its own variables, such as "
                        "CUDA_VISIBLE_DEVICES, and the lab's, in the job's batch script); not seen from here.",
                        style="dim")
        return Text("Set when the job is placed.", style="dim")
    lines = []
    for rank, (node, env) in enumerate(environment.items()):
        if len(environment) > 1:
            lines.append(Text(f"{node} (rank {rank})", style="underline"))
        lines += [Text.assemble((k, "bold"), "=", v) for k, v in env.items()]
    return Text("\n").join(lines)


def placement_of(job: JobWire | None) -> tuple:
    """The GPUs a job holds, as a key: its environment changes only with them."""
    return tuple((g["uuid"], g["memory_mb"]) for g in (job.get("gpus", ()) if job else ()))


class JobScreen(ClusterScreen):
    SCREEN_TITLE = "Job"
    KEYS = JOB_KEYS

    def __init__(self, job_id: int) -> None:
        super().__init__()
        self.job_id = job_id
        self.job: JobWire | None = None
        self.environment: dict[str, dict[str, str]] = {}  # node -> its variables (the head's)
        self._environment_for: tuple | None = None  # the placement it was computed for
        self.history: list[EventRow] = []  # events log lines of this job
        self.follow = True
        self.log_offset = 0
        self.log_lines = 0
        self.log_ended = False  # the end line is written
        self._log_done = False  # the log of the ended job is read to its end
        self._open_line = False  # the log's last line has no newline yet
        self._history_state: str | None = None  # the state the history was loaded for

    def crumb(self) -> str:
        name = self.job.get("name") if self.job else None
        return f"Job {self.job_id}" + (f" · {name}" if name else "")

    def compose_body(self) -> ComposeResult:
        with Vertical(id="job-body"):
            with Horizontal(id="job-top"):
                yield Static("Loading…", id="job-spec")
                with Vertical(id="job-side"):
                    yield Static("", id="job-env")
                    yield Static("", id="job-history")
            yield Log(id="job-log", max_lines=LOG_MAX_LINES)

    def on_mount(self) -> None:
        self.query_one("#job-spec").border_title = f"Job {self.job_id}"
        self.query_one("#job-env").border_title = "Environment"
        self.query_one("#job-history").border_title = "State history"
        self.query_one("#job-log").border_title = "Log (following)"
        self.job = self.cluster.job(self.job_id)
        self.load_job()
        self.tail_log()

    # ------------------------------------------------------------------ workers
    @work(exclusive=True, group="job-load")
    async def load_job(self) -> None:
        """The ``job-load`` group: the job and its events log lines, once per screen."""
        try:
            job = (await self.tui.call("job", JobDetailReply, **JobRequest(job=self.job_id)))["job"]
        except ApiError as err:
            self.query_one("#job-spec", Static).update(Text(str(err), style="red"))
            return
        try:
            events = (await self.tui.call("events", EventsReply, **EventsRequest(limit=2000)))["events"]
        except ApiError:
            events = []
        mine = sorted((e for e in events if e.get("job_id") == self.job_id),
                      key=lambda e: e.get("t") or 0)  # (stable: same-second lines keep their order)
        self.post_message(JobLoaded(job, mine))

    @work(exclusive=True, group="log")
    async def tail_log(self) -> None:
        """The ``log`` group: read the log from ``self.log_offset`` while following; stops once
        the job has ended and everything is read, or when follow is switched off."""
        while self.follow:
            try:
                reply = await self.tui.call("logs", LogsReply, **LogsRequest(job=self.job_id, offset=self.log_offset))
            except ApiError as err:
                self.post_message(LogChunk(f"[cannot read the log: {err}]\n", "?"))
                return
            self.log_offset = reply.get("offset", self.log_offset)
            data = reply.get("data", "")
            if data:
                self.post_message(LogChunk(data, reply.get("state", "?")))
            elif reply.get("state") in FINISHED:
                self.post_message(LogChunk("", reply["state"]))
                return
            await asyncio.sleep(LOG_POLL_S)

    @work(exclusive=True, group="attach")
    async def fetch_attach(self) -> None:
        """The ``attach`` group: ask the head how to attach; the handler runs it."""
        try:
            argv = (await self.tui.call("attach_info", AttachInfoReply, **JobRequest(job=self.job_id)))["argv"]
        except OpMissing as err:
            self.notify(str(err), title="Cannot attach", severity="warning")
            return
        except ApiError as err:
            self.notify(str(err), title="Cannot attach", severity="error")
            return
        self.post_message(AttachReady(argv))

    # ------------------------------------------------------------------ handlers
    @work(exclusive=True, group="job-environment")
    async def load_environment(self) -> None:
        """The ``job-environment`` group: the job's environment, once per placement."""
        with contextlib.suppress(ApiError):
            job = (await self.tui.call("job", JobDetailReply, **JobRequest(job=self.job_id)))["job"]
            self._show_environment(job)

    def _show_environment(self, job: JobWire) -> None:
        detail: Mapping[str, Any] = job  # (the job's page has it; a job event has not)
        self.environment = detail.get("environment") or {}
        self._environment_for = placement_of(job)
        self.query_one("#job-env", Static).update(env_text(self.environment, job))

    @on(JobLoaded)
    def show_loaded(self, message: JobLoaded) -> None:
        self._show_environment(message.job)
        self.job = self.cluster.job(self.job_id) or message.job
        self._history_state = message.job["state"]
        # The head's own lines, in the order it wrote them: nothing made up beside them.
        self.history = message.events
        if self._log_done:
            self._write_end()
        self.render_all()
        self.show_bar()  # the crumb names the job

    @on(LogChunk)
    def show_log_chunk(self, message: LogChunk) -> None:
        log = self.query_one("#job-log", Log)
        if message.data:
            log.write(message.data, scroll_end=self.follow)
            self._open_line = not message.data.endswith("\n")
            self.log_lines = log.line_count
        if message.state in FINISHED:
            log.border_title = f"Log (job {message.state})"
            if not message.data:  # read to the end
                self._log_done = True
                self._write_end()

    def _write_end(self) -> None:
        """The log's last line says how the job ended (once its end is known)."""
        job = self.job
        if self.log_ended or job is None or job["state"] not in FINISHED:
            return
        log = self.query_one("#job-log", Log)
        # Under the job's last line, which may lack its newline.
        log.write(("\n" if self._open_line else "") + end_line(job) + "\n", scroll_end=self.follow)
        self.log_ended = True

    @on(AttachReady)
    def run_attach(self, message: AttachReady) -> None:
        try:
            with self.app.suspend():
                # The TUI is suspended: the terminal belongs to tmux until the user detaches.
                # `nebula attach` is this program, through this TUI's own service.
                argv = message.argv
                if argv[:1] == ["nebula"]:
                    argv = [sys.executable, "-m", "nebula_tui", "--socket",
                            str(self.tui.client.path), *argv[1:]]
                subprocess.run(argv)
        except SuspendNotSupported:
            self.notify(f"Attach needs a real terminal; run: {shlex.join(message.argv)}",
                        title="Cannot attach here", severity="warning", timeout=15)
        except OSError as err:
            self.notify(str(err), title="Cannot attach", severity="error")

    def cluster_changed(self, change: str, key: object = None) -> None:
        if change in ("job", "job-live", "all") and (change == "all" or key == self.job_id):
            self._follow_job()

    def catch_up(self, missed: set[str]) -> None:
        # Shown again (after a question asked over it, say): the job may have ended meanwhile.
        self._follow_job()

    def _follow_job(self) -> None:
        """Show the job as the cluster has it now: placed again, the head has its new
        environment; the stream's lines for it join its history; an ended job whose log is
        read to the end gets its end line."""
        self.job = self.cluster.job(self.job_id) or self.job
        if self.job and self._environment_for is not None and placement_of(self.job) not in (
                self._environment_for, ()):
            self.load_environment()
        last = self.cluster.events[-1] if self.cluster.events else None
        if last and last.get("job_id") == self.job_id and last not in self.history:
            self.history.append(last)
        if self.job and self.job["state"] != self._history_state and self._history_state:
            self._history_state = self.job["state"]
            self.load_job()  # the head wrote what happened: read it
        if self._log_done:
            self._write_end()
        self.render_all()

    def render_all(self) -> None:
        if self.job is None:
            return
        self.query_one("#job-spec", Static).update(spec_text(self.job))
        lines = [Text.assemble((clock(e.get("t")) + " ", "dim"), e.get("message", ""))
                 for e in self.history[-12:]]
        self.query_one("#job-history", Static).update(
            Text("\n").join(lines) if lines else Text("No events yet.", style="dim"))
        name = f" · {self.job['name']}" if self.job.get("name") else ""
        self.query_one("#job-spec").border_title = f"Job {self.job_id}{name}"

    # ------------------------------------------------------------------ actions
    def action_toggle_follow(self) -> None:
        self.follow = not self.follow
        log = self.query_one("#job-log", Log)
        log.auto_scroll = self.follow
        log.border_title = "Log (following)" if self.follow else "Log (paused: f follows)"
        if self.follow:
            log.scroll_end(animate=False)
            self.tail_log()

    def action_attach(self) -> None:
        self.fetch_attach()

    def action_cancel_job(self) -> None:
        self.tui.ask_cancel(self.job_id)

    def action_hold_job(self) -> None:
        self.tui.job_action("hold", self.job_id)

    def action_release_job(self) -> None:
        self.tui.job_action("release", self.job_id)

    def action_why_job(self) -> None:
        self.tui.show_why(self.job_id)
