"""The TUI at the size of a big lab: 125 nodes, 1,000 GPUs, 10,000 jobs (Pilot).

A head with 10,000 jobs is slow to fill through its socket, so the state arrives as the
app's own ``SnapshotArrived`` message (what its event worker posts when it subscribes) and
telemetry as a ``GpusChanged`` batch; there is no service at the app's socket. Every row
must be reachable and every order right across all rows, not only the rows on screen.
"""

from __future__ import annotations

import html
import re

import pytest

from support.tui import until

from nebula_tui.screens.app import make_app
from nebula_tui.screens.gpus import SORTS, GpusScreen
from nebula_tui.screens.messages import GpusChanged, JobChanged, SnapshotArrived
from nebula_tui.screens.widgets.nodecards import NodeCards
from nebula_tui.screens.queue import QueueScreen
from nebula_tui.screens.widgets.rowtable import RowTable

NODES, PER_NODE, JOBS = 125, 8, 10_000
USERS = [f"user{n:02d}" for n in range(20)]
ME = USERS[3]


def gpu(n: int, i: int, job: int | None) -> dict:
    uuid = f"GPU-{n:03d}-{i}"
    used = 1024 * ((n * 7 + i * 3) % 80) if job else 0
    return {"uuid": uuid, "node": f"node{n:03d}", "index": i, "model": "NVIDIA A100-SXM4-80GB",
            "vendor": "nvidia", "total_memory_mb": 81920, "compute_capability": "8.0",
            "pci_bus_id": f"00000000:{i:02X}:00.0", "nvlink": [], "blocked": None,
            "status": "busy" if job else "idle", "driver_version": "550.54", "cuda_version": "12.4",
            "jobs": [job] if job else [], "memory_used_mb": used,
            "utilization_pct": float((n * 13 + i * 29) % 101), "temperature_c": 30.0 + (n + i) % 45,
            "power_w": 100.0, "unmanaged_used_mb": 0, "processes": [],
            "slices": [{"id": 1, "memory_mb": 81920, "state": "allocated" if job else "free",
                        "job": job, "exclusive": bool(job)}]}


def snapshot() -> dict:
    """1,000 GPUs, the first 999 held by a running job each, the last one idle; 9,001
    jobs waiting, submitted in an order that is not their id order."""
    jobs, gpus = [], []
    for j in range(1, JOBS + 1):
        running = j < NODES * PER_NODE
        n, i = divmod(j - 1, PER_NODE)
        jobs.append({"id": j, "user": USERS[j % len(USERS)], "name": f"train-{j}",
                     "command": ["python", "train.py"], "shell": False, "gpu_count": 1,
                     "gpu_mem_mb": None, "workdir": None,
                     "state": "running" if running else "pending", "phase": "running" if running else "pending",
                     "reason": "" if running else "needs 1 free GPU; all 1000 are taken",
                     "node": f"node{n:03d}" if running else None,
                     "submitted_at": 1_000_000.0 + (j * 7919) % JOBS,
                     "started_at": 1_000_500.0 + j if running else None, "ended_at": None,
                     "exit_code": None, "held": False, "held_by": None,
                     "gpus": [{"uuid": f"GPU-{n:03d}-{i}", "node": f"node{n:03d}", "index": i,
                               "memory_mb": 81920, "exclusive": True}] if running else []})
    for n in range(NODES):
        for i in range(PER_NODE):
            j = n * PER_NODE + i + 1
            gpus.append(gpu(n, i, j if j < NODES * PER_NODE else None))
    nodes = [{"name": f"node{n:03d}", "host": "10.0.0.1", "port": 22, "state": "up", "reason": "",
              "last_seen": 1_000_000.0, "hostname": f"node{n:03d}"} for n in range(NODES)]
    return {"type": "snapshot", "nodes": nodes, "gpus": gpus, "jobs": jobs, "events": []}


def screen_text(app) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", app.export_screenshot())).replace("\xa0", " ")


async def loaded(pilot, app) -> dict:
    snap = snapshot()
    app.user = ME  # nobody to ask at this socket
    app.post_message(SnapshotArrived(snap))
    await until(pilot, lambda: len(app.cluster.jobs) == JOBS, what="the snapshot")
    return snap


async def queue_shown(pilot, app) -> RowTable:
    """The Queue screen with every job of the snapshot in its table."""
    await pilot.press("3")
    await until(pilot, lambda: isinstance(app.screen, QueueScreen), what="the queue")
    table = app.screen.query_one("#queue-table", RowTable)
    await until(pilot, lambda: table.row_count == JOBS, what="10,000 rows")
    return table


async def test_queue_holds_every_job_in_order_and_scrolls_to_the_last():
    app = make_app("/nonexistent/nebula.sock")
    async with app.run_test(size=(160, 48)) as pilot:
        snap = await loaded(pilot, app)
        table = await queue_shown(pilot, app)
        # Running first (oldest start first), then waiting in the head's order (none in
        # this snapshot: submit order, as the scheduler has it for equal weights).
        running = sorted((j for j in snap["jobs"] if j["state"] == "running"),
                         key=lambda j: (j["started_at"], j["id"]))
        waiting = sorted((j for j in snap["jobs"] if j["state"] == "pending" and not j.get("held")),
                         key=lambda j: (j["submitted_at"], j["id"]))
        assert table.row_keys == [str(j["id"]) for j in running + waiting]

        await pilot.press("end")
        last = waiting[-1]
        await until(pilot, lambda: table.cursor_key == str(last["id"]), what="cursor on the last job")
        assert table.cursor_row == JOBS - 1
        shown = screen_text(app)
        assert f"train-{last['id']}" in shown and "needs 1 free GPU" in shown
        assert table.get_row(str(last["id"]))[4] == str(len(waiting))  # its place in line
        await pilot.press("home")
        await until(pilot, lambda: table.cursor_row == 0, what="back to the first job")
        assert f"train-{running[0]['id']}" in screen_text(app)

        # Only mine: every one of my jobs, still in queue order.
        await pilot.press("m")
        mine = [str(j["id"]) for j in running + waiting if j["user"] == ME]
        await until(pilot, lambda: table.row_keys == mine, what="only my jobs")
        assert len(mine) == JOBS // len(USERS)
        await pilot.press("m")
        await until(pilot, lambda: table.row_count == JOBS, what="everyone's jobs again")


async def test_a_jobs_idleness_repaints_its_row_without_ordering_the_queue_again():
    # A lab's running jobs go idle and busy all day: each such event must not cost an
    # order of 10,000 jobs; a change of state still does.
    app = make_app("/nonexistent/nebula.sock")
    async with app.run_test(size=(160, 48)) as pilot:
        await loaded(pilot, app)
        table = await queue_shown(pilot, app)
        queue = app.screen
        orders = []
        render_all = queue.render_all
        queue.render_all = lambda: (orders.append(1), render_all())
        first = table.row_keys[0]
        before = app.cluster.job(int(first))
        job = dict(before, idle_since=before["started_at"])
        assert app.cluster.live_fields_only(before, job)
        app.post_message(JobChanged(job))
        await until(pilot, lambda: "idle" in table.get_row(first)[-1], what="the row says idle")
        await pilot.pause(0.3)
        assert orders == []
        app.post_message(JobChanged(dict(job, state="pending", gpus=[], node=None)))
        await until(pilot, lambda: orders, what="an order for a change of state")


@pytest.mark.slow
async def test_gpu_table_sorts_every_row_and_follows_telemetry():
    app = make_app("/nonexistent/nebula.sock")
    async with app.run_test(size=(160, 48)) as pilot:
        await loaded(pilot, app)
        await pilot.press("2")
        await until(pilot, lambda: isinstance(app.screen, GpusScreen), what="the GPU screen")
        table = app.screen.query_one("#gpu-table", RowTable)
        await until(pilot, lambda: table.row_count == NODES * PER_NODE, what="1,000 rows")
        # Every sortable column in turn (s), each both ways (S), across all 1,000 rows.
        by_gpu = sorted(app.cluster.gpus.values(), key=SORTS["gpu"].key)
        seen = []
        while True:
            column = table.sort_column
            seen.append(column)
            for reverse in (False, True):
                sort = SORTS[column]
                expected = [g["uuid"] for g in sorted(by_gpu, key=sort.key,
                                                      reverse=sort.descending != reverse)]
                await until(pilot, lambda: table.row_keys == expected,
                            what=f"sorted by {column}{' reversed' if reverse else ''}")
                label = table.columns[table.column_keys.index(column)]
                arrow = "▼" if sort.descending != reverse else "▲"
                assert f"by {label} {arrow}" in table.border_title
                assert f"{label} {arrow}" in screen_text(app)  # the header shows it too
                await pilot.press("S")
            await pilot.press("s")
            await until(pilot, lambda: table.sort_column != column, what="the next column")
            if table.sort_column == "gpu":
                break
        assert set(seen) == set(SORTS) & set(table.shown_columns)
        await until(pilot, lambda: table.row_keys[0] == "GPU-000-0", what="node order")

        # The idle card is the last row; filtering finds it among 1,000.
        await pilot.press("slash")
        await pilot.press(*"idle")
        await until(pilot, lambda: table.row_keys == ["GPU-124-7"], what="the one idle GPU")
        await pilot.press("escape")
        await until(pilot, lambda: table.row_count == NODES * PER_NODE, what="filter cleared")

        # Telemetry of node000 arrives (a batch, as the event worker posts it): the visible
        # row shows the new reading.
        fresh = {g["uuid"]: {"utilization_pct": 42.0, "temperature_c": 77.0}
                 for g in app.cluster.node_gpus("node000")}
        app.post_message(GpusChanged([{"type": "gpus", "node": "node000", "gpus": fresh}]))
        await until(pilot, lambda: "77°C" in table.get_row("GPU-000-0")[5]
                    and "77°C" in screen_text(app), what="the new reading on screen")
        assert "42%" in table.get_row("GPU-000-0")[4]


async def test_overview_shows_a_card_per_node_and_scrolls_to_the_last():
    app = make_app("/nonexistent/nebula.sock")
    async with app.run_test(size=(160, 48)) as pilot:
        await loaded(pilot, app)
        cards = app.screen.query_one("#cards", NodeCards)
        await until(pilot, lambda: len(cards.names) == NODES, what="125 cards")
        texts = cards.texts()
        assert [t.split()[0] for t in texts] == [f"node{n:03d}" for n in range(NODES)]
        assert all(len(t.splitlines()) == 1 + PER_NODE for t in texts)
        summary = str(app.screen.query_one("#summary").content)
        assert "125 nodes · 1000 GPUs: 1 idle, 999 busy" in summary
        assert "node124" not in screen_text(app)

        def last_card_shown() -> bool:
            # Scrolled again each time: on a loaded machine the first scroll can come
            # before the cards' height is known, and end short of the last card.
            cards.scroll_end(animate=False)
            return "node124  up" in screen_text(app)
        await until(pilot, last_card_shown, what="the last card on screen")
        queue = app.screen.query_one("#queue", RowTable)
        assert queue.row_count == JOBS
