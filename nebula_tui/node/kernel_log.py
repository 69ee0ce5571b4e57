"""The kernel log read on the node (R16; node side, shipped with the nodelet, stdlib only,
Python 3.6+): the lines logged since the last look, sent to the head as ``kmsg`` messages;
an Xid NVML told already is not told again. The cursor (kmsg_cursor.py) survives restarts.
"""

import json
import os
import re
import threading
import time

from .attribution import pids_to_jobs
from .kmsg_cursor import new_lines
from .node_base import NODE_DIR, emit, read_text, run, write_atomic


KMSG_CURSOR = os.path.join(NODE_DIR, "kmsg-cursor.json")

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
