"""`nebula logs` to a real terminal: a job's output keeps its lines and colours but cannot
retitle the terminal or draw what it did not print, in every way of reading it (whole,
`--tail`, `--rank`, followed). tmux is the terminal: its pane title is what an OSC title
sequence would change, capture-pane what the user sees."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys

import pytest

from labkit.harness import wait_for

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")

TMUX = ["tmux", "-L", f"nebula-cli-escapes-{os.getpid()}"]
# A title change (OSC 2), then a line that goes up over the one before, clears it and draws a
# fake prompt there. (A carriage return stays one: progress bars are drawn with it.)
HOSTILE = r"printf 'before\033]2;pwned-title\007after\n\033[1A\033[2Kroot@head:~# fake\n'"


def shown_in_terminal(head, *args: str) -> tuple[str, str]:
    """(what the terminal shows, its title) after `nebula ARGS` ran in it."""
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in head.env.items()
                   if k.startswith(("NEBULA_", "PYTHON", "PATH", "HOME")))
    command = f"env {env} {shlex.quote(sys.executable)} -m nebula_tui {shlex.join(args)}; echo CLI-DONE"
    subprocess.run([*TMUX, "kill-server"], capture_output=True)
    subprocess.run([*TMUX, "-f", "/dev/null", "new-session", "-d", "-s", "t", "-x", "150", "-y", "20",
                    "sh", "-c", command + "; sleep 60"], check=True)
    try:
        screen = wait_for(lambda: "CLI-DONE" in (s := subprocess.run(
            [*TMUX, "capture-pane", "-p", "-t", "t"], capture_output=True, text=True).stdout) and s,
            30, what=f"nebula {' '.join(args)} in the terminal")
        title = subprocess.run([*TMUX, "display-message", "-p", "-t", "t", "#{pane_title}"],
                               capture_output=True, text=True).stdout.strip()
        return screen, title
    finally:
        subprocess.run([*TMUX, "kill-server"], capture_output=True)


def test_a_jobs_output_cannot_retitle_the_terminal_or_fake_a_prompt(head):
    job = head.call("submit", command=[HOSTILE], shell=True)["job"]["id"]
    head.wait_job(job)
    for way in ((), ("--tail", "5"), ("--rank", "0"), ("--follow",)):
        screen, title = shown_in_terminal(head, "logs", str(job), *way)
        assert "pwned-title" not in title, way
        assert "before\\x1b]2;pwned-title\\x07after" in screen, (way, screen)
        assert "\\x1b[1A\\x1b[2Kroot@head:~# fake" in screen, (way, screen)
