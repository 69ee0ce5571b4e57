"""The node's hardware layer, run as the head ships it: the real nodelet payload, started in
a simulated node's environment (its emulated vendor tools, its NVML library), read line by
line. No SSH here (tests/lab/test_vendors_e2e.py does it end to end); the real pynvml, the
real tools' formats and real processes holding memory are all in play.
"""

from __future__ import annotations

import ast
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time

import pytest

from nebula_tui.remote import shipping
from nebula_tui.node import registry
from nebula_tui.sim import faults, fake_smi, nvml, presets
from nebula_tui.sim.lab import Lab

HAVE_CC = nvml.build() is not None
needs_cc = pytest.mark.skipif(not HAVE_CC, reason="no C compiler (cc) to build the simulated NVML")


# ------------------------------------------------------------------ shipped code
def _annotations(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign):
            found.append(f"line {node.lineno}: annotated assignment")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            if node.returns is not None or any(a.annotation is not None for a in
                                               args.args + args.kwonlyargs + args.posonlyargs):
                found.append(f"line {node.lineno}: annotated {node.name}")
    return found


@pytest.mark.parametrize("module", shipping.SHIPPED_MODULES)
def test_shipped_modules_are_stdlib_only_and_python_3_6(module):
    source = shipping._source(module)
    tree = ast.parse(source, feature_version=(3, 6))  # no walrus, no positional-only…
    assert "from __future__ import annotations" not in source
    assert _annotations(tree) == []  # 3.6 evaluates them, and list[str] fails there
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name.split(".")[0] for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module.split(".")[0]]
        else:
            continue
        for name in names:
            assert name in sys.stdlib_module_names or name == "pynvml", f"{module} imports {name}"


def test_the_payload_carries_pynvml_and_runs_its_modules_under_their_names():
    text = shipping.script()
    assert "'pynvml':" in text and "nvmlInitWithFlags" in text
    assert len(shipping.payload()) < len(text) / 3
    for module in shipping.SHIPPED_MODULES:
        assert repr(module) in text


def test_the_registry_lists_each_vendors_backends_preferred_first():
    entries = registry.REGISTRY
    assert [(name, vendor) for name, vendor, _, _ in entries] == [
        ("nvml", "nvidia"), ("nvidia-smi", "nvidia"), ("amd-smi", "amd"), ("rocm-smi", "amd"),
        ("xpu-smi", "intel"), ("npu-smi", "ascend")]
    for name, vendor, detector, loader in entries:
        backend = loader()
        assert (backend.name, backend.vendor) == (name, vendor) and callable(detector)
        for operation in ("initialize", "status", "processes", "cleanup"):
            assert callable(getattr(backend, operation))


# ------------------------------------------------------------------ a node, as shipped
class Nodelet:
    """The shipped nodelet running in a simulated node's environment."""

    def __init__(self, lab: Lab, name: str, **settings) -> None:
        payload = shipping.payload()
        settings = {"interval": 0.5, "init_wait": 4.0, "tool_timeout": 3.0, **settings}
        self.env = lab.session_env(name)
        self.process = subprocess.Popen(
            ["/bin/sh", "-c", shipping.boot_command(len(payload), settings)], env=self.env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True)
        self.process.stdin.write(payload)
        self.process.stdin.flush()
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.hello = self.next("hello", 30)

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.put(json.loads(line))
        self.lines.put(None)

    def next(self, kind: str, timeout: float = 20) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                message = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                break
            if message is None:
                raise AssertionError("the nodelet ended: " + self.process.stderr.read().decode())
            if message.get("type") == kind:
                return message
        raise AssertionError(f"no {kind} message within {timeout}s")

    def probe_until(self, predicate, timeout: float = 30) -> dict:
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            last = self.next("probe", timeout)
            if predicate(last):
                return last
        raise AssertionError(f"no probe matched within {timeout}s; last: {last}")

    def stop(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(10)


@pytest.fixture
def lab_of(tmp_path):
    """lab_of(specs) -> a prepared (not started: no SSH needed) lab of those node specs."""
    labs = []

    def make(specs: list[dict]) -> Lab:
        lab = Lab(tmp_path / f"lab{len(labs)}", specs=specs, ssh="asyncssh")
        lab.prepare()
        labs.append(lab)
        return lab

    yield make
    for lab in labs:
        lab._sweep()


@pytest.fixture
def nodelets():
    started: list[Nodelet] = []

    def start(lab: Lab, name: str, **settings) -> Nodelet:
        started.append(Nodelet(lab, name, **settings))
        return started[-1]

    yield start
    for nodelet in started:
        nodelet.stop()


def rtx_node(name: str, **extra) -> dict:
    spec = presets.node_specs("4x4")[0]
    return dict(spec, name=name, gpus=spec["gpus"][:2], topo={}, **extra)


@needs_cc
@pytest.mark.parametrize("nvml_on", [True, False], ids=["nvml", "nvidia-smi"])
def test_a_card_woken_through_cuda_reads_p0_for_a_while_on_either_path(lab_of, nodelets, nvml_on):
    # What the simulated CUDA driver appends when work on a card ends (sim/cuda_shim.c).
    lab = lab_of([rtx_node("wake01", **({} if nvml_on else {"nvml": False}))])
    now = time.time()
    (lab.node_dir("wake01") / "woken.tsv").write_text(
        f"0\t{now:.6f}\n1\t{now - fake_smi.WAKE_HOLD_S - 1:.6f}\n")
    node = nodelets(lab, "wake01")
    assert node.hello["backends"][0]["name"] == ("nvml" if nvml_on else "nvidia-smi")
    probe = node.probe_until(lambda p: by_index(p)[0]["pstate"] == "P0")
    assert by_index(probe)[1]["pstate"] == "P8"  # woken longer ago than the hold: idle again


def hold_memory(lab: Lab, node: str, variable: str, devices: str, mb: int) -> subprocess.Popen:
    """A process that the node's tools see holding ``mb`` on ``devices`` (as a job would)."""
    env = dict(lab.session_env(node), NEBULA_GPU_MEM_MB=str(mb), NEBULA_SIM_GPU_UTIL="40")
    env[variable] = devices
    return subprocess.Popen(["sleep", "120"], env=env)


def by_index(probe: dict) -> dict[int, dict]:
    return {d["index"]: d for d in probe["devices"]}


@needs_cc
def test_an_nvidia_node_reads_nvml_when_the_library_loads(lab_of, nodelets):
    lab = lab_of([rtx_node("nvml01")])
    job = hold_memory(lab, "nvml01", "CUDA_VISIBLE_DEVICES", "1", 6144)
    try:
        node = nodelets(lab, "nvml01")
        assert node.hello["backends"] == [{"name": "nvml", "vendor": "nvidia"}]
        assert node.hello["hardware_notes"] == [] and node.hello["problems"] == []
        assert (node.hello["cuda_version"], node.hello["driver_version"]) == ("12.4", "550.54.15")
        probe = node.probe_until(lambda p: by_index(p)[1]["memory_used_mb"] == 6144)
        gpu = by_index(probe)[1]
        assert gpu["utilization_pct"] == 40 and gpu["pstate"] == "P2"
        assert (gpu["base_sm_clock_mhz"], gpu["max_sm_clock_mhz"]) == (2016, 2520)
        assert (gpu["pcie_gen_max"], gpu["pcie_width_max"], gpu["compute_cap"]) == (4, 16, "8.9")
        assert gpu["throttle_reasons"] == [] and by_index(probe)[0]["throttle_reasons"] == ["gpu_idle"]
        assert gpu["ecc_uncorrected"] is None  # a GeForce card has no ECC: missing, not 0
        assert [(p["pid"], p["used_memory_mb"], p["gpu_uuid"]) for p in probe["processes"]] == [
            (job.pid, 6144, gpu["uuid"])]
    finally:
        job.kill()


@needs_cc
def test_the_fallback_to_nvidia_smi_reads_the_same(lab_of, nodelets):
    """Two nodes alike, one whose NVML cannot load: nvidia-smi serves it, says why, and
    reads what NVML reads."""
    lab = lab_of([rtx_node("with"), rtx_node("without", nvml=False)])
    jobs = [hold_memory(lab, n, "CUDA_VISIBLE_DEVICES", "0", 4096) for n in ("with", "without")]
    try:
        with_nvml, fallback = nodelets(lab, "with"), nodelets(lab, "without")
        assert fallback.hello["backends"] == [{"name": "nvidia-smi", "vendor": "nvidia"}]
        assert with_nvml.hello["backends"] == [{"name": "nvml", "vendor": "nvidia"}]
        a = by_index(with_nvml.probe_until(lambda p: by_index(p)[0]["memory_used_mb"] == 4096))
        b = by_index(fallback.probe_until(lambda p: by_index(p)[0]["memory_used_mb"] == 4096))
        for key in ("name", "memory_total_mb", "memory_used_mb", "utilization_pct", "temperature_c",
                    "power_limit_w", "fan_pct", "sm_clock_mhz", "mem_clock_mhz", "pstate",
                    "base_sm_clock_mhz", "max_sm_clock_mhz", "pcie_width_max", "compute_cap",
                    "throttle_reasons", "driver_version"):
            assert a[0][key] == b[0][key], key
        assert abs(a[0]["power_w"] - b[0]["power_w"]) < 0.01
    finally:
        for job in jobs:
            job.kill()


@needs_cc
def test_an_old_driver_lacking_calls_gives_missing_values_not_a_failed_probe(lab_of, nodelets):
    lab = lab_of([rtx_node("old01", nvml="old")])
    node = nodelets(lab, "old01")
    assert node.hello["backends"] == [{"name": "nvml", "vendor": "nvidia"}]
    gpu = by_index(node.next("probe"))[0]
    assert gpu["pcie_gen_max"] is None and gpu["remapped_rows_pending"] is None  # not in R450
    assert gpu["pcie_width_max"] == 16 and gpu["memory_total_mb"] == 24564
    assert gpu["throttle_reasons"] == ["gpu_idle"]  # the older name of the same call


@needs_cc
def test_nvml_reports_a_critical_xid_at_once_and_the_kernel_line_is_not_told_twice(lab_of, nodelets):
    lab = lab_of([rtx_node("xid01")])
    node = nodelets(lab, "xid01", interval=30.0)  # probes (and kernel-log looks) far apart
    node.next("probe")
    started = time.monotonic()
    faults.inject_xid(lab.node_dir("xid01"), 1, 43)
    told = node.next("kmsg", 5)
    assert time.monotonic() - started < 3  # NVML's event, not the next probe's look
    xids = [line for line in told["lines"] if "Xid" in line]
    assert len(xids) == 1 and ": 43, " in xids[0]
    with pytest.raises(AssertionError):  # the kernel's own line does not come again
        node.next("kmsg", 3)


def test_two_vendors_on_one_node_have_one_index_each(lab_of, nodelets):
    lab = lab_of(presets.node_specs("mixed"))
    node = nodelets(lab, "node01")
    assert {b["vendor"] for b in node.hello["backends"]} == {"nvidia", "intel"}
    devices = by_index(node.next("probe"))
    assert sorted(devices) == [0, 1]
    assert (devices[0]["vendor"], devices[0]["visible_env"], devices[0]["visible_id"]) == (
        "nvidia", "CUDA_VISIBLE_DEVICES", "0")
    assert (devices[1]["vendor"], devices[1]["name"], devices[1]["visible_env"],
            devices[1]["visible_id"]) == ("intel", "Intel(R) Arc(TM) A770 Graphics", "ZE_AFFINITY_MASK", "0")
    assert devices[1]["memory_total_mb"] == 16288  # from xpu-smi discovery -d 0


def test_each_vendor_tool_reads_its_devices_and_the_jobs_memory(lab_of, nodelets):
    specs = presets.node_specs("demo")[3:]  # node04 Intel, node05 Ascend, node06 AMD
    lab = lab_of(specs)
    holders = [hold_memory(lab, "node04", "ZE_AFFINITY_MASK", "0", 3072),
               hold_memory(lab, "node05", "ASCEND_RT_VISIBLE_DEVICES", "1", 5120),
               hold_memory(lab, "node06", "ROCR_VISIBLE_DEVICES", "0,1", 2048)]
    try:
        expected = {"node04": ("xpu-smi", {0: 3072}), "node05": ("npu-smi", {1: 5120}),
                    "node06": ("amd-smi", {0: 2048, 1: 2048})}
        for name, (tool, used) in expected.items():
            node = nodelets(lab, name)
            assert [b["name"] for b in node.hello["backends"]] == [tool]
            probe = node.probe_until(lambda p: all(by_index(p)[i]["memory_used_mb"] == mb
                                                   for i, mb in used.items()))
            spec = next(s for s in specs if s["name"] == name)
            assert [d["uuid"] for d in probe["devices"]] == [d["uuid"] for d in spec["devices"]]
            assert {p["used_memory_mb"] for p in probe["processes"]} == set(used.values())
            assert all(p["gpu_uuid"] for p in probe["processes"])
            if name == "node06":
                assert node.hello["links"] == {"GPU0": {"GPU1": "XGMI"}, "GPU1": {"GPU0": "XGMI"}}
                assert {d["compute_cap"] for d in probe["devices"]} == {"gfx90a"}
    finally:
        for holder in holders:
            holder.kill()


def test_rocm_smi_serves_when_amd_smi_is_missing(lab_of, nodelets):
    spec = dict(presets.node_specs("demo")[5], omit_tools=["amd-smi"])
    node = nodelets(lab_of([spec]), "node06")
    assert node.hello["backends"] == [{"name": "rocm-smi", "vendor": "amd"}]
    devices = node.next("probe")["devices"]
    assert [d["uuid"] for d in devices] == [d["uuid"] for d in spec["devices"]]  # the same ids
    assert {d["memory_total_mb"] for d in devices} == {65520}


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize("how", ["fail", "garbage", "newer"])
def test_a_broken_tool_is_one_line_and_the_other_vendor_keeps_working(lab_of, nodelets, how):
    lab = lab_of(presets.node_specs("mixed"))
    node = nodelets(lab, "node01")
    assert len(node.next("probe")["devices"]) == 2
    faults.set_tool_fault(lab.node_dir("node01"), "xpu-smi", how)
    probe = node.probe_until(lambda p: p["problems"])
    (problem,) = probe["problems"]
    assert "xpu-smi" in problem and "\n" not in problem and len(problem) < 300
    assert [d["vendor"] for d in probe["devices"]] == ["nvidia"]
    faults.set_tool_fault(lab.node_dir("node01"), "xpu-smi", None)
    back = node.probe_until(lambda p: not p["problems"])
    assert [d["vendor"] for d in back["devices"]] == ["nvidia", "intel"]


def test_a_hanging_tool_is_killed_and_its_devices_come_back(lab_of, nodelets):
    lab = lab_of(presets.node_specs("mixed"))
    node = nodelets(lab, "node01", tool_timeout=2.0)
    node.next("probe")
    faults.set_tool_fault(lab.node_dir("node01"), "xpu-smi", "hang")
    stuck = node.probe_until(lambda p: p["problems"], 20)
    assert [d["vendor"] for d in stuck["devices"]] == ["nvidia"]  # probes keep coming
    killed = node.probe_until(lambda p: any("killed" in x for x in p["problems"]), 20)
    assert killed["problems"] == ["xpu-smi did not answer within 2s (killed)"]
    faults.set_tool_fault(lab.node_dir("node01"), "xpu-smi", None)
    node.probe_until(lambda p: not p["problems"] and len(p["devices"]) == 2, 20)


def test_a_tool_that_hangs_from_the_start_leaves_the_hello_on_time(lab_of, nodelets):
    lab = lab_of(presets.node_specs("mixed"))
    faults.set_tool_fault(lab.node_dir("node01"), "xpu-smi", "hang")
    started = time.monotonic()
    node = nodelets(lab, "node01", init_wait=6.0, tool_timeout=60.0)
    assert time.monotonic() - started < 40  # the hello waited init_wait, not the tool's 60 s
    assert [b["vendor"] for b in node.hello["backends"]] == ["nvidia"]
    assert node.hello["problems"] == ["xpu-smi did not answer within 6s"]


def test_a_backend_slower_than_the_hello_joins_later(lab_of, nodelets):
    """xpu-smi takes longer to start than the hello waits (a loaded node): its device comes
    a little later, with the next index, and the problem goes."""
    lab = lab_of(presets.node_specs("mixed"))
    faults.set_tool_fault(lab.node_dir("node01"), "xpu-smi", "slow")  # 5 s a call
    node = nodelets(lab, "node01", init_wait=2.0, tool_timeout=20.0)
    assert [d["vendor"] for d in node.hello["devices"]] == ["nvidia"]
    assert node.hello["problems"] == ["xpu-smi did not answer within 2s"]
    faults.set_tool_fault(lab.node_dir("node01"), "xpu-smi", None)
    joined = node.probe_until(lambda p: len(p["devices"]) == 2 and not p["problems"], 60)
    assert [(d["index"], d["vendor"]) for d in joined["devices"]] == [(0, "nvidia"), (1, "intel")]


def test_a_node_with_no_gpu_tool_is_up_with_no_devices_and_says_why(lab_of, nodelets):
    spec = dict(rtx_node("bare"), gpus=[], devices=[])
    node = nodelets(lab_of([spec]), "bare")
    assert node.hello["backends"] == [] and node.hello["devices"] == []
    (reason,) = node.next("probe")["problems"]
    assert reason == ("no GPU tool found (looked for libnvidia-ml, nvidia-smi, amd-smi, "
                      "rocm-smi, xpu-smi, npu-smi)")


def test_a_vendor_tool_failing_at_start_says_so(lab_of, nodelets):
    lab = lab_of([dict(presets.node_specs("demo")[3])])  # Intel only
    faults.set_tool_fault(lab.node_dir("node04"), "xpu-smi", "fail")
    node = nodelets(lab, "node04")
    (reason,) = node.next("probe")["problems"]
    assert reason.startswith("no GPU tool answered: xpu-smi: xpu-smi exited with 1: ")


def test_an_impossible_reading_is_clamped_and_told_once_per_episode(lab_of, nodelets):
    lab = lab_of([dict(presets.node_specs("demo")[3])])
    node = nodelets(lab, "node04")
    node.next("probe")
    fake_smi.update_faults(str(lab.node_dir("node04")), lambda g: g.update({"intel:0": {"util": 200}}))
    first = node.probe_until(lambda p: p["clamped"])
    assert first["clamped"] == [{"field": "utilization_pct", "value": 200.0, "shown": 100.0,
                                 "uuid": first["devices"][0]["uuid"], "index": 0}]
    assert first["devices"][0]["utilization_pct"] == 100
    again = node.next("probe")
    assert again["clamped"] == [] and again["devices"][0]["utilization_pct"] == 100


@needs_cc
def test_mig_instances_are_devices_of_their_own(lab_of, nodelets):
    spec = presets.node_specs("core")[1]
    a100 = dict(spec["gpus"][0], mig=[
        {"uuid": "MIG-11111111-2222-3333-4444-555555555555", "profile": "3g.40gb", "memory_total_mb": 40192},
        {"uuid": "MIG-66666666-7777-8888-9999-000000000000", "profile": "3g.40gb", "memory_total_mb": 40192}])
    lab = lab_of([dict(spec, name="mig01", gpus=[a100], topo={})])
    job = hold_memory(lab, "mig01", "CUDA_VISIBLE_DEVICES", "MIG-66666666-7777-8888-9999-000000000000", 8192)
    try:
        node = nodelets(lab, "mig01")
        probe = node.probe_until(lambda p: len(p["devices"]) == 3 and p["devices"][2]["memory_used_mb"] == 8192)
        card, first, second = probe["devices"]
        assert card["mig_mode"] == "Enabled" and card["memory_used_mb"] == 8192  # it holds its instances' work
        assert [(d["index"], d["parent_uuid"], d["memory_total_mb"], d["visible_id"]) for d in (first, second)] == [
            (1, card["uuid"], 40192, "MIG-11111111-2222-3333-4444-555555555555"),
            (2, card["uuid"], 40192, "MIG-66666666-7777-8888-9999-000000000000")]
        assert second["name"] == "NVIDIA A100-SXM4-80GB MIG 3g.40gb"
        assert [(p["gpu_uuid"], p["used_memory_mb"]) for p in probe["processes"]] == [(second["uuid"], 8192)]
    finally:
        job.kill()


def _python36() -> str | None:
    import glob
    import shutil

    found = shutil.which("python3.6") and subprocess.run(
        ["python3.6", "-c", "print(1)"], capture_output=True).returncode == 0
    if found:
        return shutil.which("python3.6")
    candidates = sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.6*/bin/python3.6")))
    return candidates[0] if candidates else None


PYTHON36 = _python36()


@pytest.mark.skipif(PYTHON36 is None, reason="no Python 3.6 here to run the nodelet with")
def test_the_nodelet_runs_on_python_3_6_with_every_backend(lab_of, nodelets):
    """The oldest python3 a node may have (as the README promises) runs the shipped
    nodelet, pynvml included."""
    lab = lab_of(presets.node_specs("mixed") + [presets.node_specs("demo")[4]])
    for name in lab.nodes:
        os.symlink(PYTHON36, lab.node_dir(name) / "bin" / "python3")  # first on the node's PATH
    mixed, ascend = nodelets(lab, "node01"), nodelets(lab, "node05")
    assert mixed.hello["python"].startswith("3.6") and ascend.hello["python"].startswith("3.6")
    assert {b["vendor"] for b in mixed.hello["backends"]} == {"nvidia", "intel"}
    if HAVE_CC:
        assert mixed.hello["backends"][0]["name"] == "nvml"
    assert [d["vendor"] for d in mixed.next("probe")["devices"]] == ["nvidia", "intel"]
    assert len(ascend.next("probe")["devices"]) == 2
