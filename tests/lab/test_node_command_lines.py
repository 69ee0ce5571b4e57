"""What another user of a node can read of a running job's processes (issue 30): on a node
whose /proc is not mounted with hidepid, every user reads every process's command line
(``ps -eo args``), while a process's environment is its own user's and root's alone. So
nothing NebulaGrid adds travels on a command line: not the job's variables, not its launch
token, not a shell command's text (``--command "TOKEN=x prog"`` shows ``prog`` only, as it
would in the user's own terminal). Real users, a shared head (``run_as: submitter``, so
jobs switch users with runuser), real tmux and root podman on the simulated lab."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from labkit.harness import wait_for
from support.containers import IMAGE, PROBLEM
from support.users import MALLORY, RUNUSER, VICTOR, submit_as

pytestmark = pytest.mark.skipif(PROBLEM is not None or shutil.which("runuser") is None,
                                reason=PROBLEM or "needs runuser")

SECRET = "hunter2-b7e1"
READ_EVERY_ARGV = ("import json, os\n"
                   "found = {}\n"
                   "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
                   "    try:\n"
                   "        line = open('/proc/%s/cmdline' % pid, 'rb').read()\n"
                   "        found[pid] = line.decode('utf-8', 'replace').split('\\0')\n"
                   "    except OSError:\n"
                   "        pass\n"
                   "print(json.dumps(found))\n")


def argv_seen_by(user: str) -> dict[str, list[str]]:
    done = subprocess.run([RUNUSER, "-u", user, "--", "/usr/bin/python3", "-c", READ_EVERY_ARGV],
                          capture_output=True, text=True, timeout=30, cwd="/", check=True)
    return json.loads(done.stdout)


def _uid_of(pid: str) -> int | None:
    try:
        return Path(f"/proc/{pid}").stat().st_uid
    except OSError:
        return None


@pytest.mark.slow
def test_another_user_reads_nothing_nebula_adds_on_the_command_lines(box_shared, openssh_lab):
    # A tmux server started by a launch would keep that launch's argv for good: start afresh.
    for node in openssh_lab.nodes:
        openssh_lab.kill_node_tmux(node)
    command = f"NEBULA_TEST_SECRET={SECRET} sleep 120"
    jobs = [submit_as(box_shared, MALLORY, "--gpu-mem", "4G", "--command", command),
            submit_as(box_shared, MALLORY, "--gpu-mem", "4G", "--image", IMAGE, "--command", command)]
    try:
        mallory = Path(f"/home/{MALLORY}").stat().st_uid

        def both_sleeping():
            seen = argv_seen_by(VICTOR)
            sleeping = [p for p, argv in seen.items() if argv[:2] == ["sleep", "120"]
                        and _uid_of(p) == mallory]
            return len(sleeping) >= 2 and seen
        seen = wait_for(both_sleeping, 60, what="both jobs' commands running as their user")
        tokens = {path.read_text().strip() for job in jobs for path in
                  openssh_lab.root.glob(f"n/*/node/heads/*/jobs/{job}/*/token")}
        assert len(tokens) >= 2
        lines = [" ".join(argv) for argv in seen.values()]
        exposed = {  # the shell command's text, the job's variables, its launch token
            "command text": [line for line in lines if SECRET in line],
            "variables": [line for line in lines
                          if "NEBULA_JOB_ID=" in line or "CUDA_VISIBLE_DEVICES=" in line],
            "token": [line for line in lines if any(token in line for token in tokens)]}
        assert exposed == {"command text": [], "variables": [], "token": []}
        # the job's variables are there, in its environment (its user's and root's to read)
        assert all(job_state(box_shared, job) == "running" for job in jobs)
        env = subprocess.run([RUNUSER, "-u", MALLORY, "--", "/usr/bin/python3", "-c",
                              "import os, sys; print([open('/proc/%s/environ' % p, 'rb').read()"
                              " for p in sys.argv[1:]])",
                              *[p for p, argv in seen.items() if argv[:2] == ["sleep", "120"]
                                and _uid_of(p) == mallory]],
                             capture_output=True, text=True, timeout=30, cwd="/")
        assert env.stdout.count(f"NEBULA_TEST_SECRET={SECRET}") >= 2, env
        assert env.stdout.count("NEBULA_JOB_ID=") >= 2, env
        refused = subprocess.run([RUNUSER, "-u", VICTOR, "--", "/usr/bin/python3", "-c",
                                  "import sys; open('/proc/%s/environ' % sys.argv[1]).read()",
                                  next(p for p, argv in seen.items() if argv[:2] == ["sleep", "120"]
                                       and _uid_of(p) == mallory)],
                                 capture_output=True, text=True, timeout=30, cwd="/")
        assert "PermissionError" in refused.stderr, refused
    finally:
        for job in jobs:
            box_shared.call("cancel", job=job)
        for job in jobs:
            box_shared.wait_job(job, 60)


def job_state(head, job: int) -> str:
    return head.job(job)["state"]
