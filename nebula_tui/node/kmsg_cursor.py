"""Reading only the new lines of a kernel log: the cursor the nodelet keeps on its node.

Stdlib only, and never imports the package: the head ships it with the nodelet over SSH
as a module of its own (see remote/shipping.py), and the parsers import it too, so the
node and the head read logs with the same code.
"""

import re

_CURSOR_STAMP = re.compile(r"^(?:<\d>)?(?:[^\[]*?kernel: )?\[\s*(\d+\.\d+)\]")


def _line_stamp(line):
    """The ``[  123.456789]`` uptime stamp of a kernel log line, or None."""
    match = _CURSOR_STAMP.match(line)
    return float(match.group(1)) if match else None


def new_lines(text, cursor, boot_id, start_at_end=True):
    """Lines of ``text`` (a kernel log read in full) not seen before, and the next cursor.

    ``cursor`` is what the previous call returned (None the first time); it is a small
    JSON-able dict the node keeps on disk. ``boot_id`` names the running boot
    (``/proc/sys/kernel/random/boot_id``; the simulator's ``boot_id`` file).

    * First call (no cursor): with ``start_at_end`` nothing is new — what was logged before
      NebulaGrid first looked is history, not a reason to drain a card.
    * Another boot than the cursor's: every line is new (the old boot's lines are gone).
    * Lines with uptime stamps (``dmesg``, ``journalctl -o short-monotonic``): a line is new
      when its stamp is later than the last one taken, or equal but past the lines taken at
      that stamp. The kernel's ring buffer dropping old lines, or ``dmesg -C``, cannot make
      an old line look new. A log whose newest stamp is older than the cursor's was
      restarted (a reboot the boot id did not show): every line is new.
    * Lines without stamps (a log file): by offset; when the file is shorter than the
      offset or the text before it changed (rotated, truncated), every line is new.

    A last line without its newline is left for the next call (it is still being written).
    Continuation lines (no stamp) go with the stamped line before them.
    """
    complete = text if text.endswith("\n") or not text else text[: text.rfind("\n") + 1]
    lines = complete.splitlines()
    stamps = [_line_stamp(line) for line in lines]
    if cursor is None or cursor.get("boot_id") != boot_id:
        fresh = [] if cursor is None and start_at_end else lines
        return fresh, _cursor_at_end(complete, lines, stamps, boot_id)
    known = [s for s in stamps if s is not None]
    last = cursor.get("stamp")
    if last is not None and known:
        if max(known) < last:
            fresh = lines  # restarted log
        else:
            seen, taken, is_new = int(cursor.get("at_stamp", 0)), 0, False
            fresh = []
            for line, stamp in zip(lines, stamps):
                if stamp is not None:
                    if stamp == last:
                        taken += 1
                    is_new = stamp > last or (stamp == last and taken > seen)
                if is_new:
                    fresh.append(line)
    else:
        offset, tail = int(cursor.get("offset", 0)), cursor.get("tail", "")
        if len(complete) >= offset and complete[offset - len(tail):offset] == tail:
            fresh = complete[offset:].splitlines()
        else:
            fresh = lines  # rotated or truncated
    return fresh, _cursor_at_end(complete, lines, stamps, boot_id)


def _cursor_at_end(complete, lines, stamps, boot_id):
    known = [s for s in stamps if s is not None]
    last = known[-1] if known else None
    return {"boot_id": boot_id, "stamp": last,
            "at_stamp": sum(1 for s in known if s == last) if last is not None else 0,
            "offset": len(complete), "tail": complete[-200:]}
