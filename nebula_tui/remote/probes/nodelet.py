"""The node side of NebulaGrid: sent over SSH stdin, run by the node's python3, never installed.

The head starts one of these per node over its persistent SSH connection and keeps it
running. It speaks JSON lines both ways (stdlib only, Python 3.6+):

node -> head
  {"type": "hello", ...}                       once, with host facts and `nvidia-smi topo -m`
  {"type": "probe", "t", "gpu_csv", "apps_csv", "pid_jobs", "error"}   every interval (R15)
  {"type": "started", "job", "t"}              a job's wrapper began (first line of its log)
  {"type": "exit", "job", "code", "t"}         a job ended (code null: it vanished)
  {"type": "reply", "id", "ok", ...}           the answer to one request
head -> node
  {"id", "op": "launch", "job", "token", "script"}  write the job's run.sh, start its tmux session
  {"id", "op": "cancel", "job", "grace"}       SIGTERM the job's processes, kill the session after grace
  {"id", "op": "ack", "jobs"}                  the head recorded these exits; stop reporting them
  {"id", "op": "log", "job", "offset", "limit"}  read part of the job's output log
  {"id", "op": "list"}                         every job directory and tmux session (reconcile)

No user string is ever given to a shell here: the run script was quoted by the head, and
every command below runs from an argv list.
"""

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time

CONFIG = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
INTERVAL = float(CONFIG.get("interval", 5.0))
GPU_ARGV = CONFIG.get("gpu_argv") or []
APPS_ARGV = CONFIG.get("apps_argv") or []
TMUX = ["tmux", "-L", CONFIG.get("tmux_socket", "nebula")]
NODE_DIR = os.path.expanduser(os.environ.get("NEBULA_NODE_DIR") or "~/.nebula-node")
JOBS_DIR = os.path.join(NODE_DIR, "jobs")
WATCH_EVERY = 0.02  # seconds between looks for started/ended jobs: ends are reported at once

_out_lock = threading.Lock()


def emit(message):
    line = json.dumps(message, separators=(",", ":"))
    with _out_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def run(argv, timeout=20):
    """(exit code, stdout, stderr) of argv; a missing tool is exit code 127."""
    try:
        done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              timeout=timeout, universal_newlines=True)
        return done.returncode, done.stdout, done.stderr
    except FileNotFoundError:
        return 127, "", "%s: command not found" % argv[0]
    except subprocess.TimeoutExpired:
        return 124, "", "%s timed out after %ss" % (argv[0], timeout)


def session_name(job):
    return "nebula-%s" % job


def exact(name):
    """A tmux target matching only this session: a bare name also matches by prefix
    (nebula-1 would find nebula-12)."""
    return "=" + name


def job_dir(job):
    return os.path.join(JOBS_DIR, str(job))


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
    code, out, _ = run(TMUX + ["list-sessions", "-F", "#{session_name}"])
    if code != 0:  # no server running means no sessions
        return set()
    return set(out.split())


def pids_to_jobs(pids):
    """Which of these pids belong to a NebulaGrid job (from their environment)."""
    found = {}
    for pid in pids:
        data = None
        try:
            with open("/proc/%d/environ" % pid, "rb") as f:
                data = f.read()
        except (OSError, ValueError):
            continue
        for item in data.split(b"\0"):
            if item.startswith(b"NEBULA_JOB_ID="):
                found[str(pid)] = item.split(b"=", 1)[1].decode("ascii", "replace")
                break
    return found


def pids_in_apps_csv(text):
    pids = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) > 1 and parts[1].isdigit():
            pids.append(int(parts[1]))
    return pids


# ------------------------------------------------------------------------ probe
def probe_once():
    message = {"type": "probe", "t": time.time(), "error": ""}
    if GPU_ARGV:
        code, out, err = run(GPU_ARGV)
        message["gpu_csv"] = out
        if code != 0:
            message["error"] = (err or out).strip()[:500] or "exit code %d" % code
    if APPS_ARGV:
        code, out, _ = run(APPS_ARGV)
        message["apps_csv"] = out if code == 0 else ""
        message["pid_jobs"] = pids_to_jobs(pids_in_apps_csv(message["apps_csv"]))
    return message


def probe_loop():
    while True:
        started = time.time()
        emit(probe_once())
        time.sleep(max(0.05, INTERVAL - (time.time() - started)))


# ---------------------------------------------------------------------- watcher
class Watcher:
    """Reports each job's start and exit once, as soon as its marker file appears."""

    def __init__(self):
        self.started = set()
        self.ended = set()
        self.last_session_check = 0.0

    def loop(self):
        while True:
            self.look()
            time.sleep(WATCH_EVERY)

    def look(self):
        try:
            names = os.listdir(JOBS_DIR)
        except OSError:
            return
        sessions = None
        if time.time() - self.last_session_check > INTERVAL:
            # Listed before the directories are read: a job launched after this moment
            # is judged at the next check, never as "vanished" by a stale list.
            self.last_session_check = time.time()
            sessions = tmux_sessions()
        for job in names:
            if job in self.ended:
                continue
            d = job_dir(job)
            if os.path.exists(os.path.join(d, "acked")):
                self.ended.add(job)
                continue
            if job not in self.started and os.path.exists(os.path.join(d, "started")):
                self.started.add(job)
                emit({"type": "started", "job": job, "token": read_text(os.path.join(d, "token")),
                      "t": _mtime(os.path.join(d, "started"))})
            code_text = read_text(os.path.join(d, "exit_code"))
            if code_text is not None and code_text.strip():
                self.ended.add(job)
                emit({"type": "exit", "job": job, "code": _int(code_text),
                      "token": read_text(os.path.join(d, "token")),
                      "t": _mtime(os.path.join(d, "exit_code"))})
            elif sessions is not None and _launched_before(d, self.last_session_check):
                # The session is gone but left no exit code: killed, or the node rebooted.
                if session_name(job) not in sessions and read_text(os.path.join(d, "exit_code")) is None:
                    self.ended.add(job)
                    emit({"type": "exit", "job": job, "code": None,
                          "token": read_text(os.path.join(d, "token")), "t": time.time()})

    def forget(self, job):
        self.started.discard(job)
        self.ended.discard(job)


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


# --------------------------------------------------------------------- requests
def op_launch(req):
    job = str(int(req["job"]))
    d = job_dir(job)
    name = session_name(job)
    token_file = os.path.join(d, "token")
    if os.path.isdir(d):
        if read_text(token_file) == req["token"] and any(
                os.path.exists(os.path.join(d, marker)) for marker in ("launched", "started", "exit_code")):
            # This very launch happened before (its wrapper left its marks), perhaps by a
            # nodelet that died before it could say so: never run it a second time. A
            # session created but not yet started is caught below as a duplicate.
            write_atomic(os.path.join(d, "launched"), str(time.time()))
            return {"ok": True, "already": True}
        if read_text(token_file) != req["token"]:
            # An earlier attempt of this job (requeued) or another head's job with the same
            # number: the head decided it is stale, so its session goes and its files are
            # kept aside.
            run(TMUX + ["kill-session", "-t", exact(name)])
            os.rename(d, "%s.old-%d" % (d, int(time.time() * 1000)))
    os.makedirs(d, mode=0o700, exist_ok=True)
    WATCHER.forget(job)
    write_atomic(token_file, req["token"])
    script = os.path.join(d, "run.sh")
    write_atomic(script, req["script"], 0o700)
    argv = TMUX + ["new-session", "-d", "-s", name, "-x", "200", "-y", "50",
                   "exec sh %s %s" % (shlex.quote(script), shlex.quote(d))]
    code, _, err = run(argv)
    if code != 0 and "server exited unexpectedly" in err:
        keep_tmux_server()  # someone killed the server meanwhile: start it again, once
        code, _, err = run(argv)
    if code != 0:
        if "duplicate session" in err:  # the session is the idempotency key: launched already
            write_atomic(os.path.join(d, "launched"), str(time.time()))
            return {"ok": True, "already": True}
        return {"ok": False, "error": "tmux new-session failed: %s" % err.strip()}
    write_atomic(os.path.join(d, "launched"), str(time.time()))
    return {"ok": True, "already": False}


def session_pids(job):
    code, out, _ = run(TMUX + ["list-panes", "-s", "-t", exact(session_name(job)), "-F", "#{pane_pid}"])
    return [int(p) for p in out.split() if p.isdigit()] if code == 0 else []


def op_cancel(req):
    job = str(int(req["job"]))
    grace = float(req.get("grace", 10))
    for pid in session_pids(job):
        _signal_group(pid, signal.SIGTERM)
    deadline = time.time() + grace
    while time.time() < deadline and session_name(job) in tmux_sessions():
        time.sleep(0.1)
    if session_name(job) in tmux_sessions():
        run(TMUX + ["kill-session", "-t", exact(session_name(job))])
    return {"ok": True}


def _signal_group(pid, sig):
    try:
        os.killpg(os.getpgid(pid), sig)
    except OSError:
        pass


def op_ack(req):
    for job in req["jobs"]:
        d = job_dir(str(int(job)))
        if os.path.isdir(d):
            write_atomic(os.path.join(d, "acked"), str(time.time()))
    return {"ok": True}


def op_log(req):
    path = os.path.join(job_dir(str(int(req["job"]))), "output.log")
    offset = int(req.get("offset", 0))
    limit = int(req.get("limit", 65536))
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read(limit)
    except OSError:
        return {"ok": True, "exists": False, "data": "", "offset": offset}
    return {"ok": True, "exists": True, "data": data.decode("utf-8", "replace"),
            "offset": offset + len(data)}


def op_list(req):
    jobs = {}
    try:
        names = os.listdir(JOBS_DIR)
    except OSError:
        names = []
    for job in names:
        if not job.isdigit():
            continue
        d = job_dir(job)
        jobs[job] = {
            "token": read_text(os.path.join(d, "token")),
            "launched": os.path.exists(os.path.join(d, "launched")),
            "started": os.path.exists(os.path.join(d, "started")),
            "exit_code": _int(read_text(os.path.join(d, "exit_code")) or "x"),
            "acked": os.path.exists(os.path.join(d, "acked")),
        }
    return {"ok": True, "jobs": jobs, "sessions": sorted(tmux_sessions())}


OPS = {"launch": op_launch, "cancel": op_cancel, "ack": op_ack, "log": op_log, "list": op_list}


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
    tool = GPU_ARGV[:1]
    topo_code, topo, _ = run(tool + ["topo", "-m"]) if tool else (127, "", "")
    table_code, table, _ = run(tool) if tool else (127, "", "")
    return {"type": "hello", "hostname": socket.gethostname(), "pid": os.getpid(),
            "python": sys.version.split()[0], "uid": os.getuid(), "node_dir": NODE_DIR,
            "topo": topo if topo_code == 0 else "", "smi_table": table if table_code == 0 else "",
            "t": time.time()}


def keep_tmux_server():
    """Keep our tmux server up between jobs.

    By default a tmux server exits with its last session; a launch racing that exit fails
    with "server exited unexpectedly". One long-lived server per node avoids the race.
    """
    # Jobs are started as `sh run.sh`: no need for the login shell's start-up around it.
    run(TMUX + ["start-server", ";", "set-option", "-s", "exit-empty", "off",
                ";", "set-option", "-g", "default-shell", "/bin/sh"])


def main():
    os.makedirs(JOBS_DIR, mode=0o700, exist_ok=True)
    keep_tmux_server()
    emit(hello())
    for target in (probe_loop, WATCHER.loop):
        threading.Thread(target=target, daemon=True).start()
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
