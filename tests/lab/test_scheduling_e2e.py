"""The scheduler's rules through the whole system: filters, gangs across nodes,
dependencies, quota and the topology preview, on real sshd nodes."""

from __future__ import annotations

import json

from labkit.harness import wait_for
from support.samples import SAMPLES
from support.head import submit


def test_arch_and_cuda_filters_say_what_is_missing(head):
    # No card of the lab could ever serve these: refused at submit (exit 2), saying why.
    no_hopper = head.run("submit", "--arch", "sm_90", "--", "true")
    new_cuda = head.run("submit", "--cuda", "13.0", "--", "true")
    assert no_hopper.returncode == new_cuda.returncode == 2
    assert "sm_90" in no_hopper.stderr and "here: sm_80, sm_86, sm_89" in no_hopper.stderr
    assert "12.4" in new_cuda.stderr and "13.0" in new_cuda.stderr
    ampere_or_newer = submit(head, "--arch", ">=sm_86", "--gpu-mem", "4G", "--", "true")
    done = head.wait_job(ampere_or_newer)
    assert done["state"] == "succeeded"
    # Not an A100 (sm_80): a 4090 or 3090 (sm_89 / sm_86).
    placed = json.loads(head.run("job", str(ampere_or_newer), "--json", check=True).stdout)
    assert placed["node"] in ("node01", "node03")


def test_a_gang_across_two_nodes_gets_the_torchrun_environment(head):
    # Five cards with ≥20 GB exist only across nodes: node02's four A100s and a 24 GB card.
    job = submit(head, "--gpu-count", "5", "--gpu-mem", "20G", "--nodes", "2", "--",
                 "sh", "-c", 'echo "$NNODES $NODE_RANK $MASTER_ADDR $MASTER_PORT $CUDA_VISIBLE_DEVICES"')
    done = head.wait_job(job, 30)
    assert done["state"] == "succeeded", done["reason"]
    nodes = {g["node"] for g in head.call("job", job=job)["job"]["gpus"]} or None
    log = head.run("logs", "--rank", "0", str(job), check=True).stdout.split()
    assert log[0] == "2" and log[1] == "0" and log[2] == "127.0.0.1" and int(log[3]) >= 29500
    assert nodes is None or len(nodes) == 2
    # Every rank's output, each line prefixed with its rank and node; or one rank's alone.
    every = sorted(head.run("logs", str(job), check=True).stdout.splitlines())
    assert [line.split()[0] for line in every] == ["[0", "[1"]
    assert every[0].split()[2:4] == ["2", "0"] and every[1].split()[2:4] == ["2", "1"]
    assert head.run("logs", "--rank", "1", str(job), check=True).stdout.split()[:2] == ["2", "1"]
    beyond = head.run("logs", "--rank", "2", str(job))
    assert beyond.returncode == 1 and "ran on 2 node(s): --rank goes from 0 to 1" in beyond.stderr
    # Without --nodes no node could ever hold it: refused at submit, with the hint.
    single = head.run("submit", "--gpu-count", "5", "--gpu-mem", "20G", "--", "true")
    assert single.returncode == 2 and "(--nodes lets a job span nodes)" in single.stderr


def test_after_waits_for_success_and_fails_when_the_dependency_fails(head, tmp_path):
    # the first job runs until the test lets it end: a busy machine's slow CLI never
    # lets it finish before the second is submitted
    go = tmp_path / "go"
    first = submit(head, "--gpu-mem", "4G", "--", "sh", "-c", f"while [ ! -e {go} ]; do sleep 0.1; done")
    second = submit(head, "--gpu-mem", "4G", "--after", str(first), "--", "true")
    assert "waits for job" in wait_for(lambda: head.job(second)["reason"], 10, what="a reason")
    assert head.job(second)["state"] == "pending"
    go.touch()
    assert head.wait_job(first)["state"] == "succeeded"
    assert head.wait_job(second)["state"] == "succeeded"

    broken = submit(head, "--gpu-mem", "4G", "--", "false")
    dependent = submit(head, "--gpu-mem", "4G", "--after", str(broken), "--", "true")
    assert head.wait_job(broken)["state"] == "failed"
    failed = head.wait_job(dependent)
    assert failed["state"] == "failed" and str(broken) in failed["reason"]

    unknown = head.run("submit", "--after", "999999", "--", "true")
    assert unknown.returncode == 1 and "no job 999999" in unknown.stderr


def test_over_quota_work_runs_on_idle_cards_as_preemptible(head):
    """quota_mode scavenge (the default): past the quota a job is not refused while cards
    sit idle; it runs as preemptible work (quota_mode refuse: tests/unit/test_lab_month.py)."""
    # a job first: a user with no usage at all has no standing to be over quota with
    assert head.run("submit", "--gpu-mem", "4G", "--wait", "--", "true").returncode == 0
    head.run("quota", "root", "0", check=True)
    try:
        job = submit(head, "--gpu-mem", "4G", "--", "true")
        done = head.wait_job(job)
        assert done["state"] == "succeeded" and done["preemptible"] is True
        users = {u["name"]: u for u in json.loads(head.run("users", "--json", check=True).stdout)}
        assert users["root"]["quota_gpu_hours"] == 0
    finally:
        head.run("quota", "root", "2000", check=True)
    assert head.run("submit", "--gpu-mem", "4G", "--wait", "--", "true").returncode == 0


def test_parse_topo_best_previews_a_k_gpu_job():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "nebula_tui", "parse", "topo",
                           str(SAMPLES / "topo" / "h100nvl_8gpu_nv12_pairs_2nic.txt"), "--best", "2"],
                          capture_output=True, text=True, check=True)
    result = json.loads(done.stdout)
    a, b = result["best"]
    assert result["links"][a][b] == "NV12"
