"""Capture real Slurm outputs for the pool's parsers into tests/data/slurm/ (as root).

Starts the real Slurm of ``nebula_tui/sim/slurmlab.py`` (Debian's 22.05, 4 nodes × 4 fake
GPUs, slurmdbd, a login node), creates the Unix user ``nebcapture``, and through the login
node as that user — as a pool does — submits jobs that end up pending (Resources, held,
Dependency), running, completed, failed, timed out, cancelled (running and pending) and
failed with their node (NODE_FAIL), then saves what ``sbatch``, ``squeue``, ``sinfo``,
``sacct`` and ``scontrol`` print about them, errors included, and writes SOURCES.md (version,
date, the command behind every file). Takes about two minutes (a one-minute time limit).

    sudo .venv/bin/python scripts/capture_slurm.py [--out tests/data/slurm]

``--gpu-counts`` captures instead, into tests/data/slurm/gpus/, how Slurm counts GPUs: a
cluster whose nodes also offer GPU shards and whose n1-n2 are in a second partition
``small``, running jobs asked with ``--gres=gpu:2``, ``--gpus-per-node``, ``--gpus``,
``--gres=shard:2`` and ``-p small``, and one pending for Resources.
"""

from __future__ import annotations

import argparse
import datetime
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from nebula_tui.pools.slurm_parse import SACCT_FORMAT, SINFO_FORMAT, SQUEUE_FORMAT  # noqa: E402
from nebula_tui.sim.slurm import Shape, SlurmUnavailable, wait_until  # noqa: E402
from nebula_tui.sim.slurmlab import SlurmLab, unlock_for_ssh  # noqa: E402

USER = "nebcapture"
SACCT_FIELDS = "JobID,State,ExitCode,Elapsed,AllocTRES"


class Capture:
    def __init__(self, lab: SlurmLab, out: Path) -> None:
        self.lab, self.out = lab, out
        self.sources: list[tuple[str, str, str]] = []  # (file, where, command)

    def ssh(self, command: str, check: bool = True) -> subprocess.CompletedProcess:
        argv = ["ssh", "-i", str(self.lab.identity_path), "-p", str(self.lab.login_port),
                "-o", f"UserKnownHostsFile={self.lab.known_hosts_path}",
                "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", f"{USER}@127.0.0.1",
                command]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        if check and done.returncode != 0:
            raise SystemExit(f"capture: {command!r} failed ({done.returncode}): {done.stderr}")
        return done

    def save(self, name: str, command: str, what: str, stderr: bool = False) -> str:
        """Run ``command`` on the login node as the user; save its stdout (and, for error
        samples, its stderr and exit status) as ``name``."""
        done = self.ssh(command, check=not stderr)
        text = done.stdout
        if stderr:
            text = (f"# exit status {done.returncode}\n# stdout:\n{done.stdout}"
                    f"# stderr:\n{done.stderr}")
        (self.out / name).write_text(text)
        self.sources.append((name, what, command))
        return done.stdout

    def sbatch(self, *args: str, wrap: str) -> str:
        command = " ".join(["cd ~/nebula && sbatch --parsable", *map(shlex.quote, args),
                            "--wrap", shlex.quote(wrap)])
        return self.ssh(command).stdout.strip().split(";")[0]

    def state(self, job: str) -> str:
        return self.ssh(f"squeue -h -t all -j {job} -o %T", check=False).stdout.strip()

    def wait_state(self, job: str, states: tuple[str, ...], timeout: float = 180) -> None:
        wait_until(lambda: self.state(job) in states, timeout, f"job {job} to be {states}", 0.5)

    def sacct_knows(self, jobs: list[str], states: set[str]) -> bool:
        out = self.ssh(f"sacct -X -n --parsable2 -j {','.join(jobs)} --format=JobID,State",
                       check=False).stdout
        seen = {line.split("|")[0]: line.split("|")[1].split()[0]
                for line in out.splitlines() if "|" in line}
        return all(seen.get(j) in states for j in jobs)


def capture(lab: SlurmLab, out: Path) -> Capture:
    c = Capture(lab, out)
    c.ssh("mkdir -p ~/nebula")
    c.save("sinfo_version.txt", "sinfo --version", "the version, as a pool records it at connect")
    c.save("sinfo_idle.json", "sinfo --json", "sinfo --json, every node idle")
    sbatch_cmd = ("cd ~/nebula && sbatch --parsable --job-name=nebula-7-capture --gres=gpu:1 "
                  "--comment=nebula-token-7 --wrap 'echo hello from $SLURM_JOB_ID'")
    done = c.save("sbatch_parsable.txt", sbatch_cmd, "sbatch --parsable: the job id (no cluster "
                  "suffix: a single cluster prints `jobid`, a federation `jobid;cluster`)")
    completed = done.strip()
    failed = c.sbatch("--job-name=nebula-failing", "--gres=gpu:1", wrap="echo failing >&2; exit 3")
    timeout = c.sbatch("--job-name=nebula-timeout", "--gres=gpu:1", "--time=1", wrap="sleep 600")
    cancel_running = c.sbatch("--job-name=nebula-cancel-running", "--gres=gpu:1", wrap="sleep 600")
    node_fail = c.sbatch("--job-name=nebula-node-fail", "--gres=gpu:1", "--nodelist=n4",
                         "--no-requeue", wrap="sleep 600")
    # Without --no-requeue a batch job whose node fails is requeued (JobRequeue=1).
    requeued = c.sbatch("--job-name=nebula-requeued", "--gres=gpu:1", "--nodelist=n4",
                        wrap="sleep 600")
    multi = c.sbatch("--job-name=nebula-multinode", "--nodes=2", "--gres=gpu:2",
                     "-o", "multinode.out",
                     wrap="env | grep -E '^(SLURM_|CUDA_|GPU_DEVICE)' | sort; sleep 600")
    held = c.sbatch("--job-name=nebula-held", "--gres=gpu:1", "--hold", wrap="true")
    dependent = c.sbatch("--job-name=nebula-dependent", "--gres=gpu:1",
                         f"--dependency=afterok:{cancel_running}", wrap="true")
    big = c.sbatch("--job-name=nebula-needs-all", "--nodes=4", "--gres=gpu:4", wrap="true")
    for job in (timeout, cancel_running, node_fail, requeued, multi):
        c.wait_state(job, ("RUNNING",))
    c.wait_state(big, ("PENDING",))
    wait_until(lambda: "Resources" in c.ssh(f"squeue -h -j {big} -o %r").stdout, 60,
               "the big job to wait for Resources", 0.5)
    wait_until(lambda: "SLURM_JOB_ID" in c.ssh("cat ~/nebula/multinode.out", check=False).stdout,
               60, "the multi-node job's environment", 0.5)
    c.save("multinode_env.txt", "cat ~/nebula/multinode.out",
           "what a 2-node job's batch script sees (--nodes=2 --gres=gpu:2): SLURM_* and "
           "CUDA_VISIBLE_DEVICES")
    live = "pending (Resources, JobHeldUser, Dependency) and running jobs"
    c.save("squeue_live.json", "squeue --json", f"squeue --json: {live}")
    c.save("squeue_live_me.json", "squeue --me --json", f"squeue --me --json: {live}, the user's own")
    c.save("squeue_live.txt", "squeue -h -o '%i|%j|%u|%T|%r|%N|%M|%l|%D|%b|%k'",
           f"squeue -o fallback (id|name|user|state|reason|nodes|time|limit|node count|gres|"
           f"comment): {live}")
    c.save("scontrol_show_job_running.txt", f"scontrol show job -o {multi}",
           "scontrol show job -o of a running 2-node job (scontrol has no --json in 22.05)")
    c.save("scontrol_show_job_pending.txt", f"scontrol show job -o {big}",
           "scontrol show job -o of a job pending for Resources")
    c.save("sinfo_mixed.json", "sinfo --json", "sinfo --json, nodes mixed (some GPUs in use)")
    c.save("sinfo_nodes.txt", "sinfo -h -N -o '%N|%T|%G|%P|%c|%C'",
           "sinfo -N -o fallback (node|state|gres|partition|cpus|cpus A/I/O/T), nodes mixed")
    c.save("sinfo_gres_used.txt", "sinfo -h -N -O 'NodeList:10,StateLong:12,Gres:20,GresUsed:40'",
           "sinfo -N -O with GresUsed (GPUs in use per node), nodes mixed")
    c.save("sacct_live.txt",
           f"sacct -X --parsable2 --noheader --format={SACCT_FIELDS}",
           "sacct, the issue's fields, while jobs are pending and running")
    # The ends: a cancel while running and while pending, a node taken down under its job.
    c.ssh(f"scancel {cancel_running} {held}")
    lab.cluster.stop_node("n4")  # else its slurmd answers and it comes back at once
    subprocess.run(["scontrol", "update", "nodename=n4", "state=down", "reason=capture"],
                   env=lab.env, check=True, capture_output=True, timeout=30)
    subprocess.run(["scontrol", "update", "nodename=n3", "state=drain", "reason=maintenance"],
                   env=lab.env, check=True, capture_output=True, timeout=30)
    c.save("sinfo_node_down.json", "sinfo --json", "sinfo --json, n4 down (its slurmd stopped, reason capture), "
           "n3 drained (reason maintenance)")
    c.save("sinfo_node_down.txt", "sinfo -h -N -o '%N|%T|%G|%P|%c|%C|%E'",
           "sinfo -N -o fallback with the reason, n4 down, n3 drained")
    c.wait_state(requeued, ("PENDING",))
    c.save("squeue_requeued.txt", f"squeue -h -t all -j {requeued},{node_fail} "
           "-o '%i|%j|%u|%T|%r|%N|%M|%l|%D|%b|%k'",
           "squeue -o of two jobs whose node went down: the one submitted with --no-requeue "
           "ended NODE_FAIL, the other was requeued (pending, BeginTime)")
    c.save("sacct_requeued.txt", f"sacct --parsable2 --noheader -D -X -j {requeued},{node_fail} "
           f"--format={SACCT_FIELDS}",
           "sacct -D (every run of a requeued job) of the same two jobs")
    c.ssh(f"scancel {multi} {big} {dependent} {requeued}")
    c.wait_state(timeout, ("TIMEOUT",), timeout=240)
    ended = [completed, failed, timeout, cancel_running, held, node_fail, requeued, multi,
             dependent, big]
    c.save("squeue_ended.json", "squeue -t all --json",
           "squeue -t all --json within MinJobAge: the ended jobs (completed, failed, timeout, "
           "cancelled running and pending, node_fail)")
    c.save("squeue_ended.txt", "squeue -h -t all -o '%i|%j|%u|%T|%r|%N|%M|%l|%D|%b|%k'",
           "squeue -t all -o fallback: the ended jobs")
    wait_until(lambda: c.sacct_knows(ended, {"COMPLETED", "FAILED", "TIMEOUT", "CANCELLED",
                                             "NODE_FAIL"}), 60, "sacct to know every end", 1)
    c.save("sacct_ended.txt", f"sacct -X --parsable2 --noheader --format={SACCT_FIELDS}",
           "sacct, the issue's fields: completed, failed (3), timeout, cancelled (running, held, "
           "pending), node_fail")
    c.save("sacct_ended_header.txt",
           "sacct -X --parsable2 --format=JobID,JobName,User,Account,State,ExitCode,Elapsed,"
           "AllocTRES,NodeList,Reason,Comment,Start,End",
           "sacct with a header and more fields (Comment is empty: the cluster does not set "
           "AccountingStoreFlags=job_comment)")
    c.save("sacct_ended_steps.txt",
           f"sacct --parsable2 --noheader -j {failed},{timeout} --format={SACCT_FIELDS}",
           "sacct without -X: the jobs' steps (batch, extern) too")
    c.save("sacct_ended.json", "sacct --json", "sacct --json of the same jobs")
    # Errors a pool meets, with their exit status.
    c.save("error_sbatch_too_many_gpus.txt", "cd ~/nebula && sbatch --parsable --gres=gpu:8 --wrap true",
           "sbatch refused: more GPUs on one node than any node has", stderr=True)
    c.save("error_sbatch_bad_partition.txt",
           "cd ~/nebula && sbatch --parsable --partition=nosuch --wrap true",
           "sbatch refused: an unknown partition", stderr=True)
    c.save("error_scancel_ended.txt", f"scancel {completed}",
           "scancel of a job that has ended", stderr=True)
    c.save("error_squeue_unknown_job.txt", "squeue -h -j 999999 -o %T",
           "squeue of a job id the controller does not know (or no longer: after MinJobAge)",
           stderr=True)
    c.save("slurm_job_out.txt", f"cat ~/nebula/slurm-{completed}.out",
           "the completed job's output file (default name slurm-<id>.out in the submit directory)")
    lab.cluster.start_node("n4")
    for node in ("n3", "n4"):
        subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], env=lab.env,
                       capture_output=True, timeout=30)
    return c


#: --gpu-counts' cluster: 8 shards per node beside its 4 GPUs, n1-n2 also in ``small``
GPU_SHAPE = Shape(shards=8, partitions=(("small", "n[1-2]"),))
#: --gpu-counts' jobs: (name, sbatch's options), submitted in this order
GPU_JOBS = (("gres", ("--gres=gpu:2",)), ("per-node", ("--nodes=2", "--gpus-per-node=1")),
            ("gpus", ("--gpus=3",)), ("shard", ("--gres=shard:2",)),
            ("small", ("--partition=small", "--gres=gpu:1")),
            ("pending", ("--nodes=4", "--gres=gpu:4")))


def capture_gpu_counts(lab: SlurmLab, out: Path) -> Capture:
    """How each way of asking for GPUs reads in squeue, sinfo and sacct (the pool's own
    commands and the ones people check them with)."""
    c = Capture(lab, out)
    c.ssh("mkdir -p ~/nebula")
    ids = {name: c.sbatch(f"--job-name=nebula-{name}", f"--comment=nebula-token-{name}", *args,
                          wrap="sleep 600") for name, args in GPU_JOBS}
    for name, job in ids.items():
        c.wait_state(job, ("PENDING",) if name == "pending" else ("RUNNING",))
    wait_until(lambda: "Resources" in c.ssh(f"squeue -h -j {ids['pending']} -o %r").stdout, 60,
               "the big job to wait for Resources", 0.5)
    c.save("sinfo_version.txt", "sinfo --version", "the version")
    c.save("squeue.json", "squeue --json", "squeue --json (each job's tres_alloc_str, tres_per_node, "
           "tres_per_job, gres_detail)")
    c.save("squeue.txt", f"squeue -h -t all -O '{SQUEUE_FORMAT}'",
           "the pool's squeue without --json (-O ... tres-alloc: a pending job's is its request)")
    c.save("squeue_b.txt", "squeue -h -o '%i|%T|%b|%P|%k'",
           "squeue %b, the request per node: N/A for --gpus, one node's share for --gpus-per-node")
    c.save("sinfo.json", "sinfo --json", "sinfo --json: each node's gres, gres_used, partitions")
    c.save("sinfo.txt", f"sinfo -h -N -O '{SINFO_FORMAT}'",
           "the pool's sinfo without --json: a line per node and partition, GresUsed")
    c.save("sinfo_partitions.txt", "sinfo -h -O 'Partition:|,Gres:|,GresUsed:|,Nodes:|'",
           "sinfo -O partition,gres,gresused: what each partition has and uses, by node group")
    c.save("sacct.txt", f"sacct -X -n -P --format={SACCT_FORMAT}",
           "the pool's sacct: each job's AllocTRES (the pending one's is empty)")
    c.ssh("scancel " + " ".join(ids.values()))
    return c


def write_sources(c: Capture, out: Path) -> None:
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# Real Slurm outputs",
        "",
        f"Captured {now} by `scripts/capture_slurm.py` (run it again, as root, to refresh them).",
        f"Slurm {c.lab.version} (Debian 12's `slurm-wlm`), munge, slurmdbd over MariaDB "
        f"(accounting {'on' if c.lab.accounting else 'off'}): the cluster of "
        "`nebula_tui/sim/slurmlab.py` — 4 nodes `n1`–`n4` (`slurmd -N nX` on 127.0.0.1) × 4 "
        "fake GPUs (`gres/gpu`, character devices), partition `gpu`, cluster `nebulalab`, "
        "`MinJobAge=300`, no `AccountingStoreFlags`. Every command ran on the login node (a "
        f"real sshd) as the ordinary Unix user `{USER}`, as a pool does; the host name of the "
        "machine was `vm`. Error samples hold the exit status, stdout and stderr.",
        "",
        "Jobs (ids in submit order): completed (`echo`), failed (`exit 3`), timeout "
        "(`--time=1`, `sleep 600`), cancelled while running, NODE_FAIL (`--no-requeue`; its "
        "node `n4` set down, its slurmd stopped), requeued (the same without `--no-requeue`, "
        "then cancelled), a 2-node job (`--nodes=2 --gres=gpu:2`, cancelled), held "
        "(`--hold`, cancelled while pending), dependent (`afterok` on the one cancelled; "
        "cancelled pending), one needing every GPU (`--nodes=4 --gres=gpu:4`: pending for "
        "Resources, cancelled).",
        "",
        "Seen while capturing: a job held or waiting on a dependency and cancelled before it was "
        "eligible is missing from a plain `sacct` (its default time window) but listed by "
        "`sacct -j ID`; a batch job whose node fails is requeued unless submitted with "
        "`--no-requeue` (then NODE_FAIL); `scancel` of a job that ended minutes ago exits 0 "
        "silently; the TIMEOUT job's batch step reads CANCELLED 0:15 (SIGTERM).",
    ]
    write_table(c, out, lines)


def write_table(c: Capture, out: Path, lines: list[str]) -> None:
    """SOURCES.md: ``lines``, then each file's line (what it holds, its command)."""
    lines += ["", "| file | what | command |", "|---|---|---|"]
    for name, what, command in c.sources:
        cell = what.replace("|", "&#124;")
        lines.append(f"| `{name}` | {cell} | `{command.replace('|', '&#124;')}` |")
    (out / "SOURCES.md").write_text("\n".join(lines) + "\n")


def write_gpu_sources(c: Capture, out: Path) -> None:
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# How a real Slurm counts GPUs",
        "",
        f"Captured {now} by `scripts/capture_slurm.py --gpu-counts` (as root). Slurm "
        f"{c.lab.version} (Debian 12's `slurm-wlm`), accounting "
        f"{'on' if c.lab.accounting else 'off'}: 4 nodes `n1`–`n4` × 4 fake GPUs and 8 GPU "
        "shards (`Gres=gpu:4,shard:8`), partition `gpu` (every node, the default) and `small` "
        f"(`n1`, `n2`). Every command ran on the login node as the ordinary user `{USER}`.",
        "",
        "Jobs (`sleep 600`, ids in this order, comment `nebula-token-NAME`): "
        + "; ".join(f"{name}: `{' '.join(args)}`" for name, args in GPU_JOBS)
        + ". All ran but the last, which waited for Resources.",
    ]
    write_table(c, out, lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--gpu-counts", action="store_true",
                        help="capture how GPUs are counted (into tests/data/slurm/gpus)")
    args = parser.parse_args()
    args.out = args.out or REPO / "tests" / "data" / "slurm" / ("gpus" if args.gpu_counts else "")
    args.out.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="nebula-capture-"))
    root.chmod(0o755)
    subprocess.run(["useradd", "-m", USER], capture_output=True)
    try:
        unlock_for_ssh(USER)
        with SlurmLab(root, GPU_SHAPE if args.gpu_counts else Shape()) as lab:
            lab.authorize(USER, lab.identity_pub)
            if args.gpu_counts:
                c = capture_gpu_counts(lab, args.out)
                write_gpu_sources(c, args.out)
            else:
                c = capture(lab, args.out)
                write_sources(c, args.out)
    except SlurmUnavailable as err:
        print(f"capture: {err}", file=sys.stderr)
        return 1
    finally:
        subprocess.run(["userdel", "-r", USER], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)
    print(f"captured {len(c.sources)} files into {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
