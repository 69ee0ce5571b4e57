"""Driving the TUI under Textual's Pilot: wait for a condition while the app runs, and
choose an entry of the command palette as a user would; read a table or a text as shown."""

from __future__ import annotations

import time

from textual.pilot import Pilot
from textual.widgets import DataTable

from nebula_tui.screens.commandline import CommandLine
from nebula_tui.screens.widgets.rowtable import RowTable


async def until(pilot, predicate, timeout: float = 30.0, what: str = "condition"):
    """Let the app run (events, renders) until ``predicate()`` is truthy."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        await pilot.pause(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def palette_options(app) -> str:
    """The command palette's current entries, as text."""
    found = app.screen.query("CommandList")
    if not found:
        return ""
    options = found.first()
    return "\n".join(str(options.get_option_at_index(i).prompt) for i in range(options.option_count))


async def palette_pick(pilot, typed: str, entry: str) -> None:
    """Open the command palette, type ``typed``, and choose once ``entry`` is offered."""
    await pilot.press("ctrl+p")
    await until(pilot, lambda: pilot.app.screen.query("CommandInput"), what="the palette")
    await pilot.press(*typed)
    await until(pilot, lambda: entry in palette_options(pilot.app), what=f"the palette's {entry!r}")
    await pilot.press("enter")


#: The terminal the screens' tests give the app (columns, lines).
SIZE = (140, 44)


def rows(pilot: Pilot, ident: str) -> dict[str, list[str]]:
    """The table's rows as text in display order, keyed by row key ({} before it mounts)."""
    found = pilot.app.screen.query(f"#{ident}")
    if not found:
        return {}
    t = found.first()
    if isinstance(t, RowTable):  # the big tables: every row, not only those on screen
        return {key: [str(c) for c in t.get_row(key)] for key in t.row_keys}
    assert isinstance(t, DataTable)
    return {row.key.value: [str(c) for c in t.get_row(row.key)] for row in t.ordered_rows}


def text(pilot: Pilot, selector: str) -> str:
    """What the widgets ``selector`` finds on the screen say, one a line."""
    return "\n".join(str(w.content) for w in pilot.app.screen.query(selector))


async def started(pilot: Pilot, gpus: int = 9) -> None:
    """Wait for the first snapshot (the session's lab has 9 cards, the in-process head 4) and
    a connection."""
    await until(pilot, lambda: len(pilot.app.cluster.gpus) == gpus and pilot.app.cluster.connected,
                what="the snapshot")


async def go(pilot: Pilot, key: str, screen_type) -> None:
    """Press ``key`` and wait for a screen of ``screen_type``, mounted."""
    await pilot.press(key)
    await until(pilot, lambda: isinstance(pilot.app.screen, screen_type) and pilot.app.screen.is_mounted,
                what=f"{screen_type.__name__}")
    await pilot.pause()


def table(pilot: Pilot, ident: str) -> RowTable:
    """The screen's big table ``ident``."""
    return pilot.app.screen.query_one(f"#{ident}", RowTable)


async def command(pilot: Pilot, line: str) -> None:
    """Type ``line`` on the ``:`` command line and run it."""
    await pilot.press("colon")
    await until(pilot, lambda: isinstance(pilot.app.screen, CommandLine), what="the command line")
    await pilot.press(*line, "enter")
