"""``nebula parse KIND FILE``: what NebulaGrid understands from a saved tool output.

Every device kind prints the same shape: ``{"gpus": [reading, …], "processes": [...],
"warnings": [...]}`` plus the facts the tool states (driver version, …), each reading
having the keys of ``backends.reading.FIELDS`` (MIG instances under ``"mig_devices"``).
Impossible values are clamped as the nodes clamp them, with a warning.

A kind is *streamed* when its parser reads one line at a time (CSV loops can be long);
the others read the whole text, which the CLI bounds first.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from ..node.backends import amd, ascend, intel, nvidia_smi, topo
from ..node.backends.reading import clamp
from .backends import xid

#: Rows shown raw (a headerless CSV whose columns cannot be named) before the rest is cut.
RAW_ROWS_SHOWN = 1000


@dataclass(frozen=True)
class Kind:
    """One ``nebula parse`` kind: its parser and how it wants its input."""

    parse: Callable[..., object]
    help: str
    streamed: bool = False  # parse takes an iterable of lines instead of the whole text
    takes_fields: bool = False  # --fields names the columns of a headerless CSV


def _document(readings: list[dict], processes: list[dict], facts: dict | None = None,
              warnings: list[str] | None = None) -> dict:
    warnings = list(warnings or [])
    gpus, migs = [], []
    for reading in readings:
        for change in clamp(reading):
            warnings.append(f"GPU {reading.get('index')}: {change['field']} {change['value']} "
                            f"cannot be; shown as {change['shown']}")
        (migs if reading.get("parent_uuid") is not None or "parent_index" in reading
         else gpus).append(reading)
    document = {"gpus": gpus}
    if migs:
        document["mig_devices"] = migs
    document["processes"] = processes
    document.update({k: v for k, v in (facts or {}).items() if k != "links"})
    if facts and facts.get("links"):
        document["links"] = facts["links"]
    document["warnings"] = warnings
    return document


class _Kept:
    """The lines passed through, the first ones kept for a raw fallback."""

    def __init__(self, lines: Iterable[str]) -> None:
        self.lines = lines
        self.kept: list[str] = []

    def __iter__(self):
        for line in self.lines:
            if len(self.kept) < RAW_ROWS_SHOWN and line.strip():
                self.kept.append(line)
            yield line

    def raw(self) -> list:
        return nvidia_smi.raw_rows(self.kept)


def _unmapped(kept: _Kept, err: Exception, key: str) -> dict:
    """A headerless CSV whose width is not the field list: its first rows, raw."""
    document = {key: [], "rows": kept.raw()}
    if key == "gpus":
        document["processes"] = []
    document["warnings"] = [f"could not map columns to fields: {err}; name them with --fields"]
    return document


def smi_csv(lines: Iterable[str], fields: Sequence[str] | None = None) -> dict:
    kept = _Kept(lines)
    try:
        readings, warnings = nvidia_smi.parse_query_gpu_lines(kept, fields)
    except nvidia_smi.ParseError as err:
        return _unmapped(kept, err, "gpus")
    return _document(readings, [], warnings=warnings)


def smi_apps(lines: Iterable[str], fields: Sequence[str] | None = None) -> dict:
    kept = _Kept(lines)
    try:
        processes = nvidia_smi.parse_query_apps_lines(kept, fields)
    except nvidia_smi.ParseError as err:
        return _unmapped(kept, err, "processes")
    return {"processes": processes, "warnings": []}


def _lost(text: str) -> list[str]:
    """What nvidia-smi prints instead of a card the driver lost, as warnings (every view
    of the tool prints the same line: the table, ``-q``, ``--query-gpu``)."""
    return [f"GPU {card} could not be read: {why}"
            for card, why in nvidia_smi.lost_devices(text.splitlines())]


def smi_plain(text: str) -> dict:
    table = nvidia_smi.parse_plain_table(text)
    readings, processes = nvidia_smi.plain_table_readings(table)
    facts = {k: table[k] for k in ("nvidia_smi_version", "driver_version", "cuda_version")}
    document = _document(readings, processes, facts, warnings=_lost(text))
    # The table's own columns, for what the readings do not say (persistence, ECC mode).
    for reading, gpu in zip(document["gpus"], table["gpus"]):
        for key in ("persistence_mode", "display_active", "ecc", "compute_mode"):
            reading[key] = gpu.get(key)
    return document


def _triple(parse: Callable[[str], tuple],
            warn: Callable[[str], list[str]] | None = None) -> Callable[[str], dict]:
    def run(text: str) -> dict:
        readings, processes, facts = parse(text)
        return _document(readings, processes, facts, warnings=warn(text) if warn else None)
    run.__doc__ = parse.__doc__
    return run


def rocm_smi(text: str) -> dict:
    """``rocm-smi`` concise table or ``rocm-smi … --json`` (told apart by the first ``{``)."""
    if text.lstrip().startswith("{"):
        try:
            readings, processes, facts = amd.parse_rocm_smi_json(text)
        except ValueError as err:
            raise ValueError(f"not rocm-smi JSON: {err}") from None
    else:
        readings, processes, facts = amd.parse_rocm_smi_concise(text)
    return _document(readings, processes, facts)


def xpu_smi(text: str) -> dict:
    """``xpu-smi discovery`` (a ``Device Information`` column) or ``xpu-smi stats -d N``."""
    if "Device Information" in text or "Device Name:" in text:
        readings, processes, facts = intel.parse_discovery(text)
    else:
        readings, processes, facts = intel.parse_stats(text)
    return _document(readings, processes, facts)


def _xid(text: str) -> object:
    return xid.parse_xid(text)


KINDS: dict[str, Kind] = {
    "smi-csv": Kind(smi_csv, "nvidia-smi --query-gpu … --format=csv", streamed=True,
                    takes_fields=True),
    "smi-apps": Kind(smi_apps, "nvidia-smi --query-compute-apps … --format=csv", streamed=True,
                     takes_fields=True),
    "smi-plain": Kind(smi_plain, "nvidia-smi (the default table)"),
    "smi-q": Kind(_triple(nvidia_smi.parse_q, _lost), "nvidia-smi -q"),
    "smi-xml": Kind(_triple(nvidia_smi.parse_xml), "nvidia-smi -q -x"),
    "amd-smi": Kind(_triple(amd.parse_amd_smi), "amd-smi (the default view)"),
    "rocm-smi": Kind(rocm_smi, "rocm-smi, or rocm-smi … --json"),
    "xpu-smi": Kind(xpu_smi, "xpu-smi discovery, or xpu-smi stats -d N"),
    "npu-smi": Kind(_triple(ascend.parse_npu_smi), "npu-smi info"),
    "topo": Kind(topo.parse_topo, "nvidia-smi topo -m (add --best K)"),
    "xid": Kind(_xid, "kernel log lines with NVRM: Xid"),
}


def parse_text(kind: str, text: str, fields: Sequence[str] | None = None) -> object:
    """Run ``kind`` on a whole text (tests, and callers that already hold it)."""
    chosen = KINDS[kind]
    source: object = text.splitlines() if chosen.streamed else text
    return chosen.parse(source, fields) if chosen.takes_fields else chosen.parse(source)


def to_json(result: object) -> str:
    return json.dumps(result, indent=2, default=str)


#: Input bounds: a streamed kind holds one sample per GPU whatever the length, so its
#: bound only limits the time; a whole-text kind holds the text several times over while
#: parsing, and no real table, ``-q`` or JSON output comes near this.
STREAMED_LIMIT_BYTES = 256 * 1024 * 1024
WHOLE_LIMIT_BYTES = 16 * 1024 * 1024


class InputTooLarge(ValueError):
    """The input is past the bound of its kind; ``limit`` is that bound in bytes."""

    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self.limit = limit


def bounded_lines(stream, limit: int = STREAMED_LIMIT_BYTES):
    """The lines of a binary stream as text (undecodable bytes replaced), read one at a
    time; raises InputTooLarge once more than ``limit`` bytes came."""
    seen = 0
    for raw in stream:
        seen += len(raw)
        if seen > limit:
            raise InputTooLarge(limit)
        yield raw.decode("utf-8", "replace").rstrip("\r\n")


def bounded_text(stream, limit: int = WHOLE_LIMIT_BYTES) -> str:
    """A binary stream's whole text; raises InputTooLarge when it is longer than ``limit``."""
    data = stream.read(limit + 1)
    if len(data) > limit:
        raise InputTooLarge(limit)
    return data.decode("utf-8", "replace")


def parse_stream(kind: str, stream, fields: Sequence[str] | None = None) -> object:
    """Run ``kind`` on a binary stream within its bound (raises InputTooLarge past it, and
    ValueError for input the kind cannot read)."""
    chosen = KINDS[kind]
    limit = STREAMED_LIMIT_BYTES if chosen.streamed else WHOLE_LIMIT_BYTES
    try:
        size = os.fstat(stream.fileno()).st_size
    except (OSError, AttributeError, ValueError):
        size = 0  # a pipe: counted while read
    if size > limit:
        raise InputTooLarge(limit)
    source = bounded_lines(stream, limit) if chosen.streamed else bounded_text(stream, limit)
    return chosen.parse(source, fields) if chosen.takes_fields else chosen.parse(source)
