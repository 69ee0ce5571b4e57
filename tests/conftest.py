"""Shared fixtures: a real simulated lab (OpenSSH sshd nodes) and a real head service.

``head`` starts ``nebula serve`` as its own process against the session's lab, with a
fresh home (SQLite store, socket) per test module, and drives it through the real CLI.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from labfixtures import asyncssh_lab, openssh_lab  # noqa: E402,F401  (fixtures)

from nebula_tui.api import ApiError, Client  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def wait_for(predicate, timeout: float = 20.0, interval: float = 0.05, what: str = "condition"):
    """Poll ``predicate`` until it returns something truthy; fail the test after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


class Head:
    """A running ``nebula serve`` and the CLI pointed at it."""

    def __init__(self, home: Path, lab):
        self.home = home
        self.lab = lab
        self.env = {**os.environ, "NEBULA_HOME": str(home), "NEBULA_CONFIG": str(lab.config_path)}
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        log = open(self.home / "serve.out", "ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "nebula_tui", "serve"], env=self.env, cwd=REPO,
            stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        wait_for(self._answers, 20, what="nebula serve to answer")
        # Every node has reported its GPUs before a test starts.
        wait_for(lambda: len(self.call("gpus")["gpus"]) == self.expected_gpus() and
                 all(n["state"] == "up" for n in self.call("status")["nodes"]), 30,
                 what="all nodes up")

    def expected_gpus(self) -> int:
        return sum(len(json.loads((self.lab.node_dir(n) / "node.json").read_text())["gpus"])
                   for n in self.lab.nodes)

    def _answers(self) -> bool:
        try:
            Client(self.home / "nebula.sock", timeout=2).close()
            return True
        except ApiError:
            return False

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()

    def call(self, op: str, **fields) -> dict:
        with Client(self.home / "nebula.sock") as client:
            return client.call(op, **fields)

    def run(self, *args: str, timeout: float = 60, check: bool = False, **kw) -> subprocess.CompletedProcess:
        """Run the real CLI (``python -m nebula_tui ARGS``) against this head."""
        done = subprocess.run([sys.executable, "-m", "nebula_tui", *args], env=self.env, cwd=REPO,
                              capture_output=True, text=True, timeout=timeout, **kw)
        if check and done.returncode != 0:
            raise AssertionError(f"nebula {' '.join(args)} exited {done.returncode}: {done.stderr}")
        return done

    def job(self, job_id: int) -> dict:
        return self.call("job", job=job_id)["job"]

    def wait_job(self, job_id: int, timeout: float = 30) -> dict:
        return wait_for(lambda: (j := self.job(job_id))["state"] in ("succeeded", "failed", "cancelled") and j,
                        timeout, what=f"job {job_id} to end")


@pytest.fixture(scope="module")
def head(openssh_lab, tmp_path_factory):
    """A fresh head service (own store and socket) on the session's OpenSSH lab."""
    h = Head(tmp_path_factory.mktemp("home"), openssh_lab)
    h.start()
    try:
        yield h
    finally:
        h.stop()
