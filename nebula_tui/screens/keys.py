"""The TUI's keys, written down once.

Every key the user can press is a row here. The screens' BINDINGS, the footer, the help
modal and the command palette are all built from these rows, so a key cannot be bound
without also being documented and listed in the palette.

A row's action runs on the screen that lists it (``app.…`` actions run on the app).
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
    palette: bool = True  # listed in the command palette (False for duplicates such as "esc")
    priority: bool = False  # handled by the app as the key arrives (see GLOBAL_KEYS)


#: Keys that work on every screen (bound on the app). The screen keys are priority keys:
#: the app acts on them in the order they were typed. An ordinary key goes to the focused
#: widget's queue first, and a switch moves the focus, so of keys typed quickly some went
#: to the old screen's widget and some to the new one's, and ran in either order (a
#: text field still gets its digits: Textual leaves it the keys it takes).
GLOBAL_KEYS: tuple[Key, ...] = (
    Key("1", "app.show('overview')", "Overview", False, priority=True),
    Key("2", "app.show('gpus')", "GPUs", False, priority=True),
    Key("3", "app.show('queue')", "Queue", False, priority=True),
    Key("4", "app.show('users')", "Users", False, priority=True),
    Key("5", "app.show('nodes')", "Nodes / admin", False, priority=True),
    Key("n", "app.submit_form", "Submit a job", True),
    Key("t", "app.toggle_theme", "Light / dark theme", False),
    Key("r", "app.reconnect", "Reconnect", False),
    Key("ctrl+p", "app.command_palette", "Command palette", False, "^p", palette=False),
    Key("question_mark", "app.help", "Help", True, "?", palette=False),
    Key("q", "app.quit", "Quit", True),
)

#: The overview: R1 summary, node cards, events ticker, the queue.
OVERVIEW_KEYS: tuple[Key, ...] = (
    Key("c", "cancel_job", "Cancel job", True),
    Key("enter", "open_job", "Open job", False, "⏎"),
)

#: The GPU table.
GPUS_KEYS: tuple[Key, ...] = (
    Key("enter", "open_gpu", "Open GPU", True, "⏎"),
    Key("s", "cycle_sort", "Sort by next column", True),
    Key("slash", "filter", "Filter", True, "/"),
    Key("escape", "clear_filter", "Clear filter", False, "esc"),
)

#: One GPU's details.
GPU_DETAIL_KEYS: tuple[Key, ...] = (
    Key("escape", "app.pop_screen", "Back", True, "esc"),
    Key("h", "load_history", "Reload history", True),
)

#: Running and waiting jobs.
QUEUE_KEYS: tuple[Key, ...] = (
    Key("enter", "open_job", "Open job", True, "⏎"),
    Key("c", "cancel_job", "Cancel job", True),
    Key("h", "hold_job", "Hold job", True),
    Key("u", "release_job", "Release job", True),
    Key("m", "toggle_mine", "Only my jobs", True),
)

#: One job: spec, allocation, environment, history, log.
JOB_KEYS: tuple[Key, ...] = (
    Key("escape", "app.pop_screen", "Back", True, "esc"),
    Key("f", "toggle_follow", "Follow log", True),
    Key("a", "attach", "Attach (tmux)", True),
    Key("c", "cancel_job", "Cancel job", True),
    Key("h", "hold_job", "Hold job", False),
    Key("u", "release_job", "Release job", False),
)

#: The submit form (typing goes to the fields, so only control keys here).
SUBMIT_KEYS: tuple[Key, ...] = (
    Key("ctrl+s", "submit", "Submit", True, "^s"),
    Key("escape", "app.pop_screen", "Back", True, "esc"),
)

#: Users and fair share.
USERS_KEYS: tuple[Key, ...] = (
    Key("g", "reload", "Reload", True),
)

#: Nodes and the events log (admins).
NODES_KEYS: tuple[Key, ...] = (
    Key("d", "drain_node", "Drain node", True),
    Key("u", "resume_node", "Resume node", True),
    Key("a", "add_node", "Add node", True),
    Key("g", "reload", "Reload events", True),
)

#: Keys that close a modal (help, prompts).
HELP_KEYS: tuple[Key, ...] = (
    Key("escape", "dismiss", "Close", True, "esc"),
    Key("question_mark", "dismiss", "Close", False, "?"),
    Key("q", "dismiss", "Close", False),
)


def bindings(keys: tuple[Key, ...]) -> list[Binding]:
    """Textual bindings for ``keys`` (one Binding per row, same order)."""
    return [Binding(k.key, k.action, k.description, show=k.show, key_display=k.display,
                    priority=k.priority) for k in keys]


def help_lines(keys: tuple[Key, ...]) -> list[tuple[str, str]]:
    """(key as shown, description) for the help modal."""
    return [(k.display or k.key, k.description) for k in keys]
