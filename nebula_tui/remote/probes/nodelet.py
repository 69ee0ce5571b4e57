"""The node side of NebulaGrid: sent over SSH stdin, run by the node's python3, never installed.

The head starts one of these per node over its persistent SSH connection and keeps it
running. It speaks JSON lines both ways (stdlib only, Python 3.6+):

node -> head
  {"type": "hello", ...}                       once: host facts, the hardware's backends,
                                               devices, driver/CUDA versions and links,
                                               container runtimes and conda tools
  {"type": "probe", "t", "devices", "processes", "problems", "clamped", "pid_jobs",
   "pid_users", "error"}                       every interval (R15): one vendor-neutral
                                               reading per device (probes/hardware.py);
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
  {"id", "op": "signal", "job", "signal"}      USR1/TERM to the job's processes; KILL: its session
  {"id", "op": "note", "job", "text"}          append one line of the head's to the job's log
  {"id", "op": "selftest", "gpu", "command"}   GPU self-test; the reply's "result" is what
                                               scheduler.health.judge_selftest reads (R17)
  {"id", "op": "reset", "gpu"}                 nvidia-smi -r -i UUID; "reset" true when it worked

No user string is ever given to a shell here: the run script was quoted by the head, and
every command below runs from an argv list. The modules it imports (the hardware layer,
the parsers, the kernel-log cursor, the cgroup readers, the container helpers, the data
mounts' release, the tmux control client) come with this script as modules under their
own names (remote/shipping.py); it never runs without them.

Why one module: it is one program on the node (shipped over stdin, never installed):
the request loop, the watcher and the ops share the job directories, their locks and the
JSON-lines channel. What stands on its own is a module of its own already (hardware,
backends, containers, warm-up).
"""

import contextlib
import errno
import fcntl
import json
import os
import pwd
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

from nebula_tui.remote.probes.cgroups import cgroup_container_id, pane_scope
from nebula_tui.remote.probes.kmsg_cursor import new_lines
from nebula_tui.remote.probes.mount_pins import release_pins
from nebula_tui.remote.probes.node_containers import (
    conda_tools, container_id, container_remove, container_runtimes, container_signal,
    container_stop)
from nebula_tui.remote.probes.tmux_control import TmuxControl, tmux_words

CONFIG = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
INTERVAL = float(CONFIG.get("interval", 5.0))
NODE_DIR = os.path.expanduser(os.environ.get("NEBULA_NODE_DIR") or "~/.nebula-node")
WATCH_EVERY = 0.02  # seconds between looks for started/ended jobs: ends are reported at once
PHASE_EVERY = 0.25  # seconds between looks at what starting jobs are doing (for display)
KMSG_CURSOR = os.path.join(NODE_DIR, "kmsg-cursor.json")
SELFTEST_TIMEOUT = 600  # dcgmi diag -r 1 takes about a minute; a configured test may take more
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

# The job-directory layout: everything of one head (one store) lives apart from every other
# head's, and every launch of a job (an attempt) has a directory of its own:
#   NODE_DIR/heads/<head>/jobs/<job>/<attempt>/   token, run.sh, output.log, launched,
#                                                 started, exit_code, acked
#   NODE_DIR/heads/<head>/locks/<job>             held while a launch of the job is decided
# and its tmux sessions are named for it, ``nebula-<job>-<head>`` on the node's ``-L nebula``
# server (the head's first 8 characters: a socket's path must stay short, so the server is
# shared). Two heads on the same nodes (another home) never see, relaunch or stop each
# other's jobs; within one head, the token
# ``<head>.<attempt>.<nonce>`` names exactly one launch, so a job id handed out again
# (a store restored from a backup) can never be taken for an earlier job.
HEAD = str(CONFIG.get("head") or "local")
if not _NAME.match(HEAD):
    raise SystemExit("nodelet: bad head id %r" % HEAD)
HEADS_DIR = os.path.join(NODE_DIR, "heads")
JOBS_DIR = os.path.join(HEADS_DIR, HEAD, "jobs")
LOCKS_DIR = os.path.join(HEADS_DIR, HEAD, "locks")  # one file per job launched here (op_launch)
TMUX = ["tmux", "-L", CONFIG.get("tmux_socket") or "nebula"]
#: this head's sessions on the node's tmux server end so: ``nebula-<job>-<head>``
#: (launcher.session_name)
SESSION_SUFFIX = "-" + HEAD[:8]
#: the session this head's tmux control client holds (tmux_control.py): no job's
CONTROL_SESSION = "nebula-control" + SESSION_SUFFIX
#: What a job's session lets an attached owner do: type to the job, and detach (Ctrl-b d;
#: Ctrl-b Ctrl-b sends a Ctrl-b). The session belongs to the node's login account (root on
#: a shared box) while the job runs as its owner: tmux's own keys (a new window, a split,
#: the command prompt's run-shell) would be a shell as that account. The key tables are the
#: server's, so they are bound again with each session (the same binding each time).
SESSION_KEYS = ["nebula-job", "nebula-job-prefix"]


def locked_session(name, token):
    """The commands after a job's ``new-session``: its token and the options above, each
    aimed at that session by name (a control client's "current session" is its own)."""
    target = ["-t", exact(name) + ":"]
    options = [["@nebula_token", token], ["prefix", "None"], ["prefix2", "None"],
               ["mouse", "off"], ["key-table", SESSION_KEYS[0]]]
    words = []
    for option in options:
        words += [";", "set-option", *target, *option]
    return words + [
        ";", "bind-key", "-T", SESSION_KEYS[0], "C-b", "switch-client", "-T", SESSION_KEYS[1],
        ";", "bind-key", "-T", SESSION_KEYS[1], "d", "detach-client",
        ";", "bind-key", "-T", SESSION_KEYS[1], "C-b", "send-keys", "C-b"]


#: acknowledged attempts' directories are removed this long after their ack
RETENTION_S = float(CONFIG.get("retention_s", 7 * 86400))
CLEAN_EVERY_S = 3600.0
#: an exit no head acknowledged is kept this many retentions (its head may yet come back)
UNCOLLECTED_RETENTIONS = 4
MAX_LOG_READ = 1 << 20  # bytes one log request returns at most
MAX_JOB_ID = (1 << 63) - 1

_out_lock = threading.Lock()


def emit(message):
    line = json.dumps(message, separators=(",", ":"))
    with _out_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def run(argv, timeout=20, stdin_text=None):
    """(exit code, stdout, stderr) of argv (``stdin_text`` its input); a missing tool is
    exit code 127."""
    try:
        done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              timeout=timeout, universal_newlines=True, input=stdin_text)
        return done.returncode, done.stdout, done.stderr
    except FileNotFoundError:
        return 127, "", "%s: command not found" % argv[0]
    except subprocess.TimeoutExpired:
        return 124, "", "%s timed out after %ss" % (argv[0], timeout)


def tmux(args, timeout=20):
    """(exit code, stdout, stderr) of tmux ``args`` on this head's server: through the
    control client while it answers, else as a process of its own."""
    done = CONTROL.call(args, timeout) if CONTROL is not None else None
    return done if done is not None else run(TMUX + list(args), timeout)


def tmux_unseen(args):
    """tmux ``args`` kept off every command line (a node's users read every process's argv,
    and a launch's words hold its token): through the control client when it is on, else
    as ``source-file -`` reading them from stdin, where the whole line still runs as one
    (tmux 3.1 and later; an older one gets them as argv). A server is never started so,
    and never keeps such a launch's argv as its own for good."""
    line = tmux_words(args) if CONTROL is None and tmux_version() >= (3, 1) else None
    if line is None:
        return tmux(args)
    code, out, err = run(TMUX + ["source-file", "-"], stdin_text=line + "\n")
    return code, out, err + out if code else err


#: what tmux says when this head's server is not (or no longer) there
_SERVER_GONE = ("server exited unexpectedly", "no server running", "error connecting to")


def session_name(job):
    return "nebula-%s%s" % (job, SESSION_SUFFIX)


def job_of_session(name):
    """The job of one of this head's sessions, or None (another head's, or not a job's)."""
    job = name[len("nebula-"):-len(SESSION_SUFFIX)]
    ok = name.startswith("nebula-") and name.endswith(SESSION_SUFFIX) and job.isdigit()
    return job if ok else None


def exact(name):
    """A tmux target matching only this session: a bare name also matches by prefix
    (nebula-1 would find nebula-12)."""
    return "=" + name


def parse_token(token):
    """(head, attempt, nonce) of a launch token ``<head>.<attempt>.<nonce>``, or None."""
    parts = token.split(".") if isinstance(token, str) else []
    if len(parts) != 3 or not _NAME.match(parts[0]) or not parts[1].isdigit() \
            or not _NAME.match(parts[2]) or len(parts[1]) > 9:
        return None
    return parts[0], int(parts[1]), parts[2]


def job_id(value):
    """A job number from a request, as the directory name; ValueError when it is not one."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError("job must be a number")
    number = int(value)
    if not 1 <= number <= MAX_JOB_ID or str(number) != str(value).strip():
        raise ValueError("job must be a number from 1 to 2^63-1")
    return str(number)


def job_root(job):
    return os.path.join(JOBS_DIR, job)


def attempt_dir(job, attempt):
    return os.path.join(JOBS_DIR, job, str(attempt))


def attempts(job):
    """The attempts of ``job`` that have a directory here, oldest first."""
    try:
        names = os.listdir(job_root(job))
    except OSError:
        return []
    return sorted(int(n) for n in names if n.isdigit())


def latest_dir(job):
    """The directory of the job's latest attempt here (its session is that attempt's), or None."""
    found = attempts(job)
    return attempt_dir(job, found[-1]) if found else None


def read_text(path):
    try:
        with open(path) as f:
            return f.read()
    except (OSError, UnicodeDecodeError):
        return None


def write_atomic(path, text, mode=0o600):
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.rename(tmp, path)


def tmux_sessions():
    """{job: the launch token its session was created with} of this head's sessions."""
    code, out, _ = tmux(["list-sessions", "-F", "#{session_name} #{@nebula_token}"])
    if code != 0:  # no server running means no sessions
        return {}
    found = {}
    for line in out.splitlines():
        name, _, token = line.partition(" ")
        job = job_of_session(name)
        if job:
            found[job] = token.strip()
    return found


def pids_to_jobs(pids):
    """Which of these pids belong to one of this head's jobs: those descended from a job
    session's pane on this head's tmux server, those in the cgroup of a job's container
    (whose processes are children of the runtime's monitor, not of the pane) and those in
    a job pane's own systemd scope (which left its process tree: a daemon, a double fork).
    /proc tells parents and cgroups whatever user a job runs as; an environment
    (NEBULA_JOB_ID) anyone can set is never taken for a job."""
    panes = pane_jobs() if pids else {}
    found = {}
    containers = scopes = None
    for pid in pids:
        ancestor, steps = pid, 0
        while ancestor > 1 and steps < 100:
            if ancestor in panes:
                found[str(pid)] = panes[ancestor]
                break
            ancestor, steps = _ppid(ancestor), steps + 1
        if str(pid) in found:
            continue
        if containers is None:
            containers = container_jobs(set(panes.values()))
            scopes = pane_scopes(panes)
        cgroup = read_text("/proc/%d/cgroup" % pid) if containers or scopes else None
        job = containers.get(cgroup_container_id(cgroup)) or scopes.get(pane_scope(cgroup))
        if job:
            found[str(pid)] = job
    return found


def pane_scopes(panes):
    """{the systemd scope of a job's pane: its job}, for panes tmux started in a scope of
    their own (cgroups.pane_scope); a scope two jobs' panes share is nobody's."""
    found, shared = {}, set()
    for pid, job in panes.items():
        scope = pane_scope(read_text("/proc/%d/cgroup" % pid))
        if scope is None:
            continue
        if found.get(scope, job) != job:
            shared.add(scope)
        found[scope] = job
    return dict((s, j) for s, j in found.items() if s not in shared)


_CONTAINER_IDS = {}  # attempt directory -> its container's id (asked once per attempt)
_CONTAINER_IDS_LOCK = threading.Lock()  # the probe and the kernel-log reader both ask


def container_jobs(jobs):
    """{container id: job} of these jobs' containers here. An id two jobs claim is
    nobody's (a job's directory names the container it ran, not one it may choose)."""
    with _CONTAINER_IDS_LOCK:
        return _container_jobs(jobs)


def _container_jobs(jobs):
    found, claimed = {}, set()
    for job in jobs:
        d = latest_dir(job)
        if d is None:
            continue
        ident = _CONTAINER_IDS.get(d)
        if ident is None:
            ident = container_id(d)
            if ident is not None:
                _CONTAINER_IDS[d] = ident
        if ident in found:
            claimed.add(ident)
        elif ident is not None:
            found[ident] = job
    live = set(latest_dir(j) for j in jobs)
    for d in [d for d in _CONTAINER_IDS if d not in live]:
        del _CONTAINER_IDS[d]  # ended attempts
    return dict((i, j) for i, j in found.items() if i not in claimed)


def pane_jobs():
    """{pane pid: job} of every job session of this head."""
    code, out, _ = tmux(["list-panes", "-a", "-F", "#{session_name} #{pane_pid}"])
    found = {}
    for line in out.splitlines() if code == 0 else []:
        name, _, pid = line.partition(" ")
        job = job_of_session(name)
        if job and pid.strip().isdigit():
            found[int(pid)] = job
    return found


def _ppid(pid):
    stat = read_text("/proc/%d/stat" % pid)
    try:
        # The command name may hold spaces and parentheses: fields resume after the last ')'.
        return int(stat.rsplit(")", 1)[1].split()[1])
    except (AttributeError, IndexError, ValueError):
        return 0


# ------------------------------------------------------------------------ probe
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
        from nebula_tui.remote.probes import hardware, registry
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


def pids_to_users(pids):
    """The Unix user owning each of these pids (processes we did not start, for reasons
    and the memory guard: "pid 4242 of alice holds 20 GB")."""
    found = {}
    for pid in pids:
        try:
            uid = os.stat("/proc/%d" % pid).st_uid
            found[str(pid)] = pwd.getpwuid(uid).pw_name
        except (OSError, KeyError):
            continue
    return found


def probe_loop(kernel):
    while True:
        started = time.time()
        emit(probe_once())
        # After the probe: the head maps the lines' PCI addresses with the GPUs it just read.
        kernel.look()
        time.sleep(max(0.05, INTERVAL - (time.time() - started)))


# ------------------------------------------------------------------- kernel log
_PID_IN_XID = re.compile(r"NVRM: Xid \([^)]*\): \d+, pid=(\d+)")


def current_boot_id():
    """The running boot's id; the simulator's ``$NEBULA_SIM_DIR/boot_id`` when it has one."""
    sim = os.environ.get("NEBULA_SIM_DIR")
    paths = [os.path.join(sim, "boot_id")] if sim else []
    for path in paths + ["/proc/sys/kernel/random/boot_id"]:
        text = read_text(path)
        if text and text.strip():
            return text.strip()
    return None


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
    devices = [d for d in _listdir("/dev") if re.match(r"^nvidia\d+$", d)]
    return {"kind": "wsl2" if wsl2 else "linux", "release": release, "dev_nvidia": bool(devices)}


def read_kernel_log():
    """(text, error) of the kernel log with uptime stamps: dmesg, else journalctl -k.

    dmesg needs kernel.dmesg_restrict=0 (or root); journalctl -k needs the user in group
    systemd-journal or adm. Both print "[ uptime]" stamps, which the cursor follows.
    """
    code, out, err = run(["dmesg"])
    if code == 0:
        return out, ""
    jcode, jout, jerr = run(["journalctl", "-k", "-b", "-o", "short-monotonic", "--no-pager", "-q"])
    if jcode == 0:
        return jout, ""
    return None, "cannot read the kernel log: dmesg: %s; journalctl: %s" % (
        (err or out).strip()[:200] or "exit code %d" % code, (jerr or jout).strip()[:200] or
        "exit code %d" % jcode)


_XID_IN_LINE = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})"
                          r"[^)]*\):\s*(\d+)")
#: A kernel line repeats an Xid NVML already reported when it comes within this many seconds.
SAME_XID_S = 60.0


def _xid_key(domain, bus, device, code):
    return (int(domain, 16), int(bus, 16), int(device, 16), int(code))


def _take(pending, key):
    """Pair with one pending report of ``key``; whether there was one."""
    times = pending.get(key)
    if not times:
        return False
    times.pop(0)
    if not times:
        del pending[key]
    return True


def _forget_before(pending, moment):
    for key in list(pending):
        pending[key] = [t for t in pending[key] if t >= moment]
        if not pending[key]:
            del pending[key]


class KernelLog:
    """Reads the lines logged since the last look (R16); the cursor survives restarts.

    NVML's critical-Xid events (``from_nvml``) are told at once, in the kernel's words, and
    the kernel's own line for the same Xid is then not told again; the kernel's line wins
    when it is already there (it names the process)."""

    def __init__(self):
        text = read_text(KMSG_CURSOR)
        try:
            self.cursor = json.loads(text) if text else None
        except ValueError:
            self.cursor = None
        self.error = ""
        self.lock = threading.Lock()
        # (domain, bus, device, code) -> times, for Xids one source told and the other has
        # not yet: NVML's events, and the kernel's own lines. Each pairs with one of the other.
        self.told = {}
        self.logged = {}

    def look(self):
        with self.lock:
            return self._look()

    def _look(self):
        """Emit the new lines, less the Xids NVML told already."""
        text, error = read_kernel_log()
        if text is None:
            if error != self.error:  # said once, not every probe
                self.error = error
                emit({"type": "kmsg", "lines": [], "error": error, "t": time.time()})
            return set()
        self.error = ""
        lines, cursor = new_lines(text, self.cursor, current_boot_id())
        now = time.time()
        _forget_before(self.told, now - SAME_XID_S)
        _forget_before(self.logged, now - SAME_XID_S)
        kept = []
        for line in lines:
            match = _XID_IN_LINE.search(line)
            key = _xid_key(*match.groups()) if match else None
            if key is not None:
                if _take(self.told, key):
                    continue  # NVML told it already: once is enough
                self.logged.setdefault(key, []).append(now)
            kept.append(line)
        lines = kept
        if lines:
            pids = set(int(p) for p in _PID_IN_XID.findall("\n".join(lines)))
            emit({"type": "kmsg", "lines": lines, "pid_jobs": pids_to_jobs(pids), "t": time.time()})
        if cursor != self.cursor:
            self.cursor = cursor
            try:
                write_atomic(KMSG_CURSOR, json.dumps(cursor))
            except OSError:
                pass  # kept in memory; a restart then takes the log as history again

    def from_nvml(self, device, code):
        """NVML signalled Xid ``code`` on ``device`` (a reading): tell it within this poll."""
        with self.lock:
            bus = device.get("pci_bus_id") or ""
            parts = bus.replace(".", ":").split(":")
            if len(parts) < 3:
                return
            key = _xid_key(parts[0][-4:], parts[1], parts[2], code)
            self._look()
            if _take(self.logged, key):
                return  # the kernel's line came first (it names the process): once is enough
            self.told.setdefault(key, []).append(time.time())
            pci = "%04x:%s:%s" % (key[0], parts[1].lower(), parts[2].lower())
            emit({"type": "kmsg", "pid_jobs": {}, "t": time.time(), "source": "nvml",
                  "lines": ["NVRM: GPU at PCI:%s: %s" % (pci, device.get("uuid")),
                            "NVRM: Xid (PCI:%s): %d, pid='<unknown>', name=<unknown>, "
                            "reported by NVML's event set" % (pci, code)]})


# ---------------------------------------------------------------------- watcher
class Watcher:
    """Reports each attempt's start and exit once, as soon as its marker file appears."""

    def __init__(self):
        self.started = set()  # (job, attempt) whose start was reported
        self.ended = set()    # (job, attempt) whose exit was reported (or that need none)
        self.finished = set()  # jobs whose every attempt here ended: not looked at again
        self.last_session_check = 0.0
        self.last_clean = 0.0
        self.phases = {}  # (job, attempt) -> what its wrapper said it is doing (an image pull)
        self.last_phase_check = 0.0

    def loop(self):
        while True:
            self.look()
            if time.time() - self.last_clean > CLEAN_EVERY_S:
                self.last_clean = time.time()
                clean_old_attempts(time.time())
            time.sleep(WATCH_EVERY)

    def look(self):
        try:
            names = os.listdir(JOBS_DIR)
        except OSError:
            return
        sessions = None
        phases = time.time() - self.last_phase_check > PHASE_EVERY
        if phases:
            self.last_phase_check = time.time()
        if time.time() - self.last_session_check > INTERVAL:
            # Listed before the directories are read: a job launched after this moment
            # is judged at the next check, never as "vanished" by a stale list.
            self.last_session_check = time.time()
            sessions = tmux_sessions()
        for job in names:
            if job in self.finished or not job.isdigit():
                continue
            found = attempts(job)
            for attempt in found:
                self.look_at(job, attempt, attempt == found[-1], sessions, phases)
            if found and all((job, a) in self.ended for a in found):
                self.finished.add(job)  # a relaunch here takes it out again (forget)

    def look_at(self, job, attempt, latest, sessions, phases):
        key = (job, attempt)
        if key in self.ended:
            return
        d = attempt_dir(job, attempt)
        if os.path.exists(os.path.join(d, "acked")):
            self.ended.add(key)
            return
        token = read_text(os.path.join(d, "token"))
        if key not in self.started and os.path.exists(os.path.join(d, "started")):
            self.started.add(key)
            emit({"type": "started", "job": job, "attempt": attempt, "token": token,
                  "t": _mtime(os.path.join(d, "started")),
                  "workdir": read_text(os.path.join(d, "workdir")) or None})
        code_text = read_text(os.path.join(d, "exit_code"))
        if code_text is not None and code_text.strip():
            self.ended.add(key)
            self.phases.pop(key, None)
            self.look_log_cut(job, d)  # a cut just before the end is said before the exit
            emit({"type": "exit", "job": job, "attempt": attempt, "code": _int(code_text),
                  "token": token, "t": _mtime(os.path.join(d, "exit_code")),
                  "reason": (read_text(os.path.join(d, "reason")) or "").strip()[:500]})
            return
        if phases and key in self.started:
            self.look_phase(key, d, token)
            self.look_log_cut(job, d)
        if sessions is not None and _launched_before(d, self.last_session_check) and (
                not latest or job not in sessions):
            # The session is gone (an older attempt's was stopped for its relaunch) but left
            # no exit code: killed, or the node rebooted.
            if read_text(os.path.join(d, "exit_code")) is None:
                self.ended.add(key)
                emit({"type": "exit", "job": job, "attempt": attempt, "code": None,
                      "token": token, "t": time.time()})

    def look_phase(self, key, d, token):
        """Report what the wrapper says it is doing before the command ("pulling image …")."""
        text = (read_text(os.path.join(d, "phase")) or "").strip()[:200]
        if text != self.phases.get(key, ""):
            self.phases[key] = text
            emit({"type": "phase", "job": key[0], "attempt": key[1], "token": token,
                  "text": text, "t": time.time()})

    def look_log_cut(self, job, d):
        """The wrapper's tee could not write the log any more (``limits.log_max`` reached,
        or the disk full) and said why in ``log_cut``: the log ends with a line saying so,
        once (``log_cut`` is then renamed), while the job runs on."""
        cut = os.path.join(d, "log_cut")
        said = (read_text(cut) or "").strip().splitlines()  # blank: the room the wrapper kept
        if not said:
            return
        try:
            os.rename(cut, cut + ".said")
        except OSError:
            return
        why = said[-1] if said else ""
        log = os.path.join(d, "output.log")
        try:
            size = os.path.getsize(log)
        except OSError:
            size = 0
        if "too large" in why.lower():
            text = ("nebula: the log is cut here, at %s (limits.log_max); job %s runs on, its "
                    "further output only on its terminal (nebula attach %s)" % (_size_words(size), job, job))
        else:
            text = "nebula: the log stops here (%s); job %s runs on" % (why[:300] or "write failed", job)
        try:  # appended to the log the wrapper made, never through a link put in its place
            fd = os.open(log, os.O_RDWR | os.O_APPEND | os.O_NOFOLLOW)
        except OSError:
            return
        with os.fdopen(fd, "r+b", buffering=0) as f:
            for room in (0, 4096):  # on a full disk the log's last page makes room for the line
                try:
                    size = max(0, size - room)
                    if room:
                        f.truncate(size)
                    last = b"\n"
                    if size:  # a cut inside a line: the sentence still starts one of its own
                        f.seek(size - 1)
                        last = f.read(1)
                    f.write((b"" if last == b"\n" else b"\n") + text.encode("utf-8", "replace") + b"\n")
                    return
                except OSError:
                    continue

    def forget(self, job, attempt):
        self.started.discard((job, attempt))
        self.ended.discard((job, attempt))
        self.phases.pop((job, attempt), None)
        self.finished.discard(job)


def _size_words(size):
    """A size for people: 1 MiB, 10 GiB, 1.5 GiB."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return ("%.1f %s" % (size / scale, unit)).replace(".0 ", " ")
    return "%d bytes" % size


def clean_old_attempts(now):
    """Remove the directories of attempts acknowledged more than RETENTION_S ago, of every
    head (an ack means that head has recorded the exit), and their jobs' empty directories.
    An exit no head acknowledged is kept UNCOLLECTED_RETENTIONS times as long (its head may
    come back for it), then goes too: a head that is gone for good leaves nothing for ever."""
    for head in _listdir(HEADS_DIR):
        jobs = os.path.join(HEADS_DIR, head, "jobs")
        with contextlib.suppress(OSError):
            _make_private_dir(os.path.join(HEADS_DIR, head, "locks"))
        for job in _listdir(jobs):
            # Under the job's lock: a launch makes the job's directory, then its attempt's,
            # and an empty job directory removed between the two failed that launch.
            lock = job_lock(os.path.join(HEADS_DIR, head, "locks", job), wait=False)
            if lock is None:
                continue  # a launch of it is under way (or its head's locks are not ours)
            try:
                _clean_job(os.path.join(HEADS_DIR, head), job, now)
            finally:
                os.close(lock)


def _clean_job(head_dir, job, now):
    root = os.path.join(head_dir, "jobs", job)
    for attempt in _listdir(root):
        d = os.path.join(root, attempt)
        try:
            old = now - os.stat(os.path.join(d, "acked")).st_mtime > RETENTION_S
        except OSError:
            try:  # ended (the wrapper's exit code is written last), never collected
                ended = os.stat(os.path.join(d, "exit_code")).st_mtime
            except OSError:
                continue  # still running, or never started: never removed here
            old = now - ended > UNCOLLECTED_RETENTIONS * RETENTION_S
        # A data mount still bound under it (mount_pins.py) is detached first; where one
        # cannot be, the directory stays: removing it would delete the user's files through it.
        if old and release_pins(os.path.join(d, "mnt")):
            shutil.rmtree(d, ignore_errors=True)
    if not _listdir(root):
        with contextlib.suppress(OSError):
            os.rmdir(root)
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(head_dir, "locks", job))


def _listdir(path):
    try:
        return os.listdir(path)
    except OSError:
        return []


def _mtime(path):
    try:
        return os.stat(path).st_mtime
    except OSError:
        return time.time()


def _launched_before(d, moment):
    try:
        return os.stat(os.path.join(d, "launched")).st_mtime < moment
    except OSError:
        return False


def _int(text):
    try:
        return int(text.strip())
    except ValueError:
        return None


WATCHER = Watcher()
#: ``"tmux_control": true`` in the settings: tmux commands through one control client
#: (tmux_control.py; bench/nodelet.py compares the two). Off unless asked: with it, the
#: chaos test (the head killed 20 times while 200 jobs flow) still lost a running job's
#: session now and then, and never without it; until that is understood, every tmux
#: command is a process of its own.
CONTROL = TmuxControl(TMUX, CONTROL_SESSION, lambda: keep_tmux_server()) \
    if CONFIG.get("tmux_control", False) else None


# --------------------------------------------------------------------- requests
def op_launch(req):
    """Launch one attempt of a job once. Two nodelets can be asked for the same launch at
    once (a head killed mid-launch leaves its nodelet finishing while the next head's
    relaunches), so the look for an earlier launch and the launch are one step under a lock
    per job: else a job quick enough to end between the two steps of one runs a second time."""
    job = job_id(req["job"])
    parsed = parse_token(req["token"])
    if parsed is None or parsed[0] != HEAD:
        return {"ok": False, "error": "bad launch token %r for head %s" % (req["token"], HEAD)}
    try:
        os.makedirs(LOCKS_DIR, mode=0o700, exist_ok=True)
        lock = job_lock(os.path.join(LOCKS_DIR, job))
    except OSError as err:
        return _launch_error(err)
    try:
        return _launch(req, job, parsed[1])
    except OSError as err:
        return _launch_error(err)
    finally:
        os.close(lock)


def job_lock(path, wait=True):
    """The open file of a job's lock at ``path``, locked (released when closed, or when this
    process dies); None when ``wait`` is false and it is held. The cleaner unlinks the lock
    of a job it removes, holding it: whoever waited on the unlinked file takes a new one."""
    while True:
        try:
            fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
        except OSError:
            if wait:
                raise
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except OSError:
            os.close(fd)
            if wait:
                raise  # no locking here (NFS without lockd): the launch says so
            return None
        try:
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                return fd
        except OSError:
            pass  # unlinked while this waited
        os.close(fd)


def _launch(req, job, attempt):
    token = req["token"]
    d = attempt_dir(job, attempt)
    name = session_name(job)
    found = attempts(job)
    later = [a for a in found if a > attempt]
    if later:
        # Never stop or shadow a later launch: the head asking is behind the node.
        return {"ok": False, "error": "job %s already has attempt %d on this node, after the "
                "attempt %d asked for; the head's store is older than the node's record "
                "(restored from a backup?)" % (job, later[-1], attempt)}
    marks = [m for m in ("launched", "started", "exit_code") if os.path.exists(os.path.join(d, m))]
    recorded = read_text(os.path.join(d, "token"))
    if recorded is None and not marks:
        pass  # no directory, or one whose launch died before its token: nothing ran from it
    elif recorded != token:
        # The same job number and attempt from another launch: a store that handed the
        # number out again, or a copy of this store. Neither may adopt nor stop it.
        return {"ok": False, "error": "job %s attempt %d on this node is another launch "
                "(token %s, asked for %s); nothing was started" % (job, attempt, recorded, token)}
    elif marks:
        # This very launch happened before (its wrapper left its marks), perhaps by a
        # nodelet that died before it could say so: never run it a second time. A
        # session created but not yet started is caught below as a duplicate.
        write_atomic(os.path.join(d, "launched"), str(time.time()))
        return {"ok": True, "already": True}
    # A job never launched here has no session of this head's to supersede: its first
    # launch asks tmux once, not twice (a session of that name is still refused below).
    session = tmux_sessions().get(job) if found else None
    if session is not None and session != token:
        theirs = parse_token(session)
        if theirs is None or theirs[1] >= attempt:
            return _taken(name, session)
        # An earlier attempt of this job, requeued by its head meanwhile: the relaunch
        # supersedes it, so its session and container go (its directory and log stay).
        tmux(["kill-session", "-t", exact(name)])
        container_remove(attempt_dir(job, theirs[1]))
        release_pins(os.path.join(attempt_dir(job, theirs[1]), "mnt"))
    _make_private_dir(job_root(job))
    _make_private_dir(d)
    WATCHER.forget(job, attempt)
    write_atomic(os.path.join(d, "token"), token)
    if isinstance(req.get("record"), dict):
        # What the head knew of the job at its launch: a store restored from an older
        # backup learns from it what ran meanwhile (op_list with "records").
        write_atomic(os.path.join(d, "launch.json"), json.dumps(req["record"]))
    _prepare_log(os.path.join(d, "output.log"), req.get("user"))
    script = os.path.join(d, "run.sh")
    write_atomic(script, req["script"], 0o700)
    command = ["sh", script, d, JOB_UMASK] if tmux_execs_argv() else [
        "exec sh %s %s %s" % (shlex.quote(script), shlex.quote(d), JOB_UMASK)]
    argv = ["new-session", "-d", "-s", name, "-x", "200", "-y", "50", *command,
            *locked_session(name, token)]
    code, _, err = tmux_unseen(argv)
    if code != 0 and any(gone in err for gone in _SERVER_GONE):
        keep_tmux_server()  # someone killed the server meanwhile: start it again, once
        code, _, err = tmux_unseen(argv)
    if code != 0:
        session = tmux_sessions().get(job) if "duplicate session" in err else None
        if session in (token, ""):
            # the session is the idempotency key: this launch happened already
            write_atomic(os.path.join(d, "launched"), str(time.time()))
            return {"ok": True, "already": True}
        if session is not None:
            return _taken(name, session)
        return {"ok": False, "error": "tmux new-session failed: %s" % err.strip()}
    write_atomic(os.path.join(d, "launched"), str(time.time()))
    return {"ok": True, "already": False}


def _launch_error(err):
    """A launch the node's disk could not take: one sentence saying where and what."""
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        return {"ok": False, "error": "the disk of its job directories (%s) is full: %s; free "
                "space there" % (NODE_DIR, os.strerror(err.errno))}
    return {"ok": False, "error": "%s: %s" % (type(err).__name__, err)}


def _taken(name, session):
    return {"ok": False, "error": "tmux session %s on this node belongs to another launch (%s); "
            "nothing was started" % (name, session or "no token")}


def _make_private_dir(path):
    """A directory only this node's login account can enter (the jobs of the lab's users run
    as themselves and must not read each other's logs or write each other's exit codes)."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    os.chmod(path, 0o700)


def _prepare_log(path, user):
    """Create the job's log for its wrapper: readable by the job's own user alone (chowned
    to them where this nodelet may), never by the other users' jobs."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        if user and os.getuid() == 0:
            try:
                entry = pwd.getpwnam(user)
                os.fchown(fd, entry.pw_uid, entry.pw_gid)
            except KeyError:
                pass  # the launch's own run as that user will say the user is unknown
    finally:
        os.close(fd)


def session_pids(job):
    code, out, _ = tmux(["list-panes", "-s", "-t", exact(session_name(job)), "-F", "#{pane_pid}"])
    return [int(p) for p in out.split() if p.isdigit()] if code == 0 else []


def _session_is(job, token):
    """Whether the job's session exists and (when ``token`` is given) is that launch's."""
    session = tmux_sessions().get(job)
    return session is not None and (token is None or session in (token, ""))


def op_cancel(req):
    """SIGTERM the job's processes, kill its session after ``grace``. With ``token``, only
    that launch's session: a newer attempt in its place is left alone."""
    job = job_id(req["job"])
    token = req.get("token")
    grace = float(req.get("grace", 10))
    if not _session_is(job, token):
        return {"ok": True, "alive": False}
    d = latest_dir(job) or ""
    # A container is stopped by its runtime (SIGTERM, SIGKILL after the grace); its client
    # in the session then ends with its exit code. Else, or when it is not up yet (pulling):
    # the session's processes get SIGTERM.
    if not container_stop(d, grace):
        for pid in session_pids(job):
            _signal_group(pid, signal.SIGTERM)
    deadline = time.time() + grace
    while time.time() < deadline and _session_is(job, token):
        time.sleep(0.1)
    if _session_is(job, token):
        tmux(["kill-session", "-t", exact(session_name(job))])
        container_remove(d)
        release_pins(os.path.join(d, "mnt"))  # the killed wrapper could not (mount_pins.py)
    return {"ok": True}


def _signal_group(pid, sig):
    try:
        os.killpg(os.getpgid(pid), sig)
    except OSError:
        pass


def op_ack(req):
    """The head recorded these exits: ``jobs`` is a list of [job, token] (each names one
    attempt), so a late ack can never silence a relaunch of the same job."""
    for job, token in req["jobs"]:
        parsed = parse_token(token)
        if parsed is None or parsed[0] != HEAD:
            continue
        d = attempt_dir(job_id(job), parsed[1])
        if read_text(os.path.join(d, "token")) == token:
            write_atomic(os.path.join(d, "acked"), str(time.time()))
    return {"ok": True}


def op_log(req):
    """Part of a job's output log: its latest attempt here, or ``attempt``."""
    job = job_id(req["job"])
    attempt = req.get("attempt")
    d = latest_dir(job) if attempt is None else attempt_dir(job, int(attempt))
    offset = max(0, int(req.get("offset", 0)))
    limit = min(MAX_LOG_READ, max(0, int(req.get("limit", 65536))))
    try:
        with open(os.path.join(d or "", "output.log"), "rb") as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(offset)
            data = f.read(limit)
    except OSError:
        return {"ok": True, "exists": False, "data": "", "offset": offset, "size": 0}
    return {"ok": True, "exists": True, "data": data.decode("utf-8", "replace"),
            "offset": offset + len(data), "size": size}


def _attempt_info(d, with_record=False):
    info = {
        "token": read_text(os.path.join(d, "token")),
        "launched": os.path.exists(os.path.join(d, "launched")),
        "started": os.path.exists(os.path.join(d, "started")),
        "started_at": _mtime(os.path.join(d, "started")) if os.path.exists(os.path.join(d, "started")) else None,
        "exit_code": _int(read_text(os.path.join(d, "exit_code")) or "x"),
        "acked": os.path.exists(os.path.join(d, "acked")),
    }
    if with_record:
        try:
            info["record"] = json.loads(read_text(os.path.join(d, "launch.json")) or "null")
        except ValueError:
            info["record"] = None
    return info


def op_note(req):
    """One line of the head's in the job's log (why it was warned or stopped): the log of
    its latest attempt here, the one running."""
    d = latest_dir(job_id(req["job"]))
    if d is None:
        return {"ok": False, "error": "no such job here"}
    text = "".join(c if c.isprintable() else " " for c in str(req.get("text", "")))[:1000]
    try:  # appended to the log the wrapper made, never through a link put in its place
        fd = os.open(os.path.join(d, "output.log"), os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)
        with os.fdopen(fd, "w") as f:
            f.write(text + "\n")
    except OSError as err:
        return {"ok": False, "error": str(err)}
    return {"ok": True}


def op_list(req):
    """This head's jobs here: ``jobs`` holds each job's latest attempt (the one its session,
    if any, belongs to), ``attempts`` every attempt; ``sessions`` the jobs with a live session and
    ``session_tokens`` the launch each belongs to. With ``records``, each attempt also
    carries the record its launch left (``launch.json``)."""
    jobs, every = {}, {}
    with_records = bool(req.get("records"))
    for job in _listdir(JOBS_DIR):
        if not job.isdigit():
            continue
        found = attempts(job)
        if not found:
            continue
        every[job] = {str(a): _attempt_info(attempt_dir(job, a), with_records) for a in found}
        jobs[job] = dict(every[job][str(found[-1])], attempt=found[-1])
    sessions = tmux_sessions()
    return {"ok": True, "jobs": jobs, "attempts": every, "sessions": sorted(sessions, key=int),
            "session_tokens": sessions}


_SIGNALS = {"USR1": signal.SIGUSR1, "TERM": signal.SIGTERM, "KILL": signal.SIGKILL}


def _children():
    """ppid -> [pid] from /proc."""
    tree = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            tree.setdefault(_ppid(int(name)), []).append(int(name))
    return tree


def _descendants(pids):
    tree, out, todo = _children(), [], list(pids)
    while todo:
        for child in tree.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _job_of(pid):
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            for item in f.read().split(b"\0"):
                if item.startswith(b"NEBULA_JOB_ID="):
                    return item.split(b"=", 1)[1].decode("ascii", "replace")
    except OSError:
        pass
    return None


def job_processes(job):
    """The processes of the job's own command: the session's descendants that carry its
    NEBULA_JOB_ID. Not the wrapper shell and its tee, which must outlive a SIGUSR1 to write
    the exit code and keep the log; when the environment cannot be read (the command runs
    as another user), every descendant but those two."""
    panes = session_pids(job)
    below = _descendants(panes)
    own = [pid for pid in below if _job_of(pid) == str(job)]
    if own:
        return own
    wrapper = set(read_text("/proc/%d/cmdline" % pid) for pid in panes)
    return [pid for pid in below if read_text("/proc/%d/cmdline" % pid) not in wrapper
            and (read_text("/proc/%d/comm" % pid) or "").strip() != "tee"]


def op_signal(req):
    """USR1 (checkpoint now) or TERM to the job's processes; KILL ends everything of the
    job, its tmux session included. ``alive``: whether the session is still there."""
    job = job_id(req["job"])
    name = str(req.get("signal", "")).upper().replace("SIG", "")
    if name not in _SIGNALS:
        return {"ok": False, "error": "signal must be one of %s" % ", ".join(sorted(_SIGNALS))}
    if name == "KILL":
        panes = session_pids(job)
        pids = _descendants(panes) + panes
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        tmux(["kill-session", "-t", exact(session_name(job))])
        # The head ends or requeues this attempt itself: its exit is not reported, so no
        # late report (and ack) can meet a relaunch of the job in the same directory.
        d = latest_dir(job)
        if d is not None:
            container_remove(d)
            release_pins(os.path.join(d, "mnt"))
            write_atomic(os.path.join(d, "acked"), str(time.time()))
            WATCHER.ended.add((job, int(os.path.basename(d))))
    elif container_signal(latest_dir(job) or "", name):
        pids = []  # the container's main process got it (its init passes it on)
    else:
        pids = job_processes(job)
        for pid in pids:
            try:
                os.kill(pid, _SIGNALS[name])
            except OSError:
                pass
    return {"ok": True, "pids": pids, "alive": job in tmux_sessions()}


def _smi():
    return "nvidia-smi"


def _number(text):
    try:
        return float(text.strip())
    except (ValueError, AttributeError):
        return None


def op_selftest(req):
    """The GPU answers nvidia-smi, its temperature, its volatile uncorrected ECC count (the
    memory check), the configured command if any, and dcgmi diag -r 1 where DCGM exists."""
    gpu = str(req["gpu"])
    result = {"smi_ok": False, "smi_error": "", "temperature_c": None, "memory_test": None,
              "dcgm": {"ran": False, "ok": False, "detail": ""}}
    code, out, err = run([_smi(), "-i", gpu, "--query-gpu=index,temperature.gpu,"
                          "ecc.errors.uncorrected.volatile.total", "--format=csv,noheader,nounits"])
    cells = [c.strip() for c in out.strip().splitlines()[0].split(",")] if out.strip() else []
    if code != 0 or len(cells) != 3:
        result["smi_error"] = (err or out).strip()[:300] or "exit code %d" % code
        return {"ok": True, "result": result}
    result["smi_ok"] = True
    index, result["temperature_c"], ecc = cells[0], _number(cells[1]), _number(cells[2])
    checks = []
    if ecc is not None:  # cards without ECC say [N/A]: nothing to check there
        checks.append((ecc == 0, "%d uncorrected ECC errors since the last reset" % ecc
                       if ecc else "no uncorrected ECC errors"))
    command = req.get("command")
    if command:
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=gpu, NEBULA_GPU_UUID=gpu)
        try:
            done = subprocess.run(["sh", "-c", command], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, universal_newlines=True, env=env,
                                  timeout=SELFTEST_TIMEOUT)
            lines = done.stdout.strip().splitlines()
            checks.append((done.returncode == 0, "%s: exit code %d%s" % (
                command, done.returncode, (": " + lines[-1][:200]) if lines else "")))
        except subprocess.TimeoutExpired:
            checks.append((False, "%s: no result after %ds" % (command, SELFTEST_TIMEOUT)))
    if checks:
        result["memory_test"] = {"ok": all(ok for ok, _ in checks),
                                 "detail": "; ".join(d for ok, d in checks if not ok)
                                 or "; ".join(d for _, d in checks)}
    dcode, dout, derr = run(["dcgmi", "diag", "-r", "1", "-i", index], timeout=SELFTEST_TIMEOUT)
    if dcode != 127:
        lines = (dout or derr).strip().splitlines()
        result["dcgm"] = {"ran": True, "ok": dcode == 0,
                          "detail": lines[-1][:300] if lines else "exit code %d" % dcode}
    return {"ok": True, "result": result}


def op_reset(req):
    """One reset attempt (nvidia-smi -r): refused while processes use the card."""
    code, out, err = run([_smi(), "-r", "-i", str(req["gpu"])], timeout=120)
    lines = (out + err).strip().splitlines()
    return {"ok": True, "reset": code == 0,
            "detail": lines[0][:300] if lines else "exit code %d" % code}


OPS = {"launch": op_launch, "cancel": op_cancel, "ack": op_ack, "log": op_log, "list": op_list,
       "signal": op_signal, "selftest": op_selftest, "reset": op_reset, "note": op_note}


def handle(req):
    try:
        reply = OPS[req["op"]](req)
    except KeyError as err:
        reply = {"ok": False, "error": "bad request: missing %s" % err}
    except Exception as err:  # one bad request must never stop the node's probe
        reply = {"ok": False, "error": "%s: %s" % (type(err).__name__, err)}
    reply.update({"type": "reply", "id": req.get("id")})
    emit(reply)


def hello():
    facts = HARDWARE.facts()
    first = HARDWARE.snapshot()
    return {"type": "hello", "hostname": socket.gethostname(), "pid": os.getpid(),
            "python": sys.version.split()[0], "uid": os.getuid(), "node_dir": NODE_DIR,
            "head": HEAD, "max_job": max([int(j) for j in _listdir(JOBS_DIR) if j.isdigit()] or [0]),
            # What jobs may run in here: container runtimes, conda tools (node_containers.py).
            "runtimes": container_runtimes(), "conda": conda_tools(CONFIG.get("conda_lookup")),
            # The hardware: what serves it, its devices (static facts such as the base
            # clock R19 compares with, and PCIe links R9 weighs), versions and links.
            "backends": HARDWARE.backends(), "hardware_notes": list(HARDWARE.notes),
            "devices": first["devices"], "problems": first["problems"],
            "driver_version": facts.get("driver_version"),
            "cuda_version": facts.get("cuda_version"), "links": facts.get("links") or {},
            "platform": platform(), "t": time.time()}


_TMUX_VERSION = []


def tmux_version():
    """(major, minor) of this node's tmux, (0, 0) when it says none; asked once."""
    if not _TMUX_VERSION:
        _, out, _ = run([TMUX[0], "-V"])
        found = re.search(r"(\d+)\.(\d+)", out)
        _TMUX_VERSION.append((int(found.group(1)), int(found.group(2))) if found else (0, 0))
    return _TMUX_VERSION[0]


def tmux_execs_argv():
    """Whether this tmux (3.0 and later) runs a command given as several words itself,
    without a shell around it: one process fewer before every job starts."""
    return tmux_version() >= (3, 0)


def keep_tmux_server():
    """Keep our tmux server up between jobs.

    By default a tmux server exits with its last session; a launch racing that exit fails
    with "server exited unexpectedly". One long-lived server per node avoids the race.
    """
    # Jobs are started as `sh run.sh`: no need for the login shell's start-up around it.
    run(TMUX + ["start-server", ";", "set-option", "-s", "exit-empty", "off",
                ";", "set-option", "-g", "default-shell", "/bin/sh"])


#: the umask jobs get (the wrapper's $2), read once before any thread starts: reading
#: it means setting it, which would race with another thread's new file
JOB_UMASK = "0022"


def main():
    global HARDWARE, JOB_UMASK
    mask = os.umask(0o077)
    os.umask(mask)
    JOB_UMASK = "%04o" % mask
    for path in (NODE_DIR, HEADS_DIR, os.path.dirname(JOBS_DIR), JOBS_DIR):
        _make_private_dir(path)  # makedirs gives its mode to the last directory only
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
