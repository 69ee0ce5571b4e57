"""Nodes and the events log, for admins: drain (with a reason), resume, add a node.

The node table renders from the app's ``Cluster``; the events log is the head's: its older
lines from one ``events`` request when the screen is first shown (worker group
``events-log``), every later one from the stream. Drain/resume are requests in the
``node-actions`` group; the head's answer arrives as a node event and a log line too.
"""

from __future__ import annotations

from collections.abc import Hashable

from textual import on, work
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Input, Static

from ..api import ApiError
from ..model import format_mb
from .base import TELEMETRY_EVERY_S, ClusterScreen, OpMissing
from .keys import HELP_KEYS, NODES_KEYS, bindings
from .render import ago, clock, selected_key, set_columns, status_cell, sync_table

NODE_COLUMNS = (("name", "Node"), ("host", "Host"), ("state", "State"), ("gpus", "GPUs"),
                ("free", "Free VRAM"), ("seen", "Seen"), ("reason", "Reason"))
EVENT_COLUMNS = (("t", "Time"), ("kind", "Kind"), ("message", "Event"))
EVENTS_SHOWN = 300


class ReasonPrompt(ModalScreen[str | None]):
    """Asks for one line of text (why a node is drained); esc cancels."""

    BINDINGS = bindings(HELP_KEYS[:1])

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical(id="prompt"):
            yield Static(self.question, id="prompt-question")
            yield Input(placeholder="reason (enter to confirm, esc to cancel)", id="prompt-input")

    @on(Input.Submitted)
    def _done(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip())

    def action_dismiss(self) -> None:  # type: ignore[override]
        self.dismiss(None)


class AddNodePrompt(ModalScreen[None]):
    """R21's trust step in the TUI: name, host and port; the head reads the node's host key,
    the fingerprint is shown, and only a second Enter (after comparing it with the node's
    own) trusts it and adds the node. Esc cancels at any point, changing nothing."""

    BINDINGS = bindings(HELP_KEYS[:1])

    def compose(self) -> ComposeResult:
        with Vertical(id="prompt"):
            yield Static("Add a node: its name, host and SSH port (enter on the last field)",
                         id="prompt-question")
            yield Input(placeholder="name, e.g. node05", id="add-name")
            yield Input(placeholder="host, e.g. 10.0.0.15", id="add-host")
            yield Input(placeholder="port (22)", id="add-port")
            yield Static("", id="add-fingerprint")

    @on(Input.Submitted, "#add-name, #add-host")
    def _next(self, event: Input.Submitted) -> None:
        self.focus_next()

    @on(Input.Submitted, "#add-port")
    def _submitted(self) -> None:
        name = self.query_one("#add-name", Input).value.strip()
        host = self.query_one("#add-host", Input).value.strip()
        port_text = self.query_one("#add-port", Input).value.strip() or "22"
        if not name or not host or not port_text.isdigit():
            self._say("give a name, a host and a port number")
            return
        if self._pending == (name, host, int(port_text)):
            self.add(name, host, int(port_text), self._fingerprint)
        else:
            self.read_key(name, host, int(port_text))

    _pending: tuple | None = None
    _fingerprint: str = ""

    def _say(self, text: str) -> None:
        self.query_one("#add-fingerprint", Static).update(text)

    @work(exclusive=True, group="node-actions")
    async def read_key(self, name: str, host: str, port: int) -> None:
        """The ``node-actions`` group: ask the head for the key the node presents."""
        self._say("reading the node's host key…")
        try:
            fingerprint = (await self.app.call("node_key", host=host, port=port))["fingerprint"]
        except ApiError as err:
            self._say(f"[b]cannot add:[/b] {err}")
            return
        self._pending, self._fingerprint = (name, host, port), fingerprint
        self._say(f"{host}:{port} presents host key\n[b]{fingerprint}[/b]\nCompare it with the "
                  "node's own (ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub on the node).\n"
                  "Enter again trusts it and adds the node; esc cancels.")

    @work(exclusive=True, group="node-actions")
    async def add(self, name: str, host: str, port: int, fingerprint: str) -> None:
        try:
            await self.app.call("node_add", node=name, host=host, port=port, trust=fingerprint)
        except ApiError as err:
            self._say(f"[b]not added:[/b] {err}")
            return
        self.app.notify(f"Added {name} ({host}:{port}, host key {fingerprint})")
        self.dismiss(None)

    def action_dismiss(self) -> None:  # type: ignore[override]
        self.dismiss(None)


def node_cells(node: dict, gpus: list[dict]) -> tuple:
    free = sum(s["memory_mb"] for g in gpus for s in g.get("slices", []) if s["state"] == "free")
    return (node["name"], f"{node.get('host')}:{node.get('port')}", status_cell(node["state"]),
            str(len(gpus)), format_mb(free), ago(node.get("last_seen")), node.get("reason") or "")


class NodesScreen(ClusterScreen):
    SCREEN_TITLE = "Nodes"
    KEYS = NODES_KEYS

    def __init__(self) -> None:
        super().__init__()
        self._shown_nodes: dict[Hashable, tuple] = {}
        self._shown_events: dict[Hashable, tuple] = {}
        self._log: list[dict] = []  # the log's lines from before the stream's, oldest first

    def compose_body(self) -> ComposeResult:
        with Vertical(id="body"):
            yield DataTable(id="nodes-table", cursor_type="row", zebra_stripes=True)
            yield DataTable(id="events-table", cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        set_columns(self.query_one("#events-table", DataTable), EVENT_COLUMNS, "Events log")
        set_columns(self.query_one("#nodes-table", DataTable), NODE_COLUMNS, "Nodes").focus()
        self.reload()

    def cluster_changed(self, change: str, key: object = None) -> None:
        if change == "gpus":  # free memory moves with every node's readings: once a second
            self.later(TELEMETRY_EVERY_S)
        elif change in ("all", "node", "event"):
            self.later()

    def render_all(self) -> None:
        rows = {name: node_cells(n, self.cluster.node_gpus(name))
                for name, n in sorted(self.cluster.nodes.items())}
        sync_table(self.query_one("#nodes-table", DataTable), self._shown_nodes, rows)
        self._render_log()

    @work(exclusive=True, group="events-log")
    async def reload(self) -> None:
        """The ``events-log`` group: the log's older lines (the stream brings new ones)."""
        try:
            self._log = (await self.app.call("events", limit=EVENTS_SHOWN))["events"]
        except ApiError as err:
            self.query_one("#events-table", DataTable).border_subtitle = f"cannot load: {err}"
            return
        self._render_log()

    def _render_log(self) -> None:
        """The log newest first: the lines loaded, then the stream's newer ones."""
        table = self.query_one("#events-table", DataTable)
        newest = self._log[-1]["t"] if self._log else 0
        events = (self._log + [e for e in self.cluster.events if e.get("t", 0) > newest])
        rows = {f"{e['t']}-{n}": (clock(e["t"]), e.get("kind") or "", e.get("message") or "")
                for n, e in enumerate(events[-EVENTS_SHOWN:])}
        rows = dict(reversed(list(rows.items())))
        first = not self._shown_events
        if list(rows) != list(self._shown_events):
            table.clear()
            self._shown_events.clear()
            sync_table(table, self._shown_events, rows)
        if first:
            table.move_cursor(row=0)

    @work(group="node-actions")
    async def node_action(self, op: str, node: str, reason: str = "") -> None:
        """The ``node-actions`` group: drain or resume; a refusal becomes a notification."""
        fields = {"node": node, **({"reason": reason} if op == "drain" else {})}
        try:
            reply = await self.app.call(op, **fields)
        except OpMissing as err:
            self.notify(str(err), title=f"Cannot {op} {node}", severity="warning")
            return
        except ApiError as err:
            self.notify(str(err), title=f"Cannot {op} {node}", severity="error")
            return
        if "node" in reply:
            self.app.cluster.apply_node(reply["node"])
            self.render_all()
        self.notify(f"{node} {'drained' if op == 'drain' else 'resumed'}")

    def _selected(self) -> str | None:
        name = selected_key(self.query_one("#nodes-table", DataTable))
        if name is None:
            self.notify("No node selected", severity="warning")
        return name

    def action_drain_node(self) -> None:
        name = self._selected()
        if name is None:
            return

        def answered(reason: str | None) -> None:
            if reason is not None:
                self.node_action("drain", name, reason or "drained from the TUI")

        self.app.push_screen(ReasonPrompt(f"Drain {name}: no new jobs start there. Why?"), answered)

    def action_resume_node(self) -> None:
        name = self._selected()
        if name is not None:
            self.node_action("resume", name)

    def action_reload(self) -> None:
        self.reload()

    def action_add_node(self) -> None:
        self.app.push_screen(AddNodePrompt())
