"""``nebula demo``: the simulated lab, a head service on it, and the TUI (or nothing, headless).

The lab runs as its own process (in-process asyncssh servers: no root, no system sshd),
the head service as another, exactly as in production; the demo only starts and stops
them.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from .api import ApiError, Client
from .service import Home, ServiceUnavailable, start_background

LAB_START_TIMEOUT_S = 30.0
RESTART_CHECK_S = 0.5
DEMO_PROBE_INTERVAL_S = 2.0


def run_demo(home: Home, layout: str, headless: bool, shared_group: str | None = None,
             metrics: str | None = None) -> int:
    home.ensure()
    lab_dir = home.root / "lab"
    stop_service(home)  # one left by an earlier demo points at ports that are gone
    lab = start_lab(lab_dir, layout, home.root / "lab.log")
    supervisor = None
    # A closed terminal (SIGHUP) or a plain kill (SIGTERM) would end the process at once and
    # leave the lab and the service running: end it through the clean-up below instead.
    for sig in (signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, _exit_cleanly)
    try:
        config = lab_dir / "nodes.yaml"
        supervisor = ServiceSupervisor(home, config, shared_group, metrics)
        supervisor.start()
        if headless:
            return _wait_headless(home, config)
        from .screens.app import run_tui

        return run_tui(home, str(config))
    except (ServiceUnavailable, LabUnavailable) as err:
        print(f"nebula demo: {err}", file=sys.stderr)
        return 1
    finally:
        if supervisor:
            supervisor.stop()
        stop_service(home)
        lab.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            lab.wait(10)


def _exit_cleanly(signum: int, _frame) -> None:
    raise SystemExit(128 + signum)


class ServiceSupervisor:
    """Keeps the demo's head service up, as systemd does with ``Restart=always``.

    The service is a process of its own, as in production: killing it leaves the
    simulated nodes and their jobs running, and the restarted service re-adopts them.
    """

    def __init__(self, home: Home, config: Path, shared_group: str | None,
                 metrics: str | None = None):
        self.home, self.config, self.shared_group = home, config, shared_group
        self.metrics = metrics  # HOST:PORT of the service's Prometheus metrics, or None
        self.restarts = 0
        self._stopping = threading.Event()
        self._process: subprocess.Popen | None = None
        self._thread = threading.Thread(target=self._watch, name="service-supervisor", daemon=True)

    def start(self) -> None:
        self._process = start_background(self.home, self.config, self.shared_group, self.metrics)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stopping.wait(RESTART_CHECK_S):
            if self._process is not None and self._process.poll() is not None:
                with contextlib.suppress(ServiceUnavailable):
                    self._process = start_background(self.home, self.config, self.shared_group, self.metrics)
                    self.restarts += 1

    def stop(self) -> None:
        self._stopping.set()


class LabUnavailable(Exception):
    """The simulated lab did not come up; str() says why."""


def start_lab(lab_dir: Path, layout: str, log_path: Path) -> subprocess.Popen:
    ready = lab_dir / "ready"
    ready.unlink(missing_ok=True)
    with open(log_path, "ab") as log:
        lab = subprocess.Popen(
            [sys.executable, "-m", "nebula_tui.sim.lab", "--dir", str(lab_dir), "--layout", layout,
             "--ssh", "asyncssh", "--probe-interval", str(DEMO_PROBE_INTERVAL_S)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
        )
    deadline = time.monotonic() + LAB_START_TIMEOUT_S
    while not ready.exists():
        if lab.poll() is not None:
            raise LabUnavailable(f"the simulated lab exited (code {lab.returncode}); see {log_path}")
        if time.monotonic() > deadline:
            lab.kill()
            raise LabUnavailable(f"the simulated lab did not start in {LAB_START_TIMEOUT_S:.0f}s")
        time.sleep(0.05)
    return lab


def stop_service(home: Home) -> None:
    """Ask the home's service to stop, and wait until its socket is gone."""
    try:
        with Client(home.socket, timeout=5) as client:
            client.call("shutdown")
    except ApiError:
        return
    deadline = time.monotonic() + 10
    while home.socket.exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def _wait_headless(home: Home, config: Path) -> int:
    print(f"NebulaGrid demo: simulated lab and head service are up.\n"
          f"Point other commands at it from another terminal:\n\n"
          f"  export NEBULA_HOME={home.root} NEBULA_CONFIG={config}\n"
          f"  nebula status\n"
          f"  nebula submit --gpu-mem 4G -- nvidia-smi\n\n"
          f"Press Ctrl-C to stop the lab.", flush=True)
    stopped = False

    def stop(*_):
        nonlocal stopped
        stopped = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while not stopped:
        time.sleep(0.2)
    return 0
