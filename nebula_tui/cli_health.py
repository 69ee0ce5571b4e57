"""The simulated lab's fault injection (``nebula sim …``).

cli.py owns the parser; it hands its top-level sub-parsers to :func:`add_sim_commands`
and dispatches ``sim`` to :func:`cmd_sim`.

``nebula sim`` works on the lab whose cluster file it is given (``--config``,
``$NEBULA_CONFIG``, as every command): the lab directory holds that file and ``n/<node>/``.
It changes the node's files the way the fault changes a real machine (kernel log lines,
``nvidia-smi`` answers; see ``sim/faults.py``) and stops or starts the node's SSH server:

* openssh labs (the tests'): the node's ``sshd`` is found by its pid file and killed with
  its sessions; ``up`` starts it again from the node's ``sshd_config``;
* asyncssh labs (``nebula demo``): one process serves every node, so ``down`` leaves a
  ``down`` flag in the node's directory, which that process follows (``sim/lab.py``).

Like the rest of the CLI this imports neither asyncssh nor textual.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

#: How long ``sim node down|up`` waits for the node's port to close or open.
NODE_SWITCH_TIMEOUT_S = 10.0
#: Codes whose driver message names the process that caused them (``pid=…``).
_PROCESS_CODES = (13, 31, 43, 45, 94)


class SimError(Exception):
    """A sim command that cannot be done; str() is the one-line reason."""


# ----------------------------------------------------------------------------- parsers
def _code(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"'{text}' is not an Xid code (a number such as 79)")
    return int(text)


def add_sim_commands(sub, command) -> None:
    """``nebula sim inject|node|throttle`` (``command`` is cli.py's sub-parser factory)."""
    p = command("sim", "faults for the simulated lab: Xid errors, silent nodes, throttling")
    sim_sub = p.add_subparsers(dest="sim_command", required=True, parser_class=type(p))
    inject = sim_sub.add_parser("inject", help="log a fault on a simulated node")
    inject_sub = inject.add_subparsers(dest="fault", required=True, parser_class=type(p))
    p = inject_sub.add_parser("xid", help="the kernel lines of an Xid error, and its effect")
    p.add_argument("code", type=_code)
    p.add_argument("--node", required=True)
    p.add_argument("--gpu", required=True, help="index or uuid on that node")
    p.add_argument("--pid", type=int, default=None,
                   help="the process the driver names (default for 13/31/43/94: one on that GPU)")
    p = sim_sub.add_parser("node", help="make a node go silent, or come back")
    p.add_argument("action", choices=("down", "up"))
    p.add_argument("node")
    p.add_argument("--reboot", action="store_true",
                   help="with up: it comes back as a new boot (new boot id, empty kernel log, "
                        "its jobs gone, GPU faults cleared)")
    p = sim_sub.add_parser("throttle", help="make a GPU run hot, idle and below its base clock")
    p.add_argument("node")
    p.add_argument("gpu", help="index or uuid on that node")
    p.add_argument("--off", action="store_true", help="end the throttling")


# ---------------------------------------------------------------------------- commands
def cmd_sim(args, home, config) -> int:
    try:
        lab = lab_dir(config, home.root)
        if args.sim_command == "inject":
            return _inject_xid(lab, args)
        if args.sim_command == "throttle":
            from .sim import faults

            faults.set_throttle(node_dir(lab, args.node), args.gpu, not args.off)
            print(f"{args.node}:{args.gpu} " + ("runs normally again" if args.off else
                  f"throttles: {faults.THROTTLE_TEMP_C} °C, {faults.THROTTLE_UTIL_PCT:g} % busy, "
                  "SM clock below base"))
            return 0
        if args.action == "down":
            node_down(lab, args.node)
            print(f"{args.node} is silent: its SSH server is stopped, its jobs keep running")
        else:
            node_up(lab, args.node, reboot=args.reboot)
            print(f"{args.node} answers again" + (" (rebooted)" if args.reboot else ""))
        return 0
    except (SimError, ValueError) as err:
        print(f"nebula sim: {err}", file=sys.stderr)
        return 1


def _inject_xid(lab: Path, args) -> int:
    from .sim import faults

    where = node_dir(lab, args.node)
    pid = args.pid
    if pid is None and args.code in _PROCESS_CODES:
        pid = process_on_gpu(where, args.gpu)
    lines = faults.inject_xid(where, args.gpu, args.code, pid)
    print("\n".join(lines))
    return 0


# ------------------------------------------------------------------------------ the lab
def lab_dir(config: str | None, home: Path) -> Path:
    """The simulated lab the cluster file belongs to (the file's directory)."""
    from .config import find_config

    path = find_config(config, home)
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
    from .sim import fake_smi, faults

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
    from .sim.lab import port_open  # the lab module needs asyncssh: only load it here
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
    from .sim.lab import descendants, port_open

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
        from .sim import faults

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
