"""Preemptible jobs end to end on the simulated lab (real sshd, tmux, SQLite): one runs on
idle cards, gets SIGUSR1 when a normal job needs them, is killed after the grace, requeued
and started again once they are free; the stop survives a head SIGKILL (issue 27).

node02's four A100s are the only cards a 70 GB request fits, so a preemptible job on all
four is in the way of any normal 70 GB job.
"""

from __future__ import annotations

import getpass

import pytest

from labkit.harness import wait_for
from support.labfixtures import lab_config, serving
from support.head import CHECKPOINTING, cancelled_after, state_is, submit
from support.shapes import reply_mismatches

from nebula_tui.wire import PlanView

GRACE_S = 3


@pytest.fixture(scope="module")
def head(openssh_lab, tmp_path_factory):
    path = lab_config(openssh_lab, "preemption", health={"isolation_grace": f"{GRACE_S}s"})
    yield from serving(openssh_lab, tmp_path_factory.mktemp("preemption-home"), path)


@pytest.mark.slow
def test_a_normal_job_preempts_a_preemptible_one_which_runs_again_later(head):
    me = getpass.getuser()
    with cancelled_after(head) as jobs:
        spare = submit(head, "--preemptible", "--gpu-count", "4", "--gpu-mem", "70G", "--", *CHECKPOINTING)
        jobs.append(spare)
        first = state_is(head, spare, "running")
        assert first["preemptible"] and {g["node"] for g in first["gpus"]} == {"node02"}
        assert "preemptible · " in head.run("queue", check=True).stdout
        # its trap is set (a SIGUSR1 before that would end it)
        wait_for(lambda: "ready" in head.run("logs", str(spare)).stdout, 20, what="its trap")
        urgent = submit(head, "--gpu-mem", "70G", "--", "sleep", "120")
        jobs.append(urgent)
        # Within one pass (it waits "would preempt"; 3 s apart at most), the grace and the
        # kill that frees the cards, plus the launch.
        state_is(head, urgent, "running", timeout=3 + GRACE_S + 10)
        again = head.job(spare)
        assert again["state"] == "pending"  # it needs all four
        assert again["preemptions"] == 1 and again["attempt"] == 1
        said = [e for e in head.call("events", limit=200)["events"] if e["kind"] == "preempt"]
        assert said and said[-1]["message"] == f"job {spare} preempted for job {urgent} of {me}"
        log = head.run("logs", str(spare), "--attempt", "1", check=True).stdout
        assert f"nebula: job {spare} preempted for job {urgent} of {me}: SIGUSR1 now" in log
        assert "checkpoint-on-usr1" in log
        # It waits, saying why, then runs again once the cards are free.
        assert again["reason"]
        queue = head.run("queue", check=True).stdout
        assert "preemptible, preempted 1 time · " in queue
        head.run("cancel", str(urgent), check=True)
        assert state_is(head, spare, "running", timeout=40)["attempt"] == 1


def test_an_admins_urgent_job_preempts_and_the_preemption_survives_a_head_sigkill(head):
    with cancelled_after(head) as jobs:
        spare = submit(head, "--preemptible", "--gpu-count", "4", "--gpu-mem", "70G", "--", *CHECKPOINTING)
        jobs.append(spare)
        state_is(head, spare, "running")
        urgent = submit(head, "--priority", "5", "--gpu-mem", "70G", "--", "sleep", "120")  # an admin's
        jobs.append(urgent)
        wait_for(lambda: head.job(spare)["phase"] == "stopping", 10, what="the preemption to begin")
        head.kill()  # during the grace: the stop is the store's
        head.start()
        stopping = head.job(spare)
        assert stopping["preemptions"] == 1
        state_is(head, urgent, "running", timeout=GRACE_S + 20)
        back = head.job(spare)
        assert back["state"] == "pending" and back["attempt"] == 1 and back["preemptions"] == 1
        assert back["preemptible"]


def test_the_preview_says_what_a_normal_job_would_preempt(head):
    with cancelled_after(head) as jobs:
        spare = submit(head, "--preemptible", "--gpu-count", "4", "--gpu-mem", "70G", "--", *CHECKPOINTING)
        jobs.append(spare)
        state_is(head, spare, "running")
        plan = head.call("plan", command=["true"], gpu_mem_mb=70 * 1024)
        assert plan["decision"] == "preempt" and plan["preempts"] == [spare]
        assert head.job(spare)["phase"] == "running"  # a preview preempts nobody
        waits = head.call("plan", command=["true"], gpu_mem_mb=70 * 1024, preemptible=True)
        assert waits["decision"] == "wait"  # preemptible jobs never preempt each other
        # both answers are of the shape the submit form reads (wire.PlanView)
        assert reply_mismatches(plan, PlanView, "plan") + reply_mismatches(waits, PlanView, "plan") == []


async def test_the_tui_submits_a_preemptible_job_and_shows_it_on_the_queue(head):
    from textual.widgets import Checkbox, Input

    from nebula_tui.screens.app import make_app
    from nebula_tui.screens.queue import QueueScreen
    from nebula_tui.screens.submit import SubmitScreen
    from support.tui import until
    from support.tui import SIZE, go, rows, started, text

    app = make_app(head.socket)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await started(pilot)
        await go(pilot, "n", SubmitScreen)
        form = app.screen
        form.query_one("#f-command", Input).focus()
        await pilot.press(*"sleep 60")
        form.query_one("#f-preemptible", Checkbox).value = True
        await until(pilot, lambda: "Would start now as preemptible on node0" in text(pilot, "#preview"),
                    what="the preemptible preview")
        await pilot.press("ctrl+s")
        await until(pilot, lambda: getattr(app.screen, "job_id", None), what="the job screen")
        job = app.screen.job_id
        with cancelled_after(head) as jobs:
            jobs.append(job)
            assert head.job(job)["preemptible"]
            await pilot.press("escape")
            await go(pilot, "3", QueueScreen)
            await until(pilot, lambda: any(str(job) == r[0] and "preemptible · " in r[-1]
                                           for r in rows(pilot, "queue-table").values()),
                        what="the preemptible tag on the queue")
