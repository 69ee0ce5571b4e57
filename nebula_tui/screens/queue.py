"""Running and waiting jobs: each waiting job with its reason (R5) and its place in
fair-share order (R6); "mine" filter; cancel / hold / release.

Rows are keyed by job id and updated in place; the table is re-ordered only when the order
changes. Fair-share weights come from the ``users`` request (worker group ``weights``).
"""

from __future__ import annotations

import time
from collections.abc import Hashable

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, Static

from ..api import ApiError
from .base import ClusterScreen
from .cluster import fair_share_order, user_weight
from .keys import QUEUE_KEYS, bindings
from .render import ago, job_size, job_state, job_where, order_table, selected_key, status_cell, sync_table

QUEUE_COLUMNS = (("id", "ID"), ("user", "User"), ("name", "Name"), ("state", "State"),
                 ("pos", "Pos"), ("size", "Asks"), ("age", "Age"), ("where", "GPUs / reason"))

#: Rows the table holds at most: the running jobs and the head of the waiting line.
#: (Textual's DataTable measures every row it holds, ~1 ms each: 10,000 would take seconds.)
MAX_ROWS = 300

#: How often fair-share weights are reloaded (they move when jobs finish).
WEIGHTS_RELOAD_S = 10.0


def queue_order(jobs: list[dict], weights: dict[str, float]) -> tuple[list[dict], dict[int, int]]:
    """Running first (oldest start first), then waiting jobs in fair-share order, then held
    ones; and each waiting job's 1-based place in the fair-share order."""
    running = sorted((j for j in jobs if j["state"] in ("running", "launching")),
                     key=lambda j: (j.get("started_at") or j["submitted_at"], j["id"]))
    waiting = fair_share_order(jobs, weights)
    held = sorted((j for j in jobs if j["state"] == "pending" and j.get("held")),
                  key=lambda j: (j["submitted_at"], j["id"]))
    place = {j["id"]: n for n, j in enumerate(waiting, start=1)}
    return running + waiting + held, place


def queue_cells(job: dict, place: int | None, now: float) -> tuple:
    since = job.get("started_at") if job["state"] == "running" else job["submitted_at"]
    return (str(job["id"]), job["user"], job["name"] or "-", status_cell(job_state(job)),
            str(place) if place else "-", job_size(job), ago(since, now), job_where(job))


class QueueScreen(ClusterScreen):
    SCREEN_TITLE = "Queue"
    KEYS = QUEUE_KEYS
    BINDINGS = bindings(QUEUE_KEYS)

    def __init__(self) -> None:
        super().__init__()
        self._shown: dict[Hashable, tuple] = {}
        self.weights: dict[str, float] = {}
        self.mine = False

    def compose_body(self) -> ComposeResult:
        with Vertical(id="body"):
            yield Static("", id="queue-summary")
            yield DataTable(id="queue-table", cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        table = self.query_one("#queue-table", DataTable)
        for key, label in QUEUE_COLUMNS:
            table.add_column(label, key=key)
        table.focus()
        self.load_weights()
        self.set_interval(WEIGHTS_RELOAD_S, self.load_weights)

    @work(exclusive=True, group="weights")
    async def load_weights(self) -> None:
        """The ``weights`` group: users' fair-share weights for the Pos column."""
        try:
            users = (await self.app.call("users"))["users"]
        except ApiError:
            return  # positions fall back to submit order among equals
        weights = {u["name"]: user_weight(u) for u in users}
        if weights != self.weights:
            self.weights = weights
            self.render_all()

    def cluster_changed(self, change: str, key: object = None) -> None:
        if change in ("all", "job"):
            self.render_all()

    def render_all(self) -> None:
        me = self.app.user
        jobs = [j for j in self.cluster.jobs.values() if not self.mine or j["user"] == me]
        ordered, place = queue_order(jobs, self.weights)
        now = time.time()
        rows = {str(j["id"]): queue_cells(j, place.get(j["id"]), now) for j in ordered[:MAX_ROWS]}
        table = self.query_one("#queue-table", DataTable)
        sync_table(table, self._shown, rows)
        order_table(table, list(rows), "id")
        running = sum(1 for j in jobs if j["state"] in ("running", "launching"))
        held = sum(1 for j in jobs if j.get("held") and j["state"] == "pending")
        waiting = len(jobs) - running - held
        who = f"{me}'s jobs" if self.mine else "all users"
        summary = Text.assemble((f" {running} running", "green"), " · ",
                                (f"{waiting} waiting", "yellow"), " · ", (f"{held} held", "dim"),
                                f" · {who}  (m: only mine)")
        self.query_one("#queue-summary", Static).update(summary)
        more = f" (first {MAX_ROWS} shown)" if len(ordered) > MAX_ROWS else ""
        table.border_title = f"Queue — {len(jobs)} jobs{more}"

    # ------------------------------------------------------------------ actions
    def _selected(self) -> int | None:
        key = selected_key(self.query_one("#queue-table", DataTable))
        if key is None:
            self.notify("No job selected: the queue is empty", severity="warning")
            return None
        return int(key)

    def action_cancel_job(self) -> None:
        if (job_id := self._selected()) is not None:
            self.app.job_action("cancel", job_id)

    def action_hold_job(self) -> None:
        if (job_id := self._selected()) is not None:
            self.app.job_action("hold", job_id)

    def action_release_job(self) -> None:
        if (job_id := self._selected()) is not None:
            self.app.job_action("release", job_id)

    def action_toggle_mine(self) -> None:
        self.mine = not self.mine
        self.render_all()

    def action_open_job(self) -> None:
        if (job_id := self._selected()) is not None:
            self.app.open_job(job_id)

    @on(DataTable.RowSelected, "#queue-table")
    def _row_selected(self, event: DataTable.RowSelected) -> None:
        self.app.open_job(int(event.row_key.value))
