"""Parsers for what ``nvidia-smi`` prints: CSV queries and the default table. Pure: no I/O.

Every field is parsed on its own, so a ``[N/A]`` or ``[Not Supported]`` (old drivers, laptop
cards, GB10's unified memory) becomes ``None`` for that field only and never loses the GPU.
The same functions read real outputs (``shared/samples``) and the simulated lab's emulator.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import asdict

from ...model import GpuProcess, GpuReading

#: What the probe asks ``--query-gpu`` for, in this order (noheader output relies on it).
QUERY_GPU_FIELDS: tuple[str, ...] = (
    "index", "uuid", "name", "pci.bus_id", "memory.total", "memory.used", "utilization.gpu",
    "temperature.gpu", "power.draw", "power.limit", "fan.speed", "clocks.sm", "clocks.mem",
    "pstate", "driver_version", "compute_cap",
)
#: What the probe asks ``--query-compute-apps`` for, in this order.
QUERY_APPS_FIELDS: tuple[str, ...] = ("gpu_uuid", "pid", "process_name", "used_gpu_memory")

_CSV_FORMAT = "--format=csv,noheader,nounits"


class ParseError(ValueError):
    """nvidia-smi output that cannot be read as the layout it claims (or was said) to have."""


def query_gpu_argv() -> list[str]:
    """The argv the probe runs to read every GPU (CSV, no header, no units)."""
    return ["nvidia-smi", "--query-gpu=" + ",".join(QUERY_GPU_FIELDS), _CSV_FORMAT]


def query_apps_argv() -> list[str]:
    """The argv the probe runs to list compute processes (CSV, no header, no units)."""
    return ["nvidia-smi", "--query-compute-apps=" + ",".join(QUERY_APPS_FIELDS), _CSV_FORMAT]


# --- single values -------------------------------------------------------------------------

# Anything in brackets is a status, not a value: [N/A], [Not Supported], [Unknown Error],
# [Not Found], [Insufficient Permissions], [GPU is lost] …
_MISSING = {"", "n/a", "na"}
_NUMBER_RE = re.compile(r"^(-?\d+(?:\.\d+)?)\s*(?:MiB|%|W|MHz|C|KiB|GiB)?$")
_HEADER_CELL_RE = re.compile(r"^[a-z][a-z0-9_.]*(?:\s*\[[^\]]*\])?$")
_UNIT_SUFFIX_RE = re.compile(r"\s*\[[^\]]*\]$")


def _text(raw: str | None) -> str | None:
    """A cell as text, or None when the tool said it has no value."""
    if raw is None:
        return None
    value = raw.strip()
    if value.lower() in _MISSING or (value.startswith("[") and value.endswith("]")):
        return None
    return value


def _float(raw: str | None) -> float | None:
    """``28.16 W`` / ``28.16`` / ``0 %`` -> float; anything unreadable -> None."""
    value = _text(raw)
    match = _NUMBER_RE.match(value) if value is not None else None
    return float(match.group(1)) if match else None


def _int(raw: str | None) -> int | None:
    number = _float(raw)
    return None if number is None else int(round(number))


# Field name (as the tool prints it, aliases included) -> (GpuReading attribute, converter).
_GPU_FIELD_MAP: dict[str, tuple[str, Callable[[str | None], object]]] = {
    "index": ("index", _int),
    "uuid": ("uuid", _text), "gpu_uuid": ("uuid", _text),
    "name": ("name", _text), "gpu_name": ("name", _text),
    "pci.bus_id": ("pci_bus_id", _text), "gpu_bus_id": ("pci_bus_id", _text),
    "memory.total": ("memory_total_mb", _int),
    "memory.used": ("memory_used_mb", _int),
    "utilization.gpu": ("utilization_pct", _float),
    "temperature.gpu": ("temperature_c", _float),
    "power.draw": ("power_w", _float), "power.draw.instant": ("power_w", _float),
    "power.limit": ("power_limit_w", _float), "enforced.power.limit": ("power_limit_w", _float),
    "fan.speed": ("fan_pct", _float),
    "clocks.sm": ("sm_clock_mhz", _float), "clocks.current.sm": ("sm_clock_mhz", _float),
    "clocks.mem": ("mem_clock_mhz", _float), "clocks.current.memory": ("mem_clock_mhz", _float),
    "pstate": ("pstate", _text),
    "driver_version": ("driver_version", _text),
    "compute_cap": ("compute_cap", _text),
}

_APPS_FIELD_MAP: dict[str, tuple[str, Callable[[str | None], object]]] = {
    "gpu_uuid": ("gpu_uuid", _text),
    "pid": ("pid", _int),
    "process_name": ("name", _text), "name": ("name", _text),
    "used_gpu_memory": ("used_memory_mb", _int), "used_memory": ("used_memory_mb", _int),
}


# --- CSV ---------------------------------------------------------------------------------

# A GPU the driver lost is reported in the middle of query output instead of its row.
_LOST_RE = re.compile(r"^Unable to determine the device handle for (?:GPU)?\s*(\S+?):\s*(.*)$")


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.split(",")]


def _is_header(cells: list[str]) -> bool:
    """A header names fields (``memory.total [MiB]``); no data row is all lowercase names."""
    return all(_HEADER_CELL_RE.match(cell) for cell in cells) and any(
        "." in cell or "_" in cell or cell in ("index", "name", "uuid", "pid", "pstate")
        for cell in cells
    )


def _split_csv(text: str, fields: Sequence[str] | None, default: Sequence[str]):
    """Return (field names, data rows as cell lists, warnings) of a CSV query output.

    The header, when there is one, decides the fields (units stripped from the names);
    otherwise ``fields`` (or ``default``). Lost-GPU lines become warnings.
    """
    lines = [line for line in text.splitlines() if line.strip()]
    warnings: list[str] = []
    data: list[list[str]] = []
    names: list[str] | None = None
    for line in lines:
        lost = _LOST_RE.match(line.strip())
        if lost:
            warnings.append(f"GPU {lost.group(1)} could not be read: {lost.group(2)}")
            continue
        cells = _cells(line)
        if names is None and not data and _is_header(cells):
            names = [_UNIT_SUFFIX_RE.sub("", cell) for cell in cells]
            continue
        data.append(cells)
    if names is None:
        names = list(fields if fields is not None else default)
    return names, data, warnings


def _check_width(names: Sequence[str], cells: list[str], row_number: int) -> None:
    if len(cells) != len(names):
        raise ParseError(
            f"row {row_number} has {len(cells)} values but {len(names)} fields were expected "
            f"({', '.join(names)}); the output's field list is not the one assumed"
        )


def _convert(names: Sequence[str], cells: list[str], field_map) -> dict[str, object]:
    """Map a row onto dataclass keyword arguments; unknown fields (timestamp…) are ignored."""
    values: dict[str, object] = {}
    for name, cell in zip(names, cells):
        target = field_map.get(name.strip().lower())
        if target is not None:
            attribute, converter = target
            values[attribute] = converter(cell)
    return values


def _reading(position: int, values: dict[str, object]) -> GpuReading:
    if values.get("index") is None:
        values["index"] = position
    values["uuid"] = values.get("uuid") or ""
    values["name"] = values.get("name") or ""
    return GpuReading(**values)


def parse_query_gpu_report(
    text: str, fields: Sequence[str] | None = None
) -> tuple[list[GpuReading], list[str]]:
    """Like :func:`parse_query_gpu`, also returning warnings (GPUs the driver lost).

    Raises ParseError when a row's value count differs from the field list.
    """
    names, rows, warnings = _split_csv(text, fields, QUERY_GPU_FIELDS)
    readings = []
    for position, cells in enumerate(rows):
        _check_width(names, cells, position + 1)
        readings.append(_reading(position, _convert(names, cells, _GPU_FIELD_MAP)))
    return readings, warnings


def parse_query_gpu(text: str, fields: Sequence[str] | None = None) -> list[GpuReading]:
    """Parse ``--query-gpu`` CSV output, with or without header and units.

    With a header the fields are read from it; without, ``fields`` (default
    QUERY_GPU_FIELDS) says what each column is. Missing values are None; a missing index is
    the row position, a missing uuid or name is "". Raises ParseError when a row's value
    count differs from the field list.
    """
    return parse_query_gpu_report(text, fields)[0]


def parse_query_apps(text: str, fields: Sequence[str] | None = None) -> list[GpuProcess]:
    """Parse ``--query-compute-apps`` CSV output; header only (or nothing) = no processes.

    A row without a readable pid is dropped (it names no process we could act on); a name
    of ``[Not Found]`` (process in another PID namespace) is None. Raises ParseError when a
    row's value count differs from the field list.
    """
    names, rows, _ = _split_csv(text, fields, QUERY_APPS_FIELDS)
    processes = []
    for position, cells in enumerate(rows):
        _check_width(names, cells, position + 1)
        values = _convert(names, cells, _APPS_FIELD_MAP)
        if values.get("pid") is None:
            continue
        processes.append(
            GpuProcess(
                gpu_uuid=values.get("gpu_uuid"),
                pid=values["pid"],
                name=values.get("name"),
                used_memory_mb=values.get("used_memory_mb"),
            )
        )
    return processes


# --- the default table ---------------------------------------------------------------------

_VERSION_RE = re.compile(
    r"NVIDIA-SMI\s+(?P<smi>\S+)\s+Driver Version:\s+(?P<driver>\S+)\s+CUDA Version:\s+(?P<cuda>\S+)"
)
_GPU_LINE1_RE = re.compile(
    r"^\|\s*(?P<index>\d+)\s+(?P<name>.+?)\s+(?P<persistence>On|Off|WDDM|TCC)\s*"
    r"\|\s*(?P<bus>[0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+\.[0-9A-Fa-f])\s+(?P<disp>\S+)\s*"
    r"\|\s*(?P<ecc>.*?)\s*\|$"
)
_GPU_LINE2_RE = re.compile(
    r"^\|\s*(?P<fan>\S+)\s+(?P<temp>\S+)\s+(?P<perf>\S+)\s+(?P<power>\S+)\s*/\s*(?P<cap>\S+)\s*"
    r"\|\s*(?P<used>\S+)\s*/\s*(?P<total>\S+)\s*\|\s*(?P<util>\S+)\s+(?P<compute>.*?)\s*\|$"
)
_LAST_CELL_RE = re.compile(r"\|\s*(?P<value>[^|]*?)\s*\|$")
_PROCESS_RE = re.compile(
    r"^\|\s*(?P<gpu>\d+|N/A)\s+(?P<gi>\S+)\s+(?P<ci>\S+)\s+(?P<pid>\d+)\s+(?P<type>\S+)\s+"
    r"(?P<name>.*?)\s+(?P<mem>\d+MiB|N/A)\s*\|$"
)
_MIG_RE = re.compile(
    r"^\|\s*(?P<gpu>\d+)\s+(?P<gi>\d+)\s+(?P<ci>\d+)\s+(?P<dev>\d+)\s*"
    r"\|\s*(?P<used>\d+)MiB\s*/\s*(?P<total>\d+)MiB\s*\|\s*(?P<sm>\d+|N/A)\b"
)


def _table_gpu(first: re.Match, second: re.Match | None, third: str | None) -> dict:
    """One GPU's three table lines -> a dict of plain values (None where N/A)."""
    gpu = {
        "index": int(first["index"]),
        "name": first["name"],
        "persistence_mode": first["persistence"],
        "pci_bus_id": first["bus"],
        "display_active": _text(first["disp"]),
        "ecc": _text(first["ecc"]),
    }
    if second is not None:
        gpu.update(
            fan_pct=_float(second["fan"]),
            temperature_c=_float(second["temp"]),
            pstate=_text(second["perf"]),
            power_w=_float(second["power"]),
            power_limit_w=_float(second["cap"]),
            memory_used_mb=_int(second["used"]),
            memory_total_mb=_int(second["total"]),
            utilization_pct=_float(second["util"]),
            compute_mode=_text(second["compute"]),
        )
    third_match = _LAST_CELL_RE.search(third) if third else None
    gpu["mig_mode"] = _text(third_match["value"]) if third_match else None
    return gpu


def _table_process(match: re.Match) -> dict:
    return {
        "gpu": _int(match["gpu"]),
        "gpu_instance": _text(match["gi"]),
        "compute_instance": _text(match["ci"]),
        "pid": int(match["pid"]),
        "type": match["type"],
        "name": match["name"],
        "used_memory_mb": _int(match["mem"]),
    }


def _table_mig(match: re.Match) -> dict:
    return {
        "gpu": int(match["gpu"]),
        "gpu_instance": int(match["gi"]),
        "compute_instance": int(match["ci"]),
        "mig_device": int(match["dev"]),
        "memory_used_mb": int(match["used"]),
        "memory_total_mb": int(match["total"]),
        "sm_count": _int(match["sm"]),
    }


def parse_plain_table(text: str) -> dict:
    """Parse the default ``nvidia-smi`` table (the 89- and 91-column layouts).

    Returns ``{"nvidia_smi_version", "driver_version", "cuda_version", "gpus": [...],
    "mig_devices": [...], "processes": [...]}``; absent pieces are None or empty. Raises
    nothing for odd input: lines it does not recognise are skipped.
    """
    lines = text.splitlines()
    result: dict = {"nvidia_smi_version": None, "driver_version": None, "cuda_version": None,
                    "gpus": [], "mig_devices": [], "processes": []}
    section = None
    i = 0
    while i < len(lines):
        line = lines[i].rstrip()
        version = _VERSION_RE.search(line)
        if version:
            result.update(nvidia_smi_version=version["smi"], driver_version=version["driver"],
                          cuda_version=version["cuda"])
        elif "MIG devices:" in line:
            section = "mig"
        elif "Processes:" in line:
            section = "processes"
        elif section is None and (first := _GPU_LINE1_RE.match(line)):
            # A GPU takes three lines; the third (MIG mode) may be absent on old drivers.
            second = _GPU_LINE2_RE.match(lines[i + 1].rstrip()) if i + 1 < len(lines) else None
            third = lines[i + 2].rstrip() if second and i + 2 < len(lines) else None
            if third is not None and not third.startswith("|"):
                third = None
            result["gpus"].append(_table_gpu(first, second, third))
            i += 1 + (second is not None) + (third is not None)
            continue
        elif section == "mig" and (mig := _MIG_RE.match(line)):
            result["mig_devices"].append(_table_mig(mig))
        elif section == "processes" and (process := _PROCESS_RE.match(line)):
            result["processes"].append(_table_process(process))
        i += 1
    return result


# --- `nebula parse KIND FILE` ----------------------------------------------------------------


def _raw_rows(text: str) -> list[list[str | None]]:
    return [[_text(cell) for cell in _cells(line)] for line in text.splitlines() if line.strip()]


def parse_csv_document(text: str) -> dict:
    """``smi-csv``: GPUs as dicts plus warnings; never raises on an unknown noheader layout.

    A noheader file whose width is not QUERY_GPU_FIELDS cannot be mapped to fields, so its
    rows come back raw under ``"rows"`` with a warning saying so.
    """
    try:
        readings, warnings = parse_query_gpu_report(text)
    except ParseError as exc:
        return {"gpus": [], "rows": _raw_rows(text),
                "warnings": [f"could not map columns to fields: {exc}"]}
    return {"gpus": [asdict(reading) for reading in readings], "warnings": warnings}


def parse_apps_document(text: str) -> dict:
    """``smi-apps``: processes as dicts; an unknown layout gives raw rows and a warning."""
    try:
        processes = parse_query_apps(text)
    except ParseError as exc:
        return {"processes": [], "rows": _raw_rows(text),
                "warnings": [f"could not map columns to fields: {exc}"]}
    return {"processes": [asdict(process) for process in processes], "warnings": []}


#: ``nebula parse KIND FILE``: kind -> function from file text to JSON-serialisable data.
PARSERS: dict[str, Callable[[str], object]] = {
    "smi-csv": parse_csv_document,
    "smi-apps": parse_apps_document,
    "smi-plain": parse_plain_table,
}
