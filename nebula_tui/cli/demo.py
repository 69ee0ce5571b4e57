"""``nebula demo``: the simulated lab, a head service on it, and the TUI (or nothing, headless).

The lab runs as its own process (in-process asyncssh servers: no root, no system sshd),
the head service as another, exactly as in production; the demo only starts and stops
them.

One demo per home, and nothing of it is lost by accident:

* the demo that started a home's lab owns it (it holds ``demo.lock``); a second ``nebula
  demo`` on the same home opens the TUI on that lab and leaves it alone when it quits;
* quitting a demo whose lab runs jobs asks whether to stop the lab with them or to leave
  it running in the background (its lab's pid stays in ``lab/pid``); the next ``nebula
  demo`` finds it, owns it again, and asks again when it quits.

Run by root for another user (``sudo nebula demo --slurm --home ~alice/.nebula/demo``:
``owner``), only the lab and its Slurm run as root; the home, the head service and the
pool's account are that user's, so they use the demo with their own ``nebula`` at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pwd
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from ..api import ApiError, Client
from ..client.service import START_TIMEOUT_S, ServiceUnavailable, start_background
from ..homedir import Home
from ..wire import NoReply

LAB_START_TIMEOUT_S = 30.0
RESTART_CHECK_S = 0.5
#: how long a service asked to stop may take before it is terminated, then killed
SHUTDOWN_GRACE_S = 10.0
#: how long a demo whose terminal closed may take to end by itself once its lab is stopped
HANGUP_EXIT_S = 5.0
DEMO_PROBE_INTERVAL_S = 2.0
#: Where a running lab's pid is kept (in the lab's directory).
LAB_PID = "pid"
#: What identifies a lab process in its command line (a pid may be reused); with ``--slurm``
#: the lab runs with a real Slurm beside it as its pool.
LAB_MODULE = "nebula_tui.sim.lab"
SLURM_LAB_MODULE = "nebula_tui.sim.slurmlab"
#: Slurm may have to be installed first (apt) before its daemons start.
SLURM_LAB_START_TIMEOUT_S = 600.0


def run_demo(home: Home, layout: str, headless: bool, shared_group: str | None = None,
             metrics: str | None = None, slurm: bool = False, owner: str | None = None) -> int:
    """``owner``: the user root runs the demo for (see the module's docstring), or None."""
    # The demo talks to its own head only: never to the box's shared one (a home without
    # a socket falls back to /run/nebula's), nor to a NEBULA_SOCKET, which it would stop.
    home = Home(home.root, home.root / "nebula.sock")
    home.ensure()
    if owner:
        hand_over(home.root, owner)
    lock = _own(home)
    if lock is None:
        return _join(home, headless)
    lab_dir = home.root / "lab"
    config = lab_dir / "nodes.yaml"
    supervisor = None
    leave_running = False
    # A closed terminal (SIGHUP) or a plain kill (SIGTERM) would end the process at once and
    # leave the lab and the service running: end it through the clean-up below instead.
    for sig in (signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, _exit_cleanly)
    lab: Lab | None = None
    try:
        lab = Lab.running(lab_dir)  # one an earlier demo left running in the background
        if lab is not None and slurm and not lab.has_slurm():
            print(f"nebula demo: the lab running for {home.root} has no Slurm pool; quit it "
                  "(stop the lab) and start `nebula demo --slurm` again", file=sys.stderr)
            return 1
        if lab is None:
            stop_service(home)  # one left by an earlier demo points at ports that are gone
            if slurm:
                print("Starting a real Slurm beside the lab (installed first when missing: "
                      "a minute or two)…", flush=True)
            lab = Lab.start(lab_dir, layout, home.root / "lab.log", slurm, owner)
        if owner:  # what the head reads: the lab's nodes.yaml, its key and known_hosts
            hand_over(home.root, owner)
        if shared_group:
            config = shared_config(config)
        supervisor = ServiceSupervisor(home, config, shared_group, metrics, owner)
        supervisor.start()
        if headless:
            return _wait_headless(home, config, lab.has_slurm())
        from ..screens.app import LEAVE_LAB, open_tui

        app = open_tui(home, str(config), demo_lab=True,
                       on_hangup=lambda: _stop_lab_now(home, lab, supervisor))
        leave_running = app.return_value == LEAVE_LAB
        if leave_running:
            print(f"The demo's lab keeps running in the background ({home.root}).\n"
                  f"`nebula demo` opens it again; quitting that one can stop it.", flush=True)
        return app.return_code or 0
    except (ServiceUnavailable, LabUnavailable) as err:
        print(f"nebula demo: {err}", file=sys.stderr)
        return 1
    finally:
        for sig in (signal.SIGHUP, signal.SIGTERM):  # the clean-up itself is not cut short
            signal.signal(sig, signal.SIG_IGN)
        if supervisor:
            supervisor.stop()
        if not leave_running:
            stop_service(home)
            if lab is not None:
                lab.stop()
        if owner:  # what root wrote in the home meanwhile (the lab's log, its last files)
            if lab is not None and not lab.alive():  # its nodes' folders: made anew each start
                shutil.rmtree(lab_dir / "n", ignore_errors=True)
            hand_over(home.root, owner)
        lock.close()  # the next demo on this home may own the lab now


def shared_config(config: Path) -> Path:
    """The lab's nodes.yaml with each job run as its owner, which a shared head needs, on
    the lab's nodes and in its Slurm pool (whose own account is the lab process's: root
    under sudo)."""
    import yaml

    data = yaml.safe_load(config.read_text())
    data.setdefault("cluster", {})["run_as"] = "submitter"
    for pool in data.get("pools") or ():  # the Slurm pool too: never the lab's own account
        pool["user"] = "submitter"
        pool.pop("identity", None)  # each member logs in with the head's pool key
    shared = config.with_name("nodes-shared.yaml")
    shared.write_text(yaml.safe_dump(data))
    return shared


def demo_owner(home: Path) -> str | None:
    """The user root runs a demo for: the one who ran sudo, when the demo's home is theirs
    (``--home`` under their home folder, as the sudo line ``nebula demo --slurm`` prints
    names it); else None (the demo is root's own)."""
    name = os.environ.get("SUDO_USER")
    if os.geteuid() != 0 or not name or name == "root":
        return None
    try:
        their = Path(pwd.getpwnam(name).pw_dir).resolve()
    except KeyError:
        return None
    return name if their != Path("/") and their in Path(home).resolve().parents else None


#: what stays root's in a demo's home run for another user: the lab's Slurm (its daemons'
#: files) and its nodes' folders (where root's jobs and tmux servers run)
ROOTS_OWN = ("lab/slurm", "lab/n")


def hand_over(root: Path, owner: str) -> None:
    """Make what root wrote under ``root`` (and the folders above it that root made, up to
    the owner's home) the owner's, but for ``ROOTS_OWN``."""
    pw = pwd.getpwnam(owner)
    their = Path(pw.pw_dir).resolve()
    ids = (pw.pw_uid, pw.pw_gid)
    for up in Path(root).resolve().parents:
        if up == their or their not in up.parents:
            break
        with contextlib.suppress(OSError):
            if up.stat().st_uid == 0:
                os.chown(up, *ids)
    keep = {Path(root).resolve() / part for part in ROOTS_OWN}
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if Path(folder, d).resolve() not in keep]
        for name in (folder, *(os.path.join(folder, f) for f in files)):
            with contextlib.suppress(OSError):  # a file the lab removed meanwhile
                if os.lstat(name).st_uid == 0:
                    os.lchown(name, *ids)


def _stop_lab_now(home: Home, lab: Lab, supervisor: ServiceSupervisor) -> None:
    """The demo's terminal closed: its service and lab stop from a thread of their own at
    once. The TUI's own exit has to write to the terminal that is gone, and Textual can stay
    stuck there; then the process ends once they are stopped."""
    def stop() -> None:
        supervisor.stop()
        stop_service(home)
        lab.stop()
        time.sleep(HANGUP_EXIT_S)  # the TUI's exit and the demo's clean-up, given a moment
        os._exit(128 + signal.SIGHUP)

    threading.Thread(target=stop, name="demo-hangup", daemon=True).start()


def _exit_cleanly(signum: int, _frame) -> None:
    raise SystemExit(128 + signum)


def _own(home: Home):
    """Become the demo that owns this home's lab: the held lock file, or None when another
    demo process holds it."""
    lock = open(home.demo_lock, "a+")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        return None
    lock.truncate(0)
    lock.write(f"{os.getpid()}\n")
    lock.flush()
    return lock


def _owner(home: Home) -> str:
    with contextlib.suppress(OSError):
        return home.demo_lock.read_text().strip() or "?"
    return "?"


def _join(home: Home, headless: bool) -> int:
    """Another demo owns this home's lab: look at it, never stop or rewrite it."""
    config = home.root / "lab" / "nodes.yaml"
    if headless:
        print(f"nebula demo: a demo already runs for {home.root} (process {_owner(home)}); "
              f"point other commands at it:\n  export NEBULA_HOME={home.root} NEBULA_CONFIG={config}",
              file=sys.stderr)
        return 1
    try:
        Client(home.socket, timeout=5).close()
    except ApiError:
        print(f"nebula demo: a demo is starting for {home.root} (process {_owner(home)}); "
              f"try again in a moment", file=sys.stderr)
        return 1
    from ..screens.app import open_tui

    return open_tui(home, str(config)).return_code or 0


class ServiceSupervisor:
    """Keeps the demo's head service up, as systemd does with ``Restart=always``.

    The service is a process of its own, as in production: killing it leaves the
    simulated nodes and their jobs running, and the restarted service re-adopts them. One
    found running (left by an earlier demo) is watched through its socket.
    """

    def __init__(self, home: Home, config: Path, shared_group: str | None,
                 metrics: str | None = None, user: str | None = None):
        self.home, self.config, self.shared_group = home, config, shared_group
        self.metrics = metrics  # HOST:PORT of the service's Prometheus metrics, or None
        self.user = user  # the account it runs as (None: this process's)
        self.restarts = 0
        self._stopping = threading.Event()
        self._process: subprocess.Popen | None = None
        self._thread = threading.Thread(target=self._watch, name="service-supervisor", daemon=True)

    def start(self) -> None:
        if not self._answers():
            self._process = start_background(self.home, self.config, self.shared_group,
                                             self.metrics, self.user)
        self._thread.start()

    def _answers(self) -> bool:
        try:
            Client(self.home.socket, timeout=2).close()
        except ApiError:
            return False
        return True

    def _alive(self) -> bool:
        if self._process is not None and self._process.poll() is None:
            return True
        # Not our child (left by an earlier demo, or started by a client that found the
        # socket silent after a crash, before we noticed): watch it through its socket.
        return self._answers()

    def _watch(self) -> None:
        while not self._stopping.wait(RESTART_CHECK_S):
            if not self._alive() and not self._stopping.is_set():
                with contextlib.suppress(ServiceUnavailable):
                    self._process = start_background(self.home, self.config,
                                                     self.shared_group, self.metrics, self.user)
                    self.restarts += 1

    def stop(self) -> None:
        """Stop watching, and wait for a restart under way: a service still starting when
        the demo stops the one that answers would otherwise outlive the demo."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(START_TIMEOUT_S + RESTART_CHECK_S)
        self._end_a_start_that_lost()

    def _end_a_start_that_lost(self) -> None:
        """A service this supervisor started that is not the one answering ends now. A
        client's won the race while ours was still starting (a restart waits for whichever
        answers); once the demo stops the one that answers, ours would take the home over
        and outlive the demo. Still starting, it has nothing to save: killed."""
        process = self._process
        if process is None or process.poll() is not None:
            return
        try:
            with Client(self.home.socket, timeout=2) as client:
                answering, _ = client.peer()
        except ApiError:
            answering = None
        if answering == process.pid:
            return  # the one answering: stopped through its socket, as any
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(10)


class LabUnavailable(Exception):
    """The simulated lab did not come up; str() says why."""


class Lab:
    """The simulated lab's process: one this demo started, or one found running."""

    def __init__(self, pid: int, lab_dir: Path, process: subprocess.Popen | None = None) -> None:
        self.pid = pid
        self.lab_dir = lab_dir
        self.process = process

    @classmethod
    def start(cls, lab_dir: Path, layout: str, log_path: Path, slurm: bool = False,
              owner: str | None = None) -> Lab:
        process = start_lab(lab_dir, layout, log_path, slurm, owner)
        (lab_dir / LAB_PID).write_text(f"{process.pid}\n")
        return cls(process.pid, lab_dir, process)

    @classmethod
    def running(cls, lab_dir: Path) -> Lab | None:
        """The lab an earlier demo of this directory left running, if it still runs."""
        try:
            pid = int((lab_dir / LAB_PID).read_text())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, ValueError):
            return None
        if not any(f"{m} " in cmdline for m in (LAB_MODULE, SLURM_LAB_MODULE)) \
                or str(lab_dir) not in cmdline:
            return None  # the pid went to another process since
        return cls(pid, lab_dir) if (lab_dir / "ready").exists() else None

    def has_slurm(self) -> bool:
        """Whether this lab runs with its Slurm pool (``--slurm``)."""
        return (self.lab_dir / "slurm" / "ready.json").exists()

    def alive(self) -> bool:
        if self.process is not None:
            return self.process.poll() is None
        return Path(f"/proc/{self.pid}").exists()

    def stop(self, timeout: float = 10.0) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        if not self.alive():
            (self.lab_dir / LAB_PID).unlink(missing_ok=True)


def start_lab(lab_dir: Path, layout: str, log_path: Path, slurm: bool = False,
              owner: str | None = None) -> subprocess.Popen:
    """``owner``: the user whose account the Slurm pool's jobs run in (None: this process's)."""
    ready = lab_dir / "ready"
    ready.unlink(missing_ok=True)
    with open(log_path, "ab") as log:
        lab = subprocess.Popen(
            [sys.executable, "-m", SLURM_LAB_MODULE if slurm else LAB_MODULE, "--dir",
             str(lab_dir), "--layout", layout, "--ssh", "asyncssh", "--probe-interval",
             str(DEMO_PROBE_INTERVAL_S), *(["--owner", owner] if slurm and owner else [])],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
        )
    timeout = SLURM_LAB_START_TIMEOUT_S if slurm else LAB_START_TIMEOUT_S
    deadline = time.monotonic() + timeout
    while not ready.exists():
        if lab.poll() is not None:
            raise LabUnavailable(f"the simulated lab exited (code {lab.returncode}); see {log_path}")
        if time.monotonic() > deadline:
            lab.terminate()  # its handler stops what it started (Slurm's daemons)
            raise LabUnavailable(f"the simulated lab did not start in {timeout:.0f}s; "
                                 f"see {log_path}")
        time.sleep(0.05)
    return lab


def stop_service(home: Home, grace_s: float = SHUTDOWN_GRACE_S) -> None:
    """Ask the home's service to stop and wait until it has; one that is still there after
    ``grace_s`` is terminated, then killed (the head recovers from a kill: nothing is lost)."""
    try:
        client = Client(home.socket, timeout=5)
    except ApiError:
        return  # nobody serves this home
    with client:
        pid, uid = client.peer()
        with contextlib.suppress(ApiError):  # one that does not answer is stopped below
            client.call("shutdown", NoReply, timeout=5)
    if uid != os.getuid() and os.geteuid() != 0:
        return  # not ours to terminate (root's demo stops the head it ran for its owner)
    for sig in (None, signal.SIGTERM, signal.SIGKILL):
        if sig is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace_s
        while _runs(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not _runs(pid):
            return


def _runs(pid: int) -> bool:
    """Whether ``pid`` is still a process that has not ended (a zombie has)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def _wait_headless(home: Home, config: Path, slurm: bool = False) -> int:
    pool = ("  nebula submit --pool hpc --gpu-count 1 -- sh -c 'echo $CUDA_VISIBLE_DEVICES'\n"
            if slurm else "")
    print(f"NebulaGrid demo: simulated lab{', its Slurm pool hpc' if slurm else ''} and head "
          f"service are up.\n"
          f"Point other commands at it from another terminal:\n\n"
          f"  export NEBULA_HOME={home.root} NEBULA_CONFIG={config}\n"
          f"  nebula status\n"
          f"  nebula submit --gpu-mem 4G -- nvidia-smi\n{pool}\n"
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
