"""The Queue, Nodes and Users screens follow the head's stream: a drain, a quota change and
a requeue appear on them with no request for them, and the queue's order and each job's
environment are the head's own.

The head is the real ``Engine`` and ``ApiServer`` on a real socket in this test's loop
(``inprocess``); the TUI is the real app under Pilot. Every request the app makes is
recorded: none may ask for what the stream brings.
"""

from __future__ import annotations

import getpass
import time

from support.tui import until
from textual.widgets import DataTable

from nebula_tui.model import JobSpec, Placement
from nebula_tui.screens.app import make_app
from nebula_tui.screens.nodes import NodesScreen
from nebula_tui.screens.queue import QueueScreen
from nebula_tui.screens.widgets.rowtable import RowTable
from nebula_tui.screens.users import UsersScreen

ME = getpass.getuser()
SIZE = (140, 44)
#: What the app may ask for itself: who it is, the Nodes log's older lines (once), and the
#: Users screen's month of the cluster (the head's report: not in the stream).
ONE_OFF = {"ping", "events", "report"}


def recording(app) -> list[str]:
    """The ops of every request the app makes from now on."""
    calls: list[str] = []
    call = app.client.call
    app.client.call = lambda op, **fields: (calls.append(op), call(op, **fields))[1]
    return calls


def cells(app, ident: str) -> dict[str, list[str]]:
    table = app.screen.query_one(f"#{ident}")
    if isinstance(table, RowTable):
        return {key: [str(c) for c in table.get_row(key)] for key in table.row_keys}
    assert isinstance(table, DataTable)
    return {row.key.value: [str(c) for c in table.get_row(row.key)] for row in table.ordered_rows}


def text(app, selector: str) -> str:
    return "\n".join(str(w.content) for w in app.screen.query(selector))


def start(engine, job_id: int, node: str = "node01") -> None:
    """Place a job on ``node``'s GPU 0 and let it run (as a pass and the nodelet would)."""
    engine.transitions.begin_launch(engine.jobs[job_id], (Placement(f"GPU-{node}-0", node, 0, 81920, True),))
    engine.transitions.mark_running(engine.jobs[job_id])


async def test_a_drain_a_quota_change_and_a_requeue_appear_without_any_poll(engine, served):
    running = engine.submit(ME, JobSpec(command=("sleep", "600")))
    start(engine, running.id)
    # They wait for it (a request no card here could ever serve would be refused at submit).
    waiting = [engine.submit("root", JobSpec(command=("true",), after=(running.id,))) for _ in range(2)]
    engine.scheduling.schedule_pass()
    app = make_app(served)
    calls = recording(app)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.cluster.connected, what="the snapshot")

        await pilot.press("3")
        await until(pilot, lambda: isinstance(app.screen, QueueScreen), what="the queue")
        await until(pilot, lambda: list(cells(app, "queue-table")) ==
                    [str(running.id)] + [str(j.id) for j in waiting], what="the head's order")
        engine.transitions.requeue(engine.jobs[running.id], "lost with node node01; requeued")
        await until(pilot, lambda: cells(app, "queue-table")[str(running.id)][3] == "pending"
                    and "lost with node node01" in cells(app, "queue-table")[str(running.id)][-1],
                    what="the requeued job waiting, with why")

        await pilot.press("4")
        await until(pilot, lambda: isinstance(app.screen, UsersScreen), what="the users")
        await until(pilot, lambda: ME in cells(app, "users-table"), what="our row")
        engine.set_quota("root", ME, 77)
        await until(pilot, lambda: "/ 77 h" in cells(app, "users-table")[ME][2], what="the new quota")

        await pilot.press("5")
        await until(pilot, lambda: isinstance(app.screen, NodesScreen), what="the nodes")
        engine.set_drained("root", "node02", True, "new fans")
        await until(pilot, lambda: cells(app, "nodes-table")["node02"][1] == "drained",
                    what="node02 drained")
        await until(pilot, lambda: any("node02 drained" in row[2] for row in
                                       cells(app, "events-table").values()), what="its log line")
    assert set(calls) <= ONE_OFF and calls.count("events") <= 1, calls


async def test_the_queue_shows_the_schedulers_order_priority_first(engine, served):
    blocker = engine.submit(ME, JobSpec(command=("sleep", "600")))
    start(engine, blocker.id)
    first = engine.submit(ME, JobSpec(command=("true",), after=(blocker.id,)))
    urgent = engine.submit("root", JobSpec(command=("true",), after=(blocker.id,), priority=10))
    engine.scheduling.schedule_pass()
    assert engine.state.queue_order == [urgent.id, first.id]
    assert [(j["id"], j["queue_pos"]) for j in engine.queue_json() if j["state"] == "pending"] == \
        [(urgent.id, 1), (first.id, 2)]
    assert engine.job_detail(urgent.id)["queue_pos"] == 1
    app = make_app(served)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.cluster.connected, what="the snapshot")
        await pilot.press("3")
        await until(pilot, lambda: isinstance(app.screen, QueueScreen), what="the queue")
        await until(pilot, lambda: list(cells(app, "queue-table")) ==
                    [str(blocker.id), str(urgent.id), str(first.id)],
                    what="running, then priority first, as the scheduler orders")
        assert [row[4] for row in cells(app, "queue-table").values()] == ["-", "1", "2"]


async def test_a_gang_jobs_page_shows_each_nodes_environment_from_the_head(engine, served):
    job = engine.submit(ME, JobSpec(command=("true",), gpu_count=2, nodes=2))
    engine.transitions.begin_launch(engine.jobs[job.id], (
        Placement("GPU-node01-0", "node01", 0, 81920, True),
        Placement("GPU-node02-1", "node02", 1, 81920, True)))
    app = make_app(served)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.cluster.connected, what="the snapshot")
        app.open_job(job.id)
        env = await until(pilot, lambda: "NODE_RANK" in (shown := text(app, "#job-env")) and shown,
                          what="the environment")
    for rank, (node, variables) in enumerate(engine.transitions.environments(engine.jobs[job.id]).items()):
        assert f"{node} (rank {rank})" in env
        assert variables["NODE_RANK"] == str(rank)
        assert all(f"{k}={v}" in env for k, v in variables.items())


async def test_a_forecast_reaches_the_queue_by_the_stream_and_w_explains_the_job(engine, served):
    for index in range(2):
        for node in ("node01", "node02"):
            held = engine.submit("root", JobSpec(command=("sleep", "600"), time_limit_s=3600.0))
            engine.transitions.begin_launch(engine.jobs[held.id], (
                Placement(f"GPU-{node}-{index}", node, index, 81920, True),))
            engine.transitions.mark_running(engine.jobs[held.id])
    waiting = engine.submit(ME, JobSpec(command=("true",), time_limit_s=600.0))
    engine.scheduling.schedule_pass()
    app = make_app(served)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.cluster.connected, what="the snapshot")
        await pilot.press("3")
        await until(pilot, lambda: isinstance(app.screen, QueueScreen), what="the queue")
        engine.scheduling.forecast_if_due()  # in a thread; its "queue" event brings it
        starts = await until(pilot, lambda: (app.cluster.job(waiting.id) or {}).get("starts"),
                             what="the forecast", timeout=20)
        assert starts["start_at"] > engine.clock()
        table = app.screen.query_one("#queue-table", RowTable)
        table.move_cursor(row=list(table.row_keys).index(str(waiting.id)))
        await until(pilot, lambda: ", starts ~" in text(app, "#queue-detail"), what="the detail's start")
        await pilot.press("w")
        shown = await until(pilot, lambda: "Held by:" in (body := text(app, "#dialog-body")) and body,
                            what="the why dialog", timeout=20)
    assert f"Job {waiting.id} " in shown and "fair share: weight" in shown


async def test_a_booking_whose_window_opens_reads_under_way_without_a_restart(tmp_path):
    """Before its window the Queue said "ahead"; once it opened the running TUI kept
    "ahead" and the GPUs screen never said "booked for …" (only `nebula reservations` knew):
    the head told subscribers of a booking made or ended, not of a window opening."""
    from support.inprocess import up_engine

    from nebula_tui.head.server import ApiServer
    from nebula_tui.screens.overview import OverviewScreen

    clock = [time.time()]
    head = up_engine(tmp_path, clock=lambda: clock[0])
    head.bookings.create(ME, {"gpus": "node01:0", "start": clock[0] + 600, "duration_s": 3600,
                              "name": "paper"})
    server = ApiServer(head, tmp_path / "nebula.sock")
    await server.start()
    app = make_app(server.path)
    calls = recording(app)
    try:
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.cluster.connected, what="the snapshot")
            await pilot.press("3")
            await until(pilot, lambda: "(ahead)" in text(app, "#queue-bookings"), what="the booking ahead")
            clock[0] += 700  # its window opens: the scheduling loop's turn notices
            head.bookings.check()
            await until(pilot, lambda: "(under way)" in text(app, "#queue-bookings"), what="under way")
            await pilot.press("2")
            await until(pilot, lambda: "booked for paper" in " ".join(cells(app, "gpu-table")["GPU-node01-0"]),
                        what="the GPUs screen's booked card")
            await pilot.press("1")
            await until(pilot, lambda: isinstance(app.screen, OverviewScreen), what="the overview")
            await until(pilot, lambda: "bookings: 1 under way" in text(app, "Static"), what="the summary")
            clock[0] += 3600  # and it ends
            head.bookings.check()
            await until(pilot, lambda: not app.cluster.bookings, what="the booking gone")
    finally:
        await server.close()
        await head.stop()
        head.state.store.close()
    assert set(calls) <= ONE_OFF, calls


async def test_the_queue_shows_the_idle_mark_the_head_puts_on_a_running_job(tmp_path):
    """A running job whose card reads idle is marked by the head at once (with idle_after
    set), and the Queue's "where" says so from the stream. The mark's timing and what
    follows it (warning, cancel) are the head's rule on its clock:
    tests/unit/test_limits_clock.py; the lab's end to end run: tests/lab/test_limits_e2e.py."""
    from support.inprocess import gpu_row, probe, up_engine

    from nebula_tui.head.server import ApiServer

    head = up_engine(tmp_path, "limits:\n  idle_after: 10m\n  idle_action: cancel\n")
    server = ApiServer(head, tmp_path / "nebula.sock")
    await server.start()
    app = make_app(server.path)
    try:
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.cluster.connected, what="the snapshot")
            await pilot.press("3")
            await until(pilot, lambda: isinstance(app.screen, QueueScreen), what="the queue screen")
            job = head.submit(ME, JobSpec(command=("sleep", "120"))).id
            start(head, job)
            head.on_node_message("node01", probe("node01", [gpu_row("node01", i, util=0) for i in range(2)]))
            assert head.jobs[job].status.idle_since is not None

            def where() -> str:
                row = cells(app, "queue-table").get(str(job))
                return row[-1] if row else ""
            shown = await until(pilot, lambda: "idle" in (w := where()) and w, what="the idle mark in the queue")
            assert shown.startswith("node01:0") and shown.endswith(" on 1 GPU"), shown
    finally:
        await server.close()
        await head.stop()
        head.state.store.close()


async def test_the_job_page_says_where_it_ran_and_draws_stopping_styled(engine, served):
    """The page said `Workdir $HOME` for a job that ran in the folder it was submitted from
    (`nebula job` said it right), and drew a `stopping` job in no colour at all."""
    from nebula_tui.model import JobState
    from nebula_tui.remote.protocol import Started
    from nebula_tui.screens.job import JobScreen
    from nebula_tui.screens.look import LOOK

    job = engine.submit(ME, JobSpec(command=("sleep", "600")))
    engine.transitions.begin_launch(engine.jobs[job.id], (Placement("GPU-node01-0", "node01", 0, 81920, True),))
    engine.transitions.on_started("node01", Started(job.id, engine.state.token(engine.jobs[job.id]), "/srv/paper"))
    assert engine.jobs[job.id].state == JobState.RUNNING
    app = make_app(served)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.cluster.connected, what="the snapshot")
        app.open_job(job.id)
        await until(pilot, lambda: isinstance(app.screen, JobScreen) and "Workdir   /srv/paper" in
                    text(app, "#job-spec"), what="the workdir it ran in")
        engine.transitions.begin_stop(engine.jobs[job.id], JobState.TIMEOUT, "its time limit", False,
                                      engine.state.clock() + 30)
        await until(pilot, lambda: "stopping" in text(app, "#job-spec"), what="stopping")
        spec = app.screen.query_one("#job-spec").content
        word = next(span for span in spec.spans if spec.plain[span.start:span.end] == "stopping")
        assert str(word.style) == LOOK.state("stopping") != ""


def test_a_pool_jobs_environment_panel_does_not_wait_for_a_placement():
    """A job running on a pool's cluster read "Set when the job is placed" while it ran."""
    from nebula_tui.screens.job import env_text

    shown = env_text({}, {"id": 4, "pool": "hpc", "phase": "running"}).plain
    assert "placed" not in shown and "pool hpc" in shown
