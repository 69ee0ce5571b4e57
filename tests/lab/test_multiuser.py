"""One head service, several real Unix users (R22): identity from the kernel, permissions,
a socket only the lab's group can reach, a store nobody else can read, jobs run as their
owner. CI runs as root, so the test creates its users and group."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from labkit.harness import wait_for
from labkit.harness import HeadProcess
from support.users import ALICE, BOB, GROUP, RUNUSER, STRANGER, as_user, submit_as
from support.head import submitted_id

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("runuser") or not Path("/usr/bin/python3").exists(),
    reason="needs root (to create users), runuser and /usr/bin/python3")

def test_each_job_belongs_to_the_user_the_kernel_names(shared):
    a = submit_as(shared, ALICE, "--gpu-mem", "4G", "--", "true")
    b = submit_as(shared, BOB, "--gpu-mem", "4G", "--", "true")
    assert shared.job(a)["user"] == ALICE and shared.job(b)["user"] == BOB
    shared.wait_job(a)
    shared.wait_job(b)
    users = {u["name"]: u for u in shared.call("users")["users"]}
    assert users[ALICE]["jobs_finished"] == 1 and users[BOB]["jobs_finished"] == 1


def test_a_client_cannot_claim_another_identity(shared):
    forged = ("import json, socket, sys; s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); "
              "s.sendall(json.dumps({'op': 'submit', 'user': 'root', 'command': ['true'], "
              "'gpu_mem_mb': 4096}).encode() + b'\\n'); print(s.makefile().readline())")
    done = subprocess.run([RUNUSER, "-u", BOB, "--", "/usr/bin/python3", "-c", forged, str(shared.socket)],
                          capture_output=True, text=True, timeout=30)
    reply = json.loads(done.stdout)
    assert reply["ok"] and reply["job"]["user"] == BOB
    shared.wait_job(reply["job"]["id"])


def test_permission_matrix(shared):
    job = submit_as(shared, ALICE, "--gpu-mem", "4G", "--", "sh", "-c", "echo secret; sleep 60")
    wait_for(lambda: shared.job(job)["state"] == "running", 20, what="alice's job running")
    for verb in ("cancel", "hold", "logs"):
        refused = as_user(shared, BOB, verb, str(job))
        assert refused.returncode == 1, (verb, refused.stdout)
        assert f"belongs to {ALICE}; only they or an admin" in refused.stderr
        assert refused.stderr.count("\n") == 1 and "secret" not in refused.stdout
    assert wait_for(lambda: "secret" in as_user(shared, ALICE, "logs", str(job)).stdout, 10,
                    what="alice reading her own log")
    # root is an admin: it may cancel anyone's job, and that is audited.
    assert shared.run("cancel", str(job)).returncode == 0
    assert shared.wait_job(job)["state"] == "cancelled"
    audit = [e for e in shared.call("events", limit=500)["events"] if e["kind"] == "admin"]
    assert any(f"job {job} cancel requested by root" in e["message"] for e in audit)


def test_only_admins_raise_priority(shared):
    refused = as_user(shared, BOB, "submit", "--priority", "5", "--", "true")
    assert refused.returncode == 1 and "only an admin" in refused.stderr
    lowered = submit_as(shared, BOB, "--priority", "-1", "--gpu-mem", "4G", "--", "true")
    assert shared.wait_job(lowered)["state"] == "succeeded"


def test_only_the_group_reaches_the_socket_and_nobody_the_store(shared):
    mode = shared.socket.stat().st_mode & 0o777
    assert mode == 0o660
    outsider = as_user(shared, STRANGER, "queue")
    assert outsider.returncode == 1 and "Permission denied" in outsider.stderr
    assert outsider.stderr.count("\n") == 1
    for path in (shared.home / "state.db",):
        read = subprocess.run([RUNUSER, "-u", BOB, "--", "cat", str(path)], capture_output=True)
        assert read.returncode != 0 and b"Permission denied" in read.stderr


def test_jobs_run_as_their_owner(shared):
    done = as_user(shared, ALICE, "submit", "--gpu-mem", "4G", "--wait", "--", "sh", "-c", "id -un; pwd")
    assert done.returncode == 0, done.stderr
    job = submitted_id(done.stdout)
    log = as_user(shared, ALICE, "logs", str(job)).stdout.split()
    assert log == [ALICE, "/"]  # where it was submitted from (as_user's cwd), which the node has


def test_the_socket_peer_is_the_kernels_word(shared):
    """The server reads SO_PEERCRED; check what the kernel reports for our own socket."""
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(shared.socket))
        s.sendall(b'{"op": "ping"}\n')
        assert json.loads(s.makefile().readline())["user"] == "root"


def test_one_users_job_cannot_reach_anothers_files_on_its_node(shared, openssh_lab):
    """The attacks of the review, as bob's job on the node where alice's job runs: read her
    log, write 0 into her exit-code file (her job would "succeed" while it runs), read the
    head's SSH private key."""
    victim = submit_as(shared, ALICE, "--gpu-mem", "4G", "--", "sh", "-c", "echo alice-secret; sleep 60")
    node = wait_for(lambda: (j := shared.job(victim))["state"] == "running" and j["node"], 20,
                    what="alice's job running")
    jobdir = openssh_lab.node_dir(node) / "node" / "heads" / shared.head_id / "jobs" / str(victim) / "0"
    assert (jobdir / "output.log").exists()
    attack = (f"cat {jobdir}/output.log; echo 0 > {jobdir}/exit_code; "
              f"cat {openssh_lab.identity_path}; echo attack-over")
    done = as_user(shared, BOB, "submit", "--gpu-mem", "4G", "--wait", "--", "sh", "-c", attack)
    job = submitted_id(done.stdout)
    log = as_user(shared, BOB, "logs", str(job)).stdout
    assert "attack-over" in log and log.count("Permission denied") == 3, log
    assert "alice-secret" not in log and "PRIVATE KEY" not in log
    assert not (jobdir / "exit_code").exists()
    time.sleep(1)
    assert shared.job(victim)["state"] == "running"
    assert shared.run("cancel", str(victim)).returncode == 0
    shared.wait_job(victim)


def test_a_shared_head_refuses_to_run_jobs_as_the_login_account(openssh_lab, users, tmp_path):
    config = yaml.safe_load(openssh_lab.config_path.read_text())
    config["cluster"]["run_as"] = "login"
    (tmp_path / "nodes.yaml").write_text(yaml.safe_dump(config))
    (tmp_path / "home").mkdir(mode=0o700)
    head = HeadProcess(tmp_path / "home", openssh_lab, config=tmp_path / "nodes.yaml",
                       serve_args=("--shared-group", GROUP))
    done = subprocess.run([sys.executable, "-m", "nebula_tui", "serve", "--shared-group", GROUP],
                          env=head.env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "needs `run_as: submitter`" in done.stderr and "read another's log" in done.stderr
    assert not head.socket.exists()


def test_other_users_see_neither_escapes_nor_command_lines(shared):
    """The review's terminal injection: a job name and arguments with ESC, BEL, CR and
    newlines printed fake lines and retitled other users' terminals; and everyone read
    everyone's command line (one held TOKEN=hunter2)."""
    name = "x\x1b]0;pwned\x07\r"
    # It waits for a running job of Bob's (a request no card could serve is refused at submit).
    blocker = int(as_user(shared, BOB, "submit", "--gpu-mem", "4G", "--", "sleep", "600").stdout.split()[2])
    done = as_user(shared, BOB, "submit", "--name", "t\x1b]0;title\x07", "--after", str(blocker), "--", "sh", "-c",
                   "TOKEN=hunter2 true", f"{name}\n  999  alice  fake  running  node01:0  rm -rf ~")
    assert done.returncode == 0, done.stderr
    job = submitted_id(done.stdout)
    try:
        seen = as_user(shared, ALICE, "queue").stdout
        assert "\x1b" not in seen and "\x07" not in seen and "\r" not in seen
        assert "hunter2" not in seen and "t\\x1b]0;title" in seen
        assert not any(line.lstrip().startswith("999") for line in seen.splitlines())
        other = json.loads(as_user(shared, ALICE, "job", str(job), "--json").stdout)
        assert other["command"] == [f"(hidden: only {BOB} and admins see it)"]
        own = json.loads(as_user(shared, BOB, "job", str(job), "--json").stdout)
        assert "TOKEN=hunter2 true" in own["command"]
        assert "\x1b]0;pwned\x07\r\n" in own["command"][-1]
        assert "TOKEN=hunter2 true" in shared.call("job", job=job)["job"]["command"]  # root: an admin
    finally:
        shared.run("cancel", str(job))
        shared.run("cancel", str(blocker))


def test_clients_wait_for_a_shared_head_that_restarts(shared):
    """During a restart some `nebula submit` calls ended in a traceback (`PermissionError:
    …/serve.log`): a client with the head's root-owned home tried to start a head of its own
    there. A client that may not start the service waits for it, with one line saying so,
    whichever home it names: its own, or the shared head's."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(shared.public), "LANG": "C.UTF-8",
           "NEBULA_SOCKET": str(shared.socket), "NEBULA_CONFIG": str(shared.home / "nodes.yaml")}
    homes = {ALICE: f"/tmp/{ALICE}-nebula", BOB: str(shared.home)}  # Bob names root's home
    shared.stop()
    clients = {user: subprocess.Popen(
        [RUNUSER, "-u", user, "--", "/usr/bin/python3", "-m", "nebula_tui", "submit", "--gpu-mem", "4G",
         "--", "true"], env={**env, "NEBULA_HOME": home}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, cwd="/") for user, home in homes.items()}
    time.sleep(2)  # they are waiting by now
    shared.start(wait_nodes=False)
    for user, client in clients.items():
        out, err = client.communicate(timeout=60)
        assert client.returncode == 0 and "Traceback" not in err, (user, err)
        assert err.count("\n") == 1 and "(restarting?); waiting up to" in err, (user, err)
        shared.wait_job(int(out.split()[2]), timeout=60)
    assert not Path(f"/tmp/{ALICE}-nebula/serve.log").exists()
