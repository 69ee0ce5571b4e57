"""The head's requests on the node (node side; shipped with the nodelet, stdlib only, Python
3.6+): launch, cancel, ack, log, note, list, signal, selftest and reset, each answered with
one reply (the nodelet's docstring lists their fields).
"""

import errno
import json
import os
import pwd
import shlex
import signal
import subprocess
import time

from .attribution import descendants, job_processes
from .job_dirs import (
    attempt_dir, attempts, job_id, job_lock, job_root, latest_dir, make_private_dir,
    parse_token)
from .mount_pins import release_pins
from .node_base import (
    HEAD, JOBS_DIR, LOCKS_DIR, NODE_DIR, SERVER_GONE, emit, exact, int_or_none,
    keep_tmux_server, list_dir, locked_session, mtime, read_text, run, session_name,
    session_pids, tmux, tmux_execs_argv, tmux_sessions, tmux_unseen, write_atomic,
    write_mark)
from .node_containers import container_remove, container_signal, container_stop
from .watcher import WATCHER


SELFTEST_TIMEOUT = 600  # dcgmi diag -r 1 takes about a minute; a configured test may take more
MAX_LOG_READ = 1 << 20  # bytes one log request returns at most


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
        write_mark(os.path.join(d, "launched"))
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
    make_private_dir(job_root(job))
    make_private_dir(d)
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
    if code != 0 and any(gone in err for gone in SERVER_GONE):
        keep_tmux_server()  # someone killed the server meanwhile: start it again, once
        code, _, err = tmux_unseen(argv)
    if code != 0:
        session = tmux_sessions().get(job) if "duplicate session" in err else None
        if session in (token, ""):
            # the session is the idempotency key: this launch happened already
            write_mark(os.path.join(d, "launched"))
            return {"ok": True, "already": True}
        if session is not None:
            return _taken(name, session)
        return {"ok": False, "error": "tmux new-session failed: %s" % err.strip()}
    write_mark(os.path.join(d, "launched"))
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


#: in an acked attempt's directory: the end the head recorded (state, reason, when), which
#: a head restored from an older backup settles the job from
ENDED_AS = "ended_as"


def op_ack(req):
    """The head recorded these exits: ``jobs`` is a list of [job, token] or [job, token,
    end] (each names one attempt, so a late ack can never silence a relaunch of the same
    job; ``end``: the state, reason and time the head recorded, kept as ``ended_as``)."""
    for item in req["jobs"]:
        job, token = item[0], item[1]
        parsed = parse_token(token)
        if parsed is None or parsed[0] != HEAD:
            continue
        d = attempt_dir(job_id(job), parsed[1])
        if read_text(os.path.join(d, "token")) == token:
            end = item[2] if len(item) > 2 and isinstance(item[2], dict) else None
            if end is not None:  # first: an ack is never without the end it acknowledges
                write_atomic(os.path.join(d, ENDED_AS), json.dumps(end)[:2000])
            write_mark(os.path.join(d, "acked"))
    return {"ok": True}


def _ended_as(d):
    try:
        end = json.loads(read_text(os.path.join(d, ENDED_AS)) or "null")
    except ValueError:
        return None
    return end if isinstance(end, dict) else None


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
        "started_at": mtime(os.path.join(d, "started")) if os.path.exists(os.path.join(d, "started")) else None,
        "exit_code": int_or_none(read_text(os.path.join(d, "exit_code")) or "x"),
        "ended_at": mtime(os.path.join(d, "exit_code")) if os.path.exists(os.path.join(d, "exit_code")) else None,
        "acked": os.path.exists(os.path.join(d, "acked")),
        "ended_as": _ended_as(d),
    }
    if with_record:
        try:
            info["record"] = json.loads(read_text(os.path.join(d, "launch.json")) or "null")
        except ValueError:
            info["record"] = None
        info["reason"] = (read_text(os.path.join(d, "reason")) or "").strip()[:500]
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
    carries the record its launch left (``launch.json``) and why its part could not start
    (``reason``, "" if it did)."""
    jobs, every = {}, {}
    with_records = bool(req.get("records"))
    for job in list_dir(JOBS_DIR):
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


USR1_SENT = "usr1-sent"  # in an attempt's directory: it got its SIGUSR1 (op_signal's "once")


def op_signal(req):
    """USR1 (checkpoint now) or TERM to the job's processes; KILL ends everything of the
    job, its tmux session included. ``alive``: whether the session is still there.

    A USR1 with ``once`` goes only if this attempt never got one: a head that stored its
    stop and died before (or while) sending it asks again after its restart, and the job
    neither misses its checkpoint nor gets two. ``first``: whether this USR1 was its first.
    The mark is written after the signal: a nodelet killed between the two sends it twice,
    never not at all."""
    job = job_id(req["job"])
    name = str(req.get("signal", "")).upper().replace("SIG", "")
    if name not in _SIGNALS:
        return {"ok": False, "error": "signal must be one of %s" % ", ".join(sorted(_SIGNALS))}
    jobdir = latest_dir(job)
    mark = os.path.join(jobdir, USR1_SENT) if jobdir is not None and name == "USR1" else None
    first = mark is not None and not os.path.exists(mark)
    if mark is not None and not first and req.get("once"):
        return {"ok": True, "pids": [], "alive": job in tmux_sessions(), "first": False}
    if name == "KILL":
        panes = session_pids(job)
        pids = descendants(panes) + panes
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        tmux(["kill-session", "-t", exact(session_name(job))])
        # The head ends or requeues this attempt itself: its exit is not reported, so no
        # late report (and ack) can meet a relaunch of the job in the same directory.
        if jobdir is not None:
            container_remove(jobdir)
            release_pins(os.path.join(jobdir, "mnt"))
            write_mark(os.path.join(jobdir, "acked"))
            WATCHER.ended.add((job, int(os.path.basename(jobdir))))
    elif container_signal(jobdir or "", name):
        pids = []  # the container's main process got it (its init passes it on)
    else:
        pids = job_processes(job)
        for pid in pids:
            try:
                os.kill(pid, _SIGNALS[name])
            except OSError:
                pass
    if first:
        try:
            write_atomic(mark, str(time.time()))
        except OSError:
            pass  # its directory went with the job: nothing is left to signal
    return {"ok": True, "pids": pids, "alive": job in tmux_sessions(), "first": first}


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


#: the umask jobs get (the wrapper's $2), read once before any thread starts: reading
#: it means setting it, which would race with another thread's new file
JOB_UMASK = "0022"
