"""The TUI renders other users' text as text: a job name or command holding ESC, BEL or a
newline shows as escapes in the queue, never reaching the terminal as control codes (the
head in the test's own loop, ``inprocess``). A job's own log, which needs its node's real
run, is ``tests/lab/test_tui_escapes.py``'s."""

from __future__ import annotations

import getpass

from support.tui import SIZE, go, rows, until

from nebula_tui.model import JobSpec, Placement
from nebula_tui.screens.app import make_app
from nebula_tui.screens.queue import QueueScreen

ME = getpass.getuser()


async def test_control_characters_in_a_job_show_as_escapes_in_the_queue(engine, served):
    # It waits for a running job (a request no card could serve is refused at submit).
    blocker = engine.submit(ME, JobSpec(command=("sleep", "600"), gpu_mem_mb=4096)).id
    engine.transitions.begin_launch(engine.jobs[blocker], (Placement("GPU-node01-0", "node01", 0, 4096, False),))
    engine.transitions.mark_running(engine.jobs[blocker])
    job = engine.submit(ME, JobSpec(name="t\x1b]0;pwned\x07", after=(blocker,),
                                    command=("echo", "\x1b[2J\nfake line"))).id
    app = make_app(served)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: len(app.cluster.gpus) == 4 and app.cluster.connected, what="the snapshot")
        await go(pilot, "3", QueueScreen)
        await until(pilot, lambda: str(job) in rows(pilot, "queue-table"), what="the job")
        row = " ".join(rows(pilot, "queue-table")[str(job)])
        assert "\\x1b]0;pwned\\x07" in row
        assert not any(c in row for c in "\x1b\x07\n")
