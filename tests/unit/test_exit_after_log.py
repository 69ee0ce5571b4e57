"""A job's exit is reported once its log holds all it wrote: a client that `wait`s for a
job and then reads its log gets the whole log.

The job's output reaches ``output.log`` through the wrapper's ``tee``, which can run after
the wrapper wrote the exit code (the two are processes of a pipeline); on a busy machine
the nodelet's watcher saw the exit code first and reported the end of a job whose log was
still empty (``bench/submit_latency.py`` once read an empty log after ``wait``). Here the
real wrapper (``run_script``) runs under ``sh`` with a ``tee`` that starts late, as a
starved one does, and the real ``Watcher`` looks at its directory in a process of its own,
as the nodelet does; at the moment it reports the exit the log is read.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from nebula_tui.model import Job, JobSpec, Launching, Placement
from nebula_tui.remote.launcher import run_script

HEAD = "t"
PLACEMENT = (Placement("GPU-aaaa", "node01", 0, 8192, False),)

#: The watcher as the nodelet runs it, reporting each event with what the log held then.
WATCH = f"""
import json, os, sys, time
sys.argv[1:] = [json.dumps({{"head": "{HEAD}"}})]
from nebula_tui.node import watcher
def emit(message):
    if message["type"] == "exit":
        log = os.path.join(watcher.attempt_dir(message["job"], message["attempt"]), "output.log")
        print(json.dumps({{"job": message["job"], "log": open(log).read(), "at": time.time()}}),
              flush=True)
watcher.emit = emit
w = watcher.Watcher()
w.last_session_check = time.time() + 3600  # no tmux here: no session counts as vanished
while True:
    w.look()
    time.sleep(watcher.WATCH_EVERY)
"""


def start_job(node_dir: Path, job_id: int, command: str, path: str) -> subprocess.Popen:
    jobdir = node_dir / "heads" / HEAD / "jobs" / str(job_id) / "0"
    jobdir.mkdir(parents=True)
    spec = JobSpec(command=(command,), shell=True)
    job = Job(id=job_id, user="alice", spec=spec, submitted_at=1.0, status=Launching(PLACEMENT))
    (jobdir / "run.sh").write_text(run_script(job, PLACEMENT))
    env = {"PATH": path, "HOME": str(node_dir), "LANG": "C.UTF-8"}
    return subprocess.Popen(["sh", "run.sh", str(jobdir)], cwd=jobdir, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def test_an_exit_is_reported_once_the_log_holds_the_last_output_not_later_than_its_grace(tmp_path):
    slow = tmp_path / "bin"
    slow.mkdir()
    real_tee = subprocess.run(["sh", "-c", "command -v tee"], capture_output=True, text=True).stdout.strip()
    (slow / "tee").write_text(f"#!/bin/sh\nsleep 0.4\nexec {real_tee} \"$@\"\n")
    (slow / "tee").chmod(0o755)
    path = f"{slow}:{os.environ['PATH']}"
    node_dir = tmp_path / "node"
    watch = subprocess.Popen([sys.executable, "-c", WATCH], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "NEBULA_NODE_DIR": str(node_dir),
                                  "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    jobs = []
    try:
        started = time.time()
        # 1: its tee starts late; 2: it leaves a process behind that holds its output open
        jobs.append(start_job(node_dir, 1, "echo the-last-line", path))
        jobs.append(start_job(node_dir, 2, 'echo before-the-child; sleep 5 & echo $! > "$HOME/child"',
                              os.environ["PATH"]))
        reports = {}
        while len(reports) < 2:
            line = watch.stdout.readline()
            assert line, "the watcher ended"
            report = json.loads(line)
            reports[report["job"]] = report
    finally:
        watch.kill()
        for job in jobs:
            job.kill()
        child = node_dir / "child"
        if child.exists():
            os.kill(int(child.read_text()), 9)  # job 2's child, by its pid
    assert reports["1"]["log"] == "the-last-line\n"
    assert reports["2"]["log"] == "before-the-child\n"
    assert reports["2"]["at"] - started < 3.0  # the grace, not the child's 5 s
