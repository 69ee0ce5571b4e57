#!/usr/bin/env python3
"""Emulated ``dmesg`` for the simulated lab: prints ``$NEBULA_SIM_DIR/kmsg.log``.

Standalone (stdlib only). Behaves like util-linux ``dmesg`` for what the node uses:

* plain: the ring buffer as written, ``[  123.456789] text``; a multi-line message's
  continuation lines are indented to the text column.
* ``-T``/``--ctime``: ``[Sun Nov 29 08:00:00 2026] text`` from ``boot_time`` (epoch seconds)
  in node.json, else node.json's modification time; continuation lines re-indented to the
  wider prefix.
* ``-C``/``--clear``: empty the buffer (as root does on a real node).
* ``-k``/``--kernel``, ``-P``/``--nopager``: accepted, no effect (everything here is kernel).
* node.json ``"dmesg_restrict": true``: "read kernel buffer failed: Operation not
  permitted", exit 1 — what a non-root user meets on distributions that restrict dmesg.

Any other option: an error and exit 1, as util-linux does.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time

_STAMP_RE = re.compile(r"^\[\s*(\d+(?:\.\d+)?)\] ?")


def _node(sim_dir: str) -> dict:
    try:
        with open(os.path.join(sim_dir, "node.json"), encoding="utf-8") as handle:
            node = json.load(handle)
        return node if isinstance(node, dict) else {}
    except (OSError, ValueError):
        return {}


def boot_time(sim_dir: str) -> float:
    """The simulated boot moment; the file's mtime when node.json has none (or is absent)."""
    path = os.path.join(sim_dir, "node.json")
    try:
        value = _node(sim_dir).get("boot_time")
        if value is not None:
            return float(value)
        return os.path.getmtime(path)
    except (OSError, ValueError, TypeError):
        return time.time()


def ctime_stamp(epoch: float) -> str:
    """``Sun Nov  9 08:00:00 2026``: day padded with a space, like dmesg -T."""
    moment = time.localtime(epoch)
    return time.strftime("%a %b ", moment) + f"{moment.tm_mday:>2}" + time.strftime(" %H:%M:%S %Y", moment)


def human_times(text: str, boot: float) -> str:
    out = []
    indent = None  # the width of the last converted prefix, for its continuation lines
    for line in text.splitlines(keepends=True):
        match = _STAMP_RE.match(line)
        if match:
            prefix = f"[{ctime_stamp(boot + float(match.group(1)))}] "
            indent = len(prefix)
            out.append(prefix + line[match.end():])
        elif indent is not None and line[:1] == " " and line.strip():
            out.append(" " * indent + line.lstrip(" "))
        else:
            out.append(line)
    return "".join(out)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    readable = clear = False
    for arg in argv:
        if arg in ("-T", "--ctime"):
            readable = True
        elif arg in ("-C", "--clear"):
            clear = True
        elif arg in ("-k", "--kernel", "-P", "--nopager"):
            pass
        else:
            sys.stderr.write(f"dmesg: unrecognized option '{arg}'\n"
                             "Try 'dmesg --help' for more information.\n")
            return 1
    sim_dir = os.environ.get("NEBULA_SIM_DIR", ".")
    path = os.path.join(sim_dir, "kmsg.log")
    if _node(sim_dir).get("dmesg_restrict"):
        sys.stderr.write("dmesg: read kernel buffer failed: Operation not permitted\n")
        return 1
    if clear:
        with open(path, "w", encoding="utf-8"):
            pass
        return 0
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = handle.read()
    except OSError:  # a node that never logged anything
        text = ""
    sys.stdout.write(human_times(text, boot_time(sim_dir)) if readable else text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
