"""``nebula demo --slurm``: the simulated lab with a real Slurm as its pool ``hpc``, the way a
newcomer starts it — the real CLI, the demo's own processes, a job run on real slurmd and
read back with ``nebula logs``, everything gone after Ctrl-C."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from nebula_tui.sim import slurm
from labkit.harness import wait_for

pytestmark = pytest.mark.lab  # a demo with Slurm of its own

REPO = Path(__file__).resolve().parents[2]


def _why_no_slurm() -> str | None:
    if os.geteuid() != 0:
        return "nebula demo --slurm runs Slurm's daemons, which need root"
    missing = slurm.missing_packages(slurm.PACKAGES)
    if missing:
        return f"{' and '.join(missing)} not installed (scripts/test-deps.sh installs them as root)"
    return None


def nebula(home: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = dict(os.environ, NEBULA_HOME=str(home), NEBULA_CONFIG=str(home / "lab" / "nodes.yaml"),
               PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "nebula_tui", *args], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_the_demo_with_slurm_runs_a_pool_job_and_leaves_nothing_behind(tmp_path):
    reason = _why_no_slurm()
    if reason:
        pytest.skip(reason)
    home = tmp_path / "home"
    out = tmp_path / "demo.out"
    env = dict(os.environ, NEBULA_HOME=str(home), PYTHONPATH=str(REPO))
    with open(out, "w") as sink:
        demo = subprocess.Popen([sys.executable, "-m", "nebula_tui", "demo", "--headless", "--slurm"],
                                env=env, cwd=REPO, stdout=sink, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for(lambda: "Press Ctrl-C" in out.read_text() or demo.poll() is not None, 300,
                 interval=0.3, what="the demo to start")
        assert demo.poll() is None, out.read_text()
        assert "nebula submit --pool hpc" in out.read_text()
        config = (home / "lab" / "nodes.yaml").read_text()
        assert "pools:" in config and "kind: slurm" in config

        def pool_line() -> str:
            line = [x for x in nebula(home, "status").stdout.splitlines() if "hpc (Slurm" in x]
            return line[0] if line and "16 GPUs" in line[0] else ""

        assert re.search(r"hpc \(Slurm \d+\.\d+\.\d+, partition gpu\): 16 GPUs, 16 idle",
                         wait_for(pool_line, 60, interval=0.5, what="the pool in nebula status"))
        done = nebula(home, "submit", "--pool", "hpc", "--gpu-count", "1", "--", "sh", "-c",
                      "echo $NEBULA_JOB_ID $CUDA_VISIBLE_DEVICES")
        assert done.returncode == 0, done.stderr
        job = int(re.search(r"job (\d+)", done.stdout).group(1))
        queued = json.loads(nebula(home, "job", str(job), "--json").stdout)
        assert queued.get("pool") == "hpc"

        def ended():
            state = json.loads(nebula(home, "job", str(job), "--json").stdout)
            return state if state["state"] in ("succeeded", "failed") else None

        state = wait_for(ended, 90, interval=0.5, what="the pool job to end")
        assert state["state"] == "succeeded", state
        assert state["node"].startswith("hpc:n")
        logs = nebula(home, "logs", str(job), timeout=30)
        assert logs.stdout.split() == [str(job), "0"], logs.stdout[:300]
    finally:
        if demo.poll() is None:
            os.kill(demo.pid, signal.SIGINT)
        try:
            demo.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(demo.pid, signal.SIGKILL)
            raise
    # Ctrl-C stops the lab, its Slurm and the head: none of the home's processes is left.
    deadline = time.monotonic() + 10
    while _processes_of(home) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _processes_of(home) == []


def _processes_of(home: Path) -> list[str]:
    """Command lines of live processes that name ``home`` (daemons are told their config)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if str(home) in cmdline and state != "Z":
            found.append(cmdline)
    return found


def test_the_demo_with_slurm_says_it_needs_root(monkeypatch, capsys):
    from nebula_tui.cli.main import main

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert main(["demo", "--headless", "--slurm"]) == 1
    err = capsys.readouterr().err
    # The one sudo line: this installation's own nebula (sudo's PATH has no venv) and this
    # user's demo home (sudo's HOME is root's).
    assert err.count("\n") == 2 and "need root" in err
    line = err.splitlines()[1].split()
    assert line[0] == "sudo" and os.path.isabs(line[1]) and line[2:4] == ["demo", "--slurm"]
    assert line[4:6] == ["--home", str(Path.home() / ".nebula" / "demo")] and "--headless" in line


# ------------------------------------------------- as the user who runs it, with real sudo
DEMO_USER = "nebdemo"


@pytest.fixture
def demo_user(tmp_path_factory):
    """A Unix user allowed `sudo` (a sudoers.d line, removed after) with an installation of
    their own that they can run: this checkout's wheel in a venv of the system's Python (the
    checkout's own venv may sit where only root can enter)."""
    reason = _why_no_slurm() or (None if shutil.which("sudo") else
                                 "sudo is not installed (scripts/test-deps.sh installs it)")
    if reason:
        pytest.skip(reason)
    if not Path("/usr/bin/python3").exists():
        pytest.skip("no /usr/bin/python3 to make the user's venv with")
    from support.boxfixtures import checkout_wheel, wheelhouse

    from nebula_tui.sim.slurmlab import unlock_for_ssh

    wheel = checkout_wheel(tmp_path_factory)
    venv = Path(tempfile.mkdtemp(prefix="nebula-demo-venv-"))
    venv.chmod(0o755)
    subprocess.run(["/usr/bin/python3", "-m", "venv", str(venv)], check=True, capture_output=True)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--no-index", "--find-links",
                    str(wheelhouse(wheel)), str(wheel)], check=True, capture_output=True, timeout=300)
    subprocess.run(["useradd", "-m", "-s", "/bin/sh", DEMO_USER], check=True, capture_output=True)
    unlock_for_ssh(DEMO_USER)  # sshd refuses a locked account's key (the login node's)
    sudoers = Path(f"/etc/sudoers.d/{DEMO_USER}")
    sudoers.write_text(f"{DEMO_USER} ALL=(root) NOPASSWD: ALL\n")
    sudoers.chmod(0o440)
    try:
        yield DEMO_USER, venv / "bin" / "nebula"
    finally:
        sudoers.unlink(missing_ok=True)
        subprocess.run(["pkill", "-KILL", "-u", DEMO_USER], capture_output=True)
        wait_for(lambda: subprocess.run(["userdel", "-r", DEMO_USER], capture_output=True)
                 .returncode in (0, 6), 10, interval=0.5, what=f"{DEMO_USER} removed")
        shutil.rmtree(venv, ignore_errors=True)


def as_demo_user(user: str, text: str, **kw) -> subprocess.CompletedProcess:
    """``text`` in a shell of ``user``'s own (a login environment, as on their terminal)."""
    return subprocess.run(["runuser", "-l", user, "-c", text], capture_output=True, text=True,
                          **{"timeout": 120, **kw})


@pytest.mark.slow
def test_a_user_runs_the_sudo_line_and_submits_to_the_pool_at_once(demo_user):
    user, nebula_bin = demo_user
    said = as_demo_user(user, f"{nebula_bin} demo --headless --slurm")
    assert said.returncode == 1, said.stdout + said.stderr
    line = said.stderr.splitlines()[-1].strip()
    home = Path(f"~{user}").expanduser() / ".nebula" / "demo"
    assert line == f"sudo {nebula_bin} demo --slurm --home {home} --headless", said.stderr
    out = Path(tempfile.mkdtemp(prefix="nebula-demo-out-")) / "demo.out"
    out.parent.chmod(0o755)
    out.write_text("")
    out.chmod(0o666)  # the user's shell writes it
    demo = subprocess.Popen(["runuser", "-l", user, "-c", f"{line} > {out} 2>&1"],
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for(lambda: "Press Ctrl-C" in out.read_text() or demo.poll() is not None, 600,
                 interval=0.5, what="the demo to start")
        lab_log = home.parent / "demo" / "lab.log"
        assert demo.poll() is None, out.read_text() + (lab_log.read_text()[-3000:] if lab_log.exists() else "")
        exports = re.search(r"export (NEBULA_HOME=\S+ NEBULA_CONFIG=\S+)", out.read_text()).group(1)
        mine = f"export {exports}; {nebula_bin}"

        # At once, as themselves: the pool answers and their job runs there as them.
        def pool_ready() -> bool:
            status = as_demo_user(user, f"{mine} status")
            return status.returncode == 0 and "16 GPUs" in status.stdout
        wait_for(pool_ready, 90, interval=1, what="the pool in the user's nebula status")
        done = as_demo_user(user, f"{mine} submit --pool hpc --gpu-count 1 -- sh -c 'id -un; "
                                  "echo ran-$NEBULA_JOB_ID'")
        assert done.returncode == 0, done.stdout + done.stderr
        job = int(re.search(r"job (\d+)", done.stdout).group(1))

        def ended():
            state = json.loads(as_demo_user(user, f"{mine} job {job} --json").stdout)
            return state if state["state"] in ("succeeded", "failed", "cancelled") else None
        state = wait_for(ended, 120, interval=1, what="the pool job to end")
        assert state["state"] == "succeeded" and state["user"] == user, state
        assert state["node"].startswith("hpc:n"), state
        logs = as_demo_user(user, f"{mine} logs {job}")
        assert logs.stdout.split() == [user, f"ran-{job}"], logs.stdout + logs.stderr
    finally:
        # Ctrl-C: on a terminal it reaches the demo through sudo's pseudo-terminal (Debian's
        # sudoers says use_pty); here, without one, it is sent to the demo itself.
        for pid in _demo_pids(home):
            os.kill(pid, signal.SIGINT)
        try:
            wait_for(lambda: not _processes_of(home), 90, interval=0.5,
                     what="the demo's processes gone")
        finally:
            if demo.poll() is None:
                os.killpg(demo.pid, signal.SIGKILL)
            demo.wait(10)
            shutil.rmtree(out.parent, ignore_errors=True)
    # The home is the user's, all but what the lab's Slurm daemons wrote: they may use it
    # again without sudo, and are told the demo is gone rather than given a dead lab.
    roots = [str(p) for p in [home, *home.rglob("*")]
             if p.lstat().st_uid == 0 and (home / "lab" / "slurm") not in [p, *p.parents]]
    assert roots == [], roots
    after = as_demo_user(user, f"{mine} status")
    assert after.returncode != 0 and "the demo lab is gone" in after.stderr, after.stderr


def _demo_pids(home: Path) -> list[int]:
    """The `nebula demo` processes (not sudo's) of ``home``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [a.decode(errors="replace") for a in argv]
        if entry.name.isdigit() and "demo" in words and str(home) in words and words[0] != "sudo":
            found.append(int(entry.name))
    return found


def test_the_demo_with_slurm_checks_for_sshd_before_starting_anything(monkeypatch, capsys, tmp_path):
    """A machine without OpenSSH's sshd (the Slurm login node) is told so at once, in one
    line with the install command, instead of a lab that exits later saying "see lab.log"."""
    import shutil as shutil_module

    from nebula_tui.cli.main import main

    monkeypatch.setattr(os, "geteuid", lambda: 0)
    real_which = shutil_module.which
    monkeypatch.setattr(shutil_module, "which",
                        lambda name, *a, **kw: None if name == "sshd" else real_which(name, *a, **kw))
    home = tmp_path / "demo"
    assert main(["demo", "--headless", "--slurm", "--home", str(home)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "OpenSSH server not found" in err
    assert "apt-get install -y openssh-server" in err
    assert not (home / "lab").exists()  # nothing started


MEMBER, SHARED_GROUP = "nebdemomember", "nebdemolab"


@pytest.mark.slow
def test_the_shared_demo_runs_a_members_pool_job_as_that_member(tmp_path):
    """``sudo nebula demo --headless --slurm --shared-group G``: a lab member authorises the
    head's pool key for her own account on the login node, as `nebula pool authorize`
    says, and her ``submit --pool hpc -- id -un`` runs in Slurm as her, not as root (the
    demo's own account) nor as another member's."""
    from support.users import RUNUSER, lab_users

    from nebula_tui.sim.slurmlab import unlock_for_ssh

    reason = _why_no_slurm()
    if reason:
        pytest.skip(reason)
    public = Path(tempfile.mkdtemp(prefix="nebula-demo-shared-"))  # pytest's own is root's alone
    public.chmod(0o755)
    shutil.copytree(REPO / "nebula_tui", public / "nebula_tui", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(["chmod", "-R", "a+rX", str(public / "nebula_tui")], check=True)
    home = public / "home"
    out = tmp_path / "demo.out"

    def member(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(public), "LANG": "C.UTF-8",
               "NEBULA_SOCKET": str(home / "nebula.sock"), "NEBULA_HOME": f"/tmp/{MEMBER}-nebula"}
        return subprocess.run([RUNUSER, "-u", MEMBER, "--", "/usr/bin/python3", "-m", "nebula_tui", *args],
                              env=env, capture_output=True, text=True, timeout=timeout, cwd="/")

    demo = None
    try:
        for _ in lab_users(SHARED_GROUP, (MEMBER,), ()):
            unlock_for_ssh(MEMBER)
            env = dict(os.environ, NEBULA_HOME=str(home), PYTHONPATH=str(REPO))
            with open(out, "w") as sink:
                demo = subprocess.Popen(
                    [sys.executable, "-m", "nebula_tui", "demo", "--headless", "--slurm",
                     "--shared-group", SHARED_GROUP], env=env, cwd=REPO, stdout=sink,
                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
            wait_for(lambda: "Press Ctrl-C" in out.read_text() or demo.poll() is not None, 300,
                     interval=0.3, what="the demo to start")
            assert demo.poll() is None, out.read_text()
            view = json.loads(wait_for(lambda: (a := member("pool", "authorize", "hpc", "--json")).returncode == 0
                                       and a.stdout, 60, interval=0.5, what="the pool's key"))
            assert view["per_submitter"] and view["line"], view
            ssh = Path(f"/home/{MEMBER}/.ssh")
            ssh.mkdir(mode=0o700, exist_ok=True)
            (ssh / "authorized_keys").write_text(view["line"] + "\n")
            (ssh / "authorized_keys").chmod(0o600)
            subprocess.run(["chown", "-R", f"{MEMBER}:{MEMBER}", str(ssh)], check=True)
            done = member("submit", "--pool", "hpc", "--", "id", "-un")
            assert done.returncode == 0, done.stderr
            job = int(re.search(r"job (\d+)", done.stdout).group(1))

            def ended():
                state = json.loads(member("job", str(job), "--json").stdout)
                return state if state["state"] in ("succeeded", "failed") else None

            state = wait_for(ended, 120, interval=0.5, what="the member's pool job to end")
            assert state["state"] == "succeeded" and state["user"] == MEMBER, state
            assert state["node"].startswith("hpc:n")
            assert member("logs", str(job), timeout=30).stdout.split() == [MEMBER]
    finally:
        if demo is not None and demo.poll() is None:
            os.kill(demo.pid, signal.SIGINT)
            try:
                demo.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(demo.pid, signal.SIGKILL)
        shutil.rmtree(public, ignore_errors=True)
