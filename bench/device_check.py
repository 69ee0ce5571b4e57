"""The device check: NebulaGrid against a real NVIDIA card, on a machine that has one.

    sh scripts/setup.sh && .venv/bin/python bench/device_check.py [--probes 20]

Needs: an NVIDIA driver (``nvidia-smi``, ``libnvidia-ml.so.1``, ``libcuda.so.1``), OpenSSH's
``sshd`` and tmux. Nothing of the simulated lab is used but its SSH plumbing: one node on
127.0.0.1 behind a real ``sshd`` whose PATH holds no emulated tool, so the nodelet meets
the machine's own driver. It checks, and prints the figures of, in order:

1. the real nodelet, shipped over SSH on loopback exactly as the head ships it, chooses
   NVML (pynvml from nvidia-ml-py, sent with it) and lists every card ``nvidia-smi -L``
   lists;
2. NVML's readings agree with ``nvidia-smi --query-gpu`` taken at the same moment: name,
   UUID, bus, memory total exactly; memory used within 256 MiB; temperature within 3 °C;
   power within 15 % (+5 W); SM clock within 15 %; and the nodelet's NVML path costs
   (wall, per GPU per probe) against one ``nvidia-smi`` query spawn;
3. with NVML set aside (the nodelet's ``skip_backends``), ``nvidia-smi`` serves the node
   and reads the same UUIDs;
4. through a real head (``nebula serve``) on that node, a one-GPU job and a 4 GB slice job
   count their devices through the CUDA driver (ctypes ``cuInit``/``cuDeviceGetCount``/
   ``cuDeviceGetUuid``) and see exactly their allocation: one device, whose UUID is the
   one in ``NEBULA_GPU_LIST``; with two cards or more, a two-GPU job sees exactly two.

Exit status 0 when every check holds; each failed check is one line on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

SMI_FIELDS = ("uuid", "name", "pci.bus_id", "memory.total", "memory.used", "temperature.gpu",
              "power.draw", "clocks.sm", "utilization.gpu")
CUDA_COUNT = r'''
import ctypes, json, os
cuda = ctypes.CDLL("libcuda.so.1")
assert cuda.cuInit(0) == 0, "cuInit failed"
count = ctypes.c_int()
assert cuda.cuDeviceGetCount(ctypes.byref(count)) == 0
uuids = []
for ordinal in range(count.value):
    device = ctypes.c_int()
    cuda.cuDeviceGet(ctypes.byref(device), ordinal)
    raw = (ctypes.c_ubyte * 16)()
    cuda.cuDeviceGetUuid(raw, device)
    h = bytes(raw).hex()
    uuids.append("GPU-%s-%s-%s-%s-%s" % (h[:8], h[8:12], h[12:16], h[16:20], h[20:]))
print(json.dumps({"count": count.value, "uuids": uuids,
                  "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
                  "NEBULA_GPU_LIST": os.environ.get("NEBULA_GPU_LIST")}))
'''

failures: list[str] = []


def check(ok: bool, what: str) -> bool:
    print(("  ok    " if ok else "  FAIL  ") + what)
    if not ok:
        failures.append(what)
    return ok


def smi_now() -> list[dict]:
    out = subprocess.run(["nvidia-smi", "--query-gpu=" + ",".join(SMI_FIELDS),
                          "--format=csv,noheader,nounits"], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    rows = []
    for line in out.strip().splitlines():
        cells = [c.strip() for c in line.split(",")]
        rows.append(dict(zip(SMI_FIELDS, cells)))
    return rows


def _number(text: str) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


async def nodelet_over_ssh(lab, name: str, probes: int, **settings) -> dict:
    """Ship and run the real nodelet on ``name`` over SSH; its hello and ``probes`` probes."""
    from nebula_tui.remote import shipping

    payload = shipping.payload()
    command = shipping.boot_command(len(payload), {"interval": 1.0, "init_wait": 15.0, **settings})
    async with lab.connect(name) as conn:
        process = await conn.create_process(command, encoding=None)
        process.stdin.write(payload)
        messages = {"probes": []}
        started = time.monotonic()
        while len(messages["probes"]) < probes and time.monotonic() - started < 120:
            line = await asyncio.wait_for(process.stdout.readline(), 60)
            if not line:
                raise RuntimeError("the nodelet ended: " + (await process.stderr.read(4000)).decode())
            message = json.loads(line)
            if message["type"] == "hello":
                messages["hello"] = message
            elif message["type"] == "probe":
                messages["probes"].append(message)
        process.close()
        return messages


def node_side(lab, probes: int) -> None:
    print("1. the real nodelet over SSH on loopback")
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60).stdout
    cards = [line for line in listed.splitlines() if line.startswith("GPU ")]
    seen = asyncio.run(nodelet_over_ssh(lab, "gpu0", probes))
    hello, last = seen["hello"], seen["probes"][-1]
    check(hello["backends"] == [{"name": "nvml", "vendor": "nvidia"}],
          f"NVML serves the node (backends {hello['backends']}, notes {hello['hardware_notes']})")
    gpus = [d for d in last["devices"] if not d.get("parent_uuid")]
    check(len(gpus) == len(cards), f"{len(gpus)} GPUs read, nvidia-smi -L lists {len(cards)}")
    check(not last["problems"], f"no problem on the node ({last['problems']})")
    # A healthy card is never read lost (NVML answers its every call), nor with ERR! fields.
    check(not any(d.get("lost") or d.get("err_fields") for d in gpus),
          f"no card read lost or with ERR! fields ({[d.get('lost') for d in gpus]})")
    from nebula_tui.scheduler.filters import cuda_gap
    for gpu in gpus:  # the card runs jobs here, so the node's CUDA must serve it
        check(cuda_gap(gpu.get("compute_cap"), hello.get("cuda_version")) is None,
              f"GPU {gpu['index']} (sm {gpu.get('compute_cap')}) served by CUDA {hello.get('cuda_version')}")
    platform = hello.get("platform") or {}
    print(f"        platform {platform.get('kind')} (kernel {platform.get('release')}), "
          f"/dev/nvidia* {'present' if platform.get('dev_nvidia') else 'absent'}, "
          f"driver {hello.get('driver_version')}, CUDA {hello.get('cuda_version')}")

    print("2. NVML against nvidia-smi, read at the same moment")
    reference = {row["uuid"]: row for row in smi_now()}
    for gpu in gpus:
        row = reference.get(gpu["uuid"])
        if not check(row is not None, f"GPU {gpu['index']} {gpu['uuid']} is one nvidia-smi lists"):
            continue
        check(gpu["name"] == row["name"] and gpu["memory_total_mb"] == int(row["memory.total"]),
              f"GPU {gpu['index']}: name and memory the same ({gpu['name']}, {gpu['memory_total_mb']} MiB)")
        check(gpu["pci_bus_id"].lower() == row["pci.bus_id"].lower(), f"GPU {gpu['index']}: bus {gpu['pci_bus_id']}")
        used, temp, power, clock = (_number(row[k]) for k in ("memory.used", "temperature.gpu",
                                                               "power.draw", "clocks.sm"))
        check(used is None or abs(gpu["memory_used_mb"] - used) <= 256,
              f"GPU {gpu['index']}: memory used {gpu['memory_used_mb']} vs {used} MiB")
        check(temp is None or abs(gpu["temperature_c"] - temp) <= 3,
              f"GPU {gpu['index']}: temperature {gpu['temperature_c']} vs {temp} °C")
        check(power is None or gpu["power_w"] is None or abs(gpu["power_w"] - power) <= 0.15 * power + 5,
              f"GPU {gpu['index']}: power {gpu['power_w']} vs {power} W")
        check(clock is None or abs(gpu["sm_clock_mhz"] - clock) <= 0.15 * clock + 30,
              f"GPU {gpu['index']}: SM clock {gpu['sm_clock_mhz']} vs {clock} MHz")
        print(f"        GPU {gpu['index']}: base {gpu['base_sm_clock_mhz']} / max {gpu['max_sm_clock_mhz']} MHz, "
              f"PCIe gen {gpu['pcie_gen_max']} x{gpu['pcie_width_max']}, ECC {gpu['ecc_uncorrected']}, "
              f"remapped pending {gpu['remapped_rows_pending']}, reasons {gpu['throttle_reasons']}, "
              f"MIG {gpu['mig_mode']}")
    timing(probes)

    print("3. nvidia-smi when NVML is not used")
    seen = asyncio.run(nodelet_over_ssh(lab, "gpu0", 2, skip_backends=["nvml"]))
    check(seen["hello"]["backends"] == [{"name": "nvidia-smi", "vendor": "nvidia"}],
          f"nvidia-smi serves it ({seen['hello']['backends']}; {seen['hello']['hardware_notes']})")
    check(sorted(d["uuid"] for d in seen["probes"][-1]["devices"]) == sorted(g["uuid"] for g in gpus),
          "the same GPUs, by UUID")


def timing(probes: int) -> None:
    """The nodelet's NVML path against one nvidia-smi query, on this machine's cards."""
    from nebula_tui.node import vendor_nvidia

    backend = vendor_nvidia.NvmlBackend()
    backend.initialize()
    walls = []
    for _ in range(probes):
        t0 = time.perf_counter()
        backend.status()
        backend.processes()
        walls.append(time.perf_counter() - t0)
    backend.cleanup()
    spawns = []
    for _ in range(max(3, probes // 4)):
        t0 = time.perf_counter()
        smi_now()
        spawns.append(time.perf_counter() - t0)
    per_gpu = statistics.median(walls) * 1000 / max(1, len(backend.gpus))
    print(f"        NVML path: {statistics.median(walls) * 1000:.2f} ms per probe, {per_gpu:.3f} ms per GPU; "
          f"one nvidia-smi query: {statistics.median(spawns) * 1000:.1f} ms")
    check(per_gpu <= 1.0, f"NVML costs {per_gpu:.3f} ms per GPU per probe (aim <= 1 ms)")


def jobs_see_their_devices(lab, root: Path) -> None:
    from labkit.harness import HeadProcess

    print("4. jobs count their devices through the CUDA driver")
    head = HeadProcess(root / "head", lab)
    head.start(timeout=120, wait_nodes=False)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not head.call("gpus")["gpus"]:
            time.sleep(1)
        gpus = head.call("gpus")["gpus"]
        runs = [("--gpu-count", "1"), ("--gpu-mem", "4G")] + ([("--gpu-count", "2")] if len(gpus) >= 2 else [])
        for flags in runs:
            job = int(head.run("submit", *flags, "--", sys.executable, "-c", CUDA_COUNT,
                               check=True).stdout.split()[2])
            done = head.wait_job(job, 180)
            if not check(done["state"] == "succeeded", f"job {' '.join(flags)}: {done['state']} {done['reason']}"):
                continue
            seen = json.loads(head.run("logs", str(job), check=True).stdout.strip().splitlines()[-1])
            given = seen["NEBULA_GPU_LIST"].split(",")
            want = int(flags[1]) if flags[0] == "--gpu-count" else 1
            check(seen["count"] == want == len(given),
                  f"job {' '.join(flags)}: cuDeviceGetCount {seen['count']}, given {given} "
                  f"(CUDA_VISIBLE_DEVICES={seen['CUDA_VISIBLE_DEVICES']})")
            check(sorted(seen["uuids"]) == sorted(given), f"job {' '.join(flags)}: the CUDA devices are its own")
    finally:
        head.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--probes", type=int, default=20)
    args = parser.parse_args()
    for tool in ("nvidia-smi", "tmux"):
        if not shutil.which(tool):
            print(f"device check: {tool} is not on PATH; this machine cannot run it", file=sys.stderr)
            return 2
    from nebula_tui.sim.lab import Lab

    root = Path(tempfile.mkdtemp(prefix="nebula-device-check-"))
    # One node with no emulated tool: its sessions find the machine's own driver and tools.
    lab = Lab(root / "lab", specs=[{"name": "gpu0", "gpus": [], "devices": [],
                                    "omit_tools": ["dmesg"]}], ssh="openssh", probe_interval=1.0)
    lab.prepare()
    lab.start()
    try:
        node_side(lab, args.probes)
        jobs_see_their_devices(lab, root)
    finally:
        lab.stop()
    if failures:
        for what in failures:
            print(f"device check failed: {what}", file=sys.stderr)
        return 1
    print("device check: every check holds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
