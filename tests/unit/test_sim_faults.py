"""Fault injection in the simulated lab, read back through the emulated tools as subprocesses."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nebula_tui.remote.backends.nvidia import parse_query_gpu, query_gpu_argv
from nebula_tui.remote.backends.xid import new_lines, parse_xid, pci_matches
from nebula_tui.model import Temperatures
from nebula_tui.scheduler.health import decide, is_throttling, judge_selftest
from nebula_tui.sim import faults, presets

SIM = Path(__file__).resolve().parents[2] / "nebula_tui" / "sim"
BOOT = 1_800_000_000.0

#: The health policy's default hot threshold.
HOT_C = Temperatures().hot_c


@pytest.fixture
def node(tmp_path):
    """node02 of the demo lab (four A100s), booted at BOOT, with an empty kernel log."""
    spec = dict(presets.node_specs("demo")[1], boot_time=BOOT)
    (tmp_path / "node.json").write_text(json.dumps(spec))
    (tmp_path / "kmsg.log").write_text("")
    return tmp_path


def tool(node_dir, script, *args, env=None):
    environ = dict(os.environ, NEBULA_SIM_DIR=str(node_dir))
    for key in ("NEBULA_SIM_NODE", "CUDA_VISIBLE_DEVICES"):
        environ.pop(key, None)  # the test runner itself must not look like a job
    environ.update(env or {})
    return subprocess.run([sys.executable, str(SIM / script), *args], env=environ,
                          capture_output=True, text=True, timeout=30)


def smi(node_dir, *args):
    return tool(node_dir, "fake_smi.py", *args)


def dmesg(node_dir, *args):
    return tool(node_dir, "fake_dmesg.py", *args)


def bus_ids(node_dir) -> dict[int, str]:
    out = smi(node_dir, "--query-gpu=index,pci.bus_id", "--format=csv,noheader").stdout
    return {int(i): bus for i, bus in (line.split(", ") for line in out.splitlines()
                                       if not line.startswith("Unable"))}


def selftest(node_dir, gpu: str) -> dict:
    """What the node's self-test gathers, run against the emulator as the node would."""
    done = smi(node_dir, "-i", gpu, "--query-gpu=temperature.gpu,ecc.errors.uncorrected.volatile.total",
               "--format=csv,noheader,nounits")
    result = {"smi_ok": done.returncode == 0, "smi_error": done.stdout if done.returncode else "",
              "temperature_c": None, "memory_test": None,
              "dcgm": {"ran": False, "ok": False, "detail": "dcgmi: command not found"}}
    if done.returncode == 0:
        temp, ecc = [cell.strip() for cell in done.stdout.strip().split(",")]
        result["temperature_c"] = float(temp)
        if ecc != "[N/A]":
            result["memory_test"] = {"ok": ecc == "0", "detail": f"{ecc} uncorrected ECC errors"}
    return result


def test_inject_xid_reads_back_to_the_right_gpu(node):
    buses = bus_ids(node)
    lines = faults.inject_xid(node, 2, 31, pid=os.getpid(), now=BOOT + 125.5)
    assert lines[-1].startswith("[  125.500000] NVRM: Xid (PCI:")
    assert f"): 31, pid={os.getpid()}, name=" in lines[-1]
    (event,) = parse_xid(dmesg(node).stdout)
    assert (event["code"], event["pid"], event["uptime_s"]) == (31, os.getpid(), 125.5)
    assert [i for i, bus in buses.items() if pci_matches(event["pci"], bus)] == [2]
    assert event["uuid"] == presets.node_specs("demo")[1]["gpus"][2]["uuid"]
    assert decide(event, [], BOOT + 125.5).kind == "fail_job"


def test_inject_by_uuid_and_bad_names(node):
    uuid = presets.node_specs("demo")[1]["gpus"][3]["uuid"]
    faults.inject_xid(node, uuid, 13, now=BOOT + 10)
    (event,) = parse_xid((node / "kmsg.log").read_text())
    assert event["uuid"] == uuid and event["pid"] is None
    with pytest.raises(ValueError, match="no GPU '7' on this node; it has 0 "):
        faults.inject_xid(node, 7, 79)
    with pytest.raises(ValueError, match="not an Xid code"):
        faults.inject_xid(node, 0, -3)


def test_xid79_loses_the_gpu_like_a_real_machine(node):
    buses = bus_ids(node)
    faults.inject_xid(node, 1, 79, now=BOOT + 500)
    events = parse_xid(dmesg(node).stdout)
    # The driver's repeat ("GPU 0000:…: GPU has fallen off the bus.") is the same event.
    assert [(e["code"], pci_matches(e["pci"], buses[1])) for e in events] == [(79, True)]
    done = smi(node, *query_gpu_argv()[1:])
    assert done.returncode == 15
    assert done.stdout.splitlines()[0] == (f"Unable to determine the device handle for "
                                           f"GPU{buses[1][4:]}: Unknown Error")
    assert [g.index for g in parse_query_gpu(done.stdout)] == [0, 2, 3]
    assert smi(node, "-L").returncode == 15
    # The self-test fails; a reset cannot help a card that is off the bus.
    ok, sentence = judge_selftest(selftest(node, "1"))
    assert not ok and "Unable to determine the device handle" in sentence
    reset = smi(node, "-r", "-i", "1")
    assert reset.returncode == 15 and "Unable to reset GPU" in reset.stdout
    # Twice within the window: isolated until an admin resumes it.
    first = events[0]
    faults.inject_xid(node, 1, 79, now=BOOT + 700)
    second = parse_xid(dmesg(node).stdout)[-1]
    assert decide(second, [(BOOT + 500, first["code"])], BOOT + 700).kind == "isolate"
    # Reseated: answers again and passes its self-test.
    faults.clear_gpu_faults(node, 1)
    assert smi(node, *query_gpu_argv()[1:]).returncode == 0
    ok, sentence = judge_selftest(selftest(node, "1"))
    assert ok, sentence


def test_xid48_fails_the_memory_check_until_a_reset(node):
    lines = faults.inject_xid(node, 0, 48, now=BOOT + 50)
    # A100s remap the row: the driver follows the 48 with a 63.
    assert [e["code"] for e in parse_xid("\n".join(lines))] == [48, 63]
    ok, sentence = judge_selftest(selftest(node, "0"))
    assert not ok and "memory test: 1 uncorrected ECC errors" in sentence
    done = smi(node, "-r", "-i", "0")
    assert done.returncode == 0
    assert done.stdout == "GPU 00000000:03:00.0 was successfully reset.\nAll done.\n"
    ok, sentence = judge_selftest(selftest(node, "0"))
    assert ok and "memory test ok" in sentence


def test_reset_is_refused_while_a_job_runs_or_when_the_card_fails(node):
    env = dict(os.environ, NEBULA_SIM_DIR=str(node), CUDA_VISIBLE_DEVICES="2")
    job = subprocess.Popen(["sleep", "30"], env=env, start_new_session=True)
    try:
        time.sleep(0.2)
        done = smi(node, "-r", "-i", "2")
        assert done.returncode == 255 and "is currently in use by another process" in done.stdout
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
    faults.set_fault(node, 3, reset_fails=True)
    done = smi(node, "-r", "-i", "3")
    assert done.returncode == 255 and "Unable to reset GPU 00000000:" in done.stdout


def test_xid119_banners_are_written_and_ignored(node):
    lines = faults.inject_xid(node, 0, 119, now=BOOT + 9)
    assert sum("_kgspLogXid119" in line for line in lines) == 3
    (event,) = parse_xid(dmesg(node, "-T").stdout)
    assert event["code"] == 119 and "_kgsp" not in event["text"] and event["time"]
    assert decide(event, [], BOOT + 9).kind == "reset"


def test_throttle_shows_in_query_gpu(node):
    fields = "index,temperature.gpu,utilization.gpu,clocks.sm,clocks.default_applications.graphics," \
             "clocks_event_reasons.hw_thermal_slowdown"
    faults.set_throttle(node, 1, True)
    rows = [line.split(", ") for line in
            smi(node, f"--query-gpu={fields}", "--format=csv,noheader,nounits").stdout.splitlines()]
    assert rows[1][1:3] == ["88", "12"] and rows[1][5] == "Active"
    assert int(rows[1][3]) < int(rows[1][4])  # below base clock
    assert rows[0][5] == "Not Active"
    readings = parse_query_gpu(smi(node, *query_gpu_argv()[1:]).stdout)
    base = float(rows[1][4])
    assert [is_throttling(r, base, HOT_C) for r in readings] == [False, True, False, False]
    ok, sentence = judge_selftest(selftest(node, "1"))
    assert not ok and "88 °C while idle" in sentence
    faults.set_throttle(node, 1, False)
    readings = parse_query_gpu(smi(node, *query_gpu_argv()[1:]).stdout)
    assert not any(is_throttling(r, base, HOT_C) for r in readings)
    assert faults.gpu_faults(node) == {}


def test_throttle_keeps_other_faults(node):
    faults.inject_xid(node, 1, 48, now=BOOT + 1)
    faults.set_throttle(node, 1, True)
    faults.set_throttle(node, 1, False)
    assert faults.gpu_faults(node) == {"1": {"ecc_uncorrected": 1}}


def test_dmesg_ctime_reindents_continuations(node):
    (node / "kmsg.log").write_text(
        "[   12.500000] NVRM: The NVIDIA GPU 0000:03:00.0\n"
        "               NVRM: (PCI ID: 10de:20b2) installed in this system has\n"
        "               NVRM: fallen off the bus and is not responding to commands.\n")
    plain = dmesg(node).stdout
    stamped = dmesg(node, "-T").stdout.splitlines()
    width = stamped[0].index("]") + 2
    assert all(line.startswith(" " * width + "NVRM:") for line in stamped[1:])
    for text in (plain, "\n".join(stamped)):
        (event,) = parse_xid(text)
        assert event["code"] is None and event["text"].endswith("not responding to commands.")


def test_dmesg_clear_and_restricted(node):
    faults.inject_xid(node, 0, 13, now=BOOT + 3)
    assert dmesg(node, "-C").returncode == 0 and dmesg(node).stdout == ""
    spec = json.loads((node / "node.json").read_text())
    (node / "node.json").write_text(json.dumps(dict(spec, dmesg_restrict=True)))
    done = dmesg(node)
    assert done.returncode == 1 and "read kernel buffer failed: Operation not permitted" in done.stderr


def test_cursor_over_the_emulated_dmesg_through_a_reboot(node):
    def look(cursor):
        boot = faults.boot_id(node) or "real-boot-id"
        return new_lines(dmesg(node).stdout, cursor, boot)

    faults.inject_xid(node, 0, 79, now=BOOT + 100)  # before NebulaGrid looked: history
    lines, cursor = look(None)
    assert lines == []
    faults.inject_xid(node, 1, 43, now=BOOT + 200)
    lines, cursor = look(cursor)
    assert [e["code"] for e in parse_xid("\n".join(lines))] == [43]
    lines, cursor = look(cursor)
    assert lines == []
    new_id = faults.reboot(node, now=BOOT + 5000)
    assert faults.boot_id(node) == new_id and faults.gpu_faults(node) == {}
    assert smi(node, *query_gpu_argv()[1:]).returncode == 0  # the lost card is back
    faults.inject_xid(node, 2, 79, now=BOOT + 5010)
    lines, cursor = look(cursor)
    assert lines[0].endswith("(simulated boot)")  # the whole new boot is new …
    events = parse_xid("\n".join(lines))
    assert [(e["code"], e["uptime_s"]) for e in events] == [(79, 10.0)]  # … and only it
