"""The TUI against a real head service on the simulated lab, driven through Textual's Pilot.

Assertions are on what is on screen: the overview text, the GPU table and the queue table.
"""

from __future__ import annotations

import re
import time

import pytest
from textual.pilot import Pilot
from textual.widgets import DataTable, Static

from nebula_tui.screens.app import HelpScreen, make_app

EXPECTED_MODELS = {
    "node01": ["RTX 4090", "RTX 4090", "RTX 4060 Laptop"],
    "node02": ["A100-SXM4-80GB"] * 4,
    "node03": ["RTX 3090", "RTX 3090"],
}


async def until(pilot: Pilot, predicate, timeout: float = 30.0, what: str = "condition"):
    """Let the app run (events, renders) until ``predicate()`` is truthy."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        await pilot.pause(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def table(pilot: Pilot, ident: str) -> DataTable:
    return pilot.app.screen.query_one(f"#{ident}", DataTable)


def overview(pilot: Pilot) -> str:
    return str(pilot.app.screen.query_one("#overview", Static).content)


def rows(pilot: Pilot, ident: str) -> dict[str, list[str]]:
    """The table's rows as text, keyed by row key (GPU uuid / job id)."""
    t = table(pilot, ident)
    return {key.value: [str(c) for c in t.get_row(key)] for key in t.rows}


def submit(head, *args: str) -> int:
    done = head.run("submit", *args, check=True)
    match = re.search(r"Submitted job (\d+)", done.stdout)
    assert match, done.stdout
    return int(match.group(1))


def cancel_quietly(head, job_id: int) -> None:
    try:
        head.call("cancel", job=job_id)
    except Exception:  # already finished: nothing to clean up
        pass


@pytest.fixture
def jobs(head):
    """Ids of jobs a test submitted; all cancelled afterwards."""
    ids: list[int] = []
    yield ids
    for job_id in ids:
        cancel_quietly(head, job_id)
    for job_id in ids:
        head.wait_job(job_id)


async def test_gpus_and_overview(head):
    app = make_app(head.home / "nebula.sock", cluster_name="lab")
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: len(rows(pilot, "gpus")) == 9, what="9 GPU rows")
        shown = rows(pilot, "gpus")
        by_node: dict[str, list[tuple[int, str]]] = {}
        for cells in shown.values():
            by_node.setdefault(cells[0], []).append((int(cells[1]), cells[2]))
        assert {n: [m for _, m in sorted(v)] for n, v in by_node.items()} == EXPECTED_MODELS
        # The rows are keyed by the GPUs' uuids, as the head publishes them.
        assert set(shown) == {g["uuid"] for g in head.call("gpus")["gpus"]}
        text = overview(pilot)
        assert text.startswith("Cluster Overview:")
        assert "  Nodes: 3" in text
        assert re.search(r"  GPUs: 9 \(\d+ idle, \d+ busy, \d+ maintenance", text)
        assert "node02: A100-SXM4-80GB x4" in text
        assert "lab" in app.title and app.sub_title == "connected"


async def test_job_appears_and_cancel_removes_it(head, jobs):
    app = make_app(head.home / "nebula.sock")
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: len(rows(pilot, "gpus")) == 9, what="9 GPU rows")
        gpu_rows_before = set(rows(pilot, "gpus"))
        job_id = submit(head, "--gpu-mem", "6G", "--", "sleep", "30")
        jobs.append(job_id)
        key = str(job_id)

        await until(pilot, lambda: rows(pilot, "queue").get(key, [None] * 4)[3] == "running",
                    what=f"job {job_id} running in the queue table")
        placed = head.job(job_id)["gpus"]
        assert len(placed) == 1
        uuid = placed[0]["uuid"]
        where = f"{placed[0]['node']}:{placed[0]['index']}"
        assert rows(pilot, "queue")[key][4] == where
        await until(pilot, lambda: key in rows(pilot, "gpus")[uuid][6].split(","),
                    what=f"job {job_id} in the jobs column of {where}")
        # Updated in place: same rows, no rebuild.
        assert set(rows(pilot, "gpus")) == gpu_rows_before

        queue = table(pilot, "queue")
        queue.focus()
        queue.move_cursor(row=queue.get_row_index(key))
        await pilot.pause()
        await pilot.press("c")
        await until(pilot, lambda: key not in rows(pilot, "queue"),
                    what=f"job {job_id} to leave the queue")
        assert head.wait_job(job_id)["state"] == "cancelled"
        await until(pilot, lambda: key not in rows(pilot, "gpus")[uuid][6].split(","),
                    what=f"job {job_id} to leave the GPU table")


async def test_cancel_refused_is_a_notification(head):
    app = make_app(head.home / "nebula.sock")
    async with app.run_test(size=(120, 40), notifications=True) as pilot:
        await until(pilot, lambda: len(rows(pilot, "gpus")) == 9, what="9 GPU rows")
        # An empty queue: c says there is nothing to cancel.
        await until(pilot, lambda: not rows(pilot, "queue"), what="empty queue")
        await pilot.press("c")
        await until(pilot, lambda: any("queue is empty" in str(t.render())
                                       for t in app.screen.query("Toast")), what="warning toast")
        # The service refuses (no such job): its reason shows as a notification.
        app.screen.cancel(999_999)
        await until(pilot, lambda: any("no job 999999" in str(t.render())
                                       for t in app.screen.query("Toast")), what="refusal toast")
        assert app.is_running


async def test_small_terminal_and_help(head):
    app = make_app(head.home / "nebula.sock")
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: len(rows(pilot, "gpus")) == 9, what="9 GPU rows")
        await pilot.pause()
        text = overview(pilot)
        assert "Cluster Overview:" in text and "GPUs: 9 (" in text
        ov = app.screen.query_one("#overview")
        assert ov.region.width <= 80 and ov.region.height >= 5
        for ident in ("gpus", "queue"):
            assert table(pilot, ident).region.height >= 3, ident
        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen), what="help")
        help_text = str(app.screen.query_one("#help-keys", Static).content)
        for word in ("Quit", "Cancel job", "Reconnect", "Help"):
            assert word in help_text
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, HelpScreen), what="help closed")
        await pilot.press("q")
        await until(pilot, lambda: not app.is_running, what="quit")


async def test_reconnects_after_stream_breaks(tmp_path):
    """No service at the socket: the TUI says so and keeps retrying instead of crashing."""
    app = make_app(tmp_path / "nope.sock")
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.sub_title.startswith("disconnected — retrying"),
                    what="disconnected banner")
        banner = app.screen.query_one("#connection", Static)
        assert banner.has_class("lost") and banner.display


async def test_stream_break_then_reconnect(head, jobs):
    """The head goes away under a running TUI and comes back: the TUI says so, then resumes.
    (Last in the module: it restarts the module's head service.)"""
    app = make_app(head.home / "nebula.sock")
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: len(rows(pilot, "gpus")) == 9, what="9 GPU rows")
        head.stop()
        await until(pilot, lambda: app.sub_title.startswith("disconnected — retrying"),
                    what="disconnected")
        head.start()
        await until(pilot, lambda: app.sub_title == "connected", timeout=60, what="reconnected")
        job_id = submit(head, "--gpu-mem", "6G", "--", "sleep", "30")
        jobs.append(job_id)
        await until(pilot, lambda: str(job_id) in rows(pilot, "queue"), what="job after reconnect")
        assert len(rows(pilot, "gpus")) == 9
