"""Probe bench: what reading a node's GPUs costs, on the node and on the head.

    python bench/probe.py [--probes 40] [--head-gpus 104] [--head-s 30]

Node side, per probe of one simulated 8-GPU node (four cards busy with a process each), in
the same run: wall time and CPU of the NVML path (the real pynvml over the simulated
``libnvidia-ml.so.1``: handles opened once, every call each probe) against the
``nvidia-smi`` path (one ``--query-gpu`` and one ``--query-compute-apps`` spawn per probe;
CPU counts the spawned tool too). Both run in the node's own environment, as the shipped
nodelet runs them. The simulated NVML scans /proc once per probe to find the jobs, which
the real library does not; the simulated nvidia-smi is a Python script, slower to start
than the real one (7-14 ms a call, the anchor); so the ratio here is the simulator's, and
the NVML figure an upper bound of the nodelet's own cost per GPU (aim: <= 1 ms).

Head side: the real head (``nebula serve``'s code, store, scheduler, event stream) fed
neutral probe messages for ``--head-gpus`` GPUs (8 per node, half of them busy and moving)
at a 5 s and at a 1 s interval; its process CPU per 100 GPUs (aim at 5 s: <= 5 % of a core).
Only the SSH links are replaced (``BenchLink``), as in bench/tui.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

GPUS_PER_NODE = 8

# ============================================================================ the node side

DRIVER = r'''
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
from nebula_tui.node import vendor_nvidia
results = {}
for name, make in (("nvml", vendor_nvidia.NvmlBackend), ("nvidia-smi", vendor_nvidia.NvidiaSmiBackend),
                   ("nvml-calls", vendor_nvidia.NvmlBackend)):
    if name == "nvml-calls":  # the simulated library's /proc scan kept out: only the calls
        os.environ["NEBULA_SIM_NVML_REFRESH_MS"] = "3600000"
        import importlib, pynvml
        pynvml.nvmlShutdown()
    backend = make()
    backend.initialize()
    for _ in range(3):  # warm: caches, first spawns
        backend.status(); backend.processes()
    walls, cpus = [], []
    for _ in range(int(sys.argv[2])):
        time.sleep(0.3)  # probes are seconds apart: nothing read is still fresh
        t0, p0, c0 = time.perf_counter(), time.process_time(), os.times()
        devices = backend.status()
        processes = backend.processes()
        t1, p1, c1 = time.perf_counter(), time.process_time(), os.times()
        walls.append(t1 - t0)
        # this process (ns resolution) and the tools it spawned and waited for (clock ticks)
        cpus.append((p1 - p0) + (c1.children_user - c0.children_user)
                    + (c1.children_system - c0.children_system))
    results[name] = {"walls": walls, "cpus": cpus, "gpus": len(devices), "processes": len(processes),
                     "used": sorted(d["memory_used_mb"] for d in devices)}
    backend.cleanup()
print(json.dumps(results))
'''


def node_side(probes: int) -> dict:
    from nebula_tui.sim import nvml, presets
    from nebula_tui.sim.lab import Lab

    if nvml.build() is None:
        raise SystemExit("bench/probe.py: no C compiler (cc) to build the simulated NVML")
    spec = presets.node_specs("core")[1]  # four A100s; make them eight
    template = spec["gpus"][0]
    spec = dict(spec, name="bench8", topo={}, gpus=[
        dict(template, index=i, uuid=f"GPU-00000000-0000-4000-8000-{i:012d}",
             pci_bus_id=f"00000000:{0x10 + i:02X}:00.0") for i in range(GPUS_PER_NODE)])
    with tempfile.TemporaryDirectory() as root:
        lab = Lab(Path(root), specs=[spec], ssh="asyncssh")
        lab.prepare()
        env = lab.session_env("bench8")
        jobs = [subprocess.Popen(["sleep", "600"], env=dict(env, CUDA_VISIBLE_DEVICES=str(i),
                                                               NEBULA_GPU_MEM_MB=str(4096 * (i + 1))))
                for i in range(0, GPUS_PER_NODE, 2)]
        try:
            done = subprocess.run([sys.executable, "-c", DRIVER, str(REPO), str(probes)], env=env,
                                  capture_output=True, text=True, timeout=900)
        finally:
            for job in jobs:
                job.kill()
            lab._sweep()
    if done.returncode != 0:
        raise SystemExit(f"bench/probe.py: the node-side driver failed:\n{done.stderr}")
    return json.loads(done.stdout)


# ============================================================================ the head side


class BenchLink:
    """Stands in for ``remote.ssh.NodeLink`` inside the real head: says hello, then sends
    the nodelet's neutral probe message every ``interval`` seconds; requests succeed."""

    interval = 5.0

    def __init__(self, node, cluster, on_message, on_state):
        self.node, self.on_message, self.on_state = node, on_message, on_state
        self._task = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def close(self) -> None:
        if self._task:
            self._task.cancel()

    async def request(self, op, timeout=None, **fields):
        return {"ok": True, "sessions": [], "jobs": {}, "data": "", "offset": 0}

    def devices(self, tick: int) -> tuple[list[dict], list[dict]]:
        from nebula_tui.node.backends.reading import new_process, new_reading

        number = int(self.node.name[4:])
        devices, processes = [], []
        for i in range(GPUS_PER_NODE):
            busy = i % 2 == 0
            uuid = f"GPU-bench-{number:03d}-{i}"
            util = float((tick * 7 + i * 13) % 100) if busy else 0.0
            devices.append(new_reading(
                "nvidia", i, uuid=uuid, name="NVIDIA A100-SXM4-80GB",
                pci_bus_id=f"00000000:{0x10 + i:02X}:00.0", memory_total_mb=81920,
                memory_used_mb=20000 + (tick % 7) * 100 if busy else 1, utilization_pct=util,
                temperature_c=35.0 + (tick + i) % 30 if busy else 31.0,
                power_w=60.0 + util * 3, power_limit_w=400.0, sm_clock_mhz=1410.0,
                mem_clock_mhz=1593.0, base_sm_clock_mhz=1275.0, max_sm_clock_mhz=1410.0,
                pstate="P0" if busy else "P8", pcie_gen=4, pcie_width=16, pcie_gen_max=4,
                pcie_width_max=16, ecc_uncorrected=0, driver_version="550.54.15",
                compute_cap="8.0", throttle_reasons=[] if busy else ["gpu_idle"]))
            if busy:
                processes.append(new_process(uuid, 10000 + number * 10 + i, "python", 20000))
        return devices, processes

    async def _run(self) -> None:
        from nebula_tui.model import NodeState

        devices, _ = self.devices(0)
        self.on_message(self.node.name, {"type": "hello", "hostname": self.node.name,
                                         "backends": [{"name": "nvml", "vendor": "nvidia"}],
                                         "devices": devices, "cuda_version": "12.4", "links": {}})
        self.on_state(self.node.name, NodeState.UP, "")
        tick = 0
        while True:
            devices, processes = self.devices(tick)
            self.on_message(self.node.name, {"type": "probe", "t": time.time(), "devices": devices,
                                             "processes": processes, "problems": [], "clamped": [],
                                             "pid_jobs": {}, "error": ""})
            tick += 1
            await asyncio.sleep(self.interval)


def head_main(home: str, config: str, interval: float) -> None:
    from nebula_tui.head import nodes
    from nebula_tui.head.serve import serve
    from nebula_tui.homedir import Home

    BenchLink.interval = interval
    nodes.NodeLink = BenchLink
    sys.exit(serve(Home(Path(home).resolve()), Path(config)))


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def head_side(n_gpus: int, seconds: float, interval: float) -> float:
    """Head CPU (% of one core) per 100 GPUs, over ``seconds`` after a settling period."""
    from nebula_tui.api import ApiError, Client

    n_nodes = (n_gpus + GPUS_PER_NODE - 1) // GPUS_PER_NODE
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        (root / "known_hosts").write_text("")
        lines = ["cluster:", "  name: bench", f"  known_hosts: {root / 'known_hosts'}",
                 f"  probe_interval: {interval:g}", "nodes:"]
        lines += [f"  - {{name: node{n:03d}, host: 127.0.0.1, port: {20000 + n}}}" for n in range(n_nodes)]
        (root / "nodes.yaml").write_text("\n".join(lines) + "\n")
        with open(root / "head.log", "wb") as log:
            head = subprocess.Popen([sys.executable, __file__, "--head", str(root),
                                     str(root / "nodes.yaml"), "--interval", str(interval)],
                                    stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                try:
                    with Client(root / "nebula.sock", timeout=10) as client:
                        if len(client.call("gpus")["gpus"]) == n_nodes * GPUS_PER_NODE:
                            break
                except (ApiError, OSError):
                    pass
                time.sleep(0.5)
            else:
                raise SystemExit("bench/probe.py: the head never listed every GPU")
            time.sleep(2 * interval)  # past the first probes' registrations
            c0, t0 = _cpu_seconds(head.pid), time.monotonic()
            time.sleep(seconds)
            c1, t1 = _cpu_seconds(head.pid), time.monotonic()
        finally:
            head.terminate()
            head.wait(30)
    return 100.0 * (c1 - c0) / (t1 - t0) * 100.0 / (n_nodes * GPUS_PER_NODE)


# ============================================================================ report


def _ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:.2f} ms (best {min(values) * 1000:.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--probes", type=int, default=40)
    parser.add_argument("--head-gpus", type=int, default=104)
    parser.add_argument("--head-s", type=float, default=30.0)
    parser.add_argument("--head", nargs=2, metavar=("HOME", "CONFIG"), help=argparse.SUPPRESS)
    parser.add_argument("--interval", type=float, default=5.0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.head:
        head_main(args.head[0], args.head[1], args.interval)
        return
    node = node_side(args.probes)
    print(f"node side, one probe of an 8-GPU node ({args.probes} probes, median):")
    for name, r in node.items():
        per_gpu = statistics.median(r["walls"]) * 1000 / r["gpus"]
        print(f"  {name:<11} wall {_ms(r['walls'])}, CPU {_ms(r['cpus'])}; "
              f"{per_gpu:.3f} ms wall per GPU; {r['processes']} processes, used MiB {r['used']}")
    print("  (nvml: the simulated library scans /proc for the jobs once per probe, as the "
          "emulated nvidia-smi does; nvml-calls: the same probes with that scan kept out, i.e. "
          "the nodelet's own cost of its NVML calls)")
    nvml, smi = node["nvml"], node["nvidia-smi"]
    print(f"  nvidia-smi / NVML: wall x{statistics.median(smi['walls']) / statistics.median(nvml['walls']):.0f}, "
          f"CPU x{statistics.median(smi['cpus']) / max(1e-6, statistics.median(nvml['cpus'])):.0f}")
    print(f"head side, {args.head_gpus} GPUs, {args.head_s:g} s each (CPU % of one core per 100 GPUs):")
    for interval in (5.0, 1.0):
        print(f"  probes every {interval:g} s: {head_side(args.head_gpus, args.head_s, interval):.2f} %")


if __name__ == "__main__":
    main()
