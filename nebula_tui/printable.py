"""Text from users and nodes made safe for a terminal: the one helper the CLI and the TUI use
wherever they print or render a string they did not write themselves.

A job name, an argument, a node's process name or a refusal that quotes one can hold ESC,
BEL, CR, newlines or Unicode's direction overrides: printed as they are, they draw fake
lines in another user's ``nebula queue``, change the terminal's title, write its clipboard
(OSC 52) or reorder what is shown. ``printable`` shows each such character as an escape
(``\\x1b``, ``\\n``, ``\\u202e``), so the text prints on one line as what it is.
``printable_log`` is for a job's own output: lines, tabs, carriage returns (progress bars)
and colours are the point of it and stay (colours only for a terminal: a widget that draws
text would pass them on as they are); every other escape sequence is shown as text.
"""

from __future__ import annotations

import json
import re

# C0 and C1 controls, DEL, and the invisible characters that move or reorder text.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
# What a log keeps: newline, tab, carriage return, and colour (SGR) sequences.
_LOG_KEPT = re.compile(r"\n|\t|\r|\x1b\[[0-9;:]{0,32}m")
_LOG_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029"
                          "\u202a-\u202e\u2066-\u2069]")


def _escape(match: re.Match) -> str:
    char = match.group()
    if char in _NAMED:
        return _NAMED[char]
    return f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}"


def printable(text: object) -> str:
    """``text`` (any value, as ``str``) with every control character shown as an escape."""
    text = "" if text is None else str(text)
    return _CONTROL.sub(_escape, text) if _CONTROL.search(text) else text


def printable_log(text: str, colours: bool = True) -> str:
    """A job's output for a terminal: what ``printable`` does, but lines, tabs, carriage
    returns and (``colours``, else dropped) colour sequences are kept."""
    if not _LOG_CONTROL.search(text):
        return text
    parts, start = [], 0
    for kept in _LOG_KEPT.finditer(text):
        parts.append(printable(text[start:kept.start()]))
        if colours or not kept.group().startswith("\x1b"):
            parts.append(kept.group())
        start = kept.end()
    parts.append(printable(text[start:]))
    return "".join(parts)


def printable_json(line: bytes | str) -> object:
    """``printable_tree`` of the JSON value in ``line``. A line of ASCII with no backslash and
    no DEL has no control character in any of its strings (JSON escapes the others, and the
    invisible ones are not ASCII), so its value is taken as it is: most of the TUI's event
    stream (readings, job changes) is such lines, and walking each one cost more than
    decoding it."""
    raw = line.encode() if isinstance(line, str) else line
    value = json.loads(raw)
    if raw.isascii() and b"\\" not in raw and b"\x7f" not in raw:
        return value
    return printable_tree(value)


def printable_tree(value: object, key: str | None = None) -> object:
    """A reply or event with ``printable`` applied to every string in it (keys too), for a
    client that renders them; a log's ``data`` gets ``printable_log`` without colours (the
    TUI's log widget would write them to the terminal as they are)."""
    if isinstance(value, str):
        return printable_log(value, colours=False) if key == "data" else printable(value)
    if isinstance(value, dict):
        return {printable(k): printable_tree(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [printable_tree(item) for item in value]
    return value
