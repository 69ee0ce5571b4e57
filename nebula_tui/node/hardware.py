"""The node's hardware layer: which vendors' devices this node has, read as one kind of reading.

A *backend* reads one vendor's devices through one library or tool. Its four operations:

``initialize()``  find and open what it needs, once (NVML's handles, the tool's path, the
                  device list); raises :class:`Unavailable` with a one-line reason.
``status()``      one vendor-neutral reading (``backends.reading``) per device, now.
``processes()``   the processes holding memory on its devices (``reading.new_process``);
                  a backend whose tool's process table cannot be believed sets
                  ``unreadable`` (why) instead: its devices' lists are then unknown.
``cleanup()``     release what ``initialize`` opened.

Backends may also offer ``facts()`` (driver and CUDA versions, the link matrix as
``{"GPU0": {"GPU1": "NV4"}}`` by the vendor's device numbers), asked once after
``initialize``, and ``watch(report)`` (a thread that calls ``report(device, code)`` for each
critical Xid the library signals).

``registry.REGISTRY`` lists (name, vendor, detector, loader), preferred first per vendor:
a detector is a cheap look (is the tool on PATH?), the loader makes the backend. For each
vendor the first backend that initializes serves it; a node may have several vendors (an
NVIDIA card and an Intel iGPU). :class:`Hardware` keeps one reader thread per backend, so
a tool that hangs or fails costs its own devices only, and gives every device an index
unique on the node; a backend slower to start than the hello may wait joins later.

Travels to the nodes with the nodelet: stdlib only, Python 3.6 syntax, no annotations.
"""

import os
import re
import shutil
import signal
import subprocess
import threading
import time

from .backends import reading as rd

#: How long one tool call may take before it is killed (a wedged driver hangs them).
TOOL_TIMEOUT_S = 10.0
#: A read still running after this long (or two intervals) is a problem of its own, and
#: its devices are left out until it answers (a loaded node's tools can take seconds).
STUCK_S = 5.0
#: Only the first line of a tool's complaint, and at most this much of it, becomes a reason.
REASON_CHARS = 200


class Unavailable(Exception):
    """This backend cannot serve this node; ``str()`` is the one-line reason."""


class ToolError(Exception):
    """A tool run that gave nothing usable: timed out, exited badly, or printed nonsense."""


def one_line(text, limit=REASON_CHARS):
    lines = [line.strip() for line in (text or "").strip().splitlines() if line.strip()]
    return (lines[0] if lines else "")[:limit]


def run_tool(argv, timeout=None):
    """(exit code, stdout, stderr) of argv in its own process group; a tool still running
    after ``timeout`` (default TOOL_TIMEOUT_S) is killed with everything it started and
    raises ToolError. A tool that is not there raises ToolError too."""
    timeout = TOOL_TIMEOUT_S if timeout is None else timeout
    try:
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, universal_newlines=True,
                                 errors="replace", start_new_session=True)
    except OSError as err:
        raise ToolError("%s: %s" % (argv[0], err.strerror or err))
    try:
        out, err = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except OSError:
            pass
        child.communicate()
        raise ToolError("%s did not answer within %gs (killed)" % (os.path.basename(argv[0]), timeout))
    return child.returncode, out, err


def checked(argv, timeout=None, ok=(0,)):
    """stdout of argv; ToolError naming the exit code and the tool's first line otherwise."""
    code, out, err = run_tool(argv, timeout)
    if code not in ok:
        raise ToolError("%s exited with %d%s" % (os.path.basename(argv[0]), code,
                                                 (": " + one_line(err or out)) if (err or out).strip() else ""))
    return out


def which(tool):
    return shutil.which(tool)


def on_path(tool):
    """A detector: whether ``tool`` is on this node's PATH."""
    return lambda: which(tool) is not None


#: What no row of a tool's table holds inside a name: a control character (a line break
#: starts a row of its own) or a column bar.
_ROW_BREAKING_RE = re.compile(r"[\x00-\x1f\x7f|]")


def _proc_text(path):
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError:
        return None


def process_name(pid):
    """A process's name as /proc gives it (its argv[0]); None when it is gone or hidden."""
    cmdline = _proc_text("/proc/%d/cmdline" % pid)
    first = cmdline.split(b"\0", 1)[0] if cmdline else b""
    return first.decode("utf-8", "replace") or None


def vouched(processes, tool):
    """The processes a tool's text table listed, believed only as far as /proc agrees:
    (processes, None), each a live process on this node named from /proc (a row whose pid is
    gone is dropped), or ([], why) when the table cannot be believed at all: a process it
    lists has a name (argv[0] or comm, its own to set) that can make rows of their own in
    it, or one device lists one pid twice (see ``reading.UNREADABLE``)."""
    kept, seen = [], set()
    for process in processes:
        pid = process.get("pid")
        if not isinstance(pid, int) or pid <= 0 or not os.path.isdir("/proc/%d" % pid):
            continue
        key = (process.get("gpu_uuid"), pid)
        names = [_proc_text("/proc/%d/%s" % (pid, part)) or b"" for part in ("cmdline", "comm")]
        argv0, comm = names[0].split(b"\0", 1)[0], names[1].rstrip(b"\n")
        if key in seen:
            return [], ("%s's process list is unreadable: it lists process %d twice on one "
                        "device; none of its processes is believed" % (tool, pid))
        if _ROW_BREAKING_RE.search(argv0.decode("latin-1")) or _ROW_BREAKING_RE.search(comm.decode("latin-1")):
            return [], ("%s's process list is unreadable: process %d's name holds a line break "
                        "or a column bar, which can make rows of their own; none of its "
                        "processes is believed" % (tool, pid))
        seen.add(key)
        kept.append(dict(process, name=argv0.decode("utf-8", "replace") or None))
    return kept, None


class Backend(object):
    """What every backend has; see the module docstring for the four operations."""

    name = "backend"
    vendor = None
    #: why the last processes() could not be believed (a text table a name broke), or None
    unreadable = None

    def initialize(self):
        raise NotImplementedError

    def status(self):
        raise NotImplementedError

    def processes(self):
        return []

    def cleanup(self):
        pass

    def facts(self):
        return {}


class OneRunBackend(Backend):
    """A backend whose tool prints every device and its processes in one run per probe.

    Subclasses name the run (``argv``), what it lists (``things``) and ``parse(out)`` ->
    (readings, processes, facts), raising ValueError for output they cannot read.
    """

    argv = ()
    things = "GPU"

    def __init__(self):
        self._processes = []
        self._facts = {}

    def initialize(self):
        if not self.status():
            raise Unavailable("%s lists no %s" % (self.name, self.things))

    def parse(self, out):
        raise NotImplementedError

    def status(self):
        out = checked(list(self.argv))
        try:
            readings, self._processes, self._facts = self.parse(out)
        except ValueError as err:
            raise ToolError("%s printed what it does not read (%s): %s"
                            % (self.name, one_line(str(err), 80), one_line(out)))
        if not readings:
            raise ToolError("%s printed no %s it can read: %s" % (self.name, self.things, one_line(out)))
        return readings

    def processes(self):
        """From the same run as status(): its table's processes as /proc vouches for them."""
        self.unreadable = self._facts.get(rd.UNREADABLE)
        if self.unreadable:
            return []
        found, self.unreadable = vouched(self._processes, self.name)
        return found

    def facts(self):
        return {"driver_version": self._facts.get("driver_version")}


def links_from(argv, parse):
    """The link matrix a tool prints, asked once: ``parse(out)`` -> links; {} without the
    tool or when it cannot say."""
    if not which(argv[0]):
        return {}
    try:
        return parse(checked(argv))
    except (ToolError, ValueError, KeyError):
        return {}


class _Reader(object):
    """One backend's devices, read in a thread of their own every interval."""

    def __init__(self, backend, interval):
        self.backend = backend
        self.interval = interval
        self.devices = []
        self.processes = []
        self.error = ""
        self.warnings = []  # what the last read said besides its devices (a lost GPU)
        self.unreadable = None  # why its devices' process lists are unknown, if they are
        self.read_at = None  # time.time() of the last finished read
        self.busy_since = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None

    def read_once(self):
        started = time.time()
        self.busy_since = started
        warnings = []
        try:
            devices = self.backend.status()
            processes = self.backend.processes()
            unreadable = getattr(self.backend, "unreadable", None)
            warnings = list(getattr(self.backend, "warnings", None) or [])
            error = ""
        except (ToolError, Unavailable) as err:
            devices, processes, unreadable, error = None, None, None, str(err)
        except Exception as err:  # a backend's bug must cost its devices, never the nodelet
            devices, processes, unreadable, error = None, None, None, "%s: %s: %s" % (
                self.backend.name, type(err).__name__, one_line(str(err)))
        with self._lock:
            if devices is not None:
                self.devices, self.processes, self.unreadable = devices, processes, unreadable
            self.error = error
            self.warnings = warnings
            self.read_at = time.time()
            self.busy_since = None

    def start(self):
        self._thread = threading.Thread(target=self._loop, name="read-%s" % self.backend.name)
        self._thread.daemon = True
        self._thread.start()

    def _loop(self):
        while not self._stop.is_set():
            started = time.time()
            self.read_once()
            self._stop.wait(max(0.05, self.interval - (time.time() - started)))

    def stop(self):
        self._stop.set()

    def latest(self):
        """(devices, processes, problems, unreadable) as last read; a read stuck past
        STUCK_S is a problem of its own, and its devices are dropped until it answers.
        ``unreadable``: whether the devices' process lists are unknown (the reason is
        among the problems)."""
        with self._lock:
            devices, processes, error = list(self.devices), list(self.processes), self.error
            warnings, busy, unreadable = list(self.warnings), self.busy_since, self.unreadable
        if busy is not None and time.time() - busy > max(2 * self.interval, STUCK_S):
            return [], [], ["%s has not answered for %.0fs" % (self.backend.name, time.time() - busy)], False
        if error:
            return [], [], [error], False
        return devices, processes, warnings + ([unreadable] if unreadable else []), bool(unreadable)


class Hardware(object):
    """Every backend this node has, read together.

    ``start()`` detects and initializes (each backend in a thread of its own, so one that
    hangs delays nothing past ``init_wait``), ``snapshot()`` gives what a probe sends:
    ``{"devices", "processes", "problems", "clamped", "unreadable"}`` (the uuids of
    devices whose process lists are unknown). Device indices are unique on the
    node and kept for the life of the process: a vendor's devices take the numbers after
    the vendors listed before it, MIG instances the numbers after every card.
    """

    def __init__(self, backends, interval=5.0, init_wait=8.0):
        self.interval = interval
        self.init_wait = init_wait
        self._candidates = list(backends)  # [(name, vendor, detector, loader)]
        self.readers = []
        self._lock = threading.Lock()  # readers, notes and indices change when one joins late
        self.notes = []  # why a preferred backend is not used ("nvml: …; using nvidia-smi")
        self._unused = []  # why the vendors without a backend have none
        self._index = {}  # uuid -> node index
        self._bases = {}  # vendor -> first index of its cards
        self._clamped = set()  # (uuid, field) shown clamped, reported once per episode
        self._facts = {}

    # -------------------------------------------------------------- detection
    def start(self):
        """Detect and initialize every vendor's backend, each in a thread of its own; return
        once all are done or ``init_wait`` has passed. A vendor still starting then says so
        and joins when it is ready (its links miss the hello; its devices do not)."""
        by_vendor = []
        for name, vendor, detector, loader in self._candidates:
            if not by_vendor or by_vendor[-1][0] != vendor:
                by_vendor.append((vendor, []))
            by_vendor[-1][1].append((name, detector, loader))
        results = {}
        threads = []
        for vendor, options in by_vendor:
            thread = threading.Thread(target=self._choose, args=(vendor, options, results),
                                      name="init-%s" % vendor)
            thread.daemon = True
            thread.start()
            threads.append((vendor, options, thread))
        deadline = time.time() + self.init_wait
        for _, _, thread in threads:
            thread.join(max(0.0, deadline - time.time()))
        late = []
        for vendor, options, thread in threads:
            if thread.is_alive():
                waiting = "%s did not answer within %gs" % (options[0][0], self.init_wait)
                self._unused.append(waiting)
                late.append((vendor, thread, waiting))
            else:
                self._join(vendor, results, start=False)
        for reader in self.readers:
            reader.start()
        if late:
            joiner = threading.Thread(target=self._join_late, args=(late, results), name="init-late")
            joiner.daemon = True
            joiner.start()

    def _join(self, vendor, results, start=True):
        chosen, notes = results.get(vendor, (None, []))
        reader = None
        if chosen is not None:
            reader = _Reader(chosen, self.interval)
            reader.read_once()
            facts = _safe_facts(chosen)
        with self._lock:
            (self.notes if chosen is not None else self._unused).extend(notes)
            if reader is not None:
                self._facts[chosen.name] = facts
                self._bases[vendor] = self._cards_end()
                self.readers.append(reader)
        if reader is not None and start:
            reader.start()

    def _join_late(self, late, results):
        for vendor, thread, waiting in late:
            thread.join()
            with self._lock:
                self._unused.remove(waiting)
            self._join(vendor, results)

    @staticmethod
    def _choose(vendor, options, results):
        notes = []
        for name, detector, loader in options:
            try:
                present = detector()
            except Exception as err:  # a detector must never stop the others
                notes.append("%s: %s" % (name, one_line(str(err))))
                continue
            if not present:
                continue
            backend = loader()
            try:
                backend.initialize()
            except (Unavailable, ToolError) as err:
                notes.append("%s: %s" % (name, one_line(str(err))))
                continue
            except Exception as err:
                notes.append("%s: %s: %s" % (name, type(err).__name__, one_line(str(err))))
                continue
            if notes:
                notes = ["%s; using %s" % ("; ".join(notes), name)]
            results[vendor] = (backend, notes)
            return
        results[vendor] = (None, notes)

    def backends(self):
        """[{"name", "vendor"}] of the backends in use, for the hello."""
        return [{"name": r.backend.name, "vendor": r.backend.vendor} for r in self.readers]

    def why_no_devices(self):
        """The node's reason when no backend serves it (up, with 0 GPUs)."""
        if self._unused:
            return "no GPU tool answered: %s" % "; ".join(self._unused)
        looked = ", ".join(name for name, _, _, _ in self._candidates)
        return "no GPU tool found (looked for %s)" % looked.replace("nvml", "libnvidia-ml")

    # -------------------------------------------------------------- reading
    def _number(self, device):
        uuid = device.get("uuid") or "%s@%s" % (device.get("vendor"), device.get("pci_bus_id"))
        known = self._index.get(uuid)
        if known is not None:
            return known
        taken = set(self._index.values())
        wanted = None
        own = device.get("index")
        if not device.get("parent_uuid") and isinstance(own, int):
            wanted = self._bases.get(device.get("vendor"), 0) + own
        if wanted is None or wanted in taken:
            wanted = max(taken | set([self._cards_end() - 1])) + 1
        self._index[uuid] = wanted
        return wanted

    def _cards_end(self):
        return sum(len([d for d in r.devices if not d.get("parent_uuid")]) for r in self.readers)

    def snapshot(self):
        """What one probe sends: devices (node indices), processes, problems, clamped."""
        with self._lock:
            return self._snapshot()

    def _snapshot(self):
        devices, processes, problems, clamped, unreadable = [], [], [], [], []
        seen = set()
        for reader in self.readers:
            found, procs, said, unknown = reader.latest()
            problems.extend(said)
            if unknown:
                unreadable.extend(d.get("uuid") for d in found if d.get("uuid"))
            for device in found:
                device = dict(device)
                device["index"] = self._number(device)
                for change in rd.clamp(device):
                    key = (device.get("uuid"), change["field"])
                    seen.add(key)
                    if key not in self._clamped:
                        self._clamped.add(key)
                        change.update(uuid=device.get("uuid"), index=device["index"])
                        clamped.append(change)
                devices.append(device)
            processes.extend(procs)
        self._clamped &= seen  # a value that reads right again ends its episode
        if not self.readers:
            problems.append(self.why_no_devices())
        else:
            problems.extend(self._unused)  # a vendor whose tool is here but failed
        devices.sort(key=lambda d: d["index"])
        return {"devices": devices, "processes": processes, "problems": problems,
                "clamped": clamped, "unreadable": unreadable}

    def facts(self):
        """Driver/CUDA versions and the links by node index, for the hello."""
        with self._lock:
            return self._merged_facts()

    def _merged_facts(self):
        merged = {"links": {}}
        for reader in self.readers:
            facts = self._facts.get(reader.backend.name) or {}
            for key, value in facts.items():
                if key == "links":
                    merged["links"].update(self._renumber_links(reader, value))
                elif value is not None and key not in merged:
                    merged[key] = value
        return merged

    def _renumber_links(self, reader, links):
        """A vendor's ``GPUn`` (its own numbers) -> the node's ``GPUm``."""
        by_own = {}
        for device in reader.devices:
            if not device.get("parent_uuid") and isinstance(device.get("index"), int):
                by_own["GPU%d" % device["index"]] = "GPU%d" % self._number(device)
        return {by_own.get(row, row): {by_own.get(col, col): code for col, code in cells.items()}
                for row, cells in links.items() if row in by_own}

    def watch(self, report):
        """Start each backend's event watcher, if it has one (NVML's critical Xids)."""
        for reader in self.readers:
            watch = getattr(reader.backend, "watch", None)
            if watch is not None:
                thread = threading.Thread(target=watch, args=(report,), name="watch-%s" % reader.backend.name)
                thread.daemon = True
                thread.start()

    def cleanup(self):
        for reader in self.readers:
            reader.stop()
            try:
                reader.backend.cleanup()
            except Exception:
                pass


def _safe_facts(backend):
    try:
        return backend.facts() or {}
    except Exception:
        return {}
