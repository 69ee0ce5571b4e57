"""Snapshots of every main screen at 80x24, 120x40 and 160x48, in the dark and the light
theme, and of the submit form and the help at each size.

Pixel snapshots (pytest-textual-snapshot, files in ``__snapshots__/``): each screen is drawn
from ``fixedhead.FixedHead`` (fixed data behind a real socket, read by the real client) at a
fixed clock in UTC, so a snapshot changes only when the screen's look does. After a change
of look that is meant, ``pytest tests/tui/test_tui_snapshots.py --snapshot-update`` writes the
new ones (look at the report first). With NEBULA_SAVE_SCREENSHOTS=1 the README's
screenshots (docs/screenshots/) are written too, from the same fixed lab.
"""

from __future__ import annotations

import html
import os
import re
import time
from pathlib import Path

import pytest
from support.tui import until
from support.fixedhead import NOW, FixedHead

from nebula_tui.screens import render
from nebula_tui.screens.app import make_app
from nebula_tui.screens.gpus import GpuDetailScreen, GpusScreen
from nebula_tui.screens.job import JobScreen
from nebula_tui.screens.nodes import NodesScreen
from nebula_tui.screens.overview import OverviewScreen
from nebula_tui.screens.queue import QueueScreen
from nebula_tui.screens.users import UsersScreen
from nebula_tui.screens.widgets.keys import help_lines

DOCS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
SIZES = [(80, 24), (120, 40), (160, 48)]
THEMES = ["textual-dark", "textual-light"]

#: Screen -> (key to reach it, its class, a word it shows once its data is drawn).
SCREENS = {
    "overview": ("1", OverviewScreen, "bert-finetune"),
    "gpus": ("2", GpusScreen, "node02:3"),
    "queue": ("3", QueueScreen, "tokenize"),
    "users": ("4", UsersScreen, "carol"),
    "nodes": ("5", NodesScreen, "isolated"),
}


@pytest.fixture
def fixed_head(tmp_path):
    """The fixed lab on a socket, the clock stopped at ``NOW``, times in UTC."""
    head = FixedHead(tmp_path / "fixed.sock").start()
    tz = os.environ.get("TZ")
    os.environ["TZ"] = "UTC"
    time.tzset()
    render.set_clock(lambda: NOW)
    try:
        yield head
    finally:
        render.set_clock(None)
        if tz is None:
            os.environ.pop("TZ", None)
        else:
            os.environ["TZ"] = tz
        time.tzset()
        head.stop()


def svg_text(svg: str) -> str:
    """The characters an SVG screenshot shows, tags dropped, one string."""
    return html.unescape(re.sub(r"<[^>]+>", "", svg)).replace("\xa0", " ")


async def settle(pilot) -> None:
    """Until two screenshots a moment apart agree (timers have drawn what they draw)."""
    before = None
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        await pilot.pause(0.4)
        now = pilot.app.export_screenshot()
        if now == before:
            return
        before = now
    raise AssertionError("the screen kept changing")


async def show(pilot, screen: str) -> None:
    app = pilot.app
    key, cls, word = SCREENS[screen]
    await until(pilot, lambda: len(app.cluster.gpus) == 9 and app.user, what="the fixed lab")
    await pilot.press(key)
    await until(pilot, lambda: isinstance(app.screen, cls)
                and word in svg_text(app.export_screenshot()), what=f"{screen} drawn")
    await settle(pilot)


@pytest.mark.parametrize("theme", THEMES, ids=["dark", "light"])
@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("screen", list(SCREENS))
def test_main_screen_snapshot(snap_compare, fixed_head, screen, size, theme):
    app = make_app(fixed_head.socket, cluster_name="gpulab")
    app.theme = theme

    async def run_before(pilot) -> None:
        await show(pilot, screen)

    assert snap_compare(app, terminal_size=size, run_before=run_before)


#: What must be readable on each screen at both sizes (the facts a newcomer looks for).
KEY_FACTS = {
    # the summary whole (it was cut after "0 running, 0"), the cluster's name (the title was
    # gone at 80 columns) and the newest event (the Events panel vanished)
    "overview": ["1 Overview", "2/3 reachable", "9 GPUs:", "node01", "free", "bert-finetune",
                 "3 running, 3 waiting", "gpulab", "node03 is unknown: missed 3 probes"],
    "gpus": ["node01:1", "Free", "Temp", "Status", "maintenance", "unreachable"],
    "queue": ["bert-finetune", "running", "pending", "held"],
    "users": ["carol", "GPU-hours", "Weight", "Efficiency", "Idle GPU-h", "91%", "905",
              "4140 of 4448 GPU-hours allocated (93%)", "cards 71% busy"],
    "nodes": ["node03", "unknown", "Events log"],
}


@pytest.mark.slow
@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
async def test_key_facts_fit_at_both_sizes_and_readme_screenshots(fixed_head, size, tmp_path):
    """Each screen shows what a newcomer looks for at 80x24 as at 160x48 (and the job and
    GPU pages); with NEBULA_SAVE_SCREENSHOTS=1 they become the README's screenshots."""
    width, height = size
    app = make_app(fixed_head.socket, cluster_name="gpulab")
    async with app.run_test(size=size) as pilot:
        for screen, words in KEY_FACTS.items():
            await show(pilot, screen)
            shown = svg_text(app.export_screenshot())
            for word in words:
                assert word in shown, (screen, size, word)
            keep(f"{screen}-{width}x{height}", app.export_screenshot())
        await pilot.press("3")
        app.open_job(12)
        await until(pilot, lambda: isinstance(app.screen, JobScreen)
                    and "loss" in svg_text(app.export_screenshot()), what="the job page")
        await settle(pilot)
        shown = svg_text(app.export_screenshot())
        assert "bert-finetune" in shown and "Environment" in shown and "Job 12" in shown
        keep(f"job-{width}x{height}", app.export_screenshot())
        uuid = next(g["uuid"] for g in app.cluster.gpus.values() if g["node"] == "node01" and g["index"] == 0)
        app.open_gpu(uuid)
        await until(pilot, lambda: isinstance(app.screen, GpuDetailScreen) and app.screen.samples,
                    what="the GPU page and its history")
        await settle(pilot)
        shown = svg_text(app.export_screenshot())
        assert "alice:12" in shown and "bob:14" in shown and "Fits" in shown
        keep(f"gpu-{width}x{height}", app.export_screenshot())


#: The dialogs, forms and pages: the screen and key that open each, a word it shows.
DIALOGS = {"submit": ("overview", "n", "Submit a job"),
           "help": ("overview", "question_mark", "Keys — Overview"),
           "cancel": ("overview", "c", "Cancel job 15?"),
           "command": ("overview", "colon", "tab completes"),
           "job": ("overview", "enter", "Log (following)"),
           "gpu": ("gpus", "enter", "Fits"),
           "drain": ("nodes", "d", "Drain node01?"),
           "remove": ("nodes", "x", "Remove node01?"),
           "add-node": ("nodes", "a", "Add a node")}

#: What each must show whole at every size (its question, its way out, its buttons).
DIALOG_FACTS = {
    "cancel": ["Cancel job 15?", "Its processes are stopped", "Cancel the job (y)", "Keep it (n)",
               "esc: do nothing"],
    "command": [":job ID", ":cancel ID", "esc closes"],
    "job": ["Job 15", "State", "running", "Command", "torchrun", "Environment", "State history",
            "Log (following)", "esc Back"],
    "gpu": ["node01:0", "RTX 4090", "Held by", "alice:12", "Fits"],
    "drain": ["Drain node01?", "job 12", "job 14", "enter drains", "Keep taking jobs", "Drain"],
    "remove": ["Remove node01?", "job 12", "job 14", "Remove the node (y)", "Keep it (n)"],
    "add-node": ["Add a node", "name, e.g. node05", "host, e.g. 10.0.0.15", "port (22)"],
}


async def open_dialog(pilot, dialog: str) -> None:
    app = pilot.app
    screen, key, word = DIALOGS[dialog]
    await show(pilot, screen)
    await pilot.press(key)
    await until(pilot, lambda: word in svg_text(app.export_screenshot()), what=f"{dialog} drawn")
    app.screen.set_focus(None)  # no blinking cursor in a picture
    await settle(pilot)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("dialog", list(DIALOGS))
def test_dialog_snapshot(snap_compare, fixed_head, dialog, size):
    app = make_app(fixed_head.socket, cluster_name="gpulab")

    async def run_before(pilot) -> None:
        await open_dialog(pilot, dialog)

    assert snap_compare(app, terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("dialog", list(DIALOG_FACTS))
async def test_each_dialog_and_page_shows_what_it_asks_whole(fixed_head, dialog, size):
    """Each dialog's question, its buttons and its way out are on screen at 80x24 as at
    160x48; the job page's top (its spec beside its environment) scrolls with a bar where
    the terminal is short (it was cut off below Allocation with nothing to say so)."""
    app = make_app(fixed_head.socket, cluster_name="gpulab")
    async with app.run_test(size=size) as pilot:
        await open_dialog(pilot, dialog)
        shown = " ".join(svg_text(app.export_screenshot()).split())
        for words in DIALOG_FACTS[dialog]:
            assert words in shown, (dialog, size, words)
        if dialog == "job":
            top = app.screen.query_one("#job-top")
            assert top.max_scroll_y == 0 or top.scrollbars_enabled[0], (size, top.max_scroll_y)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
async def test_the_submit_form_and_the_help_fit(fixed_head, size):
    """At 80x24 Preemptible and Submit lay below the fold with no cue, the Booking hint and
    (even at 120x40) the Preemptible label were cut; the help listed ⏎ twice."""
    app = make_app(fixed_head.socket, cluster_name="gpulab")
    async with app.run_test(size=size) as pilot:
        await show(pilot, "overview")
        await pilot.press("question_mark")
        await until(pilot, lambda: "Keys — Overview" in svg_text(app.export_screenshot()), what="the help")
        assert [line for line, _ in help_lines(app.screen.key_rows)].count("⏎") == 1
        await pilot.press("escape")
        await pilot.press("n")
        await until(pilot, lambda: "Submit a job" in svg_text(app.export_screenshot()), what="the form")
        await settle(pilot)
        shown = svg_text(app.export_screenshot())
        assert "(nebula reservations)" in shown
        form = app.screen.query_one("#submit-form")
        below = form.max_scroll_y > 0
        assert ("more below" in shown) == below, (size, shown)
        form.scroll_end(animate=False)
        await settle(pilot)
        shown = svg_text(app.export_screenshot())
        assert "Preemptible (--preemptible)" in shown and "when a normal job needs them" in shown
        assert "Submit (ctrl+s)" in shown and "more below" not in shown


def keep(name: str, svg: str) -> None:
    if os.environ.get("NEBULA_SAVE_SCREENSHOTS") == "1":
        DOCS.mkdir(parents=True, exist_ok=True)
        (DOCS / f"{name}.svg").write_text(svg)


def _style_of(table, key: str, column: str, app) -> str:
    """The colour a table cell is painted in (its first styled segment)."""
    cell = table.get_row(key)[table.column_keys.index(column)]
    segments = table._segments(cell, cell.cell_len)
    return str(next(s.style.color.name for s in segments if s.style and s.style.color))


@pytest.mark.parametrize("theme", THEMES, ids=["dark", "light"])
async def test_one_colour_per_meaning_on_every_screen(fixed_head, theme):
    """A state is one colour wherever it shows, and 78 °C is hot (the health policy's
    hot_c) on the GPU table as on the overview's card; maintenance and unreachable are
    drawn in the warning colour."""
    from nebula_tui.screens.look import LOOK
    from nebula_tui.screens.widgets.rowtable import RowTable

    app = make_app(fixed_head.socket, cluster_name="gpulab")
    app.theme = theme
    async with app.run_test(size=(160, 48)) as pilot:
        await show(pilot, "overview")
        role = lambda name: LOOK.styles[name].split()[-1].lower()  # noqa: E731
        queue = app.screen.query_one("#queue", RowTable)
        assert _style_of(queue, "12", "state", app) == role("ok")  # running
        assert _style_of(queue, "16", "state", app) == role("warn")  # pending
        card = app.screen.query_one("#cards").card_text("node02")
        hot = next(s for s in card.spans if card.plain[s.start:s.end] == "78°C")
        assert str(hot.style).split()[-1].lower() == role("bad")
        await show(pilot, "gpus")
        gpus = app.screen.query_one("#gpu-table", RowTable)
        by_label = {str(gpus.get_row(k)[0]): k for k in gpus.row_keys}
        assert _style_of(gpus, by_label["node02:0"], "temp", app) == role("bad")
        assert _style_of(gpus, by_label["node02:3"], "status", app) == role("warn")
        assert _style_of(gpus, by_label["node03:0"], "status", app) == role("warn")
        assert _style_of(gpus, by_label["node01:1"], "status", app) == role("ok")  # a free card
        await show(pilot, "queue")
        jobs = app.screen.query_one("#queue-table", RowTable)
        assert _style_of(jobs, "12", "state", app) == role("ok")
        assert _style_of(jobs, "16", "state", app) == role("warn")


@pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=lambda s: f"{s[0]}x{s[1]}")
async def test_the_overview_shows_a_waiting_jobs_whole_reason(fixed_head, size):
    """The Overview's queue cut a waiting job's reason at its edge ("needs 5 GPUs with
    ≥70 GB free on…") and only the job page said it whole: with the cursor on that job the
    reason reads whole under the queue; on a running job nothing is added."""
    app = make_app(fixed_head.socket, cluster_name="gpulab")
    reason = "needs 5 GPUs with ≥70 GB free on one node; the largest node has 4 such GPUs"
    async with app.run_test(size=size) as pilot:
        await show(pilot, "overview")
        queue = app.screen.query_one("#queue")
        detail = app.screen.query_one("#overview-detail")
        assert queue.cursor_key == "15" and not detail.display  # running: nothing added
        while queue.cursor_key != "16":
            await pilot.press("down")
        await settle(pilot)
        shown = " ".join(svg_text(app.export_screenshot()).split())
        assert reason in shown, (size, shown)
        assert detail.display and detail.region.height >= 1
        await pilot.press("up")
        await settle(pilot)
        assert not detail.display


async def test_the_nodes_screen_says_a_cut_reason_and_event_whole(fixed_head):
    """At 80x24 the Nodes screen cut a node's reason and an event at the table's edge
    (a lost card's "GPU 0 (00000000:02:00.0): GPU…"), with no way to read them: the cursor
    row of the table in focus is said whole under the tables."""
    reason = "GPU 0 (00000000:02:00.0): GPU is lost, reboot the node to bring it back"
    event = ("node01:0 in maintenance: Xid 79 (GPU fell off the bus) and a failed self-test; "
             "its jobs were requeued")
    data = fixed_head.data
    data["snapshot"]["nodes"][0] = {**data["snapshot"]["nodes"][0], "reason": reason}
    for log in (data["events"], data["snapshot"]["events"]):
        log.append({"t": NOW - 10, "kind": "health", "message": event, "job_id": None})
    app = make_app(fixed_head.socket, cluster_name="gpulab")
    async with app.run_test(size=(80, 24)) as pilot:
        await show(pilot, "nodes")
        detail = app.screen.query_one("#nodes-detail")
        await until(pilot, lambda: reason in " ".join(svg_text(app.export_screenshot()).split()),
                    what="node01's whole reason")
        await pilot.press("down")  # node02: no reason, nothing said
        await until(pilot, lambda: not detail.display, what="the line gone")
        await pilot.press("tab")  # the events log, newest first
        await until(pilot, lambda: event in " ".join(svg_text(app.export_screenshot()).split()),
                    what="the newest event whole")
