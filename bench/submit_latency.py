"""Submit → running latency on the simulated lab with real sshd nodes.

Latency of one job = the time its first line is written on the node (the job runs
`date +%s.%N`) minus the time just before the submit request left the client — the same
measure as ../shared/anchors/slurm/measure.sh uses for Slurm.

Baseline in the same run: the floor of the transport itself — on a warm SSH connection to
the same node, `tmux new-session -d 'date +%s.%N > f'` — so the ratio shows what the head
(socket, store, scheduler, nodelet) adds on top of SSH+tmux on this machine now.

    python bench/submit_latency.py [--jobs 20] [--gap 0.2]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from labkit.harness import HeadProcess, lab_with_head  # noqa: E402
from nebula_tui.sim.lab import Lab  # noqa: E402

# Slurm 22.05 on this same machine kind, 4 nodes x 4 fake GPUs (../shared/anchors/slurm/RESULTS.md).
SLURM_TUNED = {"p50": 0.455, "p90": 0.950}
SLURM_DEFAULT = {"p50": 1.611, "p90": 2.154}


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * p / 100
    lo = int(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def nebula_latencies(head: HeadProcess, jobs: int, gap: float, jitter: float | None = None,
                     gpu_mem_mb: int | None = 4096) -> list[float]:
    """``jobs`` samples, each after ``gap`` + up to ``jitter`` (default: ``gap``) idle
    seconds; ``gpu_mem_mb`` None asks for a whole card."""
    samples = []
    memory = {"gpu_mem_mb": gpu_mem_mb} if gpu_mem_mb else {}
    with head.client() as client:
        for _ in range(jobs):
            time.sleep(gap + random.random() * (gap if jitter is None else jitter))
            sent = time.time()
            job = client.call("submit", command=["date", "+%s.%N"], **memory)["job"]
            done = client.call("wait", timeout=60, job=job["id"])["job"]
            written = first_line(client, done)
            if written is None:
                print(f"job {done['id']} ({done['state']}): no line in its log within "
                      f"{LOG_WAIT_S:.0f} s of its end; left out", file=sys.stderr)
                continue
            samples.append(written - sent)
    if not samples:
        raise SystemExit("no job wrote its line: see the lines above")
    return samples


#: how long after a job's end its log may take to show its line (a head before the
#: nodelet waited for the wrapper's tee reported an end before the log was whole)
LOG_WAIT_S = 5.0


def first_line(client, job: dict) -> float | None:
    """The time the job wrote (its log's first word), or None when none came."""
    deadline = time.time() + LOG_WAIT_S
    while True:
        words = client.call("logs", job=job["id"], offset=0)["data"].split()
        if words:
            try:
                return float(words[0])
            except ValueError:
                return None  # it said something else: a failure's sentence
        if time.time() > deadline:
            return None
        time.sleep(0.05)


async def raw_latencies(lab: Lab, jobs: int, gap: float) -> list[float]:
    samples = []
    out = lab.node_dir("node01") / "raw-bench.txt"
    async with lab.connect("node01") as conn:
        for n in range(jobs):
            await asyncio.sleep(gap + random.random() * gap)
            out.unlink(missing_ok=True)
            sent = time.time()
            await conn.run(f"tmux -L nebula-bench new-session -d -s raw{n} 'date +%s.%N > {out}'",
                           check=True)
            while not out.exists() or not out.read_text().strip():
                await asyncio.sleep(0.002)
            samples.append(float(out.read_text()) - sent)
    return samples


def row(name: str, values: list[float]) -> str:
    return (f"{name:<28} p50 {percentile(values, 50) * 1000:7.1f} ms   "
            f"p90 {percentile(values, 90) * 1000:7.1f} ms   max {max(values) * 1000:7.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--gap", type=float, default=0.2,
                        help="idle seconds before each submit (plus random up to as much)")
    args = parser.parse_args()
    with lab_with_head("4x4") as (lab, head):
        ours = nebula_latencies(head, args.jobs, args.gap)
        raw = asyncio.run(raw_latencies(lab, args.jobs, args.gap))
    p50, p90 = percentile(ours, 50), percentile(ours, 90)
    print(f"submit -> job's first line on the node, {args.jobs} jobs, 4 nodes x 4 GPUs, real sshd")
    print(row("NebulaGrid", ours))
    print(row("baseline: ssh exec + tmux", raw))
    print(f"NebulaGrid / baseline (p50): {p50 / percentile(raw, 50):.2f}x")
    print(f"Slurm tuned (anchor, same machine kind): p50 {SLURM_TUNED['p50'] * 1000:.0f} ms, "
          f"p90 {SLURM_TUNED['p90'] * 1000:.0f} ms -> NebulaGrid is {SLURM_TUNED['p50'] / p50:.1f}x "
          f"faster at p50, {SLURM_TUNED['p90'] / p90:.1f}x at p90")
    print(f"Slurm default (anchor): p50 {SLURM_DEFAULT['p50'] * 1000:.0f} ms -> "
          f"{SLURM_DEFAULT['p50'] / p50:.1f}x")


if __name__ == "__main__":
    main()
