"""Running and waiting jobs: each waiting job with its reason (R5) and its place in the
scheduler's order (R6, priority included); "mine" filter; cancel / hold / release.

Every live job is a row (a ``RowTable``: only the rows on screen are computed and painted),
keyed by job id. The order is the head's own (the stream's ``queue`` events), applied once
per batch of job changes; once a second the visible rows are recomputed (their age moves)
and the lines that changed are repainted.
"""

from __future__ import annotations

import time

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

from .base import TELEMETRY_EVERY_S, ClusterScreen
from .keys import QUEUE_KEYS
from .render import ago, job_size, job_state, job_where, status_cell
from .rowtable import RowTable

QUEUE_COLUMNS = (("id", "ID"), ("user", "User"), ("name", "Name"), ("state", "State"),
                 ("pos", "Pos"), ("size", "Asks"), ("age", "Age"), ("where", "GPUs / reason"))


def queue_order(jobs: list[dict], order: list[int]) -> tuple[list[dict], dict[int, int]]:
    """Running first (oldest start first), then the waiting jobs in the head's ``order``
    (those it has not ordered yet, submitted since its last pass, after them by submit
    time), then held ones; and each waiting job's 1-based place in that line."""
    running = sorted((j for j in jobs if j["state"] in ("running", "launching")),
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


def queue_cells(job: dict, place: int | None, now: float) -> tuple:
    since = job.get("started_at") if job["state"] == "running" else job["submitted_at"]
    return (str(job["id"]), job["user"], job["name"] or "-", status_cell(job_state(job)),
            str(place) if place else "-", job_size(job), ago(since, now), job_where(job))


class QueueScreen(ClusterScreen):
    SCREEN_TITLE = "Queue"
    KEYS = QUEUE_KEYS

    def __init__(self) -> None:
        super().__init__()
        self.mine = False
        self._ordered: list[dict] = []  # every live job in queue order
        self._place: dict[int, int] = {}  # waiting job id -> its place in the line

    def compose_body(self) -> ComposeResult:
        with Vertical(id="body"):
            yield Static("", id="queue-summary")
            yield RowTable(QUEUE_COLUMNS, self._cells, id="queue-table")

    def on_mount(self) -> None:
        self.query_one("#queue-table", RowTable).focus()
        self.set_interval(TELEMETRY_EVERY_S, self._tick)

    def cluster_changed(self, change: str, key: object = None) -> None:
        if change in ("all", "job", "queue"):
            self.later()

    def _tick(self) -> None:
        """Once a second: the visible rows' ages move."""
        if self.is_current:
            self.query_one("#queue-table", RowTable).refresh_rows()

    def _cells(self, key: str) -> tuple:
        job = self.cluster.job(int(key))
        return queue_cells(job, self._place.get(job["id"]), time.time()) if job else GONE

    def catch_up(self, missed: set[str]) -> None:
        if missed & {"all", "job", "queue"}:
            self.render_all()
        else:  # readings, nodes, events: the order stands (sorting 10,000 jobs is dear),
            self._tick()  # but the ages on screen moved

    def render_all(self) -> None:
        """Order every job (once per batch of changes), then show them."""
        self._ordered, self._place = queue_order(list(self.cluster.jobs.values()),
                                                 self.cluster.queue_order)
        self._show()

    def _show(self) -> None:
        """The ordered jobs, or only mine: a filter of the order, not a new one, so a
        waiting job's Pos is its place in the whole line either way."""
        me = self.app.user
        jobs = [j for j in self._ordered if not self.mine or j["user"] == me]
        table = self.query_one("#queue-table", RowTable)
        table.show([str(j["id"]) for j in jobs])
        table.refresh_rows()
        running = sum(1 for j in jobs if j["state"] in ("running", "launching"))
        held = sum(1 for j in jobs if j.get("held") and j["state"] == "pending")
        waiting = len(jobs) - running - held
        who = f"{me}'s jobs" if self.mine else "all users"
        summary = Text.assemble((f" {running} running", "green"), " · ",
                                (f"{waiting} waiting", "yellow"), " · ", (f"{held} held", "dim"),
                                f" · {who}  (m: only mine)")
        self.query_one("#queue-summary", Static).update(summary, layout=False)  # one line, always
        table.border_title = f"Queue — {len(jobs)} jobs"

    # ------------------------------------------------------------------ actions
    def _selected(self) -> int | None:
        key = self.query_one("#queue-table", RowTable).cursor_key
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
        self._show()

    def action_open_job(self) -> None:
        if (job_id := self._selected()) is not None:
            self.app.open_job(job_id)

    @on(RowTable.Selected, "#queue-table")
    def _row_selected(self, event: RowTable.Selected) -> None:
        self.app.open_job(int(event.key))
