"""The node side of NebulaGrid: sent over SSH stdin, run by the node's python3, never installed.

The head starts one of these per node over its persistent SSH connection and keeps it
running. It speaks JSON lines both ways (stdlib only, Python 3.6+); the head reads each
line it sends once, into the typed messages of ``remote/protocol.py``:

node -> head
  {"type": "hello", ...}                       once: host facts, the hardware's backends,
                                               devices, driver/CUDA versions and links,
                                               container runtimes and conda tools
  {"type": "probe", "t", "devices", "processes", "problems", "clamped", "pid_jobs",
   "pid_users", "error"}                       every interval (R15): one vendor-neutral
                                               reading per device (node/hardware.py);
                                               pid_users: the Unix owner of each GPU
                                               process that is no job of ours
  {"type": "started", "job", "t", "workdir"}   a job's checks passed; where its command runs
  {"type": "exit", "job", "code", "t", "reason"}  a job ended (code null: it vanished;
                                               reason: why it could not start, if so)
  {"type": "phase", "job", "text", "t"}        what a job does before its command ("" done)
  {"type": "kmsg", "lines", "pid_jobs", "t"}  kernel log lines logged since the last probe
  {"type": "reply", "id", "ok", ...}           the answer to one request
head -> node
  {"id", "op": "launch", "job", "token", "script"}  write the job's run.sh, start its tmux session
  {"id", "op": "cancel", "job", "grace"}       SIGTERM the job's processes, kill the session after grace
  {"id", "op": "ack", "jobs"}                  the head recorded these exits; stop reporting them
  {"id", "op": "log", "job", "offset", "limit"}  read part of the job's output log (and its size)
  {"id", "op": "list"}                         every job directory and tmux session (reconcile)
  {"id", "op": "signal", "job", "signal", "once"}  USR1/TERM to the job's processes; KILL: its
                                               session; "once": no USR1 if this attempt had one
  {"id", "op": "note", "job", "text"}          append one line of the head's to the job's log
  {"id", "op": "selftest", "gpu", "command"}   GPU self-test; the reply's "result" is what
                                               scheduler.health.judge_selftest reads (R17)
  {"id", "op": "reset", "gpu"}                 nvidia-smi -r -i UUID; "reset" true when it worked

No user string is ever given to a shell here: the run script was quoted by the head, and
every command runs from an argv list. This script is the node side's main program: the
hello, the probe loop and the request loop. What they call comes with it as modules under
their own names (remote/shipping.py), imported like any module; it never runs without them:
node_base (settings, this channel, commands, the tmux server and job sessions), job_dirs
(job and attempt directories, launch tokens, locks), attribution (whose a process is),
kernel_log, watcher, cleaner and ops (the requests above), beside the hardware layer, the
parsers, the kernel-log cursor, the cgroup readers, the container helpers, the data
mounts' release and the tmux control client.
"""

import json
import os
import re
import socket
import sys
import threading
import time

from nebula_tui.node import ops
from nebula_tui.node.attribution import pids_to_jobs, pids_to_users
from nebula_tui.node.job_dirs import make_private_dir
from nebula_tui.node.kernel_log import KernelLog
from nebula_tui.node.node_base import (
    CONFIG, HEAD, HEADS_DIR, INTERVAL, JOBS_DIR, NODE_DIR, emit, keep_tmux_server, list_dir,
    read_text)
from nebula_tui.node.node_containers import conda_tools, container_runtimes
from nebula_tui.node.ops import handle
from nebula_tui.node.watcher import WATCHER


class NoHardware(object):
    """Stands in for the hardware layer when this script runs without it."""

    def snapshot(self):
        return {"devices": [], "processes": [], "clamped": [],
                "problems": ["the nodelet came without its hardware layer"]}

    def facts(self):
        return {"links": {}}

    def backends(self):
        return []

    notes = []

    def watch(self, report):
        pass


def start_hardware():
    """Every vendor's backend this node has, started (one reader thread each)."""
    try:
        from nebula_tui.node import hardware, registry
    except ImportError:
        return NoHardware()
    hardware.TOOL_TIMEOUT_S = float(CONFIG.get("tool_timeout", hardware.TOOL_TIMEOUT_S))
    skip = set(CONFIG.get("skip_backends") or ())  # e.g. ["nvml"]: read with nvidia-smi instead
    found = hardware.Hardware([b for b in registry.REGISTRY if b[0] not in skip],
                              interval=INTERVAL, init_wait=float(CONFIG.get("init_wait", 8.0)))
    found.start()
    return found


HARDWARE = None  # set by main() before the hello


def probe_once():
    message = dict(HARDWARE.snapshot(), type="probe", t=time.time(), error="")
    pids = [p["pid"] for p in message["processes"] if isinstance(p.get("pid"), int)]
    message["pid_jobs"] = pids_to_jobs(pids)
    message["pid_users"] = pids_to_users([p for p in pids if str(p) not in message["pid_jobs"]])
    return message


def probe_loop(kernel):
    while True:
        started = time.time()
        emit(probe_once())
        # After the probe: the head maps the lines' PCI addresses with the GPUs it just read.
        kernel.look()
        time.sleep(max(0.05, INTERVAL - (time.time() - started)))


def platform():
    """What kind of machine serves the GPUs: ``kind`` "wsl2" on Microsoft's WSL2 kernel
    (Windows' driver through /usr/lib/wsl/lib: no /dev/nvidia*, no Xid in the kernel log,
    no per-process GPU memory, containers get every GPU or none), else "linux"; the
    kernel's release, and whether /dev/nvidia* exists. The simulator's
    ``$NEBULA_SIM_DIR/osrelease`` stands in for the kernel's when it has one."""
    sim = os.environ.get("NEBULA_SIM_DIR")
    release = ""
    for path in ([os.path.join(sim, "osrelease")] if sim else []) + ["/proc/sys/kernel/osrelease"]:
        text = read_text(path)
        if text and text.strip():
            release = text.strip()
            break
    lowered = release.lower()
    wsl2 = "microsoft-standard" in lowered or "wsl2" in lowered
    devices = [d for d in list_dir("/dev") if re.match(r"^nvidia\d+$", d)]
    return {"kind": "wsl2" if wsl2 else "linux", "release": release, "dev_nvidia": bool(devices)}


def hello():
    facts = HARDWARE.facts()
    first = HARDWARE.snapshot()
    return {"type": "hello", "hostname": socket.gethostname(), "pid": os.getpid(),
            "python": sys.version.split()[0], "uid": os.getuid(), "node_dir": NODE_DIR,
            "head": HEAD, "max_job": max([int(j) for j in list_dir(JOBS_DIR) if j.isdigit()] or [0]),
            # What jobs may run in here: container runtimes, conda tools (node_containers.py).
            "runtimes": container_runtimes(), "conda": conda_tools(CONFIG.get("conda_lookup")),
            # The hardware: what serves it, its devices (static facts such as the base
            # clock R19 compares with, and PCIe links R9 weighs), versions and links.
            "backends": HARDWARE.backends(), "hardware_notes": list(HARDWARE.notes),
            "devices": first["devices"], "problems": first["problems"],
            "driver_version": facts.get("driver_version"),
            "cuda_version": facts.get("cuda_version"), "links": facts.get("links") or {},
            "platform": platform(), "t": time.time()}


def main():
    global HARDWARE
    mask = os.umask(0o077)
    os.umask(mask)
    ops.JOB_UMASK = "%04o" % mask
    for path in (NODE_DIR, HEADS_DIR, os.path.dirname(JOBS_DIR), JOBS_DIR):
        make_private_dir(path)  # makedirs gives its mode to the last directory only
    keep_tmux_server()
    HARDWARE = start_hardware()
    emit(hello())
    kernel = KernelLog()
    HARDWARE.watch(kernel.from_nvml)
    threading.Thread(target=probe_loop, args=(kernel,), daemon=True).start()
    threading.Thread(target=WATCHER.loop, daemon=True).start()
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            req = json.loads(line)
        except ValueError:
            emit({"type": "reply", "id": None, "ok": False, "error": "not JSON: %r" % line[:80]})
            continue
        # Slow requests (a cancel waits out its grace) must not hold up the others.
        threading.Thread(target=handle, args=(req,), daemon=True).start()


main()
