"""One tmux control-mode client held open by the nodelet, to run tmux commands without
starting a tmux process for each (part of the nodelet's script: Python 3.6, stdlib only).

A ``tmux`` process per command costs a fork of the nodelet, the client's start and its
handshake with the server: most of what a launch spends on the node besides the job.
In control mode (``tmux -C``) one client reads command lines on its stdin and answers
each command in a block on its stdout::

    %begin <time> <number> 1
    <output lines>
    %end <time> <number> 1        (or %error …, the lines being the error)

The last field is 1 for commands this client sent; notifications (``%sessions-changed``
…) and blocks of other origin come between blocks and are skipped. A line may hold several
commands (``a ; b``), each answering in a block of its own, and tmux drops the rest of a
line after a command that fails; so every request line is followed by a marker command
(``display-message -p <marker>``), and the request's answer is every block up to the
marker's. A control client must be attached to a session: it holds one of its own (one
per head, on each node), whose pane (``cat`` on its own terminal) waits and costs nothing.
It stays when its clients end, for the next nodelet: letting it go with its last client
(``destroy-unattached``) lost running jobs' sessions in the chaos test, when a killed
head's client left just as the next head's attached.

``call`` answers None whenever the client cannot be used (it could not start, died, timed
out, or the words cannot be written on one line); the caller then runs tmux as a process,
exactly as before, so that a missing or odd tmux never stops a launch.
"""

import itertools
import queue
import subprocess
import threading
import time

#: after a failed start, tmux runs as a process for this long before the client is tried again
RETRY_AFTER_S = 5.0


def tmux_words(args):
    """``args`` as one tmux command line: every word single-quoted (the parser takes quoted
    text literally: no ~, $, braces or comments), ``;`` left bare as the separator it is in
    an argv. None when a word cannot go on one line."""
    words = []
    for arg in args:
        if arg == ";":
            words.append(arg)
        elif any(ch in arg for ch in "\n\r\0"):
            return None
        else:
            words.append("'" + arg.replace("'", "'\"'\"'") + "'")
    return " ".join(words)


class TmuxControl(object):
    def __init__(self, tmux, hold_session, prepare):
        self.tmux = list(tmux)        # ["tmux", "-L", socket]
        self.hold = hold_session      # the session this client attaches to
        self.prepare = prepare        # starts the server with its options (keep_tmux_server)
        self.lock = threading.Lock()  # one request on the line at a time
        self.proc = None
        self.answers = None           # blocks of this client's commands, from the reader
        self.failed_at = None
        self.markers = itertools.count(1)

    def call(self, args, timeout=20):
        """(exit code, stdout, stderr) of ``tmux args``, or None: run it as a process."""
        line = tmux_words(args)
        if line is None:
            return None
        with self.lock:
            if not self._ensure():
                return None
            marker = "nebula-answered-%d" % next(self.markers)
            try:
                self.proc.stdin.write(("%s\ndisplay-message -p %s\n" % (line, marker)).encode())
                self.proc.stdin.flush()
            except (OSError, ValueError):
                self._close()
                return None
            out, errors = [], []
            deadline = time.monotonic() + timeout
            while True:
                try:
                    block = self.answers.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    block = None
                if block is None:  # the client ended or stopped answering
                    self._close()
                    return None
                failed, lines = block
                if not failed and lines == [marker]:
                    break
                (errors if failed else out).extend(lines)
            text = "".join(l + "\n" for l in out)
            return (1 if errors else 0), text, "".join(l + "\n" for l in errors)

    def _ensure(self):
        if self.proc is not None and self.proc.poll() is None:
            return True
        self._close()
        if self.failed_at is not None and time.monotonic() - self.failed_at < RETRY_AFTER_S:
            return False
        self.prepare()
        try:
            self.proc = subprocess.Popen(
                self.tmux + ["-C", "new-session", "-A", "-s", self.hold, "-x", "80", "-y", "24",
                             "exec cat"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        except OSError:
            self.failed_at = time.monotonic()
            return False
        self.answers = queue.Queue()
        threading.Thread(target=self._read, args=(self.proc, self.answers), daemon=True).start()
        self.failed_at = None
        return True

    @staticmethod
    def _read(proc, answers):
        """Hand each block of this client's commands to ``answers``; None at the end."""
        lines = None
        for raw in iter(proc.stdout.readline, b""):
            text = raw.decode("utf-8", "replace").rstrip("\n")
            mine = text.endswith(" 1")  # the flags of a block this client's command opened
            if lines is None:
                if mine and text.startswith("%begin "):
                    lines = []
            elif mine and text.startswith(("%end ", "%error ")):
                answers.put((text.startswith("%error "), lines))
                lines = None
            else:
                lines.append(text)
        answers.put(None)

    def _close(self):
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            self.failed_at = time.monotonic()  # it stopped answering: processes for a while
            try:
                proc.kill()  # its stdout ends, and so does the reader
            except OSError:
                pass
        try:
            proc.stdin.close()
        except OSError:
            pass
        proc.wait()
