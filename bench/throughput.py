"""Throughput: 500 tiny 1-GPU jobs through a simulated lab of 4 nodes × 4 GPUs (real sshd).

Measures, like ../shared/anchors/slurm/measure.sh does for Slurm: the submit rate, and
jobs/s from the first submit until every job has ended (each job holds a whole GPU, so at
most 16 run at once and a finished job must free its GPU for the next one).

    python bench/throughput.py [--jobs 500]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from labkit.harness import HeadProcess, lab_with_head  # noqa: E402

# Slurm 22.05 on this same machine kind, 4 nodes x 4 fake GPUs, 500 jobs
# (../shared/anchors/slurm/RESULTS.md): first submit -> all done.
SLURM_TUNED_JPS = 21.3
SLURM_DEFAULT_JPS = 5.4


def run(head: HeadProcess, jobs: int) -> tuple[float, float, int]:
    """(submit rate, jobs/s first submit -> all ended, failures)."""
    with head.client() as client:
        first = time.time()
        ids = [client.call("submit", command=["true"])["job"]["id"] for _ in range(jobs)]
        submitted = time.time()
        ended = [client.call("wait", timeout=600, job=job_id)["job"] for job_id in ids]
    last_end = max(j["ended_at"] for j in ended)
    failures = sum(j["state"] != "succeeded" for j in ended)
    return jobs / (submitted - first), jobs / (last_end - first), failures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=500)
    args = parser.parse_args()
    with lab_with_head("4x4") as (_, head):
        submit_rate, jps, failures = run(head, args.jobs)
    print(f"{args.jobs} x 1-GPU `true` jobs, 4 nodes x 4 GPUs, real sshd, one client")
    print(f"submit rate            {submit_rate:8.1f} jobs/s")
    print(f"first submit -> all done {jps:6.1f} jobs/s   ({failures} failed)")
    print(f"vs Slurm tuned (anchor, same machine kind, {SLURM_TUNED_JPS} jobs/s): {jps / SLURM_TUNED_JPS:.1f}x; "
          f"vs Slurm default ({SLURM_DEFAULT_JPS} jobs/s): {jps / SLURM_DEFAULT_JPS:.1f}x")


if __name__ == "__main__":
    main()
