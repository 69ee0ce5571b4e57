"""Sizes, durations and task ranges as people write and read them: one parser each, for
the CLI, the TUI's form and nodes.yaml alike (``--gpu-mem 8G``, ``--time 90``, ``-t 1:30:00``,
``node_lease: 10m``, ``isolation_grace: 15s``, ``--array 0-99%8``), and every form a
duration is shown in (a sentence, a table cell, a flag, an age, a time ahead), so no
other module formats one. Pure: each parser raises ValueError with a sentence saying how
to write it."""

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
#: Slurm's forms (sbatch --time): MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS
_CLOCK_RE = re.compile(r"^\s*(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?\s*$")
DURATION_EXAMPLES = "90 (minutes), 90s, 30m, 2h, 7d, 1:30:00 or 2-12"
#: nodes.yaml's timings (node_lease: 600) keep seconds for a bare number
SECONDS_EXAMPLES = "600 (seconds), 90s, 10m, 1h or 7d"


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


def parse_duration_s(value: object, bare: str = "min") -> float:
    """A duration as typed -> seconds: ``90s``, ``30m``, ``2h``, ``7d``, and Slurm's forms
    (what ``sbatch --time`` takes): ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``,
    ``D-HH:MM:SS``. A bare number is minutes, as in Slurm (``bare="min"``, every duration
    typed at the CLI); ``bare="s"`` keeps seconds for nodes.yaml's own timings and
    ``bare=None`` refuses it as ambiguous. Raises ValueError (a sentence) for anything
    else, and for 0 or less."""
    examples = SECONDS_EXAMPLES if bare == "s" else DURATION_EXAMPLES
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration; write it like {examples}")
    text = str(value).strip()
    bare_number = isinstance(value, (int, float)) or bool(re.fullmatch(r"\d+(?:\.\d+)?", text))
    if bare_number:
        if bare is None:
            raise ValueError(f"'{value}': a bare number is ambiguous (seconds here before, "
                             "minutes in Slurm); write it with its unit, e.g. 90m, 1:30:00 or 7d")
        seconds = float(text) * _UNIT_S[bare]
    elif (clock := _CLOCK_RE.match(text)) and (":" in text or "-" in text):
        seconds = _clock_seconds(clock.groups(), value, examples)
    else:
        match = _DURATION_RE.match(text)
        if not match:
            raise ValueError(f"'{value}' is not a duration; write it like {examples}")
        seconds = float(match.group(1)) * _UNIT_S[(match.group(2) or "").lower() or None]
    if not math.isfinite(seconds):
        raise ValueError(f"'{value}' is not a duration; write it like {examples}")
    if seconds <= 0:
        raise ValueError(f"'{value}' must be longer than 0 s")
    return seconds


def _clock_seconds(groups: tuple[str | None, ...], value: object, examples: str) -> float:
    """Slurm's clock forms, as its ``time_str2mins`` reads them: with a day, the parts
    after it are hours, minutes, seconds; without one, two parts are minutes and seconds
    and three are hours, minutes and seconds."""
    day_text, *rest = groups
    parts = [int(p) for p in rest if p is not None]
    if day_text is not None:
        hours, minutes, seconds = (parts + [0, 0, 0])[:3]
        days = int(day_text)
    elif len(parts) == 2:
        days, hours, (minutes, seconds) = 0, 0, parts
    elif len(parts) == 3:
        days, (hours, minutes, seconds) = 0, parts
    else:
        raise ValueError(f"'{value}' is not a duration; write it like {examples}")
    return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)


def duration_text(seconds: float) -> str:
    """How long, for people: 45 -> "45 s", 1500 -> "25 min", 10800 -> "3 h", 3 days -> "3 days"."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 86400:.0f} days"


def duration_exact(seconds: float | None) -> str:
    """A limit as it was understood, to the second: 5400 -> "1 h 30 min", 90 -> "1 min 30 s",
    216000 -> "2 days 12 h", None -> "none" (what ``--time`` gave: a Slurm user checks that
    90 was minutes)."""
    if not seconds:
        return "none"
    s = int(round(seconds))
    parts = [(s // 86400, " days" if s // 86400 != 1 else " day"), (s % 86400 // 3600, " h"),
             (s % 3600 // 60, " min"), (s % 60, " s")]
    return " ".join(f"{n}{unit}" for n, unit in parts if n) or "0 s"


def duration_flag(seconds: float) -> str:
    """A duration as a flag takes it back, in its largest whole unit: 259200 -> "3d",
    7200 -> "2h", 90 -> "90s" (a refusal echoes ``--time`` in the form it was typed)."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def duration_coarse(seconds: float) -> str:
    """An age in its largest unit alone: "12s", "5m", "3h", "2d" (a node's last report)."""
    s = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{s // size:.0f}{unit}"
    return f"{s:.0f}s"


def in_time(seconds: float) -> str:
    """A time ahead, for sentences: 0 -> "in under a minute", 1500 -> "in ~25 min",
    7200 -> "in ~2 h", … "in ~3 days"."""
    return "in under a minute" if seconds < 60 else f"in ~{duration_text(seconds)}"


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
