"""A lab-month trace CSV (``nebula simulate``'s format) whose run times are real jobs'.

    python bench/trace_from_philly.py philly_runtime.csv OUT.csv [--cards 14] [--largest 4]
        [--load 0.8] [--days 30] [--seed 2026]

The source is the only job-level public data this project could read: the run times of
83,154 jobs of Microsoft's Philly cluster (Jeon et al., USENIX ATC '19), as the Alibaba PAI
authors publish them beside their own trace (github.com/alibaba/clusterdata,
cluster-trace-gpu-v2020/analysis/philly_runtime.csv, one ``runtime`` in seconds a line).
That file has run times only, sorted. So each job's duration here is a real Philly job's,
drawn at random (the seed's) from the file (zero-second runs skipped): the real
distribution, heavier-tailed than the built-in log-normal, not the real sequence. Its submit
time, user, size, memory slice and time limit are the built-in month's (``workload.lab_month``,
the same seed); jobs are then thinned so the month offers ``--load`` of the cards' GPU-hours.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nebula_tui.month import workload  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runtimes", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--cards", type=int, default=14)
    parser.add_argument("--largest", type=int, default=4, help="the most cards one machine has")
    parser.add_argument("--users", type=int, default=12)
    parser.add_argument("--load", type=float, default=0.8)
    parser.add_argument("--days", type=float, default=30.0)
    parser.add_argument("--seed", type=int, default=2026)
    args = parser.parse_args()
    lines = args.runtimes.read_text().split()
    if not lines or lines[0] != "runtime":
        raise SystemExit(f"{args.runtimes}: expected philly_runtime.csv (a 'runtime' header)")
    rng = random.Random(args.seed)
    real = [float(v) for v in lines[1:] if float(v) > 0]
    horizon = args.days * 86400
    shaped = workload.lab_month(args.cards, args.largest, users=args.users, days=args.days,
                                load=1.0, seed=args.seed)
    jobs = []
    for request in shaped:
        runtime = rng.choice(real)
        if request.service:
            jobs.append(request)  # an inference service runs to the month's end either way
            continue
        limit = None
        if request.time_limit_s is not None:
            limit = math.ceil(runtime * rng.uniform(1.5, 4.0) / 600) * 600
        jobs.append(replace(request, duration_s=runtime, time_limit_s=limit))
    asked = sum((0.25 if r.gpu_mem_mb else r.gpus) * min(r.duration_s, horizon - r.submit_s) for r in jobs) / 3600
    keep = min(1.0, args.load * args.cards * args.days * 24 / asked) if asked else 1.0
    jobs = [r for r in jobs if rng.random() < keep]
    workload.write_trace(jobs, args.out)
    print(f"{args.out}: {len(jobs)} jobs, run times drawn from the {len(real):,} of {args.runtimes.name} "
          f"(kept {keep:.0%} to offer load {args.load})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
