"""Running and waiting jobs: each waiting job with its reason (R5) and its place in the
scheduler's order (R6, priority included); "mine" filter; cancel / hold / release; and
(``a``) every job, ended ones too, with exit code and run time (the ``job_history``
request, R31).

Every job shown is a row (a ``RowTable``: only the rows on screen are computed and
painted), keyed by job id. The order is the head's own (the stream's ``queue`` events),
applied once per batch of job changes; once a second the visible rows are recomputed
(their time moves) and the lines that changed are repainted. Ended jobs come from
``job_history`` (worker group ``job-history``). Under the table, the job under the cursor
says in full why it waits, or how it ended.
"""

from __future__ import annotations

from typing import cast

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

from ..api import ApiError
from ..client.cluster import FINISHED, LiveJob
from ..forecasts import starts_text
from ..views import preemptible_text, running_idle_text
from ..wire import HistoryReply, JobHistoryRequest, JobWire, StartForecast
from ..units import duration_short as duration
from .base import TELEMETRY_EVERY_S, ClusterScreen, OpMissing
from .look import LOOK
from .render import (booking_line, elapsed_text, exit_text, job_size, job_state, job_where,
                     now, run_seconds, state_text)
from .widgets.keys import QUEUE_KEYS
from .widgets.rowtable import Column, RowTable, Sort

QUEUE_COLUMNS = (Column("id", "ID"), Column("user", "User"), Column("name", "Name", 3),
                 Column("state", "State"), Column("pos", "Pos", 4), Column("size", "Asks", 5),
                 Column("time", "Time", 2), Column("exit", "Exit", 1),
                 Column("where", "GPUs / reason", flex=True))

#: Ended jobs the "all jobs" view asks the head for (newest first).
HISTORY_LIMIT = 2000
#: Lines the cursor job's reason may take under the table.
DETAIL_LINES = 3

ACTIVE_STATES = ("running", "launching")


def queue_order(jobs: list[LiveJob], order: list[int]) -> tuple[list[LiveJob], dict[int, int]]:
    """Running first (oldest start first), then the waiting jobs in the head's ``order``
    (those it has not ordered yet, submitted since its last pass, after them by submit
    time), then held ones; and each waiting job's 1-based place in that line."""
    running = sorted((j for j in jobs if j["state"] in ACTIVE_STATES),
                     key=lambda j: (j.get("started_at") or j["submitted_at"], j["id"]))
    waiting_by_id = {j["id"]: j for j in jobs if j["state"] == "pending" and not j.get("held")}
    waiting = [waiting_by_id.pop(job_id) for job_id in order if job_id in waiting_by_id]
    waiting += sorted(waiting_by_id.values(), key=lambda j: (j["submitted_at"], j["id"]))
    held = sorted((j for j in jobs if j["state"] == "pending" and j.get("held")),
                  key=lambda j: (j["submitted_at"], j["id"]))
    place = {j["id"]: n for n, j in enumerate(waiting, start=1)}
    return running + waiting + held, place


#: The cells of a row whose job has just left the queue (until the next re-order drops it).
GONE = ("-",) * len(QUEUE_COLUMNS)


def queue_cells(job: JobWire, place: int | None, at: float) -> tuple:
    where = " · ".join(filter(None, (preemptible_text(job), job_where(job), running_idle_text(job, at))))
    return (str(job["id"]), job["user"], job["name"] or "-", state_text(job_state(job)),
            str(place) if place else "-", job_size(job), elapsed_text(job, at), exit_text(job),
            where)


def ended_where(job: JobWire) -> str:
    """Where an ended job ran, or what ended it before it ran."""
    where = ", ".join(f"{g['node']}:{g['index']}" for g in job.get("gpus") or ())
    reason = job.get("reason") or ""
    if reason and reason != job["state"]:
        return f"{where} · {reason}" if where else reason
    return where or job_size(job)


def job_detail(job: JobWire, at: float) -> Text:
    """The cursor job in one or two sentences: why it waits, where it runs, how it ended."""
    state = job_state(job)
    text = Text(f"Job {job['id']} ", style="bold")
    if tag := preemptible_text(job):
        text.append(f"({tag}) ")
    text.append(state, style=LOOK.state(state))
    forecast = cast("StartForecast | None", job.get("starts"))  # (a waiting job's, from the stream)
    if state == "pending" and (starts := starts_text(forecast, at)):
        text.append(f", starts {starts}")
    if state == "pending" and job.get("reason"):
        text.append(f": {job['reason']}")
    elif state == "held":
        text.append(f" by {job.get('held_by') or 'someone'}; u releases it")
    elif state in ACTIVE_STATES:
        text.append(f" on {job_where(job)} for {elapsed_text(job, at)}")
        if idle := running_idle_text(job, at):
            text.append(f", {idle}")
    elif job["state"] in FINISHED:
        code = job.get("exit_code")
        text.append(f" after {duration(run_seconds(job, at))}" if job.get("started_at") else
                    " before it started")
        if code is not None:
            text.append(f", exit code {code}")
        if job.get("reason") and job["reason"] != job["state"]:
            text.append(f": {job['reason']}")
    return text


class QueueScreen(ClusterScreen):
    SCREEN_TITLE = "Queue"
    KEYS = QUEUE_KEYS

    def __init__(self) -> None:
        super().__init__()
        self.mine = False
        self.all_jobs = False  # the ended jobs too (history)
        self.history: dict[int, JobWire] = {}  # ended jobs from the head, newest first
        self.history_note = ""
        self._ordered: list[LiveJob] = []  # every live job in queue order
        self._place: dict[int, int] = {}  # waiting job id -> its place in the line

    def compose_body(self) -> ComposeResult:
        sorts = {"id": Sort(lambda j: j["id"]), "user": Sort(lambda j: j["user"]),
                 "name": Sort(lambda j: j.get("name") or ""),
                 "state": Sort(lambda j: job_state(j)),
                 "pos": Sort(lambda j: self._place.get(j["id"], 1 << 30)),
                 "size": Sort(lambda j: (j["gpu_count"], j.get("gpu_mem_mb") or 1 << 30), True),
                 "time": Sort(self._seconds, True),
                 "exit": Sort(lambda j: (j.get("exit_code") is None, j.get("exit_code") or 0)),
                 "where": Sort(job_where)}
        with Vertical(id="body"):
            yield Static("", id="queue-summary")
            yield Static("", id="queue-bookings")
            yield RowTable(QUEUE_COLUMNS, self._cells, sorts=sorts, natural="queue order",
                           id="queue-table")
            yield Static("", id="queue-detail")

    def on_mount(self) -> None:
        if (table := self.live_table("#queue-table")) is not None:
            table.hide_columns({"exit"})
            table.focus()
        self.set_interval(TELEMETRY_EVERY_S, self._tick)

    def _seconds(self, job: JobWire) -> float:
        ran = run_seconds(job)
        return ran if ran is not None else (job.get("ended_at") or now()) - job["submitted_at"]

    @work(exclusive=True, group="job-history")
    async def load_history(self) -> None:
        """The ``job-history`` group: the ended jobs (newest first) for the "all" view."""
        try:
            reply = await self.tui.call("job_history", HistoryReply, **JobHistoryRequest(limit=HISTORY_LIMIT))
        except OpMissing:
            self.history_note = "this service keeps no history: ended jobs seen since the TUI started"
        except ApiError as err:
            self.history_note = f"cannot load the history: {err}"
        else:
            self.history = {j["id"]: j for j in reply.get("jobs", [])}
            self.history_note = ""
        if self.all_jobs:
            self._show()

    def cluster_changed(self, change: str, key: object = None) -> None:
        if change in ("all", "job", "queue"):
            self.later()
        elif change == "bookings":
            self._show_bookings()

    def _show_bookings(self) -> None:
        """The bookings under way or ahead, one a line (the box is hidden without any)."""
        box = self.query_one("#queue-bookings", Static)
        lines = [booking_line(b) for b in self.cluster.bookings]
        box.display = bool(lines)
        box.update("\n".join(f"booked: {line}" for line in lines))

    def _tick(self) -> None:
        """Once a second: the visible rows' times move."""
        if self.is_current:
            self.query_one("#queue-table", RowTable).refresh_rows()
            self._show_detail()

    def _cells(self, key: str) -> tuple:
        job = self.cluster.job(int(key)) or self.history.get(int(key))
        if job is None:
            return GONE
        if job["state"] in FINISHED:
            return (*queue_cells(job, None, now())[:-1], ended_where(job))
        return queue_cells(job, self._place.get(job["id"]), now())

    def catch_up(self, missed: set[str]) -> None:
        if missed & {"all", "bookings"}:
            self._show_bookings()
        if missed & {"all", "job", "queue"}:
            self.render_all()
        else:  # readings, nodes, events: the order stands (sorting 10,000 jobs is dear),
            self._tick()  # but the times on screen moved

    def render_all(self) -> None:
        """Order every job (once per batch of changes), then show them."""
        self._ordered, self._place = queue_order(list(self.cluster.jobs.values()),
                                                 self.cluster.queue_order)
        self._show()
        self._show_bookings()

    def _ended(self) -> list[JobWire]:
        """Ended jobs, newest end first: the head's history and those seen ending since."""
        ended = {**self.history, **self.cluster.finished}
        return sorted(ended.values(), key=lambda j: (-(j.get("ended_at") or 0), -j["id"]))

    def _show(self) -> None:
        """The ordered jobs, or only mine: a filter of the order, not a new one, so a
        waiting job's Pos is its place in the whole line either way."""
        me = self.tui.user
        live = self._ordered + (self._ended() if self.all_jobs else [])
        jobs = [j for j in live if not self.mine or j["user"] == me]
        table = self.query_one("#queue-table", RowTable)
        table.hide_columns(() if self.all_jobs else {"exit"})
        shown = table.present(jobs, lambda j: str(j["id"]), self._text)
        running = sum(1 for j in jobs if j["state"] in ACTIVE_STATES)
        held = sum(1 for j in jobs if j.get("held") and j["state"] == "pending")
        ended = sum(1 for j in jobs if j["state"] in FINISHED)
        waiting = len(jobs) - running - held - ended
        who = f"{me}'s jobs" if self.mine else "all users"
        summary = Text.assemble((f" {running} running", LOOK.state("running")), " · ",
                                (f"{waiting} waiting", LOOK.state("pending")), " · ",
                                (f"{held} held", "dim"))
        if self.all_jobs:
            summary.append(f" · {ended} ended", style="dim")
        summary.append(f" · {who}  (m: only mine · a: {'active only' if self.all_jobs else 'all jobs'})")
        if self.all_jobs and self.history_note:
            summary.append(f" · {self.history_note}", style=LOOK.role("warn"))
        self.query_one("#queue-summary", Static).update(summary, layout=False)  # one line, always
        table.set_title("All jobs" if self.all_jobs else "Queue", len(shown), len(jobs))
        self._show_detail()

    @staticmethod
    def _text(job: JobWire) -> str:
        return " ".join((str(job["id"]), job["user"], job.get("name") or "", job_state(job),
                         job_where(job)))

    def _show_detail(self) -> None:
        key = self.query_one("#queue-table", RowTable).cursor_key
        job = (self.cluster.job(int(key)) or self.history.get(int(key))) if key else None
        text = job_detail(job, now()) if job else Text("")
        self.query_one("#queue-detail", Static).update(text)

    @on(RowTable.Highlighted, "#queue-table")
    def _moved(self) -> None:
        self._show_detail()

    @on(RowTable.Arranged, "#queue-table")
    def _arranged(self) -> None:
        self._show()

    # ------------------------------------------------------------------ actions
    def _selected(self) -> int | None:
        key = self.query_one("#queue-table", RowTable).cursor_key
        if key is None:
            self.notify("No job selected: the queue is empty", severity="warning")
            return None
        return int(key)

    def action_cancel_job(self) -> None:
        if (job_id := self._selected()) is not None:
            self.tui.ask_cancel(job_id)

    def action_hold_job(self) -> None:
        if (job_id := self._selected()) is not None:
            self.tui.job_action("hold", job_id)

    def action_release_job(self) -> None:
        if (job_id := self._selected()) is not None:
            self.tui.job_action("release", job_id)

    def action_why_job(self) -> None:
        if (job_id := self._selected()) is not None:
            self.tui.show_why(job_id)

    def action_toggle_mine(self) -> None:
        self.mine = not self.mine
        self._show()

    def action_toggle_all(self) -> None:
        self.show_all(not self.all_jobs)

    def show_all(self, everything: bool) -> None:
        """Every job, ended ones too (``everything``), or only the active ones."""
        self.all_jobs = everything
        if everything:
            self.load_history()
        self._show()

    def action_open_job(self) -> None:
        if (job_id := self._selected()) is not None:
            self.tui.open_job(job_id)

    @on(RowTable.Selected, "#queue-table")
    def _row_selected(self, event: RowTable.Selected) -> None:
        self.tui.open_job(int(event.key))
