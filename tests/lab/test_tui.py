"""The TUI's first screen against a real head service on the simulated lab (Pilot).

Assertions are on what is on screen: the overview text, the node cards, the events ticker
and the queue table. The other screens are in ``test_tui_screens.py``; what needs no node's
real run (a refusal, no head at all) is ``tests/tui/test_first_screen.py``.
"""

from __future__ import annotations

import re

import pytest
from support.tui import until
from textual.pilot import Pilot
from textual.widgets import Static

from nebula_tui.screens.app import HelpScreen, make_app
from nebula_tui.screens.widgets.dialogs import ChoiceScreen
from nebula_tui.screens.gpus import GpusScreen
from nebula_tui.screens.widgets.nodecards import NodeCards
from nebula_tui.screens.widgets.rowtable import RowTable
from support.head import submit

EXPECTED_MODELS = {
    "node01": ["RTX 4090", "RTX 4090", "RTX 4060 Laptop"],
    "node02": ["A100-SXM4-80GB"] * 4,
    "node03": ["RTX 3090", "RTX 3090"],
}


def table(pilot: Pilot, ident: str) -> RowTable:
    return pilot.app.screen.query_one(f"#{ident}", RowTable)


def summary(pilot: Pilot) -> str:
    return str(pilot.app.screen.query_one("#summary", Static).content)


def bar(pilot: Pilot) -> str:
    """The screen bar: the five screens and the cluster's reachability."""
    return " ".join(str(w.content) for w in pilot.app.screen.query("ScreenBar Static"))


def static_text(pilot: Pilot, selector: str) -> str:
    return "\n".join(str(w.content) for w in pilot.app.screen.query(selector))


def card_texts(pilot: Pilot) -> list[str]:
    """Every node card's text, in order ([] before the overview mounts)."""
    found = pilot.app.screen.query("#cards")
    return found.first(NodeCards).texts() if found else []


def cards(pilot: Pilot) -> str:
    return "\n".join(card_texts(pilot))


def gpu_count(pilot: Pilot) -> int:
    return len(pilot.app.cluster.gpus)


def rows(pilot: Pilot, ident: str) -> dict[str, list[str]]:
    """The table's rows as text, keyed by row key (GPU uuid / job id)."""
    t = table(pilot, ident)
    return {key: [str(c) for c in t.get_row(key)] for key in t.row_keys}


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


async def test_overview_summary_cards_and_ticker(head):
    app = make_app(head.home / "nebula.sock", cluster_name="lab")
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: gpu_count(pilot) == 9 and "node03" in cards(pilot),
                    what="9 GPUs and a card for each node")
        # R1's numbers in one line, and the bar: where we are, whether the nodes answer.
        await until(pilot, lambda: "3/3 nodes up" in bar(pilot), what="every node up in the bar")
        assert re.search(r"3 nodes · 9 GPUs: \d+ idle, \d+ busy", summary(pilot))
        assert "of 424 GB free" in summary(pilot)
        assert "NebulaGrid · lab" in bar(pilot) and "1 Overview" in bar(pilot)
        assert "lab" in app.title and app.sub_title == "connected"
        # One card per node, one line per GPU in index order, with its memory.
        shown = cards(pilot)
        for node, models in EXPECTED_MODELS.items():
            assert re.search(rf"^{node}  up", shown, re.M), node
        card_lines = [card.splitlines() for card in card_texts(pilot)]
        assert [lines[0].split()[0] for lines in card_lines] == sorted(EXPECTED_MODELS)
        by_title = {lines[0].split()[0]: lines[1:] for lines in card_lines}
        assert {n: [l.split(None, 1)[1][:15].strip() for l in lines]
                for n, lines in by_title.items()} == EXPECTED_MODELS
        assert "0 MB / 80 GB" in shown or "/ 80 GB" in shown
        assert "°C" in shown
        # The ticker starts from the head's events log (the nodes coming up).
        await until(pilot, lambda: re.search(r"node0\d is up", static_text(pilot, "#ticker")),
                    what="the nodes coming up in the ticker")


async def test_job_appears_and_cancel_removes_it(head, jobs):
    app = make_app(head.home / "nebula.sock")
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: gpu_count(pilot) == 9 and "node03" in cards(pilot),
                    what="9 GPUs")
        job_id = submit(head, "--gpu-mem", "6G", "--", "sleep", "30")
        jobs.append(job_id)
        key = str(job_id)

        await until(pilot, lambda: rows(pilot, "queue").get(key, [None] * 4)[3] == "running",
                    what=f"job {job_id} running in the queue table")
        placed = head.job(job_id)["gpus"]
        assert len(placed) == 1
        where = f"{placed[0]['node']}:{placed[0]['index']}"
        assert rows(pilot, "queue")[key][4] == where
        await until(pilot, lambda: f":{job_id}" in cards(pilot),
                    what=f"job {job_id} (user:job) on its node's card")
        await until(pilot, lambda: f"job {job_id}" in static_text(pilot, "#ticker"),
                    what="the job in the events ticker")

        queue = table(pilot, "queue")
        queue.focus()
        queue.move_cursor(row=queue.get_row_index(key))
        await pilot.pause()
        await pilot.press("c")  # asks first, naming the job
        await until(pilot, lambda: isinstance(app.screen, ChoiceScreen), what="the question")
        assert f"Cancel job {job_id}?" in static_text(pilot, "#dialog-title")
        await pilot.press("y")
        await until(pilot, lambda: key not in rows(pilot, "queue"),
                    what=f"job {job_id} to leave the queue")
        assert head.wait_job(job_id)["state"] == "cancelled"
        await until(pilot, lambda: f":{job_id}" not in cards(pilot),
                    what=f"job {job_id} to leave its card")


async def test_small_terminal_and_help(head):
    app = make_app(head.home / "nebula.sock")
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: gpu_count(pilot) == 9 and "node03" in cards(pilot),
                    what="9 GPUs")
        await pilot.pause()
        assert "9 GPUs:" in summary(pilot)
        line = app.screen.query_one("#summary")
        # whole, on two lines if need be (it was cut after "0 running, 0")
        assert line.region.width <= 80 and line.region.height <= 2 and "waiting" in summary(pilot)
        # Every node's card fits: three nodes of 3, 4 and 2 GPUs on 24 lines.
        assert app.screen.query_one("#cards").region.height >= 3 + 3 + 4 + 2
        assert app.screen.query_one("#ticker").region.height == 1  # the newest event, one line
        for ident in ("cards", "queue"):
            region = app.screen.query_one(f"#{ident}").region
            assert region.height >= 3 and region.right <= 80, ident
        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen), what="help")
        help_text = str(app.screen.query_one("#help-keys", Static).content)
        for word in ("Quit", "Cancel job", "Reconnect", "Help", "GPUs", "Submit a job"):
            assert word in help_text
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, HelpScreen), what="help closed")
        await pilot.press("q")
        await until(pilot, lambda: not app.is_running, what="quit")


@pytest.mark.slow
async def test_a_stopped_head_is_a_lost_connection_not_a_frozen_tui(head, monkeypatch):
    """A head stopped with SIGSTOP accepts the connection but answers nothing: the TUI
    gives up on the snapshot after NEBULA_TIMEOUT, says so, and connects once it is
    continued; stopped under a connected TUI, the stream's silence past a heartbeat (the
    head ticks when it has nothing to say) tells the same."""
    import os
    import signal

    monkeypatch.setenv("NEBULA_TIMEOUT", "2")
    os.kill(head.process.pid, signal.SIGSTOP)
    try:
        app = make_app(head.home / "nebula.sock")
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: app.sub_title.startswith("disconnected — retrying"),
                        what="disconnected banner")
            os.kill(head.process.pid, signal.SIGCONT)
            await until(pilot, lambda: app.sub_title == "connected", timeout=60, what="connected")
            # stopped again under a connected TUI: the stream's silence past a heartbeat tells
            os.kill(head.process.pid, signal.SIGSTOP)
            await until(pilot, lambda: app.sub_title.startswith("disconnected — retrying"),
                        timeout=60, what="disconnected once the head stopped")
            os.kill(head.process.pid, signal.SIGCONT)
            await until(pilot, lambda: app.sub_title == "connected", timeout=60, what="connected again")
    finally:
        os.kill(head.process.pid, signal.SIGCONT)


async def test_stream_break_then_reconnect(head, jobs):
    """The head goes away under a running TUI and comes back: the TUI says so, then resumes.
    (Last in the module: it restarts the module's head service.)"""
    app = make_app(head.home / "nebula.sock")
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: gpu_count(pilot) == 9, what="9 GPUs")
        await pilot.press("2")  # the GPU screen follows the stream as well
        await until(pilot, lambda: isinstance(app.screen, GpusScreen), what="GPU screen")
        head.stop()
        await until(pilot, lambda: app.sub_title.startswith("disconnected — retrying"),
                    what="disconnected")
        head.start()
        await until(pilot, lambda: app.sub_title == "connected", timeout=60, what="reconnected")
        job_id = submit(head, "--gpu-mem", "6G", "--", "sleep", "30")
        jobs.append(job_id)
        await until(pilot, lambda: any(f":{job_id}" in cells[-1]
                                       for cells in rows(pilot, "gpu-table").values()),
                    what="job after reconnect on the GPU screen")
        assert len(rows(pilot, "gpu-table")) == 9
        banner = app.screen.query_one("#connection", Static)
        assert not banner.has_class("lost")
