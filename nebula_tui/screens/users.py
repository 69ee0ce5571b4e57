"""Users and fair share: each user's weight (R6), GPU-hours against the quota (R7), running
and waiting jobs. Each user's row comes from the stream (the snapshot's ``users``, then a
``user`` event whenever their figures move); waiting jobs are counted from the queue."""

from __future__ import annotations

from collections.abc import Hashable

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, Static

from .base import ClusterScreen
from .cluster import user_weight
from .keys import USERS_KEYS
from .render import bar, load_style, set_columns, sync_table

USER_COLUMNS = (("name", "User"), ("weight", "Weight"), ("hours", "GPU-hours / quota"),
                ("finished", "Finished"), ("running", "Running"), ("waiting", "Waiting"))

#: R7's default monthly quota, used when the service does not say.
DEFAULT_QUOTA_H = 2000.0


def user_cells(row: dict, waiting: int) -> tuple:
    quota = row["quota_gpu_hours"] if row.get("quota_gpu_hours") is not None else DEFAULT_QUOTA_H
    hours = row.get("month_gpu_hours", row.get("gpu_hours")) or 0.0
    frac = hours / quota if quota else None
    cell = bar(frac, 10, load_style(frac))
    cell.append(f" {hours:.1f} / {quota:.0f} h")
    return (row["name"], f"{user_weight(row):.2f}", cell, str(row.get("jobs_finished", 0)),
            str(row.get("running_jobs", 0)), str(waiting))


class UsersScreen(ClusterScreen):
    SCREEN_TITLE = "Users"
    KEYS = USERS_KEYS

    def __init__(self) -> None:
        super().__init__()
        self._shown: dict[Hashable, tuple] = {}

    def compose_body(self) -> ComposeResult:
        with Vertical(id="body"):
            yield Static(Text("Lowest weight runs first (R6): 1.0 + 0.1 per finished job "
                              "+ 0.02 per GPU-hour.", style="dim"), id="users-note")
            yield DataTable(id="users-table", cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        set_columns(self.query_one("#users-table", DataTable), USER_COLUMNS, "Users").focus()

    def cluster_changed(self, change: str, key: object = None) -> None:
        if change in ("all", "job", "user"):
            self.later()

    def render_all(self) -> None:
        waiting: dict[str, int] = {}
        for j in self.cluster.jobs.values():
            if j["state"] == "pending":
                waiting[j["user"]] = waiting.get(j["user"], 0) + 1
        rows = {u["name"]: user_cells(u, waiting.get(u["name"], 0))
                for u in sorted(self.cluster.users.values(), key=lambda u: (user_weight(u), u["name"]))}
        sync_table(self.query_one("#users-table", DataTable), self._shown, rows)

    def action_reload(self) -> None:
        self.app.stream_events()  # a fresh snapshot: every row as the head has it now
