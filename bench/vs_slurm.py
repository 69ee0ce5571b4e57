"""NebulaGrid against real Slurm, side by side in one run, on a cluster of the same shape.

Slurm: Debian's ``slurm-wlm`` (22.05) with munge, set up by ``nebula_tui/sim/slurm.py`` the
way ../shared/anchors/slurm/setup.sh does it — 4 fake nodes (one ``slurmd -N nX`` each on
127.0.0.1) × 4 fake GPUs (character devices, never opened), ``CPUs=8`` so one-GPU jobs are
limited by GPUs — once with the ``tuned`` SchedulerParameters and once with Slurm's
defaults. Everything lives in a temporary folder (config, state, logs, munge key and
socket, fake devices) on ports chosen free at start; the daemons are started here as
children and stopped by their pids, and the folder is removed afterwards (``--keep``
keeps it). When slurm-wlm or munge is missing the bench installs them with apt (as root).

NebulaGrid: the simulated lab of the same shape (``4x4``: 4 nodes × 4 GPUs behind real
OpenSSH sshd on 127.0.0.1) and a real head service, with the full scheduler.

The same two workloads on each, measured the same way as ../shared/anchors/slurm/measure.sh:

* latency: 20 sparse one-GPU jobs (an idle pause of ``--gap`` + 0–1 s before each);
  latency = the time the job itself writes (``date +%s.%N``) minus the time just before
  the submit left the client (``sbatch``; NebulaGrid's socket API);
* throughput: 500 one-GPU ``true`` jobs submitted one after another; jobs/s from the first
  submit until every job has ended (Slurm: counted in its jobcomp log, polled every 50 ms).

    python bench/vs_slurm.py [--reps 20] [--jobs 500] [--profiles tuned,default] [--keep]

Ends with ``vs slurm tuned: throughput N.Nx, latency p50 N.Nx``.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))
sys.path.insert(0, str(BENCH))

from submit_latency import nebula_latencies, percentile  # noqa: E402
from throughput import run as nebula_throughput  # noqa: E402

from nebula_tui.sim import slurm  # noqa: E402
from labkit.harness import lab_with_head  # noqa: E402

#: SchedulerParameters per profile, as in the anchor's setup.sh: "tuned" schedules on every
#: 1 s tick with no throttling between passes, a deep queue per pass and a fast backfill.
PROFILES = {"tuned": slurm.TUNED, "default": ""}


# ------------------------------------------------------------------ the two workloads
def latencies(cluster: slurm.SlurmCluster, reps: int, gap: float) -> list[float]:
    samples = []
    jobs = cluster.root / "jobs"
    for n in range(reps):
        time.sleep(gap + random.random())
        out = jobs / f"lat{n}"
        sent = time.time()
        cluster.sbatch("--parsable", "-o", "/dev/null", "--gres=gpu:1",
                       "--wrap", f"date +%s.%N > {out}.tmp && mv {out}.tmp {out}")
        slurm.wait_until(lambda: out.exists() and out.read_text().strip(), 60,
              f"latency job {n} to start", interval=0.005)
        samples.append(float(out.read_text()) - sent)
    cluster.wait_idle()
    return samples


def throughput(cluster: slurm.SlurmCluster, jobs: int) -> tuple[float, float]:
    """(submit rate, jobs/s from the first submit until all ``jobs`` completed)."""
    base = cluster.completed()
    first = time.time()
    for _ in range(jobs):
        cluster.sbatch("-Q", "-o", "/dev/null", "--gres=gpu:1", "--wrap", "true")
    submitted = time.time()
    slurm.wait_until(lambda: cluster.completed() >= base + jobs, 900, f"{jobs} jobs to complete",
          interval=0.05)
    done = time.time()
    cluster.wait_idle()
    return jobs / (submitted - first), jobs / (done - first)


# ------------------------------------------------------------------ report
@dataclass
class Result:
    name: str
    latencies: list[float]
    submit_rate: float
    jps: float
    note: str = ""

    @property
    def p50(self) -> float:
        return percentile(self.latencies, 50)


def latency_row(r: Result) -> str:
    return (f"  {r.name:<16} p50 {r.p50 * 1000:8.1f} ms   p90 {percentile(r.latencies, 90) * 1000:8.1f} ms"
            f"   max {max(r.latencies) * 1000:8.1f} ms")


def load_text() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.2f} (1 min) / {five:.2f} (5 min)"


def report(ours: Result, slurm: list[Result], args, version: str, load_before: str) -> None:
    print()
    print(f"NebulaGrid vs Slurm {version}, one run, {args.nodes} nodes x {args.gpus} GPUs on "
          f"127.0.0.1, {os.cpu_count()} cores; {load_before} at start, {load_text()} at end")
    print(f"submit -> running, {args.reps} sparse one-GPU jobs ({args.gap:g}-{args.gap + 1:g} s "
          "idle before each; the time the job writes minus the time before the submit)")
    for r in (ours, *slurm):
        print(latency_row(r))
    print(f"{args.jobs} one-GPU `true` jobs, first submit -> all done; both sides submit one job "
          "at a time, each answered before the next is sent (Slurm: an sbatch process a job, "
          "answered once slurmctld holds it; NebulaGrid: a request a job on one socket "
          "connection, no process started for it, answered once its commit is on the disk)")
    for r in (ours, *slurm):
        print(f"  {r.name:<16} {r.jps:7.1f} jobs/s   (submits accepted at {r.submit_rate:6.1f}/s)"
              + (f"   {r.note}" if r.note else ""))
    for s in slurm:
        print(f"NebulaGrid vs {s.name}: latency p50 {s.p50 / ours.p50:.1f}x lower, "
              f"throughput {ours.jps / s.jps:.1f}x higher")
    tuned = next((s for s in slurm if s.name == "Slurm tuned"), None)
    if tuned is not None:
        print(f"vs slurm tuned: throughput {ours.jps / tuned.jps:.1f}x, "
              f"latency p50 {tuned.p50 / ours.p50:.1f}x")


def run_nebula(args) -> Result:
    with lab_with_head("4x4") as (_, head):
        lat = nebula_latencies(head, args.reps, args.gap, jitter=1.0, gpu_mem_mb=None)
        submit_rate, jps, failures = nebula_throughput(head, args.jobs)
    return Result("NebulaGrid", lat, submit_rate, jps, f"{failures} failed" if failures else "")


def run_slurm(args, cluster: slurm.SlurmCluster) -> tuple[list[Result], str]:
    """Each profile's result, and Slurm's version."""
    results = []
    cluster.start_munge()
    for profile in args.profiles:
        print(f"Slurm {profile}: starting {args.nodes} slurmd + slurmctld…", flush=True)
        cluster.start_slurm(PROFILES[profile])
        time.sleep(2)  # let the controller finish its start-up passes (as measure.sh does)
        version = cluster.version()
        lat = latencies(cluster, args.reps, args.gap)
        print(f"Slurm {profile}: latency p50 {percentile(lat, 50) * 1000:.0f} ms; "
              f"{args.jobs} jobs…", flush=True)
        submit_rate, jps = throughput(cluster, args.jobs)
        cluster.stop_slurm()
        results.append(Result(f"Slurm {profile}", lat, submit_rate, jps))
    return results, version


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=20, help="latency samples per system")
    parser.add_argument("--jobs", type=int, default=500, help="jobs of the throughput run")
    parser.add_argument("--gap", type=float, default=0.5,
                        help="idle seconds before each latency sample (plus 0-1 s at random)")
    parser.add_argument("--profiles", default="tuned,default",
                        help="Slurm profiles to run, comma-separated (tuned, default)")
    parser.add_argument("--keep", action="store_true", help="keep Slurm's folder (logs) afterwards")
    args = parser.parse_args()
    args.profiles = [p.strip() for p in args.profiles.split(",") if p.strip()]
    unknown = [p for p in args.profiles if p not in PROFILES]
    if unknown or not args.profiles:
        parser.error(f"--profiles: choose from {', '.join(PROFILES)} (got {args.profiles or 'none'})")
    shape = slurm.Shape()
    args.nodes, args.gpus = shape.nodes, shape.gpus
    try:
        slurm.ensure_installed(accounting=False)
    except slurm.SlurmUnavailable as err:
        print(f"vs_slurm: {err}", file=sys.stderr)
        return 2
    load_before = load_text()
    root = Path(tempfile.mkdtemp(prefix="nebula-vs-slurm-"))
    cluster = slurm.SlurmCluster(root, shape)  # no accounting: as the anchor measured it
    try:
        cluster.prepare()
        slurm_results, version = run_slurm(args, cluster)
    except slurm.SlurmUnavailable as err:
        print(f"vs_slurm: {err} (logs in {root}/log)", file=sys.stderr)
        args.keep = True
        return 1
    finally:
        cluster.stop()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"Slurm's folder kept: {root}")
    print("NebulaGrid: simulated lab 4x4 (real sshd) and a head service…", flush=True)
    ours = run_nebula(args)
    report(ours, slurm_results, args, version, load_before)
    return 0


if __name__ == "__main__":
    sys.exit(main())
