"""Control of a simulated lab from outside it: faults on a node, a node going silent or
coming back (what ``nebula sim …`` does).

A lab directory holds its cluster file and ``n/<node>/``. A fault changes the node's files
the way the fault changes a real machine (kernel log lines, ``nvidia-smi`` answers; see
``faults.py``); ``node_down``/``node_up`` stop or start the node's SSH server:

* openssh labs (the tests'): the node's ``sshd`` is found by its pid file and killed with
  its sessions; ``up`` starts it again from the node's ``sshd_config``;
* asyncssh labs (``nebula demo``): one process serves every node, so ``down`` leaves a
  ``down`` flag in the node's directory, which that process follows (``lab.py``).

Imports neither asyncssh nor textual at load (the CLI imports this); ``lab.py``'s helpers
are loaded only by the calls that need them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from . import faults

#: How long ``node_down``/``node_up`` wait for the node's port to close or open.
NODE_SWITCH_TIMEOUT_S = 10.0
#: Codes whose driver message names the process that caused them (``pid=…``).
PROCESS_CODES = (13, 31, 43, 45, 94)


class SimError(Exception):
    """A lab change that cannot be done; str() is the one-line reason."""


def inject_xid(lab: Path, node: str, gpu: str, code: int, pid: int | None = None) -> list[str]:
    """An Xid error on ``node``'s GPU; the driver names a process on it for the codes that
    name one (``pid`` None: one running there). Returns the kernel lines written."""
    where = node_dir(lab, node)
    if pid is None and code in PROCESS_CODES:
        pid = process_on_gpu(where, gpu)
    return faults.inject_xid(where, gpu, code, pid)


def set_throttle(lab: Path, node: str, gpu: str, on: bool) -> None:
    """Make ``node``'s GPU run hot, idle and below its base clock (or normal again)."""
    faults.set_throttle(node_dir(lab, node), gpu, on)


def lab_dir(path: Path | None) -> Path:
    """The simulated lab a cluster file belongs to (the file's directory)."""
    if path is None:
        raise SimError("no cluster file; give the lab's with --config <lab>/nodes.yaml")
    root = path.resolve().parent
    if not (root / "n").is_dir():
        raise SimError(f"{path} is not a simulated lab's cluster file (no n/ beside it)")
    return root


def node_dir(lab: Path, node: str) -> Path:
    where = lab / "n" / node
    if not (where / "node.json").is_file():
        known = sorted(p.name for p in (lab / "n").iterdir() if (p / "node.json").is_file())
        raise SimError(f"no simulated node {node}; the lab has {', '.join(known)}")
    return where


def process_on_gpu(where: Path, gpu: str) -> int | None:
    """A process running on the node's GPU (as the driver would name it), or None."""
    from . import fake_smi

    index = faults.find_gpu(where, gpu)["index"]
    node = json.loads((where / "node.json").read_text(encoding="utf-8"))
    before = os.environ.get("NEBULA_SIM_DIR")
    os.environ["NEBULA_SIM_DIR"] = str(where)  # whose processes scan_processes counts
    try:
        found = [p["pid"] for p in fake_smi.scan_processes(node) if index in p["gpus"]]
    finally:
        if before is None:
            os.environ.pop("NEBULA_SIM_DIR", None)
        else:
            os.environ["NEBULA_SIM_DIR"] = before
    return found[0] if found else None


def _port(where: Path) -> int:
    for line in (where / "sshd_config").read_text().splitlines():
        if line.startswith("Port "):
            return int(line.split()[1])
    raise SimError(f"{where / 'sshd_config'} names no port")


def _wait_port(port: int, open_: bool, node: str) -> None:
    from .lab import port_open  # the lab module needs asyncssh: only load it here

    deadline = time.monotonic() + NODE_SWITCH_TIMEOUT_S
    while port_open(port) != open_:
        if time.monotonic() > deadline:
            raise SimError(f"{node} still {'not ' if open_ else ''}listening on port {port} "
                           f"after {NODE_SWITCH_TIMEOUT_S:.0f}s")
        time.sleep(0.05)


def _lab_process(lab: Path) -> dict | None:
    """The ``ready`` file of a running lab process (``python -m nebula_tui.sim.lab``)."""
    try:
        ready = json.loads((lab / "ready").read_text())
        os.kill(int(ready["pid"]), 0)
        return ready
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _sshd_pid(where: Path) -> int | None:
    """The node's sshd listener, when it runs (its pid file, checked against /proc)."""
    try:
        pid = int((where / "sshd.pid").read_text().split()[0])
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError, IndexError):
        return None
    return pid if str(where / "sshd_config").encode() in cmdline else None


def node_down(lab: Path, node: str) -> None:
    """The node goes silent: its SSH server and live sessions die; its jobs (tmux) stay."""
    from .lab import descendants, port_open

    where = node_dir(lab, node)
    port = _port(where)
    ready = _lab_process(lab)
    if ready and ready.get("ssh") == "asyncssh":
        (where / "down").write_text("")
    else:
        pid = _sshd_pid(where)
        if pid is None:
            if port_open(port):
                raise SimError(f"{node} listens on {port} but its sshd pid file names no live "
                               "sshd; is this an asyncssh lab without its lab process?")
            return  # down already
        # The per-connection processes (and the nodelets under them) outlive the listener.
        tree = descendants(pid)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
        for child in tree:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(child, signal.SIGKILL)
    _wait_port(port, False, node)


def node_up(lab: Path, node: str, reboot: bool = False) -> None:
    """The node answers again on the same port with the same host key; ``reboot``: as a new
    boot, its jobs gone."""
    where = node_dir(lab, node)
    port = _port(where)
    if reboot:
        _kill_tmux(where)
        faults.reboot(where)
    ready = _lab_process(lab)
    if ready and ready.get("ssh") == "asyncssh":
        (where / "down").unlink(missing_ok=True)
    elif _sshd_pid(where) is None:
        sshd = shutil.which("sshd") or shutil.which("sshd", path="/usr/sbin:/usr/local/sbin")
        if not sshd:
            raise SimError("sshd not found; install it with: apt-get install -y openssh-server")
        with open(where / "sshd.log", "ab") as log:
            # The node's environment marks the server as the lab's (the lab's stop finds it).
            subprocess.Popen([sshd, "-D", "-e", "-f", str(where / "sshd_config")],
                             stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                             start_new_session=True,
                             env={**os.environ, "NEBULA_SIM_DIR": str(where)})
    _wait_port(port, True, node)


def _kill_tmux(where: Path) -> None:
    tmux = shutil.which("tmux")
    base = where / "tmux"
    if not tmux or not base.is_dir():
        return
    env = {k: v for k, v in os.environ.items() if k != "TMUX"}
    env["TMUX_TMPDIR"] = str(base)
    for sock in base.glob("tmux-*/*"):
        subprocess.run([tmux, "-S", str(sock), "kill-server"], env=env, timeout=10,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
