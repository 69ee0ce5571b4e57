"""Users and fair share: each user's weight (R6), GPU-hours against the quota (R7), running
and waiting jobs, and the jobs of the user under the cursor. Each user's row comes from
the stream (the snapshot's ``users``, then a ``user`` event whenever their figures move);
waiting jobs are counted from the queue."""

from __future__ import annotations

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

from .base import ClusterScreen
from .cluster import user_weight
from .keys import USERS_KEYS
from .render import elapsed_text, fill_bar, job_state, job_where, state_text
from .rowtable import Column, RowTable, Sort

USER_COLUMNS = (Column("name", "User"), Column("weight", "Weight"),
                Column("hours", "GPU-hours / quota"), Column("running", "Running"),
                Column("waiting", "Waiting"), Column("finished", "Finished", 1))
USER_JOB_COLUMNS = (Column("id", "ID"), Column("name", "Name", 2), Column("state", "State"),
                    Column("time", "Time", 1), Column("where", "GPUs / reason", flex=True))

#: How the user's jobs sort.
JOB_SORTS = {"id": Sort(lambda j: j["id"]), "name": Sort(lambda j: j.get("name") or ""),
             "state": Sort(job_state), "time": Sort(lambda j: j["submitted_at"]),
             "where": Sort(job_where)}

#: R7's default monthly quota, used when the service does not say.
DEFAULT_QUOTA_H = 2000.0


def quota_h(row: dict) -> float:
    return row["quota_gpu_hours"] if row.get("quota_gpu_hours") is not None else DEFAULT_QUOTA_H


def month_hours(row: dict) -> float:
    return row.get("month_gpu_hours", row.get("gpu_hours")) or 0.0


def user_cells(row: dict, waiting: int) -> tuple:
    quota, hours = quota_h(row), month_hours(row)
    cell = fill_bar(hours / quota if quota else None, 10)
    cell.append(f" {hours:.1f} / {quota:.0f} h")
    return (row["name"], f"{user_weight(row):.2f}", cell, str(row.get("running_jobs", 0)),
            str(waiting), str(row.get("jobs_finished", 0)))


class UsersScreen(ClusterScreen):
    SCREEN_TITLE = "Users"
    KEYS = USERS_KEYS

    def __init__(self) -> None:
        super().__init__()
        self._waiting: dict[str, int] = {}
        self._wanted: str | None = None  # a user asked for (``:user``) before the rows came

    def compose_body(self) -> ComposeResult:
        sorts = {"name": Sort(lambda u: u["name"]), "weight": Sort(user_weight),
                 "hours": Sort(month_hours, True),
                 "running": Sort(lambda u: u.get("running_jobs", 0), True),
                 "waiting": Sort(lambda u: self._waiting.get(u["name"], 0), True),
                 "finished": Sort(lambda u: u.get("jobs_finished", 0), True)}
        with Vertical(id="body"):
            yield Static(Text("Lowest weight runs first: 1.0 + 0.1 per finished job "
                              "+ 0.02 per GPU-hour.", style="dim"), id="users-note")
            yield RowTable(USER_COLUMNS, self._cells, sorts=sorts, natural="fair-share order",
                           id="users-table")
            yield RowTable(USER_JOB_COLUMNS, self._job_cells, sorts=JOB_SORTS,
                           natural="running first", id="user-jobs")

    def on_mount(self) -> None:
        self.query_one("#users-table", RowTable).focus()
        self.query_one("#user-jobs", RowTable).border_title = "Jobs"

    def cluster_changed(self, change: str, key: object = None) -> None:
        if change in ("all", "job", "user"):
            self.later()

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
        self.app.open_job(int(event.key))

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
