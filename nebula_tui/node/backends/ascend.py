"""What Huawei's ``npu-smi info`` prints, as vendor-neutral readings: each chip a device.

The box gives two rows per NPU: ``NPU Name | Health | Power Temp Hugepages`` and, per chip,
``Chip [Device] | Bus-Id | AICore% Memory HBM``; then a process box (``NPU Chip | pid |
name | memory``, or ``No running processes found in NPU n``). Lines may end with a
trailing space (as captured by some tools). The table names no UUID: a chip gets one made
from its PCI address. Travels to the nodes with the nodelet (stdlib only, Python 3.6
syntax, no annotations).
"""

import re

from . import reading as rd

_VERSION_RE = re.compile(r"npu-smi\s+(\S+)\s+Version:\s+(\S+)")
_PAIR_RE = re.compile(r"^(\S+)\s*/\s*(\S+)$")


def pci_uuid(bus_id):
    return "NPU-%s" % bus_id.lower() if bus_id else ""


def _used_total(text):
    match = _PAIR_RE.match((text or "").strip())
    if not match:
        return None, None
    return rd.integer(match.group(1)), rd.integer(match.group(2))


def parse_npu_smi(text):
    """``npu-smi info`` -> (readings, processes, facts). The n-th chip listed is logical
    device n (what ``ASCEND_RT_VISIBLE_DEVICES`` takes) unless its row names a Device."""
    facts = {"npu_smi_version": None, "driver_version": None}
    readings, processes = [], []
    npu = None
    lines = text.rstrip().splitlines()
    for number, raw in enumerate(lines):
        version = _VERSION_RE.search(raw)
        if version:
            facts.update(npu_smi_version=version.group(1), driver_version=version.group(2))
            continue
        cells = rd.box_cells(raw)
        if cells is None:
            continue
        if len(cells) >= 4 and cells[1].startswith("Process id"):
            processes, broken = _processes(lines, number, readings)
            if broken:
                facts[rd.UNREADABLE] = broken
            break
        if len(cells) != 3:
            continue
        left = cells[0].split()
        if len(left) >= 2 and left[0].isdigit() and not left[1].isdigit():
            numbers = rd.joined_words(cells[2], "/")
            npu = {"id": int(left[0]), "name": " ".join(left[1:]), "health": rd.text(cells[1]),
                   "power_w": rd.number(numbers[0]) if numbers else None,
                   "temperature_c": rd.number(numbers[1]) if len(numbers) > 1 else None}
        elif left and left[0].isdigit() and npu is not None:
            numbers = rd.joined_words(cells[2], "/")
            memory = numbers[2] if len(numbers) > 2 else numbers[1] if len(numbers) > 1 else None
            used, total = _used_total(memory)
            bus = rd.text(cells[1])
            logical = int(left[1]) if len(left) > 1 and left[1].isdigit() else len(readings)
            readings.append(rd.new_reading(
                "ascend", len(readings), uuid=pci_uuid(bus), name="Ascend %s" % npu["name"],
                pci_bus_id=bus, health=npu["health"], power_w=npu["power_w"],
                temperature_c=npu["temperature_c"],
                utilization_pct=rd.number(numbers[0]) if numbers else None,
                memory_used_mb=used, memory_total_mb=total,
                driver_version=facts["driver_version"], visible_id=str(logical),
                npu_id=npu["id"], chip_id=int(left[0])))
    return readings, processes, facts


_RULE_RE = re.compile(r"^\+[-=+]+\+$")
_NO_PROCESS_RE = re.compile(r"^No running processes found in NPU [0-9]+$")


def _processes(lines, header, readings):
    """The process box after its header row ``lines[header]`` to the end of the output ->
    (processes, None), or ([], why) when a line of it is no row the box can have (one a
    process name made: see ``reading.UNREADABLE``). A row is ``NPU Chip | pid | name |
    MiB``, each number strict, on a chip listed above; its name is never believed."""
    chips = dict(((r["npu_id"], r["chip_id"]), r["uuid"]) for r in readings)
    processes = []
    for number in range(header + 1, len(lines)):
        line = lines[number].rstrip()
        if _RULE_RE.match(line):
            continue
        cells = rd.box_cells(line)
        if cells is not None and len(cells) == 1 and _NO_PROCESS_RE.match(cells[0]):
            continue
        ids = cells[0].split() if cells is not None and len(cells) == 4 else []
        chip = tuple(rd.strict_int(i) for i in ids) if len(ids) == 2 else None
        pid, used = (rd.strict_int(cells[1]), rd.strict_int(cells[3])) if ids else (None, None)
        if chip not in chips or not pid or used is None:
            return [], rd.broken_table("npu-smi", number + 1)
        processes.append(rd.new_process(chips[chip], pid, rd.text(cells[2]), used))
    return processes, None
