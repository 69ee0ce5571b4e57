"""The pool's fourth attack round (issue 41): the same real parts as the first three (the real
Slurm of ``slurm_lab`` as pool hpc, its login node's real sshd, real Unix users), against
the code after the third round's fixes. docs/security.md lists every attack tried."""

from __future__ import annotations

import subprocess
import time

import pytest

from labkit.harness import wait_for
from nebula_tui.pools.slurm import MAX_OUTPUT
from support.head import submit
from support.labfixtures import cancel_left_and_stop
from support.poolmembers import members_pool
from support.slurmfixtures import config, min_job_age, pool_line, start_head, succeeded_and_charged, wait_state
from support.users import quiet, submit_as

RUNUSER = "/usr/sbin/runuser"
OUTSIDER = "nebflood41"


def _queue_bytes(slurm_lab) -> int:
    return len(slurm_lab.cluster.run(["squeue", "--json"]))


@pytest.mark.slow
def test_another_cluster_users_long_queue_blinds_no_pool_poll(slurm_lab, tmp_path):
    """An outsider with a cluster account fills the queue with held jobs whose fields are as
    long as Slurm allows (a 1,024-character name and comment, 4,000-character output paths):
    a few hundred of them, far under Slurm's MaxJobCount (a busy cluster's queue is as
    long). 22.05's `squeue --json` lists every user's jobs whatever -u says. Before: the
    answer passed MAX_OUTPUT, so every poll of ours was "degraded": a job sent then ran and
    ended in Slurm while the head showed it pending, uncharged, until the outsider let go.
    Others' lines are read, as they come, and dropped: they count against no bound of ours."""
    quiet("useradd", "-m", OUTSIDER)
    env = {"PATH": "/usr/bin:/bin", "SLURM_CONF": str(slurm_lab.slurm_conf)}
    long_path = "/tmp/" + "o" * 4000
    flood = (f"for i in $(seq 100); do sbatch --parsable --hold --job-name={'n' * 1024} "
             f"--comment={'c' * 1024} --output={long_path} --error={long_path}e --chdir=/tmp "
             "--wrap 'exit 0' >/dev/null || exit 1; done")
    head = start_head(tmp_path / "home", config(slurm_lab, tmp_path / "nodes.yaml"))
    try:
        started = time.monotonic()
        while _queue_bytes(slurm_lab) <= MAX_OUTPUT + (1 << 20):
            done = subprocess.run([RUNUSER, "-u", OUTSIDER, "--", "sh", "-c", flood], env=env,
                                  capture_output=True, text=True, timeout=300, cwd="/tmp")
            assert done.returncode == 0, done.stderr[-500:]
            assert time.monotonic() - started < 400, "the queue never grew past MAX_OUTPUT"
        job = submit(head, "--pool", "hpc", "--", "sh", "-c", "sleep 8; echo the real one")
        succeeded_and_charged(head, job, "the real one", 6)
        assert "degraded" not in pool_line(head), pool_line(head)
    finally:
        subprocess.run(["scancel", "-u", OUTSIDER], env=slurm_lab.env, capture_output=True)
        with min_job_age(slurm_lab, 2):  # the cancelled records gone before the next test
            wait_for(lambda: _queue_bytes(slurm_lab) < 1 << 20, 90, what="the outsider's jobs gone")
        cancel_left_and_stop(head)
        quiet("userdel", "-r", OUTSIDER)


@pytest.mark.slow
def test_one_member_cannot_keep_every_place_in_the_pool(openssh_lab, slurm_lab, tmp_path_factory):
    """Alice sends as many pool jobs as the pool's max_jobs (2) and keeps them there (long,
    or held by her own `scontrol hold`: uncharged while they wait). Before: Bob's `--pool
    hpc` job waited "for room" for as long as she liked. Now one lab user holds at most
    max_jobs_per_user of the places, half of them by default where several members send
    there: her second job waits here, saying why, and his goes."""
    alice, bob = "nebcapa", "nebcapb"
    for head, _ in members_pool(openssh_lab, slurm_lab, tmp_path_factory, "nebcap", (alice, bob), "",
                                max_jobs=2):
        hers = [submit_as(head, alice, "--pool", "hpc", "--", "sleep", "120") for _ in range(2)]
        wait_state(head, hers[0], {"running"})
        his = submit_as(head, bob, "--pool", "hpc", "--", "sh", "-c", "echo his turn")
        ended = wait_state(head, his, {"succeeded", "failed"}, timeout=60)
        assert ended["state"] == "succeeded" and ended["pool"] == "hpc", ended
        second = head.job(hers[1])
        assert second["state"] == "pending" and "max_jobs_per_user 1" in second["reason"], second
        for job in hers:
            head.run("cancel", str(job), check=True)
