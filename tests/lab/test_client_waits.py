"""A client never waits for ever on a head that stopped answering (SIGSTOP, a hung disk):
every request, ``nebula wait`` included, gives up after NEBULA_TIMEOUT seconds (30 unless
told) with one line naming the head's pid, and exits 1. The head, continued, serves on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from support.head import submit

def _run(head, *args: str, timeout_s: str = "3") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nebula_tui", *args],
                          env={**head.env, "NEBULA_TIMEOUT": timeout_s}, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.slow
def test_clients_of_a_stopped_head_give_up_in_one_line(head):
    job = submit(head, "--gpu-mem", "4G", "--", "sleep", "300")
    try:
        os.kill(head.process.pid, signal.SIGSTOP)
        try:
            for argv in (["status"], ["queue"], ["wait", str(job)], ["logs", str(job)], ["attach", str(job)],
                         ["submit", "--gpu-mem", "4G", "--", "true"]):
                done = _run(head, *argv)
                assert done.returncode == 1, (argv, done.returncode, done.stderr)
                assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
                assert f"(pid {head.process.pid}) did not answer within" in done.stderr, done.stderr
        finally:
            os.kill(head.process.pid, signal.SIGCONT)
        assert _run(head, "status").returncode == 0  # continued, it serves on
    finally:
        head.run("cancel", str(job))


def test_wait_outlasts_its_timeout_while_the_head_answers(head):
    """A job longer than the client's timeout is waited for to its end: the wait is asked
    for in steps, each answered by a head that is alive."""
    job = submit(head, "--gpu-mem", "4G", "--", "sleep", "5")
    done = _run(head, "wait", str(job), timeout_s="1")
    assert done.returncode == 0, done.stderr
    assert f"Job {job} succeeded" in done.stderr


def test_a_timeout_that_is_no_number_of_seconds_is_a_usage_error(head):
    done = _run(head, "status", timeout_s="soon")
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "NEBULA_TIMEOUT" in done.stderr, done.stderr
