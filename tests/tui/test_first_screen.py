"""The TUI's first screen where no node's real run matters, driven with Pilot: against a real
head in the test's own loop (``inprocess``), or none at all. What needs the lab's nodes and
jobs (its cards, a job's life, a head stopped or restarted) is ``tests/lab/test_tui.py``."""

from __future__ import annotations

from support.tui import until
from textual.widgets import Static

from nebula_tui.screens.app import make_app
from nebula_tui.screens.widgets.rowtable import RowTable


async def test_cancel_refused_is_a_notification(engine, served):
    app = make_app(served)
    async with app.run_test(size=(120, 40), notifications=True) as pilot:
        await until(pilot, lambda: len(app.cluster.gpus) == 4, what="the head's 4 GPUs")
        # An empty queue: c says there is nothing to cancel.
        await until(pilot, lambda: not app.screen.query_one("#queue", RowTable).row_keys,
                    what="empty queue")
        await pilot.press("c")
        await until(pilot, lambda: any("queue is empty" in str(t.render())
                                       for t in app.screen.query("Toast")), what="warning toast")
        # The service refuses (no such job): its reason shows as a notification.
        app.job_action("cancel", 999_999)
        await until(pilot, lambda: any("no job 999999" in str(t.render())
                                       for t in app.screen.query("Toast")), what="refusal toast")
        assert app.is_running and not engine.jobs


async def test_reconnects_after_stream_breaks(tmp_path):
    """No service at the socket: the TUI says so and keeps retrying instead of crashing."""
    app = make_app(tmp_path / "nope.sock")
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.sub_title.startswith("disconnected — retrying"),
                    what="disconnected banner")
        banner = app.screen.query_one("#connection", Static)
        assert banner.has_class("lost") and banner.display
