"""The nodelet launches a job once, even when two nodelets are asked for it at once.

A head killed mid-launch leaves its nodelet finishing the launch while the next head's
nodelet relaunches the same job with the same token (the chaos test once saw a job that
ends at once run twice this way). Here two real nodelet processes share one node
directory and one tmux server, and each gets the same launch requests at the same moment.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

from labkit.harness import wait_for

from nebula_tui.remote.ssh import nodelet_source


@pytest.fixture
def nodelets(tmp_path):
    script = tmp_path / "nodelet.py"  # what the head ships to a node
    script.write_bytes(nodelet_source())
    env = dict(os.environ, NEBULA_NODE_DIR=str(tmp_path / "node"), TMUX_TMPDIR=str(tmp_path))
    config = json.dumps({"interval": 60, "tmux_socket": "launch-test", "head": "7"})
    procs = [subprocess.Popen([sys.executable, "-S", str(script), config], env=env, text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
             for _ in range(2)]
    for proc in procs:
        assert json.loads(proc.stdout.readline())["type"] == "hello"
    yield procs
    for proc in procs:
        proc.stdin.close()
        proc.wait(timeout=10)
    subprocess.run(["tmux", "-L", "launch-test", "kill-server"], env=env, capture_output=True)


def test_the_same_launch_from_two_nodelets_runs_once(nodelets, tmp_path):
    ran = tmp_path / "ran.txt"
    jobs = range(1, 31)
    for job in jobs:
        request = json.dumps({"id": job, "op": "launch", "job": job, "token": f"7.0.n{job}",
                              "script": f"echo {job} >> {ran}\n"}) + "\n"
        start = threading.Barrier(2)

        def send(proc):
            start.wait()
            proc.stdin.write(request)
            proc.stdin.flush()

        senders = [threading.Thread(target=send, args=(p,)) for p in nodelets]
        for sender in senders:
            sender.start()
        for sender in senders:
            sender.join()

    def all_ran():
        return ran.exists() and set(ran.read_text().split()) == {str(j) for j in jobs}

    wait_for(all_ran, 30, what="every job to run")
    subprocess.run(["sleep", "0.5"])  # a second run, if any, would land by now
    lines = ran.read_text().split()
    assert len(lines) == len(jobs), f"ran twice: {sorted({j for j in lines if lines.count(j) > 1})}"
