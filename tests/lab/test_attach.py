"""Attach for everyone, in a real terminal: ``nebula attach`` as a lab member on a shared-group
service relays the job's tmux session through the head (no node key needed), follows window
resizes, detaches cleanly and leaves the job running; anyone else is refused.

The terminal is a pane of a tmux server of the test's own, driven with ``send-keys`` and read
with ``capture-pane``; the users are real (created by ``test_multiuser``'s fixtures, as root).
"""

from __future__ import annotations

import asyncio
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import asyncssh
import pytest
import yaml

from labkit.harness import wait_for
from nebula_tui.head import attach
from support.users import as_user, lab_users, shared_head, submit_as

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None or shutil.which("setpriv") is None,
                                reason="needs tmux and setpriv")

TMUX = ["tmux", "-L", "nebula-attach-test"]
# Users of their own: support.users' GROUP may be created and removed meanwhile by another run.
# CAROL is an admin: she may attach to anyone's job.
GROUP, ALICE, BOB, CAROL = "nebattlab", "nebattann", "nebattbob", "nebattcar"


@pytest.fixture(scope="module")
def members():
    yield from lab_users(GROUP, (ALICE, BOB, CAROL), ())


@pytest.fixture(scope="module")
def shared(openssh_lab, members, tmp_path_factory):
    cluster = yaml.safe_load(openssh_lab.config_path.read_text())["cluster"]
    cluster.update(run_as="submitter", admins=[CAROL])
    yield from shared_head(openssh_lab, tmp_path_factory, GROUP, {"cluster": cluster})

# Prints its window's size twice a second and echoes what it is sent.
JOB = ["bash", "-c", 'while :; do stty size; if read -t 0.5 line; then echo "got:$line"; fi; done']


@pytest.fixture
def terminal():
    """open(command, name): a 100x30 terminal (a pane of our own tmux server, session
    ``name``) running ``command`` under ``sh``; screen(name): what it shows."""
    subprocess.run([*TMUX, "kill-server"], capture_output=True)

    def open_(command: str, name: str = "t") -> None:
        subprocess.run([*TMUX, "-f", "/dev/null", "new-session", "-d", "-s", name, "-x", "100",
                        "-y", "30", "sh", "-c", command + "; sleep 600"], check=True)

    def screen(name: str = "t") -> str:
        return subprocess.run([*TMUX, "capture-pane", "-p", "-t", name], capture_output=True,
                              text=True).stdout
    screen.open = open_
    yield screen
    subprocess.run([*TMUX, "kill-server"], capture_output=True)


def as_user_in_terminal(head, user: str, *args: str) -> str:
    """The shell line that runs `nebula ARGS` as ``user`` in the terminal, then prints its
    exit code and whether the terminal is cooked again."""
    env = (f"PATH=/usr/bin:/bin PYTHONPATH={head.public} LANG=C.UTF-8 TERM=screen "
           f"NEBULA_SOCKET={head.socket} NEBULA_HOME=/tmp/{user}-nebula")
    # setpriv, not runuser: runuser -c starts a new session, away from the terminal (so no
    # SIGWINCH); a user typing `nebula attach` in their own shell keeps theirs.
    return (f"setpriv --reuid={user} --regid={user} --init-groups env {env} HOME=/home/{user} "
            f"/usr/bin/python3 -m nebula_tui {shlex.join(args)}; "
            f"echo {args[0]}-exit=$?; stty -a | grep -o -- ' -\\?icanon' | head -n 1")


def test_the_owner_attaches_types_resizes_and_detaches_and_the_job_runs_on(shared, terminal):
    job = submit_as(shared, ALICE, "--gpu-mem", "4G", "--", *JOB)
    wait_for(lambda: shared.job(job)["state"] == "running", 20, what="alice's job running")
    terminal.open(as_user_in_terminal(shared, ALICE, "attach", str(job)))
    # The job's window takes the attached terminal's size (tmux's status line takes one row).
    wait_for(lambda: "29 100" in terminal(), 30, what="the job's output at 100x30")
    subprocess.run([*TMUX, "send-keys", "-t", "t", "hello-from-alice", "Enter"], check=True)
    wait_for(lambda: "got:hello-from-alice" in terminal(), 20, what="keys reaching the job")
    subprocess.run([*TMUX, "resize-window", "-t", "t", "-x", "120", "-y", "40"], check=True)
    wait_for(lambda: "39 120" in terminal(), 20, what="the job's window following the resize")
    subprocess.run([*TMUX, "send-keys", "-t", "t", "C-b", "d"], check=True)
    screen = wait_for(lambda: "attach-exit=0" in (s := terminal()) and "icanon" in s and s, 20,
                      what="a clean detach")
    assert "[detached (from session nebula-" in screen
    assert " icanon" in screen and "-icanon" not in screen  # the terminal is cooked again
    assert shared.job(job)["state"] == "running"  # detaching leaves it running
    refused = as_user(shared, BOB, "attach", str(job))
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1
    assert f"job {job} belongs to {ALICE}; only they or an admin" in refused.stderr
    assert shared.run("cancel", str(job)).returncode == 0
    assert shared.wait_job(job)["state"] == "cancelled"


def test_attach_to_a_job_that_is_not_running_says_so(shared):
    job = submit_as(shared, ALICE, "--gpu-mem", "4G", "--", "true")
    shared.wait_job(job)
    done = as_user(shared, ALICE, "attach", str(job))
    assert done.returncode == 1
    assert f"job {job} has succeeded; only a running job has a session" in done.stderr


def test_nebula_run_gives_a_shell_once_it_has_its_gpus_and_ends_with_it(shared, terminal):
    terminal.open(as_user_in_terminal(shared, ALICE, "run", "--pty", "--gpu-mem", "4G", "--",
                                      "bash", "--norc", "--noprofile"))
    job = wait_for(lambda: next((j for j in shared.call("queue")["jobs"] if j["interactive"]
                                 and j["user"] == ALICE and j["state"] == "running"), None),
                   30, what="the interactive job in the queue")  # the queue shows it as any job
    wait_for(lambda: "bash-" in terminal(), 30, what="the shell's prompt")
    subprocess.run([*TMUX, "send-keys", "-t", "t", 'echo "in-job-$NEBULA_JOB_ID"; tty', "Enter"],
                   check=True)
    screen = wait_for(lambda: f"in-job-{job['id']}" in (s := terminal()) and "/dev/pts/" in s and s,
                      20, what="the shell answering")
    assert "not a tty" not in screen  # the shell has a terminal of its own
    subprocess.run([*TMUX, "send-keys", "-t", "t", "exit 3", "Enter"], check=True)
    screen = wait_for(lambda: "run-exit=3" in (s := terminal()) and "icanon" in s and s, 30,
                      what="the shell's exit ending `nebula run`")
    assert f"Job {job['id']} failed with exit code 3" in screen and " icanon" in screen
    ended = shared.wait_job(job["id"])
    assert (ended["state"], ended["exit_code"]) == ("failed", 3)
    assert f"in-job-{job['id']}" in as_user(shared, ALICE, "logs", str(job["id"])).stdout


def test_an_attached_owner_cannot_reach_tmux_and_the_login_account_behind_it(shared, terminal):
    """The session is the node's login account's (root here); its jobs' commands run as
    their owners. tmux's own keys (a new window, the command prompt, a split) would give the
    owner a shell as that account: only the detach key is left to them."""
    marks = Path(tempfile.mkdtemp(prefix="nebula-escape-"))
    marks.chmod(0o777)
    job = submit_as(shared, ALICE, "--gpu-mem", "4G", "--", *JOB)
    wait_for(lambda: shared.job(job)["state"] == "running", 20, what="alice's job running")
    terminal.open(as_user_in_terminal(shared, ALICE, "attach", str(job)))
    wait_for(lambda: "29 100" in terminal(), 30, what="the job's output")
    keys = [["C-b", "c"], ["C-b", '"'], ["C-b", "%"]]
    for n, escape in enumerate(keys):
        subprocess.run([*TMUX, "send-keys", "-t", "t", *escape], check=True)
        subprocess.run([*TMUX, "send-keys", "-t", "t", f"id -un > {marks}/window-{n}", "Enter"],
                       check=True)
    subprocess.run([*TMUX, "send-keys", "-t", "t", "C-b", ":"], check=True)
    subprocess.run([*TMUX, "send-keys", "-t", "t", f"run-shell 'id -un > {marks}/prompt'", "Enter"],
                   check=True)
    time.sleep(3)
    assert {p.name: p.read_text().strip() for p in marks.iterdir()} == {}
    subprocess.run([*TMUX, "send-keys", "-t", "t", "after-the-keys", "Enter"], check=True)
    wait_for(lambda: "got:after-the-keys" in terminal(), 20, what="the job still reading its keys")
    subprocess.run([*TMUX, "send-keys", "-t", "t", "C-b", "d"], check=True)  # detach still works
    wait_for(lambda: "attach-exit=0" in terminal(), 20, what="a clean detach")
    assert shared.job(job)["state"] == "running"
    assert shared.run("cancel", str(job)).returncode == 0
    shutil.rmtree(marks, ignore_errors=True)


def attach_in(shared, terminal, name: str, user: str, job: int) -> None:
    """``user`` attached to ``job`` in terminal ``name``, once the job's output shows there."""
    terminal.open(as_user_in_terminal(shared, user, "attach", str(job)), name)
    wait_for(lambda: "29 100" in terminal(name), 30, what=f"{user}'s attach in {name}")


def refusal(done: subprocess.CompletedProcess) -> str:
    """The one line a refused attach prints ("" when the head let it through: these probes
    have no terminal, so the client leaves right after the head's yes)."""
    if "attach needs a terminal" in done.stderr:
        return ""
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    return done.stderr.strip()


@pytest.mark.slow
def test_one_user_holds_at_most_four_attaches_and_every_way_one_ends_frees_its_place(
        shared, terminal, openssh_lab):
    # Four to attach to, and a spare for the probes and re-attaches.
    *four, spare = [submit_as(shared, ALICE, "--gpu-mem", "4G", "--", *JOB) for _ in range(5)]
    for job in (*four, spare):
        wait_for(lambda: shared.job(job)["state"] == "running", 20, what=f"job {job} running")
    node = {job: shared.job(job)["node"] for job in (*four, spare)}
    lost = next((j for j in four if node[j] != node[spare]), None)  # its node goes away last
    if lost is None:
        pytest.skip("all five jobs landed on one node")
    jobs = [*(j for j in four if j != lost), lost]
    for n, job in enumerate(jobs):
        attach_in(shared, terminal, f"a{n}", ALICE, job)
    probe = lambda: refusal(as_user(shared, ALICE, "attach", str(spare)))  # noqa: E731
    full = (f"{ALICE} already has 4 sessions attached (jobs {', '.join(map(str, four))}); "
            "detach one first")
    assert full in probe()

    def freed_then_refilled(name: str, job: int) -> None:
        wait_for(lambda: probe() == "", 30, what="the ended attach's place free again")
        attach_in(shared, terminal, name, ALICE, job)
        assert "already has 4 sessions attached" in probe()

    # A detach.
    subprocess.run([*TMUX, "send-keys", "-t", "a0", "C-b", "d"], check=True)
    wait_for(lambda: "attach-exit=0" in terminal("a0"), 20, what="a clean detach")
    freed_then_refilled("b0", spare)
    # The client killed (no goodbye on the socket).
    shell = subprocess.run([*TMUX, "display", "-p", "-t", "a1", "#{pane_pid}"], check=True,
                           capture_output=True, text=True).stdout.strip()
    client = int(subprocess.run(["pgrep", "-P", shell], capture_output=True, text=True,
                                check=True).stdout.split()[0])
    os.kill(client, signal.SIGKILL)
    freed_then_refilled("b1", spare)
    # The job ends under the attach.
    ended = jobs[2]
    assert shared.run("cancel", str(ended)).returncode == 0
    assert shared.wait_job(ended)["state"] == "cancelled"
    freed_then_refilled("b2", spare)
    # The node goes away: the attach's channel dies with the connection.
    openssh_lab.stop_node(node[lost])
    try:
        wait_for(lambda: probe() == "", 60, what="the lost node's attach freed")
        # Attaches the head cannot open (the node unreachable) hold no place either.
        for _ in range(3):
            assert "cannot reach the job's node" in refusal(as_user(shared, ALICE, "attach",
                                                                    str(lost)))
        attach_in(shared, terminal, "b3", ALICE, spare)
        assert "already has 4 sessions attached" in probe()
    finally:
        openssh_lab.start_node(node[lost])
    for job in (*four, spare):
        shared.run("cancel", str(job))


def test_one_node_holds_at_most_eight_attaches_so_one_user_leaves_room_for_others(
        shared, terminal):
    """The head's one SSH connection to a node carries the nodelet and every attach there;
    OpenSSH allows 10 sessions a connection. Eight attaches (two users' four) all really
    open on the lab's sshd; the next one, by anyone, is refused by the head, not by sshd."""
    job = submit_as(shared, ALICE, "--gpu-mem", "4G", "--", *JOB)
    wait_for(lambda: shared.job(job)["state"] == "running", 20, what="alice's job running")
    node = shared.job(job)["node"]
    for n in range(4):
        attach_in(shared, terminal, f"a{n}", ALICE, job)
        attach_in(shared, terminal, f"c{n}", CAROL, job)  # an admin, on alice's job
    root = shared.run("attach", str(job))
    assert root.returncode == 1 and root.stderr.count("\n") == 1, root.stderr
    assert (f"{node} already has 8 sessions attached ({ALICE} 4, {CAROL} 4), as many as its "
            "SSH server leaves room for; try again once one detaches") in root.stderr
    subprocess.run([*TMUX, "send-keys", "-t", "c0", "C-b", "d"], check=True)
    wait_for(lambda: "attach needs a terminal" in shared.run("attach", str(job)).stderr, 30,
             what="room on the node after a detach")
    assert shared.run("cancel", str(job)).returncode == 0


def test_the_node_cap_fits_in_the_sessions_a_real_sshd_allows_one_connection(openssh_lab):
    """The caps' premise, on the lab's OpenSSH with its defaults: one connection carries the
    nodelet, ATTACHES_PER_NODE attaches and the spare; the next session is refused."""
    async def sessions() -> tuple[int, str]:
        async with openssh_lab.connect(openssh_lab.nodes[0]) as conn:
            opened = []
            try:
                while len(opened) <= attach.NODE_SESSIONS:
                    opened.append(await conn.create_process("sleep 30"))
            except asyncssh.ChannelOpenError as err:
                return len(opened), err.reason
            finally:
                for process in opened:
                    process.close()
            return len(opened), ""
    opened, why = asyncio.run(sessions())
    assert opened == attach.NODE_SESSIONS == 1 + attach.ATTACHES_PER_NODE + 1, why
