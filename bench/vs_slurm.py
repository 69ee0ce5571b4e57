"""NebulaGrid against real Slurm, side by side in one run, on a cluster of the same shape.

Slurm: Debian's ``slurm-wlm`` (22.05) with munge, set up the way
../shared/anchors/slurm/setup.sh does it — 4 fake nodes (one ``slurmd -N nX`` each on
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
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))
sys.path.insert(0, str(BENCH))

from submit_latency import nebula_latencies, percentile  # noqa: E402
from throughput import run as nebula_throughput  # noqa: E402

from nebula_tui.sim.harness import lab_with_head  # noqa: E402

PACKAGES = ("slurm-wlm", "munge")
#: SchedulerParameters per profile, as in the anchor's setup.sh: "tuned" schedules on every
#: 1 s tick with no throttling between passes, a deep queue per pass and a fast backfill.
PROFILES = {
    "tuned": "batch_sched_delay=0,sched_min_interval=0,default_queue_depth=1000,bf_interval=1,bf_continue",
    "default": "",
}


class BenchError(RuntimeError):
    """Slurm cannot be set up or run here; str() says what to do."""


# ------------------------------------------------------------------ install
def missing_packages() -> list[str]:
    missing = []
    for package in PACKAGES:
        done = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package],
                              capture_output=True, text=True)
        if "install ok installed" not in done.stdout:
            missing.append(package)
    return missing


def ensure_installed() -> None:
    """Install slurm-wlm and munge with apt when missing (root only: slurmd runs as root)."""
    if os.geteuid() != 0:
        raise BenchError("this bench runs Slurm's daemons, which need root: run it as root "
                         "(sudo make bench-slurm); as root it installs slurm-wlm and munge itself")
    missing = missing_packages() if shutil.which("dpkg-query") else list(PACKAGES)
    if missing and not shutil.which("apt-get"):
        raise BenchError(f"{' and '.join(missing)} missing and no apt-get here: install "
                         "Slurm 22.05 (slurmctld, slurmd) and munge, then run it again")
    if missing:
        print(f"installing {' '.join(missing)} (apt-get)…", flush=True)
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        for argv in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *missing]):
            done = subprocess.run(argv, env=env, capture_output=True, text=True)
            if done.returncode != 0:
                tail = (done.stderr or done.stdout).strip().splitlines()[-1:]
                raise BenchError(f"{' '.join(argv)} failed: {tail[0] if tail else done.returncode}")
    for tool in ("slurmctld", "slurmd", "sbatch", "munged"):
        if not shutil.which(tool):
            raise BenchError(f"{tool} not found after installing {' '.join(PACKAGES)}")


def free_port_run(count: int, start: int = 20000, stop: int = 40000) -> int:
    """The first of ``count`` consecutive ports that are all free on 127.0.0.1 now."""
    base = random.randrange(start, stop - count, count + 1)
    for _ in range(200):
        held = []
        try:
            for port in range(base, base + count):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                held.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            base = start + (base - start + count + 1) % (stop - start - count)
        finally:
            for s in held:
                s.close()
    raise BenchError(f"no {count} consecutive free ports between {start} and {stop}")


# ------------------------------------------------------------------ config
@dataclass
class Shape:
    nodes: int = 4
    gpus: int = 4
    cpus: int = 8  # advertised: more than the machine's, so jobs are bound by GPUs


def slurm_conf(root: Path, host: str, ctld_port: int, node_port: int, shape: Shape,
               sched: str) -> tuple[str, str]:
    """(slurm.conf, gres.conf) of the anchor's cluster under ``root``; node i listens on
    ``node_port + i - 1``. Only ``sched`` (SchedulerParameters) differs between profiles."""
    conf = f"""ClusterName=nebulabench
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={root}/munge/run/munge.socket.2
CredType=cred/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/state/slurmctld.pid
SlurmdPidFile={root}/spool/%n/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
MailProg=/bin/true
MpiDefault=none
ProctrackType=proctrack/pgid
TaskPlugin=task/none
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc={root}/log/jobcomp.txt
ReturnToService=2
SlurmdParameters=config_overrides
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
"""
    if sched:
        conf += f"SchedulerParameters={sched}\n"
    last = node_port + shape.nodes - 1
    conf += (f"NodeName=n[1-{shape.nodes}] NodeHostname={host} NodeAddr=127.0.0.1 "
             f"Port=[{node_port}-{last}] CPUs={shape.cpus} RealMemory=4000 Gres=gpu:{shape.gpus} "
             "State=UNKNOWN\n"
             "PartitionName=gpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n")
    gres = "AutoDetect=off\n" + "".join(
        f"NodeName=n{i} Name=gpu File={root}/dev/n{i}/nvidia[0-{shape.gpus - 1}]\n"
        for i in range(1, shape.nodes + 1))
    return conf, gres


# ------------------------------------------------------------------ cluster
@dataclass
class SlurmCluster:
    """A throw-away Slurm under ``root``: munged, slurmctld and one slurmd per fake node,
    each a child of this process in its own session, stopped by its pid."""

    root: Path
    shape: Shape = field(default_factory=Shape)
    daemons: dict[str, subprocess.Popen] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.host = socket.gethostname().split(".")[0]
        self.env = dict(os.environ, SLURM_CONF=str(self.root / "etc" / "slurm.conf"))
        self.munge_socket = self.root / "munge" / "run" / "munge.socket.2"

    # --- layout
    def prepare(self) -> None:
        r = self.root
        for sub in ("etc", "state", "log", "jobs", "dev", "munge/key", "munge/run", "munge/log"):
            (r / sub).mkdir(parents=True, exist_ok=True)
        # munged insists on a key directory nobody else may read and a socket directory
        # everybody may traverse.
        for path, mode in ((r, 0o755), (r / "munge", 0o755), (r / "munge" / "run", 0o755),
                           (r / "munge" / "key", 0o700), (r / "munge" / "log", 0o700)):
            path.chmod(mode)
        key = r / "munge" / "key" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        # Slurm 22.05 drops a GPU without File= and complains about a File= that is not a
        # character device: make devices with NVIDIA's major number (nothing opens them).
        for i in range(1, self.shape.nodes + 1):
            (r / "spool" / f"n{i}").mkdir(parents=True, exist_ok=True)
            d = r / "dev" / f"n{i}"
            d.mkdir(exist_ok=True)
            for g in range(self.shape.gpus):
                path = d / f"nvidia{g}"
                try:
                    os.mknod(path, 0o600 | 0o020000, os.makedev(195, (i - 1) * self.shape.gpus + g))
                except OSError:
                    path.touch()  # slurmd logs an error for it but still counts it

    # --- daemons
    def _spawn(self, name: str, argv: list[str]) -> None:
        with open(self.root / "log" / f"{name}.stdout", "ab") as out:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                    env=self.env, start_new_session=True)
        self.daemons[name] = proc
        time.sleep(0.3)
        if proc.poll() is not None:
            log = (self.root / "log" / f"{name}.stdout").read_text(errors="replace")
            raise BenchError(f"{name} exited at start ({proc.returncode}): {log.strip()[-500:]}")

    def _halt(self, name: str) -> None:
        proc = self.daemons.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)

    def start_munge(self) -> None:
        m = self.root / "munge"
        self._spawn("munged", ["munged", "-F", f"--socket={self.munge_socket}",
                               f"--key-file={m / 'key' / 'munge.key'}",
                               f"--pid-file={m / 'run' / 'munged.pid'}",
                               f"--seed-file={m / 'key' / 'munged.seed'}",
                               f"--log-file={m / 'log' / 'munged.log'}"])
        self._until(self.munge_socket.exists, 5, "munged's socket")

    def start_slurm(self, profile: str) -> None:
        """Write the profile's config and start slurmctld (clean state) and every slurmd;
        returns when every node is idle."""
        ctld = free_port_run(1)
        nodes = free_port_run(self.shape.nodes)
        conf, gres = slurm_conf(self.root, self.host, ctld, nodes, self.shape, PROFILES[profile])
        (self.root / "etc" / "slurm.conf").write_text(conf)
        (self.root / "etc" / "gres.conf").write_text(gres)
        for sub in ("state", "jobs"):  # job ids restart at 1; no earlier profile's files
            shutil.rmtree(self.root / sub, ignore_errors=True)
            (self.root / sub).mkdir()
        (self.root / "log" / "jobcomp.txt").unlink(missing_ok=True)
        conf_path = str(self.root / "etc" / "slurm.conf")
        self._spawn("slurmctld", ["slurmctld", "-D", "-c", "-i", "-f", conf_path])
        self._until(lambda: "UP" in self._out(["scontrol", "ping"]), 15, "slurmctld to answer")
        for i in range(1, self.shape.nodes + 1):
            self._spawn(f"slurmd-n{i}", ["slurmd", "-D", "-N", f"n{i}", "-f", conf_path])
        self._until(lambda: len(self._out(["sinfo", "-h", "-N", "-t", "idle", "-o", "%N"]).split())
                    >= self.shape.nodes, 30, "every slurmd to register idle")
        time.sleep(2)  # let the controller finish its start-up passes (as measure.sh does)

    def version(self) -> str:
        words = self._out(["sinfo", "-V"]).split()
        return words[-1] if words else "?"

    def stop_slurm(self) -> None:
        for name in [n for n in self.daemons if n.startswith("slurmd-")] + ["slurmctld"]:
            self._halt(name)

    def stop(self) -> None:
        self.stop_slurm()
        self._halt("munged")

    # --- helpers
    def _out(self, argv: list[str]) -> str:
        done = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=30)
        return done.stdout

    @staticmethod
    def _until(predicate, timeout: float, what: str, interval: float = 0.1) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise BenchError(f"timed out after {timeout:.0f}s waiting for {what}")
            time.sleep(interval)

    def sbatch(self, *args: str) -> str:
        done = subprocess.run(["sbatch", *args], env=self.env, cwd=self.root / "jobs",
                              capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            raise BenchError(f"sbatch failed: {done.stderr.strip()}")
        return done.stdout.strip()

    def completed(self) -> int:
        try:
            with open(self.root / "log" / "jobcomp.txt", "rb") as f:
                return sum(1 for _ in f)
        except FileNotFoundError:
            return 0

    def wait_idle(self, timeout: float = 120) -> None:
        self._until(lambda: not self._out(["squeue", "-h", "-o", "%i"]).strip(), timeout,
                    "Slurm's queue to drain")

    # --- the two workloads
    def latencies(self, reps: int, gap: float) -> list[float]:
        samples = []
        for n in range(reps):
            time.sleep(gap + random.random())
            out = self.root / "jobs" / f"lat{n}"
            sent = time.time()
            self.sbatch("--parsable", "-o", "/dev/null", "--gres=gpu:1",
                        "--wrap", f"date +%s.%N > {out}.tmp && mv {out}.tmp {out}")
            self._until(lambda: out.exists() and out.read_text().strip(), 60,
                        f"latency job {n} to start", interval=0.005)
            samples.append(float(out.read_text()) - sent)
        self.wait_idle()
        return samples

    def throughput(self, jobs: int) -> tuple[float, float]:
        """(submit rate, jobs/s from the first submit until all ``jobs`` completed)."""
        base = self.completed()
        first = time.time()
        for _ in range(jobs):
            self.sbatch("-Q", "-o", "/dev/null", "--gres=gpu:1", "--wrap", "true")
        submitted = time.time()
        self._until(lambda: self.completed() >= base + jobs, 900, f"{jobs} jobs to complete",
                    interval=0.05)
        done = time.time()
        self.wait_idle()
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


def run_slurm(args, cluster: SlurmCluster) -> tuple[list[Result], str]:
    """Each profile's result, and Slurm's version."""
    results = []
    cluster.start_munge()
    for profile in args.profiles:
        print(f"Slurm {profile}: starting {args.nodes} slurmd + slurmctld…", flush=True)
        cluster.start_slurm(profile)
        version = cluster.version()
        lat = cluster.latencies(args.reps, args.gap)
        print(f"Slurm {profile}: latency p50 {percentile(lat, 50) * 1000:.0f} ms; "
              f"{args.jobs} jobs…", flush=True)
        submit_rate, jps = cluster.throughput(args.jobs)
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
    shape = Shape()
    args.nodes, args.gpus = shape.nodes, shape.gpus
    try:
        ensure_installed()
    except BenchError as err:
        print(f"vs_slurm: {err}", file=sys.stderr)
        return 2
    load_before = load_text()
    root = Path(tempfile.mkdtemp(prefix="nebula-vs-slurm-"))
    cluster = SlurmCluster(root, shape)
    try:
        cluster.prepare()
        slurm, version = run_slurm(args, cluster)
    except BenchError as err:
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
    report(ours, slurm, args, version, load_before)
    return 0


if __name__ == "__main__":
    sys.exit(main())
