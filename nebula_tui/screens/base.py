"""What every screen of live cluster data shares: header, connection banner, footer, and
the hook through which the app tells the visible screen what changed."""

from __future__ import annotations

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


class ClusterScreen(Screen):
    """A screen rendered from the app's ``Cluster``.

    Only the visible screen is told about changes (``cluster_changed``); a screen coming
    back into view renders everything once (``on_screen_resume``), updating rows in place.
    Screens batch what they are told: ``later`` runs ``render_all`` once for any number of
    changes, and only while the screen is shown.
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

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("", id="connection")
        yield from self.compose_body()
        yield Footer()

    def compose_body(self) -> ComposeResult:
        yield from ()

    @property
    def cluster(self):
        return self.app.cluster

    def on_screen_resume(self) -> None:
        if self._shown_before:  # at once, so the first frame shown is up to date
            self._resumed()
        else:  # after the next refresh: a screen just pushed has not mounted its widgets yet
            self._shown_before = True
            self.call_after_refresh(self._resumed)

    def _resumed(self) -> None:
        if self.is_mounted and self.is_current:
            self.show_connection()
            self.render_all()

    def cluster_changed(self, change: Change, key: object = None) -> None:
        """The app folded an event into the cluster; re-render what depends on it."""
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

    def show_connection(self) -> None:
        state, lost = self.app.connection
        banner = self.query_one("#connection", Static)
        banner.update(state)
        banner.set_class(lost, "lost")
