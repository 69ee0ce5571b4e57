"""The pool's second attack round (issue 41): the same real parts as ``test_pool_trust.py``
(the real Slurm of ``slurm_lab`` as pool hpc, its login node's real sshd, real Unix users),
the attacks that round one's fixes left open. docs/security.md lists every attack tried."""

from __future__ import annotations

import json
import re
import subprocess
import time

import pytest

from support.labfixtures import cancel_left_and_stop
from labkit.harness import wait_for
from support.poolmembers import members_pool, sent_with_token_of
from support.users import submit_as
from support.slurmfixtures import config, pool_line, requeued_once, start_head, wait_state


@pytest.mark.slow
def test_one_members_key_line_answering_garbage_stops_nobody_elses_pool_jobs(
        openssh_lab, slurm_lab, tmp_path_factory):
    """Alice's forced command answers sinfo with a cluster of 0-GPU nodes, then squeue with
    200,000-deep JSON. Before: the capacity read in her account (the first sorted) refused
    Bob's `--gpu-count 1` at submit, and her answer made the whole pool degraded, Bob's
    running job frozen and nothing sent for anyone. Now each is her account's alone."""
    alice, bob = "nebgarba", "nebgarbb"  # alice's account sorts first: the old poller
    lie = """case "$SSH_ORIGINAL_COMMAND" in
  sinfo\\ -h*) [ -e "$here/sinfo" ] && { echo 'x|gpu:0|idle|gpu|gpu:0|'; exit 0; } ;;
  squeue*) [ -e "$here/squeue" ] && { printf '{"jobs":'; head -c 200000 /dev/zero | tr '\\0' '['; exit 0; } ;;
esac"""
    for head, public in members_pool(openssh_lab, slurm_lab, tmp_path_factory, "nebgarbage",
                                      (alice, bob), lie):
        hers = submit_as(head, alice, "--pool", "hpc", "--", "sleep", "120")
        his = submit_as(head, bob, "--pool", "hpc", "--", "sleep", "15")
        wait_state(head, hers, {"running"})
        wait_state(head, his, {"running"})
        (public / "sinfo").touch()
        time.sleep(4)  # four polls with her sinfo in them
        later = submit_as(head, bob, "--pool", "hpc", "--gpu-count", "1", "--", "echo", "sent")
        (public / "squeue").touch()
        for job in (his, later):
            ended = wait_state(head, job, {"succeeded", "failed"}, timeout=90)
            assert ended["state"] == "succeeded", ended["reason"]
        line = pool_line(head)
        assert f"as {alice}: " in line and "nests deeper" in line and "degraded" not in line, line
        assert head.job(hers)["state"] == "running"  # hers: left as it is, not ended
        (public / "squeue").unlink()
        wait_for(lambda: f"as {alice}" not in pool_line(head), 30, what="her account answering again")
        head.run("cancel", str(hers), check=True)


@pytest.mark.slow
def test_a_job_that_requeues_itself_is_charged_for_every_run(slurm_lab, tmp_path):
    """The job runs 8 s and requeues itself (`scontrol requeue`, its owner may); its owner
    lifts the BeginTime Slurm gives a requeued job (`scontrol update StartTime=now`) and it
    runs again, all between two polls. Slurm's accounting of the job id (`sacct -X`) has the
    last run alone; the runs before it are its duplicates (`-D`). Before, the head charged
    the last run only (the 8 s were free); now every run."""
    head = start_head(tmp_path / "home", config(slurm_lab, tmp_path / "nodes.yaml", poll_interval="45s"))
    try:
        job, rid = requeued_once(head, slurm_lab, tmp_path, "echo second run")
        lifted = subprocess.run(["scontrol", "update", f"jobid={rid}", "StartTime=now"],
                                env=slurm_lab.env, capture_output=True, text=True, timeout=30)
        assert lifted.returncode == 0, lifted.stderr
        ended = wait_state(head, job, {"succeeded", "failed"}, timeout=120)
        assert ended["state"] == "succeeded", ended["reason"]
        runs = subprocess.run(["sacct", "-X", "-D", "-n", "-P", "-j", rid, "-o",
                               "State,AllocTRES,ElapsedRaw"], env=slurm_lab.env, capture_output=True,
                              text=True, timeout=30).stdout.strip().splitlines()
        assert len(runs) >= 2, runs  # the requeued run, then the last one
        held = sum(int(re.search(r"gres/gpu=(\d+)", tres).group(1)) * int(elapsed)
                   for _, tres, elapsed in (line.split("|") for line in runs))
        assert held >= 8
        mine = next(j for j in json.loads(head.run("history", "--json", check=True).stdout)
                    if j["id"] == job)
        assert mine["gpu_hours"] == pytest.approx(held / 3600, rel=0.05, abs=2 / 3600), (mine, runs)
    finally:
        cancel_left_and_stop(head)


@pytest.mark.slow
def test_one_members_garbage_at_a_restore_holds_nobody_elses_jobs(openssh_lab, slurm_lab, tmp_path_factory):
    """A restore asks each member's account which jobs carry this head's tokens before it
    sends any. Alice's key line answers squeue with 200,000-deep JSON then. Before: the
    whole pool stayed degraded, nothing adopted or sent for anyone, Bob's job sent after
    the backup waiting for ever. Now Bob's is adopted (sent once) and ends; Alice's waits,
    unsent, until her account answers as Slurm does."""
    alice, bob = "nebresta", "nebrestb"  # alice's account sorts first
    lie = """case "$SSH_ORIGINAL_COMMAND" in
  squeue*) [ -e "$here/squeue" ] && { printf '{"jobs":'; head -c 200000 /dev/zero | tr '\\0' '['; exit 0; } ;;
esac"""
    for head, public in members_pool(openssh_lab, slurm_lab, tmp_path_factory, "nebrestore",
                                      (alice, bob), lie, max_jobs=1):
        blocker = submit_as(head, bob, "--pool", "hpc", "--", "sleep", "300")
        wait_state(head, blocker, {"running"})
        later = submit_as(head, bob, "--pool", "hpc", "--", "sh", "-c", "sleep 10; echo once")
        hers = submit_as(head, alice, "--pool", "hpc", "--", "echo", "hers")
        wait_for(lambda: "waiting for room" in head.job(hers)["reason"], 20, what="no room")
        backup = head.run("backup", check=True).stdout.split()[2]
        head.run("cancel", str(blocker), check=True)
        wait_state(head, later, {"running"})
        head.stop()
        (public / "squeue").touch()
        head.run("backup", "--restore", backup, check=True)
        head.start()
        ended = wait_state(head, later, {"succeeded", "failed"}, timeout=90)
        assert ended["state"] == "succeeded", ended["reason"]
        assert "once" in head.run("logs", str(later), check=True).stdout
        sent = sent_with_token_of(head, slurm_lab, later)
        said = [e["message"] for e in head.call("events", limit=200)["events"]]
        assert len(sent) == 1, ([(j["job_id"], j["job_state"]) for j in sent], said)  # adopted, not sent again
        assert head.job(hers)["state"] == "pending"
        assert f"as {alice}: " in pool_line(head), pool_line(head)
        (public / "squeue").unlink()  # asked again when its backoff is over (15 s, 30 s, …)
        assert wait_state(head, hers, {"succeeded", "failed"}, timeout=150)["state"] == "succeeded"



def test_a_members_key_line_cannot_give_her_job_a_hundred_thousand_nodes(
        openssh_lab, slurm_lab, tmp_path_factory):
    """Her forced command lists her one-node job on `x[1-99999]`. Before: the head took
    99,999 placements for it (a row each, in every `queue` answer to everyone). A job runs
    on at most the nodes it asked for."""
    alice, bob = "nebnodea", "nebnodeb"
    lie = """case "$SSH_ORIGINAL_COMMAND" in
  squeue*) sh -c "$SSH_ORIGINAL_COMMAND" | python3 -c 'import json, sys
d = json.load(sys.stdin)
for j in d["jobs"]:
    if j.get("job_state") == "RUNNING":
        j["nodes"] = "x[1-99999]"
print(json.dumps(d))'; exit 0 ;;
esac"""
    for head, _ in members_pool(openssh_lab, slurm_lab, tmp_path_factory, "nebnodes", (alice, bob), lie):
        hers = submit_as(head, alice, "--pool", "hpc", "--", "sleep", "20")
        wait_state(head, hers, {"running"})
        assert len(head.job(hers)["gpus"]) == 1, len(head.job(hers)["gpus"])
        head.run("cancel", str(hers), check=True)


@pytest.mark.slow
def test_a_job_whose_owners_login_is_refused_at_a_restore_is_not_sent_twice(
        openssh_lab, slurm_lab, tmp_path_factory):
    """Bob's job went to the pool after the backup; when the restored head starts, his
    account refuses its key (he took the line out for a while). Before: his account was
    skipped, the restore counted done, and once his login worked again his job was sent a
    second time. Now his account is asked for this head's jobs first, and his is adopted."""
    alice, bob = "nebrefa", "nebrefb"
    for head, _ in members_pool(openssh_lab, slurm_lab, tmp_path_factory, "nebrefused", (alice, bob),
                                 "", max_jobs=1):
        blocker = submit_as(head, bob, "--pool", "hpc", "--", "sleep", "300")
        wait_state(head, blocker, {"running"})
        later = submit_as(head, bob, "--pool", "hpc", "--", "sh", "-c", "sleep 5; echo once")
        wait_for(lambda: "waiting for room" in head.job(later)["reason"], 20, what="no room")
        backup = head.run("backup", check=True).stdout.split()[2]
        head.run("cancel", str(blocker), check=True)
        wait_state(head, later, {"running"})
        head.stop()
        line = (slurm_lab.login_dir / "keys" / bob).read_text()
        slurm_lab.revoke(bob)
        head.run("backup", "--restore", backup, check=True)
        head.start()
        time.sleep(5)  # refused, and waiting out its backoff
        slurm_lab.authorize(bob, line)
        ended = wait_state(head, later, {"succeeded", "failed"}, timeout=150)
        assert ended["state"] == "succeeded", ended["reason"]
        sent = sent_with_token_of(head, slurm_lab, later)
        assert len(sent) == 1, [(j["job_id"], j["job_state"]) for j in sent]
