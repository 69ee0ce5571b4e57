"""What every screen of live cluster data shares: header, connection banner, footer, and
the hooks through which the app tells screens what changed: the visible screen renders it,
a hidden one notes what it missed and catches up when shown again."""

from __future__ import annotations

from textual import events
from textual.app import ComposeResult
from textual.screen import Screen
from textual.widgets import Footer, Header, Static

from ..api import ApiError
from .keys import Key, bindings


class OpMissing(ApiError):
    """The head service does not know this request (it is older than the TUI)."""


#: What changed, as the app tells screens: "all" (a snapshot), "job", "gpus", "node", "event".
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

    def bindings_changed(self, screen: Screen) -> None:
        keys = tuple((key, b.action, b.description, b.show, enabled, tooltip)
                     for key, (_, b, enabled, tooltip) in screen.active_bindings.items())
        if keys != self._shown_keys:
            self._shown_keys = keys
            super().bindings_changed(screen)


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

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("", id="connection")
        yield from self.compose_body()
        yield KeyFooter()

    def compose_body(self) -> ComposeResult:
        yield from ()

    @property
    def cluster(self):
        return self.app.cluster

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
        if self.app.connection == self._connection:
            return  # (an update lays the whole screen out again: not on every switch)
        self._connection = state, lost = self.app.connection
        banner = self.query_one("#connection", Static)
        banner.update(state)
        banner.set_class(lost, "lost")
