"""The screens' keys, the submit form's checks and the Nodes screen's drain and resume,
driven with Pilot against a real head in the test's own loop (``inprocess``: the
``Engine`` and its ``ApiServer`` on a real socket, its two nodes' reports fed directly).
What needs the lab's real jobs, logs and cards is ``tests/lab/test_tui_screens.py``.
"""

from __future__ import annotations

from support.tui import SIZE, go, palette_pick, rows, started, text, until
from textual import events
from textual.widgets import Input

from nebula_tui.screens.app import HelpScreen, make_app
from nebula_tui.screens.gpus import GpusScreen
from nebula_tui.screens.nodes import DrainPrompt, NodesScreen
from nebula_tui.screens.overview import OverviewScreen
from nebula_tui.screens.queue import QueueScreen
from nebula_tui.screens.submit import check_field

GPUS = 4  # the in-process head's two nodes of two A100s each


def select_row(pilot, ident: str, key: str) -> None:
    t = pilot.app.screen.query_one(f"#{ident}")
    t.focus()
    t.move_cursor(row=t.get_row_index(key))


def test_form_checks_fields_like_the_cli():
    assert check_field("gpu_mem", "8G") is None and check_field("gpu_mem", "8GiB") is None
    assert check_field("gpu_mem", "8192M") is None
    assert "not a size" in check_field("gpu_mem", "eight")
    assert check_field("gpu_count", "0") and check_field("gpu_count", "2") is None
    assert check_field("workdir", "data") and check_field("workdir", "/data") is None
    assert check_field("command", " ") and check_field("name", "x" * 129)


# ============================================================================ nodes
async def test_nodes_drain_resume_and_events_log(engine, served):
    app = make_app(served)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await started(pilot, GPUS)
        await go(pilot, "5", NodesScreen)
        await until(pilot, lambda: len(rows(pilot, "nodes-table")) == 2, what="2 nodes")
        assert all("up" == c[1] for c in rows(pilot, "nodes-table").values())
        await until(pilot, lambda: rows(pilot, "events-table"), what="events log")
        assert any("is up" in c[2] for c in rows(pilot, "events-table").values())

        select_row(pilot, "nodes-table", "node02")
        await pilot.press("d")
        await until(pilot, lambda: isinstance(app.screen, DrainPrompt), what="drain prompt")
        await pilot.press(*"fan swap")
        await pilot.press("enter")
        await until(pilot, lambda: rows(pilot, "nodes-table")["node02"][1] == "drained",
                    what="node02 drained")
        assert engine.state.nodes["node02"].drained
        assert engine.state.nodes["node02"].drain_reason == "fan swap"
        await until(pilot, lambda: any("drain" in c[2] for c in rows(pilot, "events-table").values()),
                    timeout=15, what="drain in the events log")
        select_row(pilot, "nodes-table", "node02")
        await pilot.press("u")
        await until(pilot, lambda: rows(pilot, "nodes-table")["node02"][1] == "up",
                    what="node02 resumed")
        assert not engine.state.nodes["node02"].drained


# ============================================================================ keys
async def test_palette_help_and_theme_read_the_same_keys(served):
    app = make_app(served)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, GPUS)
        await go(pilot, "3", QueueScreen)
        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen), what="help")
        help_text = text(pilot, "#help-keys")
        for word in ("Hold job", "Release job", "Only my jobs", "Cancel job", "Submit a job", "Quit"):
            assert word in help_text
        await pilot.press("escape")
        await until(pilot, lambda: isinstance(app.screen, QueueScreen), what="help closed")

        dark = app.current_theme.dark
        await pilot.press("t")
        await until(pilot, lambda: app.current_theme.dark != dark, what="theme toggled")
        await pilot.press("t")
        await until(pilot, lambda: app.current_theme.dark == dark, what="theme back")

        await palette_pick(pilot, "Nodes", "Nodes")
        await until(pilot, lambda: isinstance(app.screen, NodesScreen), what="nodes via palette")


async def test_screen_keys_typed_quickly_act_in_the_order_typed(served):
    """Screen keys typed faster than screens switch, delivered as the terminal driver
    delivers them (no wait in between): the last key's screen is the one shown. (Digits
    typed while the GPU screen mounted went into its hidden filter, which had the focus
    then: "42141" ended on GPUs. And keys went to the focused widget first, which a switch
    changes, so keys typed meanwhile could run in either order.) The pauses are what
    a wrong order would need to show: a wait for the right screen could pass on the way."""
    app = make_app(served)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, GPUS)
        for keys, mode, screen_type in (("42141", "overview", OverviewScreen),
                                         ("53253", "queue", QueueScreen),
                                         ("21432", "gpus", GpusScreen)):
            for key in keys:
                app.post_message(events.Key(key, key))
            await pilot.pause(1.0)
            await pilot.pause()
            assert (app.current_mode, type(app.screen)) == (mode, screen_type), keys
        await pilot.press("question_mark")  # help keeps the screen under it
        await until(pilot, lambda: isinstance(app.screen, HelpScreen), what="help")
        await pilot.press("1")
        await pilot.pause(0.3)
        assert isinstance(app.screen, HelpScreen) and app.current_mode == "gpus"
        await pilot.press("escape")
        await pilot.press("slash", "1", "2")  # digits typed into the filter stay there
        await until(pilot, lambda: app.screen.query_one("#filter", Input).value == "12",
                    what="digits in the filter")
        assert app.current_mode == "gpus"
