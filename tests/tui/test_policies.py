"""The head authors every policy its clients show: the temperature thresholds the TUI draws
by and the throttling detector judges by, whether a request takes a card whole, a job's
state in one word. Each of these was once worked out a second time, differently, on the
client side (issue 29); these tests hold them to one author.

The head is the real ``Engine`` (and its ``ApiServer`` on a real socket) in the test's own
loop (``inprocess``); the TUI is the real app under Pilot.
"""

from __future__ import annotations

import getpass
from pathlib import Path

import pytest
from support.tui import until
from support.inprocess import up_engine

from nebula_tui import views
from nebula_tui.cli import text
from nebula_tui.model import NOT_AVAILABLE, GpuReading, JobSpec, JobState, Placement, Temperatures
from nebula_tui.screens import render
from nebula_tui.screens.app import make_app
from nebula_tui.screens.look import LOOK

ME = getpass.getuser()
HOT_60 = "scheduler:\n  hot_c: 60\n"


@pytest.fixture
async def hot_at_60(tmp_path):
    """A head whose nodes.yaml says cards are hot above 60 °C, and its socket."""
    from nebula_tui.head.server import ApiServer

    head = up_engine(tmp_path, HOT_60)
    server = ApiServer(head, tmp_path / "nebula.sock")
    await server.start()
    yield head, server.path
    await server.close()
    await head.stop()
    head.state.store.close()
    LOOK.use_temperatures(None)  # the next test draws by the defaults again


async def test_a_configured_hot_c_colours_the_tui(hot_at_60):
    """scheduler.hot_c: 60 — the TUI once read a ``hot_c`` the settings object lacks, and
    drew 65 °C as merely warm; warm started 15 °C under hot there and at 50 °C in the
    scheduler. Now both come from the head's snapshot."""
    _, socket = hot_at_60
    app = make_app(socket)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.cluster.connected)
        assert LOOK.temperatures == Temperatures(hot_c=60.0, warm_c=50.0)
        assert LOOK.temperature_role(65) == "bad"
        assert LOOK.temperature_role(55) == "warn"  # the scheduler's warm, not 60 - 15 = 45
        assert LOOK.temperature_role(48) == "ok"


async def test_throttling_is_judged_by_the_configured_hot_c(hot_at_60):
    """An idle card at 70 °C clocking under its base is throttling when hot_c is 60 (it was
    judged against a hard-coded 75 °C)."""
    head, _ = hot_at_60
    reading = GpuReading(index=0, uuid="GPU-node01-0", name="card", temperature_c=70.0,
                         utilization_pct=5.0, sm_clock_mhz=900.0, base_sm_clock_mhz=1400.0)
    head.health.on_probe("node01", [reading], {})
    assert any("suspected thermal throttling" in e["message"] for e in head.store.events(10))


@pytest.mark.parametrize("total_mb, model, size_gb", [
    (8188, "NVIDIA GeForce RTX 3070", 8), (16160, "Tesla V100-SXM2-16GB", 16),
    (24564, "NVIDIA GeForce RTX 4090", 24), (81920, "NVIDIA A100-SXM4-80GB", 80)])
async def test_the_gpus_screen_shows_what_the_scheduler_would_place(tmp_path, total_mb, model, size_gb):
    """An idle 8188 MiB card takes an 8G job (the scheduler measures a whole card by its
    nominal size) but the GPUs screen counted it against the real memory and said 0: the
    head now publishes ``fits`` from ``scheduler.slices`` and the screen only shows it."""
    from support.inprocess import gpu_row, probe

    from nebula_tui.head.server import ApiServer

    head = up_engine(tmp_path)
    for node in ("node01", "node02"):
        head.on_node_message(node, probe(node, [{**gpu_row(node, i), "memory_total_mb": total_mb, "name": model}
                                                for i in range(2)]))
    server = ApiServer(head, tmp_path / "nebula.sock")
    await server.start()
    try:
        card = head.stream.gpus_json("node01")[0]
        assert card["fits"][f"{min(size_gb, 16)}G"] >= 1
        job = head.submit(ME, JobSpec(command=("true",), gpu_mem_mb=size_gb * 1024))
        head.scheduling.schedule_pass()
        assert head.jobs[job.id].placements, head.jobs[job.id].status  # the scheduler places it
        if size_gb <= 16:
            app = make_app(server.path)
            async with app.run_test(size=(140, 40)) as pilot:
                await until(pilot, lambda: app.cluster.connected, what="the snapshot")
                await pilot.press("2")
                await until(pilot, lambda: f"{size_gb}G×1" in str(app.screen.query_one("#gpu-table")
                                                                   .get_row("GPU-node02-0")),
                            what=f"{size_gb}G×1 on an idle {total_mb} MiB card")
    finally:
        await server.close()
        await head.stop()
        head.state.store.close()


async def test_a_stopping_job_reads_stopping_on_every_screen(tmp_path):
    """A job the head is stopping (its time limit, the memory guard) read "running" on the
    TUI's screens: they derived its state a second time and did not know ``stopping``."""
    head = up_engine(tmp_path)
    try:
        job = head.submit(ME, JobSpec(command=("sleep", "600")))
        head.transitions.begin_launch(head.jobs[job.id], (Placement("GPU-node01-0", "node01", 0, 81920, True),))
        head.transitions.mark_running(head.jobs[job.id])
        head.transitions.begin_stop(head.jobs[job.id], JobState.TIMEOUT, "its time limit", False,
                                    head.state.clock() + 30)
        shown = views.job_json(head.jobs[job.id])
        assert render.job_state(shown) == "stopping"
        assert "stopping" in render.job_summary(shown)
        held = head.submit(ME, JobSpec(command=("true",)))
        head.set_held(ME, held.id, True)
        assert render.job_state(views.job_json(head.jobs[held.id])) == "held"
    finally:
        await head.stop()
        head.state.store.close()


def test_one_duration_formatter_and_one_na():
    """The CLI's tables, the TUI and the head's sentences write a duration one way."""
    from nebula_tui.units import duration_short

    assert render.duration is duration_short
    assert not hasattr(views, "format_duration")
    assert [duration_short(s) for s in (None, 45, 192, 720, 3900, 190000)] == \
        ["-", "45s", "3m12s", "12m", "1h05m", "2d4h"]
    assert render.temp_text(None).plain == render.power_text({}) == NOT_AVAILABLE
    assert render.util_cell({}).plain.endswith(f" {NOT_AVAILABLE}")
    assert render.memory_text({}) == f"{NOT_AVAILABLE} / {NOT_AVAILABLE}"


def test_the_queue_of_the_cli_says_the_same_word_as_the_tui():
    """`nebula queue` wrote the stored state ("running", "pending") where the TUI wrote
    "stopping" or "held": both now write the head's phase."""
    job = {"id": 3, "user": "ann", "name": "t", "state": "running", "phase": "stopping",
           "gpus": [{"node": "n1", "index": 0}], "gpu_count": 1, "gpu_mem_mb": None,
           "reason": "", "command": ["python", "t.py"]}
    held = {**job, "id": 4, "state": "pending", "phase": "held", "gpus": []}
    lines = text.queue_text([job, held]).splitlines()
    assert lines[1].split()[3] == "stopping" and lines[2].split()[3] == "held"


def test_one_booking_state_for_the_cli_and_the_tui():
    """`nebula reservations` and the TUI each wrote a booking's state words themselves."""
    from nebula_tui.cli import bookings as cli_bookings

    for booking, word in (({"active": True}, "under way"), ({"active": False}, "ahead"),
                          ({"active": True, "broken": "node01:0 is gone"}, "broken: node01:0 is gone")):
        b = {"name": "paper", "gpus": "node01:0", "when": "Fri 09:00 – Fri 19:00", "users": ["ann"],
             "created_by": "ann", "broken": None, **booking}
        assert views.booking_state(b) == word
        assert render.booking_line(b).endswith(f"({word})")
        assert cli_bookings.bookings_text([b]).splitlines()[1].endswith(word)
    for module in (render, cli_bookings):
        source = Path(module.__file__).read_text()
        assert '"under way"' not in source and '"ahead"' not in source, module.__name__


@pytest.mark.parametrize("dark", [True, False])
def test_every_job_phase_has_a_word_and_a_style(dark):
    """`stopping` was drawn unstyled: look.py listed the phase words again and missed it."""
    from nebula_tui.screens.look import Look

    look = Look()
    look.use_colours(dark=dark, success="#4EBF71", warning="#ffa62b", error="#ba3c5b", accent="#0178D4")
    for phase in views.JobPhase:
        assert phase.value.isalpha() and phase.value.islower()
        assert look.state(phase.value), phase
    assert {p.value for p in views.JobPhase} >= {s.value for s in JobState}
