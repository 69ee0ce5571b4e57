"""What AMD's tools print, as vendor-neutral readings: ``amd-smi`` (its default table),
``rocm-smi`` (the concise table and ``--json``) and ``rocm-smi --showtopo --json``. Pure.

``amd-smi``'s table names no UUID and ``rocm-smi``'s concise one only a short GUID; a
device without a vendor id gets one made from its PCI address (stable while the card
stays in its slot), so it is never lost. Travels to the nodes with the nodelet (stdlib
only, Python 3.6 syntax, no annotations).
"""

import json
import re

from . import reading as rd

#: AMD's device ids -> the LLVM target (``--arch gfx90a``): the Instinct cards a lab meets.
GFX_BY_DEVICE_ID = {
    "0x738c": "gfx908", "0x738e": "gfx908",                       # MI100
    "0x7408": "gfx90a", "0x740c": "gfx90a", "0x740f": "gfx90a",   # MI250X, MI250, MI210
    "0x74a0": "gfx942", "0x74a1": "gfx942", "0x74a5": "gfx942", "0x74b5": "gfx942",  # MI300
    "0x744c": "gfx1100", "0x7448": "gfx1100",                      # RX 7900 XTX / W7900
}

#: Model names -> LLVM target, where the tool names the model but not the device id.
_GFX_BY_MODEL = (("MI300", "gfx942"), ("MI325", "gfx942"), ("MI250", "gfx90a"),
                 ("MI210", "gfx90a"), ("MI100", "gfx908"), ("MI50", "gfx906"), ("MI60", "gfx906"))


def gfx_target(device_id=None, name=None):
    """The ``gfx…`` target of a card from its device id or, failing that, its model name."""
    if device_id and device_id.lower() in GFX_BY_DEVICE_ID:
        return GFX_BY_DEVICE_ID[device_id.lower()]
    for model, target in _GFX_BY_MODEL:
        if name and model in name:
            return target
    return None


# Gigatransfers per second per lane -> PCIe generation.
_GEN_BY_GTS = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}
_PCIE_LEVEL_RE = re.compile(r"(\d+(?:\.\d+)?)\s*GT/s\s*x(\d+)")


def pci_uuid(bus_id):
    """A stand-in id for a device its tool names no UUID for: ``AMD-0000:a6:00.0``."""
    return "AMD-%s" % bus_id.lower() if bus_id else ""


def _pcie(level):
    """``0 (16.0GT/s x16)`` / ``16.0GT/s x16 *`` -> (generation, width); (None, None)."""
    match = _PCIE_LEVEL_RE.search(level or "")
    if not match:
        return None, None
    return _GEN_BY_GTS.get(float(match.group(1))), int(match.group(2))


def _model(series):
    """``Arcturus GL-XL [Instinct MI100]`` -> ``AMD Instinct MI100``; other names as they are."""
    if not series:
        return None
    inner = re.search(r"\[([^\]]+)\]", series)
    name = inner.group(1) if inner else series
    return name if name.startswith("AMD") else "AMD " + name


# --- amd-smi (default table) -------------------------------------------------------------------

_AMD_SMI_VERSION_RE = re.compile(r"AMD-SMI\s+(\S+)\s+amdgpu version:\s+(\S+)\s+ROCm version:\s+(\S+)")
_BDF_RE = re.compile(r"^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")
_FIELD_SPLIT = re.compile(r"\s{2,}")
#: A row of the process box: the name (free text) lies between the fields read from the left
#: (GPU, PID) and those read from the right (GTT, VRAM, MEM, CU %); it is never believed.
_AMD_PROCESS_RE = re.compile(r"^\|\s*(?P<gpu>[0-9]+)\s+(?P<pid>[0-9]+)\s+(?P<name>.*?)\s*(?P<gtt>\S+ \S+)\s+"
                             r"(?P<vram>\S+ \S+)\s+(?P<mem>\S+ \S+)\s+(?P<cu>\S+ %|N/A)\s*\|$")
_AMD_PROCESS_HEADER_RE = re.compile(r"^\|\s*GPU\s+PID\s+Process Name\s+GTT_MEM\s+VRAM_MEM\s+MEM_USAGE\s+CU %\s*\|$")
_RULE_RE = re.compile(r"^\+[-=+]+\+$|^\|[-=+]+\|$")


def _used_total(cell):
    """``283/196592 MB`` -> (283, 196592); ``129/750 W`` -> (129.0, 750.0)."""
    match = re.match(r"^(\S+?)\s*/\s*(\S+)\s*(MB|W|GB)?$", cell or "")
    if not match:
        return None, None
    unit = match.group(3) or ""
    scale = 1024 if unit == "GB" else 1
    left, right = rd.number(match.group(1)), rd.number(match.group(2))
    return (None if left is None else left * scale), (None if right is None else right * scale)


def parse_amd_smi(text):
    """``amd-smi`` (the default view) -> (readings, processes, facts).

    Each GPU takes two rows of the box: ``BDF name | mem-util temp UEC power/cap`` and
    ``GPU HIP-ID OAM-ID partition | gfx-util fan used/total``; each cell is read alone.
    """
    facts = {"amd_smi_version": None, "driver_version": None, "rocm_version": None}
    readings = []
    pending = None
    lines = text.rstrip().splitlines()
    box = next((n for n, raw in enumerate(lines) if rd.box_cells(raw) == ["Processes:"]), len(lines))
    for raw in lines[:box]:
        version = _AMD_SMI_VERSION_RE.search(raw)
        if version:
            facts.update(amd_smi_version=version.group(1), driver_version=version.group(2),
                         rocm_version=version.group(3))
            continue
        cells = rd.box_cells(raw)
        if not cells or len(cells) != 2:
            continue
        left = cells[0].split(None, 1)
        right = _FIELD_SPLIT.split(cells[1].strip())
        if len(left) == 2 and _BDF_RE.match(left[0]):
            pending = {"pci_bus_id": left[0], "name": left[1], "right": right}
            continue
        words = cells[0].split()
        if pending is not None and words and words[0].isdigit():
            first, second = pending["right"], right
            power, limit = _used_total(first[-1]) if first else (None, None)
            used, total = _used_total(second[-1]) if second else (None, None)
            index = int(words[0])
            readings.append(rd.new_reading(
                "amd", index, uuid=pci_uuid(pending["pci_bus_id"]), name=pending["name"],
                pci_bus_id=pending["pci_bus_id"],
                memory_used_mb=None if used is None else int(used),
                memory_total_mb=None if total is None else int(total),
                utilization_pct=rd.number(second[0]) if second else None,
                temperature_c=rd.number(first[1]) if len(first) > 1 else None,
                ecc_uncorrected=rd.integer(first[2]) if len(first) > 2 else None,
                power_w=power, power_limit_w=limit,
                fan_pct=rd.number(second[1]) if len(second) > 2 else None,
                driver_version=facts["driver_version"],
                compute_cap=gfx_target(name=pending["name"]),
                visible_id=words[1] if len(words) > 1 and words[1].isdigit() else str(index),
                partition=words[3] if len(words) > 3 else None))
            pending = None
    processes, broken = _amd_processes(lines, box, dict((r["index"], r["uuid"]) for r in readings))
    if broken:
        facts[rd.UNREADABLE] = broken
    return readings, processes, facts


def _amd_processes(lines, box, uuids):
    """The process box, from its ``Processes:`` row at ``lines[box]`` to the end of the
    output -> (processes, None), or ([], why) when a line of it is no row the box can have
    (one a process name made: see ``reading.UNREADABLE``). ``uuids``: GPU index -> uuid."""
    processes, closed = [], False
    for number in range(box + 1, len(lines)):
        line = lines[number].rstrip()
        row = None if closed else _AMD_PROCESS_RE.match(line)
        if row is not None:
            pid, gpu, vram = rd.strict_int(row.group("pid")), rd.strict_int(row.group("gpu")), _mb(row.group("vram"))
            if pid and gpu in uuids and vram is not None:
                processes.append(rd.new_process(uuids[gpu], pid, rd.text(row.group("name")), vram))
                continue
        elif not closed and (_AMD_PROCESS_HEADER_RE.match(line)
                             or rd.box_cells(line) == ["No running processes found"]):
            continue
        elif not closed and _RULE_RE.match(line):
            closed = line.startswith("+") and number > box + 3  # the box's last rule
            continue
        return [], rd.broken_table("amd-smi", number + 1)
    return processes, None


def _mb(text):
    """``4.0 MB`` / ``1.2 GB`` / ``512 KB`` -> MiB."""
    match = re.match(r"^(\d+(?:\.\d+)?)\s*(KB|MB|GB|B)$", (text or "").strip())
    if not match:
        return None
    scale = {"B": 1.0 / (1024 * 1024), "KB": 1.0 / 1024, "MB": 1.0, "GB": 1024.0}[match.group(2)]
    return int(round(float(match.group(1)) * scale))


# --- rocm-smi (concise table) ---------------------------------------------------------------

_CONCISE_COLUMNS = {
    "device": "index", "gpu": "index", "temp": "temperature_c", "power": "power_w",
    "avgpwr": "power_w", "sclk": "sm_clock_mhz", "mclk": "mem_clock_mhz", "fan": "fan_pct",
    "perf": "perf", "pwrcap": "power_limit_w", "gpu%": "utilization_pct", "vram%": "vram_pct",
    "ids": "ids",
}


def parse_rocm_smi_concise(text):
    """``rocm-smi`` (the concise table, 5.x and 6.x headers) -> (readings, [], facts).

    The table has no memory size (only ``VRAM%``), so memory is None; ``IDs`` gives the
    device id (for the ``gfx`` target) and the GUID.
    """
    names = None
    readings = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("=") or "ROCm System Management" in line:
            continue
        if names is None and (line.startswith("Device") or line.startswith("GPU")):
            names = [w.lower() for w in line.split() if not w.startswith("(")]
            continue
        if names is None or line.startswith("("):
            continue
        cells = rd.joined_words(line, ",")
        if not cells or not cells[0].isdigit() or len(cells) != len(names):
            continue
        values = dict(zip(names, cells))
        index = int(values.get("device", values.get("gpu")))
        reading = rd.new_reading("amd", index, uuid="", name="")
        for column, cell in values.items():
            key = _CONCISE_COLUMNS.get(column)
            if key in rd.FIELDS and key != "index":
                reading[key] = rd.number(cell)
        ids = values.get("ids", "").split(",")
        if ids and ids[0].startswith("0x"):
            reading["compute_cap"] = gfx_target(ids[0])
            reading["device_id"] = ids[0].lower()
        if len(ids) > 1 and rd.text(ids[1]):
            reading["guid"] = ids[1]
        reading["perf_level"] = rd.text(values.get("perf"))
        readings.append(reading)
    return readings, [], {}


# --- rocm-smi --json -------------------------------------------------------------------------

_CLOCK_RE = re.compile(r"\(?(\d+(?:\.\d+)?)\s*Mhz\)?", re.IGNORECASE)


def _clock(value):
    match = _CLOCK_RE.search(value or "")
    return float(match.group(1)) if match else None


def _first(card, *keys):
    for key in keys:
        value = rd.text(card.get(key))
        if value is not None:
            return value
    return None


def _card_index(name):
    match = re.match(r"^card(\d+)$", name)
    return int(match.group(1)) if match else None


def rocm_json_reading(name, card, driver_version=None):
    """One ``cardN`` object of ``rocm-smi --json`` -> a reading."""
    index = _card_index(name)
    device_id = (_first(card, "Device ID") or "").lower() or None
    gen, width = _pcie(_first(card, "pcie clock level", "PCIe clock level"))
    bus = _first(card, "PCI Bus")
    total_b = _first(card, "VRAM Total Memory (B)")
    used_b = _first(card, "VRAM Total Used Memory (B)")
    return rd.new_reading(
        "amd", index,
        # By bus, as amd-smi's view (which shows no id) is named: one card keeps one id
        # whichever tool reads it; rocm-smi's own id is kept beside.
        uuid=pci_uuid(bus), unique_id=_first(card, "Unique ID"),
        name=_first(card, "Device Name") or _model(_first(card, "Card series", "Card Series"))
        or "AMD GPU",
        pci_bus_id=bus,
        memory_total_mb=rd.mib_from_bytes(total_b),
        memory_used_mb=rd.mib_from_bytes(used_b),
        utilization_pct=rd.number(_first(card, "GPU use (%)")),
        temperature_c=rd.number(_first(card, "Temperature (Sensor edge) (C)",
                                       "Temperature (Sensor junction) (C)")),
        power_w=rd.number(_first(card, "Average Graphics Package Power (W)",
                                 "Current Socket Graphics Package Power (W)")),
        power_limit_w=rd.number(_first(card, "Max Graphics Package Power (W)")),
        fan_pct=rd.number(_first(card, "Fan speed (%)")),
        sm_clock_mhz=_clock(_first(card, "sclk clock speed:")),
        mem_clock_mhz=_clock(_first(card, "mclk clock speed:")),
        max_sm_clock_mhz=_max_level(card),
        pcie_gen=gen, pcie_width=width,
        compute_cap=_first(card, "GFX Version") or gfx_target(device_id, _first(card, "Card series")),
        driver_version=driver_version,
        health=None,
    )


def _max_level(card):
    """The highest sclk level listed (``"15": "1502Mhz"``) as the max SM clock."""
    levels = [_clock(v) for k, v in card.items() if k.isdigit() and "GT/s" not in str(v)]
    levels = [v for v in levels if v is not None]
    return max(levels) if levels else None


_PIDS_RE = re.compile(r"^PID(\d+)$")


def parse_rocm_smi_json(text):
    """``rocm-smi … --json`` -> (readings, processes, facts); the ``system`` object gives
    the driver version and, with ``--showtopo``, the links (see :func:`rocm_topology`).
    Raises ValueError for text that is not JSON."""
    document = json.loads(text)
    if not isinstance(document, dict):
        raise ValueError("rocm-smi --json printed %s, not an object of cards" % type(document).__name__)
    system = document.get("system") if isinstance(document.get("system"), dict) else {}
    driver = rd.text(system.get("Driver version"))
    readings = [rocm_json_reading(name, card, driver) for name, card in sorted(
        document.items(), key=lambda item: (_card_index(item[0]) is None, _card_index(item[0]) or 0))
        if isinstance(card, dict) and _card_index(name) is not None]
    processes = []
    for key, value in system.items():
        match = _PIDS_RE.match(key)  # --showpids: "PID1234": "python3, 1, 4096, 0, 0"
        if match:
            parts = [p.strip() for p in str(value).split(",")]
            if len(parts) > 5:  # a name holding commas: the four numbers are the last four
                parts = [", ".join(parts[:-4])] + parts[-4:]
            gpu = rd.integer(parts[1]) if len(parts) > 1 else None
            uuid = next((r["uuid"] for r in readings if r["index"] == gpu), None)
            processes.append(rd.new_process(uuid, int(match.group(1)), parts[0] or None,
                                            rd.mib_from_bytes(parts[2]) if len(parts) > 2 else None))
    return readings, processes, {"driver_version": driver, "links": rocm_topology(system)}


_TOPO_KEY_RE = re.compile(r"^\(Topology\) (Link type|Hops|Weight) between DRM devices (\d+) and (\d+)$")


def rocm_topology(system):
    """The ``system`` object's ``(Topology) …`` keys -> ``{"GPU0": {"GPU1": code}}`` with
    codes as ``nvidia-smi topo -m`` writes them: ``XGMI`` for Infinity Fabric links, and a
    PCIe path by its hop count (1 ``PIX``, 2 ``PHB`` through the CPU, more ``SYS``)."""
    pairs = {}
    for key, value in system.items():
        match = _TOPO_KEY_RE.match(key)
        if match:
            pair = (int(match.group(2)), int(match.group(3)))
            pairs.setdefault(pair, {})[match.group(1)] = rd.text(value)
    links = {}
    for (a, b), facts in sorted(pairs.items()):
        kind = (facts.get("Link type") or "").upper()
        hops = rd.integer(facts.get("Hops"))
        if kind == "XGMI":
            code = "XGMI"
        elif kind == "PCIE":
            code = "PIX" if hops == 1 else "PHB" if hops == 2 else "SYS"
        else:
            continue
        links.setdefault("GPU%d" % a, {})["GPU%d" % b] = code
        links.setdefault("GPU%d" % b, {})["GPU%d" % a] = code
    return links
