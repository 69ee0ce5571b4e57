"""The first screen: the R1 summary, one card per node, an events ticker and the queue.

Renders from the app's ``Cluster``: a GPU event rewrites only its node's card, a job event
only its queue row (and the cards of the nodes it touches).
"""

from __future__ import annotations

from collections.abc import Hashable

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import DataTable, Static

from ..views import status_summary, status_text
from .base import ClusterScreen
from .keys import OVERVIEW_KEYS, bindings
from .render import clock, job_cells_overview, node_card, selected_key, sync_table

QUEUE_COLUMNS = (("id", "ID"), ("user", "User"), ("name", "Name"), ("state", "State"),
                 ("where", "GPUs / reason"))

#: Jobs the overview's queue shows at most (running first); the Queue screen has them all.
MAX_QUEUE_ROWS = 100
#: Lines the ticker keeps on screen (the newest at the bottom).
TICKER_LINES = 8
#: Longest the R1 summary and the node cards lag behind telemetry (seconds).
SUMMARY_EVERY_S = 0.5
#: Columns one node card needs; wider terminals get cards side by side.
CARD_WIDTH = 72


class NodeCard(Static):
    """One node: its state and a line per GPU (memory and utilisation bars, temperature)."""


class OverviewScreen(ClusterScreen):
    """R1 overview, node cards, events ticker and the queue, live from the head."""

    SCREEN_TITLE = "Overview"
    KEYS = OVERVIEW_KEYS
    BINDINGS = bindings(OVERVIEW_KEYS)

    def __init__(self) -> None:
        super().__init__()
        self._shown_jobs: dict[Hashable, tuple] = {}
        self._cards: dict[str, NodeCard] = {}
        self._card_text: dict[str, Text] = {}
        self._summary_dirty = False
        self._dirty_cards: set[str] = set()

    def compose_body(self) -> ComposeResult:
        with Vertical(id="body"):
            with Horizontal(id="top"):
                yield Static("Connecting to the head service…", id="overview")
                yield Static("", id="ticker")
            yield VerticalScroll(id="cards")
            yield DataTable(id="queue", cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        queue = self.query_one("#queue", DataTable)
        for key, label in QUEUE_COLUMNS:
            queue.add_column(label, key=key)
        queue.border_title = "Queue"
        self.query_one("#ticker").border_title = "Events"
        self.query_one("#cards").border_title = "Nodes"
        self.set_interval(SUMMARY_EVERY_S, self._flush_summary)

    def _flush_summary(self) -> None:
        """Telemetry, batched: the summary and the cards of nodes with fresh readings."""
        if not self.is_current:
            return
        with self.app.batch_update():
            if self._summary_dirty:
                self._summary_dirty = False
                self._render_overview()
            cards, self._dirty_cards = self._dirty_cards, set()
            for name in sorted(cards):
                self._render_card(name)

    def on_resize(self, event) -> None:
        # Wide terminals: node cards side by side (one card needs about 70 columns).
        self.query_one("#cards").styles.grid_size_columns = max(1, min(3, event.size.width // CARD_WIDTH))

    # ------------------------------------------------------------------ rendering
    def cluster_changed(self, change: str, key: object = None) -> None:
        if change == "gpus":
            # Telemetry comes per node; the summary over all nodes is redrawn at most
            # SUMMARY_EVERY_S, not once per node.
            self._summary_dirty = True
            self._dirty_cards.add(str(key))
        elif change == "job":
            self._render_queue()
            job = self.cluster.job(key)
            for node in {g["node"] for g in (job or {}).get("gpus", [])}:
                self._render_card(node)
            self._render_ticker()
        elif change == "node":
            self._render_overview()
            self._render_card(str(key))
            self._render_ticker()
        elif change == "event":
            self._render_ticker()
        else:
            self.render_all()

    def render_all(self) -> None:
        if not self.cluster.connected and not self.cluster.nodes:
            return
        self._render_overview()
        for name in sorted(self.cluster.nodes):
            self._render_card(name)
        self._render_queue()
        self._render_ticker()

    def _render_overview(self) -> None:
        summary = status_summary(list(self.cluster.nodes.values()), list(self.cluster.gpus.values()))
        self.query_one("#overview", Static).update(status_text(summary))

    def _render_card(self, name: str) -> None:
        node = self.cluster.nodes.get(name)
        if node is None:
            return
        gpus = self.cluster.node_gpus(name)
        text = node_card(node, gpus, {g["uuid"]: self.cluster.holders_of(g["uuid"]) for g in gpus})
        if self._card_text.get(name) == text:
            return
        self._card_text[name] = text
        card = self._cards.get(name)
        if card is None:
            card = self._cards[name] = NodeCard(text, classes="node-card")
            container = self.query_one("#cards", VerticalScroll)
            container.mount(card)
            container.sort_children(key=lambda w: next(n for n, c in self._cards.items() if c is w))
        else:
            card.update(text)

    def _render_queue(self) -> None:
        jobs = sorted(self.cluster.jobs.values(),
                      key=lambda j: (j["state"] == "pending", j["submitted_at"], j["id"]))[:MAX_QUEUE_ROWS]
        rows = {str(j["id"]): job_cells_overview(j) for j in jobs}
        sync_table(self.query_one("#queue", DataTable), self._shown_jobs, rows)

    def _render_ticker(self) -> None:
        lines = list(self.cluster.events)[-TICKER_LINES:]
        text = Text("\n").join(Text.assemble((clock(e.get("t")) + " ", "dim"),
                                             (e.get("message") or "", ""), no_wrap=True,
                                             overflow="ellipsis") for e in lines)
        text.no_wrap, text.overflow = True, "ellipsis"  # one event a line, cut at the edge
        self.query_one("#ticker", Static).update(text)

    # ------------------------------------------------------------------ actions
    def action_cancel_job(self) -> None:
        key = selected_key(self.query_one("#queue", DataTable))
        if key is None:
            self.notify("No job selected: the queue is empty", severity="warning")
            return
        self.app.job_action("cancel", int(key))

    def action_open_job(self) -> None:
        key = selected_key(self.query_one("#queue", DataTable))
        if key is not None:
            self.app.open_job(int(key))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.app.open_job(int(event.row_key.value))
