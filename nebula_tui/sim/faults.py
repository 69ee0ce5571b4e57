"""Fault injection for the simulated lab: what a sick card writes and how its tools behave.

Each function changes a simulated node's directory the way the fault changes a real
machine, so the node's unmodified probe sees it through the emulated tools:

* ``kmsg.log`` gets the exact kernel lines (``dmesg`` prints them; ``dmesg -T`` too);
* ``faults.json`` changes what the emulated ``nvidia-smi`` reports (see ``fake_smi.py``).

The lead's CLI maps ``nebula sim inject xid CODE --node N --gpu INDEX|UUID`` to
:func:`inject_xid`, ``nebula sim throttle N INDEX [--off]`` to :func:`set_throttle`, and
``nebula sim node up N`` after a ``down`` to :func:`reboot` when the node comes back as a new
boot (the SSH side of ``down``/``up`` is the lab's).

Reading the kernel log from a cursor (what the node runs)
---------------------------------------------------------
The node runs plain ``dmesg`` (util-linux; here ``fake_dmesg.py``) each probe and keeps
``xid.new_lines``'s cursor in ``$NEBULA_NODE_DIR/kmsg-cursor.json`` (so a restarted
nodelet resumes where it stopped). The boot id comes from
``/proc/sys/kernel/random/boot_id`` — on the simulator from ``$NEBULA_SIM_DIR/boot_id``
when that file exists (:func:`reboot` writes it; :func:`boot_id` reads it). Then:

* only lines logged since the last look are returned (uptime stamps, not byte offsets:
  the ring buffer drops its oldest lines when full, so offsets would shift);
* a reboot (another boot id) starts over: every line of the new boot is new and nothing
  of the old boot can come back — a drained node is not drained again by an old line;
* a log that was cleared (``dmesg -C``) or restarted is detected (the newest stamp is
  older than the cursor) and read from its start;
* the very first look takes the existing log as history (nothing acted upon).

Why ``dmesg`` rather than ``/dev/kmsg`` records by sequence number: both need the same
permission (``kernel.dmesg_restrict=0`` or CAP_SYSLOG), ``/dev/kmsg`` needs a reader
thread that blocks, and ``dmesg`` is what the simulator can emulate faithfully. Where
dmesg is restricted for the node's user, ``journalctl -k -o short-monotonic`` (user in
group ``systemd-journal`` or ``adm``) prints the same ``[ uptime]`` stamps and works with
the same cursor; ``parse_xid`` reads both.

A self-test on the simulator
----------------------------
The node's self-test runs ``nvidia-smi -i UUID --query-gpu=temperature.gpu,
ecc.errors.uncorrected.volatile.total --format=csv,noheader,nounits``:

* after Xid 79 the GPU is ``lost``: exit 15, "Unable to determine the device handle for
  GPU0000:…: Unknown Error" → ``smi_ok`` false → the test fails (and ``nvidia-smi -r`` is
  refused too); only :func:`clear_gpu_faults` ("reseated") brings it back;
* after Xid 48/95 the volatile double-bit ECC count is 1 → the memory check fails until
  a reset (``nvidia-smi -r -i UUID`` with no job on the card clears it, like a real reset);
* a throttled card reports 88 °C, above the self-test's idle limit, until the throttle is
  turned off;
* ``dcgmi`` does not exist on the simulated nodes (``dcgm.ran`` false).

After :func:`clear_gpu_faults` every part passes: the card answers, is at its idle
temperature, and its ECC count is [N/A] or 0.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from . import fake_smi

#: How hot a throttled card runs (R19 calls > 75 °C hot).
THROTTLE_TEMP_C = 88
#: Its utilisation: low, it does little work …
THROTTLE_UTIL_PCT = 12.0
#: … at this fraction of its base SM clock.
THROTTLE_CLOCK_FRACTION = 0.45
_THROTTLE_KEYS = ("temp_c", "util", "sm_clock_mhz", "throttle", "pstate")

# The driver's text after "CODE, pid=…, name=…, " for each code we inject. 13, 31, 43,
# 48, 63, 74, 79, 94 and 119 follow lines posted from real machines; 64, 92 and 95 are
# shaped after NVIDIA's catalog descriptions (no real line at hand).
_MESSAGES = {
    13: "Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): Out Of Range Address",
    31: ("Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ "
         "0x7f3a_12340000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ"),
    43: "Ch 00000008",
    45: "Ch 00000008",
    48: ("An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer "
         "at physAddr 0x7fdf0de80 partition 5, subpartition 1."),
    63: "Row Remapper: New row (0x00000007fdf0de80) marked for remapping, reset gpu to activate.",
    64: "Row Remapper: Failed to remap row (0x00000007fdf0de80), the GPU must be reset or replaced.",
    74: "NVLink: fatal error detected on link 2(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
    79: "GPU has fallen off the bus.",
    92: "High single-bit ECC error rate detected.",
    94: "Contained: SM (0x1). RST: No, D-RST: No",
    95: "Uncontained: LTC TAG (0x2,0x0). RST: Yes, D-RST: No",
    119: ("Timeout after 45s of waiting for RPC response from GPU{index} GSP! Expected function "
          "76 (GSP_RM_CONTROL) sequence 1204 (0x20801322 0x808)."),
}
_GSP_BANNER = "_kgspLogXid119: "


# --- node files --------------------------------------------------------------------------------


def _node(node_dir: Path) -> dict:
    return json.loads((Path(node_dir) / "node.json").read_text(encoding="utf-8"))


def find_gpu(node_dir: Path, gpu: int | str) -> dict:
    """The GPU of node.json named by index (``1``, ``"1"``) or UUID (or a unique UUID prefix).

    Raises ValueError naming what exists.
    """
    gpus = _node(node_dir)["gpus"]
    text = str(gpu).strip()
    found = [g for g in gpus if text == str(g["index"])]
    if not found and text.startswith("GPU-"):
        found = [g for g in gpus if g["uuid"].startswith(text)]
    if len(found) != 1:
        known = ", ".join(f"{g['index']} ({g['uuid']})" for g in gpus)
        raise ValueError(f"no GPU '{gpu}' on this node; it has {known}")
    return found[0]


def kernel_pci(bus_id: str) -> str:
    """nvidia-smi's ``00000000:01:00.0`` -> the kernel's ``0000:01:00`` (lower case)."""
    domain, bus, rest = bus_id.split(":")
    return f"{int(domain, 16):04x}:{int(bus, 16):02x}:{int(rest.split('.')[0], 16):02x}"


def _function_address(bus_id: str) -> str:
    domain, bus, rest = bus_id.split(":")
    device, _, function = rest.partition(".")
    return f"{int(domain, 16):04x}:{int(bus, 16):02x}:{int(device, 16):02x}.{int(function or 0)}"


def boot_time(node_dir: Path) -> float:
    """The node's boot moment (node.json ``boot_time``; else the file's modification time)."""
    path = Path(node_dir) / "node.json"
    value = _node(node_dir).get("boot_time")
    return float(value) if value is not None else path.stat().st_mtime


def boot_id(node_dir: Path) -> str | None:
    """The simulated boot id (``boot_id`` file), None until the node was first rebooted."""
    try:
        return (Path(node_dir) / "boot_id").read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


def _stamp(uptime: float) -> str:
    micro = int(round(max(0.0, uptime) * 1e6))
    return f"[{micro // 1_000_000:5d}.{micro % 1_000_000:06d}] "


def _process_name(pid: int) -> str:
    # The driver writes the task's comm (at most 15 characters).
    try:
        return Path(f"/proc/{pid}/comm").read_text(encoding="utf-8").strip() or "<unknown>"
    except OSError:
        return "<unknown>"


def _append_kmsg(node_dir: Path, lines: list[str]) -> None:
    # One write of whole lines: a reader never sees half a message.
    with open(Path(node_dir) / "kmsg.log", "a", encoding="utf-8") as handle:
        handle.write("".join(line + "\n" for line in lines))


def _append_nvml_event(node_dir: Path, gpu_index: int, code: int) -> None:
    """What the simulated NVML's event sets report: a critical Xid of this GPU."""
    with open(Path(node_dir) / "nvml_events.tsv", "a", encoding="utf-8") as handle:
        handle.write(f"{gpu_index}\t{code}\n")


def _change_faults(node_dir: Path, change) -> dict:
    return fake_smi.update_faults(str(node_dir), change)


# --- faults ------------------------------------------------------------------------------------


def xid_lines(gpu: dict, code: int, pid: int | None, uptime: float, first: bool) -> list[str]:
    """The kernel lines a real driver logs for Xid ``code`` on ``gpu`` at ``uptime``.

    ``first``: the driver has not reported this GPU since it loaded, so it names it first
    ("GPU at PCI:…: GPU-uuid"). Codes without a known message get the catalog's words.
    """
    pci = kernel_pci(gpu["pci_bus_id"])
    who = (f"pid={pid}, name={_process_name(pid)}" if pid is not None
           else "pid='<unknown>', name=<unknown>")
    message = _MESSAGES.get(code)
    if message is None:
        from nebula_tui.remote.backends.xid import meaning

        message = meaning(code)
    message = message.format(index=gpu["index"])
    stamp = _stamp(uptime)
    lines = [f"{stamp}NVRM: GPU at PCI:{pci}: {gpu['uuid']}"] if first else []
    if code == 119:
        lines += [f"{stamp}NVRM: {_GSP_BANNER}" + " GSP Timeout ".center(80, "*"),
                  f"{stamp}NVRM: {_GSP_BANNER}Note: Please also check logs above."]
    lines.append(f"{stamp}NVRM: Xid (PCI:{pci}): {code}, {who}, {message}")
    if code == 119:
        lines.append(f"{stamp}NVRM: {_GSP_BANNER}" + "*" * 80)
    if code == 79:
        later = _stamp(uptime + 0.000005)
        lines.append(f"{later}NVRM: GPU {_function_address(gpu['pci_bus_id'])}: "
                     "GPU has fallen off the bus.")
    if code == 48 and fake_smi.has_ecc(gpu):  # cards with ECC memory remap the row
        lines.append(f"{_stamp(uptime + 0.023)}NVRM: Xid (PCI:{pci}): 63, "
                     f"pid='<unknown>', name=<unknown>, {_MESSAGES[63]}")
    return lines


def inject_xid(node_dir: Path, gpu_index: int | str, code: int, pid: int | None = None,
               now: float | None = None, lose: bool = True) -> list[str]:
    """Log Xid ``code`` for a GPU of the node (index or UUID) and apply what it does.

    Appends the driver's lines to ``kmsg.log`` with uptime ``now - boot_time``; for 79 the
    GPU is marked lost (nvidia-smi names it and exits 15; ``lose=False``: a fall the card
    came back from before anyone looked, logged only), for 48/95 its volatile
    double-bit ECC count goes up. Returns the lines written. Raises ValueError for an
    unknown GPU or a code that is not a positive number.
    """
    if isinstance(code, bool) or not isinstance(code, int) or code <= 0:
        raise ValueError(f"'{code}' is not an Xid code (a positive number such as 79)")
    node_dir = Path(node_dir)
    gpu = find_gpu(node_dir, gpu_index)
    now = time.time() if now is None else now
    try:
        logged = (node_dir / "kmsg.log").read_text(encoding="utf-8", errors="replace")
    except OSError:
        logged = ""
    first = f"GPU at PCI:{kernel_pci(gpu['pci_bus_id'])}:" not in logged
    lines = xid_lines(gpu, code, pid, now - boot_time(node_dir), first)
    _append_kmsg(node_dir, lines)
    _append_nvml_event(node_dir, gpu["index"], code)  # NVML tells its event sets at once
    index = str(gpu["index"])
    if code == 79 and lose:
        _change_faults(node_dir, lambda gpus: gpus.setdefault(index, {}).update(lost=True))
    elif code in (48, 95):
        def more_ecc(gpus: dict) -> None:
            entry = gpus.setdefault(index, {})
            entry["ecc_uncorrected"] = int(entry.get("ecc_uncorrected", 0)) + 1

        _change_faults(node_dir, more_ecc)
    return lines


def set_throttle(node_dir: Path, gpu_index: int | str, on: bool) -> None:
    """Make a GPU run hot (88 °C), nearly idle (12 %) and below its base SM clock, or stop.

    What ``is_throttling`` calls a suspected throttling event (R19); the card reports
    ``clocks_event_reasons.hw_thermal_slowdown`` Active meanwhile.
    """
    gpu = find_gpu(node_dir, gpu_index)
    index = str(gpu["index"])
    clock = int(fake_smi.base_sm_clock(gpu) * THROTTLE_CLOCK_FRACTION)

    def change(gpus: dict) -> None:
        entry = gpus.setdefault(index, {})
        for key in _THROTTLE_KEYS:
            entry.pop(key, None)
        if on:
            entry.update(temp_c=THROTTLE_TEMP_C, util=THROTTLE_UTIL_PCT, sm_clock_mhz=clock,
                         throttle=True, pstate="P2")

    _change_faults(node_dir, change)


#: How a vendor tool can misbehave (``fake_smi.act_up``).
TOOL_FAULTS = ("hang", "slow", "fail", "garbage", "newer")


def set_tool_fault(node_dir: Path, tool: str, how: str | None) -> None:
    """Make ``tool`` (``nvidia-smi``, ``xpu-smi`` …) of the node hang, answer slowly, fail,
    print garbage or a newer layout; ``how`` None: behave again. Raises ValueError for
    another ``how``."""
    if how is not None and how not in TOOL_FAULTS:
        raise ValueError(f"'{how}' is not a tool fault; choose one of {', '.join(TOOL_FAULTS)}")
    path = Path(node_dir) / "tool_faults.json"
    try:
        faults = json.loads(path.read_text())
    except (OSError, ValueError):
        faults = {}
    if how is None:
        faults.pop(tool, None)
    else:
        faults[tool] = how
    _write_atomic(path, json.dumps(faults))


def set_fault(node_dir: Path, gpu_index: int | str, **fields) -> None:
    """Set raw fault fields of a GPU (``reset_fails=True``, ``lost=True`` …) for tests."""
    index = str(find_gpu(node_dir, gpu_index)["index"])
    _change_faults(node_dir, lambda gpus: gpus.setdefault(index, {}).update(fields))


def clear_gpu_faults(node_dir: Path, gpu_index: int | str) -> None:
    """Every fault of one GPU gone: what reseating a card (or a reset that worked) does."""
    index = str(find_gpu(node_dir, gpu_index)["index"])
    _change_faults(node_dir, lambda gpus: gpus.pop(index, None))


def gpu_faults(node_dir: Path) -> dict[str, dict]:
    """faults.json's per-GPU entries ({} when there are none)."""
    try:
        return json.loads((Path(node_dir) / "faults.json").read_text(encoding="utf-8")).get("gpus", {})
    except (OSError, ValueError):
        return {}


def reboot(node_dir: Path, now: float | None = None) -> str:
    """The node booted again: new boot id and boot time, an empty kernel log starting with
    the kernel's banner, every GPU fault cleared (a power cycle brings a lost card back)
    and no card woken lately. Returns the new boot id."""
    node_dir = Path(node_dir)
    now = time.time() if now is None else now
    node = _node(node_dir)
    node["boot_time"] = now
    new_id = f"{os.urandom(4).hex()}-{os.urandom(2).hex()}-{os.urandom(2).hex()}-" \
             f"{os.urandom(2).hex()}-{os.urandom(6).hex()}"
    _write_atomic(node_dir / "node.json", json.dumps(node, indent=2) + "\n")
    _write_atomic(node_dir / "kmsg.log",
                  f"{_stamp(0)}Linux version 6.8.0-nebula-sim (simulated boot)\n")
    _write_atomic(node_dir / "boot_id", new_id + "\n")
    _change_faults(node_dir, lambda gpus: gpus.clear())
    (node_dir / "woken.tsv").unlink(missing_ok=True)  # every card starts idle again
    return new_id


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
