"""What every screen of live cluster data shares: header, connection banner, footer, and
the hook through which the app tells the visible screen what changed."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.screen import Screen
from textual.widgets import Footer, Header, Static

from ..api import ApiError
from .keys import Key


class OpMissing(ApiError):
    """The head service does not know this request (it is older than the TUI)."""


#: What changed, as the app tells screens: "all" (a snapshot), "job", "gpus", "node", "event".
Change = str


class ClusterScreen(Screen):
    """A screen rendered from the app's ``Cluster``.

    Only the visible screen is told about changes (``cluster_changed``); a screen coming
    back into view renders everything once (``on_screen_resume``), updating rows in place.
    """

    #: This screen's keys (its BINDINGS are built from them; help and palette read them).
    KEYS: tuple[Key, ...] = ()

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
        # After the next refresh: a screen just pushed may not have mounted its widgets yet.
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

    def show_connection(self) -> None:
        state, lost = self.app.connection
        banner = self.query_one("#connection", Static)
        banner.update(state)
        banner.set_class(lost, "lost")
