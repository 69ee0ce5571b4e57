"""Bookings end to end on the simulated lab (real sshd, tmux, SQLite): `nebula reserve`
keeps node02's four A100s (the only cards a 70 GB request fits) for its users through its
window, lets a short job backfill before it, stops a preemptible job at its start, says at
once when it can no longer be honoured, survives a head SIGKILL, and shows in `nebula
reservations` and `nebula report` (issue 27).
"""

from __future__ import annotations

import contextlib
import json
import time

import pytest

from labkit.harness import wait_for
from support.labfixtures import lab_config, serving
from support.head import CHECKPOINTING, cancelled_after, state_is, submit

#: how far ahead the booking starts: long enough for the jobs before it to be placed
LEAD_S = 25

GRACE_S = 3  # the head's isolation grace


@pytest.fixture(scope="module")
def head(openssh_lab, tmp_path_factory):
    path = lab_config(openssh_lab, "bookings", health={"isolation_grace": f"{GRACE_S}s"})
    yield from serving(openssh_lab, tmp_path_factory.mktemp("bookings-home"), path)


def reserve(head, *args: str, check: bool = True):
    return head.run("reserve", *args, check=check)


@contextlib.contextmanager
def ended_after(head, name: str):
    """The booking ``name`` is ended at the end (if the test did not), so the next test's
    cards are free."""
    try:
        yield
    finally:
        head.run("reserve", "--delete", name)


def reason(head, job: int) -> str:
    return head.job(job)["reason"]


@pytest.mark.slow
def test_a_booking_keeps_its_cards_for_its_users_and_lets_a_short_job_backfill(head):
    said = reserve(head, "--gpus", "node02:0-3", "--start", f"+{LEAD_S}s", "--duration", "1h",
                   "--users", "nobody", "--name", "deadline").stdout
    assert said.startswith("Booked node02:0-3 for deadline: ")
    with ended_after(head, "deadline"), cancelled_after(head) as jobs:
        short = submit(head, "--gpu-mem", "70G", "--time", "5s", "--", "sleep", "3")
        long = submit(head, "--gpu-mem", "70G", "--", "sleep", "120")
        spare = submit(head, "--preemptible", "--gpu-mem", "70G", "--", *CHECKPOINTING)
        jobs += [short, long, spare]
        ran = wait_for(lambda: (j := head.job(short))["state"] in ("running", "succeeded") and j, 30,
                       what="the short job to run")
        assert ran["gpus"][0]["node"] == "node02"  # backfilled: it ends before the window
        wait_for(lambda: reason(head, long).startswith("node02:0-3 booked for deadline from "), 10,
                 what="the waiting reason")
        assert reason(head, long).endswith("(a job whose --time ends before then may use them now)")
        state_is(head, spare, "running")  # a preemptible job may use them until the window
        # The window begins: the preemptible job is stopped; the normal one still waits.
        stopped = wait_for(lambda: (j := head.job(spare))["preemptions"] == 1 and j,
                           LEAD_S + 10, what="the preemptible job to be stopped")
        assert head.job(spare)["state"] in ("running", "pending")
        state_is(head, spare, "pending", timeout=GRACE_S + 10)
        assert stopped["preemptible"]
        events = [e["message"] for e in head.call("events", kind="preempt", limit=20)["events"]]
        assert f"job {spare} preempted: booking deadline begins on its cards" in events
        wait_for(lambda: reason(head, long).startswith("node02:0-3 booked for deadline until "), 10,
                 what="the reason inside the window")
        listed = head.run("reservations", check=True).stdout
        assert "deadline" in listed and "node02:0-3" in listed and "under way" in listed
        # Someone else's booking overlapping it on a card is refused at once.
        refused = reserve(head, "--gpus", "node02:3", "--start", "now", "--duration", "1h", check=False)
        assert refused.returncode == 1 and "node02:3 is booked for deadline in that window" in refused.stderr
        # The head is killed: the booking is the store's, and holds after the restart.
        head.kill()
        head.start()
        assert [b["name"] for b in head.call("reserve", list=True)["bookings"]] == ["deadline"]
        time.sleep(4)  # a pass or more
        assert head.job(long)["state"] == "pending"
        assert reason(head, long).startswith("node02:0-3 booked for deadline until ")
        # Ending it gives the cards back at once.
        assert reserve(head, "--delete", "deadline").stdout.strip() == "Booking deadline ended"
        state_is(head, long, "running", timeout=15)
        report = json.loads(head.run("report", "--json", "--since", "1h", check=True).stdout)
        row = next(b for b in report["bookings"] if b["name"] == "deadline")
        assert row["booked_gpu_hours"] > 0 and row["used_gpu_hours"] == 0.0  # nobody's jobs
        assert "Bookings (GPU-hours booked" in head.run("report", "--since", "1h", check=True).stdout


def test_its_own_users_jobs_run_on_it_and_a_drain_is_said_at_once(head):
    reserve(head, "--gpus", "node02:2-3", "--start", "now", "--duration", "1h", "--name", "mine")
    with cancelled_after(head) as jobs:
        named = submit(head, "--reservation", "mine", "--gpu-mem", "8G", "--", "sleep", "60")
        jobs.append(named)
        placed = state_is(head, named, "running")["gpus"][0]
        assert (placed["node"], placed["index"]) in (("node02", 2), ("node02", 3))
        head.run("node", "drain", "node02", check=True)
        try:
            broken = wait_for(lambda: [b for b in head.call("reserve", list=True)["bookings"] if b["broken"]],
                              10, what="the booking to be broken")
            assert broken[0]["broken"].startswith("node02:2: ")
            lines = [e["message"] for e in head.call("events", kind="booking", limit=20)["events"]]
            assert any(line.startswith("booking mine can no longer be honoured: node02:2") for line in lines)
        finally:
            head.run("node", "resume", "node02", check=True)
        wait_for(lambda: not head.call("reserve", list=True)["bookings"][0]["broken"], 10, what="honoured again")
    refused = head.run("submit", "--reservation", "nosuch", "--", "true")
    assert refused.returncode == 1 and "no such booking" in refused.stderr
    reserve(head, "--delete", "mine")


async def test_the_tui_shows_bookings_on_the_queue_gpus_overview_and_a_cards_page(head):
    from textual.widgets import Input

    from support.tui import until
    from nebula_tui.screens.app import make_app
    from nebula_tui.screens.gpus import GpuDetailScreen, GpusScreen
    from nebula_tui.screens.queue import QueueScreen
    from nebula_tui.screens.submit import SubmitScreen
    from support.tui import SIZE, go, rows, started, text

    app = make_app(head.socket)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await started(pilot)
        reserve(head, "--gpus", "node02:1", "--start", "now", "--duration", "1h", "--name", "shown")
        reserve(head, "--gpus", "node03:0", "--start", "+2h", "--duration", "1h", "--name", "later")
        try:
            await until(pilot, lambda: "bookings: 1 under way, 1 ahead" in text(pilot, "#summary"),
                        what="the overview's count")
            await go(pilot, "3", QueueScreen)
            await until(pilot, lambda: "booked: shown node02:1 " in text(pilot, "#queue-bookings"),
                        what="the queue's bookings")
            assert "(under way)" in text(pilot, "#queue-bookings")
            assert "booked: later node03:0 " in text(pilot, "#queue-bookings")
            await go(pilot, "2", GpusScreen)
            await until(pilot, lambda: any(r[0] == "node02:1" and "booked for shown" in r[-1]
                                           for r in rows(pilot, "gpu-table").values()),
                        what="the GPU table's holder column")
            uuid = next(u for u, g in app.cluster.gpus.items() if (g["node"], g["index"]) == ("node03", 0))
            app.open_gpu(uuid)
            await until(pilot, lambda: isinstance(app.screen, GpuDetailScreen), what="the card's page")
            await until(pilot, lambda: "Booked  later node03:0 " in text(pilot, "#gpu-live"),
                        what="the card's bookings")
            # The form's preview says a job naming a booking ahead waits for it.
            await pilot.press("escape")
            await go(pilot, "n", SubmitScreen)
            app.screen.query_one("#f-command", Input).value = "sleep 1"
            app.screen.query_one("#f-reservation", Input).value = "later"
            await until(pilot, lambda: "Would wait for its booking: node03:0 booked for later from"
                        in text(pilot, "#preview"), what="the preview")
        finally:
            reserve(head, "--delete", "shown")
            reserve(head, "--delete", "later")
