"""A head service run as its own process against a lab: for the tests and the benches.

``HeadProcess`` starts ``nebula serve`` with its own home (store, socket), waits until
every node of the lab has reported its GPUs, and drives it through the real socket API
or the real CLI.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from nebula_tui.api import ApiError, Client
from nebula_tui.remote.launcher import TMUX_SOCKET, session_name
from nebula_tui.model import FINISHED_STATES

if TYPE_CHECKING:  # the lab is imported when one is made (it is heavy)
    from nebula_tui.sim.lab import Lab

FINISHED = FINISHED_STATES


def wait_for(predicate, timeout: float = 20.0, interval: float = 0.05, what: str = "condition",
             seen=None):
    """Poll ``predicate`` until it returns something truthy; AssertionError after ``timeout``,
    with what ``seen()`` returns then (a screen, a card) when given: a failure that came
    only on another machine then says what was there instead."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    instead = ""
    if seen is not None:
        try:
            instead = f"; instead:\n{seen()}"
        except Exception as err:  # noqa: BLE001 - the timeout is the failure to report
            instead = f"; and what was there could not be read: {err!r}"
    raise AssertionError(f"timed out after {timeout}s waiting for {what}{instead}")


def libfaketime() -> str | None:
    """The path of libfaketime's library (Debian's ``libfaketime``), or None."""
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
    return found[0] if found else None


class HeadProcess:
    """A running ``nebula serve`` for ``lab`` and the CLI pointed at it.

    ``own_clock``: the service's wall clock can be stepped (``step_clock``) while every other
    process's, and its own monotonic clock, run on (libfaketime; see ``libfaketime``).
    """

    def __init__(self, home: Path, lab, config: Path | None = None, socket: Path | None = None,
                 serve_args: tuple[str, ...] = (), own_clock: bool = False):
        self.home = Path(home)
        self.home.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.lab = lab
        self.socket = Path(socket) if socket else self.home / "nebula.sock"
        self.serve_args = serve_args
        self.env = {**os.environ, "NEBULA_HOME": str(self.home),
                    "NEBULA_CONFIG": str(config or lab.config_path), "NEBULA_SOCKET": str(self.socket)}
        self.serve_env = dict(self.env)
        self.clock_file = self.home.parent / f"{self.home.name}.clock"
        if own_clock:
            library = libfaketime()
            if library is None:
                raise RuntimeError("libfaketime is not installed (apt-get install libfaketime)")
            self.clock_file.write_text("+0\n")
            # Only the realtime clock moves, as when NTP steps it; the file is read again
            # at most once a second, so a step is seen within a second.
            self.serve_env.update(LD_PRELOAD=library, FAKETIME_TIMESTAMP_FILE=str(self.clock_file),
                                  FAKETIME_CACHE_DURATION="1", FAKETIME_DONT_FAKE_MONOTONIC="1")
        self.process: subprocess.Popen | None = None

    def step_clock(self, seconds: float) -> None:
        """Step the service's wall clock to ``seconds`` from the real one (own_clock)."""
        self.clock_file.write_text(f"{seconds:+.0f}\n")

    def start(self, timeout: float = 30, wait_nodes: bool = True) -> None:
        with open(self.home / "serve.out", "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "nebula_tui", "serve", *self.serve_args], env=self.serve_env,
                stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        wait_for(self._answers, timeout, what="nebula serve to answer")
        if wait_nodes:
            wait_for(self._all_gpus_reported, timeout, what="every node to report its GPUs")

    def _answers(self) -> bool:
        try:
            Client(self.socket, timeout=2).close()
            return True
        except ApiError:
            return False

    def _all_gpus_reported(self) -> bool:
        expected = 0
        for name in self.lab.nodes:
            spec = json.loads((self.lab.node_dir(name) / "node.json").read_text())
            expected += len(spec["gpus"]) + len(spec.get("devices", []))
            if (self.lab.node_dir(name) / "lib" / "libnvidia-ml.so.1").exists():
                expected += sum(len(g.get("mig", [])) for g in spec["gpus"])  # NVML lists them
        nodes = self.call("status")["nodes"]
        return len(self.call("gpus")["gpus"]) == expected and all(n["state"] == "up" for n in nodes)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def client(self) -> Client:
        return Client(self.socket)

    def call(self, op: str, **fields) -> dict:
        with self.client() as client:
            return client.call(op, **fields)

    def run(self, *args: str, timeout: float = 60, check: bool = False, **kw) -> subprocess.CompletedProcess:
        """Run the real CLI (``python -m nebula_tui ARGS``) against this head."""
        done = subprocess.run([sys.executable, "-m", "nebula_tui", *args], env=self.env,
                              capture_output=True, text=True, timeout=timeout, **kw)
        if check and done.returncode != 0:
            raise AssertionError(f"nebula {' '.join(args)} exited {done.returncode}: {done.stderr}")
        return done

    @property
    def head_id(self) -> str:
        """The id of this head's store, which names its job directories and tmux server on
        the nodes (read from the store itself, as a node sees it in launch tokens)."""
        db = sqlite3.connect(f"file:{self.home / 'state.db'}?mode=ro", uri=True)
        try:
            return db.execute("SELECT value FROM meta WHERE key = 'head_token'").fetchone()[0]
        finally:
            db.close()

    def session(self, job: int) -> str:
        """The tmux session of this head's job ``job`` on its node."""
        return session_name(self.head_id, job)

    def tmux(self, node: str, *args: str) -> subprocess.CompletedProcess:
        """Run tmux against the jobs' tmux server on ``node`` of the lab."""
        env = {**os.environ, "TMUX_TMPDIR": str(self.lab.node_dir(node) / "tmux")}
        return subprocess.run(["tmux", "-L", TMUX_SOCKET, *args], env=env,
                              capture_output=True, text=True)

    def job(self, job_id: int) -> dict:
        return self.call("job", job=job_id)["job"]

    def wait_job(self, job_id: int, timeout: float = 30) -> dict:
        return wait_for(lambda: (j := self.job(job_id))["state"] in FINISHED and j,
                        timeout, what=f"job {job_id} to end")


@contextlib.contextmanager
def lab_with_head(layout: str = "4x4", ssh: str = "openssh",
                  probe_interval: float = 5.0) -> Iterator[tuple["Lab", HeadProcess]]:
    """A fresh lab and a head service on it, both stopped and their folder removed on exit
    (for the benches)."""
    from nebula_tui.sim.lab import Lab

    root = Path(tempfile.mkdtemp(prefix="nebula-bench-"))
    lab = Lab(root / "lab", layout=layout, ssh=ssh, probe_interval=probe_interval)
    lab.prepare()
    lab.start()
    head = HeadProcess(root / "home", lab)
    try:
        head.start()
        yield lab, head
    finally:
        head.stop()
        lab.stop()
        shutil.rmtree(root, ignore_errors=True)  # a bench's lab is its own: nothing stays
