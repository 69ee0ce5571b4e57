"""What ``nvidia-smi`` prints, as vendor-neutral readings: CSV queries (with or without
header and units, one sample or a ``-l``/``-lms`` loop), the default table, ``-q`` and
``-q -x``. Pure: no I/O.

Every field is parsed on its own, so a ``[N/A]`` or ``[Not Supported]`` (old drivers, laptop
cards, GB10's unified memory) becomes None for that field only and never loses the GPU.
Travels to the nodes with the nodelet (stdlib only, Python 3.6 syntax, no annotations).

Why one module: it is one tool's five output forms read into one reading shape, with
the same throttle bits and the same rule for a missing field; they travel together.
"""

import re
import xml.etree.ElementTree as ElementTree
from collections import OrderedDict

from . import reading as rd

#: What the probe asks ``--query-gpu`` for, in this order (noheader output relies on it).
QUERY_GPU_FIELDS = (
    "index", "uuid", "name", "pci.bus_id", "memory.total", "memory.used", "utilization.gpu",
    "temperature.gpu", "power.draw", "power.limit", "fan.speed", "clocks.sm", "clocks.mem",
    "pstate", "driver_version", "compute_cap",
)
#: Asked too where the driver knows them; an older driver refuses the query naming the
#: first field it lacks, and the probe asks again without it.
QUERY_GPU_EXTRA_FIELDS = (
    "clocks.max.sm", "clocks.max.mem", "clocks.default_applications.graphics",
    "pcie.link.gen.current", "pcie.link.width.current", "pcie.link.gen.max",
    "pcie.link.width.max", "ecc.errors.uncorrected.volatile.total",
    "ecc.errors.corrected.volatile.total", "clocks_event_reasons.active", "mig.mode.current",
    "persistence_mode",
)
#: The fields of ``--query-compute-apps`` as saved outputs and older probes have them.
QUERY_APPS_FIELDS = ("gpu_uuid", "pid", "process_name", "used_gpu_memory")
#: What a node's probe asks for: only what the driver says. A process name is whatever the
#: process set as its argv[0], printed unquoted: a comma in it shifts the row's fields and a
#: newline starts a row of its own (a made-up process holding a card's memory). The probe
#: reads names from /proc instead, as data.
PROBE_APPS_FIELDS = ("gpu_uuid", "pid", "used_gpu_memory")
#: the names of a compute process's free-text field: extra commas in a row belong to it
_PROCESS_NAME_FIELDS = ("process_name", "name")

CSV_FORMAT = "--format=csv,noheader,nounits"


class ParseError(ValueError):
    """nvidia-smi output that cannot be read as the layout it claims (or was said) to have."""


def query_gpu_argv(fields=QUERY_GPU_FIELDS, tool="nvidia-smi"):
    """The argv that reads every GPU (CSV, no header, no units)."""
    return [tool, "--query-gpu=" + ",".join(fields), CSV_FORMAT]


def query_apps_argv(tool="nvidia-smi", fields=QUERY_APPS_FIELDS):
    """The argv that lists compute processes (CSV, no header, no units)."""
    return [tool, "--query-compute-apps=" + ",".join(fields), CSV_FORMAT]


_UNKNOWN_FIELD_RE = re.compile(r'Field "([^"]+)" is not a valid field to query')


def unknown_field(output):
    """The field an older nvidia-smi refused (``Field "x" is not a valid field…``), or None."""
    match = _UNKNOWN_FIELD_RE.search(output or "")
    return match.group(1) if match else None


# --- clock-event (throttle) reasons ----------------------------------------------------------

#: NVML's clocks-event reason bits, named as the health checks read them.
THROTTLE_BITS = (
    (0x1, "gpu_idle"), (0x2, "applications_clocks_setting"), (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"), (0x10, "sync_boost"), (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"), (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)


def throttle_names(mask):
    """A clocks-event bit mask -> the names of the active reasons; None when unknown."""
    if mask is None:
        return None
    return [name for bit, name in THROTTLE_BITS if mask & bit]


def _mask(raw):
    value = rd.text(raw)
    if value is None:
        return None
    try:
        return int(value, 16) if value.lower().startswith("0x") else int(value)
    except ValueError:
        return None


# --- CSV -----------------------------------------------------------------------------------


def _reasons(raw):
    return throttle_names(_mask(raw))


# Field name (as the tool prints it, aliases included) -> (reading key, converter).
GPU_FIELD_MAP = {
    "index": ("index", rd.integer),
    "uuid": ("uuid", rd.text), "gpu_uuid": ("uuid", rd.text),
    "name": ("name", rd.text), "gpu_name": ("name", rd.text),
    "pci.bus_id": ("pci_bus_id", rd.text), "gpu_bus_id": ("pci_bus_id", rd.text),
    "memory.total": ("memory_total_mb", rd.integer),
    "memory.used": ("memory_used_mb", rd.integer),
    "utilization.gpu": ("utilization_pct", rd.number),
    "temperature.gpu": ("temperature_c", rd.number),
    "power.draw": ("power_w", rd.number), "power.draw.instant": ("power_w", rd.number),
    "power.limit": ("power_limit_w", rd.number),
    "enforced.power.limit": ("power_limit_w", rd.number),
    "fan.speed": ("fan_pct", rd.number),
    "clocks.sm": ("sm_clock_mhz", rd.number), "clocks.current.sm": ("sm_clock_mhz", rd.number),
    "clocks.mem": ("mem_clock_mhz", rd.number),
    "clocks.current.memory": ("mem_clock_mhz", rd.number),
    "clocks.max.sm": ("max_sm_clock_mhz", rd.number),
    "clocks.max.mem": ("max_mem_clock_mhz", rd.number),
    "clocks.max.memory": ("max_mem_clock_mhz", rd.number),
    "clocks.default_applications.graphics": ("base_sm_clock_mhz", rd.number),
    "clocks.default_applications.gr": ("base_sm_clock_mhz", rd.number),
    "pcie.link.gen.current": ("pcie_gen", rd.integer),
    "pcie.link.gen.gpucurrent": ("pcie_gen", rd.integer),
    "pcie.link.width.current": ("pcie_width", rd.integer),
    "pcie.link.gen.max": ("pcie_gen_max", rd.integer),
    "pcie.link.width.max": ("pcie_width_max", rd.integer),
    "ecc.errors.uncorrected.volatile.total": ("ecc_uncorrected", rd.integer),
    "ecc.errors.corrected.volatile.total": ("ecc_corrected", rd.integer),
    "remapped_rows.correctable": ("remapped_rows_correctable", rd.integer),
    "remapped_rows.uncorrectable": ("remapped_rows_uncorrectable", rd.integer),
    "remapped_rows.pending": ("remapped_rows_pending", rd.flag),
    "remapped_rows.failure": ("remapped_rows_failure", rd.flag),
    "clocks_event_reasons.active": ("throttle_reasons", _reasons),
    "clocks_throttle_reasons.active": ("throttle_reasons", _reasons),
    "mig.mode.current": ("mig_mode", rd.text),
    "persistence_mode": ("persistence_mode", rd.text),
    "pstate": ("pstate", rd.text),
    "driver_version": ("driver_version", rd.text),
    "compute_cap": ("compute_cap", rd.text),
}

APPS_FIELD_MAP = {
    "gpu_uuid": ("gpu_uuid", rd.text),
    "pid": ("pid", rd.integer),
    "process_name": ("name", rd.text), "name": ("name", rd.text),
    "used_gpu_memory": ("used_memory_mb", rd.integer), "used_memory": ("used_memory_mb", rd.integer),
}

# A GPU the driver lost is reported in the middle of query output instead of its row.
_LOST_RE = re.compile(r"^Unable to determine the device handle for (?:GPU)?\s*"
                      r"([0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+\.[0-9A-Fa-f]|\S+?):\s*(.*)$")


def lost_devices(lines):
    """[(the id the tool named, why)] of each "Unable to determine the device handle for
    GPU…: GPU is lost" line: devices the driver lost, which have no row of their own."""
    found = []
    for line in lines:
        lost = _LOST_RE.match(line.strip())
        if lost:
            found.append((lost.group(1), lost.group(2).strip()))
    return found


_HEADER_CELL_RE = re.compile(r"^[a-z][a-z0-9_.]*(?:\s*\[[^\]]*\])?$")
_UNIT_SUFFIX_RE = re.compile(r"\s*\[[^\]]*\]$")
_TIMESTAMP_RE = re.compile(r"^(\d{4})/(\d\d)/(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d+))?$")
#: In a ``-l``/``-lms`` loop without a GPU column, rows closer than this belong to one sample.
SAME_SAMPLE_S = 0.05


def _cells(line):
    return [cell.strip() for cell in line.split(",")]


def _is_header(cells):
    """A header names fields (``memory.total [MiB]``); no data row is all lowercase names."""
    return all(_HEADER_CELL_RE.match(cell) for cell in cells) and any(
        "." in cell or "_" in cell or cell in ("index", "name", "uuid", "pid", "pstate")
        for cell in cells
    )


class _Csv(object):
    """A CSV query output read line by line, never held whole: :meth:`rows` yields each
    data row's cells; ``names`` is known once the first row (or the header) was read."""

    def __init__(self, lines, fields, default, free_text=()):
        self.lines = lines
        self.free_text = free_text
        self.names = [name.strip().lower() for name in (fields if fields is not None else default)]
        self.warnings = []

    def rows(self):
        header = None
        number = 0
        for line in self.lines:
            if not line.strip():
                continue
            lost = _LOST_RE.match(line.strip())
            if lost:
                self.warnings.append("GPU %s could not be read: %s" % (lost.group(1), lost.group(2)))
                continue
            cells = _cells(line)
            if header is None and number == 0 and _is_header(cells):
                header = cells
                self.names = [_UNIT_SUFFIX_RE.sub("", cell).strip().lower() for cell in header]
                continue
            if header is not None and cells == header:
                continue  # a loop that repeats its header
            number += 1
            cells = self._free_text_joined(cells)
            if len(cells) != len(self.names):
                raise ParseError(
                    "row %d has %d values but %d fields were expected (%s); the output's "
                    "field list is not the one assumed" % (
                        number, len(cells), len(self.names), ", ".join(self.names)))
            yield cells

    def _free_text_joined(self, cells):
        """A row with more values than fields, when one field is free text: the fields
        before it are read from the left, those after it from the right, and the rest is
        its text (a process named ``evil,x``)."""
        extra = len(cells) - len(self.names)
        free = [i for i, name in enumerate(self.names) if name in self.free_text]
        if extra <= 0 or len(free) != 1:
            return cells
        i = free[0]
        return cells[:i] + [", ".join(cells[i:i + extra + 1])] + cells[i + extra + 1:]

    def convert(self, cells, field_map):
        values = {}
        errors = []
        for name, cell in zip(self.names, cells):
            target = field_map.get(name)
            if target is not None:
                values[target[0]] = target[1](cell)
                if rd.is_error(cell):
                    errors.append(name)
        if errors:
            values["err_fields"] = errors
        return values


def _seconds(stamp):
    match = _TIMESTAMP_RE.match(stamp or "")
    if not match:
        return None
    year, month, day, hour, minute, second, fraction = match.groups()
    days = (int(year) * 12 + int(month)) * 31 + int(day)  # only differences matter
    return ((days * 24 + int(hour)) * 60 + int(minute)) * 60 + int(second) + (
        float("0." + fraction) if fraction else 0.0)


class _Places(object):
    """Each row's GPU in a loop that names no GPU: the rows of one sample are printed within
    a few ms of each other, so a gap of SAME_SAMPLE_S starts the next sample."""

    def __init__(self):
        self.previous = None
        self.place = -1

    def next(self, names, cells):
        if "timestamp" not in names:
            self.place += 1
            return self.place
        moment = _seconds(cells[names.index("timestamp")])
        close = self.previous is not None and moment is not None \
            and moment - self.previous <= SAME_SAMPLE_S
        self.place = self.place + 1 if close else 0
        self.previous = moment
        return self.place


def _identity(values, place):
    for key in ("uuid", "pci_bus_id", "index"):
        if values.get(key) is not None:
            return key, values[key]
    return "place", place


def parse_query_gpu_lines(lines, fields=None):
    """``--query-gpu`` CSV (with or without header and units) -> (readings, warnings).

    With a header the fields are read from it; without, ``fields`` (default
    QUERY_GPU_FIELDS) says what each column is. Repeated samples of a ``-l``/``-lms`` loop
    give one reading per GPU (grouped by uuid, bus id or index, else by the row's place in
    its sample), the latest sample kept; lines are read one at a time, so a long loop costs
    no more memory than one sample. A missing index is the GPU's place; a missing uuid or
    name is "". Raises ParseError when a row's value count differs from the field list.
    """
    csv = _Csv(lines, fields, QUERY_GPU_FIELDS)
    places = _Places()
    latest = OrderedDict()  # the order GPUs first appeared
    for cells in csv.rows():
        values = csv.convert(cells, GPU_FIELD_MAP)
        key = _identity(values, places.next(csv.names, cells))
        latest[key] = values
    readings = []
    for place, values in enumerate(latest.values()):
        index = values.pop("index", None)
        reading = rd.new_reading("nvidia", place if index is None else index, **values)
        reading["uuid"] = reading["uuid"] or ""
        reading["name"] = reading["name"] or ""
        readings.append(reading)
    return readings, csv.warnings


def parse_query_apps_lines(lines, fields=None):
    """``--query-compute-apps`` CSV -> processes; header only (or nothing) = none.

    A row without a readable pid is dropped (it names no process we could act on); a name
    of ``[Not Found]`` (process in another PID namespace) is None. A name holding commas
    is what lies between the fields before and after it. Raises ParseError when a row has
    fewer values than the field list (or more, without a name to hold them).
    """
    csv = _Csv(lines, fields, QUERY_APPS_FIELDS, free_text=_PROCESS_NAME_FIELDS)
    processes = []
    for cells in csv.rows():
        values = csv.convert(cells, APPS_FIELD_MAP)
        if values.get("pid") is None:
            continue
        processes.append(rd.new_process(values.get("gpu_uuid"), values["pid"], values.get("name"),
                                        values.get("used_memory_mb")))
    return processes


def raw_rows(lines):
    return [[rd.text(cell) for cell in _cells(line)] for line in lines if line.strip()]


# --- the default table ---------------------------------------------------------------------

_VERSION_RE = re.compile(
    r"NVIDIA-SMI\s+(?P<smi>\S+)\s+Driver Version:\s+(?P<driver>\S+)\s+CUDA Version:\s+(?P<cuda>\S+)"
)
_BUS_RE = re.compile(r"^[0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+\.[0-9A-Fa-f]$")
_GPU_CELL_RE = re.compile(r"^(?P<index>\d+)\s+(?P<name>.+?)\s+(?P<persistence>On|Off|WDDM|TCC)$")
_PROCESS_RE = re.compile(
    r"^\|\s*(?P<gpu>\d+|N/A)\s+(?P<gi>\S+)\s+(?P<ci>\S+)\s+(?P<pid>\d+)\s+(?P<type>\S+)\s+"
    r"(?P<name>.*?)\s+(?P<mem>\d+MiB|N/A)\s*\|$"
)
_MIG_RE = re.compile(
    r"^\|\s*(?P<gpu>\d+)\s+(?P<gi>\d+)\s+(?P<ci>\d+)\s+(?P<dev>\d+)\s*"
    r"\|\s*(?P<used>\d+)MiB\s*/\s*(?P<total>\d+)MiB\s*\|\s*(?P<sm>\d+|N/A)\b"
)


_PAIR_SEPARATOR = re.compile(r"\s+/\s+")


def _split_pair(cell):
    """``72W /  700W`` -> ("72W", "700W"): the slash between spaces, never the one of N/A."""
    parts = _PAIR_SEPARATOR.split(cell.strip(), 1)
    return (parts[0], parts[1]) if len(parts) == 2 else (cell.strip(), None)


def _table_first_line(cells):
    """``0  NVIDIA A100…  On`` | ``00000000:07:00.0 Off`` | ``On``: each cell on its own."""
    if len(cells) != 3:
        return None
    gpu = _GPU_CELL_RE.match(cells[0])
    if not gpu:
        return None
    bus_parts = cells[1].split()
    values = {"index": int(gpu.group("index")), "name": gpu.group("name"),
              "persistence_mode": gpu.group("persistence"), "pci_bus_id": None,
              "display_active": None, "ecc": rd.text(cells[2])}
    if bus_parts and _BUS_RE.match(bus_parts[0]):
        values["pci_bus_id"] = bus_parts[0]
        values["display_active"] = rd.text(bus_parts[1]) if len(bus_parts) > 1 else None
    return values


def _table_second_line(cells):
    """``Fan Temp Perf Pwr/Cap`` | ``used / total`` | ``util compute``, each cell alone, so an
    odd cell (``Not Supported`` memory on unified-memory machines) loses only itself."""
    values = {}
    if len(cells) != 3:
        return values
    first = cells[0]
    power, cap = _split_pair(first)
    words = power.split()
    if cap is not None and len(words) >= 4:
        values.update(fan_pct=rd.number(words[0]), temperature_c=rd.number(words[1]),
                      pstate=rd.text(words[2]), power_w=rd.number(" ".join(words[3:])),
                      power_limit_w=rd.number(cap))
    elif cap is not None and len(words) == 3:  # no fan column on some boards
        values.update(temperature_c=rd.number(words[0]), pstate=rd.text(words[1]),
                      power_w=rd.number(words[2]), power_limit_w=rd.number(cap))
    used, total = _split_pair(cells[1])
    values.update(memory_used_mb=rd.integer(used), memory_total_mb=rd.integer(total))
    util_words = cells[2].split()
    if util_words:
        values["utilization_pct"] = rd.number(util_words[0])
        values["compute_mode"] = rd.text(" ".join(util_words[1:]))
    return values


def _table_process(match):
    return {
        "gpu": rd.integer(match.group("gpu")),
        "gpu_instance": rd.text(match.group("gi")),
        "compute_instance": rd.text(match.group("ci")),
        "pid": int(match.group("pid")),
        "type": match.group("type"),
        "name": match.group("name"),
        "used_memory_mb": rd.integer(match.group("mem")),
    }


def _table_mig(match):
    return {
        "gpu": int(match.group("gpu")),
        "gpu_instance": int(match.group("gi")),
        "compute_instance": int(match.group("ci")),
        "mig_device": int(match.group("dev")),
        "memory_used_mb": int(match.group("used")),
        "memory_total_mb": int(match.group("total")),
        "sm_count": rd.integer(match.group("sm")),
    }


def parse_plain_table(text):
    """The default ``nvidia-smi`` table (the 89- and 91-column layouts).

    Returns ``{"nvidia_smi_version", "driver_version", "cuda_version", "gpus": [...],
    "mig_devices": [...], "processes": [...]}``, GPUs as the table shows them (plus
    ``persistence_mode``, ``display_active``, ``ecc``, ``compute_mode``, ``mig_mode``).
    Lines it does not recognise are skipped; a cell it cannot read is None.
    """
    lines = text.splitlines()
    result = {"nvidia_smi_version": None, "driver_version": None, "cuda_version": None,
              "gpus": [], "mig_devices": [], "processes": []}
    section = None
    i = 0
    while i < len(lines):
        line = lines[i].rstrip()
        version = _VERSION_RE.search(line)
        cells = rd.box_cells(line)
        first = _table_first_line(cells) if cells and section is None else None
        if version:
            result.update(nvidia_smi_version=version.group("smi"),
                          driver_version=version.group("driver"), cuda_version=version.group("cuda"))
        elif "MIG devices:" in line:
            section = "mig"
        elif "Processes:" in line:
            section = "processes"
        elif first is not None:
            # A GPU takes three lines; the third (MIG mode) may be absent on old drivers.
            gpu = first
            taken = 1
            second = rd.box_cells(lines[i + 1]) if i + 1 < len(lines) else None
            if second is not None and len(second) == 3 and _table_first_line(second) is None:
                gpu.update(_table_second_line(second))
                taken = 2
                third = rd.box_cells(lines[i + 2]) if i + 2 < len(lines) else None
                if third is not None and len(third) == 3 and not third[0]:
                    gpu["mig_mode"] = rd.text(third[2])
                    taken = 3
            gpu.setdefault("mig_mode", None)
            result["gpus"].append(gpu)
            i += taken
            continue
        elif section == "mig":
            mig = _MIG_RE.match(line)
            if mig:
                result["mig_devices"].append(_table_mig(mig))
        elif section == "processes":
            process = _PROCESS_RE.match(line)
            if process:
                result["processes"].append(_table_process(process))
        i += 1
    return result


_TABLE_READING_KEYS = ("name", "pci_bus_id", "memory_total_mb", "memory_used_mb",
                       "utilization_pct", "temperature_c", "power_w", "power_limit_w",
                       "fan_pct", "pstate", "mig_mode")


def plain_table_readings(table):
    """:func:`parse_plain_table`'s result as readings: the GPUs, then their MIG devices (a
    device each, named after its GPU); processes by the GPU's position. The table names
    no UUIDs: ``uuid`` is ""."""
    readings = []
    for gpu in table["gpus"]:
        readings.append(rd.new_reading(
            "nvidia", gpu["index"], uuid="", driver_version=table["driver_version"],
            persistence_mode={"On": "Enabled", "Off": "Disabled"}.get(gpu.get("persistence_mode")),
            **{key: gpu.get(key) for key in _TABLE_READING_KEYS}))
    by_index = dict((r["index"], r) for r in readings)
    for mig in table["mig_devices"]:
        parent = by_index.get(mig["gpu"], {})
        readings.append(rd.new_reading(
            "nvidia", None, uuid="", name="%s MIG %d/%d" % (parent.get("name") or "GPU",
                                                           mig["gpu_instance"], mig["compute_instance"]),
            memory_total_mb=mig["memory_total_mb"], memory_used_mb=mig["memory_used_mb"],
            pci_bus_id=parent.get("pci_bus_id"), driver_version=table["driver_version"],
            parent_index=mig["gpu"], gpu_instance=mig["gpu_instance"],
            compute_instance=mig["compute_instance"]))
    processes = [rd.new_process(None, p["pid"], p["name"], p["used_memory_mb"])
                 for p in table["processes"]]
    for process, raw in zip(processes, table["processes"]):
        process["gpu_index"] = raw["gpu"]
    return readings, processes


# --- nvidia-smi -q ---------------------------------------------------------------------------

# "GPU 00000000:07:00.0"; drivers of 2011 (270.x) wrote "GPU 0:2:0" (no domain width, no function)
_Q_GPU_RE = re.compile(r"^GPU [0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+(?:\.[0-9A-Fa-f])?$")


def _q_tree(text):
    """``-q`` text -> nested dicts by indentation: ``{"GPU 00000000:07:00.0": {…}}``.

    A key without a value opens a section. Keys hold no colon (a GPU's own line, its bus
    id, is the one exception); values may (times, bus ids).
    """
    root = {}
    stack = [(-1, root)]
    for raw in text.splitlines():
        stripped = raw.strip()
        if not stripped or stripped.startswith("="):
            continue
        indent = len(raw.expandtabs(4)) - len(raw.expandtabs(4).lstrip())
        while len(stack) > 1 and stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1]
        if _Q_GPU_RE.match(stripped):
            key, value = stripped, ""
        else:
            key, _, value = stripped.partition(":")
            key, value = key.strip(), value.strip()
        if value == "":
            section = parent[key] = {}
            stack.append((indent, section))
        else:
            parent[key] = value
    return root


def _get(tree, *path):
    node = tree
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def _active_reasons(section, names):
    """``Clocks Event Reasons`` (or ``Clocks Throttle Reasons``) -> active reason names."""
    if not isinstance(section, dict):
        return None
    active, known = [], False
    for label, name in names:
        value = section.get(label)
        if value is None:
            for nested in section.values():  # HW Thermal Slowdown sits under HW Slowdown
                if isinstance(nested, dict) and label in nested:
                    value = nested[label]
        state = rd.flag(value)
        if state is not None:
            known = True
            if state:
                active.append(name)
    return active if known else None


_Q_REASONS = (
    ("Idle", "gpu_idle"), ("Applications Clocks Setting", "applications_clocks_setting"),
    ("SW Power Cap", "sw_power_cap"), ("HW Slowdown", "hw_slowdown"),
    ("Sync Boost", "sync_boost"), ("SW Thermal Slowdown", "sw_thermal_slowdown"),
    ("HW Thermal Slowdown", "hw_thermal_slowdown"),
    ("HW Power Brake Slowdown", "hw_power_brake_slowdown"),
    ("Display Clock Setting", "display_clock_setting"),
)


def _volatile_total(errors, kind):
    """Sum of the volatile SRAM/DRAM (or older ``Double Bit``/``Single Bit``) counts."""
    volatile = _get(errors, "Volatile")
    if not isinstance(volatile, dict):
        return None
    values = []
    for label, value in volatile.items():
        if isinstance(value, dict):  # pre-Ampere: Single Bit / Double Bit blocks with "Total"
            if (kind == "Uncorrectable") == label.startswith("Double"):
                values.append(rd.integer(value.get("Total")))
        elif label.endswith(kind):
            values.append(rd.integer(value))
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _q_processes(text):
    """The ``Processes`` blocks of ``-q``: each ``Process ID`` line starts one process and the
    lines after it name it and its memory (``Processes : None`` is none)."""
    processes, uuid, current, inside = [], "", None, False
    for raw in text.splitlines():
        stripped = raw.strip()
        if _Q_GPU_RE.match(stripped):
            uuid, current, inside = "", None, False
            continue
        key, _, value = stripped.partition(":")
        key, value = key.strip(), value.strip()
        if key == "GPU UUID":
            uuid = value
        elif key == "Processes":
            inside, current = value == "", None
        elif inside and key == "Process ID":
            current = rd.new_process(uuid, rd.integer(value))
            processes.append(current)
        elif inside and current is not None and key == "Name":
            current["name"] = rd.text(value)
        elif inside and current is not None and key == "Used GPU Memory":
            current["used_memory_mb"] = rd.integer(value)
    return [p for p in processes if p["pid"] is not None]


def _q_errors(section, path=""):
    """The fields of a ``-q`` section written as ERR! (the driver failed to read them)."""
    found = []
    for key, value in section.items():
        where = "%s/%s" % (path, key) if path else key
        if isinstance(value, dict):
            found.extend(_q_errors(value, where))
        elif rd.is_error(value):
            found.append(where)
    return found


def parse_q(text):
    """``nvidia-smi -q`` -> (readings, processes, facts) with facts = driver/CUDA version.

    Layouts from 2011 on: drivers of the 270 series wrote ``Memory Usage`` (in ``Mb``),
    ``Temperature/Gpu`` and ``Power Readings/Power State`` where later ones write ``FB
    Memory Usage``, ``GPU Current Temp`` and ``Performance State``."""
    tree = _q_tree(text)
    facts = {"driver_version": rd.text(tree.get("Driver Version")),
             "cuda_version": rd.text(tree.get("CUDA Version"))}
    readings = []
    for key, section in tree.items():
        if not _Q_GPU_RE.match(key) or not isinstance(section, dict):
            continue
        uuid = rd.text(section.get("GPU UUID")) or ""
        clocks = section.get("Clocks") or {}
        max_clocks = section.get("Max Clocks") or {}
        link = _get(section, "PCI", "GPU Link Info") or {}
        power = section.get("GPU Power Readings") or section.get("Power Readings") or {}
        remap = section.get("Remapped Rows")
        remap = remap if isinstance(remap, dict) else {}
        reasons = section.get("Clocks Event Reasons") or section.get("Clocks Throttle Reasons")
        memory = section.get("FB Memory Usage") or section.get("Memory Usage") or {}
        temperature = section.get("Temperature") or {}
        reading = rd.new_reading(
            "nvidia", len(readings),
            uuid=uuid, name=rd.text(section.get("Product Name")) or "",
            pci_bus_id=rd.text(_get(section, "PCI", "Bus Id")) or key[4:].strip(),
            memory_total_mb=rd.integer(memory.get("Total")),
            memory_used_mb=rd.integer(memory.get("Used")),
            utilization_pct=rd.number(_get(section, "Utilization", "Gpu")),
            temperature_c=rd.number(temperature.get("GPU Current Temp") or temperature.get("Gpu")),
            power_w=rd.number(power.get("Power Draw") or power.get("Average Power Draw")),
            power_limit_w=rd.number(power.get("Current Power Limit") or power.get("Power Limit")),
            fan_pct=rd.number(section.get("Fan Speed")),
            sm_clock_mhz=rd.number(clocks.get("SM")),
            mem_clock_mhz=rd.number(clocks.get("Memory")),
            base_sm_clock_mhz=rd.number(_get(section, "Default Applications Clocks", "Graphics")),
            max_sm_clock_mhz=rd.number(max_clocks.get("SM")),
            max_mem_clock_mhz=rd.number(max_clocks.get("Memory")),
            pstate=rd.text(section.get("Performance State") or power.get("Power State")),
            pcie_gen=rd.integer(_get(link, "PCIe Generation", "Current")),
            pcie_gen_max=rd.integer(_get(link, "PCIe Generation", "Max")),
            pcie_width=rd.integer(_get(link, "Link Width", "Current")),
            pcie_width_max=rd.integer(_get(link, "Link Width", "Max")),
            ecc_uncorrected=_volatile_total(section.get("ECC Errors"), "Uncorrectable"),
            ecc_corrected=_volatile_total(section.get("ECC Errors"), "Correctable"),
            remapped_rows_correctable=rd.integer(remap.get("Correctable Error")),
            remapped_rows_uncorrectable=rd.integer(remap.get("Uncorrectable Error")),
            remapped_rows_pending=rd.flag(remap.get("Pending")),
            remapped_rows_failure=rd.flag(remap.get("Remapping Failure Occurred")),
            driver_version=facts["driver_version"],
            persistence_mode=rd.text(section.get("Persistence Mode")),
            throttle_reasons=_active_reasons(reasons, _Q_REASONS),
            mig_mode=rd.text(_get(section, "MIG Mode", "Current")),
            err_fields=_q_errors(section) or None,
        )
        readings.append(reading)
    return readings, _q_processes(text), facts


# --- nvidia-smi -q -x ------------------------------------------------------------------------

_XML_REASONS = tuple(("clocks_event_reason_" + name, name) for _, name in _Q_REASONS[:8]) + (
    ("clocks_event_reason_display_clocks_setting", "display_clock_setting"),)


def _x(element, path):
    """The text at ``path`` under ``element`` (None when absent or N/A)."""
    if element is None:
        return None
    found = element.find(path)
    return rd.text(found.text) if found is not None else None


def _xml_reasons(gpu):
    section = gpu.find("clocks_event_reasons")
    prefix = "clocks_event_reason_"
    if section is None:
        section, prefix = gpu.find("clocks_throttle_reasons"), "clocks_throttle_reason_"
    if section is None:
        return None
    active, known = [], False
    for tag, name in _XML_REASONS:
        state = rd.flag(_x(section, tag.replace("clocks_event_reason_", prefix)))
        if state is not None:
            known = True
            if state:
                active.append(name)
    return active if known else None


def _xml_volatile(gpu, kind):
    volatile = gpu.find("ecc_errors/volatile")
    if volatile is None:
        return None
    values = [rd.integer(child.text) for child in volatile if child.tag.endswith(kind)]
    if not values:  # pre-Ampere: <single_bit>/<double_bit> blocks with <total>
        block = "double_bit" if kind == "uncorrectable" else "single_bit"
        values = [rd.integer(_x(volatile, block + "/total"))]
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def parse_xml(text):
    """``nvidia-smi -q -x`` -> (readings, processes, facts). MIG instances are readings of
    their own after their GPU, with ``parent_uuid`` and their memory; the XML names no MIG
    UUIDs, so theirs is "". Raises ParseError for text that is not the tool's XML."""
    try:
        root = ElementTree.fromstring(text.encode("utf-8") if isinstance(text, str) else text)
    except ElementTree.ParseError as err:
        raise ParseError("not nvidia-smi XML: %s" % err)
    if root.tag != "nvidia_smi_log":
        raise ParseError("not nvidia-smi XML: the root element is <%s>, not <nvidia_smi_log>"
                         % root.tag)
    facts = {"driver_version": _x(root, "driver_version"), "cuda_version": _x(root, "cuda_version"),
             "attached_gpus": rd.integer(_x(root, "attached_gpus"))}
    readings, processes = [], []
    for position, gpu in enumerate(root.findall("gpu")):
        uuid = _x(gpu, "uuid") or ""
        remap = gpu.find("remapped_rows")
        reading = rd.new_reading(
            "nvidia", position, uuid=uuid, name=_x(gpu, "product_name") or "",
            pci_bus_id=_x(gpu, "pci/pci_bus_id") or gpu.get("id"),
            memory_total_mb=rd.integer(_x(gpu, "fb_memory_usage/total")),
            memory_used_mb=rd.integer(_x(gpu, "fb_memory_usage/used")),
            utilization_pct=rd.number(_x(gpu, "utilization/gpu_util")),
            temperature_c=rd.number(_x(gpu, "temperature/gpu_temp")),
            power_w=rd.number(_x(gpu, "gpu_power_readings/power_draw")
                              or _x(gpu, "power_readings/power_draw")),
            power_limit_w=rd.number(_x(gpu, "gpu_power_readings/current_power_limit")
                                    or _x(gpu, "power_readings/power_limit")),
            fan_pct=rd.number(_x(gpu, "fan_speed")),
            sm_clock_mhz=rd.number(_x(gpu, "clocks/sm_clock")),
            mem_clock_mhz=rd.number(_x(gpu, "clocks/mem_clock")),
            base_sm_clock_mhz=rd.number(_x(gpu, "default_applications_clocks/graphics_clock")),
            max_sm_clock_mhz=rd.number(_x(gpu, "max_clocks/sm_clock")),
            max_mem_clock_mhz=rd.number(_x(gpu, "max_clocks/mem_clock")),
            pstate=_x(gpu, "performance_state"),
            pcie_gen=rd.integer(_x(gpu, "pci/pci_gpu_link_info/pcie_gen/current_link_gen")),
            pcie_gen_max=rd.integer(_x(gpu, "pci/pci_gpu_link_info/pcie_gen/max_link_gen")),
            pcie_width=rd.integer(_x(gpu, "pci/pci_gpu_link_info/link_widths/current_link_width")),
            pcie_width_max=rd.integer(_x(gpu, "pci/pci_gpu_link_info/link_widths/max_link_width")),
            ecc_uncorrected=_xml_volatile(gpu, "uncorrectable"),
            ecc_corrected=_xml_volatile(gpu, "_correctable"),
            remapped_rows_correctable=rd.integer(_x(remap, "remapped_row_corr")),
            remapped_rows_uncorrectable=rd.integer(_x(remap, "remapped_row_unc")),
            remapped_rows_pending=rd.flag(_x(remap, "remapped_row_pending")),
            remapped_rows_failure=rd.flag(_x(remap, "remapped_row_failure")),
            driver_version=facts["driver_version"],
            throttle_reasons=_xml_reasons(gpu),
            mig_mode=_x(gpu, "mig_mode/current_mig"),
            persistence_mode=_x(gpu, "persistence_mode"),
        )
        readings.append(reading)
        for mig in gpu.findall("mig_devices/mig_device"):
            readings.append(rd.new_reading(
                "nvidia", None, uuid="", parent_uuid=uuid,
                name="%s MIG %s/%s" % (reading["name"], _x(mig, "gpu_instance_id"),
                                       _x(mig, "compute_instance_id")),
                pci_bus_id=reading["pci_bus_id"],
                memory_total_mb=rd.integer(_x(mig, "fb_memory_usage/total")),
                memory_used_mb=rd.integer(_x(mig, "fb_memory_usage/used")),
                driver_version=facts["driver_version"],
                gpu_instance=rd.integer(_x(mig, "gpu_instance_id")),
                compute_instance=rd.integer(_x(mig, "compute_instance_id")),
                sm_count=rd.integer(_x(mig, "device_attributes/shared/multiprocessor_count")),
            ))
        for process in gpu.findall("processes/process_info"):
            pid = rd.integer(_x(process, "pid"))
            if pid is not None:
                processes.append(rd.new_process(uuid, pid, _x(process, "process_name"),
                                                rd.integer(_x(process, "used_memory"))))
    return readings, processes, facts
