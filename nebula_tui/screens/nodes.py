"""Nodes and the events log, for admins: drain (with a reason), resume, add or remove a
node.

The node table renders from the app's ``Cluster``; the events log is the head's: its older
lines from one ``events`` request when the screen is first shown (worker group
``events-log``), every later one from the stream. Drain, resume and remove ask first and
are the app's (``NebulaApp.ask_drain``…), so ``:drain node01`` works anywhere; the head's
answer arrives as a node event and a log line too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.events import DescendantFocus
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Static

from ..api import ApiError
from ..model import format_mb
from ..views import doctor_lines, node_power
from ..wire import (DoctorReply, DoctorRequest, EventRow, EventsReply, EventsRequest, GpuWire, NodeAddRequest,
                    NodeKeyReply, NodeKeyRequest, NodeWire, ReloadReply)
from .base import TELEMETRY_EVERY_S, ClusterScreen, tui_of
from .look import LOOK
from .render import ago, day_clock, free_slice_mb, node_power_text, state_text
from .widgets.keys import FORM_KEYS, HELP_KEYS, NODES_KEYS, bindings
from .widgets.rowtable import Column, RowTable, Sort

NODE_COLUMNS = (Column("name", "Node"), Column("state", "State"), Column("gpus", "GPUs"),
                Column("free", "Free VRAM"), Column("power", "Power", 2), Column("jobs", "Jobs", 1),
                Column("seen", "Seen", 3),
                Column("host", "Host", 2), Column("reason", "Reason", flex=True))
EVENT_COLUMNS = (Column("t", "Time"), Column("kind", "Kind", 1), Column("message", "Event", flex=True))
EVENTS_SHOWN = 300


class DrainPrompt(ModalScreen[str | None]):
    """Drain a node: says what it means (its running jobs go on) and asks why. A habit
    Enter does no harm: Enter drains only once a reason was typed; without one it moves to
    the buttons, where "Keep taking jobs" has the focus. Esc refuses."""

    BINDINGS = bindings(HELP_KEYS[:1])

    def __init__(self, question: str, body: str, reason: str = "") -> None:
        super().__init__()
        self.question = question
        self.body = body
        self.reason = reason

    def compose(self) -> ComposeResult:
        with Vertical(id="prompt"):
            yield Static(Text(self.question, style="bold"), id="prompt-question")
            yield Static(self.body, id="prompt-body")
            yield Input(value=self.reason, id="prompt-input",
                        placeholder="why (shown to users), then enter drains · esc does nothing")
            with Horizontal(id="dialog-buttons"):
                yield Button("Keep taking jobs", id="drain-keep")
                yield Button("Drain", id="drain-go", variant="error")

    @on(Input.Submitted)
    def _done(self, event: Input.Submitted) -> None:
        if event.value.strip():
            self.dismiss(event.value.strip())
        else:  # no reason typed: this Enter may be habit, so the safe answer gets the focus
            self.query_one("#drain-keep", Button).focus()

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "drain-go":
            self.dismiss(self.query_one("#prompt-input", Input).value.strip())
        else:
            self.dismiss(None)

    def action_dismiss(self) -> None:  # type: ignore[override]
        self.dismiss(None)


class DoctorScreen(ModalScreen[None]):
    """`nebula doctor NODE` on the Nodes screen (D): the head's checks of the node, one line
    each, ✗ with its fix; it scrolls, esc closes."""

    BINDINGS = bindings(HELP_KEYS)

    def __init__(self, node: str) -> None:
        super().__init__()
        self.node = node

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help"):
            yield Static(Text(f"Checks of {self.node}", style="bold"), id="help-title")
            yield Static(f"asking the head to check {self.node}…", id="doctor-lines", markup=False)
            yield Static("esc closes · the same as `nebula doctor " + self.node + "`",
                         id="help-hint", markup=False)

    def on_mount(self) -> None:
        self.check()

    @work(exclusive=True, group="doctor")
    async def check(self) -> None:
        box = self.query_one("#doctor-lines", Static)
        try:
            reply = await tui_of(self).call("doctor", DoctorReply, **DoctorRequest(nodes=[self.node]))
        except ApiError as err:
            box.update(Text(f"not checked: {err}", style=LOOK.role("bad")))
            return
        roles = {"ok": "ok", "fail": "bad", "warn": "warn", "skip": "info"}
        checks = reply["nodes"].get(self.node, [])
        box.update(Text("\n").join(Text(line, style=LOOK.role(roles.get(c["status"], "info")))
                                   for c, line in zip(checks, doctor_lines(checks))))

    def action_dismiss(self) -> None:  # type: ignore[override]
        self.dismiss(None)


class AddNodePrompt(ModalScreen[None]):
    """R21's trust step in the TUI: name, host and port; the head reads the node's host key,
    the fingerprint is shown, and only a second Enter (after comparing it with the node's
    own) trusts it and adds the node. Esc cancels at any point, changing nothing."""

    BINDINGS = bindings(HELP_KEYS[:1] + FORM_KEYS)

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
            fingerprint = (await tui_of(self).call("node_key", NodeKeyReply,
                                                   **NodeKeyRequest(host=host, port=port)))["fingerprint"]
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
            await tui_of(self).call("node_add", ReloadReply,
                                    **NodeAddRequest(node=name, host=host, port=port, trust=fingerprint))
        except ApiError as err:
            self._say(f"[b]not added:[/b] {err}")
            return
        self.app.notify(f"Added {name} ({host}:{port}, host key {fingerprint})")
        self.dismiss(None)

    def action_dismiss(self) -> None:  # type: ignore[override]
        self.dismiss(None)


def node_free_mb(gpus: Sequence[GpuWire]) -> int:
    return sum(free_slice_mb(g) for g in gpus)


def node_cells(node: NodeWire, gpus: Sequence[GpuWire], running: int) -> tuple:
    return (node["name"], state_text(node["state"]), str(len(gpus)),
            format_mb(node_free_mb(gpus)), node_power_text(node, gpus), str(running),
            ago(node.get("last_seen")),
            f"{node.get('host')}:{node.get('port')}", node.get("reason") or "")


def pool_node_cells(node: dict, running: int) -> tuple:
    """A pool's node, read-only: what the pool's last poll said of it; ``running``: ours."""
    used = "?" if node.get("gpus_used") is None else node["gpus_used"]
    return (node["name"], state_text(node["state"]), f"{used}/{node['gpus']} used",
            "-", "-", str(running), "-", f"pool {node['pool']}",
            "read-only: the cluster's own" + ("" if node.get("usable", True) else "; takes no jobs"))


def event_cells(event: Mapping[str, Any]) -> tuple:
    kind = event.get("kind") or ""
    return (day_clock(event.get("t")), state_text(kind) if kind in ("failed", "cancelled") else kind,
            event.get("message") or "")


class NodesScreen(ClusterScreen):
    SCREEN_TITLE = "Nodes"
    KEYS = NODES_KEYS

    def __init__(self) -> None:
        super().__init__()
        self._log: list[EventRow] = []  # the log's lines from before the stream's, oldest first
        self.events: dict[str, dict[str, Any]] = {}  # row key -> events log line (and its key), newest first
        self._pool_nodes: dict[str, dict] = {}  # "pool:node" -> a pool's node (read-only)
        self._detail: Text | None = None  # the cursor row's whole words, under the tables

    def compose_body(self) -> ComposeResult:
        node_sorts = {"name": Sort(lambda n: n["name"]), "state": Sort(lambda n: n["state"]),
                      "gpus": Sort(lambda n: len(self.cluster.node_gpus(n["name"])), True),
                      "free": Sort(lambda n: node_free_mb(self.cluster.node_gpus(n["name"])), True),
                      "power": Sort(lambda n: self._power_share(n), True),
                      "jobs": Sort(lambda n: self._jobs_on(n["name"]), True),
                      "seen": Sort(lambda n: -(n.get("last_seen") or 0)),
                      "host": Sort(lambda n: (n.get("host") or "", n.get("port") or 0))}
        event_sorts = {"t": Sort(lambda e: e.get("t") or 0, True),
                       "kind": Sort(lambda e: e.get("kind") or "")}
        with Vertical(id="body"):
            yield RowTable(NODE_COLUMNS, self._node_cells, sorts=node_sorts, sort="name",
                           id="nodes-table")
            yield RowTable(EVENT_COLUMNS, self._event_cells, sorts=event_sorts,
                           natural="newest first", id="events-table")
            yield Static("", id="nodes-detail")

    def on_mount(self) -> None:
        if (table := self.live_table("#nodes-table")) is not None:
            table.focus()
        self.reload()
        # "Seen" is a time ago: it moves on even when no reading does
        self.set_interval(TELEMETRY_EVERY_S, self._tick)

    def _tick(self) -> None:
        if self.is_current:
            self.later()

    def _power_share(self, node: NodeWire) -> tuple:
        """Nearest its budget first; then nodes without one, by draw; then those unread."""
        draw, budget = node_power(node, self.cluster.node_gpus(node["name"]))
        if draw is None:
            return (0, 0.0)
        return (2, draw / budget) if budget else (1, draw)

    def _jobs_on(self, name: str) -> int:
        return len(self.tui.running_on(name))

    def _node_cells(self, name: str) -> tuple:
        node = self.cluster.nodes.get(name)
        if node is None:
            pool_node = self._pool_nodes.get(name)
            if pool_node is None:
                return ("-",) * len(NODE_COLUMNS)
            return pool_node_cells(pool_node, self._jobs_on(name))
        return node_cells(node, self.cluster.node_gpus(name), self._jobs_on(name))

    def _event_cells(self, key: str) -> tuple:
        event = self.events.get(key)
        return event_cells(event) if event else ("-",) * len(EVENT_COLUMNS)

    @on(RowTable.Arranged, "#nodes-table")
    def _nodes_arranged(self) -> None:
        self.render_all()

    @on(RowTable.Highlighted)
    @on(DescendantFocus)
    def _show_detail(self) -> None:
        """The cursor row of the table in focus, whole: a node's reason or an event (their
        columns cut them at the table's edge); nothing for a node without a reason."""
        events_log = self.focused is not None and self.focused.id == "events-table"
        table = self.query_one("#events-table" if events_log else "#nodes-table", RowTable)
        key = table.cursor_key
        text = Text("")
        if events_log and (event := self.events.get(key or "")):
            text = Text.assemble((f"{day_clock(event.get('t'))} {event.get('kind') or ''}: ", "dim"),
                                 event.get("message") or "")
        elif not events_log and (node := self.cluster.nodes.get(key or "")) and node.get("reason"):
            text = Text.assemble((f"{node['name']} ", "bold"), state_text(node["state"]),
                                 f": {node['reason']}")
        if text != self._detail:
            self._detail = text
            box = self.query_one("#nodes-detail", Static)
            box.display = bool(text.plain)
            box.update(text)

    @on(RowTable.Arranged, "#events-table")
    def _events_arranged(self) -> None:
        self._show_events()

    def cluster_changed(self, change: str, key: object = None) -> None:
        if change == "gpus":  # free memory moves with every node's readings: once a second
            self.later(TELEMETRY_EVERY_S)
        elif change in ("all", "node", "event", "pool"):
            self.later()

    def render_all(self) -> None:
        table = self.query_one("#nodes-table", RowTable)
        self._pool_nodes = self.cluster.pool_nodes()
        nodes = ([self.cluster.nodes[name] for name in sorted(self.cluster.nodes)]
                 + list(self._pool_nodes.values()))
        table.present(nodes, lambda n: n["name"], lambda n: " ".join(
            str(n.get(k) or "") for k in ("name", "state", "host", "reason")), "Nodes")
        self._show_events()
        self._show_detail()

    def _show_events(self) -> None:
        """The log newest first: the lines loaded, then the stream's newer ones."""
        newest = self._log[-1]["t"] if self._log else 0
        events = (self._log + [e for e in self.cluster.events if e.get("t", 0) > newest])
        keyed: list[dict[str, Any]] = [{**e, "key": f"{e['t']}-{n}"}
                                       for n, e in reversed(list(enumerate(events[-EVENTS_SHOWN:])))]
        self.events = {e["key"]: e for e in keyed}
        table = self.query_one("#events-table", RowTable)
        table.present(self.events.values(), lambda e: e["key"], lambda e: " ".join(
            str(e.get(k) or "") for k in ("kind", "message", "node", "user")), "Events log")

    @work(exclusive=True, group="events-log")
    async def reload(self) -> None:
        """The ``events-log`` group: the log's older lines (the stream brings new ones)."""
        try:
            self._log = (await self.tui.call("events", EventsReply, **EventsRequest(limit=EVENTS_SHOWN)))["events"]
        except ApiError as err:
            if (table := self.live_table("#events-table")) is not None:
                table.border_subtitle = f"cannot load: {err}"
            return
        if self.live_table("#events-table") is not None:  # the app may have closed meanwhile
            self._show_events()

    def _selected(self) -> str | None:
        name = self.query_one("#nodes-table", RowTable).cursor_key
        if name is None:
            self.notify("No node selected", severity="warning")
        elif name in self._pool_nodes:
            pool = self._pool_nodes[name]["pool"]
            self.notify(f"{name} is a node of pool {pool}: its cluster's administrators "
                        "drain and resume it", severity="warning")
            return None
        return name

    def action_drain_node(self) -> None:
        if (name := self._selected()) is not None:
            self.tui.ask_drain(name)

    def action_resume_node(self) -> None:
        if (name := self._selected()) is not None:
            self.tui.node_action("resume", name)

    def action_remove_node(self) -> None:
        if (name := self._selected()) is not None:
            self.tui.ask_remove(name)

    def action_check_node(self) -> None:
        if (name := self._selected()) is not None:
            self.app.push_screen(DoctorScreen(name))

    def action_reload(self) -> None:
        self.reload()

    def action_add_node(self) -> None:
        self.app.push_screen(AddNodePrompt())
