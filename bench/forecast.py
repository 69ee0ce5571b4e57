"""Time one start-time forecast: a 200-job queue on a 20-node lab (issue 38: ≤ 1 s of
head CPU per forecast).

    python bench/forecast.py [--repeat 3] [--jobs 200] [--nodes 20]

The lab is 20 nodes × 8 cards (4090s, A100s, H100s with their topologies, as
``bench/scheduler.py`` makes them), most cards held by running jobs (70% with a --time,
the rest without), and a queue from 12 users mixing
slices, whole cards, 2- and 4-card jobs, 8-card gangs, --after and preemptible work. The
forecast is ``head.forecast.forecast``: one run of the real scheduler forward (each job
ending when it is expected to), the interval from the calibration. CPU time is
``time.process_time``: what the head's process spends.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nebula_tui.head.forecast import forecast  # noqa: E402
from nebula_tui.scheduler import PendingJob, Snapshot  # noqa: E402
from scheduler import GB, NOW, cluster  # noqa: E402  (bench/scheduler.py: its cluster)



def lab(nodes: int, jobs: int, seed: int = 1) -> Snapshot:
    """``bench/scheduler.py``'s cluster cut to ``nodes`` nodes, a third of its running jobs
    without a --time and a tenth preemptible, and a queue of ``jobs``."""
    gpus, running, topologies = cluster(seed, nodes)
    rnd = random.Random(seed)
    running = tuple(replace(r, user=f"user{rnd.randrange(12):02d}",
                            time_limit_s=r.time_limit_s if rnd.random() < 0.7 else None,
                            preemptible=rnd.random() < 0.1) for r in running)
    shapes = [(1, 8 * GB), (1, 16 * GB), (1, None), (1, None), (2, None), (4, None), (8, None), (1, 4 * GB)]
    queue = []
    for i in range(jobs):
        k, mem = rnd.choice(shapes)
        queue.append(PendingJob(id=i + 1, user=f"user{rnd.randrange(12):02d}", gpu_count=k, gpu_mem_mb=mem,
                                submitted_at=NOW - rnd.uniform(0, 86400),
                                after=(i,) if i and rnd.random() < 0.05 else (),
                                time_limit_s=rnd.choice([1800.0, 3600.0, 4 * 3600.0, 86400.0])
                                if rnd.random() < 0.7 else None,
                                preemptible=rnd.random() < 0.05))
    return Snapshot(gpus=gpus, queue=tuple(queue), now=NOW, running=running, topologies=topologies)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--nodes", type=int, default=20)
    args = parser.parse_args()
    snap = lab(args.nodes, args.jobs)
    times, result = [], {}
    for _ in range(args.repeat):
        started = time.process_time()
        result = forecast(snap)
        times.append(time.process_time() - started)
    placed = sum(1 for s in result.values() if s.at is not None)
    print(f"forecast: {args.jobs} waiting jobs on {args.nodes} nodes ({len(snap.gpus)} cards, "
          f"{len(snap.running)} running): {placed} start within 7 days")
    print(f"CPU per forecast: median {statistics.median(times):.3f} s, worst {max(times):.3f} s "
          f"(target ≤ 1 s)")


if __name__ == "__main__":
    main()
