"""A nodelet alone, as the head ships it (``nodelet_source``), run as a local process on a
node directory of the test's own: the fixture ``nodelet`` starts one per head name and
asks it requests as the head would, line by line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from nebula_tui.remote.ssh import nodelet_source


@pytest.fixture
def nodelet(tmp_path):
    """Start nodelets for heads on one node directory; each is (process, ask)."""
    env = dict(os.environ, NEBULA_NODE_DIR=str(tmp_path / "node"), TMUX_TMPDIR=str(tmp_path))
    script = tmp_path / "nodelet.py"  # what the head ships to a node
    script.write_bytes(nodelet_source())
    started = []

    def start(head: str, **settings):
        proc = subprocess.Popen([sys.executable, "-S", str(script), json.dumps(
            {"interval": 60, "head": head, **settings})], env=env, text=True, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        started.append((proc, head))
        assert json.loads(proc.stdout.readline())["type"] == "hello"
        ids = iter(range(1, 10**6))

        def ask(op: str, **fields) -> dict:
            request_id = next(ids)
            proc.stdin.write(json.dumps({"id": request_id, "op": op, **fields}) + "\n")
            proc.stdin.flush()
            while True:
                message = json.loads(proc.stdout.readline())
                if message.get("type") == "reply" and message.get("id") == request_id:
                    return message
        return ask

    yield start
    for proc, head in started:
        proc.stdin.close()
        proc.wait(timeout=10)
        subprocess.run(["tmux", "-L", "nebula", "kill-server"], env=env, capture_output=True)
