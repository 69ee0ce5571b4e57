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
    in_processes = False
    for raw in text.splitlines():
        version = _VERSION_RE.search(raw)
        if version:
            facts.update(npu_smi_version=version.group(1), driver_version=version.group(2))
            continue
        cells = rd.box_cells(raw)
        if cells is None:
            continue
        if len(cells) >= 4 and cells[1].startswith("Process id"):
            in_processes = True
            continue
        if in_processes:
            _process_row(cells, readings, processes)
            continue
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


def _process_row(cells, readings, processes):
    if len(cells) < 4:
        return
    ids = cells[0].split()
    if len(ids) < 2 or not ids[0].isdigit() or not ids[1].isdigit() or not cells[1].isdigit():
        return  # "No running processes found in NPU n", or a rule
    chip = next((r for r in readings if r.get("npu_id") == int(ids[0])
                 and r.get("chip_id") == int(ids[1])), None)
    processes.append(rd.new_process(chip["uuid"] if chip else None, int(cells[1]),
                                    rd.text(cells[2]), rd.integer(cells[3])))
