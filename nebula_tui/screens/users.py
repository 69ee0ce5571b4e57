"""Users: fair share and this month's accounting. Each user's weight (R6), GPU-hours
against the quota (R7), this month's figures of their ended jobs as ``nebula report`` counts
them (efficiency: how busy their cards were while they held them; GPU-hours held idle; mean
wait), running and waiting jobs, and the jobs of the user under the cursor. Above them, the
cluster's month: the GPU-hours its cards had, those jobs held, and how busy the cards were.

Each user's row comes from the stream (the snapshot's ``users``, then a ``user`` event
whenever their figures move); waiting jobs are counted from the queue. The cluster's month
is not in the stream: it is the head's ``report`` (the request of ``nebula report``), asked
when the screen is first shown and again, at most every ``REPORT_EVERY_S``, when users'
figures move (worker group ``month-report``)."""

from __future__ import annotations

import time

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.timer import Timer
from textual.widgets import Static

from ..api import ApiError
from ..client.cluster import user_weight
from ..model import fmt
from ..units import duration_short
from ..views import month_start
from ..wire import ReportNodeRow, ReportReply, ReportRequest, UserRow
from .base import ClusterScreen, OpMissing
from .render import elapsed_text, fill_bar, job_state, job_where, now, state_text
from .widgets.keys import USERS_KEYS
from .widgets.rowtable import Column, RowTable, Sort

#: Left out first when narrow: all-time and live counts (the jobs panel shows the live
#: ones), then the month's, the month's efficiency last.
USER_COLUMNS = (Column("name", "User"), Column("weight", "Weight"),
                Column("hours", "GPU-hours / quota"), Column("efficiency", "Efficiency", 1),
                Column("idle", "Idle GPU-h", 2), Column("wait", "Wait", 3),
                Column("jobs", "Jobs", 4), Column("running", "Running", 5),
                Column("waiting", "Waiting", 5), Column("finished", "Finished", 6))
USER_JOB_COLUMNS = (Column("id", "ID"), Column("name", "Name", 2), Column("state", "State"),
                    Column("time", "Time", 1), Column("where", "GPUs / reason", flex=True))

#: How the user's jobs sort.
JOB_SORTS = {"id": Sort(lambda j: j["id"]), "name": Sort(lambda j: j.get("name") or ""),
             "state": Sort(job_state), "time": Sort(lambda j: j["submitted_at"]),
             "where": Sort(job_where)}

#: The cluster's month is asked for again at most this often while figures move (seconds):
#: a month of telemetry is summed for it, in the head's thread, not its loop, but not free.
REPORT_EVERY_S = 15.0
#: Cells of the quota bar.
QUOTA_BAR = 6


def quota_h(row: UserRow) -> float:
    """The user's monthly quota as the head has it: their own, else nodes.yaml's
    ``scheduler.quota_gpu_hours`` (whose default only the settings write)."""
    return row["quota_gpu_hours"]


def month_hours(row: UserRow) -> float:
    return row.get("month_gpu_hours", row.get("gpu_hours")) or 0.0


def hours_text(hours: float | None) -> str:
    """GPU-hours with the digits that matter: 2030, 310.5, 4.25, 0.002 (a short job's)."""
    hours = hours or 0.0
    if hours >= 100:
        return f"{hours:.0f}"
    if hours >= 10:
        return f"{hours:.1f}"
    return f"{hours:.2f}" if hours >= 1 else f"{hours:.3f}" if hours else "0"


def user_cells(row: UserRow, waiting: int) -> tuple:
    quota, hours = quota_h(row), month_hours(row)
    cell = fill_bar(hours / quota if quota else None, QUOTA_BAR)
    cell.append(f" {hours_text(hours)} / {quota:.0f} h")
    return (row["name"], f"{user_weight(row):.2f}", cell,
            fmt(row.get("month_efficiency_pct"), "%"), hours_text(row.get("month_idle_gpu_hours")),
            duration_short(row.get("month_mean_wait_s")), str(row.get("month_jobs", 0)),
            str(row.get("running_jobs", 0)), str(waiting), str(row.get("jobs_finished", 0)))


def month_text(cluster: ReportNodeRow | None, note: str = "") -> Text:
    """The cluster's line: "December 2026 so far: 412.3 of 1944 GPU-hours allocated (21%) ·
    cards 34% busy" (``cluster``: the report's cluster row; one line at 80 columns)."""
    if cluster is None:
        return Text(note or "This month: asking the head…", style="dim")
    try:
        month = time.strftime("%B %Y", time.strptime(cluster["period"], "%Y-%m"))
    except ValueError:
        month = cluster["period"]
    text = Text(f"{month} so far: ")
    text.append(hours_text(cluster["allocated_gpu_hours"]), style="bold")
    text.append(f" of {hours_text(cluster['available_gpu_hours'])} GPU-hours allocated "
                f"({fmt(cluster['allocated_pct'], '%')}) · ")
    busy = cluster.get("util_pct")
    text.append(f"cards {fmt(busy, '%')} busy" if busy is not None else "no card read yet")
    return text


def _figure(field: str):
    """A sort key on a month figure that may be missing (no job ended): those sort last."""
    return lambda u: (u.get(field) is not None, u.get(field) or 0)


class UsersScreen(ClusterScreen):
    SCREEN_TITLE = "Users"
    KEYS = USERS_KEYS

    def __init__(self) -> None:
        super().__init__()
        self._waiting: dict[str, int] = {}
        self._wanted: str | None = None  # a user asked for (``:user``) before the rows came
        self.month: ReportNodeRow | None = None  # the head's report row of the cluster's month
        self._month_note = ""  # why there is none
        self._month_asked = -REPORT_EVERY_S  # when (monotonic) it was last asked for
        self._month_timer: Timer | None = None

    def compose_body(self) -> ComposeResult:
        sorts = {"name": Sort(lambda u: u["name"]), "weight": Sort(user_weight),
                 "hours": Sort(month_hours, True),
                 "efficiency": Sort(_figure("month_efficiency_pct"), True),
                 "idle": Sort(_figure("month_idle_gpu_hours"), True),
                 "wait": Sort(_figure("month_mean_wait_s"), True),
                 "jobs": Sort(lambda u: u.get("month_jobs", 0), True),
                 "running": Sort(lambda u: u.get("running_jobs", 0), True),
                 "waiting": Sort(lambda u: self._waiting.get(u["name"], 0), True),
                 "finished": Sort(lambda u: u.get("jobs_finished", 0), True)}
        with Vertical(id="body"):
            yield Static(month_text(None), id="users-month")
            yield Static(Text("Lowest weight runs first: 1.0 + 0.02 per GPU-hour charged.",
                              style="dim"), id="users-note")
            yield RowTable(USER_COLUMNS, self._cells, sorts=sorts, natural="fair-share order",
                           id="users-table")
            yield RowTable(USER_JOB_COLUMNS, self._job_cells, sorts=JOB_SORTS,
                           natural="running first", id="user-jobs")

    def on_mount(self) -> None:
        if (table := self.live_table("#users-table")) is not None:
            table.border_subtitle = "efficiency (card use while held), idle, mean wait, jobs: ended this month"
            table.focus()
        if (jobs := self.live_table("#user-jobs")) is not None:
            jobs.border_title = "Jobs"

    def cluster_changed(self, change: str, key: object = None) -> None:
        if change in ("all", "job", "user"):
            self.later()
        if change in ("all", "user"):
            self._month_moved()

    def catch_up(self, missed: set[str]) -> None:
        self.render_all()
        if missed & {"all", "user"}:
            self._month_moved()

    # ------------------------------------------------------------ the cluster's month
    def _month_moved(self) -> None:
        """Users' figures moved: ask for the cluster's month again, once, as soon as
        ``REPORT_EVERY_S`` has passed since it was last asked for."""
        if self._month_timer is None:
            due = self._month_asked + REPORT_EVERY_S - time.monotonic()
            if due <= 0:
                self._ask_month()
            else:
                self._month_timer = self.set_timer(due, self._ask_month)

    def _ask_month(self) -> None:
        self._month_timer = None
        if self.is_mounted and self.is_current:
            self._month_asked = time.monotonic()
            self.load_month()
        else:
            self.missed("user")  # asked for when shown again

    @work(exclusive=True, group="month-report")
    async def load_month(self) -> None:
        """The ``month-report`` group: the head's report of this month, its cluster row."""
        t = now()
        try:
            report = (await self.tui.call("report", ReportReply,
                                          **ReportRequest(since=month_start(t), until=t)))["report"]
        except OpMissing:
            self._month_note = "This service keeps no monthly report."
        except ApiError as err:
            self._month_note = f"Cannot load this month's report: {err}"
        else:
            self.month = next((r for r in reversed(report.get("nodes", []))
                               if r["node"] == "cluster"), None)
            self._month_note = "" if self.month else "No GPU has reported this month."
        self.query_one("#users-month", Static).update(month_text(self.month, self._month_note))

    def _cells(self, name: str) -> tuple:
        row = self.cluster.users.get(name)
        return user_cells(row, self._waiting.get(name, 0)) if row else ("-",) * len(USER_COLUMNS)

    def _job_cells(self, key: str) -> tuple:
        job = self.cluster.job(int(key))
        if job is None:
            return ("-",) * len(USER_JOB_COLUMNS)
        return (str(job["id"]), job.get("name") or "-", state_text(job_state(job)),
                elapsed_text(job), job_where(job))

    def render_all(self) -> None:
        waiting: dict[str, int] = {}
        for j in self.cluster.jobs.values():
            if j["state"] == "pending":
                waiting[j["user"]] = waiting.get(j["user"], 0) + 1
        self._waiting = waiting
        table = self.query_one("#users-table", RowTable)
        ordered = sorted(self.cluster.users.values(), key=lambda u: (user_weight(u), u["name"]))
        shown = table.present(ordered, lambda u: u["name"], lambda u: u["name"], "Users")
        if self._wanted in shown:
            table.move_to_key(self._wanted)
            self._wanted = None
        self._show_jobs()

    def _show_jobs(self) -> None:
        """The live jobs of the user under the cursor."""
        name = self.query_one("#users-table", RowTable).cursor_key
        panel = self.query_one("#user-jobs", RowTable)
        jobs = sorted((j for j in self.cluster.jobs.values() if j["user"] == name),
                      key=lambda j: (j["state"] == "pending", j["id"]))
        panel.present(jobs, lambda j: str(j["id"]),
                      lambda j: f"{j['id']} {j.get('name') or ''} {j['state']}",
                      f"{name}'s jobs" if name else "Jobs")

    @on(RowTable.Highlighted, "#users-table")
    def _user_moved(self) -> None:
        self._show_jobs()

    @on(RowTable.Arranged, "#users-table")
    def _users_arranged(self) -> None:
        self.render_all()

    @on(RowTable.Arranged, "#user-jobs")
    def _jobs_arranged(self) -> None:
        self._show_jobs()

    @on(RowTable.Selected, "#users-table")
    def _user_chosen(self) -> None:
        self.action_open_user()

    @on(RowTable.Selected, "#user-jobs")
    def _job_chosen(self, event: RowTable.Selected) -> None:
        self.tui.open_job(int(event.key))

    def select_user(self, name: str) -> None:
        """Put the cursor on ``name`` (``:user NAME``), now or once the rows come."""
        table = self.query_one("#users-table", RowTable)
        try:
            table.move_to_key(name)
        except KeyError:
            if self.cluster.users:
                self.notify(f"no user '{name}' has used this cluster yet", severity="warning")
            else:
                self._wanted = name
        self._show_jobs()

    def action_open_user(self) -> None:
        panel = self.query_one("#user-jobs", RowTable)
        if panel.row_count:
            panel.focus()
        else:
            self.notify("this user has no running or waiting job", severity="information")
