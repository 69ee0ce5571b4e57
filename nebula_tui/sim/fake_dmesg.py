#!/usr/bin/env python3
"""Emulated ``dmesg`` for the simulated lab: prints ``$NEBULA_SIM_DIR/kmsg.log``.

Standalone (stdlib only). ``-T``/``--ctime`` turns ``[  123.456789]`` uptime stamps into
``[Sun Nov 29 08:00:00 2026]`` using ``boot_time`` (epoch seconds) from node.json, else
node.json's modification time. Any other option: an error and exit 1, as util-linux does.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time

_STAMP_RE = re.compile(r"^\[\s*(\d+(?:\.\d+)?)\]")


def boot_time(sim_dir: str) -> float:
    """The simulated boot moment; the file's mtime when node.json has none (or is absent)."""
    path = os.path.join(sim_dir, "node.json")
    try:
        with open(path, encoding="utf-8") as handle:
            value = json.load(handle).get("boot_time")
        if value is not None:
            return float(value)
        return os.path.getmtime(path)
    except (OSError, ValueError, TypeError, AttributeError):
        return time.time()


def ctime_stamp(epoch: float) -> str:
    """``Sun Nov  9 08:00:00 2026``: day padded with a space, like dmesg -T."""
    moment = time.localtime(epoch)
    return time.strftime("%a %b ", moment) + f"{moment.tm_mday:>2}" + time.strftime(" %H:%M:%S %Y", moment)


def human_times(text: str, boot: float) -> str:
    def convert(line: str) -> str:
        match = _STAMP_RE.match(line)
        if not match:
            return line
        return f"[{ctime_stamp(boot + float(match.group(1)))}]" + line[match.end():]

    return "".join(convert(line) for line in text.splitlines(keepends=True))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    readable = False
    for arg in argv:
        if arg in ("-T", "--ctime"):
            readable = True
        else:
            sys.stderr.write(f"dmesg: unrecognized option '{arg}'\n"
                             "Try 'dmesg --help' for more information.\n")
            return 1
    sim_dir = os.environ.get("NEBULA_SIM_DIR", ".")
    try:
        with open(os.path.join(sim_dir, "kmsg.log"), encoding="utf-8", errors="replace") as handle:
            text = handle.read()
    except OSError:  # a node that never logged anything
        text = ""
    sys.stdout.write(human_times(text, boot_time(sim_dir)) if readable else text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
