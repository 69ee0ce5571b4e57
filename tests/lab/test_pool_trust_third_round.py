"""The pool's third attack round (issue 41): the same real parts as the first two (the real
Slurm of ``slurm_lab`` as pool hpc, its login node's real sshd, real Unix users), against
the code after the second round's fixes. docs/security.md lists every attack tried."""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import subprocess
import time

import pytest

from labkit.harness import wait_for
from nebula_tui.config.cluster import load_config
from nebula_tui.pools.slurm import SlurmPool
from nebula_tui.store import Store
from support.head import submit
from support.labfixtures import cancel_left_and_stop
from support.poolmembers import members_pool
from support.slurmfixtures import (config, pool_line, remote_id, squeue, start_head, succeeded_and_charged,
                                  wait_state)
from support.users import submit_as

RUNUSER = "/usr/sbin/runuser"
ME = pwd.getpwuid(os.getuid()).pw_name


def pool_row(head, job: int) -> dict:
    store = Store(head.home / "state.db", readonly=True)
    try:
        return store.pool_job(job)
    finally:
        store.close()


@pytest.mark.slow
def test_a_members_key_line_answering_sbatch_with_another_members_job_id_moves_nothing_of_his(
        openssh_lab, slurm_lab, tmp_path_factory):
    """Alice's forced command runs her sbatch but answers it with Bob's running job's Slurm
    id, then answers sacct for that id: COMPLETED, 1 s, as hers. Before: the poll keyed
    every job by its Slurm id alone, so Bob's job was asked in her account (hers came
    later) and ended "succeeded" at her word while it ran on in Slurm. A Slurm id names a
    job only in its owner's account."""
    alice, bob = "nebida", "nebidb"
    lie = f"""case "$SSH_ORIGINAL_COMMAND" in
  umask*sbatch*) [ -e "$here/rid" ] && {{ sh -c "$SSH_ORIGINAL_COMMAND" >/dev/null; cat "$here/rid"; exit 0; }} ;;
  sacct*) [ -e "$here/rid" ] && {{ now=$(date +%Y-%m-%dT%H:%M:%S)
    printf '%s|COMPLETED|0:0|00:00:01|billing=1,cpu=1,gres/gpu=1,node=1|%s|%s|{alice}|normal|gpu\\n' \\
      "$(cat "$here/rid")" "$now" "$now"; exit 0; }} ;;
esac"""
    for head, public in members_pool(openssh_lab, slurm_lab, tmp_path_factory, "nebids", (alice, bob), lie):
        his = submit_as(head, bob, "--pool", "hpc", "--", "sh", "-c", "sleep 25; echo the real one")
        wait_state(head, his, {"running"})
        rid = remote_id(head, his)
        (public / "rid").write_text(rid + "\n")
        (public / "rid").chmod(0o644)
        hers = submit_as(head, alice, "--pool", "hpc", "--", "sleep", "1")
        wait_for(lambda: remote_id(head, hers), 30, what="her sbatch's answer")
        assert remote_id(head, hers) == rid  # her key line's answer, taken as hers
        time.sleep(5)  # five polls with her answer in them
        assert head.job(his)["state"] == "running", head.job(his)["reason"]
        assert any(str(j["job_id"]) == rid and j["job_state"] == "RUNNING" for j in squeue(slurm_lab))
        succeeded_and_charged(head, his, "the real one", 20)
        (public / "rid").unlink()
        assert "degraded" not in pool_line(head), pool_line(head)


def test_a_member_who_grows_her_pool_job_while_it_waits_does_not_run_it_bigger_than_sent(
        openssh_lab, slurm_lab, tmp_path_factory):
    """Bob's pool job was sent for 1 GPU on 1 node. While it waits there he holds it,
    `scontrol update`s it to 4 GPUs (Slurm lets a user change his own pending job's
    request) and releases it. Before: it ran on 4 GPUs while the head's
    books, its queue and its running charge showed 1. Now the head cancels a job whose
    request there is more than it sent, saying so."""
    alice, bob = "nebgrowa", "nebgrowb"
    env = {"PATH": "/usr/bin:/bin", "SLURM_CONF": str(slurm_lab.slurm_conf)}
    for head, _ in members_pool(openssh_lab, slurm_lab, tmp_path_factory, "nebgrow", (alice, bob), ""):
        blocker = slurm_lab.cluster.sbatch("--parsable", "--gres=gpu:4", "--nodes=4", "--wrap", "sleep 300")
        try:
            wait_for(lambda: any(str(j["job_id"]) == blocker and j["job_state"] == "RUNNING"
                                 for j in squeue(slurm_lab)), 30, what="the blocker to run")
            his = submit_as(head, bob, "--pool", "hpc", "--gpu-count", "1", "--", "sleep", "60")
            wait_for(lambda: remote_id(head, his), 30, what="his Slurm id")
            rid = remote_id(head, his)
            for words in (["hold", rid], ["update", f"jobid={rid}", "gres=gpu:4"],
                          ["release", rid]):
                done = subprocess.run([RUNUSER, "-u", bob, "--", "scontrol", *words], env=env,
                                      capture_output=True, text=True, timeout=30, cwd="/tmp")
                assert done.returncode == 0, done.stderr
        finally:
            subprocess.run(["scancel", blocker], env=slurm_lab.env, capture_output=True)
        ended = wait_state(head, his, {"cancelled", "failed", "succeeded"}, timeout=60)
        listed = next(j for j in json.loads(slurm_lab.cluster.run(["squeue", "--json", "-t", "all"]))["jobs"]
                      if str(j["job_id"]) == rid)
        assert ended["state"] == "cancelled", (ended, listed["tres_alloc_str"])
        assert "more than it was sent with" in ended["reason"], ended["reason"]


def test_a_job_name_cannot_write_a_line_into_the_accounting_a_restore_reads(slurm_lab, tmp_path):
    """A restored head finds the jobs it sent since the backup that squeue forgot in the
    account's sacct, by the ``--comment`` of their SubmitLine. A job's name is in that line
    too, and may hold \\r (the head refuses \\n only), which Python's splitlines cuts at:
    before, the name `x\\r<a sacct line of its own>` was read as another job carrying any
    token it liked (every comment is public); a name ` --comment=…` came before ours and
    was read as the job's comment. Now the lines are cut at \\n and the comment is ours."""
    path = config(slurm_lab, tmp_path / "nodes.yaml")
    head = start_head(tmp_path / "home", path)
    try:
        store = Store(head.home / "state.db", readonly=True)
        try:
            prefix = f"{store.head_token}."
        finally:
            store.close()
        forged = f"987654|COMPLETED|0:0|1||||{ME}|||--comment={prefix}1.0.f"  # --name: 128 at most
        job = submit(head, "--pool", "hpc", "--name", f"x --comment={prefix}9.9.f\r{forged}",
                     "--", "true")
        assert wait_state(head, job, {"succeeded", "failed"})["state"] == "succeeded"
        rid, token = remote_id(head, job), pool_row(head, job)["token"]
    finally:
        cancel_left_and_stop(head)
    cluster = load_config(path)
    pool = SlurmPool(cluster.pools[0], cluster)

    async def ours():
        try:
            return await pool.ours(ME, prefix, since=time.time() - 600)
        finally:
            await pool.close()

    found = {(job.slurm_id, job.comment) for job in asyncio.run(ours())}
    assert found == {(rid, token)}, found





_GARBAGE = """case "$SSH_ORIGINAL_COMMAND" in
  squeue*) [ -e "$here/squeue" ] && { echo 'not json'; exit 0; } ;;
esac"""
_SILENCE = """case "$SSH_ORIGINAL_COMMAND" in
  squeue*) [ -e "$here/squeue" ] && { sleep 8; exit 0; } ;;
esac"""


@pytest.mark.parametrize("lie, cluster, shown", [(_GARBAGE, {}, "degraded"),
                                                 (_SILENCE, {"command_timeout": "3s"}, "unreachable")],
                         ids=["garbage", "silence"])
@pytest.mark.slow
def test_one_members_trouble_when_only_she_has_jobs_there_stops_nobody_elses_burst(
        openssh_lab, slurm_lab, tmp_path_factory, request, lie, cluster, shown):
    """Alice is the only member with a job in the pool; her key line (or her ~/.bashrc) lets
    the head in, then answers squeue with what Slurm never writes, or with nothing before
    command_timeout. Before: every account polled was in trouble, so the head took it for
    the pool's: `status` said the pool degraded (or unreachable) and nothing was sent for
    anyone, so Bob's job, waiting here on drained nodes past burst_after, never went to the
    pool. A login that worked and then an odd answer, or none, is that account's trouble
    alone, however few accounts are asked."""
    word = request.node.callspec.id
    alice, bob = f"neb{word}a", f"neb{word}b"
    for head, public in members_pool(openssh_lab, slurm_lab, tmp_path_factory, f"neb{word}", (alice, bob),
                                     lie, cluster=cluster, burst_after="2s"):
        hers = submit_as(head, alice, "--pool", "hpc", "--", "sleep", "120")
        wait_state(head, hers, {"running"})
        (public / "squeue").touch()
        wait_for(lambda: f"as {alice}" in pool_line(head) or shown in pool_line(head), 30,
                 what="her answer read")
        for node in openssh_lab.nodes:
            head.run("node", "drain", node, "--reason", "test", check=True)
        his = submit_as(head, bob, "--", "sh", "-c", "echo burst")
        ended = wait_state(head, his, {"succeeded", "failed"}, timeout=60)
        assert ended["state"] == "succeeded" and ended["pool"] == "hpc", ended
        assert f"as {alice}: " in pool_line(head) and shown not in pool_line(head), pool_line(head)
        assert head.job(hers)["state"] == "running"
        (public / "squeue").unlink()
        head.run("cancel", str(hers), check=True)
