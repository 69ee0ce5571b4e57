"""A full disk under the head's home: refused with what it is, nothing stored is lost, and
nothing is handed out twice once there is room again."""

from __future__ import annotations

import time

import pytest

from labkit.harness import wait_for
from support.reliability import fill, small_disk
from labkit.harness import HeadProcess
from nebula_tui.model import JobSpec
from nebula_tui.store import Store, StoreUnavailable
from support.head import submit


def test_a_submit_on_a_full_disk_fails_and_loses_nothing(tmp_path):
    with small_disk(tmp_path / "home", mb=8) as home:
        store = Store(home / "state.db")
        kept = [store.add_job("alice", JobSpec(command=("true",)), float(t)).id for t in range(20)]
        filler = fill(home)
        with pytest.raises(StoreUnavailable, match="the disk is full; nothing of this change was kept"):
            for t in range(2000):  # the WAL's free pages take a few
                store.add_job("alice", JobSpec(command=("x" * 4000,)), 100.0 + t)
        filler.unlink()
        after = store.add_job("alice", JobSpec(command=("true",)), 9999.0).id
        assert [j.id for j in store.jobs()][:20] == kept
        assert after not in {j.id for j in store.jobs()[:-1]}
        store.close()
        reopened = Store(home / "state.db")
        assert reopened.add_job("alice", JobSpec(command=("true",)), 10000.0).id == after + 1
        reopened.close()


def node_state(head, name: str) -> str:
    return next(n for n in head.call("status")["nodes"] if n["name"] == name)["state"]


@pytest.mark.slow
def test_a_full_disk_loses_no_exit_and_says_what_it_is(openssh_lab, tmp_path):
    with small_disk(tmp_path / "home", mb=24) as home:
        head = HeadProcess(home, openssh_lab)
        head.start()
        try:
            job = submit(head, "--gpu-mem", "4G", "--", "sleep", "4")
            node = wait_for(lambda: (j := head.job(job))["state"] == "running" and j["node"], 20,
                            what="the job running")
            attempt = (openssh_lab.node_dir(node) / "node" / "heads" / head.head_id / "jobs"
                       / str(job) / "0")
            filler = fill(home)
            refused = head.run("submit", "--gpu-mem", "4G", "--", "true")
            assert refused.returncode == 1 and refused.stderr.count("\n") == 1, refused.stderr
            assert "the disk is full" in refused.stderr and "closed the connection" not in refused.stderr
            # The job ends while nothing can be written: its exit is kept, never acknowledged.
            wait_for(lambda: (attempt / "exit_code").exists(), 20, what="the job's end on its node")
            time.sleep(2)
            assert head.job(job)["state"] == "running" and not (attempt / "acked").exists()
            # A node that reconnects meanwhile keeps its link.
            other = next(n for n in openssh_lab.nodes if n != node)
            openssh_lab.stop_node(other)
            wait_for(lambda: node_state(head, other) == "unknown", 20, what=f"{other} unknown")
            openssh_lab.start_node(other)
            wait_for(lambda: node_state(head, other) == "up", 30, what=f"{other} back while the disk is full")
            filler.unlink()
            done = head.wait_job(job, timeout=20)
            assert (done["state"], done["exit_code"]) == ("succeeded", 0)
            wait_for(lambda: (attempt / "acked").exists(), 10, what="the exit acknowledged")
            after = submit(head, "--gpu-mem", "4G", "--", "true")
            assert after > job and head.wait_job(after)["state"] == "succeeded"
            assert node_state(head, other) == "up"
        finally:
            head.stop()


def test_a_nodes_full_job_disk_at_launch_and_while_a_job_writes(openssh_lab, tmp_path):
    """node01's job directories on a small filesystem. Full at launch: the job fails with
    one sentence naming the node and the full disk, and the head goes on. Filled by a job's
    own output while it runs: its log ends with a line saying why, the job runs to its own
    end, and its exit code — which once could not be written, leaving the job running for
    ever — is recorded."""
    head = HeadProcess(tmp_path / "home", openssh_lab)
    head.start()
    others = [n for n in openssh_lab.nodes if n != "node01"]
    jobs_dir = openssh_lab.node_dir("node01") / "node" / "heads" / head.head_id / "jobs"
    try:
        for name in others:
            head.run("node", "drain", name, check=True)
        with small_disk(jobs_dir, mb=4):
            filler = fill(jobs_dir)
            full = submit(head, "--gpu-mem", "4G", "--", "true")
            refused = head.wait_job(full, timeout=30)
            assert refused["state"] == "failed" and "\n" not in refused["reason"], refused
            assert refused["reason"].startswith("launch failed on node01: the disk of its job "
                                                "directories") and "is full" in refused["reason"], refused
            assert head.run("status").returncode == 0  # the head goes on
            filler.unlink()
            writer = int(head.run("submit", "--gpu-mem", "4G", "--command",
                                  "head -c 8000000 /dev/zero | tr '\\0' x; echo written-after || exit 3",
                                  check=True).stdout.split()[2])
            ended = head.wait_job(writer, timeout=60)
            assert (ended["state"], ended["exit_code"]) == ("succeeded", 0), ended
            tail = head.run("logs", str(writer), "-n", "1", check=True).stdout
            assert tail.startswith("nebula: the log stops here (tee: ") and "No space left" in tail, tail
            assert f"job {writer} runs on" in tail
        after = submit(head, "--gpu-mem", "4G", "--", "true")
        assert head.wait_job(after, timeout=30)["state"] == "succeeded"
    finally:
        for name in others:
            head.run("node", "resume", name)
        head.stop()
