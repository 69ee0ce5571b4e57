"""What Intel's ``xpu-smi`` prints, as vendor-neutral readings: ``discovery`` (all devices,
or one with ``-d``), ``stats -d N`` and ``ps``. Pure.

Both tables are boxes of ``| key | value |`` rows; a value may be empty (the Flex 170's
``stats`` leaves most engine cells blank) or compound (``0; Engine 0: 0, Engine 1: 0``:
the number before the ``;`` is the whole). ``stats`` may report more than 100 %
utilisation; :func:`reading.clamp` deals with it on the node. Travels to the nodes with
the nodelet (stdlib only, Python 3.6 syntax, no annotations).
"""

import re

from . import reading as rd


def _rows(text):
    """The ``| key | value |`` rows of a box as [key, value]."""
    for raw in text.splitlines():
        cells = rd.box_cells(raw)
        if cells is not None and len(cells) == 2:
            yield cells


def _value(cell):
    """``0; Engine 0: 0, …`` -> ``0``; ``Engine 0: 0, Engine 1: 0`` (no whole) -> None."""
    head = cell.split(";", 1)[0].strip()
    return None if ":" in head else rd.text(head)


_DISCOVERY_KEYS = {
    "Device Name": "name", "PCI BDF Address": "pci_bus_id", "UUID": "uuid", "SOC UUID": "uuid",
    "Driver Version": "driver_version", "Kernel Version": "kernel_version",
    "DRM Device": "drm_device", "Function Type": "function_type", "Device Type": "device_type",
    "Vendor Name": "vendor_name", "PCI Device ID": "device_id",
}


def parse_discovery(text):
    """``xpu-smi discovery [-d N]`` -> (readings, [], facts). Each ``Device ID`` row starts a
    device; the ``key: value`` lines under it describe it (``-d N`` adds memory size, clocks
    and the PCIe link)."""
    readings = []
    current = None
    for device, info in _rows(text):
        if device == "Device ID":
            continue
        if device.isdigit():
            current = rd.new_reading("intel", int(device), uuid="", name="")
            readings.append(current)
        if current is None or ":" not in info:
            continue
        key, _, value = info.partition(":")
        key, value = key.strip(), value.strip()
        target = _DISCOVERY_KEYS.get(key)
        if target:
            current[target] = rd.text(value)
        elif key == "Memory Physical Size":
            current["memory_total_mb"] = rd.integer(value)
        elif key == "Max Clock Frequency" or key == "Core Clock Rate":
            current["max_sm_clock_mhz"] = rd.number(value)
        elif key == "PCIe Generation":
            current["pcie_gen"] = rd.integer(value)
        elif key == "PCIe Max Link Width":
            current["pcie_width"] = rd.integer(value)
    for reading in readings:
        reading["name"] = reading["name"] or ""
        reading["uuid"] = reading["uuid"] or ""
    return readings, [], {}


_STATS_KEYS = {
    "GPU Utilization (%)": ("utilization_pct", rd.number),
    "GPU Power (W)": ("power_w", rd.number),
    "GPU Frequency (MHz)": ("sm_clock_mhz", rd.number),
    "GPU Core Temperature (C)": ("temperature_c", rd.number),
    "GPU Memory Used (MiB)": ("memory_used_mb", rd.integer),
    "GPU Memory Frequency (MHz)": ("mem_clock_mhz", rd.number),
    "Mem Errors Uncorrectable": ("ecc_uncorrected", rd.integer),
    "Mem Errors Correctable": ("ecc_corrected", rd.integer),
}


def parse_stats(text):
    """``xpu-smi stats -d N`` -> (readings of that device, [], facts). Blank cells are None."""
    reading = None
    for key, value in _rows(text):
        if key == "Device ID":
            reading = rd.new_reading("intel", rd.integer(value), uuid="", name="")
            continue
        target = _STATS_KEYS.get(key)
        if target is not None and reading is not None:
            reading[target[0]] = target[1](_value(value))
    return ([reading] if reading is not None else []), [], {}


_PS_HEADER_RE = re.compile(r"^\s*PID\s+Command\s+DeviceID\s+SHR\s+MEM\s*$")
#: A row: the command (free text, never believed) between the pid read from the left and
#: DeviceID, SHR and MEM read from the right.
_PS_ROW_RE = re.compile(r"^\s*(?P<pid>[0-9]+)\s(?P<command>.*?)\s*(?P<device>[0-9]+)\s+[0-9]+\s+(?P<mem>[0-9]+)\s*$")


def parse_ps(text, devices=None):
    """``xpu-smi ps`` (columns PID, Command, DeviceID, SHR, MEM in KiB) -> (processes, None),
    each with ``device`` (the Device ID) and no uuid (the caller knows the devices); or
    ([], why) when a line after the header is no row of it (one a process name made: see
    ``reading.UNREADABLE``), or names a device not in ``devices`` (when given)."""
    processes, seen_header = [], False
    for number, raw in enumerate(text.rstrip().splitlines()):
        if not seen_header:
            seen_header = bool(_PS_HEADER_RE.match(raw))
            continue
        row = _PS_ROW_RE.match(raw)
        pid = rd.strict_int(row.group("pid")) if row else None
        device = rd.strict_int(row.group("device")) if row else None
        if not pid or device is None or (devices is not None and device not in devices):
            return [], rd.broken_table("xpu-smi ps", number + 1)
        process = rd.new_process(None, pid, rd.text(row.group("command")),
                                 rd.strict_int(row.group("mem")) // 1024)
        process["device"] = device
        processes.append(process)
    return processes, None


def merge(discovered, stats):
    """A device's discovery facts with its stats readings (stats win where they have one)."""
    merged = dict(discovered)
    for key, value in stats.items():
        if key not in ("index", "uuid", "name", "visible_id", "visible_env", "vendor") \
                and value is not None:
            merged[key] = value
    return merged
