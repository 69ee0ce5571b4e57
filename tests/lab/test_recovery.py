"""The head may die at any moment and nodes may go silent (R15, R23): nothing acknowledged
is lost, nothing runs twice, no GPU is promised twice, and accounting adds up."""

from __future__ import annotations

import random
import shutil
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml

from labkit.harness import wait_for
from nebula_tui.api import Client
from labkit.harness import FINISHED, HeadProcess
from support.head import session_alive, submit
from support.stores import never_overcommitted


def node_of(head, name: str) -> dict:
    return next(n for n in head.call("status")["nodes"] if n["name"] == name)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_chaos_head_killed_20_times_while_200_jobs_flow(openssh_lab, tmp_path):
    ran = tmp_path / "ran.txt"
    head = HeadProcess(tmp_path / "home", openssh_lab)
    head.start()
    rng = random.Random(23)
    try:
        with head.client() as client:
            ids = [client.call("submit", gpu_mem_mb=4096, shell=True, command=[
                f'echo "$NEBULA_JOB_ID" >> {ran}; sleep $((NEBULA_JOB_ID % 3))'])["job"]["id"]
                for _ in range(200)]
        for _ in range(20):
            time.sleep(rng.uniform(0.1, 0.8))
            head.kill()
            time.sleep(rng.uniform(0.0, 0.3))
            head.start(wait_nodes=False)
        head.stop()
        head.start()

        def all_done():
            with head.client() as c:
                return all(c.call("job", job=i)["job"]["state"] in FINISHED for i in ids)
        wait_for(all_done, 240, interval=0.5, what="all 200 jobs to end")
        jobs = [head.job(i) for i in ids]
    finally:
        head.stop()
    unfinished = {j["id"]: (j["state"], j.get("reason")) for j in jobs if j["state"] != "succeeded"}
    assert not unfinished, f"jobs that did not succeed, with their reasons: {unfinished}"
    runs = Counter(int(line) for line in ran.read_text().split())
    assert set(runs) == set(ids), "every job ran"
    assert max(runs.values()) == 1, f"jobs ran twice: {[i for i, n in runs.items() if n > 1]}"
    db = head.home / "state.db"
    never_overcommitted(db)
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT count(*) FROM allocations WHERE released_at IS NULL").fetchone()[0] == 0
    (finished,) = conn.execute("SELECT SUM(jobs_finished) FROM users").fetchone()
    assert finished == 200


def test_a_job_that_ends_while_the_head_is_down_is_charged_until_its_end(openssh_lab, tmp_path):
    """Killed while a 2 s job runs, the head is back 8 s later: the job ended when its node
    recorded, not when the new head heard of it (it was charged the head's outage too)."""
    head = HeadProcess(tmp_path / "home", openssh_lab)
    head.start()
    try:
        job = submit(head, "--gpus", "1", "--", "sleep", "2")
        wait_for(lambda: head.job(job)["state"] == "running", 20, what="the job to run")
        head.kill()
        time.sleep(8)
        head.start(wait_nodes=False)
        done = head.wait_job(job, 30)
    finally:
        head.stop()
    assert done["state"] == "succeeded"
    assert 1.5 < done["ended_at"] - done["started_at"] < 5, (done["started_at"], done["ended_at"])


@pytest.mark.slow
def test_node_sshd_stopped_30s_while_its_job_runs(head, openssh_lab):
    job = submit(head, "--gpu-mem", "4G", "--", "sleep", "120")
    try:
        node = wait_for(lambda: (j := head.job(job))["state"] == "running" and j["node"], 20,
                        what="the job to run")
        stopped = time.monotonic()
        openssh_lab.stop_node(node)
        try:
            wait_for(lambda: node_of(head, node)["state"] == "unknown", 20, what="node unknown")
            assert time.monotonic() - stopped < 16
            time.sleep(max(0.0, 30 - (time.monotonic() - stopped)))
            assert head.job(job)["state"] == "running", "a short drop costs nobody their job"
            assert session_alive(head, node, job)
        finally:
            openssh_lab.start_node(node)
        wait_for(lambda: node_of(head, node)["state"] == "up", 30, what="node back up")
        assert head.job(job)["state"] == "running" and head.job(job)["node"] == node
    finally:
        head.run("cancel", str(job))
    # Reconciled: the cancel reaches the node, the job ends with a real outcome.
    assert head.wait_job(job, 30)["state"] == "cancelled"


@pytest.mark.slow
def test_a_node_silent_past_its_lease_has_its_jobs_requeued(openssh_lab, tmp_path):
    config = yaml.safe_load(openssh_lab.config_path.read_text())
    config["cluster"]["node_lease"] = 3
    (tmp_path / "nodes.yaml").write_text(yaml.safe_dump(config))
    head = HeadProcess(tmp_path / "home", openssh_lab, config=tmp_path / "nodes.yaml")
    head.start()
    try:
        job = submit(head, "--gpu-mem", "4G", "--", "sleep", "120")
        first = wait_for(lambda: (j := head.job(job))["state"] == "running" and j, 20, what="running")
        openssh_lab.stop_node(first["node"])
        try:
            moved = wait_for(lambda: (j := head.job(job))["state"] == "running" and j["attempt"] == 1 and j,
                             30, what="the job requeued and running elsewhere")
            assert moved["node"] != first["node"]
            assert "lost with node" in " ".join(e["message"] for e in head.call("events", limit=200)["events"])
        finally:
            openssh_lab.start_node(first["node"])
        # The old copy must not keep running: reconcile stops it when the node is back.
        wait_for(lambda: not session_alive(head, first["node"], job), 40,
                 what="the stale copy stopped")
        assert session_alive(head, moved["node"], job)
        head.run("cancel", str(job))
        assert head.wait_job(job, 30)["state"] == "cancelled"
        never_overcommitted(head.home / "state.db")
    finally:
        head.stop()


@pytest.mark.slow
def test_50_clients_submitting_at_once(head):
    # Every flood job waits for one that runs meanwhile (a request no card could ever
    # serve would be refused at submit).
    with Client(head.socket) as c:
        blocker = c.call("submit", command=["sleep", "600"], gpu_mem_mb=4096, name="blocker")["job"]["id"]
    script = ("import sys; from nebula_tui.api import Client\n"
              "with Client(sys.argv[1]) as c:\n"
              "    for _ in range(20):\n"
              "        print(c.call('submit', command=['true'], after=[int(sys.argv[2])], "
              "name='flood')['job']['id'])\n")
    procs = [subprocess.Popen([sys.executable, "-c", script, str(head.socket), str(blocker)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(50)]
    outputs = [p.communicate(timeout=120) for p in procs]
    try:
        assert all(p.returncode == 0 for p in procs), [err for _, err in outputs if err][:3]
        assert not any("locked" in err for _, err in outputs)
        ids = [int(x) for out, _ in outputs for x in out.split()]
        assert len(ids) == 1000 and len(set(ids)) == 1000
        # The queue answers while all of that waits.
        assert sum(j["name"] == "flood" for j in head.call("queue")["jobs"]) == 1000
    finally:
        with Client(head.socket) as c:
            for job in c.call("queue")["jobs"]:
                if job["name"] == "flood":
                    c.call("cancel", job=job["id"])
            c.call("cancel", job=blocker)


def test_garbage_from_a_node_tool_marks_the_node_and_nothing_crashes(head, openssh_lab):
    # node03 is read through nvidia-smi (its NVML does not load; see sim/presets.py).
    tool = openssh_lab.node_dir("node03") / "bin" / "nvidia-smi"
    original = tool.read_text()
    tool.write_text("#!/bin/sh\nprintf 'garbage,,\\n\\x01\\x02 not csv at all\\n'\n")
    try:
        reason = wait_for(lambda: (n := node_of(head, "node03"))["reason"] and n["reason"], 15,
                          what="node03 to be marked")
        assert "nvidia-smi" in reason and "\n" not in reason
        assert head.call("ping")["pid"]  # the service lives on
    finally:
        tool.write_text(original)
    wait_for(lambda: not node_of(head, "node03")["reason"], 15, what="node03 healthy again")


def _card_of(db_path, job: int) -> tuple[str, int]:
    """The card the job's latest allocation is on, and all the memory that card has."""
    db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        return db.execute("SELECT a.gpu_uuid, g.total_mb FROM allocations a JOIN gpus g "
                          "ON g.uuid = a.gpu_uuid WHERE a.job_id = ? ORDER BY a.created_at DESC",
                          [job]).fetchone()
    finally:
        db.close()


#: The lab's sm_89 cards are node01's two RTX 4090s and its RTX 4060 Laptop (8188 MiB).
ADA = "sm_89"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("when", ["end-acked", "head-died-before-its-ack", "backup-during-its-launch"])
def test_a_restore_records_the_end_that_freed_a_card_before_it_takes_in_the_next_job(
        openssh_lab, tmp_path, when):
    """The backup holds a job running on a card that has room for one (or launching there:
    the backup was taken after its card was written, before its node answered); after the
    backup that job ends and a later one takes its card. Restored, the store learns both
    from the node: it records the first one's end before it takes the second one in, so at
    no moment does it hold both on the card. Whether the node had the end's ack or not (the
    head died before it went) makes no difference."""
    head = HeadProcess(tmp_path / "home", openssh_lab)
    db, gate, ran = head.home / "state.db", tmp_path / "gate", tmp_path / "ran.txt"
    filler = second = None
    head.start()
    try:
        with head.client() as client:
            # Both 4090s taken, so the laptop card is the only sm_89 card left for the jobs.
            filler = client.call("submit", gpu_count=2, gpu_mem_mb=24564, arch=ADA, shell=True,
                                 command=["sleep 600"])["job"]["id"]
        wait_for(lambda: head.job(filler)["state"] == "running", 30, what="the 4090s taken")
        if when == "backup-during-its-launch":  # its launch waits on the node till the backup
            openssh_lab.freeze_node("node01")
        try:
            with head.client() as client:
                first = client.call("submit", gpu_mem_mb=4096, arch=ADA, shell=True, command=[
                    f"while [ ! -e {gate} ]; do sleep 0.2; done"])["job"]["id"]
            wait_for(lambda: head.job(first)["state"] == (
                "launching" if when == "backup-during-its-launch" else "running"), 30,
                what="the first job placed")
            source, target = sqlite3.connect(db), sqlite3.connect(tmp_path / "backup.db")
            source.backup(target)
            source.close()  # open, it would write its view of the store over the restored one
            target.close()
        finally:
            if when == "backup-during-its-launch":
                openssh_lab.thaw_node("node01")
        card, node = _card_of(db, first), head.job(first)["node"]
        assert node == "node01" and card[1] < 2 * 4096, card
        gate.touch()
        assert head.wait_job(first)["state"] == "succeeded"

        def card_free():  # its readings too: what the first job left there is gone
            gpu = next(g for g in head.call("gpus")["gpus"] if g["uuid"] == card[0])
            return not gpu["jobs"] and not gpu["unmanaged_used_mb"]
        wait_for(card_free, 20, what="the first job's card free again")
        with head.client() as client:
            second = client.call("submit", gpu_mem_mb=4096, arch=ADA, shell=True, command=[
                f'echo "$NEBULA_JOB_ID" >> {ran}; sleep 300'])["job"]["id"]
        wait_for(lambda: head.job(second)["state"] == "running", 30, what="the second job to run")
        assert _card_of(db, second) == card  # the card the first one left
        jobs_dir = openssh_lab.node_dir(node).rglob(f"heads/{head.head_id}/jobs")
        acks = next(jobs_dir) / str(first)
        wait_for(lambda: list(acks.glob("*/acked")), 20, what="the first job's end acknowledged")
        head.stop()
        if when == "head-died-before-its-ack":  # as if its ack had not reached the node
            for mark in acks.glob("*/acked"):
                mark.unlink()
        shutil.copy(tmp_path / "backup.db", db)  # the admin's restore
        for suffix in ("-wal", "-shm"):
            Path(f"{db}{suffix}").unlink(missing_ok=True)
        head.start()
        assert head.wait_job(first)["state"] == "succeeded"
        wait_for(lambda: head.job(second)["state"] == "running", 30,
                 what="the second job taken in again")
        never_overcommitted(db)
        assert ran.read_text().split() == [str(second)], "a job ran twice"
    finally:
        for job in (second, filler):  # the lab is shared: their cards are left free
            if job is not None:
                head.run("cancel", str(job))
                head.wait_job(job)
        head.stop()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("ignores_term", [True, False], ids=["killed-after-the-grace", "ends-on-sigterm"])
def test_a_job_cancelled_after_the_backup_is_cancelled_after_the_restore(openssh_lab, tmp_path, ignores_term):
    """The backup holds a job running; after it the job is cancelled, its end recorded and
    acked on the node. Restored, the head settles it from the node's record of that end:
    cancelled, its card free, within the node's reconcile — not "running" past the lease
    (a job killed after the cancel's grace left no exit code), nor "failed" (issue 41)."""
    head = HeadProcess(tmp_path / "home", openssh_lab)
    db = head.home / "state.db"
    head.start()
    try:
        command = ("trap '' TERM; while :; do sleep 0.2; done" if ignores_term else "sleep 300")
        with head.client() as client:
            job = client.call("submit", gpu_mem_mb=4096, shell=True, command=[command])["job"]["id"]
        wait_for(lambda: head.job(job)["state"] == "running", 30, what="the job to run")
        card, node = _card_of(db, job), head.job(job)["node"]
        source, target = sqlite3.connect(db), sqlite3.connect(tmp_path / "backup.db")
        source.backup(target)
        source.close()
        target.close()
        head.run("cancel", str(job))
        assert head.wait_job(job)["state"] == "cancelled"
        acks = next(openssh_lab.node_dir(node).rglob(f"heads/{head.head_id}/jobs")) / str(job)
        wait_for(lambda: list(acks.glob("*/acked")), 20, what="the job's end acknowledged")
        head.stop()
        shutil.copy(tmp_path / "backup.db", db)  # the admin's restore
        for suffix in ("-wal", "-shm"):
            Path(f"{db}{suffix}").unlink(missing_ok=True)
        head.start()
        ended = wait_for(lambda: (j := head.job(job))["state"] != "running" and j, 30,
                         what="the restored head to settle the job from the node's record")
        assert ended["state"] == "cancelled", ended
        gpu = next(g for g in head.call("gpus")["gpus"] if g["uuid"] == card[0])
        assert job not in [j.get("id", j) if isinstance(j, dict) else j for j in gpu["jobs"]], gpu
        never_overcommitted(db)
    finally:
        head.stop()
