"""Sizes, durations and task ranges as people write them: one parser each, for the CLI,
the TUI's form and nodes.yaml alike (``--gpu-mem 8G``, ``--time 2h``, ``node_lease: 10m``,
``isolation_grace: 15s``, ``--array 0-99%8``). Pure: each raises ValueError with a
sentence saying how to write it."""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass

MIB_PER_GIB = 1024

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b)?\s*$", re.IGNORECASE)
_UNIT_MB = {"": None, "k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}
_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h|d)?\s*$", re.IGNORECASE)
_UNIT_S = {None: 1, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}
DURATION_EXAMPLES = "600, 90s, 10m, 1h or 7d"


def parse_size_mb(text: str) -> int:
    """Parse a memory size as users write it: 8G, 8GB, 8GiB, 8192M, 0.5T -> MiB.

    G, GB and GiB all mean 1024 MiB, the way nvidia-smi counts. A bare number is taken as
    GiB when small (<= 1024, "8" = 8 GiB) — nobody asks for 8 MiB of a GPU. Raises
    ValueError with a sentence naming what is wrong.
    """
    match = _SIZE_RE.match(str(text))
    if not match:
        raise ValueError(f"'{text}' is not a size; write it like 8G, 8GB, 8GiB or 8192M")
    number, unit, _ = match.groups()
    scale = _UNIT_MB[unit.lower()]
    if scale is None:
        scale = MIB_PER_GIB if float(number) <= 1024 else 1
    mb = float(number) * scale
    if mb < 1:
        raise ValueError(f"'{text}' is smaller than 1 MiB")
    return int(round(mb))


def parse_duration_s(value: object) -> float:
    """``600``, ``"600s"``, ``"10m"``, ``"1h"``, ``"7d"`` -> seconds (a bare number is
    seconds). Raises ValueError (a sentence) for anything else, and for 0 or less."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration; write it like {DURATION_EXAMPLES}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        match = _DURATION_RE.match(str(value))
        if not match:
            raise ValueError(f"'{value}' is not a duration; write it like {DURATION_EXAMPLES}")
        seconds = float(match.group(1)) * _UNIT_S[(match.group(2) or "").lower() or None]
    if not math.isfinite(seconds):
        raise ValueError(f"'{value}' is not a duration; write it like {DURATION_EXAMPLES}")
    if seconds <= 0:
        raise ValueError(f"'{value}' must be longer than 0 s")
    return seconds


def duration_text(seconds: float) -> str:
    """How long, for people: 45 -> "45 s", 1500 -> "25 min", 10800 -> "3 h", 3 days -> "3 days"."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 86400:.0f} days"


def duration_short(seconds: float | None) -> str:
    """How long, in a table cell: "45s", "3m12s", "12m", "3h05m", "2d4h" — to the unit that
    matters; "-" for none. The one short form every client writes (``duration_text`` is
    the one for sentences)."""
    if seconds is None:
        return "-"
    s = int(max(0, seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s" if s < 600 else f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600}h"


_ARRAY_PART = re.compile(r"^(\d+)(?:-(\d+))?$")
#: the most tasks one --array may have
MAX_ARRAY_TASKS = 10_000


@dataclass(frozen=True)
class TaskArray:
    """``--array`` parsed: the task numbers in the order written (each once), how many may
    run at once (None: no limit) and the text as the user wrote it, which is how it is
    stored, sent and shown. Made by :meth:`parse` at the edge (the CLI's flag, the head's
    request); everything after reads these fields."""

    text: str
    indices: tuple[int, ...]
    limit: int | None = None

    def __str__(self) -> str:
        return self.text

    @staticmethod
    def parse(text: str) -> TaskArray:
        """``--array`` as users write it (Slurm's form): ``0-99%8`` -> tasks 0 … 99, at
        most 8 at once; ``1,3,5-7`` -> tasks 1, 3, 5, 6, 7, no limit. Raises ValueError
        with a sentence. One text is parsed once a process (the tasks of an array read
        from the store share it)."""
        return _parse_array(str(text))


@functools.lru_cache(maxsize=64)
def _parse_array(text: str) -> TaskArray:
    body, _, limit_text = text.strip().partition("%")
    limit = None
    if limit_text:
        if not limit_text.strip().isdigit() or int(limit_text) < 1:
            raise ValueError(f"--array '{text}': after % comes how many tasks may run at once, "
                             "e.g. 0-99%8")
        limit = int(limit_text)
    indices: list[int] = []
    for part in body.split(","):
        match = _ARRAY_PART.match(part.strip())
        if not match:
            raise ValueError(f"--array '{text}' is not a list of task numbers like 0-99, 1,3,5-7 or 0-99%8")
        first, last = int(match.group(1)), int(match.group(2) or match.group(1))
        if last < first:
            raise ValueError(f"--array '{text}': {first}-{last} runs backwards")
        if last - first + 1 + len(indices) > MAX_ARRAY_TASKS:
            raise ValueError(f"--array '{text}' has more than {MAX_ARRAY_TASKS} tasks")
        indices.extend(range(first, last + 1))
    return TaskArray(text, tuple(dict.fromkeys(indices)), limit)
