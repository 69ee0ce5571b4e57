"""The Textual application: one factory (``make_app``) for the CLI and the tests alike.

The app only knows the head service's socket; everything it shows arrives over that socket
(a subscription for live state, one request per user action).
"""

from __future__ import annotations

import sys
from pathlib import Path

from textual.app import App, ComposeResult
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static

from ..api import ApiError, AsyncClient
from ..service import Home, ServiceUnavailable, connect
from .keys import HELP_KEYS, OVERVIEW_KEYS, bindings, help_lines
from .overview import OverviewScreen


class HelpScreen(ModalScreen[None]):
    """The keys, as listed in ``keys.OVERVIEW_KEYS``."""

    BINDINGS = bindings(HELP_KEYS)

    def compose(self) -> ComposeResult:
        width = max(len(k) for k, _ in help_lines(OVERVIEW_KEYS))
        text = "\n".join(f"{k:>{width}}  {d}" for k, d in help_lines(OVERVIEW_KEYS))
        with Vertical(id="help"):
            yield Static("Keys", id="help-title")
            yield Static(text, id="help-keys")
            yield Static("esc closes this help", id="help-hint")

    def action_dismiss(self) -> None:  # type: ignore[override]
        self.dismiss(None)


class NebulaApp(App):
    """NebulaGrid TUI: a client of one head service."""

    CSS_PATH = "nebula.tcss"
    TITLE = "NebulaGrid"

    def __init__(self, client: AsyncClient, cluster_name: str | None = None) -> None:
        super().__init__()
        self.client = client
        if cluster_name:
            self.title = f"NebulaGrid — {cluster_name}"

    def on_mount(self) -> None:
        self.push_screen(OverviewScreen())

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())


def make_app(socket_path: Path, cluster_name: str | None = None) -> NebulaApp:
    """The app, talking to the head service listening on ``socket_path``."""
    return NebulaApp(AsyncClient(Path(socket_path)), cluster_name)


def _cluster_name(home: Home, config: str | None) -> str | None:
    """The cluster's name from nodes.yaml, for the header; None when it cannot be read."""
    from ..config import ConfigError, find_config, load_config

    try:
        path = find_config(config, home.root)
        return load_config(path).name if path else None
    except (ConfigError, OSError):
        return None


def run_tui(home: Home, config: str | None) -> int:
    """Start the head service if needed, then run the TUI until the user quits."""
    try:
        connect(home, config).close()  # autostarts the service like tmux does
    except (ServiceUnavailable, ApiError) as err:
        print(f"nebula: {err}", file=sys.stderr)
        return 1
    app = make_app(home.socket, _cluster_name(home, config))
    app.run()
    return app.return_code or 0
