"""The walking skeleton end to end: real sshd nodes, real tmux, real SQLite, the real CLI."""

from __future__ import annotations

import json
import sqlite3
import time

from labkit.harness import wait_for
from support.head import gpu, running, submit, submitted_id
from support.shapes import reply_mismatches

from nebula_tui.wire import (DoctorReply, GpuHistoryReply, GpusReply, HistoryReply, JobDetailReply, JobReply, LogsReply,
                             NodeShowReply, PlanView, QueueReply, StatusReply, SubmitReply, WaitReply)


def test_a_job_on_a_slice_runs_nvidia_smi_and_frees_the_slice(head):
    done = head.run("submit", "--gpu-mem", "4G", "--wait", "--", "nvidia-smi")
    assert done.returncode == 0, done.stderr
    job_id = submitted_id(done.stdout)
    job = head.job(job_id)
    assert job["state"] == "succeeded" and job["exit_code"] == 0
    log = head.run("logs", str(job_id), check=True).stdout
    assert "NVIDIA-SMI" in log and "Driver Version:" in log and "Processes:" in log
    # The allocation was freed: no slice on any GPU names the job any more.
    assert all(job_id not in g["jobs"] for g in head.call("gpus")["gpus"])


def test_job_sees_its_devices_and_the_exit_code_is_recorded(head):
    done = head.run("submit", "--name", "env check", "--gpu-mem", "6G", "--wait", "--",
                    "sh", "-c", 'echo "$CUDA_VISIBLE_DEVICES $NEBULA_GPU_LIST $NEBULA_JOB_ID"; exit 3')
    assert done.returncode == 3
    job_id = submitted_id(done.stdout)
    job = head.job(job_id)
    assert job["state"] == "failed" and job["exit_code"] == 3
    stored = sqlite3.connect(head.home / "state.db").execute(
        "SELECT a.gpu_index, a.gpu_uuid, j.exit_code FROM allocations a JOIN jobs j ON j.id = a.job_id "
        "WHERE j.id = ?", [job_id]).fetchone()
    index, uuid, code = stored
    assert code == 3
    assert head.run("logs", str(job_id), check=True).stdout.strip() == f"{index} {uuid} {job_id}"


def test_10g_jobs_are_slices_spread_over_idle_cards_and_13g_takes_a_card_whole(head):
    first = submit(head, "--gpu-mem", "10G", "--", "sleep", "20")
    second = submit(head, "--gpu-mem", "10G", "--", "sleep", "20")
    whole = submit(head, "--gpu-mem", "13G", "--", "sleep", "20")
    try:
        a, b, c = running(head, first), running(head, second), running(head, whole)
        # no job waits for a whole card: the second slice goes to another idle, cool card
        assert a["gpus"][0]["uuid"] != b["gpus"][0]["uuid"]
        for job_id, placed in ((first, a), (second, b)):
            card = gpu(head, placed["gpus"][0]["uuid"])
            assert [(s["job"], s["memory_mb"], s["exclusive"]) for s in card["slices"]
                    if s["state"] == "allocated"] == [(job_id, 10240, False)]
            free = [s["memory_mb"] for s in card["slices"] if s["state"] == "free"]
            assert free == [card["total_memory_mb"] - 10240]  # the rest stays on offer
        taken = gpu(head, c["gpus"][0]["uuid"])
        assert c["gpus"][0]["exclusive"] and c["gpus"][0]["memory_mb"] == taken["total_memory_mb"]
        assert taken["slices"] == [{"id": 1, "memory_mb": taken["total_memory_mb"],
                                    "state": "allocated", "job": whole, "exclusive": True}]
        # The emulated card shows what the job really holds: 10 GB.
        wait_for(lambda: gpu(head, a["gpus"][0]["uuid"])["memory_used_mb"] == 10240, 10,
                 what="the first job's card to show 10 GB used")
    finally:
        for job_id in (first, second, whole):
            head.run("cancel", str(job_id))
        for job_id in (first, second, whole):
            head.wait_job(job_id)


def test_a_gang_job_never_starts_with_part_of_its_gpus(head):
    blocker = submit(head, "--gpu-count", "3", "--gpu-mem", "70G", "--", "sleep", "60")
    gang = None
    try:
        held = running(head, blocker)
        assert {g["node"] for g in held["gpus"]} == {"node02"} and len(held["gpus"]) == 3
        gang = submit(head, "--gpu-count", "2", "--gpu-mem", "70G", "--", "sleep", "1")
        waiting = wait_for(lambda: (j := head.job(gang))["reason"].startswith("needs") and j, 10,
                           what="a waiting reason")
        assert waiting["state"] == "pending" and waiting["gpus"] == []
        assert waiting["reason"].startswith("needs 2 GPUs with ≥70 GB free on one node; best now: "
                                            "node02 has 1; node02:")
        assert f"held by job {blocker}" in waiting["reason"]
        queue = head.run("queue", check=True).stdout
        assert "best now: node02 has 1" in queue
        head.run("cancel", str(blocker), check=True)
        done = head.wait_job(gang, timeout=40)
        assert done["state"] == "succeeded"
        starts = sqlite3.connect(head.home / "state.db").execute(
            "SELECT count(*) FROM allocations WHERE job_id = ?", [gang]).fetchone()[0]
        assert starts == 2
    finally:
        head.run("cancel", str(blocker))
        if gang:
            head.run("cancel", str(gang))


def test_arguments_reach_the_node_literally(head):
    nasty = ["a;b", "$(echo pwned)", "`id`", "it's", 'say "hi"', "line\nbreak", "*"]
    done = head.run("submit", "--gpu-mem", "4G", "--wait", "--", "printf", "[%s]\\n", *nasty)
    assert done.returncode == 0, done.stderr
    job_id = submitted_id(done.stdout)
    log = head.run("logs", str(job_id), check=True).stdout
    assert log == "".join(f"[{arg}]\n" for arg in nasty)


def test_shell_command_and_workdir(head, tmp_path):
    (tmp_path / "marker.txt").write_text("here")
    done = head.run("submit", "--gpu-mem", "4G", "--workdir", str(tmp_path), "--wait",
                    "--command", "cat marker.txt && echo \" and $((1+2))\"")
    assert done.returncode == 0, done.stderr
    job_id = submitted_id(done.stdout)
    assert head.run("logs", str(job_id), check=True).stdout == "here and 3\n"


def test_missing_workdir_fails_clearly(head):
    done = head.run("submit", "--gpu-mem", "4G", "--workdir", "/no/such/dir", "--wait", "--", "true")
    assert done.returncode == 127
    job_id = submitted_id(done.stdout)
    assert head.job(job_id)["reason"].startswith("--workdir /no/such/dir does not exist on node0")
    assert head.run("logs", str(job_id)).stdout == f"nebula: {head.job(job_id)['reason']}\n"


def test_logs_follow_streams_until_the_end(head):
    job_id = submit(head, "--gpu-mem", "4G", "--", "sh", "-c", "echo one; sleep 1; echo two")
    done = head.run("logs", "-f", str(job_id), timeout=30)
    assert done.stdout == "one\ntwo\n"


def test_a_requeued_jobs_earlier_attempt_keeps_its_own_log(head, tmp_path):
    """Each run of a job logs apart: after a requeue, --attempt 1 is the first run's output,
    --attempt 2 and the default the second's; an attempt it never had is one line."""
    job_id = submit(head, "--gpu-mem", "4G", "--workdir", str(tmp_path), "--command",
                    'n=$(( $(cat runs 2>/dev/null || echo 0) + 1 )); echo $n > runs; '
                    'echo "run $n"; exec sleep 60')
    try:
        running(head, job_id)
        wait_for(lambda: head.run("logs", str(job_id)).stdout == "run 1\n", 20,
                 what="the first run's line")
        assert head.run("logs", "--attempt", "1", str(job_id), check=True).stdout == "run 1\n"
        head.run("requeue", str(job_id), check=True)
        wait_for(lambda: (j := head.job(job_id))["attempt"] == 1 and j["state"] == "running", 40,
                 what="the job to run again")
        wait_for(lambda: head.run("logs", str(job_id)).stdout == "run 2\n", 20,
                 what="the second run's line")
        assert head.run("logs", "--attempt", "2", str(job_id), check=True).stdout == "run 2\n"
        first = head.run("logs", "--attempt", "1", str(job_id), check=True).stdout
        # the first run's line, and what its shell said of the SIGUSR1 that ended it
        assert first.startswith("run 1\n") and "run 2" not in first
        assert head.run("logs", "--attempt", "1", "--rank", "0", "--tail", "5", str(job_id),
                        check=True).stdout == first
        # The first run is over: following it ends at its end while the job runs on.
        followed = head.run("logs", "--attempt", "1", "-f", str(job_id), timeout=20)
        assert (followed.returncode, followed.stdout) == (0, first)
        followed = head.run("logs", "--attempt", "1", "--rank", "0", "-f", str(job_id), timeout=20)
        assert (followed.returncode, followed.stdout) == (0, first)
        refused = head.run("logs", "--attempt", "3", str(job_id))
        assert (refused.returncode, refused.stdout) == (1, "")
        assert refused.stderr == (f"nebula: job {job_id} has no attempt 3; its attempts: 1, 2 "
                                  "(1 is its first run)\n")
        bad = head.run("logs", "--attempt", "0", str(job_id))
        assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--attempt" in bad.stderr
    finally:
        head.run("cancel", str(job_id))


def test_status_prints_the_r1_overview(head):
    # Utilisation and memory come from the probe: wait for one taken after the last test's
    # jobs ended and their memory was given back.
    text = wait_for(lambda: (out := head.run("status", check=True).stdout).count("load 0%") == 3
                    and "(free: 424 GB)" in out and out, 10, what="an idle probe")
    assert text.splitlines()[:5] == [
        "Cluster Overview:",
        "  Nodes: 3",
        "  GPUs: 9 (9 idle, 0 busy, 0 maintenance)",
        "  Total VRAM: 424 GB (free: 424 GB)",
        "Node Details:",
    ]
    assert "  node01: RTX 4090 x2, RTX 4060 Laptop x1, load 0%" in text
    summary = json.loads(head.run("status", "--json", check=True).stdout)
    assert summary["gpus"] == 9 and summary["nodes"] == 3


def test_gpus_json_has_the_r2_descriptor(head):
    gpus = json.loads(head.run("gpus", "--json", check=True).stdout)
    assert len(gpus) == 9
    a100 = next(g for g in gpus if g["node"] == "node02" and g["index"] == 0)
    for key in ("uuid", "node", "model", "total_memory_mb", "compute_capability", "pci_bus_id",
                "nvlink", "status", "slices", "vendor", "driver_version", "cuda_version"):
        assert key in a100
    assert a100["compute_capability"] == "sm_80" and a100["cuda_version"] == "12.4"
    assert {p["link"] for p in a100["nvlink"]} == {"NV12"} and len(a100["nvlink"]) == 3
    rtx3090 = next(g for g in gpus if g["node"] == "node03" and g["index"] == 0)
    assert rtx3090["nvlink"] == [{"gpu": 1, "link": "NV4"}]


def test_the_heads_replies_are_of_the_shapes_both_ends_import(head):
    """What the head process sends a client about jobs, the queue, GPUs and the status is of
    its shape in ``nebula_tui/wire.py``, keys and types: a job running on a node (with its
    environment, and its log as the node reads it), one waiting for it (--after), both once
    ended (their history rows); the node it ran on, shown and checked by the doctor, and its
    card's samples."""
    since = time.time() - 1
    replies = []

    def ask(op, shape, **fields):
        reply = head.call(op, **fields)
        replies.append((op, reply, shape))
        return reply

    ran = ask("submit", SubmitReply, command=["sleep", "30"], gpu_count=1, gpu_mem_mb=4096)["job"]["id"]
    after = ask("submit", SubmitReply, command=["true"], gpu_count=1, after=[ran])["job"]["id"]
    try:
        running(head, ran)
        ask("job", JobDetailReply, job=ran)
        ask("job", JobDetailReply, job=after)
        ask("queue", QueueReply)
        ask("plan", PlanView, command=["true"], gpu_count=1)
        ask("status", StatusReply)
        ask("gpus", GpusReply)
        node = ask("job", JobDetailReply, job=ran)["job"]["node"]
        ask("logs", LogsReply, job=ran)
        ask("node_show", NodeShowReply, node=node)
        ask("doctor", DoctorReply, nodes=[node])
        ask("history", GpuHistoryReply, gpu=f"{node}:0")
    finally:
        ask("cancel", JobReply, job=ran)
        for job_id in (ran, after):
            wait_for(lambda: ask("wait", WaitReply, job=job_id, within=5)["ended"], 60, what=f"job {job_id} to end")
    ask("job", JobDetailReply, job=ran)
    history = ask("job_history", HistoryReply, since=since)
    assert {ran, after} <= {job["id"] for job in history["jobs"]}
    found = [line for op, reply, shape in replies for line in reply_mismatches(reply, shape, op)]
    assert not found, "\n".join(found)


def test_bad_input_gets_one_line_and_touches_nothing(head):
    before = head.call("queue")["jobs"]
    cases = [
        (("submit", "--gpu-mem", "abc", "--", "true"), 2, "--gpu-mem"),
        (("submit", "--gpu-count", "0", "--", "true"), 2, "--gpu-count"),
        (("submit", "--gpu-mem", "4G"), 2, "nothing to run"),
        (("cancel", "99999"), 1, "no job 99999"),
        (("logs", "abc"), 2, "not a job id"),
    ]
    for args, code, words in cases:
        done = head.run(*args)
        assert done.returncode == code, (args, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1 and words in done.stderr
        assert "Traceback" not in done.stderr
    assert head.call("queue")["jobs"] == before
