"""A job's log, whole and bounded, end to end on the simulated lab (real sshd, tmux, the
nodelet): ``nebula logs JOB`` without ``-f`` prints all of it (it stopped at 64 KB), and a
job that writes without end meets ``limits.log_max`` — its log cut with a line saying so,
the job running on to its own end."""

from __future__ import annotations

import pytest

from support.labfixtures import lab_config, serving
from support.head import log, submit


@pytest.fixture(scope="module")
def head(openssh_lab, tmp_path_factory):
    """A head whose jobs' logs are capped at 1 MiB."""
    path = lab_config(openssh_lab, "logs", limits={"log_max": "1M"})
    yield from serving(openssh_lab, tmp_path_factory.mktemp("logs-home"), path)


def submit_slice(head, *args: str) -> int:
    """``nebula submit --gpu-mem 4G ARGS``: a slice, so that the module's jobs share a card."""
    return submit(head, "--gpu-mem", "4G", *args)


def test_logs_without_follow_prints_the_whole_log(head):
    job = submit_slice(head, "--", "seq", "1", "100000")  # 588,895 bytes: nine replies' worth
    assert head.wait_job(job, timeout=60)["state"] == "succeeded"
    done = head.run("logs", str(job), check=True)
    assert done.stdout == "".join(f"{i}\n" for i in range(1, 100001))
    ranked = head.run("logs", str(job), "--rank", "0", check=True)
    assert ranked.stdout == done.stdout


def test_a_log_past_limits_log_max_is_cut_with_a_line_and_the_job_runs_on(head):
    # its last write must reach its terminal, or it exits 3 (or dies of SIGPIPE: 141)
    writes = "head -c 3000000 /dev/zero | tr '\\0' x; echo; echo written-after-the-cap || exit 3"
    job = submit_slice(head, "--command", writes)
    ended = head.wait_job(job, timeout=60)
    assert ended["state"] == "succeeded" and ended["exit_code"] == 0, ended
    text = log(head, job)
    kept, cut, rest = text.partition("\nnebula: the log is cut here, at 1 MiB (limits.log_max)")
    assert kept == "x" * (1 << 20), len(kept)
    assert cut and f"job {job} runs on" in rest and rest.count("\n") == 1, rest
    assert "written-after-the-cap" not in text
