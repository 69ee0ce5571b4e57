"""The watcher of the node's job directories (node side; shipped with the nodelet, stdlib
only, Python 3.6+): each attempt's start and exit reported once, as soon as its marker file
appears; what a starting job does (its phase); a log its tee stopped writing ended with a
line saying so. Runs the cleaner now and then.
"""

import os
import time

from .cleaner import CLEAN_EVERY_S, clean_old_attempts
from .job_dirs import attempt_dir, attempts
from .mount_pins import release_pins
from .node_base import INTERVAL, JOBS_DIR, emit, int_or_none, mtime, read_text, tmux_sessions


WATCH_EVERY = 0.02  # seconds between looks for started/ended jobs: ends are reported at once
PHASE_EVERY = 0.25  # seconds between looks at what starting jobs are doing (for display)
#: An exit is reported once the wrapper's tee has written the job's last output to its log
#: (``logged``), or this long (seconds) after the exit code when it has not: a process the
#: job left behind holding its output keeps tee open, and must not keep the job running.
LOG_GRACE_S = 0.5


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
        self.tokens = {}  # (job, attempt) -> its token, read once: a launch writes it once

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
        # A look every 20 ms at each running attempt reads its exit code and nothing else:
        # the ack is looked for until the start is seen and before an exit is said (an
        # attempt the head acked already is never reported again), the token read once.
        if key not in self.started and self._acked(key, d):
            return
        token = self.tokens.get(key)
        if token is None:
            token = read_text(os.path.join(d, "token"))
            if token is not None:
                self.tokens[key] = token
        if key not in self.started and os.path.exists(os.path.join(d, "started")):
            self.started.add(key)
            emit({"type": "started", "job": job, "attempt": attempt, "token": token,
                  "t": mtime(os.path.join(d, "started")),
                  "workdir": read_text(os.path.join(d, "workdir")) or None})
        code_text = read_text(os.path.join(d, "exit_code"))
        if code_text is not None and code_text.strip():
            if not os.path.exists(os.path.join(d, "logged")) \
                    and time.time() - mtime(os.path.join(d, "exit_code")) < LOG_GRACE_S:
                return  # the log is not whole yet: a `wait` then `logs` would read it short
            if self._acked(key, d):
                return
            self.ended.add(key)
            self.tokens.pop(key, None)
            # A wrapper that ended before its own release (a launch that failed after its
            # data mounts were pinned) leaves no staging mount behind it.
            release_pins(os.path.join(d, "mnt"))
            self.phases.pop(key, None)
            self.look_log_cut(job, d)  # a cut just before the end is said before the exit
            emit({"type": "exit", "job": job, "attempt": attempt, "code": int_or_none(code_text),
                  "token": token, "t": mtime(os.path.join(d, "exit_code")),
                  "reason": (read_text(os.path.join(d, "reason")) or "").strip()[:500]})
            return
        if phases and key in self.started:
            self.look_phase(key, d, token)
            self.look_log_cut(job, d)
        if sessions is not None and _launched_before(d, self.last_session_check) and (
                not latest or job not in sessions):
            # The session is gone (an older attempt's was stopped for its relaunch) but left
            # no exit code: killed, or the node rebooted.
            if read_text(os.path.join(d, "exit_code")) is None and not self._acked(key, d):
                self.ended.add(key)
                self.tokens.pop(key, None)
                release_pins(os.path.join(d, "mnt"))  # the wrapper killed before its release
                emit({"type": "exit", "job": job, "attempt": attempt, "code": None,
                      "token": token, "t": time.time()})

    def _acked(self, key, d):
        """Whether the head acknowledged this attempt's end (then it is not looked at again)."""
        if not os.path.exists(os.path.join(d, "acked")):
            return False
        self.ended.add(key)
        self.tokens.pop(key, None)
        self.phases.pop(key, None)
        return True

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
        self.tokens.pop((job, attempt), None)
        self.finished.discard(job)


def _size_words(size):
    """A size for people: 1 MiB, 10 GiB, 1.5 GiB."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return ("%.1f %s" % (size / scale, unit)).replace(".0 ", " ")
    return "%d bytes" % size


def _launched_before(d, moment):
    try:
        return os.stat(os.path.join(d, "launched")).st_mtime < moment
    except OSError:
        return False


WATCHER = Watcher()
