"""The first screen: the R1 summary, one card per node, an events ticker and the queue.

Renders from the app's ``Cluster``. Telemetry reaches the screen at most once a second,
and then only the cards on screen are recomputed (``NodeCards``: one widget for all of
them; a card scrolled into view is brought up to date then). The queue is a ``RowTable``
of every live job, re-ordered once per batch of job changes.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Static

from ..views import status_summary, status_text
from .base import TELEMETRY_EVERY_S, ClusterScreen
from .keys import OVERVIEW_KEYS
from .nodecards import NodeCards
from .render import clock, job_cells_overview, node_card
from .rowtable import RowTable

QUEUE_COLUMNS = (("id", "ID"), ("user", "User"), ("name", "Name"), ("state", "State"),
                 ("where", "GPUs / reason"))

#: Lines the ticker keeps on screen (the newest at the bottom).
TICKER_LINES = 8
#: Node lines the R1 summary box shows at most (it is 12 lines high); at 125 nodes the
#: rest would be cut off anyway, and every node has its card.
SUMMARY_NODES = 7


class OverviewScreen(ClusterScreen):
    """R1 overview, node cards, events ticker and the queue, live from the head."""

    SCREEN_TITLE = "Overview"
    KEYS = OVERVIEW_KEYS

    def __init__(self) -> None:
        super().__init__()
        self._summary_dirty = False
        self._summary_text = ""
        self._summary_shape = (0, 0)
        self._counts: tuple[int, dict] = (-1, {})  # (cluster.counts_version, R1 counts)
        self._dirty_cards: set[str] = set()  # nodes whose card is behind the cluster

    def compose_body(self) -> ComposeResult:
        with Vertical(id="body"):
            with Horizontal(id="top"):
                yield Static("Connecting to the head service…", id="overview")
                yield Static("", id="ticker")
            yield NodeCards(self._card, id="cards")
            yield RowTable(QUEUE_COLUMNS, self._job_cells, id="queue")

    def on_mount(self) -> None:
        queue = self.query_one("#queue", RowTable)
        queue.border_title = "Queue"
        queue.focus()  # enter and c act on its cursor
        self.query_one("#ticker").border_title = "Events"
        self.query_one("#cards", NodeCards).border_title = "Nodes"
        self.set_interval(TELEMETRY_EVERY_S, self._tick)

    def _tick(self) -> None:
        """Telemetry, at most once a second: the summary and the cards on screen."""
        if not self.is_current:
            return
        if self._summary_dirty:
            self._summary_dirty = False
            self._render_overview()
        self._render_cards()
        self.query_one("#queue", RowTable).refresh_rows()

    # ------------------------------------------------------------------ rendering
    def cluster_changed(self, change: str, key: object = None) -> None:
        if change == "gpus":
            self._summary_dirty = True
            self._dirty_cards.add(str(key))
        elif change == "job":
            job = self.cluster.job(key)
            self._dirty_cards.update(g["node"] for g in (job or {}).get("gpus", []))
            self.later()
        elif change == "node":
            self._summary_dirty = True
            self._dirty_cards.add(str(key))
            self.later()
        elif change == "event":
            self._render_ticker()
        else:  # a snapshot: the summary too, whichever of tick and ``later`` comes first
            self._summary_dirty = True
            self._dirty_cards.update(self.cluster.nodes)
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
        self._render_overview()
        self._summary_dirty = False
        self._dirty_cards.update(self.cluster.nodes)  # events missed while hidden
        self._render_cards()
        if reorder:
            self._render_queue()
        else:
            self.query_one("#queue", RowTable).refresh_rows()
        self._render_ticker()

    def _render_overview(self) -> None:
        cluster = self.cluster
        nodes = [cluster.nodes[name] for name in sorted(cluster.nodes)]
        # The box shows a few nodes' details (every node has its card): only theirs are
        # worked out each time. The counts are over every GPU, worked out again only when
        # what they count changed (not for readings: 1,000 GPUs took ~10 ms a second).
        more = len(nodes) - SUMMARY_NODES + 1 if len(nodes) > SUMMARY_NODES else 0
        shown = nodes[:len(nodes) - more]
        if self._counts[0] != cluster.counts_version:
            self._counts = (cluster.counts_version,
                            status_summary([], list(cluster.gpus.values())))
        details = status_summary(shown, [g for n in shown for g in cluster.node_gpus(n["name"])])
        summary = {**self._counts[1], "nodes": len(nodes), "node_details": details["node_details"]}
        text = status_text(summary)
        if more:
            text += f"\n  … {more} more nodes: see their cards below"
        if text == self._summary_text:
            return
        lines = text.splitlines()
        shape = (len(lines), max(map(len, lines)))
        box = self.query_one("#overview", Static)
        # The box sizes itself to the text: lay out again only when its size changes.
        box.update(text, layout=shape != self._summary_shape)
        self._summary_text, self._summary_shape = text, shape

    def _card(self, name: str) -> Text:
        gpus = self.cluster.node_gpus(name)
        return node_card(self.cluster.nodes[name], gpus,
                         {g["uuid"]: self.cluster.holders_of(g["uuid"]) for g in gpus})

    def _render_cards(self) -> None:
        """Recompute the out-of-date cards on screen (the others when scrolled to)."""
        cards = self.query_one("#cards", NodeCards)
        cards.show(sorted(self.cluster.nodes))
        dirty, self._dirty_cards = self._dirty_cards, set()
        cards.refresh_cards(dirty)

    def _job_cells(self, key: str) -> tuple:
        job = self.cluster.job(int(key))
        return job_cells_overview(job) if job else ("-",) * len(QUEUE_COLUMNS)

    def _render_queue(self) -> None:
        jobs = sorted(self.cluster.jobs.values(),
                      key=lambda j: (j["state"] == "pending", j["submitted_at"], j["id"]))
        table = self.query_one("#queue", RowTable)
        table.show([str(j["id"]) for j in jobs])
        table.refresh_rows()

    def _render_ticker(self) -> None:
        lines = list(self.cluster.events)[-TICKER_LINES:]
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
        self.app.job_action("cancel", int(key))

    def action_open_job(self) -> None:
        key = self.query_one("#queue", RowTable).cursor_key
        if key is not None:
            self.app.open_job(int(key))

    def on_row_table_selected(self, event: RowTable.Selected) -> None:
        self.app.open_job(int(event.key))
