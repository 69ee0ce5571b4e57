"""What every screen of live cluster data shares: the screen bar (where you are, and
whether the cluster is reachable), the connection banner, the filter box of its tables,
the footer, and the hooks through which the app tells screens what changed: the visible
screen renders it, a hidden one notes what it missed and catches up when shown again."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, Protocol, TypeVar, cast, overload

from rich.markup import escape
from rich.text import Text
from textual import events, on
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.content import Content
from textual.screen import Screen
from textual.widgets import Footer, Input, Static

from ..api import ApiError, AsyncClient
from ..client.cluster import Cluster, LiveJob
from ..wire import NodeWire
from .look import LOOK
from .widgets.keys import SCREENS, Key, bindings
from .widgets.rowtable import RowTable


class OpMissing(ApiError):
    """The head service does not know this request (it is older than the TUI)."""


#: What changed, as the app tells screens: "all" (a snapshot), "job", "job-live" (a job's
#: ``LIVE_JOB_FIELDS`` of ``client/cluster.py`` alone: rows on screen, no re-order), "gpus",
#: "node", "event", "bookings".
Change = str


#: Telemetry (every node's readings, once a second each) reaches the screen at most this
#: often, however many node messages arrive in between (seconds).
TELEMETRY_EVERY_S = 1.0
#: Job and node changes are batched this long, so a burst (a scheduling pass giving 9,000
#: waiting jobs their reasons) costs one re-sort, not one per job (seconds).
CHANGES_EVERY_S = 0.1


class KeyFooter(Footer):
    """Textual's footer, rebuilt only when the keys it shows change.

    Textual's footer rebuilds itself (a widget per key, each styled) whenever its screen
    says its bindings may have changed, and a screen says so every time it is shown: at
    1,000 GPUs that rebuild, its layout and its repaint were a third of a screen switch.
    The keys of a screen rarely change (focus moving into the GPU filter does), so this
    one compares what it would show with what it shows and keeps itself when they agree.
    """

    _shown_keys: tuple | None = None

    def on_resize(self) -> None:
        # At 80 columns the keys need every cell: the palette has its key in the help, and
        # the keys go closer together (the queue's and a job's ten reach past 80 otherwise).
        wide = self.size.width >= PALETTE_MIN_WIDTH
        self.compact = self.size.width < COMPACT_BELOW_WIDTH
        if wide != self.show_command_palette:
            self.show_command_palette = wide
            self.call_after_refresh(self.recompose)

    def bindings_changed(self, screen: Screen) -> None:
        keys = tuple((key, b.action, b.description, b.show, enabled, tooltip)
                     for key, (_, b, enabled, tooltip) in screen.active_bindings.items())
        if keys != self._shown_keys:
            self._shown_keys = keys
            super().bindings_changed(screen)


#: Below this many columns the footer leaves out the command palette's entry …
PALETTE_MIN_WIDTH = 110
#: … and below this many it sets its keys closer together.
COMPACT_BELOW_WIDTH = 100
#: Below this many columns the bar leaves out the program's and the cluster's name.
BAR_NAME_MIN_WIDTH = 110

#: Node states in which the head reaches the node.
REACHABLE = frozenset({"up", "drained"})


def reach_text(nodes: Mapping[str, NodeWire], connected: bool, lost: bool = False) -> Text:
    """What the bar says of the cluster: every node up, some unreachable, or none (or
    that the head itself is not reached)."""
    if lost:
        return Text("✖ head not reached", style=LOOK.role("bad"))
    if not connected:
        return Text("connecting…", style="dim")
    if not nodes:
        return Text("no nodes yet", style="dim")
    reached = [n for n in nodes.values() if n.get("state") in REACHABLE]
    total = len(nodes)
    if len(reached) == total:
        return Text(f"● {total}/{total} nodes up", style=LOOK.role("ok"))
    if not reached:
        return Text(f"✖ no node reachable (0/{total})", style=LOOK.role("bad"))
    down = sorted(name for name, n in nodes.items() if n.get("state") not in REACHABLE)
    names = ", ".join(down[:2]) + ("…" if len(down) > 2 else "")
    return Text(f"▲ {len(reached)}/{total} reachable · {names} not", style=LOOK.role("warn"))


class ScreenBar(Horizontal):
    """The top line: the five screens (the current one marked, each clickable), where in
    it a detail page is, and on the right the cluster's real reachability."""

    DEFAULT_CSS = """
    ScreenBar {
        height: 1;
        dock: top;
        background: $panel;
        & > #bar-tabs { width: 1fr; height: 1; }
        & > #bar-state { width: auto; height: 1; padding: 0 1; }
    }
    """

    _shown: tuple | None = None

    def compose(self) -> ComposeResult:
        yield Static("", id="bar-tabs")
        yield Static("", id="bar-state")

    def show(self, mode: str | None, crumb: str, state: Text, name: str) -> None:
        width = self.app.size.width
        wide = width >= BAR_NAME_MIN_WIDTH
        # Narrow, the tabs are tight; the name still shows where it fits (the cluster's
        # part of it first): at 80 columns the title was gone.
        tabs_width = sum(len(f"{key} {title} ") for key, _, title in SCREENS) + (len(crumb) + 3 if crumb else 0)
        room = width - tabs_width - len(state.plain) - 4
        if not wide:
            name = next((n for n in (name, name.rpartition(" · ")[2]) if len(n) <= room), "")
        shown = (mode, crumb, state.plain, state.style, name, LOOK.dark)
        if shown == self._shown:
            return
        self._shown = shown
        tabs = []
        for key, tab_mode, title in SCREENS:
            style = "reverse bold" if tab_mode == mode else ""
            label = f" {key} {title} " if wide else f"{key} {title}" + (" " if key != "5" else "")
            tabs.append(f"[@click=app.show('{tab_mode}')][{style}]{label}[/][/]" if style else
                        f"[@click=app.show('{tab_mode}')]{label}[/]")
        markup = "".join(tabs)
        if crumb:
            markup += f" › [b]{escape(crumb)}[/b]"
        tabs_line, state_line = (next(iter(self.query(f"#bar-{part}").results(Static)), None)
                                 for part in ("tabs", "state"))
        if tabs_line is None or state_line is None:
            # A screen warmed up unseen can be asked before its bar has composed (or after
            # the app closed it); its next show paints once the lines are there.
            self._shown = None
            return
        tabs_line.update(Content.from_markup(markup))
        right = Text()
        if name:
            right.append(f"{name}  ", style="bold")
        right.append_text(state)
        state_line.update(right)

    def on_resize(self) -> None:
        self._shown = None
        screen = self.screen
        if isinstance(screen, ClusterScreen):
            screen.show_bar()


class FilterBox(Input):
    """The filter of the table that asked for it (``/``): typing filters at once, enter
    goes back to the table keeping the filter, esc clears it."""

    BINDINGS = [("escape", "clear", "Clear the filter")]

    table: RowTable | None = None

    def action_clear(self) -> None:
        self.value = ""
        self.close()

    def close(self) -> None:
        self.remove_class("shown")
        if self.table is not None:
            self.table.set_filter(self.value)
            if self.table.is_mounted:
                self.table.focus()


R = TypeVar("R")


class ClusterApp(Protocol):
    """What the screens use of the app besides Textual's ``App`` (``app.NebulaApp``, which
    mypy checks is one): its connection to the head, its ``Cluster``, who it runs for, and
    the actions a screen's keys ask of it. A screen reaches it as ``self.tui``."""

    client: AsyncClient
    cluster: Cluster
    user: str | None
    #: (what the title bar says, whether the stream is lost)
    connection: tuple[str, bool]

    @overload
    async def call(self, op: str, reply: type[R], **fields: Any) -> R: ...

    @overload
    async def call(self, op: str, reply: None = None, **fields: Any) -> dict[str, Any]: ...

    def open_job(self, job_id: int) -> None: ...

    def action_back(self) -> None: ...

    def open_gpu(self, uuid: str) -> None: ...

    def running_on(self, node: str) -> list[LiveJob]: ...

    # (Textual's workers: each call starts one and returns it)
    def job_action(self, op: str, job_id: int) -> object: ...

    def ask_cancel(self, job_id: int) -> object: ...

    def show_why(self, job_id: int) -> object: ...

    def ask_drain(self, node: str, reason: str | None = None) -> None: ...

    def ask_remove(self, node: str) -> object: ...

    def node_action(self, op: str, node: str, reason: str = "") -> object: ...


def tui_of(screen: Screen) -> ClusterApp:
    """The app of ``screen`` as the screens use it (a dialog's too)."""
    return cast(ClusterApp, screen.app)


class ClusterScreen(Screen):
    """A screen rendered from the app's ``Cluster``.

    The visible screen is told about changes (``cluster_changed``); hidden ones only note
    the kinds of change they missed (``missed``) and, coming back into view, bring what
    they show up to date once (``catch_up``; by default ``render_all``), updating rows in
    place. Screens batch what they are told: ``later`` runs ``render_all`` once for any
    number of changes, and only while the screen is shown.
    """

    #: This screen's keys (its BINDINGS are built from them; help and palette read them).
    KEYS: tuple[Key, ...] = ()

    def live_table(self, selector: str) -> RowTable | None:
        """The screen's table, or None once its widgets are gone: the app may close while a
        screen it warms up unseen (``NebulaApp._warm_up``) still mounts or loads."""
        return next(iter(self.query(selector).results(RowTable)), None)

    def __init_subclass__(cls, **kwargs) -> None:
        # A screen declares its keys once, as data; set before Textual reads BINDINGS.
        if "KEYS" in cls.__dict__:
            cls.BINDINGS = bindings(cls.KEYS)
        super().__init_subclass__(**kwargs)

    _later = None  # the pending ``later`` timer, if any
    _shown_before = False
    _connection: tuple[str, bool] | None = None  # what the banner shows
    _styled_for: tuple | None = None  # the app's style state when this screen was hidden

    def __init__(self) -> None:
        super().__init__()
        self._missed: set[Change] = {"all"}  # kinds of change not rendered yet
        self.drawn = asyncio.Event()  # set once the screen has been shown with its data

    #: The main screen (mode) a screen belongs to for the bar; None: the app's current one.
    MODE: str | None = None

    def compose(self) -> ComposeResult:
        yield ScreenBar()
        yield Static("", id="connection")
        yield from self.compose_body()
        yield FilterBox(placeholder="filter: type to narrow the rows · enter keeps it · esc clears",
                        id="filter")
        yield KeyFooter()

    def crumb(self) -> str:
        """Where in its main screen this one is ("Job 7 · train"); "" for a main screen."""
        return ""

    def show_bar(self) -> None:
        bars = self.query(ScreenBar)
        if bars:
            bars.first().show(self.MODE or self.app.current_mode, self.crumb(),
                              reach_text(self.cluster.nodes, self.cluster.connected,
                                         self.tui.connection[1]),
                              getattr(self.app, "bar_name", "NebulaGrid"))

    # ------------------------------------------------------------------ filter box
    @on(RowTable.FilterAsked)
    def _filter_asked(self, message: RowTable.FilterAsked) -> None:
        box = self.query_one("#filter", FilterBox)
        box.table = message.table
        box.value = message.table.needle
        box.add_class("shown")
        box.focus()

    @on(Input.Changed, "#filter")
    def _filter_typed(self, event: Input.Changed) -> None:
        box = self.query_one("#filter", FilterBox)
        if box.table is not None:
            box.table.set_filter(event.value)
        event.stop()

    @on(Input.Submitted, "#filter")
    def _filter_kept(self, event: Input.Submitted) -> None:
        self.query_one("#filter", FilterBox).close()
        event.stop()

    def compose_body(self) -> ComposeResult:
        yield from ()

    @property
    def tui(self) -> ClusterApp:
        return tui_of(self)

    @property
    def cluster(self) -> Cluster:
        return self.tui.cluster

    def on_screen_suspend(self) -> None:
        self._styled_for = self._app_style_state()

    def on_screen_resume(self, event: events.ScreenResume) -> None:
        if self._styled_for == self._app_style_state():
            # Textual restyles every widget of a screen shown again, which then paints every
            # line anew: at 1,000 GPUs a third of a switch. Only the app's own state (theme,
            # classes, focus) could have moved this screen's styles while it was hidden.
            event.refresh_styles = False
        if self._shown_before:  # at once, so the first frame shown is up to date
            self._resumed()
        else:  # after the next refresh: a screen just pushed has not mounted its widgets yet
            self._shown_before = True
            self.call_after_refresh(self._resumed)

    def _app_style_state(self) -> tuple:
        app = self.app
        return app.theme, app.classes, app.pseudo_classes

    def _resumed(self) -> None:
        if self.is_mounted and self.is_current:
            self.show_connection()
            missed, self._missed = self._missed, set()
            if missed:
                self.catch_up(missed)
            self.drawn.set()

    def cluster_changed(self, change: Change, key: object = None) -> None:
        """The app folded an event into the cluster; re-render what depends on it."""
        self.render_all()

    def missed(self, change: Change) -> None:
        """The app folded an event into the cluster while this screen was hidden."""
        self._missed.add(change)

    def catch_up(self, missed: set[Change]) -> None:
        """Shown again after ``missed`` kinds of change (``"all"``: never rendered, or a
        render came due while hidden): show the cluster as it is now. Screens whose full
        render is dear override this to redo only what those changes touch."""
        self.render_all()

    def render_all(self) -> None:
        """Show the cluster as it is now (rows updated in place)."""

    def restyle(self, *, shown: bool) -> None:
        """The theme changed: what was drawn in the old colours is drawn again (now when
        ``shown``, else when shown next)."""
        for table in self.query(RowTable):
            table.forget_cells()
        if shown:
            self.catch_up({"all"})
            self.show_bar()
        else:
            self.missed("all")

    def later(self, delay: float = CHANGES_EVERY_S) -> None:
        """Render everything within ``delay`` seconds, once, however often this is called
        meanwhile; skipped when the screen is hidden by then (it renders on resume)."""
        if self._later is None:
            self._later = self.set_timer(delay, self._render_later)

    def _render_later(self) -> None:
        self._later = None
        if self.is_mounted and self.is_current:
            self.render_all()
        else:
            self.missed("all")

    def show_connection(self) -> None:
        self.show_bar()
        if self.tui.connection == self._connection:
            return  # (an update lays the whole screen out again: not on every switch)
        banners = self.query("#connection")
        if not banners:
            return  # not composed yet (a snapshot came first): shown when it resumes
        self._connection = state, lost = self.tui.connection
        banner = banners.first(Static)
        banner.update(state)
        banner.set_class(lost, "lost")
