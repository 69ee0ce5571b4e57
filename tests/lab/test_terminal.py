"""`nebula demo` in a real terminal: tmux runs it, send-keys types, capture-pane reads."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from labkit.harness import wait_for

pytestmark = pytest.mark.lab  # demos of their own

REPO = Path(__file__).resolve().parents[2]
TMUX = ["tmux", "-L", f"nebula-term-test-{os.getpid()}"]


def screen(target: str = "demo") -> str:
    done = subprocess.run(TMUX + ["capture-pane", "-p", "-t", target], capture_output=True, text=True)
    return done.stdout


def open_demo(home: Path, session: str, size: tuple[int, int] = (100, 32)) -> None:
    """``nebula demo`` on ``home`` in a new tmux session (a terminal of its own)."""
    command = (f"cd {shlex.quote(str(REPO))} && NEBULA_HOME={shlex.quote(str(home))} "
               f"{shlex.quote(sys.executable)} -m nebula_tui demo; echo DEMO-EXITED $?; sleep 60")
    first = subprocess.run(TMUX + ["has-session"], capture_output=True).returncode != 0
    subprocess.run(TMUX + ["new-session", "-d", "-s", session, "-x", str(size[0]),
                           "-y", str(size[1]), command], check=True)
    if first:  # Esc then a key must not read as Alt+key
        subprocess.run(TMUX + ["set", "-g", "escape-time", "50"], check=True)


def keys(session: str, *typed: str) -> None:
    subprocess.run(TMUX + ["send-keys", "-t", session, *typed], check=True)


@pytest.fixture
def demo_terminal(tmp_path, request):
    """``nebula demo`` in a tmux terminal of 100x32 (``indirect`` parametrising: another)."""
    home = tmp_path / "home"
    open_demo(home, "demo", getattr(request, "param", (100, 32)))
    try:
        yield home
    finally:
        subprocess.run(TMUX + ["kill-server"], capture_output=True)
        # A test that failed after leaving the lab running in the background: stop what
        # this test's demos started (their lab and service, by pid).
        for pid in _demo_processes(home):
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGTERM)


@pytest.mark.slow
def test_demo_renders_in_a_real_terminal_and_shows_a_job(demo_terminal):
    home = demo_terminal
    # Every node's cards (the nodes say they are up before their first probe is in).
    text = wait_for(lambda: "14 GPUs: 14 idle, 0 busy" in (s := screen()) and "RTX 3090" in s and s,
                    60, interval=0.3, what="the demo's overview with every card")
    assert "6/6 nodes up" in text
    assert "A100-SXM4-80GB" in text and "RTX 4060 Laptop" in text

    env = {**os.environ, "NEBULA_HOME": str(home), "NEBULA_CONFIG": str(home / "lab" / "nodes.yaml")}
    subprocess.run([sys.executable, "-m", "nebula_tui", "submit", "--name", "from-cli",
                    "--vendor", "nvidia", "--gpu-mem", "10G", "--", "sleep", "30"], env=env, check=True, cwd=REPO,
                   capture_output=True)
    wait_for(lambda: "from-cli" in (s := screen()) and "running" in s, 30, interval=0.3,
             what="the job in the queue")
    # An NVIDIA card too big for the laptop's: one of node01's first two, shown on screen.
    wait_for(lambda: re.search(r"10 GB / [\d.]+ GB", screen()), 15, interval=0.3,
             what="10 GB used on its card")

    keys("demo", "q")  # its job runs: the demo asks whether to stop the lab with it
    wait_for(lambda: "Quit the demo?" in screen(), 15, interval=0.3, what="the question")
    keys("demo", "s")
    wait_for(lambda: "DEMO-EXITED 0" in screen(), 30, interval=0.3, what="the demo to quit")
    # Stopping the demo stops its lab and service: nothing of it keeps running, and a
    # clean quit writes no traceback (the TUI's subscription was open until the end).
    assert not (home / "nebula.sock").exists()
    assert _demo_processes(home) == []
    for log in ("serve.log", "lab.log"):
        assert "Traceback" not in (home / log).read_text(), log


def flat(text: str) -> str:
    """A screen's words on one line (a wrapped line read across its break)."""
    return " ".join(text.split())


@pytest.mark.slow
@pytest.mark.parametrize("demo_terminal", [(80, 24)], indirect=True)
def test_every_screen_fits_a_real_80x24_terminal(demo_terminal):
    """The README's tour in a real 80x24 tmux: each screen shows what a newcomer looks for,
    a waiting job's reason reads whole on the Overview, the form says there is more below."""
    home = demo_terminal
    text = wait_for(lambda: "14 GPUs: 14 idle" in (s := screen()) and s, 60, interval=0.3,
                    what="the overview with every card")
    assert "waiting" in text and "6/6 nodes up" in text and "Events" not in text.splitlines()[-2]
    first = cli(home, "submit", "--name", "wide", "--vendor", "nvidia", "--gpu-count", "4", "--", "sleep", "120")
    waits = cli(home, "submit", "--name", "waits", "--vendor", "nvidia", "--gpu-count", "4", "--", "sleep", "5")
    job = waits.stdout.split()[2]
    reason = wait_for(lambda: json.loads(cli(home, "job", job, "--json").stdout)["reason"], 30,
                      interval=0.5, what=f"job {job}'s reason ({first.stdout} {waits.stdout})")
    wait_for(lambda: "waits" in screen(), 30, interval=0.3, what="the waiting job in the queue")
    for _ in range(3):  # the cursor to the waiting job (running first)
        if flat(reason) in flat(screen()):
            break
        keys("demo", "Down")
        time.sleep(0.5)
    wait_for(lambda: flat(reason) in flat(screen()), 10, interval=0.3,
             what=f"the whole reason {reason!r} on the Overview")
    for key, words in (("2", ["node06:1", "Held by", "Status"]), ("3", ["waits", "pending", "Pos"]),
                       ("4", ["GPU-hours", "root"]), ("5", ["node06", "Events log"])):
        time.sleep(0.5)
        keys("demo", key)
        wait_for(lambda: all(w in screen() for w in words), 15, interval=0.3,
                 what=f"screen {key} with {words}")
    keys("demo", "1")
    keys("demo", "n")
    wait_for(lambda: "more below" in screen() and "Command" in screen(), 15, interval=0.3,
             what="the submit form's cue")
    keys("demo", "Escape")
    wait_for(lambda: "Submit a job" not in screen(), 15, interval=0.3, what="the form closed")
    keys("demo", "q")
    wait_for(lambda: "Quit the demo?" in screen(), 15, interval=0.3, what="the question")
    keys("demo", "s")
    wait_for(lambda: "DEMO-EXITED 0" in screen(), 30, interval=0.3, what="the demo to quit")


def cli(home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "NEBULA_HOME": str(home), "NEBULA_CONFIG": str(home / "lab" / "nodes.yaml")}
    return subprocess.run([sys.executable, "-m", "nebula_tui", *args], env=env, cwd=REPO,
                          capture_output=True, text=True)


@pytest.mark.slow
def test_a_second_demo_opens_the_running_one(demo_terminal):
    """A second `nebula demo` on the same home shows the running lab instead of stopping
    its service and rewriting it; quitting it leaves the first one as it was."""
    home = demo_terminal
    wait_for(lambda: "node03" in screen(), 60, interval=0.3, what="the first demo's overview")
    job = cli(home, "submit", "--name", "keep-me", "--gpu-mem", "4G", "--", "sleep", "120").stdout.split()[2]
    wait_for(lambda: "keep-me" in screen(), 30, interval=0.3, what="the job in the first demo")
    before = sorted(_demo_processes(home))
    open_demo(home, "second")
    text = wait_for(lambda: "keep-me" in (s := screen("second")) and s, 60, interval=0.3,
                    what="the second demo showing the first one's job")
    assert "6/6 nodes up" in text
    assert sorted(_demo_processes(home)) == before  # nothing restarted, nothing rewritten
    keys("second", "q")  # it does not own the lab: it quits without a question
    wait_for(lambda: "DEMO-EXITED 0" in screen("second"), 30, interval=0.3, what="the second to quit")
    assert sorted(_demo_processes(home)) == before
    assert '"running"' in cli(home, "job", job, "--json").stdout
    assert "already runs" not in (home / "serve.log").read_text()  # no two supervisors
    assert "keep-me" in screen()
    keys("demo", "q")
    wait_for(lambda: "Quit the demo?" in screen(), 15, interval=0.3, what="the owner asks")
    keys("demo", "s")
    wait_for(lambda: "DEMO-EXITED 0" in screen(), 30, interval=0.3, what="the demo to quit")
    wait_for(lambda: not _demo_processes(home), 30, interval=0.3, what="lab and service stopped")


@pytest.mark.slow
def test_quitting_with_running_jobs_asks_and_can_leave_the_lab_running(demo_terminal):
    """q with jobs running asks: stay, leave the lab running in the background (the next
    `nebula demo` opens it again, jobs and all), or stop it and its jobs."""
    home = demo_terminal
    wait_for(lambda: "node03" in screen(), 60, interval=0.3, what="the demo's overview")
    job = cli(home, "submit", "--name", "long-run", "--gpu-mem", "4G", "--", "sleep", "300").stdout.split()[2]
    wait_for(lambda: "long-run" in screen() and "1 running" in screen(), 30, interval=0.3,
             what="the job running")
    keys("demo", "q")
    text = wait_for(lambda: "Quit the demo?" in (s := screen()) and s, 15, interval=0.3,
                    what="the question")
    assert "long-run" in text and "of " in text  # the job, named with its owner
    keys("demo", "c")  # stay
    wait_for(lambda: "Quit the demo?" not in screen(), 15, interval=0.3, what="the question gone")
    assert "DEMO-EXITED" not in screen()
    keys("demo", "q")
    wait_for(lambda: "Quit the demo?" in screen(), 15, interval=0.3, what="asked again")
    keys("demo", "l")  # leave it running
    wait_for(lambda: "DEMO-EXITED 0" in screen(), 30, interval=0.3, what="the TUI to quit")
    assert "keeps running in the background" in screen()
    assert _demo_processes(home) and (home / "nebula.sock").exists()
    assert '"running"' in cli(home, "job", job, "--json").stdout

    open_demo(home, "again")  # the lab left running is found, owned, and shown
    wait_for(lambda: "long-run" in screen("again"), 60, interval=0.3, what="the job again")
    keys("again", "q")
    wait_for(lambda: "Quit the demo?" in screen("again"), 15, interval=0.3, what="the owner asks")
    keys("again", "s")  # stop the lab and its jobs
    wait_for(lambda: "DEMO-EXITED 0" in screen("again"), 30, interval=0.3, what="the demo to quit")
    wait_for(lambda: not _demo_processes(home), 30, interval=0.3, what="lab and service stopped")
    assert not (home / "nebula.sock").exists()


def _log_tail(path: Path, lines: int = 15) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return f"({path.name} unreadable)"


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
    wait_for(lambda: not _demo_processes(home), 60, interval=0.3,
             what="the demo's lab and service to stop")


@pytest.mark.slow
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
    keys("demo", "3")
    wait_for(lambda: "to-attach" in (s := screen()) and "running" in s, 30, interval=0.3,
             what="the job running in the queue")
    keys("demo", "Enter")
    wait_for(lambda: f"Job {job}" in screen(), 15, interval=0.3, what="the job screen")
    keys("demo", "a")
    # tmux's own status line ("[nebula-N-…", the session's name cut at 10 characters) and
    # the job's output, without the TUI's frame (the TUI's log tail shows the output too,
    # so the mark alone proves nothing)
    text = wait_for(lambda: f"[nebula-{job}" in (s := screen()) and "NebulaGrid" not in s and s,
                    30, interval=0.3, what="the job's tmux session instead of the TUI",
                    seen=lambda: f"{screen()}\nserve.log ends:\n{_log_tail(home / 'serve.log')}")
    assert "TUI-ATTACH-MARK" in text
    keys("demo", "C-b", "d")
    wait_for(lambda: f"Job {job}" in screen(), 20, interval=0.3, what="the TUI back")
    keys("demo", "q")
    wait_for(lambda: "Quit the demo?" in screen(), 15, interval=0.3, what="the question")
    keys("demo", "s")
    wait_for(lambda: "DEMO-EXITED 0" in screen(), 30, interval=0.3, what="the demo to quit")


@pytest.mark.slow
def test_headless_demo_serves_other_commands_until_interrupted(headless_demo):
    home, _, run = headless_demo
    # The service is a process of its own: kill it, and the demo restarts it (as systemd
    # would); the job it had launched keeps running and is re-adopted.
    job = run("submit", "--gpu-mem", "4G", "--", "sleep", "4").stdout.split()[2]
    wait_for(lambda: '"running"' in run("job", job, "--json").stdout, 20, interval=0.3, what="job running")
    old = subprocess.run(["pgrep", "-f", f"serve --home {home}"], capture_output=True, text=True).stdout.split()
    assert len(old) == 1
    os.kill(int(old[0]), 9)
    wait_for(lambda: (new := subprocess.run(["pgrep", "-f", f"serve --home {home}"], capture_output=True,
                                           text=True).stdout.split()) and new != old, 30,
             interval=0.3, what="the service restarted")
    wait_for(lambda: '"succeeded"' in run("job", job, "--json").stdout, 30, interval=0.3,
             what="the job finished under the new service")


@pytest.mark.slow
def test_a_service_a_client_restarted_after_a_kill_is_watched_not_fought(headless_demo):
    """Killed, the service may be started again by the next client before the demo's
    supervisor looks: the supervisor then watches that one rather than starting others
    beside it, and Ctrl-C still stops it (the fixture checks no socket is left)."""
    home, _, run = headless_demo
    old = subprocess.run(["pgrep", "-f", f"serve --home {home}"], capture_output=True, text=True).stdout.split()
    demo = int(Path(f"/proc/{old[0]}/stat").read_text().rpartition(")")[2].split()[1])  # its parent
    os.kill(demo, signal.SIGSTOP)  # the supervisor cannot look until this client has acted
    try:
        os.kill(int(old[0]), 9)
        assert "GPUs: 14" in run("status").stdout  # this client starts the service itself
    finally:
        os.kill(demo, signal.SIGCONT)
    time.sleep(3)  # six of the supervisor's looks
    log = (home / "serve.log").read_text()
    assert "another head service answers" not in log, log[-2000:]


@pytest.mark.slow
def test_attach_opens_the_jobs_session_in_a_real_terminal(headless_demo):
    """`nebula attach JOB` in a terminal: the job's own tmux session with its output;
    detaching (C-b d) returns to the shell and leaves the job running."""
    _, client_env, run = headless_demo
    job = run("submit", "--gpu-mem", "4G", "--command", "echo ATTACH-MARK-$NEBULA_JOB_ID; sleep 120").stdout.split()[2]
    wait_for(lambda: '"running"' in run("job", job, "--json").stdout, 20, interval=0.3, what="job running")
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
        assert '"running"' in run("job", job, "--json").stdout
    finally:
        subprocess.run(TMUX + ["kill-server"], capture_output=True)
        run("cancel", job)
