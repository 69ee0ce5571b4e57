"""What the nodelet's watcher reads while a job runs: it looks at every running attempt
every 20 ms, so each look is what a node pays for each of its running jobs all the time.

A real wrapper (``run_script``) runs under ``sh`` in a job directory as the nodelet lays it
out; the real ``Watcher`` looks at it in a process of its own (as the nodelet does), with
an audit hook counting the files each look opens.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from nebula_tui.model import Job, JobSpec, Launching, Placement
from nebula_tui.remote.launcher import run_script

HEAD = "t"
PLACEMENT = (Placement("GPU-aaaa", "node01", 0, 8192, False),)

WATCH = f"""
import json, os, sys, time
sys.argv[1:] = [json.dumps({{"head": "{HEAD}"}})]
from nebula_tui.node import watcher
events = []
watcher.emit = events.append
w = watcher.Watcher()
w.last_session_check = time.time() + 3600  # no tmux here: no session counts as vanished
def until(kind):
    for _ in range(1000):
        w.look()
        if any(e["type"] == kind for e in events):
            return
        time.sleep(0.01)
    raise SystemExit("no %s event" % kind)
until("started")
opened, counting = [], [True]
sys.addaudithook(lambda event, args: opened.append(os.path.basename(str(args[0])))
                 if event == "open" and counting[0] else None)
for _ in range(20):
    w.look()
counting[0] = False
open(os.path.join(os.environ["JOBDIR"], "go"), "w").close()
until("exit")
print(json.dumps({{"events": events, "opened": opened}}))
"""


def test_a_running_attempt_costs_one_read_a_look_and_its_exit_still_carries_its_token(tmp_path):
    node_dir = tmp_path / "node"
    jobs = node_dir / "heads" / HEAD / "jobs"
    jobdir = jobs / "5" / "0"
    jobdir.mkdir(parents=True)
    (jobdir / "token").write_text(f"{HEAD}.0.abc")
    go = jobdir / "go"
    spec = JobSpec(command=(f"while [ ! -e '{go}' ]; do sleep 0.02; done",), shell=True)
    job = Job(id=5, user="alice", spec=spec, submitted_at=1.0, status=Launching(PLACEMENT))
    (jobdir / "run.sh").write_text(run_script(job, PLACEMENT))
    # an attempt that ended and that the head acknowledged: never reported again
    done = jobs / "4" / "0"
    done.mkdir(parents=True)
    for name, text in (("token", f"{HEAD}.0.old"), ("started", ""), ("exit_code", "0\n"),
                       ("logged", ""), ("acked", "1")):
        (done / name).write_text(text)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8"}
    wrapper = subprocess.Popen(["sh", "run.sh", str(jobdir)], cwd=jobdir, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        watch = subprocess.run(
            [sys.executable, "-c", WATCH], capture_output=True, text=True, timeout=60,
            env={**env, "NEBULA_NODE_DIR": str(node_dir), "JOBDIR": str(jobdir),
                 "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    finally:
        go.touch()  # whatever the watcher did, the job ends
        wrapper.wait(timeout=30)
    assert watch.returncode == 0, watch.stderr
    seen = json.loads(watch.stdout)
    # each look at the running attempt opens its exit code and nothing else
    assert seen["opened"] == ["exit_code"] * 20
    assert [(e["type"], e["job"], e["token"]) for e in seen["events"]] == [
        ("started", "5", f"{HEAD}.0.abc"), ("exit", "5", f"{HEAD}.0.abc")]
