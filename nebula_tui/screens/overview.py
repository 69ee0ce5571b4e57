"""The first screen: one summary line (R1's numbers), one card per node, the queue and an
events ticker — each as large as what it holds.

Renders from the app's ``Cluster``. Telemetry reaches the screen at most once a second,
and then only the cards on screen are recomputed (``NodeCards``: one widget for all of
them; a card scrolled into view is brought up to date then). The queue is a ``RowTable``
of every live job, re-ordered once per batch of job changes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

from ..units import MIB_PER_GIB
from ..views import preemptible_text, status_summary
from ..wire import BookingView, JobWire
from .base import TELEMETRY_EVERY_S, ClusterScreen
from .look import LOOK
from .queue import job_detail
from .render import bookings_count, clock, holders_text, job_state, job_where, node_card, pool_card, state_text
from .render import now as clock_now
from .widgets.keys import OVERVIEW_KEYS
from .widgets.nodecards import NodeCards
from .widgets.rowtable import Column, RowTable, Sort

QUEUE_COLUMNS = (Column("id", "ID"), Column("user", "User"), Column("name", "Name", 2),
                 Column("state", "State"), Column("where", "GPUs / reason", flex=True))

#: A pool's card among the node cards is keyed by this and its name (no node is named so).
POOL_CARD = "pool "

#: Lines the ticker keeps (the newest at the bottom); it shows what fits.
TICKER_LINES = 8
#: Below this many terminal lines the ticker gives its room to the cards and the queue
#: (the events log is on the Nodes screen).
TICKER_MIN_HEIGHT = 30


def summary_text(counts: Mapping[str, Any], jobs: Sequence[JobWire], bookings: Sequence[BookingView] = ()) -> Text:
    """The cluster in one line: nodes, GPUs by state, memory, jobs."""
    text = Text(f" {counts['nodes']} nodes · {counts['gpus']} GPUs: ")
    parts = [(f"{counts['idle']} idle", "free"), (f"{counts['busy']} busy", "info")]
    for state in ("maintenance", "unreachable"):  # said when there are some
        if counts.get(state):
            parts.append((f"{counts[state]} {state}", "warn"))
    for n, (words, role) in enumerate(parts):
        if n:
            text.append(", ")
        text.append(words, style=LOOK.role(role))
    total, free = counts["total_vram_mb"] / MIB_PER_GIB, counts["free_vram_mb"] / MIB_PER_GIB
    text.append(f" · {free:.0f} of {total:.0f} GB free")
    running = sum(1 for j in jobs if j["state"] in ("running", "launching"))
    spare = sum(1 for j in jobs if j["state"] in ("running", "launching") and j.get("preemptible"))
    waiting = sum(1 for j in jobs if j["state"] == "pending")
    text.append(" · ")
    text.append(f"{running} running", style=LOOK.state("running"))
    if spare:
        text.append(f" ({spare} preemptible)")
    text.append(", ")
    text.append(f"{waiting} waiting", style=LOOK.state("pending"))
    if booked := bookings_count(list(bookings)):
        text.append(f" · {booked}")
    return text


class OverviewScreen(ClusterScreen):
    """Summary line, node cards, the queue and the events ticker, live from the head."""

    SCREEN_TITLE = "Overview"
    KEYS = OVERVIEW_KEYS

    def __init__(self) -> None:
        super().__init__()
        self._summary_dirty = False
        self._summary_text: Text | None = None
        self._counts: tuple[int, Mapping[str, Any]] = (-1, {})  # (cluster.counts_version, R1 counts)
        self._dirty_cards: set[str] = set()  # nodes whose card is behind the cluster
        self._detail: Text | None = None  # the cursor job's line under the queue

    def compose_body(self) -> ComposeResult:
        sorts = {"id": Sort(lambda j: j["id"]), "user": Sort(lambda j: j["user"]),
                 "name": Sort(lambda j: j.get("name") or ""), "state": Sort(job_state),
                 "where": Sort(job_where)}
        with Vertical(id="body"):
            yield Static("Connecting to the head service…", id="summary")
            yield NodeCards(self._card, id="cards")
            yield RowTable(QUEUE_COLUMNS, self._job_cells, sorts=sorts, natural="running first",
                           id="queue")
            yield Static("", id="overview-detail")
            yield Static("", id="ticker")

    def on_mount(self) -> None:
        queue = self.query_one("#queue", RowTable)
        queue.border_title = "Queue"
        queue.focus()  # enter and c act on its cursor
        self.query_one("#ticker").border_title = "Events"
        self.query_one("#cards", NodeCards).border_title = "Nodes"
        self.set_interval(TELEMETRY_EVERY_S, self._tick)

    def on_resize(self, event) -> None:
        short = self.size.height < TICKER_MIN_HEIGHT
        if short != self.has_class("short"):
            self.set_class(short, "short")
            self._render_ticker()

    def _tick(self) -> None:
        """Telemetry, at most once a second: the summary and the cards on screen."""
        if not self.is_current:
            return
        if self._summary_dirty:
            self._summary_dirty = False
            self._render_summary()
        self._render_cards()
        self.query_one("#queue", RowTable).refresh_rows()
        self._show_detail()

    # ------------------------------------------------------------------ rendering
    def cluster_changed(self, change: str, key: object = None) -> None:
        if change == "gpus":
            self._summary_dirty = True
            self._dirty_cards.add(str(key))
        elif change in ("job", "job-live"):
            job = self.cluster.job(key) if isinstance(key, int) else None
            self._dirty_cards.update(g["node"] for g in (job.get("gpus", ()) if job else ()))
            self._summary_dirty = True
            if change == "job":  # (the tick brings the rest up to date)
                self.later()
        elif change == "node":
            self._summary_dirty = True
            self._dirty_cards.add(str(key))
            self.later()
        elif change == "event":
            self._render_ticker()
        elif change == "pool":
            self._dirty_cards.add(POOL_CARD + str(key))
            self.later()
        elif change == "bookings":
            self._render_summary()
        else:  # a snapshot: the summary too, whichever of tick and ``later`` comes first
            self._summary_dirty = True
            self._dirty_cards.update(self._card_names())
            self.later()

    def render_all(self) -> None:
        self._show_cluster(reorder=True)

    def catch_up(self, missed: set[str]) -> None:
        # Readings, nodes and events leave the queue's order as it was: it is not sorted
        # again (10,000 jobs), only its rows on screen are brought up to date.
        self._show_cluster(reorder=bool(missed & {"all", "job"}))

    def _show_cluster(self, *, reorder: bool) -> None:
        if not self.cluster.connected and not self.cluster.nodes:
            return
        self._render_summary()
        self._summary_dirty = False
        self._dirty_cards.update(self._card_names())  # events missed while hidden
        self._render_cards()
        if reorder:
            self._render_queue()
        else:
            self.query_one("#queue", RowTable).refresh_rows()
        self._show_detail()
        self._render_ticker()

    def _render_summary(self) -> None:
        cluster = self.cluster
        # The counts are over every GPU, worked out again only when what they count
        # changed (not for readings: 1,000 GPUs took ~10 ms a second).
        if self._counts[0] != cluster.counts_version:
            self._counts = (cluster.counts_version,
                            status_summary([], list(cluster.gpus.values())))
        counts = {**self._counts[1], "nodes": len(cluster.nodes)}
        text = summary_text(counts, list(cluster.jobs.values()), cluster.bookings)
        if text != self._summary_text:
            box = self.query_one("#summary", Static)
            # one line, or two where the width cuts it: a new layout only when that changes
            lines = lambda t: 1 if t is None or t.cell_len <= box.size.width - 2 else 2  # noqa: E731
            relayout = lines(text) != lines(self._summary_text)
            self._summary_text = text
            box.update(text, layout=relayout)

    def _card_names(self) -> list[str]:
        """The nodes' cards, then one per pool."""
        return sorted(self.cluster.nodes) + [POOL_CARD + p for p in sorted(self.cluster.pools)]

    def _card(self, name: str) -> Text:
        if name.startswith(POOL_CARD):
            return pool_card(self.cluster.pools[name[len(POOL_CARD):]])
        jobs = self.cluster.jobs
        return node_card(self.cluster.nodes[name], self.cluster.node_gpus(name),
                         lambda g: holders_text(g, jobs, self.cluster.holders_of(g["uuid"])))

    def _render_cards(self) -> None:
        """Recompute the out-of-date cards on screen (the others when scrolled to)."""
        cards = self.query_one("#cards", NodeCards)
        cards.show(self._card_names())
        dirty, self._dirty_cards = self._dirty_cards, set()
        cards.refresh_cards(dirty)

    def _job_cells(self, key: str) -> tuple:
        job = self.cluster.job(int(key))
        if job is None:
            return ("-",) * len(QUEUE_COLUMNS)
        tag = preemptible_text(job)
        return (str(job["id"]), job["user"], job["name"] or "-", state_text(job_state(job)),
                f"{tag} · {job_where(job)}" if tag else job_where(job))

    def _render_queue(self) -> None:
        jobs = sorted(self.cluster.jobs.values(),
                      key=lambda j: (j["state"] == "pending", j["submitted_at"], j["id"]))
        table = self.query_one("#queue", RowTable)
        table.present(jobs, lambda j: str(j["id"]), lambda j: " ".join(
            (str(j["id"]), j["user"], j.get("name") or "", job_state(j), job_where(j))), "Queue")

    def on_row_table_arranged(self, event: RowTable.Arranged) -> None:
        self._render_queue()

    def on_row_table_highlighted(self, event: RowTable.Highlighted) -> None:
        self._show_detail()

    def _show_detail(self) -> None:
        """A waiting or held job's whole reason under the queue while the cursor is on it
        (its row cuts the reason at the table's edge); nothing for the others."""
        key = self.query_one("#queue", RowTable).cursor_key
        job = self.cluster.job(int(key)) if key is not None else None
        shown = job is not None and job_state(job) in ("pending", "held")
        text = job_detail(job, clock_now()) if job is not None and shown else Text("")
        if text != self._detail:  # (its "waiting for 3m" changes once a minute at most)
            self._detail = text
            box = self.query_one("#overview-detail", Static)
            box.display = shown
            self.set_class(shown, "detail")  # a short terminal's cards give it their room
            box.update(text)

    def _render_ticker(self) -> None:
        # a short terminal's one line shows the newest; a tall one the last that fit
        lines = list(self.cluster.events)[-(1 if self.has_class("short") else TICKER_LINES):]
        text = Text("\n").join(Text.assemble((clock(e.get("t")) + " ", "dim"),
                                             (e.get("message") or "", ""), no_wrap=True,
                                             overflow="ellipsis") for e in lines)
        text.no_wrap, text.overflow = True, "ellipsis"  # one event a line, cut at the edge
        self.query_one("#ticker", Static).update(text, layout=False)  # its size is the box's

    # ------------------------------------------------------------------ actions
    def action_cancel_job(self) -> None:
        key = self.query_one("#queue", RowTable).cursor_key
        if key is None:
            self.notify("No job selected: the queue is empty", severity="warning")
            return
        self.tui.ask_cancel(int(key))

    def action_open_job(self) -> None:
        key = self.query_one("#queue", RowTable).cursor_key
        if key is not None:
            self.tui.open_job(int(key))

    def on_row_table_selected(self, event: RowTable.Selected) -> None:
        self.tui.open_job(int(event.key))
