"""The head at scale: 100, 250 and 500 nodes x 8 GPUs probing every 5 s, 10,000 jobs waiting.

    python bench/scale.py [--sizes 100,250,500] [--gpus 8] [--pending 10000] [--window 30]

What is real: the head — ``nebula serve``'s own code in a process of its own (SSH links,
NodeLink, engine, scheduler, store, API server) — and its SQLite store, pre-filled through
the Store's API as a full lab leaves it: every GPU registered, every GPU running a
one-GPU job, and ``--pending`` one-GPU jobs waiting behind them (so every periodic pass
walks the whole queue and starts nothing). The only addition to the head is a timer
around its scheduling pass, written to a file.

What is simulated: the nodes. The 2 cores cannot host 500 real nodelets (each probe
starts nvidia-smi, and the emulated one is a Python process), so all nodes live in one
other process, ``labkit.swarm``: each node a real SSH endpoint on 127.0.0.1 (own
port and host key, verified by the head) whose session speaks the nodelet's protocol from
memory — hello, a probe every 5 s at its own phase (nvidia-smi's CSV as the emulated tool
writes it, the running jobs' processes on their GPUs), launches, cancels, lists.

Per size, after the head has every node up and has passed over the queue once:

* head CPU: its CPU time over a ``--window`` of idle running (probes arriving, a periodic
  pass every 3 s), as a share of one core; the swarm's share is printed beside it;
* memory: the head's resident set (and its peak) after the window;
* a scheduling pass: median and worst wall time of the passes in the window;
* submit latency: 40 submits, each on a fresh connection like the CLI's, from the request
  to the reply with the job's id (p50 / p90).

The baseline is the same run's smallest size: each figure's growth is printed against it,
next to the growth of the cluster itself.
"""

from __future__ import annotations

import argparse
import getpass
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))
sys.path.insert(0, str(BENCH))

from submit_latency import percentile  # noqa: E402

from nebula_tui.api import ApiError, Client  # noqa: E402

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
N_USERS = 20


# ======================================================================= the head process
def head_main(home: str, config: str) -> None:
    """``nebula serve`` with a timer around each scheduling pass (``HOME/passes.txt``:
    wall ms, CPU ms, waiting jobs per line)."""
    from nebula_tui.head.scheduling import Scheduling
    from nebula_tui.head.serve import serve
    from nebula_tui.homedir import Home

    timed = Scheduling.pass_now
    out = open(Path(home) / "passes.txt", "a", buffering=1)

    async def pass_now(self) -> None:
        wall, cpu = time.perf_counter(), time.process_time()
        await timed(self)
        out.write(f"{(time.perf_counter() - wall) * 1000:.2f} "
                  f"{(time.process_time() - cpu) * 1000:.2f} {len(self.waiting())}\n")

    Scheduling.pass_now = pass_now
    sys.exit(serve(Home(Path(home).resolve()), Path(config)))


# ======================================================================= the store
def prefill(home: Path, specs: list[dict], pending: int) -> dict[str, dict[int, dict]]:
    """A full lab's store: every GPU registered and running a one-GPU job, ``pending``
    one-GPU jobs waiting. Returns the running jobs per node for the swarm."""
    from nebula_tui.model import JobSpec, Placement
    from nebula_tui.store import Store

    class BulkStore(Store):
        """Writes as the head does, without waiting for the disk at each commit: a bench's
        throw-away store of 14,000 jobs would otherwise take minutes to fill."""

        def transaction(self, durable: bool = False):
            return super().transaction(durable=False)

    home.mkdir(parents=True, exist_ok=True)
    store = BulkStore(home / "state.db")
    store.db.execute("PRAGMA synchronous=OFF")
    users = [getpass.getuser()] + [f"user{u:02d}" for u in range(1, N_USERS)]
    t0 = time.time() - 3600
    gpus = []
    for spec in specs:
        descriptors = [{"uuid": g["uuid"], "idx": g["index"], "model": g["name"], "vendor": "nvidia",
                        "total_mb": g["memory_total_mb"], "compute_cap": g["compute_cap"],
                        "pci_bus_id": g["pci_bus_id"], "driver_version": spec["driver_version"],
                        "cuda_version": spec["cuda_version"]} for g in spec["gpus"]]
        store.register_gpus(spec["name"], descriptors, t0)
        gpus += [(spec["name"], g) for g in spec["gpus"]]
    running: dict[str, dict[int, dict]] = {}
    for n in range(len(gpus) + pending):
        job = store.add_job(users[n % N_USERS], JobSpec(command=("python", "train.py"),
                                                        name=f"train-{n + 1}"), t0 + n * 0.01)
        if n < len(gpus):
            node, g = gpus[n]
            placement = Placement(g["uuid"], node, g["index"], g["memory_total_mb"], True)
            token = store.start_launching(job.id, (placement,), t0 + 600)
            store.mark_running(job.id, t0 + 600)
            # the launch's token: the head's reconcile adopts the swarm's job by it (without
            # it, every one failed as "no record of its launch" and the cards looked free)
            running.setdefault(node, {})[job.id] = {"gpus": [g["index"]], "token": token}
    store.close()
    return running


# ======================================================================= measuring
def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime + stime


def memory_mb(pid: int) -> tuple[float, float]:
    """(resident, peak resident) in MiB."""
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                  if ":" in line)
    return int(status["VmRSS"].split()[0]) / 1024, int(status["VmHWM"].split()[0]) / 1024


def wait_until(predicate, timeout: float, what: str, interval: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except (ApiError, OSError):
            value = None
        if value:
            return value
        time.sleep(interval)
    raise SystemExit(f"scale: timed out after {timeout:.0f}s waiting for {what}")


def measure(nodes: int, args) -> dict:
    from nebula_tui.sim.presets import uniform_nodes
    from labkit.swarm import SwarmProcess

    root = Path(tempfile.mkdtemp(prefix=f"nebula-scale-{nodes}-"))
    specs = uniform_nodes(nodes, args.gpus)
    stoppers = []
    try:
        began = time.monotonic()
        running = prefill(root / "home", specs, args.pending)
        filled = time.monotonic() - began
        swarm = SwarmProcess(root, nodes, args.gpus, 5.0, running)
        stoppers.append(swarm.stop)
        swarm.start()
        socket = root / "home" / "nebula.sock"
        env = dict(os.environ, NEBULA_HOME=str(root / "home"), NEBULA_SOCKET=str(socket))
        with open(root / "head.log", "wb") as log:
            head = subprocess.Popen([sys.executable, __file__, "--head", str(root / "home"),
                                     str(swarm.config_path)], env=env,
                                    stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        stoppers.append(lambda: stop_process(head))
        started = time.monotonic()

        def call(op: str, **fields) -> dict:
            with Client(socket, timeout=60) as client:
                return client.call(op, **fields)

        last: list[dict] = []

        def all_up() -> bool:
            last[:] = call("status")["nodes"]
            return all(n["state"] == "up" for n in last)

        try:
            wait_until(all_up, 600, "every node to be up")
        except SystemExit as timeout:  # say how far it got, and what kept the rest down
            down = Counter(f"{n['state']} ({n['reason'][:60]})" for n in last if n["state"] != "up")
            raise SystemExit(f"{timeout}: {len(last) - sum(down.values())} of {len(last)} up; "
                             + "; ".join(f"{k} x{v}" for k, v in down.most_common(4))
                             + (f" (head log: {root / 'head.log'})" if args.keep else "")) from None
        up = time.monotonic() - started
        passes = root / "home" / "passes.txt"
        wait_until(lambda: passes.exists() and passes.read_text().strip(), 120, "a first pass")
        time.sleep(5)  # the connect burst's tail: every node's first probes

        seen = len(passes.read_text().splitlines())
        head_cpu, swarm_cpu, t = cpu_seconds(head.pid), cpu_seconds(swarm.process.pid), time.monotonic()
        time.sleep(args.window)
        elapsed = time.monotonic() - t
        head_share = (cpu_seconds(head.pid) - head_cpu) / elapsed
        swarm_share = (cpu_seconds(swarm.process.pid) - swarm_cpu) / elapsed
        rss, peak = memory_mb(head.pid)
        window = [float(line.split()[0]) for line in passes.read_text().splitlines()[seen:]]

        spy = None
        if args.profile:  # py-spy (pip install py-spy into the venv) samples the head's submits
            spy = subprocess.Popen([str(Path(sys.executable).with_name("py-spy")), "record", "-p",
                                    str(head.pid), "-r", "200", "--format", "raw", "-o",
                                    str(Path(args.profile) / f"submits-{nodes}.txt")],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1)
        submits = []
        for _ in range(args.submits):
            time.sleep(0.1 + random.random() * 0.2)
            sent = time.perf_counter()
            with Client(socket, timeout=60) as client:
                client.call("submit", command=["python", "train.py"])
            submits.append(time.perf_counter() - sent)
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(30)
        return {"nodes": nodes, "gpus": nodes * args.gpus, "filled_s": filled, "up_s": up,
                "cpu": head_share, "swarm_cpu": swarm_share, "rss": rss, "peak": peak,
                "pass_p50": statistics.median(window) if window else float("nan"),
                "pass_max": max(window) if window else float("nan"), "passes": len(window),
                "submit_p50": percentile(submits, 50) * 1000,
                "submit_p90": percentile(submits, 90) * 1000}
    finally:
        for stop in reversed(stoppers):
            stop()
        if args.keep:
            print(f"kept: {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


def stop_process(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main() -> int:
    # A timeout's SIGTERM unwinds like Ctrl-C: the nodes, the head and the folder go.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100,250,500", help="node counts, comma-separated")
    parser.add_argument("--gpus", type=int, default=8, help="GPUs per node")
    parser.add_argument("--pending", type=int, default=10000, help="jobs waiting")
    parser.add_argument("--window", type=float, default=30.0, help="seconds of idle measured")
    parser.add_argument("--submits", type=int, default=40)
    parser.add_argument("--keep", action="store_true", help="keep each size's folder")
    parser.add_argument("--profile", metavar="DIR", help="py-spy's samples of the head during "
                        "the submits, one file a size (collapsed stacks)")
    parser.add_argument("--head", nargs=2, metavar=("HOME", "CONFIG"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.head:
        head_main(*args.head)
        return 0
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    print(f"head vs cluster size: {args.gpus} GPUs a node, probes every 5 s, every GPU busy, "
          f"{args.pending} jobs waiting; {os.cpu_count()} cores, load "
          f"{os.getloadavg()[0]:.2f} at start", flush=True)
    rows = []
    for nodes in sizes:
        row = measure(nodes, args)
        rows.append(row)
        print(f"{nodes} nodes: store filled in {row['filled_s']:.0f} s, every node up "
              f"{row['up_s']:.1f} s after the head started", flush=True)
    print()
    print(f"{'nodes':>5} {'GPUs':>5} | {'head CPU':>8} {'RSS MiB':>8} {'peak':>6} | "
          f"{'pass p50':>8} {'max':>6} ms {'(n)':>4} | {'submit p50':>10} {'p90':>6} ms | swarm CPU")
    for r in rows:
        print(f"{r['nodes']:>5} {r['gpus']:>5} | {r['cpu'] * 100:7.1f}% {r['rss']:8.0f} {r['peak']:6.0f} | "
              f"{r['pass_p50']:8.1f} {r['pass_max']:6.1f}    {r['passes']:>4} | "
              f"{r['submit_p50']:10.1f} {r['submit_p90']:6.1f}    | {r['swarm_cpu'] * 100:.1f}%")
    base, last = rows[0], rows[-1]
    if len(rows) > 1:
        print(f"growth {base['nodes']} -> {last['nodes']} nodes ({last['nodes'] / base['nodes']:.1f}x, "
              f"the baseline is the same run's {base['nodes']}): head CPU "
              f"{last['cpu'] / base['cpu']:.1f}x, RSS {last['rss'] / base['rss']:.1f}x, pass "
              f"{last['pass_p50'] / base['pass_p50']:.1f}x, submit p50 "
              f"{last['submit_p50'] / base['submit_p50']:.1f}x")
    print(f"scale: {last['nodes']} nodes, head CPU {last['cpu'] * 100:.0f}% of a core, "
          f"submit p50 {last['submit_p50']:.1f} ms, {os.getloadavg()[0]:.2f} load at end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
