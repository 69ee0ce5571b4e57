"""Finding one's way, against a real head on the simulated lab (Pilot): what needs a job's
real log and its real processes. The ``:`` command line opens an ended job's page (its
log's end line is the node's wrapper's), a GPU and a user; the same filter and sort keys
work on every table, the GPU page's processes (the node's probe) included. The rest of
the navigation tests run against the in-process head: ``tests/tui/test_navigation.py``.
"""

from __future__ import annotations

import pytest
from support.tui import command, go, table, text, until
from textual.pilot import Pilot

from nebula_tui.api import ApiError
from nebula_tui.screens.app import make_app
from nebula_tui.screens.base import FilterBox
from nebula_tui.screens.commandline import CommandLine
from nebula_tui.screens.gpus import GpuDetailScreen, GpusScreen
from nebula_tui.screens.job import JobScreen
from nebula_tui.screens.nodes import NodesScreen
from nebula_tui.screens.overview import OverviewScreen
from nebula_tui.screens.queue import QueueScreen
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
