"""`nebula demo` in a real terminal: tmux runs it, send-keys types, capture-pane reads."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import wait_for

REPO = Path(__file__).resolve().parent.parent
TMUX = ["tmux", "-L", f"nebula-term-test-{os.getpid()}"]


def screen(target: str = "demo") -> str:
    done = subprocess.run(TMUX + ["capture-pane", "-p", "-t", target], capture_output=True, text=True)
    return done.stdout


@pytest.fixture
def demo_terminal(tmp_path):
    home = tmp_path / "home"
    command = (f"cd {shlex.quote(str(REPO))} && NEBULA_HOME={shlex.quote(str(home))} "
               f"{shlex.quote(sys.executable)} -m nebula_tui demo; echo DEMO-EXITED $?; sleep 60")
    subprocess.run(TMUX + ["new-session", "-d", "-s", "demo", "-x", "100", "-y", "32", command],
                   check=True)
    try:
        yield home
    finally:
        subprocess.run(TMUX + ["kill-server"], capture_output=True)


def test_demo_renders_in_a_real_terminal_and_shows_a_job(demo_terminal):
    home = demo_terminal
    text = wait_for(lambda: "node03" in (s := screen()) and "RTX 3090" in s and s, 60,
                    interval=0.3, what="the demo's overview")
    assert "Cluster Overview:" in text and "GPUs: 9 (9 idle, 0 busy, 0 maintenance)" in text
    assert "A100-SXM4-80GB" in text and "RTX 4060 Laptop" in text

    env = {**os.environ, "NEBULA_HOME": str(home), "NEBULA_CONFIG": str(home / "lab" / "nodes.yaml")}
    subprocess.run([sys.executable, "-m", "nebula_tui", "submit", "--name", "from-cli",
                    "--gpu-mem", "6G", "--", "sleep", "30"], env=env, check=True, cwd=REPO,
                   capture_output=True)
    wait_for(lambda: "from-cli" in (s := screen()) and "running" in s, 30, interval=0.3,
             what="the job in the queue")
    wait_for(lambda: re.search(r"6 GB / [\d.]+ GB", screen()), 15, interval=0.3, what="6 GB used on its card")

    subprocess.run(TMUX + ["send-keys", "-t", "demo", "q"], check=True)
    wait_for(lambda: "DEMO-EXITED 0" in screen(), 30, interval=0.3, what="the demo to quit")
    # Quitting the demo stops its lab and service: nothing of it keeps running.
    assert not (home / "nebula.sock").exists()
    assert _demo_processes(home) == []


def _demo_processes(home: Path) -> list[str]:
    found = []
    for pattern in (f"sim.lab --dir {home}", f"serve --home {home}"):
        found += subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split()
    return found


def test_closing_the_terminal_stops_the_demos_lab_and_service(demo_terminal):
    """The terminal goes away (tmux killed: SIGHUP) while the demo runs: its lab and its
    service stop with it rather than running on unseen."""
    home = demo_terminal
    wait_for(lambda: "node03" in screen(), 60, interval=0.3, what="the demo's overview")
    assert _demo_processes(home)
    subprocess.run(TMUX + ["kill-server"], check=True)
    wait_for(lambda: not _demo_processes(home), 30, interval=0.3,
             what="the demo's lab and service to stop")


def test_tui_attach_suspends_the_tui_for_the_jobs_session(demo_terminal):
    """Job screen, `a`: the TUI steps aside for the job's tmux session; detaching (C-b d)
    brings the TUI back where it was."""
    home = demo_terminal
    wait_for(lambda: "node03" in screen(), 60, interval=0.3, what="the demo's overview")
    env = {**os.environ, "NEBULA_HOME": str(home), "NEBULA_CONFIG": str(home / "lab" / "nodes.yaml")}
    done = subprocess.run([sys.executable, "-m", "nebula_tui", "submit", "--name", "to-attach",
                           "--gpu-mem", "4G", "--command", "echo TUI-ATTACH-MARK; sleep 120"],
                          env=env, check=True, cwd=REPO, capture_output=True, text=True)
    job = done.stdout.split()[2]
    keys = lambda *k: subprocess.run(TMUX + ["send-keys", "-t", "demo", *k], check=True)  # noqa: E731
    keys("3")
    wait_for(lambda: "to-attach" in (s := screen()) and "running" in s, 30, interval=0.3,
             what="the job running in the queue")
    keys("Enter")
    wait_for(lambda: f"Job {job}" in screen(), 15, interval=0.3, what="the job screen")
    keys("a")
    # tmux's own status line ("[nebula-N-…", the session's name cut at 10 characters) and
    # the job's output, without the TUI's frame (the TUI's log tail shows the output too,
    # so the mark alone proves nothing)
    text = wait_for(lambda: f"[nebula-{job}" in (s := screen()) and "NebulaGrid" not in s and s,
                    30, interval=0.3, what="the job's tmux session instead of the TUI")
    assert "TUI-ATTACH-MARK" in text
    keys("C-b", "d")
    wait_for(lambda: f"Job {job}" in screen(), 20, interval=0.3, what="the TUI back")
    keys("q")
    wait_for(lambda: "DEMO-EXITED 0" in screen(), 30, interval=0.3, what="the demo to quit")


@pytest.fixture
def headless_demo(tmp_path):
    """`nebula demo --headless` running; yields (home, run) where ``run(*args)`` runs the
    CLI with the environment the demo printed. Interrupted (Ctrl-C) at the end."""
    home = tmp_path / "home"
    env = {**os.environ, "NEBULA_HOME": str(home)}
    demo = subprocess.Popen([sys.executable, "-m", "nebula_tui", "demo", "--headless"], env=env,
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        while not any(line.strip().startswith("export NEBULA_HOME=") for line in lines):
            line = demo.stdout.readline()
            assert line, f"demo ended early: {demo.stderr.read()}"
            lines.append(line)
        export = next(l for l in lines if l.strip().startswith("export "))
        client_env = {**os.environ, **dict(kv.split("=", 1) for kv in export.split()[1:])}
        run = lambda *a: subprocess.run([sys.executable, "-m", "nebula_tui", *a],  # noqa: E731
                                        env=client_env, capture_output=True, text=True)
        wait_for(lambda: "GPUs: 9 (9 idle" in run("status").stdout, 30, interval=0.3,
                 what="the lab's GPUs")
        yield home, client_env, run
    finally:
        demo.send_signal(2)  # Ctrl-C
        assert demo.wait(30) == 0
    assert not (home / "nebula.sock").exists()


def test_headless_demo_serves_other_commands_until_interrupted(headless_demo):
    home, _, run = headless_demo
    # The service is a process of its own: kill it, and the demo restarts it (as systemd
    # would); the job it had launched keeps running and is re-adopted.
    job = run("submit", "--gpu-mem", "4G", "--", "sleep", "4").stdout.split()[2]
    wait_for(lambda: '"running"' in run("job", job).stdout, 20, interval=0.3, what="job running")
    old = subprocess.run(["pgrep", "-f", f"serve --home {home}"], capture_output=True, text=True).stdout.split()
    assert len(old) == 1
    os.kill(int(old[0]), 9)
    wait_for(lambda: (new := subprocess.run(["pgrep", "-f", f"serve --home {home}"], capture_output=True,
                                           text=True).stdout.split()) and new != old, 30,
             interval=0.3, what="the service restarted")
    wait_for(lambda: '"succeeded"' in run("job", job).stdout, 30, interval=0.3,
             what="the job finished under the new service")


def test_attach_opens_the_jobs_session_in_a_real_terminal(headless_demo):
    """`nebula attach JOB` in a terminal: the job's own tmux session with its output;
    detaching (C-b d) returns to the shell and leaves the job running."""
    _, client_env, run = headless_demo
    job = run("submit", "--gpu-mem", "4G", "--command", "echo ATTACH-MARK-$NEBULA_JOB_ID; sleep 120").stdout.split()[2]
    wait_for(lambda: '"running"' in run("job", job).stdout, 20, interval=0.3, what="job running")
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in client_env.items() if k.startswith("NEBULA_"))
    command = (f"cd {shlex.quote(str(REPO))} && env {exports} {shlex.quote(sys.executable)} "
               f"-m nebula_tui attach {job}; echo ATTACH-EXITED $?; sleep 60")
    subprocess.run(TMUX + ["new-session", "-d", "-s", "attach", "-x", "100", "-y", "30", command],
                   check=True)
    try:
        text = wait_for(lambda: f"ATTACH-MARK-{job}" in (s := screen("attach")) and s, 30,
                        interval=0.3, what="the job's session")
        assert f"nebula-{job}" in text  # the inner tmux's status line names the session
        subprocess.run(TMUX + ["send-keys", "-t", "attach", "C-b", "d"], check=True)
        wait_for(lambda: "ATTACH-EXITED 0" in screen("attach"), 20, interval=0.3,
                 what="attach to return after detaching")
        assert '"running"' in run("job", job).stdout
    finally:
        subprocess.run(TMUX + ["kill-server"], capture_output=True)
        run("cancel", job)
