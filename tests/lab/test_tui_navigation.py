"""Finding one's way and not losing work, against a real head on the simulated lab (Pilot).

Each test presses keys as a user would: questions that appear before anything is
cancelled, drained or removed (and can be refused), the ``:`` command line, ``1``–``5`` from
a detail page, the queue's active / all toggle, the same filter and sort keys on every
table, the palette's entries from other screens, the remembered theme, the screenshot key,
and keys typed quickly after Tab.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from support.head import has_op
from support.tui import palette_pick, until
from textual import events
from textual.pilot import Pilot
from textual.widgets import Input

from nebula_tui.api import ApiError
from nebula_tui.screens.app import make_app
from nebula_tui.screens.base import FilterBox
from nebula_tui.screens.commandline import CommandLine
from nebula_tui.screens.widgets.dialogs import ChoiceScreen
from nebula_tui.screens.gpus import GpuDetailScreen, GpusScreen
from nebula_tui.screens.job import JobScreen
from nebula_tui.screens.nodes import DrainPrompt, NodesScreen
from nebula_tui.screens.overview import OverviewScreen
from nebula_tui.screens.queue import QueueScreen
from nebula_tui.screens.widgets.rowtable import RowTable
from nebula_tui.screens.submit import SubmitScreen
from nebula_tui.screens.users import UsersScreen
from support.head import submit

SIZE = (140, 44)


@pytest.fixture(scope="module")
def lab_jobs(head):
    """A running job, a waiting one and an ended one, shared by the module's tests."""
    runner = submit(head, "--name", "nav-runner", "--gpu-mem", "6G", "--", "sleep", "600")
    # It waits for the runner (a request no card here could serve would be refused at submit).
    waiter = submit(head, "--name", "nav-waiter", "--after", str(runner), "--", "true")
    ended = submit(head, "--name", "nav-ended", "--gpu-mem", "4G", "--", "true")
    head.wait_job(ended)
    yield {"runner": runner, "waiter": waiter, "ended": ended}
    for job_id in (runner, waiter):
        try:
            head.call("cancel", job=job_id)
        except ApiError:
            pass
    # Ended before the head goes: a head stopped mid-cancel leaves its job running on the
    # session's shared lab, holding a card the next module counts as free.
    for job_id in (runner, waiter):
        head.wait_job(job_id, 60)


async def started(pilot: Pilot, lab_jobs: dict) -> None:
    app = pilot.app
    await until(pilot, lambda: len(app.cluster.gpus) == 9
                and (app.cluster.jobs.get(lab_jobs["runner"]) or {}).get("state") == "running"
                and app.user, what="the snapshot with the runner running")


async def go(pilot: Pilot, key: str, screen_type) -> None:
    await pilot.press(key)
    await until(pilot, lambda: isinstance(pilot.app.screen, screen_type) and pilot.app.screen.is_mounted,
                what=screen_type.__name__)
    await pilot.pause()


def text(pilot: Pilot, selector: str) -> str:
    return "\n".join(str(w.content) for w in pilot.app.screen.query(selector))


def table(pilot: Pilot, ident: str) -> RowTable:
    return pilot.app.screen.query_one(f"#{ident}", RowTable)


async def command(pilot: Pilot, line: str) -> None:
    await pilot.press("colon")
    await until(pilot, lambda: isinstance(pilot.app.screen, CommandLine), what="the command line")
    await pilot.press(*line, "enter")


# ============================================================================ asking first
@pytest.mark.slow
async def test_cancel_drain_and_remove_ask_first_and_can_be_refused(head, lab_jobs):
    runner = lab_jobs["runner"]
    app = make_app(head.socket)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, lab_jobs)
        await go(pilot, "3", QueueScreen)
        queue = table(pilot, "queue-table")
        await until(pilot, lambda: str(runner) in queue.row_keys, what="the runner in the queue")
        queue.move_to_key(str(runner))
        for refuse in ("n", "escape"):
            await pilot.press("c")
            await until(pilot, lambda: isinstance(app.screen, ChoiceScreen), what="the question")
            body = text(pilot, "#dialog-body")
            assert f"Cancel job {runner}?" in text(pilot, "#dialog-title")
            assert "“nav-runner”" in body and f"of {app.user}" in body and "running for" in body
            await pilot.press(refuse)
            await until(pilot, lambda: isinstance(app.screen, QueueScreen), what="the question gone")
        await pilot.press("enter", "c")  # on the job page too: enter opens it, c asks
        await until(pilot, lambda: isinstance(app.screen, ChoiceScreen), what="asked on the job page")
        await pilot.press("enter")  # the focus is on "Keep it": habit cancels nothing
        await until(pilot, lambda: isinstance(app.screen, JobScreen), what="back on the job page")
        assert head.job(runner)["state"] == "running"

        node = head.job(runner)["gpus"][0]["node"]
        await command(pilot, f"drain {node}")
        await until(pilot, lambda: isinstance(app.screen, DrainPrompt), what="the drain question")
        assert f"Drain {node}?" in text(pilot, "#prompt-question")
        assert f"job {runner} “nav-runner”" in text(pilot, "#prompt-body")  # its running jobs
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, DrainPrompt), what="refused")

        await go(pilot, "5", NodesScreen)
        nodes = table(pilot, "nodes-table")
        await until(pilot, lambda: node in nodes.row_keys, what="the node's row")
        nodes.move_to_key(node)
        await pilot.press("x")
        await until(pilot, lambda: isinstance(app.screen, ChoiceScreen), what="the remove question")
        assert f"Remove {node}?" in text(pilot, "#dialog-title")
        assert "nav-runner" in text(pilot, "#dialog-body")
        await pilot.press("n")
        await until(pilot, lambda: isinstance(app.screen, NodesScreen), what="refused")
        states = {n["name"]: n["state"] for n in head.call("status")["nodes"]}
        assert states[node] == "up" and head.job(runner)["state"] == "running"


# ============================================================================ getting around
async def test_the_command_line_goes_anywhere(head, lab_jobs):
    app = make_app(head.socket)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, lab_jobs)
        await command(pilot, f"job {lab_jobs['ended']}")  # an ended job, loaded from the head
        await until(pilot, lambda: isinstance(app.screen, JobScreen)
                    and app.screen.job_id == lab_jobs["ended"], what="the job page")
        await until(pilot, lambda: "succeeded" in text(pilot, "#job-spec"), what="how it ended")
        await until(pilot, lambda: "exit code 0" in "\n".join(app.screen.query_one("#job-log").lines),
                    what="the log's end line")
        await command(pilot, "gpu node02:1")  # replaces the job page
        await until(pilot, lambda: isinstance(app.screen, GpuDetailScreen), what="the GPU page")
        assert "GPU node02:1" in app.screen.query_one("#gpu-descriptor").border_title
        assert len(app.screen_stack) == 2 and "GPU node02:1" in text(pilot, "ScreenBar Static")
        await command(pilot, f"user {app.user}")
        await until(pilot, lambda: isinstance(app.screen, UsersScreen), what="the users screen")
        await until(pilot, lambda: table(pilot, "users-table").cursor_key == app.user,
                    what="the cursor on our user")
        await until(pilot, lambda: str(lab_jobs["runner"]) in table(pilot, "user-jobs").row_keys,
                    what="our jobs beside")
        await command(pilot, "jbo 7")  # a mistake is said at once, the line stays
        await until(pilot, lambda: "no command 'jbo'" in text(pilot, "#command-error"), what="the error")
        assert isinstance(app.screen, CommandLine)
        await pilot.press("escape")
        await until(pilot, lambda: isinstance(app.screen, UsersScreen), what="closed")
        await command(pilot, "history")
        await until(pilot, lambda: isinstance(app.screen, QueueScreen) and app.screen.all_jobs,
                    what="the queue with ended jobs")


@pytest.mark.slow
async def test_screen_keys_work_from_a_job_page_and_pages_replace_each_other(head, lab_jobs):
    runner = str(lab_jobs["runner"])
    app = make_app(head.socket)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, lab_jobs)
        await go(pilot, "3", QueueScreen)
        await until(pilot, lambda: runner in table(pilot, "queue-table").row_keys, what="the runner")
        table(pilot, "queue-table").move_to_key(runner)
        await go(pilot, "enter", JobScreen)
        assert "› Job" in text(pilot, "ScreenBar Static")  # the bar says where we are
        await go(pilot, "3", QueueScreen)  # the key of the screen the page is on: its list
        await go(pilot, "enter", JobScreen)
        await go(pilot, "1", OverviewScreen)  # another screen's key: that screen, no page left
        await go(pilot, "3", QueueScreen)
        assert len(app.screen_stack) == 1
        await go(pilot, "enter", JobScreen)
        await go(pilot, "n", SubmitScreen)  # the form replaces the job page
        assert len(app.screen_stack) == 2
        await go(pilot, "escape", QueueScreen)  # and Esc goes straight back
        assert len(app.screen_stack) == 1
        await go(pilot, "2", GpusScreen)
        await go(pilot, "enter", GpuDetailScreen)
        await go(pilot, "5", NodesScreen)
        await go(pilot, "2", GpusScreen)


async def test_queue_toggles_between_active_and_all_jobs(head, lab_jobs):
    """a: the ended jobs too, with exit code and run time (from the head's history when it
    keeps one; a job seen ending meanwhile either way), and back."""
    app = make_app(head.socket)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, lab_jobs)
        await go(pilot, "3", QueueScreen)
        queue = table(pilot, "queue-table")
        await until(pilot, lambda: str(lab_jobs["runner"]) in queue.row_keys, what="the queue")
        quick = submit(head, "--name", "nav-quick", "--gpu-mem", "4G", "--", "sh", "-c", "exit 3")
        await until(pilot, lambda: (app.cluster.job(quick) or {}).get("state") == "failed",
                    what="the quick job ending")
        await until(pilot, lambda: str(quick) not in queue.row_keys, what="it left the active queue")
        assert "exit" not in queue.shown_columns
        await pilot.press("a")
        await until(pilot, lambda: str(quick) in queue.row_keys, what="the ended job")
        assert queue.border_title.startswith("All jobs") and "exit" in queue.shown_columns
        cells = [str(c) for c in queue.get_row(str(quick))]
        assert cells[3] == "failed" and cells[7] == "3" and re.match(r"\d+s", cells[6])
        assert "ended" in text(pilot, "#queue-summary")
        queue.move_to_key(str(quick))
        await until(pilot, lambda: "exit code 3" in text(pilot, "#queue-detail"), what="how it ended")
        if has_op(head, "job_history"):  # ended before the TUI started: from the head
            await until(pilot, lambda: str(lab_jobs["ended"]) in queue.row_keys, what="older jobs")
        else:
            assert "keeps no history" in text(pilot, "#queue-summary")
        await pilot.press("a")
        await until(pilot, lambda: str(quick) not in queue.row_keys, what="active jobs only again")


#: Every table of the main screens and the GPU page: (key to its screen, screen, table,
#: a word that picks some of its rows).
TABLES = (
    ("1", OverviewScreen, "queue", "nav-runner"),
    ("2", GpusScreen, "gpu-table", "node03"),
    ("3", QueueScreen, "queue-table", "nav-waiter"),
    ("4", UsersScreen, "users-table", None),  # our own name
    ("4", UsersScreen, "user-jobs", "nav-runner"),
    ("5", NodesScreen, "nodes-table", "node02"),
    ("5", NodesScreen, "events-table", "node01"),
)


async def filter_and_sort(pilot: Pilot, ident: str, needle: str) -> None:
    """``/`` filters this table to the rows holding ``needle`` (said in its title), enter
    keeps the filter, esc clears it; ``s`` sorts by a column, ``S`` reverses it."""
    app = pilot.app
    t = table(pilot, ident)
    await until(pilot, lambda: t.row_count > 0, what=f"rows in {ident}")
    t.focus()
    await pilot.pause()
    total = t.row_count
    await pilot.press("slash")
    await until(pilot, lambda: isinstance(app.focused, FilterBox), what=f"{ident}'s filter box")
    await pilot.press(*needle)
    await until(pilot, lambda: f"filter “{needle}”" in (t.border_title or ""), what=f"{ident} filtered")
    assert 0 < t.row_count <= total
    for key in t.row_keys:
        assert needle.lower() in " ".join(str(c) for c in t.get_row(key)).lower(), (ident, key)
    await pilot.press("enter")
    assert app.focused is t and t.needle == needle
    await pilot.press("escape")
    await until(pilot, lambda: not t.needle and "filter" not in (t.border_title or ""),
                what=f"{ident}'s filter cleared")
    await pilot.press("s")
    await until(pilot, lambda: t.sort_label[-1:] in ("▲", "▼") and f"by {t.sort_label}" in t.border_title,
                what=f"{ident} sorted by a column")
    arrow = t.sort_label[-1]
    await pilot.press("S")
    await until(pilot, lambda: t.sort_label[-1] != arrow, what=f"{ident} reversed")


@pytest.mark.slow
async def test_filter_and_sort_work_the_same_on_every_table(head, lab_jobs):
    app = make_app(head.socket)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, lab_jobs)
        for key, screen, ident, needle in TABLES:
            await go(pilot, key, screen)
            await filter_and_sort(pilot, ident, needle or app.user)
        # The GPU page's tables too: the slices and the processes of the runner's card.
        uuid = app.cluster.jobs[lab_jobs["runner"]]["gpus"][0]["uuid"]
        app.open_gpu(uuid)
        await until(pilot, lambda: isinstance(app.screen, GpuDetailScreen)
                    and app.screen.query("#gpu-procs"), what="the GPU page")
        await filter_and_sort(pilot, "gpu-slices", str(lab_jobs["runner"]))
        await until(pilot, lambda: table(pilot, "gpu-procs").row_count, what="the runner's process")
        await filter_and_sort(pilot, "gpu-procs", "sleep")


async def test_vi_keys_move_like_the_arrows(head, lab_jobs):
    app = make_app(head.socket)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, lab_jobs)
        await go(pilot, "2", GpusScreen)
        gpus = table(pilot, "gpu-table")
        await until(pilot, lambda: gpus.row_count == 9, what="9 rows")
        await pilot.press("G")
        assert gpus.cursor_row == 8
        await pilot.press("k", "k")
        assert gpus.cursor_row == 6
        await pilot.press("g", "j")
        assert gpus.cursor_row == 1


async def test_the_palette_offers_other_screens_actions(head, lab_jobs):
    app = make_app(head.socket)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, lab_jobs)
        await go(pilot, "3", QueueScreen)
        await palette_pick(pilot, "drain node", "Nodes: Drain node")
        await until(pilot, lambda: isinstance(app.screen, DrainPrompt), what="drain, from the Queue")
        assert app.current_mode == "nodes"
        await pilot.press("escape")


# ============================================================================ the rest
async def test_the_theme_is_remembered(head, lab_jobs, tmp_path):
    app = make_app(head.socket, home=tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, lab_jobs)
        dark = app.current_theme.dark
        await pilot.press("t")
        await until(pilot, lambda: app.current_theme.dark != dark, what="the other theme")
        chosen = app.theme
    assert json.loads((tmp_path / "tui.json").read_text())["theme"] == chosen
    again = make_app(head.socket, home=tmp_path)
    async with again.run_test(size=SIZE) as pilot:
        assert again.theme == chosen


async def test_the_screenshot_key_saves_an_ascii_name_in_the_home_and_says_where(head, lab_jobs, tmp_path,
                                                                                  monkeypatch):
    """`P` saved "NebulaGrid_—_simlab_….svg" (an em dash) into the current directory."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    app = make_app(head.socket, home=tmp_path / "nebula-home")
    folder = tmp_path / "nebula-home" / "screenshots"
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await started(pilot, lab_jobs)
        await pilot.press("P")
        saved = await until(pilot, lambda: next(folder.glob("*.svg"), None), what="the screenshot in the home")
        await until(pilot, lambda: any(str(saved) in str(n.message) for n in app._notifications),
                    what="a notice saying where")
    assert saved.name.isascii() and " " not in saved.name and not list(work.iterdir())
    assert "nav-runner" in saved.read_text().replace("&#160;", " ")


async def test_keys_typed_right_after_tab_land_in_the_next_field(head, lab_jobs):
    """Tab moves the focus as it arrives: what follows it, however fast, lands after it."""
    app = make_app(head.socket)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, lab_jobs)
        await go(pilot, "n", SubmitScreen)
        for key in ("t", "r", "tab", "2", "tab", "8", "G"):
            app.post_message(events.Key(key, key if len(key) == 1 else None))
        form = app.screen
        await until(pilot, lambda: form.query_one("#f-gpu_mem", Input).value == "8G", what="typing")
        assert form.query_one("#f-name", Input).value == "tr"
        assert form.query_one("#f-gpu_count", Input).value == "2"


def _helps(parser) -> list[str]:
    """The --help text of a parser and of every sub-command under it."""
    out = [parser.format_help()]
    for action in parser._actions:
        choices = getattr(action, "choices", None)
        for sub in (choices.values() if isinstance(choices, dict) else ()):
            out += _helps(sub)
    return out


def test_no_requirement_numbers_in_what_users_read():
    """--help, the keys' and commands' descriptions and the screens' titles never show
    R1…R33 (those belong in comments and issues)."""
    from nebula_tui import cli
    from nebula_tui.screens import commandline
    from nebula_tui.screens.widgets import keys

    shown = [k.description for group in vars(keys).values() if isinstance(group, tuple)
             for k in group if isinstance(k, keys.Key)]
    shown += [d for _, d in commandline.help_lines()]
    shown += _helps(cli.build_parser())
    for path in Path(__file__).resolve().parents[2].glob("nebula_tui/screens/*.py"):
        shown += [part for literal in re.findall(r'border_title = f?"([^"]*)"|Static\(Text\("([^"]*)"',
                                                 path.read_text()) for part in literal]
    for line in shown:
        assert not re.search(r"\bR\d{1,2}\b", line), line
