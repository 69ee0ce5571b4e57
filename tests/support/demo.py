"""``nebula demo --headless`` as a fixture: the demo running in the background, and the CLI
run with the environment the demo printed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from labkit.harness import wait_for

REPO = Path(__file__).resolve().parents[2]


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
        wait_for(lambda: "GPUs: 14 (14 idle" in run("status").stdout, 30, interval=0.3,
                 what="the lab's GPUs")
        yield home, client_env, run
    finally:
        demo.send_signal(2)  # Ctrl-C
        assert demo.wait(30) == 0
    assert not (home / "nebula.sock").exists()
