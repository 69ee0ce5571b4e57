"""A `nebula` command after the demo stopped says so, instead of starting a head on the
demo's nodes.yaml, whose nodes are gone (it would take jobs that wait for ever)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

LAB_CONFIG = ("cluster: {name: simlab, probe_interval: 1}\n"
              "nodes:\n  - {name: node01, host: 127.0.0.1, port: 9}\n")


def _nebula(home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "NEBULA_HOME": str(home), "NEBULA_CONFIG": str(home / "lab" / "nodes.yaml"),
           "NEBULA_TIMEOUT": "10"}
    env.pop("NEBULA_SOCKET", None)
    return subprocess.run([sys.executable, "-m", "nebula_tui", *args], capture_output=True,
                          text=True, timeout=60, env=env)


@pytest.fixture
def demo_home(tmp_path):
    home = tmp_path / "demo"
    (home / "lab").mkdir(parents=True)
    home.chmod(0o700)
    (home / "lab" / "nodes.yaml").write_text(LAB_CONFIG)
    (home / "demo.lock").write_text("")
    yield home
    try:  # a head the command started after all (the bug) is stopped
        os.kill(int((home / "serve.lock").read_text()), signal.SIGTERM)
    except (OSError, ValueError):
        pass


@pytest.mark.parametrize("ready", ["stopped", "killed"])
def test_a_command_after_the_demo_says_the_lab_is_gone(demo_home, ready):
    if ready == "killed":  # the lab's ready file names a process that is gone
        dead = subprocess.Popen(["true"])
        dead.wait()
        (demo_home / "lab" / "ready").write_text(json.dumps({"pid": dead.pid}))
    done = _nebula(demo_home, "queue")
    assert done.returncode == 1
    assert done.stderr.strip().endswith(
        "no head is running and the demo lab is gone; start it with `nebula demo`"), done.stderr
    assert not (demo_home / "serve.lock").exists()


def test_a_running_demo_lab_is_used(demo_home):
    (demo_home / "lab" / "ready").write_text(json.dumps({"pid": os.getpid()}))
    done = _nebula(demo_home, "queue")
    assert "the demo lab is gone" not in done.stderr
