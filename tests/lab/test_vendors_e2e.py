"""Every card in the lab, end to end on real sshd: the demo's Intel, Ascend and AMD nodes
beside an NVIDIA one, R1's lines, vendor-filtered jobs that see their own device
variables, memory they hold seen by their vendor's tool, an impossible reading flagged,
and a broken tool shown on its node. Then ``nebula demo`` itself.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from labkit.harness import wait_for
from nebula_tui.sim import fake_smi, faults, presets
from labkit.harness import HeadProcess
from nebula_tui.sim.lab import Lab, find_sshd
from support.head import log, submit

pytestmark = pytest.mark.lab  # a lab of their own

REPO = Path(__file__).resolve().parents[2]
PRINT_DEVICES = ("import json, os; print(json.dumps({k: os.environ.get(k) for k in ("
                 "'CUDA_VISIBLE_DEVICES', 'ZE_AFFINITY_MASK', 'ONEAPI_DEVICE_SELECTOR', "
                 "'ASCEND_RT_VISIBLE_DEVICES', 'ROCR_VISIBLE_DEVICES', 'HIP_VISIBLE_DEVICES', "
                 "'NEBULA_GPU_LIST')}))")

try:
    find_sshd()
except Exception as err:  # noqa: BLE001
    pytest.skip(str(err), allow_module_level=True)


MIG_UUIDS = ("MIG-11111111-2222-3333-4444-555555555555", "MIG-66666666-7777-8888-9999-000000000000")


def mig_node() -> dict:
    """node07: one A100 split into two 3g.40gb MIG instances (seen through NVML)."""
    spec = presets.node_specs("core")[1]
    a100 = dict(spec["gpus"][0], mig=[{"uuid": u, "profile": "3g.40gb", "memory_total_mb": 40192}
                                      for u in MIG_UUIDS])
    return dict(spec, name="node07", gpus=[a100], topo={})


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """node03 (two RTX 3090), the demo's node04–node06 and a MIG node, on real sshd, with a
    head."""
    specs = [presets.node_specs("demo")[2]] + presets.node_specs("demo")[3:] + [mig_node()]
    lab = Lab(tmp_path_factory.mktemp("vendorlab"), specs=specs, ssh="openssh", probe_interval=1.0)
    lab.prepare()
    lab.start()
    head = HeadProcess(tmp_path_factory.mktemp("vendorhead"), lab)
    try:
        head.start(timeout=90)
        yield lab, head
    finally:
        head.stop()
        lab.stop()


def devices_seen(head: HeadProcess, job: int) -> dict:
    done = head.wait_job(job, 60)
    assert done["state"] == "succeeded", done
    return json.loads(log(head, job).strip().splitlines()[-1])


def test_status_shows_every_vendors_node(mixed):
    _, head = mixed
    text = head.run("status", check=True).stdout
    assert "  node04: Intel Arc A770 x1, load 0%" in text
    assert "  node05: Ascend 910B2 x2, load 0%" in text
    assert "  node06: AMD Instinct MI210 x2, load 0%" in text
    assert "  node03: RTX 3090 x2, load 0%" in text
    gpus = {g["uuid"]: g for g in head.call("gpus")["gpus"]}
    intel = next(g for g in gpus.values() if g["vendor"] == "intel")
    assert (intel["model"], intel["total_memory_mb"], intel["node"]) == (
        "Intel(R) Arc(TM) A770 Graphics", 16288, "node04")
    amd = [g for g in gpus.values() if g["vendor"] == "amd"]
    assert {g["compute_capability"] for g in amd} == {"gfx90a"}
    assert {g["vendor"] for g in gpus.values()} == {"nvidia", "intel", "ascend", "amd"}


def test_vendor_jobs_see_their_own_devices(mixed):
    _, head = mixed
    intel = devices_seen(head, submit(head, "--vendor", "intel", "--", sys.executable, "-c", PRINT_DEVICES))
    assert (intel["ZE_AFFINITY_MASK"], intel["ONEAPI_DEVICE_SELECTOR"]) == ("0", "level_zero:0")
    assert intel["CUDA_VISIBLE_DEVICES"] == ""  # never the node's NVIDIA cards
    ascend = devices_seen(head, submit(head, "--vendor", "ascend", "--gpu-count", "2", "--",
                                       sys.executable, "-c", PRINT_DEVICES))
    assert sorted(ascend["ASCEND_RT_VISIBLE_DEVICES"].split(",")) == ["0", "1"]
    amd = devices_seen(head, submit(head, "--arch", "gfx90a", "--", sys.executable, "-c", PRINT_DEVICES))
    assert amd["ROCR_VISIBLE_DEVICES"] == amd["HIP_VISIBLE_DEVICES"] in ("0", "1")
    assert amd["CUDA_VISIBLE_DEVICES"] is None  # HIP reads it too: left alone
    nvidia = devices_seen(head, submit(head, "--vendor", "nvidia", "--", sys.executable, "-c", PRINT_DEVICES))
    assert nvidia["CUDA_VISIBLE_DEVICES"] in ("0", "1") and nvidia["ZE_AFFINITY_MASK"] is None


def test_a_mig_instance_is_a_device_a_job_is_given(mixed):
    lab, head = mixed
    if not (lab.node_dir("node07") / "lib" / "libnvidia-ml.so.1").exists():
        pytest.skip("no C compiler: the simulated NVML (which lists MIG instances) was not built")
    gpus = [g for g in head.call("gpus")["gpus"] if g["node"] == "node07"]
    card = next(g for g in gpus if g["uuid"].startswith("GPU-"))
    assert card["blocked"] == "MIG mode is on: jobs get its MIG instances"
    assert sorted(g["uuid"] for g in gpus if g["uuid"].startswith("MIG-")) == sorted(MIG_UUIDS)
    seen = devices_seen(head, submit(head, "--arch", "sm_80", "--gpu-mem", "8G", "--",
                                     sys.executable, "-c", PRINT_DEVICES))
    assert seen["CUDA_VISIBLE_DEVICES"] in MIG_UUIDS and seen["NEBULA_GPU_LIST"] == seen["CUDA_VISIBLE_DEVICES"]


def test_a_job_on_an_ascend_chip_holds_its_memory_as_on_nvidia(mixed):
    _, head = mixed
    job = submit(head, "--vendor", "ascend", "--gpu-mem", "8G", "--", "sleep", "60")
    try:
        running = wait_for(lambda: (j := head.job(job))["state"] == "running" and j, 30, what="running")
        uuid = running["gpus"][0]["uuid"]
        held = wait_for(lambda: (g := next(x for x in head.call("gpus")["gpus"] if x["uuid"] == uuid))
                        ["memory_used_mb"] == 8192 and g, 20, what="npu-smi to show the job's 8 GB")
        assert [p["job_id"] for p in held["processes"]] == [job]
        assert held["unmanaged_used_mb"] == 0
    finally:
        head.run("cancel", str(job))


def test_an_impossible_reading_is_clamped_and_named_in_an_event(mixed):
    lab, head = mixed
    node04 = lab.node_dir("node04")
    fake_smi.update_faults(str(node04), lambda gpus: gpus.update({"intel:0": {"util": 200}}))
    try:
        event = wait_for(lambda: next((e for e in head.call("events", limit=200)["events"]
                                       if e["kind"] == "hardware"), None), 20, what="a hardware event")
        assert event["message"] == ("node04:0 (Intel(R) Arc(TM) A770 Graphics) reported "
                                    "utilisation 200%, which cannot be; shown as 100%")
        assert event["node"] == "node04"
        gpu = next(g for g in head.call("gpus")["gpus"] if g["node"] == "node04")
        assert gpu["utilization_pct"] == 100
    finally:
        fake_smi.update_faults(str(node04), lambda gpus: gpus.pop("intel:0", None))


def test_a_broken_tool_is_shown_on_its_node_and_the_others_go_on(mixed):
    lab, head = mixed
    faults.set_tool_fault(lab.node_dir("node05"), "npu-smi", "garbage")
    try:
        line = wait_for(lambda: next((l for l in head.run("status").stdout.splitlines()
                                      if l.startswith("  node05:") and "npu-smi" in l), None),
                        20, what="node05's reason in status")
        assert "npu-smi printed no NPU it can read" in line
        node = next(n for n in head.call("status")["nodes"] if n["name"] == "node05")
        assert node["state"] == "up"
        assert all(n["state"] == "up" and not n["reason"] for n in head.call("status")["nodes"]
                   if n["name"] != "node05")
    finally:
        faults.set_tool_fault(lab.node_dir("node05"), "npu-smi", None)
    wait_for(lambda: not next(n for n in head.call("status")["nodes"] if n["name"] == "node05")["reason"],
             20, what="node05's reason to clear")


def test_nebula_demo_status_shows_the_intel_and_ascend_nodes(tmp_path):
    home = tmp_path / "home"
    env = dict(os.environ, HOME=str(home), NEBULA_HOME=str(home / ".nebula"))
    env.pop("NEBULA_CONFIG", None)
    env.pop("NEBULA_SOCKET", None)
    demo = subprocess.Popen([sys.executable, "-m", "nebula_tui", "demo", "--headless"], cwd=REPO,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        exports = {}
        for line in demo.stdout:
            if line.strip().startswith("export "):
                exports = dict(item.split("=", 1) for item in line.split()[1:])
                break
        assert exports, "the demo printed no environment"
        run_env = dict(env, **exports)

        def status() -> str:
            return subprocess.run([sys.executable, "-m", "nebula_tui", "status"], cwd=REPO, env=run_env,
                                  capture_output=True, text=True, timeout=60).stdout

        text = wait_for(lambda: (s := status()) and "Intel Arc A770 x1" in s and "Ascend 910B2 x2" in s
                        and s, 120, interval=1, what="the demo's status to show every vendor")
        assert "  node04: Intel Arc A770 x1" in text and "  node05: Ascend 910B2 x2" in text
        assert "  Nodes: 6" in text
    finally:
        os.killpg(demo.pid, signal.SIGINT)
        try:
            demo.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(demo.pid, signal.SIGKILL)


def test_a_default_vendor_places_jobs_that_name_none(mixed, tmp_path):
    """A mixed lab whose jobs mostly need one vendor says so once in nodes.yaml: a job that
    names no vendor (and no arch) gets that vendor's cards; --vendor any takes any card."""
    lab, _ = mixed
    config = yaml.safe_load(lab.config_path.read_text())
    config["scheduler"] = {"default_vendor": "intel"}
    path = tmp_path / "nodes-intel.yaml"
    path.write_text(yaml.safe_dump(config))
    head = HeadProcess(tmp_path / "home", lab, config=path)
    try:
        head.start(timeout=90)
        intel = devices_seen(head, submit(head, "--", sys.executable, "-c", PRINT_DEVICES))
        assert (intel["ZE_AFFINITY_MASK"], intel["CUDA_VISIBLE_DEVICES"]) == ("0", "")
        assert head.job(submit(head, "--vendor", "any", "--", "true"))["vendor"] is None
        amd = devices_seen(head, submit(head, "--arch", "gfx90a", "--", sys.executable, "-c", PRINT_DEVICES))
        assert amd["ROCR_VISIBLE_DEVICES"] in ("0", "1")  # its arch said whose cards
    finally:
        head.stop()


def test_a_process_named_with_a_line_break_neither_hides_nor_gets_a_job_killed(mixed):
    """npu-smi prints names unquoted: an outsider whose argv[0] holds a line break forged a
    row of 30 GB on a job's pid (the memory guard kills at first sight past its grace) and
    hid its own row. The node believes no row of a table a name broke: the guard judges
    no one there, and what the job did not reserve stays out of the scheduler's hands."""
    lab, head = mixed
    node05 = lab.node_dir("node05")
    job = submit(head, "--vendor", "ascend", "--gpu-mem", "8G", "--", "sleep", "120")
    forger = None
    try:
        running = wait_for(lambda: (j := head.job(job))["state"] == "running" and j, 30, what="running")
        uuid = running["gpus"][0]["uuid"]
        gpu = wait_for(lambda: (g := next(x for x in head.call("gpus")["gpus"] if x["uuid"] == uuid))
                       ["processes"] and g, 20, what="the job's process on its chip")
        (victim,) = [p["pid"] for p in gpu["processes"]]
        spec = next(s for s in presets.node_specs("demo") if s["name"] == "node05")
        chips = {d["uuid"]: d["index"] for d in spec["devices"]}
        other = next(u for u in chips if u != uuid)
        name = f"x\n|{chips[uuid]} 0|{victim}|p|30000|"  # within npu-smi's 24 characters
        forger = subprocess.Popen(["bash", "-c", 'exec -a "$0" sleep 120', name], start_new_session=True,
                                  env=dict(os.environ, NEBULA_SIM_DIR=str(node05), NEBULA_SIM_NODE="node05",
                                           ASCEND_RT_VISIBLE_DEVICES=str(chips[other]), NEBULA_SIM_GPU_MEM="4G"))
        printed = subprocess.run([str(node05 / "bin" / "npu-smi"), "info"], capture_output=True, text=True,
                                 env=dict(os.environ, NEBULA_SIM_DIR=str(node05))).stdout
        assert f"|{chips[uuid]} 0|{victim}|p|30000|" in printed  # the forged row is there
        reason = wait_for(lambda: next(n for n in head.call("status")["nodes"] if n["name"] == "node05")["reason"],
                          20, what="node05 to say its process list is unreadable")
        assert "npu-smi's process list is unreadable" in reason
        seen = wait_for(lambda: (g := next(x for x in head.call("gpus")["gpus"] if x["uuid"] == other))
                        ["unmanaged_used_mb"] and g, 20, what="the forger's memory to count")
        assert seen["unmanaged_used_mb"] == 4096  # not hidden: what no job reserved is held
        time.sleep(5)  # five probes: the forged row would have made the guard speak by now
        assert not [e for e in head.call("events", limit=200)["events"] if f"job {job} holds" in e["message"]]
        assert head.job(job)["state"] == "running"
    finally:
        if forger is not None:
            os.killpg(forger.pid, signal.SIGKILL)
            forger.wait()
        head.run("cancel", str(job))
    wait_for(lambda: not next(n for n in head.call("status")["nodes"] if n["name"] == "node05")["reason"],
             20, what="node05's reason to clear once the forger is gone")
