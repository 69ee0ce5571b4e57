"""Hundreds of simulated nodes in one process, for measuring the head at scale.

Each node is an SSH endpoint on 127.0.0.1 like the lab's asyncssh kind (its own port and
host key in the lab's ``known_hosts``, the lab's client key, the lab's ``nodes.yaml``), so
the head connects, verifies and talks to it exactly as to a real node. What differs is the
session: instead of starting python3 with the nodelet, this process answers in the
nodelet's protocol itself (``node/nodelet.py``'s docstring), from memory —

* ``hello`` at once, then a ``probe`` every probe interval (each node at its own phase),
  its vendor-neutral readings what the nodelet's nvidia-smi backend makes of the emulated
  nvidia-smi's own output (``fake_smi``) for the GPUs of ``node.json``, busy where a job
  runs;
* ``launch`` is accepted and answered with ``started``; the job then runs until cancelled
  (``cancel`` or ``signal KILL``), which reports its ``exit``; ``list``, ``ack``, ``log``
  answer like the nodelet.

No process, tmux session or emulated tool is started per node, so 500 nodes cost this
process a few percent of a core and the head's own figures are what a bench measures.
Jobs the head believes already run when the swarm starts (a pre-filled store) are given
in a JSON file, ``{node: {job id: [GPU index, …]}}``; their processes show in the probes.

    python -m labkit.swarm --dir D --nodes 500 [--gpus 8] [--probe-interval 5]
                                   [--jobs running.json]

writes the lab (``D/nodes.yaml``, keys, ``known_hosts``) and ``D/ready`` once every node
listens, and serves until SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import asyncssh

from nebula_tui.node.backends import nvidia_smi
from nebula_tui.sim import fake_smi
from nebula_tui.sim.lab import Lab, _AsyncNode
from nebula_tui.sim.presets import uniform_nodes

_READ_LENGTH = re.compile(r"read\((\d+)\)")
_VISIBLE = re.compile(r"CUDA_VISIBLE_DEVICES=([\d,]+)")
_JOB_MEMORY_MB = 20000
_JOB_UTIL = 90.0


class SwarmNode(_AsyncNode):
    """One simulated node: the lab's asyncssh endpoint, whose sessions are fake nodelets."""

    def __init__(self, lab: Lab, name: str, spec: dict, running: dict[int, list[int] | dict]):
        super().__init__(lab, name)
        self.spec = spec
        self.jobs: dict[int, dict] = {}  # job id -> {"gpus": [index], "token", "pid"}
        for job, held in running.items():
            # {"gpus": [...], "token": ...}: a job the head's store launched here under that
            # token (its reconcile adopts it); a bare list of GPUs: one without a record
            if isinstance(held, dict):
                self._add(int(job), held["gpus"], held.get("token"))
            else:
                self._add(int(job), held, None)

    def _add(self, job: int, gpus: list[int], token: str | None) -> None:
        self.jobs[job] = {"gpus": gpus, "token": token, "pid": 100000 + job, "t": time.time()}

    def _handle(self, process: asyncssh.SSHServerProcess) -> None:
        task = asyncio.get_running_loop().create_task(FakeNodelet(self, process).serve())
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)


class FakeNodelet:
    """One session speaking the nodelet's protocol for ``node``."""

    def __init__(self, node: SwarmNode, process: asyncssh.SSHServerProcess):
        self.node, self.process = node, process
        command = process.command or ""
        words = shlex.split(command) if command else []
        try:
            self.settings = json.loads(words[-1]) if words else {}
        except ValueError:
            self.settings = {}
        found = _READ_LENGTH.search(command)
        self.source_length = int(found.group(1)) if found else 0
        self.tick = 0

    def emit(self, message: dict) -> None:
        self.process.stdout.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")

    async def serve(self) -> None:
        probes = None
        try:
            if self.source_length:  # the nodelet's source comes first on stdin
                await self.process.stdin.readexactly(self.source_length)
            self.emit(self.hello())
            probes = asyncio.create_task(self.probe_loop())
            while line := await self.process.stdin.readline():
                if line.strip():
                    self.handle(json.loads(line))
        except (asyncio.IncompleteReadError, asyncssh.Error, OSError, ValueError):
            pass
        finally:
            if probes:
                probes.cancel()
            self.process.close()

    # ----- node -> head
    def hello(self) -> dict:
        states = self.states()
        return {"type": "hello", "hostname": self.node.name, "pid": os.getpid(),
                "python": sys.version.split()[0], "uid": os.getuid(),
                "node_dir": f"/sim/{self.node.name}",
                "topo": fake_smi.topo_matrix(self.node.spec, states),
                "smi_table": fake_smi.table(self.node.spec, states), "clocks_csv": "",
                "t": time.time()}

    def states(self) -> list[dict]:
        processes = [{"pid": job["pid"], "name": "python", "gpus": job["gpus"],
                      "memory_mb": _JOB_MEMORY_MB, "util": _JOB_UTIL - (self.tick + job_id) % 20}
                     for job_id, job in self.node.jobs.items()]
        return [fake_smi.gpu_state(g, processes, {}) for g in self.node.spec["gpus"]]

    def probe(self) -> dict:
        """The readings the real nodelet would send: the emulated nvidia-smi's CSV read by
        the nvidia-smi backend's own parser, as on a node with that tool."""
        states = self.states()
        fmt = {"csv", "noheader", "nounits"}
        gpu_csv, _ = fake_smi.query_gpu(self.node.spec, states,
                                        ",".join(nvidia_smi.QUERY_GPU_FIELDS), fmt)
        apps_csv, _ = fake_smi.query_apps(self.node.spec, states,
                                          ",".join(nvidia_smi.QUERY_APPS_FIELDS), fmt)
        devices, _ = nvidia_smi.parse_query_gpu_lines(gpu_csv.splitlines(),
                                                      nvidia_smi.QUERY_GPU_FIELDS)
        processes = nvidia_smi.parse_query_apps_lines(apps_csv.splitlines(),
                                                      nvidia_smi.QUERY_APPS_FIELDS)
        return {"type": "probe", "t": time.time(), "error": "", "devices": devices,
                "processes": processes, "problems": [], "clamped": [],
                "pid_jobs": {str(job["pid"]): str(job_id) for job_id, job in self.node.jobs.items()},
                "pid_users": {}}

    async def probe_loop(self) -> None:
        interval = float(self.settings.get("interval", 5.0))
        self.emit(self.probe())
        await asyncio.sleep(random.random() * interval)  # nodes do not probe in step
        while True:
            self.tick += 1
            self.emit(self.probe())
            await asyncio.sleep(interval)

    # ----- head -> node
    def handle(self, req: dict) -> None:
        op = req.get("op")
        reply: dict = {"ok": True}
        jobs = self.node.jobs
        if op == "launch":
            job = int(req["job"])
            if job in jobs and jobs[job]["token"] == req.get("token"):
                reply["already"] = True
            else:
                found = _VISIBLE.search(req.get("script", ""))
                gpus = [int(i) for i in found.group(1).split(",")] if found else []
                self.node._add(job, gpus, req.get("token"))
                reply["already"] = False
        elif op in ("cancel", "signal") and (op == "cancel" or req.get("signal") == "KILL"):
            job = jobs.pop(int(req["job"]), None)
            if job is not None and op == "cancel":
                self.emit({"type": "exit", "job": str(req["job"]), "code": 143,
                           "token": job["token"], "t": time.time()})
        elif op == "list":
            reply.update(list_reply({j: (job["token"], job.get("t")) for j, job in jobs.items()}))
        elif op == "log":
            reply.update(exists=False, data="", offset=int(req.get("offset", 0)))
        elif op not in ("ack", "signal"):
            reply = {"ok": False, "error": f"the simulated node does not do {op!r}"}
        reply.update(type="reply", id=req.get("id"))
        self.emit(reply)
        if op == "launch" and not reply.get("already"):
            self.emit({"type": "started", "job": str(req["job"]), "token": req.get("token"),
                       "t": time.time()})




def list_reply(running: dict[int, tuple[str | None, float | None]]) -> dict:
    """The nodelet's ``list`` reply (each job's attempts and live sessions) for these jobs,
    running here under their launch tokens since the given times."""
    every = {str(j): {str(_attempt(token)): {
        "token": token, "launched": True, "started": True, "started_at": t,
        "exit_code": None, "acked": False}}
        for j, (token, t) in running.items() if token}
    tokens = {str(j): token or "" for j, (token, _) in running.items()}
    return {"attempts": every,
            "jobs": {j: dict(info, attempt=int(a)) for j, found in every.items()
                     for a, info in found.items()},
            "session_tokens": tokens, "sessions": sorted(tokens, key=int)}


def _attempt(token: str) -> int:
    """The attempt a launch token names (``<head>.<attempt>.<nonce>``)."""
    parts = token.split(".")
    return int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else 0


class SwarmProcess:
    """A swarm in a process of its own (``python -m labkit.swarm``), for benches and
    tests: ``start()`` returns once every node listens; ``config_path`` is its nodes.yaml."""

    def __init__(self, root: Path, nodes: int, gpus: int = 8, probe_interval: float = 5.0,
                 running: dict[str, dict[int, list[int] | dict]] | None = None):
        self.root = Path(root)
        self.argv = [sys.executable, "-m", "labkit.swarm", "--dir", str(self.root / "lab"),
                     "--nodes", str(nodes), "--gpus", str(gpus), "--probe-interval", str(probe_interval)]
        self.running = running
        self.process: subprocess.Popen | None = None

    @property
    def config_path(self) -> Path:
        return self.root / "lab" / "nodes.yaml"

    def start(self, timeout: float = 300) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        argv = list(self.argv)
        if self.running:
            jobs = self.root / "running.json"
            jobs.write_text(json.dumps(self.running))
            argv += ["--jobs", str(jobs)]
        log_path = self.root / "swarm.log"
        with open(log_path, "wb") as log:
            # ``-m labkit.swarm`` finds labkit wherever the caller's working directory is.
            root = str(Path(__file__).resolve().parent.parent)
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(
                p for p in (root, os.environ.get("PYTHONPATH")) if p)}
            self.process = subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                                            env=env)
        ready = self.root / "lab" / "ready"
        deadline = time.monotonic() + timeout
        while not ready.exists():
            if self.process.poll() is not None:
                raise RuntimeError(f"the swarm exited: {log_path.read_text()[-800:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the swarm did not listen within {timeout:.0f}s")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


async def run_swarm(root: Path, nodes: int, gpus: int, probe_interval: float,
                    running: dict[str, dict[int, list[int] | dict]]) -> None:
    specs = uniform_nodes(nodes, gpus)
    lab = Lab(root, ssh="asyncssh", specs=specs, probe_interval=probe_interval)
    lab.prepare()
    members = [SwarmNode(lab, s["name"], s, running.get(s["name"], {})) for s in specs]
    for member in members:
        await member.start()
    lab.write_ready()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    for member in members:
        await member.stop()
    lab.ready_path.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m labkit.swarm",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True, type=Path)
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--probe-interval", type=float, default=5.0)
    parser.add_argument("--jobs", type=Path, help="JSON {node: {job id: [GPU index, …] or "
                        "{gpus: [...], token: launch token}}} running at start")
    args = parser.parse_args(argv)
    running = json.loads(args.jobs.read_text()) if args.jobs else {}
    asyncio.run(run_swarm(args.dir, args.nodes, args.gpus, args.probe_interval, running))
    return 0


if __name__ == "__main__":
    sys.exit(main())
