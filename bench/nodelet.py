"""The node side alone: what one nodelet and its tmux server spend on each job.

One real nodelet (the script the head ships, run by this machine's python3 on its stdin
pipe, no SSH) on a tmux server of its own launches ``--jobs`` one-GPU ``true`` jobs, at
most ``--parallel`` at a time (a node's cards), each launch -> exit -> ack as the head
does it, with the wrapper the head writes. Printed per job: wall time, and the CPU of the
nodelet (with the processes it starts) and of the tmux server (with the job's wrapper,
shell and command) — and the same with every tmux command run as a process of its own
(``"tmux_control": false``), the baseline, measured in the same run, rounds alternating.

    python bench/nodelet.py [--jobs 300] [--parallel 4] [--rounds 2]

Ends with ``nodelet: control client N.Nx less node CPU a job, N.Nx the jobs/s``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nebula_tui.model import Job, JobSpec, Launching, Placement  # noqa: E402
from nebula_tui.remote import launcher, shipping  # noqa: E402

HEAD = "benchnodelet"
HZ = os.sysconf("SC_CLK_TCK")
CARD = (Placement("GPU-bench-0", "bench", 0, 8192, True),)


def cpu_s(pid: int) -> tuple[float, float]:
    """(own, reaped children's) CPU seconds of ``pid``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / HZ, (int(fields[13]) + int(fields[14])) / HZ


class Nodelet:
    def __init__(self, root: Path, control: bool):
        self.env = dict(os.environ, NEBULA_NODE_DIR=str(root / "node"), TMUX_TMPDIR=str(root / "tmux"))
        self.env.pop("TMUX", None)
        (root / "tmux").mkdir(parents=True)
        script = root / "nodelet.py"
        script.write_text(shipping.script())
        settings = {"interval": 5, "head": HEAD, "tmux_socket": "nebula-bench",
                    "tmux_control": control}
        self.tmux = ["tmux", "-L", "nebula-bench"]
        self.proc = subprocess.Popen(["python3", "-u", str(script), json.dumps(settings)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=self.env,
                                     text=True, bufsize=1)
        self.proc.stdout.readline()  # hello
        self.exits: set[str] = set()
        self.changed = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()
        self.ids = iter(range(1, 1 << 30))

    def _read(self) -> None:
        for line in self.proc.stdout:
            message = json.loads(line)
            if message.get("type") == "exit":
                with self.changed:
                    self.exits.add(message["job"])
                    self.changed.notify_all()

    def send(self, op: str, **fields) -> None:
        self.proc.stdin.write(json.dumps({"id": next(self.ids), "op": op, **fields}) + "\n")

    def server_pid(self) -> int:
        done = subprocess.run(self.tmux + ["display-message", "-p", "#{pid}"], env=self.env,
                              capture_output=True, text=True, check=True)
        return int(done.stdout)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)
        subprocess.run(self.tmux + ["kill-server"], env=self.env, stderr=subprocess.DEVNULL)


def token(job: int) -> str:
    return f"{HEAD}.0.n{job}"


def one_round(root: Path, control: bool, jobs: int, parallel: int) -> dict[str, float]:
    node = Nodelet(root, control)
    try:
        time.sleep(0.5)  # the first probe
        server = node.server_pid()
        before = cpu_s(node.proc.pid), cpu_s(server)
        started = time.perf_counter()
        running: set[str] = set()
        following = 1
        while following <= jobs or running:
            while following <= jobs and len(running) < parallel:
                job = Job(following, "bench", JobSpec(command=("true",)), 1.0,
                          status=Launching(CARD))
                node.send("launch", job=following, token=token(following),
                          script=launcher.run_script(job, CARD))
                running.add(str(following))
                following += 1
            with node.changed:
                node.changed.wait_for(lambda: running & node.exits, timeout=30)
                ended = running & node.exits
            if not ended:
                raise SystemExit("nodelet bench: no job ended within 30 s")
            running -= ended
            node.send("ack", jobs=[[int(j), token(int(j))] for j in ended])
        wall = time.perf_counter() - started
        after = cpu_s(node.proc.pid), cpu_s(server)
    finally:
        node.close()
    nodelet = sum(after[0]) - sum(before[0])
    tmux = sum(after[1]) - sum(before[1])
    return {"jobs_s": jobs / wall, "nodelet_ms": nodelet / jobs * 1e3,
            "tmux_ms": tmux / jobs * 1e3, "node_ms": (nodelet + tmux) / jobs * 1e3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--parallel", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if shutil.which("tmux") is None:
        raise SystemExit("nodelet bench: needs tmux (scripts/setup.sh installs it)")
    results: dict[bool, list[dict[str, float]]] = {True: [], False: []}
    with tempfile.TemporaryDirectory(prefix="nebula-nodelet-bench-") as folder:
        for n in range(args.rounds):
            for control in (False, True):
                root = Path(folder) / f"{n}-{int(control)}"
                results[control].append(one_round(root, control, args.jobs, args.parallel))
    print(f"{args.jobs} one-GPU `true` jobs through one nodelet, {args.parallel} at a time, "
          f"{args.rounds} rounds alternating; CPU per job (ms), best round")
    best = {c: min(rounds, key=lambda r: r["node_ms"]) for c, rounds in results.items()}
    for control, name in ((False, "a tmux process a command"), (True, "one control client")):
        r = best[control]
        print(f"  {name:26s} {r['jobs_s']:6.0f} jobs/s   nodelet {r['nodelet_ms']:5.2f}   "
              f"tmux server + job {r['tmux_ms']:5.2f}   node {r['node_ms']:5.2f}")
    print(f"nodelet: control client {best[False]['node_ms'] / best[True]['node_ms']:.1f}x less "
          f"node CPU a job, {best[True]['jobs_s'] / best[False]['jobs_s']:.1f}x the jobs/s")


if __name__ == "__main__":
    main()
