"""Time one full scheduling pass: 1k, 10k and 100k pending jobs over 1,000 GPUs.

    python bench/scheduler.py [--repeat 3]

The cluster is 125 nodes × 8 GPUs (4090s, A100s and H100s with their topologies), about
two thirds of the cards held by running jobs with --time limits (so the R25 reservation
is computed every pass), a queue from 30 users mixing slices, whole cards, gangs, --arch,
--cuda, --after, --time and priorities. Target (issue 3): 10k pending in ≤ 100 ms on one
core. ``naive_pass`` is the walking skeleton's first-fit pass, kept here as the baseline.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nebula_tui.model import GpuReading, GpuView, Placement  # noqa: E402
from nebula_tui.scheduler import PendingJob, RunningJob, Snapshot, UserShare, schedule  # noqa: E402
from nebula_tui.scheduler.slices import fits  # noqa: E402

GB = 1024
NOW = 1_700_000_000.0
MODELS = [("NVIDIA GeForce RTX 4090", 24564, "8.9", "12.4", "PHB"),
          ("NVIDIA A100-SXM4-80GB", 81920, "8.0", "12.4", "NV12"),
          ("NVIDIA H100 80GB HBM3", 81559, "9.0", "12.8", "NV18")]


def cluster(seed: int = 1, nodes: int = 125):
    rnd = random.Random(seed)
    gpus, running, topologies = [], [], {}
    job_id = 1_000_000
    for n in range(nodes):
        node = f"node{n:03d}"
        name, total, cap, cuda, link = MODELS[n % len(MODELS)]
        topologies[node] = {f"GPU{i}": {f"GPU{j}": (link if i // 4 == j // 4 else "SYS")
                                        for j in range(8) if j != i} for i in range(8)}
        for i in range(8):
            placements = []
            roll = rnd.random()
            if roll < 0.45:
                placements = [(job_id, Placement(f"GPU-{node}-{i}", node, i, total, True))]
            elif roll < 0.65:
                placements = [(job_id + k, Placement(f"GPU-{node}-{i}", node, i, 8 * GB, False))
                              for k in range(rnd.randint(1, 2))]
            for j, p in placements:
                running.append(RunningJob(j, "r", (p,), NOW - rnd.randint(0, 7200),
                                          time_limit_s=rnd.choice([3600.0, 4 * 3600.0, 24 * 3600.0])))
            job_id += 10
            reading = GpuReading(index=i, uuid=f"GPU-{node}-{i}", name=name, memory_total_mb=total,
                                 compute_cap=cap, utilization_pct=rnd.choice([0.0, 5.0, 60.0, 100.0]),
                                 temperature_c=rnd.choice([35.0, 45.0, 60.0, 78.0]))
            gpus.append(GpuView(node=node, reading=reading, placements=tuple(placements),
                                blocked="node is drained" if n == 7 else None,
                                health_score=rnd.choice([1.0, 1.0, 0.9]), cuda_version=cuda))
    return tuple(gpus), tuple(running), topologies


def queue(count: int, seed: int = 2):
    rnd = random.Random(seed)
    shapes = [(1, 8 * GB), (1, 16 * GB), (1, None), (2, None), (2, 24 * GB), (4, None), (8, None),
              (1, 4 * GB), (4, 40 * GB), (16, None)]
    jobs = []
    for i in range(count):
        k, mem = rnd.choice(shapes)
        jobs.append(PendingJob(
            id=i + 1, user=f"user{rnd.randrange(30):02d}", gpu_count=k, gpu_mem_mb=mem,
            submitted_at=NOW - rnd.uniform(0, 86400),
            arch=rnd.choice([None] * 6 + ["sm_89", ">=sm_80", "sm_120"]),
            cuda=rnd.choice([None] * 8 + ["12.6"]),
            max_nodes=2 if k == 16 else 1, priority=5 if rnd.random() < 0.01 else 0,
            after=(i,) if i and rnd.random() < 0.05 else (),
            time_limit_s=rnd.choice([None, 1800.0, 7200.0, 86400.0])))
    return tuple(jobs)


USERS = {f"user{u:02d}": UserShare(f"user{u:02d}", 1.0 + u * 0.05) for u in range(30)}


# ---------------------------------------------------------------- the skeleton's first fit
def naive_place(gpus, gpu_count, gpu_mem_mb):
    by_node = defaultdict(list)
    for gpu in gpus:
        ask = fits(gpu, gpu_mem_mb)
        if ask is None:
            continue
        by_node[gpu.node].append(Placement(gpu.uuid, gpu.node, gpu.reading.index, ask.memory_mb,
                                           ask.exclusive))
    first_seen = {}
    for gpu in gpus:
        first_seen.setdefault(gpu.node, len(first_seen))
    for node in sorted(by_node, key=first_seen.__getitem__):
        if len(by_node[node]) >= gpu_count:
            return tuple(by_node[node][:gpu_count]), ""
    return (), "waits"


def naive_pass(gpus, pending):
    state = {g.uuid: g for g in gpus}
    refused, decisions = {}, []
    for job in sorted(pending, key=lambda j: (j.submitted_at, j.id)):
        ask = (job.gpu_count, job.gpu_mem_mb)
        if ask in refused:
            decisions.append(("wait", job.id))
            continue
        placements, reason = naive_place(tuple(state.values()), job.gpu_count, job.gpu_mem_mb)
        if not placements:
            refused[ask] = reason
            decisions.append(("wait", job.id))
            continue
        decisions.append(("start", job.id))
        refused.clear()
        for p in placements:
            held = state[p.gpu_uuid]
            state[p.gpu_uuid] = replace(held, placements=held.placements + ((job.id, p),))
    return decisions


def cpu_time(fn) -> tuple[float, object]:
    """CPU time of one call: process time, so other processes on a busy shared machine are
    not counted against it."""
    started = time.process_time()
    result = fn()
    return time.process_time() - started, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    gpus, running, topologies = cluster()
    held = sum(1 for g in gpus if g.placements)
    print(f"cluster: {len(gpus)} GPUs on 125 nodes, {held} holding running jobs; best (and median) "
          f"of {args.repeat} rounds")
    cases = []
    for count in (1_000, 10_000, 100_000):
        pending = queue(count)
        cases.append((count, pending, Snapshot(gpus=gpus, queue=pending, now=NOW, running=running,
                                               users=USERS, topologies=topologies)))
    # Rounds, each timing every size and the baseline once: the machine's slow spells then
    # fall on every case alike instead of on whichever one ran during them.
    times: dict[tuple, list[float]] = defaultdict(list)
    last: dict[tuple, object] = {}
    for _ in range(args.repeat):
        for count, pending, snap in cases:
            seconds, last[count, "pass"] = cpu_time(lambda: schedule(snap))
            times[count, "pass"].append(seconds)
            seconds, last[count, "naive"] = cpu_time(lambda: naive_pass(gpus, pending))
            times[count, "naive"].append(seconds)
    print(f"{'pending':>8} {'pass cpu ms':>18} {'per job µs':>11} {'starts':>7} "
          f"{'first-fit cpu ms':>17} {'its starts':>11}")
    best = {}
    for count, _, _ in cases:
        best[count] = min(times[count, "pass"])
        starts = sum(1 for d in last[count, "pass"] if type(d).__name__ == "Start")
        naive_starts = sum(1 for kind, _ in last[count, "naive"] if kind == "start")
        shown = f"{best[count] * 1000:.1f} ({statistics.median(times[count, 'pass']) * 1000:.0f})"
        print(f"{count:>8} {shown:>18} {best[count] / count * 1e6:>11.1f} {starts:>7} "
              f"{min(times[count, 'naive']) * 1000:>17.1f} {naive_starts:>11}")
    t1, t2, t3 = best[1_000], best[10_000], best[100_000]
    print(f"growth: ×{t2 / t1:.1f} for ×10 jobs (1k→10k), ×{t3 / t2:.1f} for ×10 (10k→100k)")
    print(f"first-fit / this pass at 10k: ×{min(times[10_000, 'naive']) / t2:.0f}")
    print(f"target: 10k pending ≤ 100 ms — {'met' if t2 <= 0.100 else 'NOT met'} ({t2 * 1000:.0f} ms)")


if __name__ == "__main__":
    main()
