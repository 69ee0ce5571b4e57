"""Parse NVIDIA ``NVRM: Xid`` kernel messages, and read a kernel log from a cursor. Pure.

The driver prints one message per event; what surrounds it depends on who shows the log:

* ``dmesg``                ``[ 8659.726062] NVRM: Xid (PCI:0000:01:00): 79, …``
* ``dmesg -T``             ``[Sun Apr 26 23:12:26 2026] NVRM: Xid …``
* ``dmesg --time-format iso``  ``2026-04-26T23:12:26,123456+00:00 NVRM: Xid …``
* syslog / kern.log        ``Feb 15 17:37:45 host kernel: [82659.755847] NVRM: Xid …``
* ``journalctl -k``        ``Nov 29 11:28:11 host kernel: NVRM: Xid …`` (or ``kernel: …``)
* ``journalctl -k -o short-monotonic``  ``[ 1234.567890] host kernel: NVRM: Xid …``
* ``/dev/kmsg`` records    ``4,1094,1843308145,-;NVRM: Xid …`` (dictionary lines after it)
* newer kernels add the caller, ``[  130.456250] [ T1946] NVRM: …``; bare pasted lines have
  no prefix at all.

The message body changed over driver generations: ``79, GPU has fallen off the bus.``
(old), ``31, pid=12890, Ch 0000003b, …`` (pid, no name), ``45, pid=1818990, name=python3, …``
(new), ``48, pid='<unknown>', name=<unknown>, …`` (new, no process). Very old drivers wrote
``Xid (0000:01:00)`` without ``PCI:``.

A message may span lines. ``dmesg`` and ``journalctl`` indent the continuation lines; syslog
files repeat the prefix with the same uptime stamp (one record per line on older kernels).
Both fold into their event. ``_kgspLogXid119`` banners around an Xid 119 are not events.
A "GPU … has fallen off the bus" message without an Xid is an event with ``code`` None —
unless it only repeats an Xid 79 of the same GPU just logged, which it then joins.

``new_lines`` at the end is the node's side: it must stay copyable into the stdlib-only
nodelet (it uses ``re`` and nothing from this package).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

# --- the catalog -----------------------------------------------------------------------------


@dataclass(frozen=True)
class XidInfo:
    """What NVIDIA's Xid catalog says a code means, and the action it recommends."""

    meaning: str
    action: str


#: The codes the health policies name (R16) plus those met in the sample logs. Meanings and
#: recommended actions follow NVIDIA's public Xid catalog (docs.nvidia.com/deploy/xid-errors).
XID_CATALOG: dict[int, XidInfo] = {
    13: XidInfo("graphics engine exception", "usually the application; run a self-test if it repeats"),
    31: XidInfo("GPU memory page fault", "usually the application (illegal address); restart it"),
    32: XidInfo("invalid or corrupted push buffer stream", "restart the application; check the driver"),
    43: XidInfo("GPU stopped processing", "reset the GPU; restart the application"),
    45: XidInfo("preemptive cleanup after earlier errors", "none by itself; see the Xid before it"),
    48: XidInfo("double-bit ECC error", "reset the GPU (activates row remapping); replace it if it repeats"),
    61: XidInfo("internal micro-controller breakpoint/warning", "reset the GPU if errors follow"),
    62: XidInfo("internal micro-controller halt", "reset the GPU"),
    63: XidInfo("ECC page retirement or row remapping event", "record it; a reset activates the remap"),
    64: XidInfo("ECC page retirement or row remapping failure", "reset the GPU; replace it if it repeats"),
    74: XidInfo("NVLink error", "reset the GPU; check the NVLink bridge or baseboard"),
    79: XidInfo("GPU fell off the bus", "check the slot, the power cable and cooling; reseat or power-cycle"),
    92: XidInfo("high single-bit ECC error rate", "record it; watch for double-bit errors"),
    94: XidInfo("contained ECC error", "restart the affected application; the GPU keeps serving"),
    95: XidInfo("uncontained ECC error", "reset the GPU; every application on it is affected"),
    119: XidInfo("GSP RPC timeout", "reset the GPU; update the driver if it repeats"),
    120: XidInfo("GSP error", "reset the GPU; update the driver if it repeats"),
    144: XidInfo("NVLink SAW error", "check the NVLink fabric; reset if fatal"),
    145: XidInfo("NVLink RLW error", "check the NVLink fabric; reset if fatal"),
    149: XidInfo("NVLink NETIR error", "check the NVLink fabric; reset if fatal"),
}


def meaning(code: int | None) -> str:
    """A short phrase for a code ("GPU fell off the bus"); None is the code-less bus fall."""
    if code is None:
        return "GPU fell off the bus"
    info = XID_CATALOG.get(code)
    return info.meaning if info else "see NVIDIA's Xid catalog"


# --- PCI addresses ---------------------------------------------------------------------------

_PCI_RE = re.compile(r"^(?:PCI:)?([0-9a-fA-F]{1,8}):([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})(?:\.([0-7]))?$")
_PCI_IN_TEXT = re.compile(r"\b([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)\b")


def pci_key(address: str) -> tuple[int, int, int, int | None] | None:
    """``0000:01:00`` / ``00000000:01:00.0`` / ``PCI:0001:6c:00`` -> (domain, bus, device,
    function or None); None when it is not a PCI address."""
    match = _PCI_RE.match((address or "").strip())
    if not match:
        return None
    domain, bus, device, function = match.groups()
    return int(domain, 16), int(bus, 16), int(device, 16), None if function is None else int(function)


def pci_matches(xid_pci: str, gpu_bus_id: str) -> bool:
    """Whether a kernel message's address names the GPU nvidia-smi lists as ``gpu_bus_id``.

    The kernel writes a 4-digit domain and no function (``0000:01:00``); nvidia-smi an
    8-digit domain and a function (``00000000:01:00.0``), in upper case. Numbers compare,
    not text; the function only when both sides have one.
    """
    a, b = pci_key(xid_pci), pci_key(gpu_bus_id)
    if a is None or b is None:
        return False
    if a[:3] != b[:3]:
        return False
    return a[3] is None or b[3] is None or a[3] == b[3]


# --- line prefixes -----------------------------------------------------------------------------

_LEVEL = re.compile(r"^<\d>")
_KMSG = re.compile(r"^\d+,(\d+),(\d+),[^;]*;")
_DICT_LINE = re.compile(r"^ [A-Z_]+=")
_SYSLOG_TIME = (r"[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d"
                r"|\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?")
_SYSLOG = re.compile(rf"^(?P<time>{_SYSLOG_TIME})\s+(?:(?P<host>\S+)\s+)?"
                     r"(?P<tag>[\w\-./@]+)(?:\[\d+\])?:(?: |$)")
_UPTIME = re.compile(r"^\[\s*(\d+\.\d+)\] ?")
_CTIME = re.compile(r"^\[([A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]?\d \d\d:\d\d:\d\d \d{4})\] ?")
_HOST_KERNEL = re.compile(r"^(?:\S+ )?kernel: ?")
_CALLER = re.compile(r"^\[\s*[TC]\d+\] ?")


@dataclass
class _Line:
    kernel: bool  # False: another program's syslog line (never part of a kernel message)
    prefixed: bool  # a prefix was recognised: a line of its own, not an indented continuation
    time: str | None
    uptime: float | None
    body: str


def _split(line: str) -> _Line:
    """Strip what the log reader put before the kernel's text (see the module docstring)."""
    rest = _LEVEL.sub("", line, count=1)
    time_text: str | None = None
    uptime: float | None = None
    prefixed = False
    kmsg = _KMSG.match(rest)
    if kmsg:
        uptime = int(kmsg.group(2)) / 1e6
        rest = rest[kmsg.end():].replace("\\x0a", "\n")
        return _Line(True, True, None, uptime, rest)
    syslog = _SYSLOG.match(rest)
    if syslog and syslog.group("tag") == "NVRM":  # dmesg --time-format iso: no host, no tag
        time_text, rest, prefixed = syslog.group("time"), rest[syslog.end("time"):].lstrip(), True
    elif syslog:
        if syslog.group("tag") != "kernel":
            return _Line(False, True, syslog.group("time"), None, rest[syslog.end():])
        time_text, rest, prefixed = syslog.group("time"), rest[syslog.end():], True
    elif rest.startswith("kernel:"):
        rest, prefixed = rest[len("kernel:"):].lstrip(" "), True
    stamp = _UPTIME.match(rest)
    if stamp:
        uptime, rest, prefixed = float(stamp.group(1)), rest[stamp.end():], True
        host_kernel = _HOST_KERNEL.match(rest)  # journalctl -o short-monotonic
        if host_kernel:
            rest = rest[host_kernel.end():]
    else:
        ctime = _CTIME.match(rest)
        if ctime:
            time_text, rest, prefixed = ctime.group(1), rest[ctime.end():], True
    caller = _CALLER.match(rest)
    if caller:
        rest = rest[caller.end():]
    if not prefixed and rest[:1] not in ("", " ", "\t"):
        prefixed = True  # a bare line ("NVRM: Xid …" as pasted) stands on its own
    return _Line(True, prefixed, time_text, uptime, rest)


# --- messages ----------------------------------------------------------------------------------

# The address inside the parentheses is read apart from the code: one redacted when posted
# (``PCI:xxxx:xx:xx``, ``<redacted>``) or written oddly still gives its code.
_XID = re.compile(r"NVRM: Xid \((?P<inner>[^)]*)\):\s*(?P<code>\d+)(?P<rest>.*)$", re.DOTALL)
_XID_PCI = re.compile(r"(?:PCI:)?([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)")
_XID_REST = re.compile(r"^(?:,\s*pid=(?P<pid>'[^']*'|[^,]*))?(?:,\s*name=(?P<name>'[^']*'|[^,]*))?"
                       r"(?:,\s*(?P<detail>.*))?$", re.DOTALL)
_BANNER = re.compile(r"NVRM: GPU at PCI:(?P<pci>[0-9a-fA-F:.]+): "
                     r"(?P<uuid>GPU-[0-9a-fA-F]{8}-[0-9a-fA-F-]+)\s*$")
_BUS_FALL = re.compile(r"fallen off the bus", re.IGNORECASE)
# Lines that are kernel messages of their own even when they share the previous line's
# stamp (the driver prints them with separate printk calls in the same microsecond).
_STARTS_OWN_MESSAGE = re.compile(r"^\s*NVRM: (?:Xid \(|GPU at PCI:|_kgspLogXid)")
#: A bus-fall line within this many seconds after an Xid 79 of the same GPU repeats it.
BUS_FALL_FOLD_S = 5.0


@dataclass
class _Message:
    time: str | None
    uptime: float | None
    body: str


def _messages(text: str) -> Iterator[_Message]:
    """Kernel messages, each with its continuation lines folded into one line of text."""
    current: _Message | None = None
    after_kmsg = False
    for raw in text.splitlines():
        if after_kmsg and _DICT_LINE.match(raw):
            continue  # /dev/kmsg dictionary (SUBSYSTEM=…, DEVICE=…): not the message
        after_kmsg = bool(_KMSG.match(raw))
        line = _split(raw)
        if not line.kernel:
            if current:
                yield current
            current = None
            continue
        continued = current is not None and (
            not line.prefixed
            # syslog's one-record-per-line: same microsecond stamp, not a message of its own
            or (line.uptime is not None and line.uptime == current.uptime
                and not _STARTS_OWN_MESSAGE.search(line.body)))
        if continued and not raw.strip():
            continue
        if continued:
            assert current is not None
            more = line.body.strip()
            if more.startswith("NVRM: ") and current.body.startswith("NVRM: "):
                more = more[len("NVRM: "):]
            if more:
                current.body = f"{current.body.rstrip()} {more}"
            continue
        if current:
            yield current
        current = None
        if not raw.strip():
            continue
        parts = line.body.split("\n")  # a /dev/kmsg record's escaped newlines
        current = _Message(line.time, line.uptime, parts[0])
        for more in parts[1:]:
            more = more.strip().removeprefix("NVRM: ")
            if more:
                current.body = f"{current.body.rstrip()} {more}"
    if current:
        yield current


def _unquote(value: str | None) -> str | None:
    if value is None:
        return None
    value = value.strip().strip("'\"")
    return None if value in ("", "<unknown>", "<n/a>") else value


def _event(message: _Message, code: int | None, pci: str, pid: int | None,
           process: str | None, detail: str) -> dict:
    return {"code": code, "pci": pci, "pid": pid, "process": process, "time": message.time,
            "uptime_s": message.uptime, "text": message.body.strip(), "detail": detail,
            "uuid": None}


def parse_xid(text: str) -> list[dict]:
    """Every Xid (and code-less bus-fall) event in a kernel log, in order.

    Each event: ``code`` (int; None for "fallen off the bus" without an Xid), ``pci`` (as
    written), ``pid`` (int or None), ``process`` (None when unknown), ``time`` (the
    wall-clock stamp as written, or None), ``uptime_s`` (seconds since boot when the line
    had a ``[  123.456]`` stamp), ``text`` (the whole message, continuation lines folded),
    ``detail`` (the driver's words after code/pid/name) and ``uuid`` (when the driver's
    "GPU at PCI:…: GPU-…" line named the card before). Lines it cannot read are skipped.
    """
    events: list[dict] = []
    uuids: dict[str, str] = {}
    for message in _messages(text):
        body = message.body
        xid = _XID.search(body)
        if xid:
            rest = _XID_REST.match(xid.group("rest"))
            pid_text = _unquote(rest.group("pid")) if rest else None
            pid = int(pid_text) if pid_text and pid_text.isdigit() else None
            detail = (rest.group("detail") or "").strip() if rest else xid.group("rest").strip(", ")
            address = _XID_PCI.search(xid.group("inner"))
            pci = address.group(1) if address else xid.group("inner").strip().removeprefix("PCI:")
            event = _event(message, int(xid.group("code")), pci, pid,
                           _unquote(rest.group("name")) if rest else None, detail)
            event["uuid"] = next((u for p, u in uuids.items() if pci_matches(p, event["pci"])), None)
            events.append(event)
            continue
        banner = _BANNER.search(body)
        if banner:
            uuids[banner.group("pci")] = banner.group("uuid")
            continue
        if _BUS_FALL.search(body) and body.lstrip().startswith("NVRM:"):
            address = _PCI_IN_TEXT.search(body)
            if address is None:
                continue
            pci = address.group(1)
            last = events[-1] if events else None
            if last is not None and last["code"] == 79 and pci_matches(last["pci"], pci) \
                    and _close(last, message):
                last["text"] += " " + body.strip()  # the same fall, told twice
                continue
            event = _event(message, None, pci, None, None, body.strip().removeprefix("NVRM: "))
            event["uuid"] = next((u for p, u in uuids.items() if pci_matches(p, pci)), None)
            events.append(event)
    return events


def _close(event: dict, message: _Message) -> bool:
    if event["uptime_s"] is not None and message.uptime is not None:
        return 0 <= message.uptime - event["uptime_s"] <= BUS_FALL_FOLD_S
    return event["time"] == message.time


# --- reading only new lines: the code the nodelet runs, shared (see node/kmsg_cursor.py)
from ...node.kmsg_cursor import new_lines  # noqa: E402,F401  (re-exported)
