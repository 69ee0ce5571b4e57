"""The TUI's keys, written down once.

Every key the user can press is a row here. The screens' BINDINGS, the tables' bindings,
the footer, the help modal and the command palette are all built from these rows, so a key
cannot be bound without also being documented and listed in the palette.

A row's action runs on the screen that lists it (``app.…`` actions run on the app; the
table keys run on the table that has the focus).
"""

from __future__ import annotations

from typing import NamedTuple

from textual.binding import Binding, BindingType


class Key(NamedTuple):
    """One key: what Textual calls it, the action it runs, what the help says, footer or not."""

    key: str
    action: str
    description: str
    show: bool
    display: str | None = None  # how the footer/help spell the key, where Textual's name is odd
    palette: bool = True  # listed in the command palette (False for duplicates such as "esc")
    priority: bool = False  # handled by the app as the key arrives (see GLOBAL_KEYS)
    short: str | None = None  # the footer's word, where the description is long

    @property
    def shown_key(self) -> str:
        return self.display or self.key


#: The main screens, in the order of their keys (1–5) and of the screen bar.
SCREENS: tuple[tuple[str, str, str], ...] = (
    ("1", "overview", "Overview"), ("2", "gpus", "GPUs"), ("3", "queue", "Queue"),
    ("4", "users", "Users"), ("5", "nodes", "Nodes"),
)

#: Keys that work on every screen (bound on the app). The screen keys are priority keys:
#: the app acts on them in the order they were typed. An ordinary key goes to the focused
#: widget's queue first, and a switch moves the focus, so of keys typed quickly some went
#: to the old screen's widget and some to the new one's, and ran in either order (a
#: text field still gets its digits and ":": Textual leaves it the keys it takes).
GLOBAL_KEYS: tuple[Key, ...] = (
    *(Key(key, f"app.show('{mode}')", title, False, priority=True) for key, mode, title in SCREENS),
    Key("colon", "app.command_line", "Command line (the commands are under the keys)", True, ":",
        priority=True, short="Command"),
    Key("n", "app.submit_form", "Submit a job", True, short="Submit"),
    Key("t", "app.toggle_theme", "Light / dark theme", False),
    Key("r", "app.reconnect", "Reconnect to the head", False),
    Key("P", "app.save_screenshot", "Save a screenshot (SVG)", False, "P"),
    Key("ctrl+p", "app.command_palette", "Command palette", False, "^p", palette=False),
    Key("question_mark", "app.help", "Help", True, "?", palette=False),
    Key("q", "app.quit", "Quit", True),
)

#: Every table (``RowTable``): the same keys everywhere. Arrows, PgUp/PgDn and Home/End
#: beside the vi keys; ``/`` filters, ``s``/``S`` sort (a click on a header sorts too).
TABLE_KEYS: tuple[Key, ...] = (
    Key("up,k", "cursor(-1)", "Up", False, "↑/k", palette=False),
    Key("down,j", "cursor(1)", "Down", False, "↓/j", palette=False),
    Key("pageup,ctrl+b", "page(-1)", "Page up", False, "PgUp", palette=False),
    Key("pagedown,ctrl+f", "page(1)", "Page down", False, "PgDn", palette=False),
    Key("home,g", "jump(0)", "First row", False, "Home/g"),
    Key("end,G", "jump(-1)", "Last row", False, "End/G"),
    Key("left", "scroll_left", "Scroll left", False, "←", palette=False),
    Key("right", "scroll_right", "Scroll right", False, "→", palette=False),
    Key("enter", "select", "Open the row", False, "⏎", palette=False),
    Key("slash", "filter", "Filter rows", True, "/", short="Filter"),
    Key("s", "sort_next", "Sort by the next column", True, short="Sort"),
    Key("S", "sort_reverse", "Reverse the sort", False),
    Key("escape", "clear_filter", "Clear the filter", False, "esc", palette=False),
)

#: The overview: summary line, node cards, events ticker, the queue.
OVERVIEW_KEYS: tuple[Key, ...] = (
    Key("enter", "open_job", "Open job", False, "⏎"),
    Key("c", "cancel_job", "Cancel job", True, short="Cancel"),
)

#: The GPU table.
GPUS_KEYS: tuple[Key, ...] = (
    Key("enter", "open_gpu", "Open GPU", True, "⏎", short="Open"),
    Key("f", "toggle_free", "Only free GPUs", True, short="Free"),
)

#: One GPU's details.
GPU_DETAIL_KEYS: tuple[Key, ...] = (
    Key("escape", "app.back", "Back", True, "esc"),
    Key("h", "load_history", "Reload history", True, short="Reload"),
)

#: Running and waiting jobs, and (``a``) the ended ones too.
QUEUE_KEYS: tuple[Key, ...] = (
    Key("enter", "open_job", "Open job", True, "⏎", short="Open"),
    Key("c", "cancel_job", "Cancel job", True, short="Cancel"),
    Key("h", "hold_job", "Hold job", False),
    Key("u", "release_job", "Release job", False),
    Key("w", "why_job", "Why it waits, and what would start it sooner", True, short="Why"),
    Key("m", "toggle_mine", "Only my jobs", True, short="Mine"),
    Key("a", "toggle_all", "Active / all jobs (history)", True, short="All"),
)

#: One job: spec, allocation, environment, history, log.
JOB_KEYS: tuple[Key, ...] = (
    Key("escape", "app.back", "Back", True, "esc"),
    Key("f", "toggle_follow", "Follow log", True, short="Follow"),
    Key("a", "attach", "Attach (tmux)", True, short="Attach"),
    Key("c", "cancel_job", "Cancel job", True, short="Cancel"),
    Key("h", "hold_job", "Hold job", False),
    Key("u", "release_job", "Release job", False),
    Key("w", "why_job", "Why it waits, and what would start it sooner", True, short="Why"),
)

#: Every form with several fields. Tab is a priority key: the focus moves as it arrives,
#: so what is typed right after lands in the next field, however fast.
FORM_KEYS: tuple[Key, ...] = (
    Key("tab", "app.focus_next", "Next field", False, "tab", palette=False, priority=True),
    Key("shift+tab", "app.focus_previous", "Previous field", False, "⇧tab", palette=False,
        priority=True),
)

#: The submit form (typing goes to the fields, so only control keys here).
SUBMIT_KEYS: tuple[Key, ...] = (
    Key("ctrl+s", "submit", "Submit", True, "^s"),
    Key("escape", "app.back", "Back", True, "esc"),
    *FORM_KEYS,
)

#: Users and fair share.
USERS_KEYS: tuple[Key, ...] = (
    Key("enter", "open_user", "The user's jobs", True, "⏎", short="Jobs"),
)

#: Nodes and the events log (admins).
NODES_KEYS: tuple[Key, ...] = (
    Key("d", "drain_node", "Drain node", True, short="Drain"),
    Key("u", "resume_node", "Resume node", True, short="Resume"),
    Key("a", "add_node", "Add node", False),
    Key("x", "remove_node", "Remove node", False),
    Key("D", "check_node", "Check node (doctor)", False),
    Key("e", "reload", "Reload events", False),
)

#: Keys that close a modal (help, prompts).
HELP_KEYS: tuple[Key, ...] = (
    Key("escape", "dismiss", "Close", True, "esc"),
    Key("question_mark", "dismiss", "Close", False, "?"),
    Key("q", "dismiss", "Close", False),
)

#: The main screens' own keys, by mode: the palette offers them from every screen.
SCREEN_KEYS: dict[str, tuple[Key, ...]] = {
    "overview": OVERVIEW_KEYS, "gpus": GPUS_KEYS, "queue": QUEUE_KEYS,
    "users": USERS_KEYS, "nodes": NODES_KEYS,
}


def bindings(keys: tuple[Key, ...]) -> list[BindingType]:
    """Textual bindings for ``keys`` (one Binding per row, same order)."""
    return [Binding(k.key, k.action, k.short or k.description, show=k.show,
                    key_display=k.display, priority=k.priority, tooltip=k.description)
            for k in keys]


def help_lines(keys: tuple[Key, ...]) -> list[tuple[str, str]]:
    """(key as shown, description) for the help modal."""
    return [(k.shown_key, k.description) for k in keys]
