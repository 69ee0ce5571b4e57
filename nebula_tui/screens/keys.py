"""The TUI's keys, written down once.

Every key the user can press is a row here; the screens' BINDINGS, the footer and the help
modal are all built from these rows, so a key cannot be bound without also being documented.
"""

from __future__ import annotations

from typing import NamedTuple

from textual.binding import Binding


class Key(NamedTuple):
    """One key: what Textual calls it, the action it runs, what the help says, footer or not."""

    key: str
    action: str
    description: str
    show: bool
    display: str | None = None  # how the footer/help spell the key, where Textual's name is odd


#: The overview screen's keys (actions live on ``OverviewScreen`` / ``NebulaApp``).
OVERVIEW_KEYS: tuple[Key, ...] = (
    Key("q", "app.quit", "Quit", True),
    Key("c", "cancel_job", "Cancel job", True),
    Key("r", "reconnect", "Reconnect", True),
    Key("question_mark", "app.help", "Help", True, "?"),
)

#: Keys that close the help modal.
HELP_KEYS: tuple[Key, ...] = (
    Key("escape", "dismiss", "Close", True, "esc"),
    Key("question_mark", "dismiss", "Close", False, "?"),
    Key("q", "dismiss", "Close", False),
)


def bindings(keys: tuple[Key, ...]) -> list[Binding]:
    """Textual bindings for ``keys`` (one Binding per row, same order)."""
    return [Binding(k.key, k.action, k.description, show=k.show, key_display=k.display)
            for k in keys]


def help_lines(keys: tuple[Key, ...]) -> list[tuple[str, str]]:
    """(key as shown, description) for the help modal."""
    return [(k.display or k.key, k.description) for k in keys]
