"""Restart in seconds: the head is killed (SIGKILL) while 100 nodes run 400 jobs, and restarted.

    python bench/recovery.py [--nodes 100] [--gpus 8] [--jobs 400] [--kind lab|swarm]

The head is the real ``nebula serve`` in a process of its own. Its ``--nodes`` nodes of
``--gpus`` cards each are, with ``--kind lab`` (the default), the in-process asyncssh lab:
every node a real SSH endpoint on 127.0.0.1 with its own nodelet, emulated nvidia-smi and
tmux server, the jobs really running there (``sleep``) and surviving the head. With
``--kind swarm`` every node is answered from memory by one other process
(``labkit.swarm``), so the figures are the head's own: on 2 cores, 100 real
nodelets starting at once (each runs the emulated nvidia-smi, a Python process that reads
every process's environment, five times before its first probe is out) cost more than the
head does.

Once every job runs, the head gets SIGKILL and is started again at once; the figures are
seconds from the kill until:

* the new head answers on its socket;
* every node is ``up`` again;
* every running job is re-adopted: still ``running``, and its process seen on its GPU by
  the new head (its node's first probe after the restart names the job);
* a job submitted the moment the new head answers is running.

``recovery`` is the last of these. Baseline from the same run: the head's first start on
the same nodes (no jobs yet) until every node is up with its GPUs. Slurm's backup
controller takes over only after ``SlurmctldTimeout``, 120 s by default.

The probe interval is 30 s here (5 s by default): each probe of the lab starts the
emulated nvidia-smi twice and dmesg once, and 100 nodes of them every 5 s would take more
than the machine's 2 cores. A node probes at once when its nodelet starts, so the restart
is measured the same way with either interval.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nebula_tui.api import ApiError, Client  # noqa: E402
from labkit.harness import HeadProcess, wait_for  # noqa: E402
from nebula_tui.sim.lab import Lab  # noqa: E402
from nebula_tui.sim.presets import uniform_nodes  # noqa: E402
from labkit.swarm import SwarmProcess  # noqa: E402

SLURM_BACKUP_TAKEOVER_S = 120.0  # SlurmctldTimeout's default


class Watch:
    """Follows the head's event stream in a thread and notes when each condition first held.

    State: every node's state, every job's state, and which jobs the head sees as a process
    on some GPU. ``moments`` holds the monotonic time each condition was first met.
    """

    def __init__(self, socket: Path, jobs: set[int], nodes: int):
        self.jobs, self.n_nodes = jobs, nodes
        self.node_state: dict[str, str] = {}
        self.job_state: dict[int, str] = {}
        self.gpu_jobs: dict[str, set[int]] = {}  # GPU uuid -> job ids of its processes
        self.moments: dict[str, float] = {}
        self.probe: int | None = None  # the job submitted after the restart
        self.done = threading.Event()
        self._client = Client(socket, timeout=None)
        self._thread = threading.Thread(target=self._follow, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._client.close()

    def _follow(self) -> None:
        try:
            for event in self._client.events():
                self._apply(event)
                self._note()
        except (ApiError, OSError, ValueError):
            pass

    def _apply(self, event: dict) -> None:
        if event.get("type") == "snapshot":
            for node in event["nodes"]:
                self.node_state[node["name"]] = node["state"]
            for job in event["jobs"]:
                self.job_state[job["id"]] = job["state"]
            for gpu in event["gpus"]:
                self._gpu(gpu["uuid"], gpu)
        elif event.get("type") == "node":
            self.node_state[event["node"]["name"]] = event["node"]["state"]
        elif event.get("type") == "job":
            self.job_state[event["job"]["id"]] = event["job"]["state"]
        elif event.get("type") == "gpus":
            for uuid, fields in event["gpus"].items():
                self._gpu(uuid, fields)

    def _gpu(self, uuid: str, fields: dict) -> None:
        if "processes" in fields:
            self.gpu_jobs[uuid] = {p["job_id"] for p in fields["processes"] if p.get("job_id")}

    def _note(self) -> None:
        now = time.monotonic()
        up = len(self.node_state) == self.n_nodes and all(
            s == "up" for s in self.node_state.values())
        if up:
            self.moments.setdefault("nodes up", now)
        seen = set().union(*self.gpu_jobs.values()) if self.gpu_jobs else set()
        if all(self.job_state.get(j) == "running" for j in self.jobs) and self.jobs <= seen:
            self.moments.setdefault("jobs re-adopted", now)
        if self.probe is not None and self.job_state.get(self.probe) == "running":
            self.moments.setdefault("new submit started", now)
        if any(self.job_state.get(j) not in (None, "running") for j in self.jobs):
            self.moments.setdefault("a job left running", now)  # the first one


    def standing(self) -> str:
        """Where each condition stands (said when one never held)."""
        up = sum(s == "up" for s in self.node_state.values())
        running = sum(self.job_state.get(j) == "running" for j in self.jobs)
        seen = len(self.jobs & set().union(*self.gpu_jobs.values())) if self.gpu_jobs else 0
        return (f"{up} of {self.n_nodes} nodes up, {running} of {len(self.jobs)} jobs running "
                f"and {seen} seen on a GPU, the new job {self.job_state.get(self.probe, 'unknown')}")


def start_jobs(head: HeadProcess, count: int) -> list[int]:
    """``count`` one-GPU jobs that run for an hour; returns once all run."""
    with head.client() as client:
        ids = [client.call("submit", command=["sleep", "3600"])["job"]["id"] for _ in range(count)]
    wait_for(lambda: all(j["state"] == "running" for j in head.call("queue")["jobs"]
                         if j["id"] in set(ids)), 300, interval=0.5, what=f"{count} jobs to run")
    return ids


def processes_seen(head: HeadProcess) -> set[int]:
    return {p["job_id"] for g in head.call("gpus")["gpus"] for p in g["processes"] if p["job_id"]}


class LabNodes:
    """The asyncssh lab in this process: real nodelets, emulated nvidia-smi, tmux, jobs."""

    kind = "asyncssh lab: real nodelets, tmux and jobs"

    def __init__(self, root: Path, args) -> None:
        self.lab = Lab(root / "lab", ssh="asyncssh", specs=uniform_nodes(args.nodes, args.gpus),
                       probe_interval=args.probe_interval)
        self.config_path = self.lab.config_path

    def start(self) -> None:
        self.lab.prepare()
        self.lab.start(timeout=60)

    def stop(self) -> None:
        self.lab.stop()


def nodes_for(kind: str, root: Path, args):
    if kind == "lab":
        return LabNodes(root, args)
    swarm = SwarmProcess(root / "swarm", args.nodes, args.gpus, args.probe_interval)
    swarm.kind = "swarm: every node answered from memory in one process"
    return swarm


def all_up(head: HeadProcess, gpus: int) -> bool:
    with head.client() as client:
        return (all(n["state"] == "up" for n in client.call("status")["nodes"])
                and len(client.call("gpus")["gpus"]) == gpus)


def main() -> int:
    # A timeout's SIGTERM unwinds like Ctrl-C: the nodes, the head and the folder go.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--gpus", type=int, default=8, help="GPUs per node")
    parser.add_argument("--jobs", type=int, default=400)
    parser.add_argument("--probe-interval", type=float, default=30.0)
    parser.add_argument("--kind", choices=("lab", "swarm"), default="lab",
                        help="lab: the asyncssh lab (real nodelets and jobs); swarm: nodes "
                             "answered from memory (the head's own cost alone)")
    parser.add_argument("--keep", action="store_true", help="keep the lab's folder afterwards")
    args = parser.parse_args()
    if args.jobs >= args.nodes * args.gpus:
        parser.error("--jobs must leave a GPU free for the submit after the restart")
    root = Path(tempfile.mkdtemp(prefix="nebula-recovery-"))
    nodes = nodes_for(args.kind, root, args)
    head = HeadProcess(root / "home", nodes)
    gpus = args.nodes * args.gpus
    try:
        nodes.start()
        began = time.monotonic()
        head.start(timeout=300, wait_nodes=False)
        wait_for(lambda: all_up(head, gpus), 300, interval=0.1, what="every node up")
        first_start = time.monotonic() - began
        print(f"{args.nodes} nodes x {args.gpus} GPUs up after the head's first start: "
              f"{first_start:.1f} s; starting {args.jobs} jobs…", flush=True)
        ids = start_jobs(head, args.jobs)
        wait_for(lambda: set(ids) <= processes_seen(head), 3 * args.probe_interval + 60,
                 interval=1, what="every job's process on its GPU")
        load = os.getloadavg()[0]

        killed = time.monotonic()
        head.kill()
        head.start(timeout=120, wait_nodes=False)
        answered = time.monotonic()
        watch = Watch(head.socket, set(ids), args.nodes)
        with head.client() as client:
            watch.probe = client.call("submit", command=["sleep", "3600"])["job"]["id"]
        try:
            wait_for(lambda: {"nodes up", "jobs re-adopted", "new submit started"} <= set(watch.moments),
                     300, interval=0.1, what="every node up, every job re-adopted, the new job running")
        except AssertionError as err:
            print(f"recovery: FAILED ({err}): {watch.standing()}", file=sys.stderr)
            return 1
        finally:
            watch.close()
    finally:
        head.stop()
        nodes.stop()
        if args.keep:
            print(f"kept: {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)

    figures = {"head answers": answered - killed,
               **{k: v - killed for k, v in watch.moments.items()}}
    print(f"\nhead killed (SIGKILL) with {args.jobs} jobs running on {args.nodes} nodes x "
          f"{args.gpus} GPUs ({nodes.kind}; probes every {args.probe_interval:g} s; load "
          f"{load:.2f} before the kill); seconds after the kill:")
    for what, seconds in sorted(figures.items(), key=lambda kv: kv[1]):
        print(f"  {what:<28} {seconds:6.1f} s")
    print(f"baseline, same run: the head's first start on these nodes, every node up: {first_start:.1f} s")
    print(f"Slurm: its backup controller takes over after {SLURM_BACKUP_TAKEOVER_S:.0f} s (SlurmctldTimeout)")
    if "a job left running" in figures:
        print(f"recovery: FAILED (a job left running: {watch.standing()})")
        return 1
    recovery = max(figures["nodes up"], figures["jobs re-adopted"], figures["new submit started"])
    print(f"recovery: {recovery:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
