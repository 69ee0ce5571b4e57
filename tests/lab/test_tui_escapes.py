"""The TUI renders a job's own log as text: what needs the job's real run on the lab. A job
name or command holding ESC, BEL or a newline in the queue is ``tests/tui/test_escapes.py``'s."""

from __future__ import annotations

from support.tui import until
from support.tui import SIZE, started

from nebula_tui.screens.app import make_app


async def test_a_jobs_log_on_its_page_draws_no_escape_sequence(head):
    """The job page's log is text: the job's colours and title changes reach the terminal
    as neither (Textual's log passes ESC through to it as it is): the colours are dropped,
    the rest shown as escapes."""
    from textual.widgets import Log

    from nebula_tui.screens.job import JobScreen

    job = head.call("submit", shell=True, gpu_mem_mb=4096, command=[
        r"printf 'a\033[31mred\033[0m b\033]0;pwned\007c\n'"])["job"]["id"]
    head.wait_job(job)
    app = make_app(head.socket)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot)
        app.open_job(job)
        await until(pilot, lambda: isinstance(app.screen, JobScreen) and app.screen.query("#job-log"),
                    what="the job page")
        log = app.screen.query_one("#job-log", Log)
        await until(pilot, lambda: "red" in "\n".join(log.lines), what="the job's log")
        line = next(line for line in log.lines if "red" in line)
        assert "\x1b" not in line and "\x07" not in line, repr(line)
        assert line == "ared b\\x1b]0;pwned\\x07c"
