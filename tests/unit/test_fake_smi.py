"""The emulated nvidia-smi, run as a real subprocess, read back by the real parsers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support.samples import SAMPLES

from nebula_tui.remote.backends.nvidia import (
    QUERY_APPS_FIELDS,
    parse_plain_table,
    parse_query_apps,
    parse_query_gpu,
    query_apps_argv,
    query_gpu_argv,
)
from nebula_tui.sim import presets

SIM = Path(__file__).resolve().parents[2] / "nebula_tui" / "sim"
FAKE_SMI = SIM / "fake_smi.py"
FAKE_DMESG = SIM / "fake_dmesg.py"


@pytest.fixture
def node_dir(tmp_path):
    spec = presets.node_specs("demo")[0]
    (tmp_path / "node.json").write_text(json.dumps(spec))
    return tmp_path


def smi(node_dir, *args, check=True):
    env = dict(os.environ, NEBULA_SIM_DIR=str(node_dir))
    for key in ("NEBULA_SIM_NODE", "CUDA_VISIBLE_DEVICES"):
        env.pop(key, None)  # the test runner itself must not look like a job
    done = subprocess.run([sys.executable, str(FAKE_SMI), *args], env=env, capture_output=True,
                          text=True, timeout=30)
    if check:
        assert done.returncode == 0, done.stdout + done.stderr
    return done


def test_presets_are_deterministic_and_distinct():
    first, again = presets.node_specs("demo"), presets.node_specs("demo")
    assert first == again
    for layout in (first, presets.node_specs("4x4")):
        gpus = [g for node in layout for g in node["gpus"] + node["devices"]]
        assert len({g["uuid"] for g in gpus}) == len(gpus)
    for node in first:
        devices = node["gpus"] + node["devices"]
        assert len({g["pci_bus_id"] for g in devices}) == len(devices)
    assert [len(n["gpus"]) for n in first] == [3, 4, 2, 0, 0, 0]
    assert [[d["vendor"] for d in n["devices"]] for n in first[3:]] == [
        ["intel"], ["ascend", "ascend"], ["amd", "amd"]]
    assert presets.node_specs("core") == first[:3]
    assert first[2]["topo"]["GPU0"]["GPU1"] == "NV4"
    with pytest.raises(ValueError, match="unknown lab layout"):
        presets.node_specs("nope")


def test_probe_query_round_trip(node_dir):
    out = smi(node_dir, *query_gpu_argv()[1:]).stdout
    gpus = parse_query_gpu(out)
    spec = presets.node_specs("demo")[0]["gpus"]
    assert [g.uuid for g in gpus] == [g["uuid"] for g in spec]
    assert [g.memory_total_mb for g in gpus] == [24564, 24564, 8188]
    assert gpus[2].name == "NVIDIA GeForce RTX 4060 Laptop GPU" and gpus[2].fan_pct is None
    assert gpus[0].compute_cap == "8.9" and gpus[0].driver_version == "550.54.15"
    assert gpus[0].memory_used_mb == 1 and gpus[0].utilization_pct == 0


def test_csv_header_matches_real_tool(node_dir):
    real = (SAMPLES / "smi_csv" / "a10_lms_loop_timestamp_pstate_mem.csv").read_text().splitlines()
    fields = "timestamp,pstate,temperature.gpu,utilization.gpu,utilization.memory,memory.total,memory.free,memory.used"
    lines = smi(node_dir, f"--query-gpu={fields}", "--format=csv").stdout.splitlines()
    assert lines[0] == real[0]
    assert len(lines) == 4
    # Same shape of values: "2024/01/16 14:44:16.977, P8, 25, 0 %, 0 %, 23028 MiB, …"
    shape = lambda line: [c.split(" ")[1:] for c in line.split(", ")[1:]]  # noqa: E731
    assert shape(lines[1]) == shape(real[1])
    real_h200 = (SAMPLES / "smi_csv" / "h200_8gpu_index_name_memtotal_driver_powerlimit_pstate.csv").read_text()
    ours = smi(node_dir, "--query-gpu=index,name,memory.total,driver_version,power.limit,pstate",
               "--format=csv").stdout
    assert ours.splitlines()[0] == real_h200.splitlines()[0]
    assert ours.splitlines()[1] == "0, NVIDIA GeForce RTX 4090, 24564 MiB, 550.54.15, 450.00 W, P8"


def test_apps_header_only_when_idle(node_dir):
    real = (SAMPLES / "smi_csv" / "rtxpro6000_compute_apps_header_only_no_procs.csv").read_text()
    out = smi(node_dir, "--query-compute-apps=" + ",".join(QUERY_APPS_FIELDS), "--format=csv").stdout
    assert out.splitlines() == real.splitlines()
    assert smi(node_dir, *query_apps_argv()[1:]).stdout == ""


def test_unknown_field_and_option(node_dir):
    done = smi(node_dir, "--query-gpu=index,xyz", "--format=csv", check=False)
    assert done.returncode == 2 and 'Field "xyz" is not a valid field to query.' in done.stdout
    assert smi(node_dir, "--bogus", check=False).returncode == 2
    assert smi(node_dir, "-i", "9", "--query-gpu=index", "--format=csv", check=False).returncode == 6


def test_select_and_list(node_dir):
    out = smi(node_dir, "-i", "1", "--query-gpu=index,pcie.link.width.current,clocks.max.sm",
              "--format=csv,noheader,nounits").stdout
    assert out == "1, 16, 2520\n"
    lines = smi(node_dir, "-L").stdout.splitlines()
    assert lines[2].startswith("GPU 2: NVIDIA GeForce RTX 4060 Laptop GPU (UUID: GPU-")


def test_topo_is_tab_separated_like_560(node_dir):
    real = (SAMPLES / "topo" / "rtx3090_2gpu_nv4_bridge.txt").read_text()
    ours = smi(node_dir, "topo", "-m").stdout
    assert ours.splitlines()[0] == "\tGPU0\tGPU1\tGPU2\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID"
    assert ours.splitlines()[1] == "GPU0\t X \tPHB\tSYS\t0-31\t0\t\tN/A"
    assert ours[ours.index("\nLegend:"):] == real[real.index("\nLegend:"):]


def test_plain_table_shape(node_dir):
    real = (SAMPLES / "smi_plain" / "rtx3090_2gpu_560_vllm_processes.txt").read_text().splitlines()
    ours = smi(node_dir).stdout.splitlines()
    assert len(ours[0]) == len(real[0])
    assert {len(line) for line in ours[1:]} == {len(line) for line in real[1:]} == {89, 91}
    assert ours[3:8] == real[3:8]  # column headings, byte for byte
    table = parse_plain_table("\n".join(ours))
    assert table["driver_version"] == "550.54.15" and table["cuda_version"] == "12.4"
    assert [g["memory_total_mb"] for g in table["gpus"]] == [24564, 24564, 8188]
    assert table["gpus"][2]["name"] == "NVIDIA GeForce RTX 4060 ..."


def test_lost_gpu(node_dir):
    (node_dir / "faults.json").write_text(json.dumps({"gpus": {"0": {"lost": True}, "1": {"temp_c": 88}}}))
    done = smi(node_dir, *query_gpu_argv()[1:], check=False)
    assert done.returncode == 15
    bus = presets.node_specs("demo")[0]["gpus"][0]["pci_bus_id"][4:]
    assert done.stdout.splitlines()[0] == (f"Unable to determine the device handle for "
                                           f"GPU{bus}: Unknown Error")
    gpus = parse_query_gpu(done.stdout)
    assert [g.index for g in gpus] == [1, 2] and gpus[0].temperature_c == 88
    assert smi(node_dir, check=False).returncode == 15


def test_real_process_shows_as_usage(node_dir):
    env = dict(os.environ, NEBULA_SIM_NODE="node01", CUDA_VISIBLE_DEVICES="1",
               NEBULA_SIM_GPU_MEM="6G")
    # A job's shell with a child: the tree must count once, under the shell.
    job = subprocess.Popen(["/bin/sh", "-c", "sleep 30; true"], env=env, start_new_session=True)
    try:
        time.sleep(0.3)
        gpus = parse_query_gpu(smi(node_dir, *query_gpu_argv()[1:]).stdout)
        assert [g.memory_used_mb for g in gpus] == [1, 6144, 1]
        assert gpus[1].utilization_pct == 60 and gpus[1].pstate == "P2"
        assert gpus[1].temperature_c > gpus[0].temperature_c
        (process,) = parse_query_apps(smi(node_dir, *query_apps_argv()[1:]).stdout)
        assert process.pid == job.pid and process.used_memory_mb == 6144
        assert process.gpu_uuid == gpus[1].uuid and process.name == "/bin/sh"
        table = parse_plain_table(smi(node_dir).stdout)
        assert [(p["gpu"], p["pid"]) for p in table["processes"]] == [(1, job.pid)]
    finally:
        os.killpg(job.pid, signal.SIGKILL)  # the shell and its sleep child
        job.wait()
    time.sleep(0.1)
    gpus = parse_query_gpu(smi(node_dir, *query_gpu_argv()[1:]).stdout)
    assert gpus[1].memory_used_mb == 1


def test_uuid_visible_devices_and_reservation_env(node_dir):
    uuid = presets.node_specs("demo")[0]["gpus"][0]["uuid"]
    env = dict(os.environ, NEBULA_SIM_NODE="node01", CUDA_VISIBLE_DEVICES=f"{uuid},2",
               NEBULA_GPU_MEM_MB="4096", NEBULA_SIM_GPU_UTIL="80")
    env.pop("NEBULA_SIM_GPU_MEM", None)
    job = subprocess.Popen(["sleep", "30"], env=env)
    try:
        time.sleep(0.2)
        gpus = parse_query_gpu(smi(node_dir, *query_gpu_argv()[1:]).stdout)
        assert [g.memory_used_mb for g in gpus] == [4096, 1, 4096]
        assert gpus[0].utilization_pct == 80
    finally:
        job.kill()
        job.wait()


def test_fake_dmesg(tmp_path):
    (tmp_path / "node.json").write_text(json.dumps({"name": "n", "boot_time": 1_800_000_000}))
    (tmp_path / "kmsg.log").write_text(
        "[  123.456789] NVRM: Xid (PCI:0000:01:00): 79, pid=0, GPU has fallen off the bus.\n")
    env = dict(os.environ, NEBULA_SIM_DIR=str(tmp_path))
    run = lambda *a: subprocess.run([sys.executable, str(FAKE_DMESG), *a], env=env,  # noqa: E731
                                    capture_output=True, text=True, timeout=30)
    assert run().stdout.startswith("[  123.456789] NVRM: Xid")
    stamped = run("-T").stdout
    expected = time.strftime("%a %b ", time.localtime(1_800_000_123))
    assert stamped.startswith("[" + expected) and "] NVRM: Xid (PCI:0000:01:00): 79" in stamped
    bad = run("-x")
    assert bad.returncode == 1 and "unrecognized option" in bad.stderr


def test_a_process_name_cannot_hide_or_invent_processes(node_dir, tmp_path, monkeypatch):
    """nvidia-smi prints a process's argv[0] unquoted: a comma in it once made the probe's
    whole list of processes unreadable (so a job hid its memory from the guard), and a
    newline in it made a row of its own (a 24 GB process no one runs, on another card)."""
    from nebula_tui.node.vendor_nvidia import NvidiaSmiBackend

    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "nvidia-smi").write_text(f"#!/bin/sh\nexec {sys.executable} {FAKE_SMI} \"$@\"\n")
    (tools / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}:{os.environ['PATH']}")
    monkeypatch.setenv("NEBULA_SIM_DIR", str(node_dir))
    monkeypatch.delenv("NEBULA_SIM_NODE", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    other = presets.node_specs("demo")[0]["gpus"][0]["uuid"]
    names = {"1": "evil,x", "2": f"x\n{other}, 1, fake, 24000"}
    jobs = [subprocess.Popen(["bash", "-c", 'exec -a "$0" sleep 30', name], start_new_session=True,
                             env=dict(os.environ, NEBULA_SIM_NODE="node01", CUDA_VISIBLE_DEVICES=card,
                                      NEBULA_SIM_GPU_MEM="6G"))
            for card, name in names.items()]
    try:
        time.sleep(0.5)
        seen = {p["pid"]: p for p in NvidiaSmiBackend().processes()}
        assert set(seen) == {job.pid for job in jobs}, seen
        assert [seen[job.pid]["name"] for job in jobs] == list(names.values())
        assert all(p["used_memory_mb"] == 6144 and p["gpu_uuid"] != other for p in seen.values())
        # A saved output with such a name still reads: the fields around it are fixed.
        (row,) = parse_query_apps(f"{other}, 42, evil,x, 100\n")
        assert (row.pid, row.name, row.used_memory_mb) == (42, "evil, x", 100)
    finally:
        for job in jobs:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
