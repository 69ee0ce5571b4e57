"""The head's side of the hardware layer: a nodelet's vendor-neutral messages as model values.

The nodelet (``node/``) reads every vendor's devices and sends plain dicts (the keys
of ``backends.reading.FIELDS``); :func:`read_probe` turns one probe message into
``GpuReading``/``GpuProcess`` values, the problems to show on the node and the notes of
impossible readings the node clamped, and :func:`read_hello` the facts a hello carries
(CUDA version, topology with each pair's PCIe link). Nothing here knows a tool's format.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field, fields

from ..model import GpuProcess, GpuReading
from ..scheduler.topology import pcie_gbps
from ..node.backends import topo
from ..node.backends.reading import FIELDS

_READING_FIELDS = frozenset(f.name for f in fields(GpuReading))
_CUDA_VERSION = re.compile(r"CUDA Version:\s*(\d+\.\d+)")

assert _READING_FIELDS <= set(FIELDS), "GpuReading has a field the nodelet never sends"


def gpu_reading(device: dict) -> GpuReading:
    """One vendor-neutral reading (a dict from any backend) as a ``GpuReading``.

    Unknown keys are ignored, so a newer nodelet's extra fields never break an older head;
    a missing index, uuid or name becomes -1, "" and "" (the caller skips uuid-less ones).
    """
    values = {key: device[key] for key in _READING_FIELDS if device.get(key) is not None}
    values.setdefault("index", -1)
    values.setdefault("uuid", "")
    values.setdefault("name", "")
    if isinstance(values.get("throttle_reasons"), list):
        values["throttle_reasons"] = tuple(values["throttle_reasons"])
    errors = device.get("err_fields")
    if errors and isinstance(errors, list) and not values.get("lost"):
        # ERR!: the driver failed to read those fields of the card (each reads None)
        values["lost"] = "nvidia-smi shows ERR! for " + ", ".join(str(e) for e in errors[:8])
    for key in ("index", "memory_total_mb", "memory_used_mb"):
        if key in values and not isinstance(values[key], int):
            with contextlib.suppress(TypeError, ValueError):
                values[key] = int(values[key])
    return GpuReading(**values)


def gpu_process(process: dict) -> GpuProcess | None:
    """A process dict as a ``GpuProcess``; None when it names no pid."""
    pid = process.get("pid")
    if not isinstance(pid, int):
        return None
    return GpuProcess(gpu_uuid=process.get("gpu_uuid"), pid=pid, name=process.get("name"),
                      used_memory_mb=process.get("used_memory_mb"))


@dataclass(frozen=True)
class ProbeView:
    """What one probe says: the devices, their processes, and what the node should show.

    ``problem``: one line for the node ("" when every backend read its devices); ``notes``:
    sentences about readings the node clamped as impossible, one per new episode.
    """

    readings: list[GpuReading]
    processes: list[GpuProcess]
    problem: str = ""
    notes: list[str] = field(default_factory=list)
    #: uuids of the devices whose process lists are unknown (a tool's table a process name
    #: broke): none of their processes is in ``processes``, and none is believed
    unreadable: frozenset[str] = frozenset()


def read_probe(node: str, message: dict) -> ProbeView:
    """A nodelet's ``probe`` message -> :class:`ProbeView`. Never raises on odd content: a
    message it cannot read is a view with no devices and the reason as its problem."""
    devices = message.get("devices")
    if not isinstance(devices, list):
        return ProbeView([], [], "probe output not understood: devices is not a list")
    readings = [gpu_reading(d) for d in devices if isinstance(d, dict)]
    processes = [p for p in (gpu_process(d) for d in message.get("processes") or []
                             if isinstance(d, dict)) if p is not None]
    problems = [str(p) for p in message.get("problems") or []]
    if message.get("error"):
        problems.insert(0, str(message["error"]))
    names = {r.uuid: r for r in readings}
    notes = [_clamp_note(node, names.get(n.get("uuid")), n) for n in message.get("clamped") or []
             if isinstance(n, dict)]
    unreadable = frozenset(str(u) for u in message.get("unreadable") or [] if isinstance(u, str))
    processes = [p for p in processes if p.gpu_uuid not in unreadable]
    return ProbeView(readings, processes, "; ".join(problems), notes, unreadable)


def _clamp_note(node: str, reading: GpuReading | None, note: dict) -> str:
    where = f"{node}:{reading.index}" if reading else f"{node}:{note.get('index', '?')}"
    model = f" ({reading.name})" if reading and reading.name else ""
    label, unit = _LABELS.get(note.get("field"), (str(note.get("field")), ""))
    return (f"{where}{model} reported {label} {_show(note.get('value'))}{unit}, which cannot be; "
            f"shown as {_show(note.get('shown'))}{unit}")


_LABELS = {"utilization_pct": ("utilisation", "%"), "fan_pct": ("fan speed", "%"),
           "power_w": ("power", " W"), "power_limit_w": ("power limit", " W"),
           "memory_used_mb": ("memory used", " MiB"), "memory_total_mb": ("memory", " MiB"),
           "temperature_c": ("temperature", " °C")}


def _show(value: object) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


#: Without a base clock from the driver, R19 compares with this share of the max SM clock
#: (base clocks sit between about 65 % and 90 % of the max).
BASE_CLOCK_OF_MAX = 0.8


def base_sm_clock(reading: GpuReading) -> float | None:
    """The SM clock R19 calls the card's base: the driver's default application clock, or
    a share of its max clock; None when the backend reads neither."""
    if reading.base_sm_clock_mhz:
        return reading.base_sm_clock_mhz
    if reading.max_sm_clock_mhz:
        return reading.max_sm_clock_mhz * BASE_CLOCK_OF_MAX
    return None


# --- hello -------------------------------------------------------------------------------


def hello_cuda_version(hello: dict) -> str | None:
    """The highest CUDA version the node's driver supports ("12.4"), or None."""
    if hello.get("cuda_version"):
        return str(hello["cuda_version"])
    match = _CUDA_VERSION.search(hello.get("smi_table") or "")
    return match.group(1) if match else None


def hello_topology(hello: dict) -> dict | None:
    """The node's link matrix, ``{"gpus": [...], "links": {"GPU0": {"GPU1": code}}}``, by
    node device index, or None when the node sent none.

    PCIe paths carry the pair's slower link (R9: a 4090 on x16 with a laptop card on x8
    runs at x8) as ``PHB/g4x8``, which ``scheduler.topology.link_rank`` reads; NVLink and
    XGMI codes stay as they are.
    """
    links = hello.get("links")
    if not isinstance(links, dict):
        text = hello.get("topo")
        if not text:
            return None
        try:
            links = topo.parse_topo(text)["links"]
        except ValueError:
            return None
    pcie = {}
    for device in hello.get("devices") or []:
        if isinstance(device, dict) and isinstance(device.get("index"), int):
            gen = device.get("pcie_gen_max") or device.get("pcie_gen")
            width = device.get("pcie_width_max") or device.get("pcie_width")
            if gen and width:
                pcie[f"GPU{device['index']}"] = (int(gen), int(width))
    annotated = {}
    for row, cells in links.items():
        annotated[row] = {}
        for col, code in cells.items():
            annotated[row][col] = _with_link(code, pcie.get(row), pcie.get(col))
    names = sorted(set(annotated) | {c for cells in annotated.values() for c in cells},
                   key=lambda n: (len(n), n))
    return {"gpus": names, "links": annotated}


def _with_link(code: str, a: tuple[int, int] | None, b: tuple[int, int] | None) -> str:
    if not code or code.upper().startswith(("NV", "XGMI")) or a is None or b is None:
        return code
    gen, width = min((a, b), key=lambda link: pcie_gbps(*link))
    return f"{code}/g{gen}x{width}"
