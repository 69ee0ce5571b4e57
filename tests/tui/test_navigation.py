"""Finding one's way and not losing work, driven with Pilot against a real head in the test's
own loop (``inprocess``: the ``Engine`` and its ``ApiServer`` on a real socket; the nodes'
reports are the nodelet's messages, fed directly).

Each test presses keys as a user would: questions that appear before anything is cancelled,
drained or removed (and can be refused), ``1``–``5`` from a detail page, the queue's active /
all toggle, the vi keys, the palette's entries from other screens, the remembered theme,
the screenshot key, and keys typed quickly after Tab. What needs a job's real log or its
real processes (the ``:`` command line's job page, the GPU page's tables) stays on the lab:
``tests/lab/test_tui_navigation.py``.
"""

from __future__ import annotations

import getpass
import json
import re
from pathlib import Path

import pytest
from support.tui import command, go, palette_pick, table, text, until
from textual import events
from textual.pilot import Pilot
from textual.widgets import Input

from nebula_tui.model import JobSpec, JobState, NodeState, Placement, Running
from nebula_tui.screens.app import make_app
from nebula_tui.screens.gpus import GpuDetailScreen, GpusScreen
from nebula_tui.screens.job import JobScreen
from nebula_tui.screens.nodes import DrainPrompt, NodesScreen
from nebula_tui.screens.overview import OverviewScreen
from nebula_tui.screens.queue import QueueScreen
from nebula_tui.screens.submit import SubmitScreen
from nebula_tui.screens.widgets.dialogs import ChoiceScreen

ME = getpass.getuser()
SIZE = (140, 44)
GPUS = 4  # the in-process head's two nodes of two A100s each


def run(engine, job_id: int, node: str, mb: int) -> None:
    """Start a job on ``node``'s GPU 0 (a slice of ``mb``) as a pass and its node would."""
    engine.transitions.begin_launch(engine.jobs[job_id], (Placement(f"GPU-{node}-0", node, 0, mb, False),))
    engine.transitions.mark_running(engine.jobs[job_id])


def exit_with(engine, job_id: int, node: str, code: int) -> None:
    """The node's report that the job's command exited with ``code``."""
    engine.on_node_message(node, {"type": "exit", "job": job_id, "code": code,
                                  "token": engine.state.token(engine.jobs[job_id])})


@pytest.fixture
async def nav(engine, served):
    """A running job, a waiting one and an ended one; and the head's socket."""
    runner = engine.submit(ME, JobSpec(command=("sleep", "600"), name="nav-runner", gpu_mem_mb=6144)).id
    run(engine, runner, "node01", 6144)
    # It waits for the runner (a request no card here could serve would be refused at submit).
    waiter = engine.submit(ME, JobSpec(command=("true",), name="nav-waiter", after=(runner,))).id
    ended = engine.submit(ME, JobSpec(command=("true",), name="nav-ended", gpu_mem_mb=4096)).id
    run(engine, ended, "node02", 4096)
    exit_with(engine, ended, "node02", 0)
    assert engine.state.store.job(ended).state == JobState.SUCCEEDED
    engine.scheduling.schedule_pass()
    return {"runner": runner, "waiter": waiter, "ended": ended, "socket": served}


async def started(pilot: Pilot, nav: dict) -> None:
    app = pilot.app
    await until(pilot, lambda: len(app.cluster.gpus) == GPUS
                and (app.cluster.jobs.get(nav["runner"]) or {}).get("state") == "running"
                and app.user, what="the snapshot with the runner running")


# ============================================================================ asking first
async def test_cancel_drain_and_remove_ask_first_and_can_be_refused(engine, nav):
    runner = nav["runner"]
    app = make_app(nav["socket"])
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, nav)
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
        assert isinstance(engine.jobs[runner].status, Running)  # not cancelling

        node = engine.jobs[runner].node
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
        view = engine.state.nodes.get(node)
        assert view is not None and view.state == NodeState.UP and not view.drained
        assert isinstance(engine.jobs[runner].status, Running)  # not cancelling


# ============================================================================ getting around
async def test_screen_keys_work_from_a_job_page_and_pages_replace_each_other(nav):
    runner = str(nav["runner"])
    app = make_app(nav["socket"])
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, nav)
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


async def test_queue_toggles_between_active_and_all_jobs(engine, nav):
    """a: the ended jobs too, with exit code and run time (from the head's history; a job
    seen ending meanwhile either way), and back."""
    app = make_app(nav["socket"])
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, nav)
        await go(pilot, "3", QueueScreen)
        queue = table(pilot, "queue-table")
        await until(pilot, lambda: str(nav["runner"]) in queue.row_keys, what="the queue")
        quick = engine.submit(ME, JobSpec(command=("sh", "-c", "exit 3"), name="nav-quick",
                                          gpu_mem_mb=4096)).id
        run(engine, quick, "node02", 4096)
        exit_with(engine, quick, "node02", 3)
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
        # ended before the TUI started: from the head's history
        await until(pilot, lambda: str(nav["ended"]) in queue.row_keys, what="older jobs")
        await pilot.press("a")
        await until(pilot, lambda: str(quick) not in queue.row_keys, what="active jobs only again")


async def test_vi_keys_move_like_the_arrows(nav):
    app = make_app(nav["socket"])
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, nav)
        await go(pilot, "2", GpusScreen)
        gpus = table(pilot, "gpu-table")
        await until(pilot, lambda: gpus.row_count == GPUS, what=f"{GPUS} rows")
        await pilot.press("G")
        assert gpus.cursor_row == GPUS - 1
        await pilot.press("k", "k")
        assert gpus.cursor_row == GPUS - 3
        await pilot.press("g", "j")
        assert gpus.cursor_row == 1


async def test_the_palette_offers_other_screens_actions(nav):
    app = make_app(nav["socket"])
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, nav)
        await go(pilot, "3", QueueScreen)
        await palette_pick(pilot, "drain node", "Nodes: Drain node")
        await until(pilot, lambda: isinstance(app.screen, DrainPrompt), what="drain, from the Queue")
        assert app.current_mode == "nodes"
        await pilot.press("escape")


# ============================================================================ the rest
async def test_the_theme_is_remembered(nav, tmp_path):
    app = make_app(nav["socket"], home=tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, nav)
        dark = app.current_theme.dark
        await pilot.press("t")
        await until(pilot, lambda: app.current_theme.dark != dark, what="the other theme")
        chosen = app.theme
    assert json.loads((tmp_path / "tui.json").read_text())["theme"] == chosen
    again = make_app(nav["socket"], home=tmp_path)
    async with again.run_test(size=SIZE):
        assert again.theme == chosen


async def test_the_screenshot_key_saves_an_ascii_name_in_the_home_and_says_where(nav, tmp_path, monkeypatch):
    """`P` saved "NebulaGrid_—_simlab_….svg" (an em dash) into the current directory."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    app = make_app(nav["socket"], home=tmp_path / "nebula-home")
    folder = tmp_path / "nebula-home" / "screenshots"
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await started(pilot, nav)
        # the table draws what the app holds a moment later (CI, loaded, shot it before)
        await until(pilot, lambda: "nav-runner" in app.export_screenshot().replace("&#160;", " "),
                    what="the runner on the screen")
        await pilot.press("P")
        saved = await until(pilot, lambda: next(folder.glob("*.svg"), None), what="the screenshot in the home")
        await until(pilot, lambda: any(str(saved) in str(n.message) for n in app._notifications),
                    what="a notice saying where")
    assert saved.name.isascii() and " " not in saved.name and not list(work.iterdir())
    assert "nav-runner" in saved.read_text().replace("&#160;", " ")


async def test_keys_typed_right_after_tab_land_in_the_next_field(nav):
    """Tab moves the focus as it arrives: what follows it, however fast, lands after it."""
    app = make_app(nav["socket"])
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, nav)
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
