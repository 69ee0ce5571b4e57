"""The vendor-neutral reading of one device, and the helpers every vendor parser shares.

Every backend, whatever tool or library it reads, yields the same dict per device (the keys
of :data:`FIELDS`); the head turns it into a ``model.GpuReading`` with one function. A field
the vendor lacks or the tool could not read is ``None`` (shown as ``N/A``), never a zero,
and one unreadable field never loses the device.

This module travels to the nodes with the nodelet (see ``remote/shipping.py``): stdlib
only, Python 3.6 syntax, no annotations.
"""

import re

#: Every key of a reading, with what it means. Units are in the names.
FIELDS = (
    "index",            # the device's number on its node (unique across vendors there)
    "uuid",             # the vendor's stable id ("GPU-…", "MIG-…"; derived where it has none)
    "name",             # the model as the vendor prints it
    "vendor",           # "nvidia", "amd", "intel", "ascend"
    "pci_bus_id",       # "00000000:01:00.0" (as the tool writes it)
    "memory_total_mb", "memory_used_mb",
    "utilization_pct", "temperature_c", "power_w", "power_limit_w", "fan_pct",
    "sm_clock_mhz", "mem_clock_mhz",                  # current
    "base_sm_clock_mhz", "max_sm_clock_mhz", "max_mem_clock_mhz",
    "pstate",                                          # "P0" … "P12" (NVIDIA), else None
    "pcie_gen", "pcie_width",                          # the link now (idle cards slow down)
    "pcie_gen_max", "pcie_width_max",                  # what card and slot can do
    "ecc_uncorrected", "ecc_corrected",                # volatile counts since the last reset
    "remapped_rows_correctable", "remapped_rows_uncorrectable",
    "remapped_rows_pending", "remapped_rows_failure",  # bools
    "driver_version",
    "compute_cap",       # "8.9" (NVIDIA), "gfx90a" (AMD); None where the vendor has none
    "throttle_reasons",  # names of active clock-event reasons, [] when none, None unknown
    "mig_mode",          # "Enabled"/"Disabled" on MIG-capable cards
    "persistence_mode",  # "Enabled"/"Disabled": whether the driver stays loaded between jobs
    "parent_uuid",       # a MIG instance's GPU
    "health",            # the vendor's own verdict where it gives one ("OK", "Warning")
    "visible_env",       # the variable that hands this device to a job
    "visible_id",        # what that variable takes for this device ("0", "MIG-…")
    "lost",              # why the driver cannot read the device now (NVML "GPU is lost",
                         # nvidia-smi "Unknown Error", gone from its list); None: it answers
    "err_fields",        # the fields the tool wrote as ERR! (each of them None), else None
)

#: The variable each vendor's runtime reads to choose its devices (R12).
VISIBLE_ENV = {
    "nvidia": "CUDA_VISIBLE_DEVICES",
    "amd": "ROCR_VISIBLE_DEVICES",
    "intel": "ZE_AFFINITY_MASK",
    "ascend": "ASCEND_RT_VISIBLE_DEVICES",
}

PROCESS_FIELDS = ("gpu_uuid", "pid", "name", "used_memory_mb")


def new_reading(vendor, index, **values):
    """A reading with every field None except those given; the vendor's variable set."""
    reading = dict.fromkeys(FIELDS)
    reading.update(vendor=vendor, index=index, visible_env=VISIBLE_ENV.get(vendor),
                   visible_id=None if index is None else str(index))
    reading.update(values)
    return reading


def new_process(gpu_uuid, pid, name=None, used_memory_mb=None):
    return {"gpu_uuid": gpu_uuid, "pid": pid, "name": name, "used_memory_mb": used_memory_mb}


# --- single values -------------------------------------------------------------------------

# Statuses, not values: [N/A], [Not Supported], [Unknown Error], [Not Found], N/A, "-" …
# and ERR! (a field the driver failed to read: missing, never a zero; the parsers note it).
_MISSING = {"", "n/a", "na", "-", "--", "none", "not supported", "unknown", "unsupported", "err!"}


def is_error(raw):
    """Whether a cell is nvidia-smi's ERR!: the driver failed to read that field."""
    return raw is not None and str(raw).strip().upper() == "ERR!"
_NUMBER_RE = re.compile(
    r"^\(?(-?\d+(?:\.\d+)?)\s*(?:MiB|MB|GiB|GB|KiB|KB|B|%|W|mW|MHz|Mhz|GHz|C|°C|mV|x)?\)?$",
    re.IGNORECASE)


def text(raw):
    """A cell as text, or None when the tool said it has no value."""
    if raw is None:
        return None
    value = str(raw).strip()
    if value.lower() in _MISSING or (value.startswith("[") and value.endswith("]")):
        return None
    return value


def number(raw):
    """``28.16 W`` / ``28.16`` / ``0 %`` / ``(1402Mhz)`` / ``16x`` -> float; else None."""
    value = text(raw)
    if value is None:
        return None
    match = _NUMBER_RE.match(value)
    return float(match.group(1)) if match else None


def integer(raw):
    value = number(raw)
    return None if value is None else int(round(value))


def flag(raw):
    """``Yes``/``Active``/``Enabled``/``1`` -> True, ``No``/``Not Active``/``0`` -> False."""
    value = text(raw)
    if value is None:
        return None
    lowered = value.lower()
    if lowered in ("yes", "active", "enabled", "true", "1", "on"):
        return True
    if lowered in ("no", "not active", "disabled", "false", "0", "off"):
        return False
    return None


def mib_from_bytes(raw):
    value = integer(raw)
    return None if value is None else value // (1024 * 1024)


def box_cells(line):
    """``| a | b | c |`` -> ["a", "b", "c"]: a row of the boxes vendor tools draw; None for
    a line that is none (rules, ``|===|`` and text around the box)."""
    line = line.rstrip()
    if not (line.startswith("|") and line.endswith("|")) or line.startswith("|="):
        return None
    return [cell.strip() for cell in line[1:-1].split("|")]


def joined_words(text, separator):
    """Words, with those around ``separator`` kept as one: ``0x740f,   12261`` -> one word
    for ",", ``20701/ 65536`` -> ``20701/65536`` for "/"."""
    words = []
    for word in text.replace(separator, " %s " % separator).split():
        if word == separator and words:
            words[-1] += separator
        elif words and words[-1].endswith(separator):
            words[-1] += word
        else:
            words.append(word)
    return words


# --- process tables --------------------------------------------------------------------------

# A vendor tool prints each process's name as the process set it (argv[0], its own to
# choose) and unquoted: a name holding a line break starts rows of its own, a made-up
# process on another job's pid or card. So a table is read for its numbers only, each
# field strict, and one whose line structure a name broke is not believed at all: its
# devices' process lists are *unreadable* (the memory guard acts on none of them). A name
# parsed is kept for ``nebula parse`` only: the node names the processes it keeps from
# /proc (``probes.hardware.vouched``).

#: the facts key of a parser's (readings, processes, facts) that says why the process
#: table is not believed; absent when it is
UNREADABLE = "processes_unreadable"

_DIGITS_RE = re.compile(r"^[0-9]{1,10}$")


def strict_int(cell):
    """``"124528"`` -> 124528; anything else (``1e3``, ``+5``, non-ASCII digits, ``12 MB``,
    empty) -> None."""
    value = (cell or "").strip()
    return int(value) if _DIGITS_RE.match(value) else None


def broken_table(tool, number):
    """The reason a process table is unreadable: its line ``number`` (1-based) is no row of
    it. The line itself is not quoted: a process wrote it."""
    return ("%s's process list is unreadable: line %d is no row of its table (a process "
            "name holding a line break?); none of its processes is believed" % (tool, number))


# --- impossible readings -------------------------------------------------------------------

#: field -> (lowest, highest) a real device can report; None: no bound on that side.
_BOUNDS = {
    "utilization_pct": (0.0, 100.0),
    "fan_pct": (0.0, 100.0),
    "power_w": (0.0, None),
    "power_limit_w": (0.0, None),
    "memory_used_mb": (0, None),
    "memory_total_mb": (0, None),
    "temperature_c": (-60.0, 150.0),
}


def clamp(reading):
    """Clamp impossible values in place (Intel's 200 % utilisation, used > total, negative
    power). Returns what was changed: ``[{"field", "value", "shown"}]``."""
    changes = []
    for field, (low, high) in sorted(_BOUNDS.items()):
        value = reading.get(field)
        if value is None:
            continue
        shown = value
        if low is not None and value < low:
            shown = type(value)(low)
        if high is not None and value > high:
            shown = type(value)(high)
        if shown != value:
            reading[field] = shown
            changes.append({"field": field, "value": value, "shown": shown})
    used, total = reading.get("memory_used_mb"), reading.get("memory_total_mb")
    if used is not None and total is not None and used > total:
        reading["memory_used_mb"] = total
        changes.append({"field": "memory_used_mb", "value": used, "shown": total})
    return changes


def same_device(a, b):
    """Whether two readings name one device: uuid first, then PCI address, then index."""
    for key in ("uuid", "pci_bus_id"):
        if a.get(key) and b.get(key):
            return a[key] == b[key]
    return a.get("index") is not None and a.get("index") == b.get("index")
