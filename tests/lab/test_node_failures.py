"""Nodes that cannot be reached, that present the wrong host key, or that go silent;
cluster files that are broken. Each gets one clear line, and nothing else stops working."""

from __future__ import annotations

import json
import subprocess
import sys

import asyncssh
import pytest
import yaml

from support.head import free_port, submitted_id
from labkit.harness import wait_for
from labkit.harness import HeadProcess


@pytest.fixture(scope="module")
def broken_cluster(openssh_lab, tmp_path_factory):
    """The lab's nodes, but node01's known key is wrong and node04 does not exist."""
    root = tmp_path_factory.mktemp("broken")
    config = yaml.safe_load(openssh_lab.config_path.read_text())
    impostor = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().strip()
    wrong = root / "wrong_known_hosts"
    wrong.write_text(f"[127.0.0.1]:{openssh_lab.port('node01')} {impostor}\n")
    config["nodes"][0]["known_hosts"] = str(wrong)
    config["nodes"].append({"name": "node04", "host": "127.0.0.1", "port": free_port()})
    path = root / "nodes.yaml"
    path.write_text(yaml.safe_dump(config))
    head = HeadProcess(root / "home", openssh_lab, config=path)
    head.start(wait_nodes=False)
    try:
        yield head
    finally:
        head.stop()


def node(head, name: str) -> dict:
    return next(n for n in head.call("status")["nodes"] if n["name"] == name)


def test_host_key_mismatch_is_refused_with_the_fix(broken_cluster):
    down = wait_for(lambda: (n := node(broken_cluster, "node01"))["state"] == "down" and n, 20,
                    what="node01 to be refused")
    assert "host key of node01" in down["reason"] and "ssh-keygen -R" in down["reason"]
    status = broken_cluster.run("status", check=True).stdout
    line = next(l for l in status.splitlines() if l.startswith("  node01:"))
    assert "[down: host key of node01" in line


def test_unreachable_node_is_down_and_the_rest_keeps_working(broken_cluster):
    down = wait_for(lambda: (n := node(broken_cluster, "node04"))["state"] == "down" and n, 20,
                    what="node04 to be down")
    assert down["reason"].startswith("cannot connect to node04 (127.0.0.1:")
    assert "refused" in down["reason"].lower()
    wait_for(lambda: node(broken_cluster, "node02")["state"] == "up", 20, what="node02 up")
    done = broken_cluster.run("submit", "--gpu-mem", "4G", "--wait", "--", "true")
    assert done.returncode == 0, done.stderr
    job = broken_cluster.job(submitted_id(done.stdout))
    assert job["node"] in ("node02", "node03")


def test_a_node_that_goes_silent_is_unknown_then_back(head, openssh_lab):
    openssh_lab.stop_node("node03")
    try:
        gone = wait_for(lambda: (n := node(head, "node03"))["state"] == "unknown" and n, 20,
                        what="node03 to be unknown")
        assert gone["reason"]
        gpus = [g for g in head.call("gpus")["gpus"] if g["node"] == "node03"]
        assert gpus and all(g["status"] == "unreachable" for g in gpus)
        # Nothing new is placed there: the scheduler sees its GPUs as blocked.
        assert all(g["blocked"] == "node node03 is unknown" for g in gpus)
    finally:
        openssh_lab.start_node("node03")
    wait_for(lambda: node(head, "node03")["state"] == "up", 30, what="node03 back up")
    assert all(g["blocked"] is None for g in head.call("gpus")["gpus"] if g["node"] == "node03")


def test_a_node_that_hangs_with_its_connection_open_is_unknown_then_back(head, openssh_lab):
    """R15's heartbeat, not a closed stream: the node's sshd and nodelet are stopped
    (SIGSTOP), the TCP connection stays open, and only missed probes tell."""
    wait_for(lambda: node(head, "node02")["state"] == "up", 20, what="node02 up")
    openssh_lab.freeze_node("node02")
    try:
        hung = wait_for(lambda: (n := node(head, "node02"))["state"] == "unknown" and n, 20,
                        what="node02 to be unknown")
        assert hung["reason"].startswith("missed 3 probes"), hung["reason"]
        gpus = [g for g in head.call("gpus")["gpus"] if g["node"] == "node02"]
        assert gpus and all(g["blocked"] == "node node02 is unknown" for g in gpus)
        # The rest of the lab keeps working meanwhile.
        done = head.run("submit", "--gpu-mem", "4G", "--wait", "--", "true")
        assert done.returncode == 0, done.stderr
        assert head.job(submitted_id(done.stdout))["node"] != "node02"
    finally:
        openssh_lab.thaw_node("node02")
    # Resumed, it answers again and its GPUs take work.
    wait_for(lambda: node(head, "node02")["state"] == "up", 30, what="node02 back up")
    assert all(g["blocked"] is None for g in head.call("gpus")["gpus"] if g["node"] == "node02")


def test_malformed_nodes_yaml_names_file_and_line(tmp_path):
    bad = tmp_path / "nodes.yaml"
    bad.write_text("cluster:\n  name: lab\nnodes:\n  - name: node01\n    host: 10.0.0.1\n    port: abc\n")
    env = {"NEBULA_HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-m", "nebula_tui", "--config", str(bad), "status"],
                          capture_output=True, text=True, env=env, timeout=30)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and f"{bad}:6:" in done.stderr and "port" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "home" / "state.db").exists()


def test_no_cluster_and_no_service_says_what_to_do(tmp_path):
    env = {"NEBULA_HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-m", "nebula_tui", "queue"], capture_output=True,
                          text=True, env=env, timeout=30)
    assert done.returncode == 1
    assert "nebula demo --headless" in done.stderr and done.stderr.count("\n") == 1


def test_status_json_reports_node_states(broken_cluster):
    wait_for(lambda: node(broken_cluster, "node04")["state"] == "down", 20, what="node04 down")
    summary = json.loads(broken_cluster.run("status", "--json", check=True).stdout)
    states = {n["name"]: n["state"] for n in summary["node_details"]}
    assert states["node04"] == "down" and states["node02"] == "up"


@pytest.mark.slow
def test_a_nodes_sshd_killed_and_restarted_loses_nothing_and_runs_nothing_twice(head, openssh_lab, tmp_path):
    """The node's sshd dies with every session it serves (the nodelet too) while two jobs
    run there, one of which ends meanwhile, and comes back: the head reconnects, records
    the end that happened while it could not hear (its real exit code), follows the other
    to its own end, and neither job ran twice nor moved."""
    starts = tmp_path / "starts"
    others = [n for n in openssh_lab.nodes if n != "node01"]
    for name in others:  # both jobs on node01
        head.run("node", "drain", name, check=True)
    try:
        def job(seconds: int, code: int) -> int:
            done = head.run("submit", "--gpu-mem", "4G", "--command",
                            f'echo "$NEBULA_JOB_ID" >> {starts}; sleep {seconds}; exit {code}', check=True)
            return submitted_id(done.stdout)

        short, long = job(3, 5), job(14, 0)
        wait_for(lambda: all(head.job(j)["state"] == "running" for j in (short, long)), 30,
                 what="both jobs running")
    finally:
        for name in others:  # a job wrongly requeued could run elsewhere: let it show
            head.run("node", "resume", name, check=True)
    assert {head.job(j)["node"] for j in (short, long)} == {"node01"}
    openssh_lab.stop_node("node01")
    try:
        wait_for(lambda: node(head, "node01")["state"] != "up", 20, what="node01 lost")
        wait_for(lambda: starts.read_text().split().count(str(short)) == 1 and
                 _exit_written(head, openssh_lab, short), 20, what="the short job's end on its node")
    finally:
        openssh_lab.start_node("node01")
    wait_for(lambda: node(head, "node01")["state"] == "up", 30, what="node01 back up")
    ended = {j: head.wait_job(j, timeout=40) for j in (short, long)}
    assert (ended[short]["state"], ended[short]["exit_code"]) == ("failed", 5), ended[short]
    assert (ended[long]["state"], ended[long]["exit_code"]) == ("succeeded", 0), ended[long]
    assert all(e["attempt"] == 0 and e["node"] == "node01" for e in ended.values()), ended
    assert sorted(starts.read_text().split()) == sorted([str(short), str(long)])  # once each


def _exit_written(head, lab, job: int) -> bool:
    """Whether ``head``'s job ``job``'s wrapper wrote its exit code on the lab's node01."""
    return any(p.read_text().strip() for p in
               lab.node_dir("node01").rglob(f"heads/{head.head_id}/jobs/{job}/*/exit_code"))
