"""Every TUI screen against a real head service on the simulated lab, driven with Pilot.

Each test presses keys the way a user would and asserts on what the screen then shows.
Requests the service may not have yet (hold, drain, plan, history, attach_info) are probed
first; a test that needs one the service lacks is skipped with the op's name. What needs
no real job, log or card of the lab (keys, help, palette, the form's checks, drain and
resume) is ``tests/tui/test_screens.py``, against the in-process head.
"""

from __future__ import annotations

import re

import pytest
import yaml
from support.head import has_op
from support.tui import SIZE, go, rows, started, text, until
from support.labfixtures import lab_config, serving
from textual.pilot import Pilot
from textual.widgets import DataTable, Input, Log

from nebula_tui.api import ApiError
from nebula_tui.model import format_mb
from nebula_tui.screens.app import make_app
from nebula_tui.screens.gpus import GpuDetailScreen, GpusScreen
from nebula_tui.screens.job import JobScreen
from nebula_tui.screens.look import LOOK
from nebula_tui.screens.widgets.nodecards import NodeCards
from nebula_tui.screens.widgets.dialogs import ChoiceScreen
from nebula_tui.screens.nodes import NodesScreen
from nebula_tui.screens.overview import OverviewScreen
from nebula_tui.screens.queue import QueueScreen
from nebula_tui.screens.widgets.rowtable import RowTable
from nebula_tui.screens.submit import SubmitScreen
from nebula_tui.screens.users import USER_COLUMNS, UsersScreen
from support.head import submit

def toasts(app) -> str:
    return "\n".join(str(t.render()) for t in app.screen.query("Toast"))


def needs(head, op: str, **fields) -> None:
    if not has_op(head, op, **fields):
        pytest.skip(f"the service has no '{op}' request yet")


@pytest.fixture
def jobs(head):
    """Ids of jobs a test submitted; all cancelled afterwards."""
    ids: list[int] = []
    yield ids
    for job_id in ids:
        try:
            head.call("cancel", job=job_id)
        except ApiError:
            pass
    for job_id in ids:
        head.wait_job(job_id)


def select_row(pilot: Pilot, ident: str, key: str) -> None:
    table = pilot.app.screen.query_one(f"#{ident}", (DataTable, RowTable))
    table.focus()
    table.move_cursor(row=table.get_row_index(key))


# ============================================================================ GPUs
async def test_gpus_table_sorts_filters_and_opens_a_gpu(head):
    app = make_app(head.socket)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        await go(pilot, "2", GpusScreen)
        await until(pilot, lambda: len(rows(pilot, "gpu-table")) == 9, what="9 GPU rows")
        # The lab is shared by the session's modules: a job an earlier one cancelled may
        # still be leaving node01:0 (its grace), so wait for the card to be all free.
        await until(pilot, lambda: list(rows(pilot, "gpu-table").values())[0][2] == "24 GB", 30,
                    what="node01:0 all free")
        first = list(rows(pilot, "gpu-table").values())
        assert [c[0] for c in first[:3]] == ["node01:0", "node01:1", "node01:2"]
        # GPU, model, free memory, memory used of total, utilisation, temperature, power
        assert first[0][2] == "24 GB" and "B / 24 GB" in first[0][3] and "%" in first[0][4]
        assert "°C" in first[0][5] and re.match(r"\d+/450 W", first[0][6])
        # Keyed by uuid, as the head publishes them.
        assert set(rows(pilot, "gpu-table")) == {g["uuid"] for g in head.call("gpus")["gpus"]}

        await pilot.press("s", "s")  # by GPU, then model, then free memory: the 80 GB cards first
        await until(pilot, lambda: "by Free ▼" in app.screen.query_one("#gpu-table").border_title,
                    what="sorted by free memory, largest first")
        ordered = [c[1] for c in rows(pilot, "gpu-table").values()]
        assert ordered[:4] == ["A100-SXM4-80GB"] * 4 and ordered[-1] == "RTX 4060 Laptop"

        await pilot.press("slash")
        await pilot.press(*"3090")
        await until(pilot, lambda: len(rows(pilot, "gpu-table")) == 2, what="filtered to 3090s")
        assert {c[0] for c in rows(pilot, "gpu-table").values()} == {"node03:0", "node03:1"}
        await pilot.press("enter")  # leaves the filter box for the table
        await pilot.press("escape")
        await until(pilot, lambda: len(rows(pilot, "gpu-table")) == 9, what="filter cleared")

        table = app.screen.query_one("#gpu-table", RowTable)
        table.focus()
        table.move_cursor(row=0)
        uuid = table.cursor_key
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, GpuDetailScreen), what="GPU detail")
        await until(pilot, lambda: uuid in text(pilot, "#gpu-descriptor"), what="descriptor")
        desc = text(pilot, "#gpu-descriptor")
        gpu = next(g for g in head.call("gpus")["gpus"] if g["uuid"] == uuid)
        for value in (gpu["model"], gpu["compute_capability"], gpu["pci_bus_id"]):
            assert value in desc
        assert rows(pilot, "gpu-slices"), "a free GPU still lists its free slice"
        assert any("free" in cells[2] for cells in rows(pilot, "gpu-slices").values())
        await until(pilot, lambda: "Loading" not in text(pilot, "#gpu-history-note"), what="history")
        history = text(pilot, "#gpu-history-note")
        if has_op(head, "history", gpu=uuid, since=60):
            assert "samples" in history
        else:
            assert "not available on this service" in history
        await pilot.press("escape")
        await until(pilot, lambda: isinstance(app.screen, GpusScreen), what="back to GPUs")


async def test_gpu_detail_shows_the_slice_holder(head, jobs):
    app = make_app(head.socket)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        job_id = submit(head, "--name", "slice-holder", "--gpu-mem", "6G", "--", "sleep", "30")
        jobs.append(job_id)
        await until(pilot, lambda: (app.cluster.jobs.get(job_id) or {}).get("state") == "running",
                    what="job running")
        uuid = app.cluster.jobs[job_id]["gpus"][0]["uuid"]
        app.push_screen(GpuDetailScreen(uuid))
        await until(pilot, lambda: any(f":{job_id}" in c[3] for c in rows(pilot, "gpu-slices").values()),
                    what="the job's slice")
        held = next(c for c in rows(pilot, "gpu-slices").values() if f":{job_id}" in c[3])
        placed = head.job(job_id)["gpus"][0]
        size = format_mb(placed["memory_mb"]) + (" (whole)" if placed["exclusive"] else "")
        assert held[1] == size and "allocated" in held[2] and "slice-holder" in held[3]


# ============================================================================ queue
async def test_queue_reasons_positions_hold_release_cancel(head, jobs):
    app = make_app(head.socket)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await started(pilot)
        # The runner takes an A100 whole (41 GB is over half of it, more than a 24 GB card
        # has), so the waiter's four A100s are not free: it waits (a request no node could
        # ever hold would be refused at submit), and runs on once the runner is cancelled.
        runner = submit(head, "--name", "runner", "--gpu-mem", "41G", "--", "sleep", "60")
        waiter = submit(head, "--name", "too-big", "--gpu-count", "4", "--gpu-mem", "70G",
                        "--", "sleep", "60")
        jobs += [runner, waiter]
        await go(pilot, "3", QueueScreen)
        await until(pilot, lambda: rows(pilot, "queue-table").get(str(runner), [""] * 4)[3] == "running",
                    what="runner running")
        await until(pilot, lambda: rows(pilot, "queue-table").get(str(waiter), [""] * 9)[8] not in ("", "4x 70 GB"),
                    what="waiter's reason")
        table = rows(pilot, "queue-table")
        assert list(table)[:2] == [str(runner), str(waiter)]  # running first
        assert table[str(waiter)][3] == "pending" and table[str(waiter)][4] == "1"
        assert table[str(waiter)][5] == "4x 70 GB"
        assert re.search(r"GPU|node|need", table[str(waiter)][8]), table[str(waiter)][8]
        assert table[str(runner)][4] == "-" and re.match(r"node0\d:\d", table[str(runner)][8])
        assert "1 running · 1 waiting" in text(pilot, "#queue-summary")

        if has_op(head, "hold", job=10**9):
            select_row(pilot, "queue-table", str(waiter))
            await pilot.press("h")
            await until(pilot, lambda: rows(pilot, "queue-table")[str(waiter)][3] == "held",
                        what="waiter held")
            assert rows(pilot, "queue-table")[str(waiter)][4] == "-"  # out of the order
            await pilot.press("u")
            await until(pilot, lambda: rows(pilot, "queue-table")[str(waiter)][3] == "pending",
                        what="waiter released")
        else:
            select_row(pilot, "queue-table", str(waiter))
            await pilot.press("h")
            await until(pilot, lambda: "not available on this service" in toasts(app),
                        what="hold not available notice")

        # "mine": every job here is ours, so the filter keeps both and says whose.
        await until(pilot, lambda: app.user, what="who we are")
        await pilot.press("m")
        await until(pilot, lambda: f"{app.user}'s jobs" in text(pilot, "#queue-summary"),
                    what="mine filter")
        assert {str(runner), str(waiter)} <= set(rows(pilot, "queue-table"))

        select_row(pilot, "queue-table", str(runner))
        await pilot.press("c")
        await until(pilot, lambda: isinstance(app.screen, ChoiceScreen), what="asked first")
        await pilot.press("y")
        await until(pilot, lambda: str(runner) not in rows(pilot, "queue-table"),
                    what="runner cancelled")
        assert head.wait_job(runner)["state"] == "cancelled"
        assert str(waiter) in rows(pilot, "queue-table")


# ============================================================================ submit → queue → job
@pytest.mark.slow
async def test_submit_form_then_queue_then_job_log(head, jobs):
    app = make_app(head.socket)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await started(pilot)
        await go(pilot, "n", SubmitScreen)
        form = app.screen
        await pilot.press(*"form-job")
        await pilot.press("tab", "tab")  # name -> gpu count -> gpu memory
        assert app.focused.id == "f-gpu_mem"
        await pilot.press(*"6X")
        await until(pilot, lambda: "is not a size" in text(pilot, "#e-gpu_mem"),
                    what="size error while typing")
        assert form.query_one("#f-gpu_mem", Input).has_class("invalid")
        await pilot.press("backspace")
        await pilot.press("G")
        await until(pilot, lambda: text(pilot, "#e-gpu_mem") == "", what="size accepted")
        await pilot.press("ctrl+s")  # no command yet: refused, says why
        await until(pilot, lambda: "required" in text(pilot, "#e-command"), what="command required")
        assert isinstance(app.screen, SubmitScreen)

        form.query_one("#f-command", Input).focus()
        await pilot.press(*"echo hello-from-form; sleep 30")
        if has_op(head, "plan", command=["true"]):
            await until(pilot, lambda: "Would start now on" in text(pilot, "#preview"),
                        what="the preview")
            assert re.search(r"node0\d:\d \((6 GB|whole card)\)", text(pilot, "#preview"))
        else:
            await until(pilot, lambda: "not available" in text(pilot, "#preview"), what="no plan")
        await pilot.press("ctrl+s")
        await until(pilot, lambda: isinstance(app.screen, JobScreen), what="the job screen")
        job_id = app.screen.job_id
        jobs.append(job_id)
        assert head.job(job_id)["name"] == "form-job"
        assert head.job(job_id)["gpu_mem_mb"] == 6144
        log = app.screen.query_one("#job-log", Log)
        await until(pilot, lambda: "hello-from-form" in "\n".join(log.lines), what="the job's log")
        await until(pilot, lambda: "CUDA_VISIBLE_DEVICES=" in text(pilot, "#job-env"),
                    what="its environment")
        env = text(pilot, "#job-env")
        placed = head.job(job_id)["gpus"][0]
        assert f"NEBULA_GPU_LIST={placed['uuid']}" in env
        assert f"CUDA_VISIBLE_DEVICES={placed['index']}" in env
        assert f"NEBULA_JOB_ID={job_id}" in env and "CUDA_DEVICE_ORDER=PCI_BUS_ID" in env
        kind = "whole card" if placed["exclusive"] else "6 GB slice"
        # the page follows the job's events: its placement may come after the log's first line
        where = f"{placed['node']}:{placed['index']}  {kind}"
        await until(pilot, lambda: where in text(pilot, "#job-spec"), what="the placement on the job page")
        spec = text(pilot, "#job-spec")
        assert "form-job" in spec and "echo hello-from-form; sleep 30" in spec
        await until(pilot, lambda: "started" in text(pilot, "#job-history")
                    or "running" in text(pilot, "#job-history"), what="state history")
        assert "submitted" in text(pilot, "#job-history")

        # The queue shows it; Enter there opens the same job with its log.
        await go(pilot, "3", QueueScreen)
        await until(pilot, lambda: rows(pilot, "queue-table").get(str(job_id), [""] * 4)[3] == "running",
                    what="the job in the queue")
        select_row(pilot, "queue-table", str(job_id))
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, JobScreen), what="job from the queue")
        await until(pilot, lambda: "hello-from-form" in "\n".join(app.screen.query_one(Log).lines),
                    what="log again")

        # Attach: headless Pilot cannot hand the terminal over; the TUI says what to run.
        await pilot.press("a")
        if has_op(head, "attach_info", job=job_id):
            await until(pilot, lambda: f"nebula attach {job_id}" in toasts(app), what="attach command")
        else:
            await until(pilot, lambda: "not available" in toasts(app), what="no attach_info")
        assert app.is_running

        # Follow off and on again; then cancel from the job screen.
        await pilot.press("f")
        assert "paused" in app.screen.query_one(Log).border_title
        await pilot.press("f")
        assert "following" in app.screen.query_one(Log).border_title
        await pilot.press("c")
        await until(pilot, lambda: isinstance(app.screen, ChoiceScreen), what="asked first")
        await pilot.press("y")
        await until(pilot, lambda: "cancelled" in text(pilot, "#job-spec"), what="cancelled")
        assert head.wait_job(job_id)["state"] == "cancelled"


# ============================================================================ users
async def test_users_screen_shows_weights_and_hours(head, jobs):
    job_id = submit(head, "--gpu-mem", "4G", "--", "true")
    jobs.append(job_id)
    head.wait_job(job_id)
    me = head.call("ping")["user"]
    app = make_app(head.socket)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        await go(pilot, "4", UsersScreen)
        await until(pilot, lambda: me in rows(pilot, "users-table"), what="our user")
        cells = dict(zip((c.key for c in USER_COLUMNS), rows(pilot, "users-table")[me]))
        row = next(u for u in head.call("users")["users"] if u["name"] == me)
        assert int(cells["finished"]) == row["jobs_finished"] >= 1
        assert int(cells["jobs"]) == row["month_jobs"] >= 1  # this month's, as the report counts
        assert cells["weight"] == f"{row['weight']:.2f}" and row["weight"] >= 1.0  # 1.0 + 0.02 per GPU-hour
        assert "/ 2000 h" in cells["hours"] or " h" in cells["hours"]


@pytest.fixture(scope="module")
def budget_head(openssh_lab, tmp_path_factory):
    """A head whose node01 has a power budget its idle cards already pass (1 W) and node02
    one they are far from."""
    config = yaml.safe_load(openssh_lab.config_path.read_text())
    budgets = {"node01": 1, "node02": 100_000}
    for node in config["nodes"]:
        if node["name"] in budgets:
            node["power_budget_w"] = budgets[node["name"]]
    path = lab_config(openssh_lab, "power", nodes=config["nodes"])
    yield from serving(openssh_lab, tmp_path_factory.mktemp("power-home"), path)


async def test_nodes_show_their_draw_against_the_power_budget(budget_head):
    def power_cell(node: str):
        return pilot.app.screen.query_one("#nodes-table", RowTable).get_row(node)[4]

    app = make_app(budget_head.socket)
    async with app.run_test(size=(160, 44)) as pilot:
        await started(pilot)
        await go(pilot, "5", NodesScreen)
        await until(pilot, lambda: len(rows(pilot, "nodes-table")) == 3, what="3 nodes")
        for node in ("node01", "node02", "node03"):  # every card reads a draw
            assert all(g["power_w"] > 0 for g in pilot.app.cluster.node_gpus(node))
        over, far, none = (power_cell(n) for n in ("node01", "node02", "node03"))
        assert re.fullmatch(r"\d+/1 W", str(over)) and over.style == LOOK.role("bad")
        assert re.fullmatch(r"\d+/100000 W", str(far)) and far.style == LOOK.role("ok")
        assert re.fullmatch(r"\d+ W", str(none))  # no budget: its draw alone
        await go(pilot, "1", OverviewScreen)
        cards = pilot.app.screen.query_one("#cards", NodeCards)
        titles = {t.split("\n")[0].split()[0]: t.split("\n")[0] for t in cards.texts()}
        assert re.search(r"  \d+/1 W$", titles["node01"]), titles
        assert re.search(r"  \d+/100000 W$", titles["node02"]), titles
        assert " W" not in titles["node03"]  # no budget, no figure on its card
    shown = budget_head.run("node", "show", "node01", check=True).stdout
    assert re.search(r"^  power: \d+/1 W of its budget \(\d+%\)$", shown, re.M), shown
