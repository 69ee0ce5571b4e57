"""What every part of the nodelet shares: its settings, the JSON-lines channel to the head,
commands run from argv lists, and this head's tmux server with its job sessions (node side;
shipped with the nodelet, stdlib only, Python 3.6+).

The settings are the nodelet's first argument (JSON, from the head), read once when this
module is first imported on the node.
"""

import errno
import json
import os
import re
import subprocess
import sys
import threading
import time

from .tmux_control import TmuxControl, tmux_words


CONFIG = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
INTERVAL = float(CONFIG.get("interval", 5.0))
NODE_DIR = os.path.expanduser(os.environ.get("NEBULA_NODE_DIR") or "~/.nebula-node")
SAFE_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

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
if not SAFE_NAME.match(HEAD):
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
SERVER_GONE = ("server exited unexpectedly", "no server running", "error connecting to")


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


def write_mark(path):
    """A mark whose being there (and mtime) is what counts, never its text (``launched``,
    ``acked``): written in place, without write_atomic's second file and rename."""
    text = str(time.time())
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    except OSError as err:
        if err.errno != errno.ELOOP:
            raise
        return write_atomic(path, text)  # a link in its place is replaced, never followed
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


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


def list_dir(path):
    try:
        return os.listdir(path)
    except OSError:
        return []


def mtime(path):
    try:
        return os.stat(path).st_mtime
    except OSError:
        return time.time()


def int_or_none(text):
    try:
        return int(text.strip())
    except ValueError:
        return None


#: ``"tmux_control": true`` in the settings: tmux commands through one control client
#: (tmux_control.py; bench/nodelet.py compares the two). Off unless asked: with it, the
#: chaos test (the head killed 20 times while 200 jobs flow) still lost a running job's
#: session now and then, and never without it; until that is understood, every tmux
#: command is a process of its own.
CONTROL = TmuxControl(TMUX, CONTROL_SESSION, lambda: keep_tmux_server()) \
    if CONFIG.get("tmux_control", False) else None


def session_pids(job):
    code, out, _ = tmux(["list-panes", "-s", "-t", exact(session_name(job)), "-F", "#{pane_pid}"])
    return [int(p) for p in out.split() if p.isdigit()] if code == 0 else []


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
