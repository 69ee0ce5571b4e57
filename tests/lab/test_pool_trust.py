"""A pool that trusts nothing the cluster prints (issue 41): a real head polls the real Slurm
of ``slurm_lab`` over its login node's real sshd, while real Unix users on the cluster try
what a hostile one would — forge a job's end with its token, rewrite its comment, flood the
poll, read another's command — and a restore never runs a pool job twice."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import re
import shutil
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import asyncssh
import pytest

from support.labfixtures import cancel_left_and_stop
from labkit.harness import HeadProcess, wait_for
from nebula_tui.store import Store
from support.head import submit
from support.slurmfixtures import (POLL, config, min_job_age, pool_line, remote_id, squeue, start_head,
                                  wait_state)

ME = pwd.getpwuid(os.getuid()).pw_name
FORGER = "nebforger"
RUNUSER = "/usr/sbin/runuser"


def pool_row(head: HeadProcess, job: int) -> dict:
    store = Store(head.home / "state.db", readonly=True)
    try:
        return store.pool_job(job)
    finally:
        store.close()


@pytest.fixture(scope="module")
def forced(slurm_lab, tmp_path_factory):
    """A key of this process's user whose line on the login node runs every command through
    a script that answers squeue as ``mode`` says (nothing: the real squeue)."""
    root = tmp_path_factory.mktemp("forced")
    root.chmod(0o755)
    key = asyncssh.generate_private_key("ssh-ed25519", comment="nebula-trust-test")
    (root / "id").write_bytes(key.export_private_key())
    (root / "id").chmod(0o600)
    mode = root / "mode"
    script = root / "answer.sh"
    script.write_text(f"""#!/bin/sh
case "$SSH_ORIGINAL_COMMAND" in
  squeue*)
    case "$(cat {mode} 2>/dev/null)" in
      big) head -c 300000000 /dev/zero | tr '\\0' ' '; exit 0 ;;
      deep) printf '{{"jobs":'; head -c 200000 /dev/zero | tr '\\0' '['; exit 0 ;;
    esac ;;
esac
exec sh -c "$SSH_ORIGINAL_COMMAND"
""")
    script.chmod(0o755)
    slurm_lab.authorize(ME, f'command="{script}" {key.export_public_key().decode().strip()}')
    return root


@contextlib.contextmanager
def partition(slurm_lab, name: str, *settings: str):
    """A partition of every node of the lab, added for one test (skipped where scontrol
    cannot add one), deleted after."""
    made = subprocess.run(["scontrol", "create", f"PartitionName={name}", "Nodes=ALL", *settings],
                          env=slurm_lab.env, capture_output=True, text=True)
    if made.returncode != 0 and "already exists" not in made.stdout + made.stderr:
        pytest.skip(f"scontrol cannot add a partition here: {made.stderr.strip()}")
    try:
        yield
    finally:
        subprocess.run(["scontrol", "delete", f"PartitionName={name}"], env=slurm_lab.env,
                       capture_output=True)


@pytest.fixture(scope="module")
def head(slurm_lab, forced, tmp_path_factory):
    home = tmp_path_factory.mktemp("trusthead")
    started = start_head(home, config(slurm_lab, home / "nodes.yaml", identity=str(forced / "id")))
    try:
        yield started
    finally:
        (forced / "mode").unlink(missing_ok=True)
        cancel_left_and_stop(started)


@pytest.fixture(scope="module")
def forger():
    from support.users import quiet

    quiet("useradd", "-m", FORGER)
    try:
        yield FORGER
    finally:
        quiet("userdel", "-r", FORGER)


@pytest.mark.slow
def test_another_cluster_user_cannot_forge_a_jobs_end_with_its_token(head, slurm_lab, forger):
    """Anyone can read a job's comment (squeue -o %k) and give their own job the same one;
    22.05's squeue --json lists it to every user whatever -u says."""
    job = submit(head, "--pool", "hpc", "--", "sh", "-c", "sleep 12; echo the real one")
    wait_state(head, job, {"running"})
    token = pool_row(head, job)["token"]
    env = {"PATH": "/usr/bin:/bin", "SLURM_CONF": str(slurm_lab.slurm_conf)}
    done = subprocess.run([RUNUSER, "-u", forger, "--", "sbatch", "--parsable", f"--comment={token}",
                           "--gres=gpu:1", "--output=/dev/null", "--chdir=/tmp", "--wrap", "exit 0"],
                          env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    forged = done.stdout.strip()
    wait_for(lambda: any(str(j["job_id"]) == forged and j["job_state"] == "COMPLETED"
                         for j in squeue(slurm_lab)), 30, what="the forged job to end")
    time.sleep(3)  # three polls see it ended
    assert head.job(job)["state"] == "running", head.job(job)["reason"]
    ended = wait_state(head, job, {"succeeded", "failed"}, timeout=60)
    assert ended["state"] == "succeeded", ended["reason"]
    assert "the real one" in head.run("logs", str(job), check=True).stdout


def test_a_job_that_rewrites_its_comment_stays_on_the_books(head):
    job = submit(head, "--pool", "hpc", "--", "sh", "-c",
                 'scontrol update jobid="$SLURM_JOB_ID" comment=gone; sleep 8; echo stayed')
    ended = wait_state(head, job, {"succeeded", "failed"}, timeout=90)
    assert ended["state"] == "succeeded", ended["reason"]
    events = [e["message"] for e in head.call("events", job=job)["events"]]
    assert any("rewrote its comment" in m for m in events), events
    mine = next(j for j in json.loads(head.run("history", "--json", check=True).stdout)
                if j["id"] == job)
    assert mine["gpu_hours"] >= 8 / 3600 - 1e-9  # Slurm's elapsed time, all of it


def _peak_kb(head: HeadProcess) -> int:
    status = Path(f"/proc/{head.process.pid}/status").read_text()
    return int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1))


@pytest.mark.parametrize("mode,says", [("deep", "nests deeper"), ("big", "more than 8192 KiB")])
def test_a_malformed_or_huge_answer_degrades_the_pool_and_ends_no_job(head, forced, mode, says):
    job = submit(head, "--pool", "hpc", "--", "sleep", "60")
    wait_state(head, job, {"running"})
    before = _peak_kb(head)
    (forced / "mode").write_text(mode)
    try:
        wait_for(lambda: "degraded since" in pool_line(head), 30, what="the pool shown degraded")
        line = head.run("status", check=True).stdout
        assert "its jobs left as they are" in line and says in line, line
        time.sleep(3)
        assert head.job(job)["state"] == "running"
        # Read with a bound while reading: the 300 MB answer never was in the head.
        assert _peak_kb(head) - before < 64 * 1024, (before, _peak_kb(head))
    finally:
        (forced / "mode").unlink(missing_ok=True)
    wait_for(lambda: "degraded" not in pool_line(head), 30, what="the pool healthy again")
    head.run("cancel", str(job), check=True)


def test_the_command_is_on_no_command_line_and_the_output_is_private(head):
    marker = f"nebula-secret-{os.getpid()}"
    job = submit(head, "--pool", "hpc", "--command", f"sleep 6; echo {marker} >/dev/null")
    wait_state(head, job, {"running"})
    time.sleep(1)
    args = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert marker not in args, [line for line in args.splitlines() if marker in line]
    log = Path(pool_row(head, job)["log_path"])
    assert stat.S_IMODE(log.stat().st_mode) == 0o600
    assert stat.S_IMODE(log.parent.stat().st_mode) == 0o700
    assert wait_state(head, job, {"succeeded", "failed"})["state"] == "succeeded"


def test_a_job_that_turns_its_output_into_a_fifo_holds_no_log_read(head):
    """The job replaces its output file with a FIFO (its own account may): a log read does
    not wait on it until the timeout, holding the account's connection; it says nothing."""
    job = submit(head, "--pool", "hpc", "--command",
                 'out=$(scontrol show job "$SLURM_JOB_ID" | sed -n "s/.*StdOut=//p"); echo before; '
                 'rm -f "$out"; mkfifo -m 600 "$out"; sleep 60')
    wait_state(head, job, {"running"})
    path = Path(pool_row(head, job)["log_path"])
    wait_for(lambda: path.exists() and stat.S_ISFIFO(path.stat().st_mode), 30, what="the FIFO")
    try:
        read = head.run("logs", str(job))
        assert read.returncode == 0, read.stderr
        assert head.call("status")["pools"][0]["reachable"]
    finally:
        head.run("cancel", str(job))
        wait_state(head, job, {"cancelled", "failed", "succeeded"})


def test_preemptible_without_a_scavenger_qos_is_refused(head):
    done = head.run("submit", "--pool", "hpc", "--preemptible", "--", "true")
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "names no scavenger QOS" in done.stderr


def test_preemptible_runs_in_the_scavenger_partition(slurm_lab, tmp_path):
    with partition(slurm_lab, "nebscav"):
        head = start_head(tmp_path / "home", config(slurm_lab, tmp_path / "nodes.yaml",
                                                    scavenger_partition="nebscav"))
        _scavenger_partition_used(head, slurm_lab)


def test_a_preemptible_job_its_owner_moves_off_the_scavenger_partition_is_charged_in_full(slurm_lab, tmp_path):
    """While her preemptible job waits in the (down) scavenger partition, its owner moves it
    to the normal one with scontrol, where it runs as a normal job: it is charged in full
    (Slurm's elapsed time × the GPUs it held), not at the scavenger's quarter."""
    with partition(slurm_lab, "nebscav", "State=DOWN"):
        head = start_head(tmp_path / "home", config(slurm_lab, tmp_path / "nodes.yaml",
                                                    scavenger_partition="nebscav"))
        try:
            job = submit(head, "--pool", "hpc", "--preemptible", "--", "sleep", "6")
            wait_for(lambda: "PartitionDown" in head.job(job)["reason"], 30, what="it waits there")
            moved = subprocess.run(["scontrol", "update", f"jobid={remote_id(head, job)}", "partition=gpu"],
                                   env=slurm_lab.env, capture_output=True, text=True, timeout=30)
            assert moved.returncode == 0, moved.stderr
            _charged_what_was_allocated_for(head, slurm_lab, job)
            said = [e["message"] for e in head.call("events", job=job)["events"]]
            assert any("partition gpu, not its scavenger one: charged as a normal job" in m for m in said), said
            assert not head.job(job)["preemptible"]
        finally:
            cancel_left_and_stop(head)


def _scavenger_partition_used(head: HeadProcess, slurm_lab) -> None:
    try:
        normal = submit(head, "--pool", "hpc", "--", "true")
        cheap = submit(head, "--pool", "hpc", "--preemptible", "--", "true")
        for job in (normal, cheap):
            assert wait_state(head, job, {"succeeded", "failed"})["state"] == "succeeded"
        ids = {int(remote_id(head, job)): job for job in (normal, cheap)}
        where = {ids[j["job_id"]]: j["partition"] for j in squeue(slurm_lab) if j["job_id"] in ids}
        assert where == {normal: "gpu", cheap: "nebscav"}, where
    finally:
        cancel_left_and_stop(head)


def test_no_login_as_an_account_nobody_authorised(slurm_lab, tmp_path):
    """A submitter pool with no job there: the head has no account to poll with, and does
    not try its own (10 failed logins per 20 s before)."""
    head = HeadProcess(tmp_path / "home", None, config=config(
        slurm_lab, tmp_path / "nodes.yaml", user="submitter", identity=None, workdir="~/nebula"))
    log = slurm_lab.login_dir / "sshd.log"
    seen = log.read_text(errors="replace").count(f"authenticating user {ME} ")
    head.start(wait_nodes=False)
    try:
        time.sleep(6)  # six poll intervals
        assert "not polled: no member's job there yet" in pool_line(head)
    finally:
        head.stop()
    tried = log.read_text(errors="replace").count(f"authenticating user {ME} ")
    assert tried == seen, log.read_text(errors="replace")[-2000:]


def _backup_then_send(head: HeadProcess, home: Path, command: str) -> tuple[int, Path, str]:
    """A job waiting for room in the pool (max_jobs 1) when the backup is made, sent there
    after it: (the job, the backup, this head's token prefix)."""
    blocker = submit(head, "--pool", "hpc", "--", "sleep", "300")
    wait_state(head, blocker, {"running"})
    later = submit(head, "--pool", "hpc", "--", "sh", "-c", command)
    wait_for(lambda: "waiting for room" in head.job(later)["reason"], 20, what="no room")
    backup = Path(head.run("backup", check=True).stdout.split()[2])
    head.run("cancel", str(blocker), check=True)
    store = Store(home / "state.db", readonly=True)
    try:
        return later, backup, store.head_token
    finally:
        store.close()


@contextlib.contextmanager
def _restored(head: HeadProcess, backup: Path, cfg: Path, later: int):
    """``backup`` restored into the stopped ``head``'s home and a head started on it, once
    ``later`` has ended there, succeeded."""
    head.run("backup", "--restore", str(backup), check=True)
    restored = HeadProcess(head.home, None, config=cfg)
    restored.start(wait_nodes=False)
    try:
        ended = wait_state(restored, later, {"succeeded", "failed"}, timeout=90)
        assert ended["state"] == "succeeded", ended["reason"]
        yield restored
    finally:
        cancel_left_and_stop(restored)


@pytest.mark.slow
def test_a_pool_job_sent_after_a_backup_is_not_sent_again_after_restoring_it(slurm_lab, tmp_path):
    """The backup knows the job as waiting (for room in the pool); it went to Slurm after
    the backup. The restored head finds it there by its token and adopts it."""
    home = tmp_path / "home"
    cfg = config(slurm_lab, tmp_path / "nodes.yaml", max_jobs=1)
    head = start_head(home, cfg)
    try:
        later, backup, head_token = _backup_then_send(head, home, "sleep 15; echo once")
        wait_state(head, later, {"running"})
    finally:
        head.stop()
    with _restored(head, backup, cfg, later) as restored:
        sent = [j for j in squeue(slurm_lab)
                if str(j.get("comment", "")).startswith(f"{head_token}.{later}.")]
        assert len(sent) == 1, sent
        assert "once" in restored.run("logs", str(later), check=True).stdout


@pytest.mark.slow
def test_one_members_account_cannot_decide_anothers_jobs(openssh_lab, slurm_lab, tmp_path_factory):
    """Alice's key line runs a forced command that says Bob's jobs ended, 1,800 days long.
    Bob's jobs are asked in Bob's account: what Alice's prints moves nothing of his."""
    from support.users import as_user, lab_users, shared_head

    from nebula_tui.sim.slurmlab import unlock_for_ssh

    alice, bob = "nebowna", "nebownb"  # alice's account sorts first: the old poller
    public = Path(tempfile.mkdtemp(prefix="nebula-lies-"))  # pytest's own is root's alone
    public.chmod(0o755)
    lie = public / "lie.sh"
    lie.write_text(f"""#!/bin/sh
case "$SSH_ORIGINAL_COMMAND" in
  sacct*)
    ids=$(printf '%s' "$SSH_ORIGINAL_COMMAND" | sed -n "s/.* -j '*\\([0-9,]*\\).*/\\1/p")
    for id in $(printf '%s' "$ids" | tr , ' '); do
      echo "$id|COMPLETED|0:0|1800-00:00:00|billing=1,cpu=1,gres/gpu=1,node=1|||{bob}||"
    done ;;
  squeue*)
    sh -c "$SSH_ORIGINAL_COMMAND" | python3 -c 'import json, sys
d = json.load(sys.stdin)
for j in d["jobs"]:
    if j.get("user_name") == "{bob}":
        j["job_state"] = "COMPLETED"
print(json.dumps(d))' ;;
  *) exec sh -c "$SSH_ORIGINAL_COMMAND" ;;
esac
""")
    lie.chmod(0o755)
    entry = slurm_lab.pool_entry("hpc", user="submitter", known_hosts=str(slurm_lab.known_hosts_path),
                                 poll_interval=POLL)
    for _ in lab_users("nebowners", (alice, bob), ()):
        for user in (alice, bob):
            unlock_for_ssh(user)
        for head in shared_head(openssh_lab, tmp_path_factory, "nebowners", {"pools": [entry]}):
            key = (head.home / "pool_key.pub").read_text().strip()
            slurm_lab.authorize(alice, f'from="127.0.0.1",restrict,command="{lie}" {key}')
            slurm_lab.authorize(bob, f'from="127.0.0.1",restrict {key}')
            jobs = {}
            for user in (alice, bob):
                done = as_user(head, user, "submit", "--pool", "hpc", "--", "sleep", "12")
                assert done.returncode == 0, done.stderr
                jobs[user] = int(re.search(r"job (\d+)", done.stdout).group(1))
            wait_state(head, jobs[bob], {"running"})
            time.sleep(4)  # four polls, each with Alice's lies in them
            assert head.job(jobs[bob])["state"] == "running", head.job(jobs[bob])["reason"]
            ended = wait_state(head, jobs[bob], {"succeeded", "failed"}, timeout=90)
            assert ended["state"] == "succeeded", ended["reason"]
            mine = next(j for j in json.loads(head.run("history", "--json", check=True).stdout)
                        if j["id"] == jobs[bob])
            assert mine["gpu_hours"] < 0.1, mine
            # Alice's forced command ran all along: her own job went through it.
            assert wait_state(head, jobs[alice], {"succeeded", "failed"})["state"] == "succeeded"
            slurm_lab.revoke(alice)
            slurm_lab.revoke(bob)
    shutil.rmtree(public, ignore_errors=True)


def test_a_pool_job_is_charged_the_gpus_slurms_accounting_allocated(slurm_lab, tmp_path):
    """A partition that gives whole nodes (OverSubscribe=EXCLUSIVE): the job asks 1 GPU,
    Slurm allocates and accounts every GPU of the node (AllocTRES); that is what it held
    and what it is charged, over Slurm's elapsed time."""
    with partition(slurm_lab, "nebwhole", "OverSubscribe=EXCLUSIVE"):
        head = start_head(tmp_path / "home", config(slurm_lab, tmp_path / "nodes.yaml",
                                                    partition="nebwhole"))
        _charged_what_was_allocated(head, slurm_lab)


def _charged_what_was_allocated(head: HeadProcess, slurm_lab) -> None:
    try:
        job = submit(head, "--pool", "hpc", "--gpu-count", "1", "--", "sleep", "6")
        assert _charged_what_was_allocated_for(head, slurm_lab, job) > 1  # the whole node's
    finally:
        cancel_left_and_stop(head)


def _charged_what_was_allocated_for(head: HeadProcess, slurm_lab, job: int) -> int:
    """Once ``job`` ended: it was charged Slurm's elapsed time × the GPUs its accounting
    says it held, in full; those GPUs."""
    assert wait_state(head, job, {"succeeded", "failed"}, timeout=90)["state"] == "succeeded"
    rid = remote_id(head, job)
    acct = subprocess.run(["sacct", "-X", "-n", "-P", "-j", str(rid), "-o", "AllocTRES,ElapsedRaw"],
                          env=slurm_lab.env, capture_output=True, text=True, timeout=30)
    tres, elapsed = acct.stdout.strip().splitlines()[0].split("|")
    held = int(re.search(r"gres/gpu=(\d+)", tres).group(1))
    mine = next(j for j in json.loads(head.run("history", "--json", check=True).stdout)
                if j["id"] == job)
    assert mine["gpu_hours"] == pytest.approx(held * int(elapsed) / 3600, rel=0.01, abs=1e-6), \
        (mine, tres, elapsed)
    return held


@pytest.mark.slow
def test_a_pool_job_sent_after_a_backup_and_long_ended_is_not_sent_again(slurm_lab, tmp_path):
    """Like the test above, but the job ended and squeue forgot it (past MinJobAge) before
    the restore: the restored head finds it in its owner's accounting by this head's token
    prefix, and takes its end from there instead of sending it again."""
    home = tmp_path / "home"
    cfg = config(slurm_lab, tmp_path / "nodes.yaml", max_jobs=1)
    with min_job_age(slurm_lab, 2):
        head = start_head(home, cfg)
        try:
            later, backup, head_token = _backup_then_send(head, home, "sleep 3; echo once")
            assert wait_state(head, later, {"succeeded", "failed"}, timeout=90)["state"] == "succeeded"
            sent = int(remote_id(head, later))
        finally:
            head.stop()
        wait_for(lambda: all(j["job_id"] != sent for j in squeue(slurm_lab)), 200,
                 what="squeue to forget the ended job")
    with _restored(head, backup, cfg, later) as restored:
        assert int(remote_id(restored, later)) == sent
        again = [j for j in squeue(slurm_lab)
                 if str(j.get("comment", "")).startswith(f"{head_token}.{later}.")]
        assert again == [], again


def _sbatch(slurm_lab, out: Path, comment: str, script: str) -> str:
    """A cluster user's own job (this process's account, the pool's), with ``comment``."""
    done = subprocess.run(["sbatch", "--parsable", f"--comment={comment}", "-o", str(out),
                           "--wrap", script], env=slurm_lab.env, capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().split(";")[0]


def test_a_members_own_job_with_this_heads_token_prefix_is_not_adopted_after_a_restore(slurm_lab, tmp_path):
    """The backup has a job waiting for room in the pool. Before the restore, a user of the
    pool's account sends a job of her own whose comment names that job with this head's
    (public) token prefix. The restored head does not take it for its job: it sends its
    own, which runs its own command, and leaves hers alone."""
    home = tmp_path / "home"
    cfg = config(slurm_lab, tmp_path / "nodes.yaml", max_jobs=1)
    head = start_head(home, cfg)
    try:
        blocker = submit(head, "--pool", "hpc", "--", "sleep", "300")
        wait_state(head, blocker, {"running"})
        later = submit(head, "--pool", "hpc", "--", "sh", "-c", "echo genuine")
        wait_for(lambda: "waiting for room" in head.job(later)["reason"], 20, what="no room")
        backup = Path(head.run("backup", check=True).stdout.split()[2])
        store = Store(home / "state.db", readonly=True)
        try:
            prefix, genuine = store.head_token, store.pool_job(blocker)["token"]
        finally:
            store.close()
    finally:
        head.stop()
    tmp_path.chmod(0o755)
    forged = _sbatch(slurm_lab, tmp_path / "forged.out", f"{prefix}.{later}.0.{'ab' * 12}",
                     "echo forged; sleep 20")
    copied = _sbatch(slurm_lab, tmp_path / "copied.out", genuine, "echo copied; sleep 20")
    head.run("backup", "--restore", str(backup), check=True)
    restored = HeadProcess(head.home, None, config=cfg)
    restored.start(wait_nodes=False)
    try:
        wait_for(lambda: restored.call("status")["pools"][0]["reachable"], 30, what="the first poll")
        restored.run("cancel", str(blocker), check=True)
        ended = wait_state(restored, later, {"succeeded", "failed"}, timeout=90)
        assert ended["state"] == "succeeded", ended["reason"]
        assert remote_id(restored, later) not in (forged, copied)
        assert remote_id(restored, blocker) not in (forged, copied)
        log = restored.run("logs", str(later), check=True).stdout
        assert "genuine" in log and "forged" not in log
        left = {str(j["job_id"]) for j in squeue(slurm_lab)
                if j["job_state"] in ("RUNNING", "PENDING") or "RUNNING" in str(j["job_state"])}
        assert {forged, copied} <= left  # hers: left alone, neither adopted nor cancelled
        assert head_event(restored, forged) and head_event(restored, copied)
    finally:
        subprocess.run(["scancel", forged, copied], env=slurm_lab.env, capture_output=True)
        cancel_left_and_stop(restored)


def head_event(head: HeadProcess, slurm_id: str) -> bool:
    return any(f"job {slurm_id} of " in e["message"] and "not a token it issued" in e["message"]
               for e in head.call("events", limit=200)["events"])
