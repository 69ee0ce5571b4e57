"""A real Slurm as a pool behind the queue, end to end: a real head (``nebula serve``) reaches
the ``slurm_lab`` fixture's login node (a real sshd on 127.0.0.1) over SSH, and every job
here runs on its real slurmd daemons. Skipped, with the reason, where Slurm cannot run."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import yaml

from support.labfixtures import cancel_left_and_stop

from labkit.harness import HeadProcess, wait_for
from nebula_tui.store import Store
from support.head import log, sinfo_partitions, submit
from support.slurmfixtures import remote_id, squeue, start_head, wait_state

POLL = "1s"


def pool_config(slurm_lab, path: Path, **extra) -> Path:
    entry = slurm_lab.pool_entry("hpc", identity=str(slurm_lab.identity_path),
                                 known_hosts=str(slurm_lab.known_hosts_path),
                                 workdir=str(path.parent / "hpc-work"), poll_interval=POLL, **extra)
    path.write_text(yaml.safe_dump({"cluster": {"name": "pooltest"}, "pools": [entry]}))
    return path


@pytest.fixture(scope="module")
def pool_head(slurm_lab, tmp_path_factory):
    home = tmp_path_factory.mktemp("poolhead")
    head = start_head(home, pool_config(slurm_lab, home / "nodes.yaml"))
    try:
        yield head
    finally:
        cancel_left_and_stop(head)


@pytest.mark.slow
def test_a_job_runs_in_the_pool_and_its_output_is_read(pool_head):
    job = submit(pool_head, "--pool", "hpc", "--gpu-count", "2", "--", "sh", "-c",
                 "echo $NEBULA_JOB_ID $CUDA_VISIBLE_DEVICES $CUDA_DEVICE_ORDER $NEBULA_GPU_LIST; sleep 2")
    queued = {j["id"]: j for j in json.loads(pool_head.run("queue", "--json", check=True).stdout)}
    assert queued[job]["pool"] == "hpc"
    ended = wait_state(pool_head, job, {"succeeded", "failed"})
    assert ended["state"] == "succeeded", ended["reason"]
    assert ended["node"].startswith("hpc:n")
    logs = log(pool_head, job)
    assert f"{job} 0,1 PCI_BUS_ID 0,1" in logs
    assert "  pool:      hpc" in pool_head.run("job", str(job), check=True).stdout  # no nvidia-smi there: the indices
    history = json.loads(pool_head.run("history", "--json", check=True).stdout)
    mine = next(j for j in history if j["id"] == job)
    # Charged Slurm's elapsed time (whole seconds, at least the 2 s it slept) x its 2 GPUs.
    assert mine["pool"] == "hpc" and mine["gpu_hours"] >= 2 * 2 / 3600 - 1e-9
    status = pool_head.run("status", check=True).stdout
    assert re.search(r"hpc \(Slurm 22\.05\.\d+, partition gpu\): 16 GPUs, \d+ idle; ours: ", status)


def test_cancel_removes_the_job_from_squeue(pool_head, slurm_lab):
    job = submit(pool_head, "--pool", "hpc", "--", "sleep", "300")
    wait_state(pool_head, job, {"running"})
    slurm_id = int(remote_id(pool_head, job))
    assert any(j["job_id"] == slurm_id for j in squeue(slurm_lab))
    pool_head.run("cancel", str(job), check=True)
    assert pool_head.job(job)["state"] == "cancelled"
    wait_for(lambda: all(j["job_id"] != slurm_id or j["job_state"] == "CANCELLED"
                         for j in squeue(slurm_lab)), 30, what="squeue to drop the job")


def test_a_failing_exit_code_and_a_multi_node_job(pool_head):
    failing = submit(pool_head, "--pool", "hpc", "--", "sh", "-c", "echo failing; exit 3")
    gang = submit(pool_head, "--pool", "hpc", "--nodes", "2", "--", "sh", "-c",
                  "echo rank=$NODE_RANK of=$NNODES master=$MASTER_ADDR:$MASTER_PORT world=$WORLD_SIZE")
    ended = wait_state(pool_head, failing, {"succeeded", "failed"})
    assert ended["state"] == "failed" and ended["exit_code"] == 3
    assert "exit code 3" in ended["reason"]
    done = wait_state(pool_head, gang, {"succeeded", "failed"})
    assert done["state"] == "succeeded", done["reason"]
    assert len({g["node"] for g in done["gpus"]}) == 2
    logs = log(pool_head, gang)
    port = 29500 + gang % 20000
    for rank in (0, 1):
        assert f"rank={rank} of=2 master=127.0.0.1:{port} world=2" in logs


@pytest.mark.slow
def test_a_time_limit_ends_it_as_timeout(pool_head, slurm_lab):
    """The job's limit reaches Slurm as its TimeLimit, and Slurm's end of it for that limit
    reads as timeout. Slurm counts limits in whole minutes and looks for jobs past theirs
    every 30 s, so a 1-minute limit took 60-90 s of waiting; once the limit is seen there,
    the job's end is moved to now (``scontrol update EndTime``, as an operator may) and
    Slurm ends it for its time limit, for real, at its next look."""
    job = submit(pool_head, "--pool", "hpc", "--time", "1m", "--", "sleep", "600")
    wait_state(pool_head, job, {"running"})
    there = remote_id(pool_head, job)
    # (squeue --json lists every job whatever -j says: the job is picked by its id)
    shown = next(j for j in squeue(slurm_lab) if str(j["job_id"]) == there)
    assert shown["time_limit"] == 1, shown["time_limit"]  # minutes
    slurm_lab.cluster.run(["scontrol", "update", f"JobId={there}", "EndTime=now+1"])
    ended = wait_state(pool_head, job, {"timeout", "failed", "succeeded"}, timeout=90)
    assert ended["state"] == "timeout", ended["reason"]
    assert "TIMEOUT" in ended["reason"]


def test_what_the_pool_cannot_run_is_refused_at_submit(pool_head):
    for args, says in ((("--gpu-count", "8"), "at most 4 GPUs on one node"),
                       (("--image", "ubuntu:24.04"), "declares no container runtime"),
                       (("--pool", "nope"), "no pool nope")):
        flags = args if "--pool" in args else ("--pool", "hpc", *args)
        done = pool_head.run("submit", *flags, "--", "true")
        assert done.returncode == 2 and says in done.stderr, done.stderr


@pytest.mark.slow
def test_a_head_killed_mid_submit_never_submits_twice(slurm_lab, tmp_path):
    """Between the intent and sbatch's answer: the job went through (its answer lost), or it
    did not; the restarted head finds the first by its token and submits the second once."""
    config = pool_config(slurm_lab, tmp_path / "nodes.yaml", burst_after="1h")
    head = start_head(tmp_path / "home", config)
    try:
        first = submit(head, "--", "sleep", "5")  # waits here (no lab nodes) for an hour
        second = submit(head, "--", "true")
    finally:
        head.kill()
    store = Store(tmp_path / "home" / "state.db")
    work = tmp_path / "hpc-work"
    work.mkdir(exist_ok=True)
    tokens = {}
    for job in (first, second):
        tokens[job] = f"{store.head_token}.{job}.0.killed"
        store.send_to_pool(job, "hpc", slurm_lab.pool_entry()["user"], tokens[job], "",
                           "sent to pool hpc (--pool)", time.time())
    store.close()
    # The first one's sbatch went through before the head died.
    slurm_lab.cluster.run(["sbatch", "--parsable", f"--comment={tokens[first]}", "--gres=gpu:1",
                           f"--output={work}/lost-answer.out", "--wrap", "sleep 5"])
    head = HeadProcess(tmp_path / "home", None, config=config)
    head.start(wait_nodes=False)
    try:
        for job in (first, second):
            assert wait_state(head, job, {"succeeded", "failed"}, timeout=90)["state"] == "succeeded"
        out = slurm_lab.cluster.run(["squeue", "-h", "-t", "all", "-o", "%k"]).split()
        assert out.count(tokens[first]) == 1 and out.count(tokens[second]) == 1
    finally:
        head.stop()


@pytest.mark.slow
def test_the_login_node_down_and_back(pool_head, slurm_lab):
    job = submit(pool_head, "--pool", "hpc", "--", "sh", "-c", "sleep 8; echo survived")
    wait_state(pool_head, job, {"running"})
    slurm_lab.stop_login()
    try:
        wait_for(lambda: not pool_head.call("status")["pools"][0]["reachable"], 30,
                 what="the head to see the pool unreachable")
        assert "unreachable since" in pool_head.run("status", check=True).stdout
        assert pool_head.job(job)["state"] == "running"  # left alone meanwhile
        time.sleep(10)  # it ends in Slurm while nobody is looking
        assert pool_head.job(job)["state"] == "running"
    finally:
        slurm_lab.start_login()
    ended = wait_state(pool_head, job, {"succeeded", "failed"}, timeout=60)
    assert ended["state"] == "succeeded", ended["reason"]
    assert "survived" in log(pool_head, job)


@pytest.mark.slow
def test_a_job_waiting_past_burst_after_runs_in_the_pool(openssh_lab, slurm_lab, tmp_path):
    """The lab's nodes are drained: jobs wait here, and once past burst_after they go to the
    pool in the queue's order, at most max_jobs (1) there at once."""
    from support.labfixtures import lab_config, serving

    entry = slurm_lab.pool_entry("hpc", identity=str(slurm_lab.identity_path),
                                 known_hosts=str(slurm_lab.known_hosts_path),
                                 workdir=str(tmp_path / "hpc-work"), poll_interval=POLL,
                                 burst_after="2s", max_jobs=1)
    config = lab_config(openssh_lab, "burst", pools=[entry])
    for head in serving(openssh_lab, tmp_path / "home", config):
        for node in openssh_lab.nodes:
            head.run("node", "drain", node, "--reason", "test", check=True)
        first = submit(head, "--", "sh", "-c", "echo burst one; sleep 3")
        second = submit(head, "--", "sh", "-c", "echo burst two")
        kept = submit(head, "--pool", "local", "--", "true")
        for job in (first, second):
            ended = wait_state(head, job, {"succeeded", "failed"}, timeout=90)
            assert ended["state"] == "succeeded" and ended["pool"] == "hpc", ended["reason"]
        assert "burst one" in log(head, first)
        events = [e["message"] for e in head.call("events", limit=200)["events"]]  # oldest first
        sent = [m for m in events if re.match(rf"job ({first}|{second}) sent to pool hpc after "
                                               r"\d+ s waiting here", m)]
        assert [m.split()[1] for m in sent] == [str(first), str(second)]
        # each waited here past burst_after first (read from the head's own event, not by
        # racing its 2 s with a poll of the state under load)
        assert all(int(re.search(r"after (\d+) s waiting", m)[1]) >= 2 for m in sent), sent
        # max_jobs 1: the second went only once the first had ended
        assert events.index(sent[1]) > events.index(f"job {first} succeeded with exit code 0")
        assert head.job(kept)["state"] == "pending" and head.job(kept)["pool"] is None
        for node in openssh_lab.nodes:
            head.run("node", "resume", node, check=True)
        wait_state(head, kept, {"succeeded"})


def test_each_lab_user_submits_as_themselves(openssh_lab, slurm_lab, tmp_path_factory):
    """``user: submitter``: the head logs in to the login node as the submitting user with
    its pool key; a user who authorised it runs as themselves there, one who has not is
    refused at submit with the command that does it."""
    from support.users import as_user, lab_users, shared_head

    from nebula_tui.sim.slurmlab import unlock_for_ssh

    alice, bob = "nebpoola", "nebpoolb"
    entry = slurm_lab.pool_entry("hpc", user="submitter", known_hosts=str(slurm_lab.known_hosts_path),
                                 poll_interval=POLL)
    for _ in lab_users("nebpoolers", (alice, bob), ()):
        for user in (alice, bob):
            unlock_for_ssh(user)
        for head in shared_head(openssh_lab, tmp_path_factory, "nebpoolers", {"pools": [entry]}):
            key = (head.home / "pool_key.pub").read_text().strip()
            slurm_lab.authorize(alice, f'from="127.0.0.1",restrict {key}')
            done = as_user(head, alice, "submit", "--pool", "hpc", "--", "sh", "-c", "id -un; sleep 1")
            assert done.returncode == 0, done.stderr
            job = int(re.search(r"job (\d+)", done.stdout).group(1))
            ended = wait_state(head, job, {"succeeded", "failed"}, timeout=90)
            assert ended["state"] == "succeeded" and ended["user"] == alice, ended["reason"]
            assert as_user(head, alice, "logs", str(job)).stdout.strip() == alice
            refused = as_user(head, bob, "submit", "--pool", "hpc", "--", "true")
            assert refused.returncode != 0
            assert f"{bob} has not authorised the head's key on pool hpc" in refused.stderr
            assert "nebula pool authorize hpc" in refused.stderr
            slurm_lab.revoke(alice)


@pytest.mark.slow
def test_pending_there_says_why_and_hold_release_reach_slurm(pool_head, slurm_lab):
    blocker = submit(pool_head, "--pool", "hpc", "--nodes", "4", "--gpu-count", "4", "--",
                     "sleep", "300")
    wait_state(pool_head, blocker, {"running"})
    waiting = submit(pool_head, "--pool", "hpc", "--", "echo", "after the blocker")
    wait_for(lambda: pool_head.job(waiting)["reason"] == "pending in pool hpc: Resources", 30,
             what="the pool's own reason")
    queue = pool_head.run("queue", check=True).stdout
    assert "pending in pool hpc: Resources" in queue
    pool_head.run("hold", str(waiting), check=True)
    slurm_id = int(remote_id(pool_head, waiting))
    held = next(j for j in squeue(slurm_lab) if j["job_id"] == slurm_id)
    assert held["priority"] == 0 or "Held" in held["state_reason"]  # scontrol hold
    pool_head.run("release", str(waiting), check=True)
    pool_head.run("cancel", str(blocker), check=True)
    assert wait_state(pool_head, waiting, {"succeeded", "failed"})["state"] == "succeeded"


def test_a_cancel_while_the_login_node_is_down_is_done_when_it_answers(pool_head, slurm_lab):
    job = submit(pool_head, "--pool", "hpc", "--", "sleep", "300")
    wait_state(pool_head, job, {"running"})
    slurm_id = int(remote_id(pool_head, job))
    slurm_lab.stop_login()
    try:
        pool_head.run("cancel", str(job), check=True)
        assert pool_head.job(job)["phase"] == "cancelling"
        assert any(j["job_id"] == slurm_id and j["job_state"] == "RUNNING" for j in squeue(slurm_lab))
    finally:
        slurm_lab.start_login()
    ended = wait_state(pool_head, job, {"cancelled", "failed", "succeeded"})
    assert ended["state"] == "cancelled" and ended["reason"] == "cancelled by root", ended["reason"]
    assert all(j["job_id"] != slurm_id or j["job_state"] == "CANCELLED" for j in squeue(slurm_lab))


def live_partitions(slurm_lab) -> dict[str, tuple[int, int]]:
    """Each partition's (GPUs, idle GPUs) as ``sinfo -O partition,gres,gresused`` says now."""
    return sinfo_partitions(slurm_lab.cluster.run(
        ["sinfo", "-h", "-O", "Partition:|,Gres:|,GresUsed:|,Nodes:|"]))


def test_gpu_counts_read_from_the_allocation_and_free_per_partition(pool_head, slurm_lab):
    """On the live Slurm: jobs asked with --gpus and --gpus-per-node read their allocation
    (AllocTRES), in squeue's JSON and in the pool's squeue -O alike (squeue %b reads N/A and
    one node's share); the head's status says each partition's free GPUs as sinfo -O
    partition,gres,gresused does, and its pool line says as much."""
    from nebula_tui.pools import slurm_parse as parse

    run = lambda *args: slurm_lab.cluster.sbatch("--parsable", "--output=/dev/null", *args,  # noqa: E731
                                                 "--wrap", "sleep 120").split(";")[0]
    asked = {run("--gpus=3"): 3, run("--nodes=2", "--gpus-per-node=1"): 2}
    try:
        wait_for(lambda: all(j["job_state"] == "RUNNING" for j in squeue(slurm_lab)
                             if str(j["job_id"]) in asked), 60, what="both jobs running")
        listed = parse.parse_squeue_json(slurm_lab.cluster.run(["squeue", "--json"]))
        text = parse.parse_squeue_text(slurm_lab.cluster.run(
            ["squeue", "-h", "-t", "all", "-O", parse.SQUEUE_FORMAT]))
        for jobs in (listed, text):
            assert {j.slurm_id: j.gpus for j in jobs if j.slurm_id in asked} == asked
        per_node = slurm_lab.cluster.run(["squeue", "-h", "-o", "%i|%b"])
        assert {line.split("|")[0]: line.split("|")[1] for line in per_node.splitlines()
                if line.split("|")[0] in asked} == dict(zip(asked, ("N/A", "gres:gpu:1")))

        def agrees() -> bool:
            live = live_partitions(slurm_lab)
            line = pool_head.run("status", check=True).stdout
            pool = pool_head.call("status")["pools"][0]
            return ({p["name"]: (p["gpus"], p["gpus_idle"]) for p in pool["partitions"]} == live
                    and f"16 GPUs, {live['gpu'][1]} idle; ours: " in line)
        wait_for(agrees, 30, interval=0.5, what="the head's partitions and line to be sinfo's")
        assert live_partitions(slurm_lab)["gpu"][1] <= 16 - 5  # ours hold 5 GPUs
    finally:
        slurm_lab.cluster.run(["scancel", *asked])
