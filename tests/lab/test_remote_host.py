"""``nebula --host BOX`` from a "laptop": the real CLI (and the TUI) logs in to the admin box
through a real OpenSSH sshd on 127.0.0.1 as a second Unix user, and talks to the shared
head's socket over stream-local forwarding. The head learns who asks from the kernel — the
sshd child of that login — so the user's jobs are charged to that user, with no token.

The laptop user is root with a HOME of its own: ~/.ssh/config names the box (port, user,
key, known_hosts), a ProxyJump host, and a host reached through an ssh-agent only. The
clients a test starts keep their forwarded sockets under that test's own TMPDIR, so what
the test finds there (or misses) is theirs, never another session's."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from support.head import free_port, submitted_id
from labkit.harness import wait_for
from nebula_tui.sim.lab import find_sshd, port_open
from support.users import ALICE, BOB

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("runuser") or not shutil.which("ssh-keygen")
    or not shutil.which("ssh-agent"),
    reason="needs root (to create users), runuser, sshd, ssh-keygen and ssh-agent")


def _keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path.with_suffix(".pub").read_text().strip()


@pytest.fixture(scope="module")
def box(shared):
    """The admin box's sshd (the users log in to it) and a laptop HOME that knows it."""
    for name in (ALICE, BOB):  # a password of '*': no password login, but not "locked" for sshd
        subprocess.run(["usermod", "-p", "*", name], check=True)
    root = Path(tempfile.mkdtemp(prefix="nebula-box-"))
    root.chmod(0o755)  # sshd reads authorized_keys as the user logging in
    host_key = _keygen(root / "host_key")
    laptop = root / "laptop"
    (laptop / ".ssh").mkdir(parents=True)
    laptop.chmod(0o700)
    login_key = _keygen(laptop / "login_key")
    agent_key = _keygen(laptop / "agent_only_key")  # not named in the config: the agent has it
    (root / "authorized_keys").write_text(f"{login_key}\n{agent_key}\n")
    (root / "authorized_keys").chmod(0o644)
    port = free_port()
    (root / "sshd_config").write_text(textwrap.dedent(f"""\
        Port {port}
        ListenAddress 127.0.0.1
        HostKey {root / 'host_key'}
        PidFile {root / 'sshd.pid'}
        AuthorizedKeysFile {root / 'authorized_keys'}
        StrictModes no
        UsePAM no
        PasswordAuthentication no
        KbdInteractiveAuthentication no
        PubkeyAuthentication yes
        AllowUsers {ALICE} {BOB}
        AllowStreamLocalForwarding yes
        AllowTcpForwarding yes
        UseDNS no
        """))
    sshd = subprocess.Popen([find_sshd(), "-D", "-e", "-f", str(root / "sshd_config")],
                            stderr=open(root / "sshd.log", "wb"))
    wait_for(lambda: port_open(port), 20, what="the box's sshd")
    other_key = _keygen(root / "other_host_key")
    (laptop / ".ssh" / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_key}\n")
    (laptop / ".ssh" / "wrong_known_hosts").write_text(f"[127.0.0.1]:{port} {other_key}\n")
    known = laptop / ".ssh" / "known_hosts"
    hosts = {  # Host: (User, IdentityFile or None for the agent, known_hosts, ProxyJump)
        "admin-box": (ALICE, laptop / "login_key", known, None),
        "bob-box": (BOB, laptop / "login_key", known, None),
        "jumped-box": (BOB, laptop / "login_key", known, "admin-box"),
        "agent-box": (ALICE, None, known, None),
        "changed-box": (ALICE, laptop / "login_key", laptop / ".ssh" / "wrong_known_hosts", None),
    }
    lines = []
    for name, (user, identity, known_hosts, jump) in hosts.items():
        lines += [f"Host {name}", "  HostName 127.0.0.1", f"  Port {port}", f"  User {user}",
                  f"  UserKnownHostsFile {known_hosts}"]
        lines += [f"  IdentityFile {identity}"] if identity else []
        lines += [f"  ProxyJump {jump}"] if jump else []
    (laptop / ".ssh" / "config").write_text("\n".join(lines) + "\n")
    agent = subprocess.run(["ssh-agent", "-s", "-a", str(laptop / "agent.sock")], check=True,
                           capture_output=True, text=True)
    agent_pid = int(agent.stdout.split("SSH_AGENT_PID=")[1].split(";")[0])
    env = {"PATH": os.environ["PATH"], "HOME": str(laptop), "LANG": "C.UTF-8",
           "NEBULA_HOME": str(laptop / ".nebula"), "SSH_AUTH_SOCK": str(laptop / "agent.sock")}
    subprocess.run(["ssh-add", "-q", str(laptop / "agent_only_key")], env=env, check=True,
                   capture_output=True)
    try:
        yield {"env": env, "socket": str(shared.socket), "laptop": laptop, "root": root,
               "port": port}
    finally:
        sshd.terminate()
        sshd.wait(10)
        os.kill(agent_pid, 15)
        shutil.rmtree(root, ignore_errors=True)


def _argv(host: str | None, args) -> list[str]:
    return [sys.executable, "-m", "nebula_tui"] + (["--host", host] if host else []) + list(args)


def laptop(box, *args: str, host: str | None = "admin-box", timeout: float = 90,
           **env) -> subprocess.CompletedProcess:
    """The real CLI on the laptop (``--host`` when ``host``; the box's socket named)."""
    return subprocess.run(_argv(host, args), env={**box["env"], "NEBULA_SOCKET": box["socket"], **env},
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def client_tmp():
    """A TMPDIR of this test's own for the clients it starts, short enough for a Unix
    socket's path under it (pytest's own directories may not be)."""
    path = Path(tempfile.mkdtemp(prefix="nt-client-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def tunnel_dirs(tmp: Path) -> list[Path]:
    """The forwarded sockets' directories of the clients whose TMPDIR is ``tmp``."""
    return sorted(tmp.glob("nebula-ssh-*"))


def forwarding(tmp: Path) -> bool:
    return any((d / "nebula.sock").exists() for d in tunnel_dirs(tmp))


def ssh_ports(box) -> set[int]:
    """This machine's ports of the established TCP connections to the box's sshd."""
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, remote, state = line.split()[1:4]
            if state == "01" and int(remote.rsplit(":", 1)[1], 16) == box["port"]:
                ports.add(int(local.rsplit(":", 1)[1], 16))
    return ports


def test_a_users_jobs_over_ssh_are_charged_to_that_user(box, shared):
    before = {u["name"]: u for u in shared.call("users")["users"]}
    done = laptop(box, "submit", "--gpu-mem", "4G", "--wait", "--", "sh", "-c", "id -un")
    assert done.returncode == 0, done.stderr
    job = submitted_id(done.stdout)
    assert shared.job(job)["user"] == ALICE  # the login on the box, as the kernel says
    assert laptop(box, "logs", str(job)).stdout == f"{ALICE}\n"  # and it ran as her
    # Bob, through a jump host (ProxyJump admin-box in ~/.ssh/config), is Bob.
    bob = laptop(box, "submit", "--gpu-mem", "4G", "--json", "--", "true", host="jumped-box")
    assert bob.returncode == 0, bob.stderr
    assert json.loads(bob.stdout)["user"] == BOB
    shared.wait_job(json.loads(bob.stdout)["id"])
    after = {u["name"]: u for u in shared.call("users")["users"]}
    assert after[ALICE]["jobs_finished"] == before.get(ALICE, {}).get("jobs_finished", 0) + 1
    assert after[BOB]["jobs_finished"] == before.get(BOB, {}).get("jobs_finished", 0) + 1


@pytest.mark.slow
def test_every_kind_of_command_works_over_ssh_and_nebula_host_is_the_default(box, shared, client_tmp):
    box = {**box, "env": {**box["env"], "TMPDIR": str(client_tmp)}}  # its clients' sockets: here
    status = laptop(box, "status", host=None, NEBULA_HOST="admin-box")
    assert status.returncode == 0 and status.stdout.startswith("Cluster Overview:"), status.stderr
    assert "node03" in status.stdout
    job = json.loads(laptop(box, "submit", "--gpu-mem", "4G", "--json", "--", "sleep", "600").stdout)
    wait_for(lambda: shared.job(job["id"])["state"] == "running", 30, what="the job running")
    queue = json.loads(laptop(box, "queue", "--json", host="agent-box").stdout)  # key in the agent
    assert any(j["id"] == job["id"] and j["user"] == ALICE for j in queue)
    assert laptop(box, "gpus").stdout.splitlines()[0].startswith("GPU")
    refused = laptop(box, "cancel", str(job["id"]), host="bob-box")
    assert refused.returncode == 1 and f"belongs to {ALICE}" in refused.stderr
    # A client that follows the log until the job ends, its socket under this test's TMPDIR.
    follower = subprocess.Popen(_argv("admin-box", ["logs", "-f", str(job["id"])]),
                                env={**box["env"], "NEBULA_SOCKET": box["socket"]},
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: forwarding(client_tmp), 60, what="the follower's forwarded socket")
        cancelled = laptop(box, "cancel", str(job["id"]))
        assert cancelled.returncode == 0, cancelled.stderr
        assert shared.wait_job(job["id"])["state"] == "cancelled"
        assert follower.wait(60) == 0, follower.stderr.read()
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
    words = laptop(box, "__complete", "nodes", host=None, NEBULA_HOST="admin-box")
    assert words.stdout.split() == ["node01", "node02", "node03"]
    # Nothing was left behind on the laptop: every client's forwarded socket's directory is gone.
    assert tunnel_dirs(client_tmp) == []


@pytest.mark.parametrize("signo", [signal.SIGHUP, signal.SIGTERM], ids=["SIGHUP", "SIGTERM"])
def test_a_client_ended_by_a_signal_removes_its_socket_and_says_goodbye(box, shared, client_tmp, signo):
    """A closed terminal (SIGHUP) or a kill (SIGTERM) ends a client mid-command: its
    forwarded socket's directory goes, and it disconnects from the box as a clean exit would."""
    job = json.loads(laptop(box, "submit", "--gpu-mem", "4G", "--json", "--", "sleep", "600").stdout)
    before = ssh_ports(box)
    client = subprocess.Popen(_argv("admin-box", ["logs", "-f", str(job["id"])]),
                              env={**box["env"], "NEBULA_SOCKET": box["socket"], "TMPDIR": str(client_tmp),
                                   "PYTHONFAULTHANDLER": "1"},
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              # a suite started under nohup hands its children SIGHUP ignored,
                              # which the client rightly keeps ignoring: a terminal's client here
                              preexec_fn=lambda: signal.signal(signo, signal.SIG_DFL))
    try:
        wait_for(lambda: forwarding(client_tmp) and ssh_ports(box) - before, 60,
                 what="the client's SSH connection and forwarded socket")
        ours = ssh_ports(box) - before
        client.send_signal(signo)
        try:
            ended = client.wait(30)
        except subprocess.TimeoutExpired:  # where was it? (its threads' stacks)
            client.send_signal(signal.SIGABRT)
            client.wait(10)
            raise AssertionError("the client still ran 30 s after the signal:\n"
                                 + client.stderr.read()[-6000:]) from None
        assert ended == -signo  # it still dies of the signal
        assert "Traceback" not in client.stderr.read()
        assert tunnel_dirs(client_tmp) == []
        wait_for(lambda: not ssh_ports(box) & ours, 10, what="its SSH connection closed")
        log = (box["root"] / "sshd.log").read_text()
        for port in ours:  # an SSH disconnect, not a connection dropped by a dying process
            assert f"Received disconnect from 127.0.0.1 port {port}:11" in log, log[-2000:]
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()
        shared.call("cancel", job=job["id"])
        shared.wait_job(job["id"])


def test_failures_are_one_line_and_say_what_to_do(box):
    changed = laptop(box, "status", host="changed-box")
    assert changed.returncode == 1 and changed.stderr.count("\n") == 1
    assert "host key is not in your known_hosts (or changed)" in changed.stderr
    assert "ssh-keygen -R" in changed.stderr  # the way out of a changed key
    assert not (box["laptop"] / ".nebula" / "nebula.sock").exists()  # no head started in its place
    no_service = laptop(box, "status", NEBULA_SOCKET="")
    assert no_service.returncode == 1 and no_service.stderr.count("\n") == 1
    assert "no head service answers on admin-box" in no_service.stderr
    assert "/run/nebula/nebula.sock" in no_service.stderr and f"/home/{ALICE}/.nebula/nebula.sock" in no_service.stderr
    unknown = laptop(box, "status", host="nebula-no-such-host.invalid")
    assert unknown.returncode == 1 and unknown.stderr.startswith("nebula: cannot connect to")
    assert "Traceback" not in unknown.stderr + no_service.stderr + changed.stderr
    local = laptop(box, "serve")
    assert local.returncode == 2 and "drop --host" in local.stderr


def test_a_long_tmpdir_still_gets_a_socket_and_keeps_nothing(box, shared, client_tmp):
    """A TMPDIR too long for a Unix socket's path (108 bytes) is no reason to refuse: the
    client makes its private directory where the path fits, and removes it as it ends."""
    long_tmp = client_tmp / ("deep" * 25)
    long_tmp.mkdir()
    runtime = client_tmp / "run"
    runtime.mkdir(mode=0o700)
    status = laptop(box, "status", TMPDIR=str(long_tmp), XDG_RUNTIME_DIR=str(runtime))
    assert status.returncode == 0 and status.stdout.startswith("Cluster Overview:"), status.stderr
    assert tunnel_dirs(long_tmp) == [] and tunnel_dirs(runtime) == []


@pytest.mark.skipif(not shutil.which("tmux"), reason="needs tmux")
@pytest.mark.parametrize("ending", ["q", "SIGTERM", "SIGHUP"])
def test_the_tui_runs_over_ssh_and_leaves_no_socket_however_it_ends(box, shared, tmp_path, client_tmp,
                                                                   ending):
    """Quit with q (the terminal given back: the alternate screen off), killed, or its
    terminal closed: the TUI over SSH leaves no forwarded socket behind."""
    tmux = ["tmux", "-S", str(tmp_path / "tmux.sock"), "-f", "/dev/null"]
    env = {**box["env"], "NEBULA_SOCKET": box["socket"], "NEBULA_HOST": "admin-box",
           "TERM": "xterm-256color", "TMPDIR": str(client_tmp)}
    subprocess.run(tmux + ["new-session", "-d", "-x", "120", "-y", "36",
                           f"{sys.executable} -m nebula_tui; echo TUI-EXITED $?; sleep 30"],
                   env=env, check=True, cwd=str(box["laptop"]))

    shown = [""]  # the last screen that showed anything: the pane may be gone at a timeout

    def screen() -> str:
        now = subprocess.run(tmux + ["capture-pane", "-p"], capture_output=True, text=True).stdout
        shown[0] = now if now.strip() else shown[0]
        return now

    def pane(field: str) -> str:
        return subprocess.run(tmux + ["display", "-p", f"#{{{field}}}"], capture_output=True,
                              text=True).stdout.strip()

    try:
        wait_for(lambda: "1 Overview" in (s := screen()) and "node03" in s, 90,
                 interval=0.5, what="the TUI's overview over SSH", seen=lambda: shown[0])
        assert forwarding(client_tmp) and pane("alternate_on") == "1"
        if ending == "q":
            subprocess.run(tmux + ["send-keys", "q"], check=True)
        else:  # the pane's shell runs the TUI as its one child
            shell = pane("pane_pid")
            (tui,) = Path(f"/proc/{shell}/task/{shell}/children").read_text().split()
            os.kill(int(tui), getattr(signal, ending))
        code = 0 if ending == "q" else 128 + getattr(signal, ending)  # it dies of the signal
        wait_for(lambda: f"TUI-EXITED {code}" in screen(), 30, interval=0.3, what="the TUI to end")
        if ending == "q":
            assert pane("alternate_on") == "0"
        assert tunnel_dirs(client_tmp) == []
    finally:
        subprocess.run(tmux + ["kill-server"], capture_output=True)
