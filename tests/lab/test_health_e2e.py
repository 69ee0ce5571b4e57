"""GPU health end to end (R15–R17, R19) on the simulated lab with real sshd.

A head of its own (home, store, socket) runs on the session's OpenSSH lab with a 3 s
isolation grace; faults are injected with the real CLI (``nebula sim …``), which writes
the kernel lines and tool answers a sick card gives. Every fault is undone at the end:
the lab is shared with the rest of the session.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from labkit.harness import wait_for
from support.labfixtures import lab_config, serving
from nebula_tui.sim import faults
from labkit.harness import HeadProcess
from support.head import gpu, submitted_id

REPO = Path(__file__).resolve().parents[2]
GRACE_S = 3
# Traps SIGUSR1: writes its checkpoint and keeps going (so the grace ends in SIGKILL).
KEEPS_RUNNING = ('trap \'echo saved > "{dir}/ckpt-$NEBULA_JOB_ID-$NEBULA_GPU_LIST"\' USR1; '
                 'while :; do sleep 0.2; done')
# Traps SIGUSR1: writes its checkpoint and exits, as a well-behaved trainer does.
CHECKPOINTS_AND_EXITS = ('trap \'echo saved > "{dir}/ckpt-$NEBULA_JOB_ID"; exit 0\' USR1; '
                         'while :; do sleep 0.2; done')


@pytest.fixture(scope="module")
def health(openssh_lab, tmp_path_factory):
    """A head with ``health.isolation_grace: 3s`` whose cluster file sits in the lab
    directory (``nebula sim`` finds the lab beside it)."""
    path = lab_config(openssh_lab, "health", health={"isolation_grace": f"{GRACE_S}s"})
    for node in openssh_lab.nodes:  # a fresh kernel-log cursor: what is logged now is history
        (openssh_lab.node_dir(node) / "node" / "kmsg-cursor.json").unlink(missing_ok=True)
    try:
        yield from serving(openssh_lab, tmp_path_factory.mktemp("health-home"), path)
    finally:
        for node in openssh_lab.nodes:
            for gpu in json.loads((openssh_lab.node_dir(node) / "node.json").read_text())["gpus"]:
                faults.clear_gpu_faults(openssh_lab.node_dir(node), gpu["index"])


def sim(head: HeadProcess, *args: str) -> str:
    done = head.run("sim", *args)
    assert done.returncode == 0, done.stderr
    return done.stdout


def event_with(head: HeadProcess, text: str, timeout: float = 20, since: float = 0.0) -> dict:
    """The first event (written at or after ``since``) whose message holds ``text``."""
    try:
        return wait_for(lambda: next((e for e in head.call("events", limit=400)["events"]
                                      if text in e["message"] and e["t"] >= since), None),
                        timeout, what=f"event '{text}'")
    except AssertionError as missing:  # say what was written instead
        written = [e["message"] for e in head.call("events", limit=400)["events"]
                   if e["t"] >= since]
        raise AssertionError(f"{missing}; written since: {written[-12:]}") from None


def submit_running(head: HeadProcess, command: str, *flags: str) -> dict:
    done = head.run("submit", *flags, "--command", command, check=True)
    job_id = submitted_id(done.stdout)
    return wait_for(lambda: (j := head.job(job_id))["state"] == "running" and j, 20,
                    what=f"job {job_id} to run")


def cancel(head: HeadProcess, job_id: int) -> None:
    if head.job(job_id)["state"] in ("running", "launching", "pending"):
        head.call("cancel", job=job_id)
        head.wait_job(job_id)


def test_nodelet_reads_the_kernel_log_with_the_parsers_cursor():
    # The node runs the very code the parsers use: it is shipped with the nodelet.
    from nebula_tui.remote.backends import xid
    from nebula_tui.node import kmsg_cursor
    from nebula_tui.remote.ssh import nodelet_source

    assert xid.new_lines is kmsg_cursor.new_lines
    shipped = nodelet_source().decode()
    assert shipped.count("def new_lines(") == 1
    assert shipped.index("def new_lines(") < shipped.index("new_lines(text, self.cursor")
    assert "def new_lines(" not in (REPO / "nebula_tui/node/nodelet.py").read_text()


def test_parse_xid_prints_events(health, tmp_path):
    gpu = {"index": 0, "uuid": "GPU-11111111-2222-3333-4444-555555555555",
           "pci_bus_id": "00000000:01:00.0", "name": "NVIDIA A100-SXM4-80GB"}
    log = tmp_path / "kern.log"
    log.write_text("\n".join(faults.xid_lines(gpu, 79, None, 100.0, first=True)
                             + faults.xid_lines(gpu, 31, 4242, 101.5, first=False)) + "\n")
    done = health.run("parse", "xid", str(log), check=True)
    events = json.loads(done.stdout)
    assert [(e["code"], e["pci"], e["pid"]) for e in events] == [
        (79, "0000:01:00", None), (31, "0000:01:00", 4242)]
    assert events[0]["uuid"] == gpu["uuid"]  # the "GPU at PCI" line named the card


@pytest.mark.slow
def test_xid79_once_is_transient_twice_isolates_until_an_admin_resumes(health, openssh_lab,
                                                                         tmp_path):
    job = submit_running(health, KEEPS_RUNNING.format(dir=tmp_path))
    first = job["gpus"][0]
    label, uuid, where = f"{first['node']}:{first['index']}", first["uuid"], \
        openssh_lab.node_dir(first["node"])

    # Once: the card came back by itself (a transient fall); a self-test, and it stays.
    # (A card the driver reports lost is out at once: this one answers again before any probe.)
    faults.inject_xid(where, first["index"], 79, lose=False)
    event_with(health, f"{label} keeps serving: self-test passed")
    assert gpu(health, uuid)["status"] != "maintenance"
    assert health.job(job["id"])["state"] == "running"

    # Twice within 10 minutes: isolated, the job checkpoints, is killed, restarts elsewhere.
    sim(health, "inject", "xid", "79", "--node", first["node"], "--gpu", str(first["index"]))
    # The card is gone: `lost` while the driver says so, in maintenance until resumed.
    isolated = wait_for(lambda: (g := gpu(health, uuid))["status"] in ("maintenance", "lost") and g,
                        10, what=f"{label} out of service")
    # The probe may see the card lost before the kernel's line is read: either way, isolated.
    event_with(health, f"{label}: Xid 79 twice within 10 min")
    assert "check the slot and the power cable" in isolated["blocked"]
    checkpoint = tmp_path / f"ckpt-{job['id']}-{uuid}"
    wait_for(checkpoint.exists, 10, what="the job's checkpoint after SIGUSR1")
    event_with(health, f"job {job['id']} still running {GRACE_S} s after SIGUSR1: SIGKILL")
    again = wait_for(lambda: (j := health.job(job["id"]))["state"] == "running"
                     and j["attempt"] == 1 and j, 20, what="the job to run again")
    assert again["gpus"][0]["uuid"] != uuid
    assert "requeued: GPU " + label in event_with(health, f"job {job['id']} requeued")["message"]

    # The card is gone: no self-test is run on it, and only an admin brings it back, as its
    # one maintenance line says once (it said it twice: the policy's advice, then again).
    kept = event_with(health, f"{label} in maintenance")
    assert kept["message"].count("nebula gpu resume") == 1, kept["message"]
    assert gpu(health, uuid)["blocked"].count("nebula gpu resume") == 1
    said = [e["message"] for e in health.call("events", limit=400)["events"] if e.get("gpu") == uuid]
    assert not any("stays in maintenance" in m or ": self-test failed" in m for m in said), said
    faults.clear_gpu_faults(where, first["index"])  # reseated
    wait_for(lambda: gpu(health, uuid)["status"] == "maintenance", 10, what=f"{label} answering")
    done = health.run("gpu", "resume", label)
    assert done.returncode == 0, done.stderr
    assert gpu(health, uuid)["status"] != "maintenance" and gpu(health, uuid)["blocked"] is None
    event_with(health, f"{label} resumed by")
    cancel(health, job["id"])


@pytest.mark.slow
def test_a_card_lost_mid_job_is_taken_out_resumed_only_after_its_self_test(health, openssh_lab,
                                                                            tmp_path):
    """The driver loses a card under a running job (NVML: GPU is lost; nvidia-smi: Unknown
    Error). It is `lost` and never offered, its job checkpoints and runs elsewhere; a resume
    while it is still lost is refused; reseated, the resume runs its self-test first; and a
    second Xid 79 within the window after that resume isolates it again."""
    job = submit_running(health, KEEPS_RUNNING.format(dir=tmp_path))
    card = job["gpus"][0]
    label, uuid, where = f"{card['node']}:{card['index']}", card["uuid"], \
        openssh_lab.node_dir(card["node"])
    since = time.time()
    faults.set_fault(where, card["index"], lost=True)  # no Xid: the driver just lost it
    lost = wait_for(lambda: (g := gpu(health, uuid))["status"] == "lost" and g, 10,
                    what=f"{label} lost")
    assert "GPU is lost" in lost["blocked"] or "Unknown Error" in lost["blocked"]
    event_with(health, f"{label} in maintenance: the driver lost {label}", since=since)
    wait_for((tmp_path / f"ckpt-{job['id']}-{uuid}").exists, 10, what="the checkpoint")
    again = wait_for(lambda: (j := health.job(job["id"]))["state"] == "running"
                     and j["attempt"] == 1 and j, 20, what="the job to run again")
    assert again["gpus"][0]["uuid"] != uuid
    assert "requeued: GPU " + label in event_with(health, f"job {job['id']} requeued",
                                                  since=since)["message"]

    refused = health.run("gpu", "resume", label)
    assert refused.returncode != 0 and "still lost" in refused.stderr, refused.stderr
    assert gpu(health, uuid)["status"] == "lost"

    faults.clear_gpu_faults(where, card["index"])  # reseated
    event_with(health, f"{label} answers again", since=since)
    assert gpu(health, uuid)["status"] == "maintenance"
    resumed = health.run("gpu", "resume", label)
    assert resumed.returncode == 0, resumed.stderr
    assert "self-test passed" in resumed.stdout
    assert event_with(health, f"{label}: self-test passed", since=since)["t"] <= \
        event_with(health, f"{label} resumed by", since=since)["t"]
    assert gpu(health, uuid)["status"] != "maintenance"

    # Resuming kept the window: a fall within 10 minutes of the loss is the second one.
    since = time.time()
    faults.inject_xid(where, card["index"], 79, lose=False)
    event_with(health, f"{label}: Xid 79 twice within 10 min", since=since)
    wait_for(lambda: gpu(health, uuid)["status"] == "maintenance", 10, what=f"{label} isolated")
    event_with(health, f"{label} stays in maintenance", since=since)
    forced = health.run("gpu", "resume", "--force", label)
    assert forced.returncode == 0, forced.stderr
    event_with(health, f"{label} resumed by", since=since)
    assert "with --force" in event_with(health, f"{label} resumed by", since=since)["message"]
    cancel(health, job["id"])


@pytest.mark.parametrize("code", ["48", "43", "119"])  # isolate (ECC); reset (stopped, GSP)
def test_xid_isolates_resets_and_returns_the_gpu_by_itself(health, openssh_lab, tmp_path, code):
    job = submit_running(health, CHECKPOINTS_AND_EXITS.format(dir=tmp_path))
    first = job["gpus"][0]
    label, uuid = f"{first['node']}:{first['index']}", first["uuid"]
    since = time.time()  # the same card may have been through this before (other codes)
    sim(health, "inject", "xid", code, "--node", first["node"], "--gpu", str(first["index"]))
    wait_for(lambda: gpu(health, uuid)["status"] == "maintenance", 10, what=f"{label} isolated")
    event_with(health, f"{label} in maintenance: Xid {code} (", since=since)
    wait_for((tmp_path / f"ckpt-{job['id']}").exists, 10, what="the checkpoint")
    # It exited by itself after its checkpoint: requeued, not ended, and running elsewhere.
    event_with(health, f"job {job['id']} ended after SIGUSR1")
    again = wait_for(lambda: (j := health.job(job["id"]))["state"] == "running"
                     and j["attempt"] == 1 and j, 20, what="the job to run again")
    assert again["gpus"][0]["uuid"] != uuid
    event_with(health, f"{label}: GPU reset done", since=since)
    event_with(health, f"{label} back in service: self-test passed", since=since)
    assert gpu(health, uuid)["status"] != "maintenance"
    cancel(health, job["id"])


def test_xid13_runs_a_self_test_and_the_gpu_keeps_serving(health, openssh_lab, tmp_path):
    job = submit_running(health, KEEPS_RUNNING.format(dir=tmp_path), "--gpu-mem", "4G")
    card = job["gpus"][0]
    label, uuid = f"{card['node']}:{card['index']}", card["uuid"]
    # As hot as a laptop card under two jobs runs: too hot for an idle card, not for a busy one
    # (it was isolated for it, its jobs taken away).
    node_dir = openssh_lab.node_dir(card["node"])
    faults.set_fault(node_dir, card["index"], temp_c=83)
    try:
        since = time.time()
        sim(health, "inject", "xid", "13", "--node", card["node"], "--gpu", str(card["index"]))
        event_with(health, f"{label}: Xid 13 (graphics engine exception): logged; running a "
                           "memory and temperature self-test", since=since)
        event_with(health, f"{label} keeps serving: self-test passed: nvidia-smi answered, 83 °C",
                   since=since)
    finally:
        faults.clear_gpu_faults(node_dir, card["index"])
    # Nothing was taken away: the job runs on, unsignalled, and the card was never isolated.
    assert health.job(job["id"])["state"] == "running"
    assert not list(tmp_path.glob(f"ckpt-{job['id']}*")), "the job was signalled"
    assert gpu(health, uuid)["status"] != "maintenance"
    assert not any(f"{label} in maintenance" in e["message"] and e["t"] >= since
                   for e in health.call("events", limit=400)["events"])
    cancel(health, job["id"])


def test_no_requeue_job_fails_when_its_gpu_is_isolated(health, openssh_lab, tmp_path):
    job = submit_running(health, CHECKPOINTS_AND_EXITS.format(dir=tmp_path), "--no-requeue")
    first = job["gpus"][0]
    label = f"{first['node']}:{first['index']}"
    sim(health, "inject", "xid", "95", "--node", first["node"], "--gpu", str(first["index"]))
    ended = health.wait_job(job["id"], 20)
    assert ended["state"] == "failed" and ended["attempt"] == 0
    assert f"GPU {label} was isolated (Xid 95" in ended["reason"]
    assert "not requeued (--no-requeue)" in ended["reason"]
    assert (tmp_path / f"ckpt-{job['id']}").exists()
    event_with(health, f"{label} back in service: self-test passed")


def _job_pid(head: HeadProcess, uuid: str, job_id: int) -> int:
    """The pid of ``job_id``'s process on the GPU, as nvidia-smi lists it."""
    def find():
        for process in gpu(head, uuid)["processes"]:
            try:
                environ = Path(f"/proc/{process['pid']}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if f"NEBULA_JOB_ID={job_id}".encode() in environ:
                return process["pid"]
        return None
    return wait_for(find, 10, what=f"job {job_id}'s process on the GPU")


def test_xid31_fails_only_the_offending_job(health, openssh_lab, tmp_path):
    culprit = submit_running(health, KEEPS_RUNNING.format(dir=tmp_path), "--gpu-mem", "4G")
    card = culprit["gpus"][0]
    bystander = submit_running(health, KEEPS_RUNNING.format(dir=tmp_path), "--gpu-mem", "4G")
    pid = _job_pid(health, card["uuid"], culprit["id"])
    sim(health, "inject", "xid", "31", "--node", card["node"], "--gpu", str(card["index"]),
        "--pid", str(pid))
    ended = health.wait_job(culprit["id"], 20)
    assert ended["state"] == "failed" and "Xid 31" in ended["reason"]
    assert f"pid {pid}" in ended["reason"]
    assert health.job(bystander["id"])["state"] == "running"
    assert gpu(health, card["uuid"])["status"] != "maintenance"
    cancel(health, bystander["id"])


@pytest.mark.slow
def test_a_silent_node_is_unknown_and_gets_nothing_new(health, openssh_lab):
    def node() -> dict:
        return next(n for n in health.call("status")["nodes"] if n["name"] == "node03")

    ids: list[int] = []
    sim(health, "node", "down", "node03")
    try:
        wait_for(lambda: node()["state"] == "unknown", 10, what="node03 unknown")
        gpus = [g for g in health.call("gpus")["gpus"] if g["node"] == "node03"]
        assert gpus and all(g["blocked"] == "node node03 is unknown" for g in gpus)
        # Enough whole-card jobs to fill every other card: none goes to node03.
        jobs = [health.run("submit", "--command", "sleep 30", check=True) for _ in range(8)]
        ids += [int(d.stdout.split()[2]) for d in jobs]
        wait_for(lambda: sum(health.job(i)["state"] == "running" for i in ids) >= 6, 20,
                 what="the other nodes' cards to fill")
        assert all(health.job(i)["node"] != "node03" for i in ids)
        waiting = [health.job(i) for i in ids if health.job(i)["state"] == "pending"]
        assert waiting and all("node03" not in (j["node"] or "") for j in waiting)
        for i in ids:
            health.call("cancel", job=i)
        sim(health, "node", "up", "node03")
        wait_for(lambda: node()["state"] == "up", 20, what="node03 back")
    finally:
        # Hand node03's sshd back to the lab object, which the rest of the session uses.
        health.run("sim", "node", "down", "node03")
        openssh_lab.start_node("node03")
        wait_for(lambda: node()["state"] == "up", 20, what="node03 back under the lab")
        for i in ids:
            health.wait_job(i)


def test_throttling_lowers_the_health_score_and_moves_placement(health, openssh_lab):
    # Last in this module: the score recovers over hours, not within this head's life.
    before = health.call("plan", command=["true"])
    assert before["decision"] == "start"
    chosen = before["gpus"][0]
    sim(health, "throttle", chosen["node"], str(chosen["index"]))
    try:
        label = f"{chosen['node']}:{chosen['index']}"
        seen = event_with(health, f"{label}: suspected thermal throttling")
        assert f"{chosen['node']}'s health score is now 0.85" in seen["message"]
        after = health.call("plan", command=["true"])
        assert after["decision"] == "start" and after["gpus"][0]["node"] != chosen["node"]
        job = submit_running(health, "sleep 30")
        assert job["node"] != chosen["node"]
        cancel(health, job["id"])
    finally:
        sim(health, "throttle", chosen["node"], str(chosen["index"]), "--off")
    event_with(health, f"{chosen['node']}:{chosen['index']}: throttling ended")


def test_an_eviction_cut_short_by_a_head_restart_is_carried_out(health, openssh_lab, tmp_path):
    """The head dies during an isolation's grace: once back, the job is not left running on
    the isolated card but checkpointed, killed and requeued as if nothing had happened."""
    job = submit_running(health, KEEPS_RUNNING.format(dir=tmp_path))
    first = job["gpus"][0]
    label, uuid = f"{first['node']}:{first['index']}", first["uuid"]
    checkpoint = tmp_path / f"ckpt-{job['id']}-{uuid}"
    sim(health, "inject", "xid", "48", "--node", first["node"], "--gpu", str(first["index"]))
    wait_for(checkpoint.exists, 10, interval=0.05, what="the job's checkpoint after SIGUSR1")
    health.kill()  # within the grace: the SIGKILL and the requeue were still to come
    checkpoint.unlink()
    try:
        health.start()
        assert health.job(job["id"])["attempt"] == 0, "the restart came after the eviction"
        assert gpu(health, uuid)["status"] == "maintenance"
        wait_for(checkpoint.exists, 20, what="SIGUSR1 again from the restarted head")
        event_with(health, f"job {job['id']} still running {GRACE_S} s after SIGUSR1: SIGKILL")
        again = wait_for(lambda: (j := health.job(job["id"]))["state"] == "running"
                         and j["attempt"] == 1 and j, 20, what="the job to run again")
        assert again["gpus"][0]["uuid"] != uuid
    finally:
        faults.clear_gpu_faults(openssh_lab.node_dir(first["node"]), first["index"])
        if gpu(health, uuid)["status"] == "maintenance":
            assert health.run("gpu", "resume", label).returncode == 0
        cancel(health, job["id"])


def events_since(head, since: float, gpu_uuid: str) -> list[dict]:
    return [e for e in head.call("events", limit=400)["events"] if e["t"] >= since and e.get("gpu") == gpu_uuid]


def test_one_xid79_is_one_fall_and_one_health_line(health, openssh_lab):
    """A single Xid 79 that makes the driver lose the card reached the head twice (the
    kernel's line, the driver's "lost") and read "Xid 79 twice within 10 min"; one fault
    wrote 5 lines of kind health. Either order of the two reports, on three cards."""
    cards = health.call("gpus")["gpus"][:3]
    try:
        for card in cards:
            label, uuid = f"{card['node']}:{card['index']}", card["uuid"]
            since = time.time()
            sim(health, "inject", "xid", "79", "--node", card["node"], "--gpu", str(card["index"]))
            # both reports of the fall are in: the driver's (lost) and the kernel's (an xid line)
            wait_for(lambda: gpu(health, uuid)["status"] == "lost" and
                     any(e["kind"] == "xid" for e in events_since(health, since, uuid)), 15,
                     what=f"{label} lost, and its Xid line")
            written = events_since(health, since, uuid)
            said = [e["message"] for e in written]
            assert not any("twice" in m for m in said), said
            assert len([e for e in written if e["kind"] == "health"]) == 1, said
    finally:
        for card in cards:
            faults.clear_gpu_faults(openssh_lab.node_dir(card["node"]), card["index"])
        for card in cards:
            wait_for(lambda: gpu(health, card["uuid"])["status"] != "lost", 15, what="the card back")
            if gpu(health, card["uuid"])["status"] == "maintenance":
                health.run("gpu", "resume", f"{card['node']}:{card['index']}", check=True)


def test_a_forced_resume_of_a_card_still_lost_says_what_it_takes(health, openssh_lab):
    """`gpu resume --force` said "it takes new jobs again" while the card stayed lost."""
    card = health.call("gpus")["gpus"][-1]
    label, uuid, where = f"{card['node']}:{card['index']}", card["uuid"], openssh_lab.node_dir(card["node"])
    faults.set_fault(where, card["index"], lost=True)
    try:
        wait_for(lambda: gpu(health, uuid)["status"] == "lost", 15, what=f"{label} lost")
        forced = health.run("gpu", "resume", "--force", label)
        assert forced.returncode == 1, forced.stdout
        assert "takes new jobs" not in forced.stdout
        assert f"reseat it or power-cycle {card['node']}" in forced.stderr, forced.stderr
        assert gpu(health, uuid)["status"] == "lost"
    finally:
        faults.clear_gpu_faults(where, card["index"])
    wait_for(lambda: gpu(health, uuid)["status"] == "maintenance", 15, what=f"{label} answering again")
    resumed = health.run("gpu", "resume", "--force", label)
    assert resumed.returncode == 0 and "takes new jobs again" in resumed.stdout, resumed.stderr
    assert gpu(health, uuid)["status"] != "maintenance"
