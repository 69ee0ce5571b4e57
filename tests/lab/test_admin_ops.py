"""Hold/release, drain/resume, plan, history, attach, events and users, through the real CLI."""

from __future__ import annotations

import json

import pytest
from labkit.harness import wait_for

from nebula_tui.api import ApiError
from support.head import submit


def node(head, name: str) -> dict:
    return next(n for n in head.call("status")["nodes"] if n["name"] == name)


def test_a_held_job_waits_until_released(head):
    job = submit(head, "--gpu-mem", "4G", "--", "true")
    head.run("hold", str(job))  # it may already have started; then hold is refused
    state = head.job(job)
    if state["state"] != "pending":
        head.wait_job(job)
        return
    assert state["held"] and "held by" in state["reason"]
    for _ in range(3):  # several scheduler passes go by
        assert head.job(job)["state"] == "pending"
    out = head.run("release", str(job), check=True).stdout
    assert out.startswith(f"Released job {job}")
    assert head.wait_job(job)["state"] == "succeeded"


def test_hold_of_a_running_job_is_refused_in_one_line(head):
    job = submit(head, "--gpu-mem", "4G", "--", "sleep", "20")
    try:
        wait_for(lambda: head.job(job)["state"] == "running", 20, what="running")
        done = head.run("hold", str(job))
        assert done.returncode == 1 and "only waiting jobs can be held" in done.stderr
        assert done.stderr.count("\n") == 1
    finally:
        head.run("cancel", str(job))
        head.wait_job(job)


def test_a_drained_node_takes_no_new_jobs_and_stays_drained(head):
    assert head.run("node", "drain", "node02", "--reason", "fan check", check=True).returncode == 0
    try:
        drained = node(head, "node02")
        assert drained["state"] == "drained" and drained["reason"] == "fan check"
        # Only node02's A100s could take 70 GB: the job waits and says so.
        job = submit(head, "--gpu-mem", "70G", "--", "true")
        reason = wait_for(lambda: (j := head.job(job))["reason"].startswith("needs") and j["reason"],
                          10, what="a waiting reason")
        assert head.job(job)["state"] == "pending", reason
        plan = head.call("plan", command=["true"], gpu_mem_mb=70 * 1024)
        assert plan["decision"] == "wait"
        status = head.run("status", check=True).stdout
        assert "node02: A100-SXM4-80GB x4, load" in status and "[drained: fan check]" in status
    finally:
        head.run("node", "resume", "node02", check=True)
    assert head.wait_job(job)["state"] == "succeeded"
    assert node(head, "node02")["state"] == "up"


def test_plan_previews_the_placement(head):
    plan = head.call("plan", command=["true"], gpu_mem_mb=4096)
    assert plan["decision"] == "start" and len(plan["gpus"]) == 1
    chosen = plan["gpus"][0]
    # A 4 GB slice, or a whole card when 4 GB is more than half of it (the 8 GB laptop card).
    assert chosen["memory_mb"] == 4096 and not chosen["exclusive"] or \
        chosen["exclusive"] and 4096 * 2 > chosen["memory_mb"]
    # The preview refuses what submit would refuse, in submit's words (a usage error).
    with pytest.raises(ApiError, match="could never start here: needs 16 GPUs") as refused:
        head.call("plan", command=["true"], gpu_count=16, gpu_mem_mb=4096)
    assert refused.value.usage and "has 4" in str(refused.value)  # node02's four A100s
    assert head.call("queue")["jobs"] == [] or all(j["id"] != -1 for j in head.call("queue")["jobs"])


def test_gpu_history_has_samples(head):
    gpu = head.call("gpus")["gpus"][0]
    card = f"{gpu['node']}:{gpu['index']}"
    reply = wait_for(lambda: (r := head.call("history", gpu=card, since=3600))["samples"] and r,
                     10, what="a telemetry sample")
    assert reply["gpu"] == gpu["uuid"]
    sample = reply["samples"][-1]
    assert sample["temperature_c"] is not None and sample["memory_used_mb"] is not None
    text = head.run("gpu", "history", f"{gpu['node']}:{gpu['index']}", "--since", "1h", check=True).stdout
    assert text.startswith(f"GPU {gpu['uuid']}") and "TEMP" in text
    bad = head.run("gpu", "history", "node09:7")
    assert bad.returncode == 1 and "no GPU node09:7" in bad.stderr


def test_attach_info_names_the_jobs_session(head):
    job = submit(head, "--gpu-mem", "4G", "--", "sleep", "20")
    try:
        wait_for(lambda: head.job(job)["state"] == "running", 20, what="running")
        # Through the service: nobody but the head needs the nodes' key.
        assert head.call("attach_info", job=job)["argv"] == ["nebula", "attach", str(job)]
    finally:
        head.run("cancel", str(job))
        head.wait_job(job)


def test_events_and_users(head):
    job = submit(head, "--gpu-mem", "4G", "--", "true")
    head.wait_job(job)
    events = head.run("events", "--limit", "200", check=True).stdout
    assert f"job {job} submitted by" in events and f"job {job} succeeded" in events
    users = json.loads(head.run("users", "--json", check=True).stdout)
    me = next(u for u in users if u["jobs_finished"] >= 1)
    assert me["running_jobs"] >= 0 and me["gpu_hours"] >= 0
