"""Users and fair share: each user's weight (R6), GPU-hours against the quota (R7), running
and waiting jobs. From the ``users`` request (worker group ``users``), reloaded every few
seconds while shown and whenever a job ends."""

from __future__ import annotations

from collections.abc import Hashable

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, Static

from ..api import ApiError
from .base import ClusterScreen
from .cluster import FINISHED, user_weight
from .keys import USERS_KEYS
from .render import bar, load_style, set_columns, sync_table

USER_COLUMNS = (("name", "User"), ("weight", "Weight"), ("hours", "GPU-hours / quota"),
                ("finished", "Finished"), ("running", "Running"), ("waiting", "Waiting"))

#: R7's default monthly quota, used when the service does not say.
DEFAULT_QUOTA_H = 2000.0
USERS_RELOAD_S = 5.0


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
        self.users: list[dict] = []
        self._shown: dict[Hashable, tuple] = {}

    def compose_body(self) -> ComposeResult:
        with Vertical(id="body"):
            yield Static(Text("Lowest weight runs first (R6): 1.0 + 0.1 per finished job "
                              "+ 0.02 per GPU-hour.", style="dim"), id="users-note")
            yield DataTable(id="users-table", cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        set_columns(self.query_one("#users-table", DataTable), USER_COLUMNS, "Users").focus()
        self.set_interval(USERS_RELOAD_S, self.reload)

    def on_screen_resume(self) -> None:
        self.reload()

    @work(exclusive=True, group="users")
    async def reload(self) -> None:
        """The ``users`` group: one ``users`` request at a time."""
        try:
            self.users = (await self.app.call("users"))["users"]
        except ApiError as err:
            self.query_one("#users-table", DataTable).border_subtitle = f"cannot load: {err}"
            return
        self.render_all()

    def cluster_changed(self, change: str, key: object = None) -> None:
        job = self.cluster.job(key) if change == "job" else None
        if job and job["state"] in FINISHED:
            self.reload()  # finishing moves weights and hours
        elif change in ("all", "job"):
            self.render_all()

    def render_all(self) -> None:
        waiting: dict[str, int] = {}
        for j in self.cluster.jobs.values():
            if j["state"] == "pending":
                waiting[j["user"]] = waiting.get(j["user"], 0) + 1
        rows = {u["name"]: user_cells(u, waiting.get(u["name"], 0))
                for u in sorted(self.users, key=lambda u: (user_weight(u), u["name"]))}
        sync_table(self.query_one("#users-table", DataTable), self._shown, rows)

    def action_reload(self) -> None:
        self.reload()
