#!/usr/bin/env python3
"""Emulated ``nvidia-smi`` for the simulated lab: ``python3 fake_smi.py ARGS…``.

Standalone on purpose (stdlib only, never imports nebula_tui): it starts once per probe
call and must be fast. The node's GPUs come from ``$NEBULA_SIM_DIR/node.json`` (plus optional
``faults.json``); their usage from the processes really running, found in ``/proc``: a
process is on this node's GPUs when its environment has ``CUDA_VISIBLE_DEVICES`` set and
names this node (``NEBULA_SIM_DIR``, else ``NEBULA_SIM_NODE``). Output mimics 550/560 drivers byte for byte.

Exit codes follow the real tool: 2 bad argument or field, 6 no such device, 9 no node
state (driver not loaded), 15 a GPU fell off the bus, 255 other errors (a reset refused).

Faults (``faults.json``, written by ``nebula_tui.sim.faults``; ``faults.tsv`` is the same for
the simulated NVML, ``nvml_shim.c``) are per GPU index and override
the live readings: ``lost`` (fell off the bus: every query names it and exits 15),
``temp_c``/``util``/``sm_clock_mhz`` (a throttling card), ``ecc_uncorrected`` (volatile
double-bit ECC count), ``reset_fails`` (``-r`` cannot reset it). ``-r -i ID`` resets a GPU:
refused while processes use it or when it is lost, else its faults are cleared, as a real
reset clears volatile state (the wording of the reset messages is approximated).
An idle card that did work through the simulated CUDA driver (``cuda_shim.c``, which
appends to ``woken.tsv``) in the last ``WAKE_HOLD_S`` reads P0 instead of P8.

Why one module: it runs as a standalone script, once per probe call, importing nothing
of the package, so what it needs must be in this one file.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import sys
import time

EXIT_BAD_ARGUMENT = 2
EXIT_NOT_FOUND = 6
EXIT_NO_DRIVER = 9
EXIT_GPU_LOST = 15
EXIT_OTHER = 255

IDLE_MEMORY_MB = 1  # what an idle card shows used (driver context), like real cards
IDLE_SM_CLOCK_MHZ = 210
IDLE_MEM_CLOCK_MHZ = 405
DEFAULT_PROCESS_MB = 1024
DEFAULT_PROCESS_UTIL = 60.0
#: How long an idle card stays in P0 after work on it ended (the warm-up's, through the
#: simulated CUDA driver, ``cuda_shim.c``): real drivers drop the clocks after some seconds
#: of idleness; this figure is the lab's, not measured on a card.
WAKE_HOLD_S = 20.0
_TRACKED_ENV = ("NEBULA_SIM_NODE", "NEBULA_SIM_GPU_MEM", "NEBULA_GPU_MEM_MB", "NEBULA_SIM_GPU_UTIL")


class SmiError(Exception):
    """Something the real tool would refuse: message to print and exit code."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


# --- node state --------------------------------------------------------------------------


def load_node(sim_dir: str) -> tuple[dict, dict]:
    """Read node.json and faults.json (optional). Raises SmiError when node.json is absent."""
    try:
        with open(os.path.join(sim_dir, "node.json"), encoding="utf-8") as handle:
            node = json.load(handle)
    except (OSError, ValueError):
        raise SmiError("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA "
                       "driver. Make sure that the latest NVIDIA driver is installed and "
                       "running.\n", EXIT_NO_DRIVER) from None
    try:
        with open(os.path.join(sim_dir, "faults.json"), encoding="utf-8") as handle:
            faults = json.load(handle).get("gpus", {})
    except (OSError, ValueError):
        faults = {}
    return node, faults


# --- processes from /proc ----------------------------------------------------------------


def _read_environ(pid: str) -> dict[str, str] | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            raw = handle.read()
    except OSError:  # other users' processes, or gone already
        return None
    env = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env


def _parent(pid: str) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as handle:
            stat = handle.read()
    except OSError:
        return None
    # The command name may contain spaces and parentheses; fields resume after the last ')'.
    return stat.rsplit(")", 1)[1].split()[1]


def _process_name(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            first = handle.read().split(b"\0", 1)[0]
        if first:
            return first.decode(errors="replace")
        with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as handle:
            return handle.read().strip()
    except OSError:
        return "[Not Found]"


def _ancestors(pid: str) -> set[str]:
    chain = set()
    while pid and pid != "0" and pid not in chain:
        chain.add(pid)
        pid = _parent(pid)
    return chain


def parse_size_mb(text: str) -> int | None:
    """``6G``, ``6GB``, ``6GiB``, ``6144M``, ``6144`` (MiB) -> MiB; None when unreadable."""
    match = re.match(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$", text or "", re.IGNORECASE)
    if not match:
        return None
    scale = {"": 1, "k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}[match.group(2).lower()]
    return int(round(float(match.group(1)) * scale))


def visible_indices(value: str, gpus: list[dict]) -> list[int]:
    """CUDA_VISIBLE_DEVICES (or another vendor's variable) -> device indices; like CUDA,
    stop at the first unknown entry. ``0.1`` (Level Zero's device.sub-device) is device 0."""
    indices = []
    for entry in (item.strip() for item in value.split(",")):
        device = entry.split(".", 1)[0] if entry[:1].isdigit() else entry
        found = [g["index"] for g in gpus
                 if device == str(g["index"]) or (len(entry) > 4 and g["uuid"].startswith(entry))]
        if len(found) != 1:
            break
        indices.append(found[0])
    return indices


def _process_usage(env: dict[str, str]) -> tuple[int, float]:
    mem = parse_size_mb(env.get("NEBULA_SIM_GPU_MEM", ""))
    if mem is None:
        mem = parse_size_mb(env.get("NEBULA_GPU_MEM_MB", "")) or DEFAULT_PROCESS_MB
    try:
        util = float(env.get("NEBULA_SIM_GPU_UTIL", DEFAULT_PROCESS_UTIL))
    except ValueError:
        util = DEFAULT_PROCESS_UTIL
    return mem, max(0.0, util)


def _on_this_node(env: dict[str, str], name: str) -> bool:
    """Whether a process belongs to this simulated node.

    Several labs (and several test runs) may share one machine and all have a "node01", so
    the node's own directory decides; the name alone only for processes started without it.
    """
    here = os.environ.get("NEBULA_SIM_DIR")
    if here and "NEBULA_SIM_DIR" in env:
        return os.path.realpath(env["NEBULA_SIM_DIR"]) == os.path.realpath(here)
    return env.get("NEBULA_SIM_NODE") == name


def scan_processes(node: dict, variable: str = "CUDA_VISIBLE_DEVICES",
                   gpus: list[dict] | None = None) -> list[dict]:
    """Root processes of every tree running on this node's devices, one dict per process:
    NVIDIA's GPUs by default, another vendor's ``gpus`` through its ``variable``.

    A process whose parent carries the same GPU variables is part of its parent's job (the
    job's shell and its children), so each tree counts once, under its root.
    """
    gpus = node["gpus"] if gpus is None else gpus
    tracked = _TRACKED_ENV + (variable,)
    excluded = _ancestors(str(os.getpid()))
    envs: dict[str, dict[str, str]] = {}
    for pid in (entry for entry in os.listdir("/proc") if entry.isdigit()):
        if pid in excluded:
            continue
        env = _read_environ(pid)
        if env and variable in env and _on_this_node(env, node["name"]):
            envs[pid] = env
    processes = []
    for pid, env in envs.items():
        parent_env = envs.get(_parent(pid) or "")
        if parent_env is not None and all(parent_env.get(k) == env.get(k) for k in tracked):
            continue
        indices = visible_indices(env[variable], gpus)
        if not indices:
            continue
        mem, util = _process_usage(env)
        processes.append({"pid": int(pid), "name": _process_name(pid), "gpus": indices,
                          "memory_mb": mem, "util": util})
    return sorted(processes, key=lambda p: p["pid"])


# --- live GPU state ----------------------------------------------------------------------


def woken_at(sim_dir: str) -> dict[int, float]:
    """When work through the simulated CUDA driver last ended on each card (``woken.tsv``,
    "index<TAB>epoch seconds" lines the library appends); {} when none did."""
    woken: dict[int, float] = {}
    try:
        with open(os.path.join(sim_dir, "woken.tsv"), encoding="utf-8") as handle:
            for line in handle:
                index, _, when = line.strip().partition("\t")
                try:
                    woken[int(index)] = max(woken.get(int(index), 0.0), float(when))
                except ValueError:
                    continue  # a line being written
    except OSError:
        pass
    return woken


def gpu_state(gpu: dict, processes: list[dict], fault: dict, woken: float = 0.0) -> dict:
    """One GPU's readings now: static facts plus what its processes make of it; ``woken``:
    when work through CUDA last ended on it (an idle card stays in P0 for a while)."""
    mine = [p for p in processes if gpu["index"] in p["gpus"]]
    total = gpu["memory_total_mb"]
    util = min(100.0, sum(p["util"] for p in mine))
    busy = util / 100.0
    max_sm = gpu.get("max_sm_clock_mhz", 1800)
    idle_power = gpu.get("idle_power_w", 15.0)
    limit = gpu.get("power_limit_w", 250.0)
    state = dict(gpu)
    state.update(
        memory_used_mb=min(total, sum(p["memory_mb"] for p in mine)) if mine else IDLE_MEMORY_MB,
        util=util,
        temp_c=round(gpu.get("base_temp_c", 30) + util * 0.45),
        power_w=idle_power + busy * (limit - idle_power),
        sm_clock_mhz=round(IDLE_SM_CLOCK_MHZ + busy * (max_sm - IDLE_SM_CLOCK_MHZ)),
        mem_clock_mhz=gpu.get("max_mem_clock_mhz", 5000) if mine else IDLE_MEM_CLOCK_MHZ,
        fan_pct=round(30 + util * 0.5) if gpu.get("has_fan", True) else None,
        pstate="P2" if mine else "P0" if time.time() - woken < WAKE_HOLD_S else "P8",
        processes=[dict(p, memory_mb=min(total, p["memory_mb"])) for p in mine],
        lost=False,
    )
    # Faults override what the processes would give (e.g. a hot card with a low clock).
    state.update({key: value for key, value in fault.items()})
    return state


def base_sm_clock(gpu: dict) -> int:
    """The card's base SM clock: node.json's ``base_sm_clock_mhz``, else 80 % of its max
    (an approximation; real cards sit between about 65 % and 90 %)."""
    if gpu.get("base_sm_clock_mhz"):
        return int(gpu["base_sm_clock_mhz"])
    return int(round(gpu.get("max_sm_clock_mhz", 1800) * 0.8))


#: Data-centre cards ship with ECC on (node.json ``"ecc"`` overrides); GeForce has it off.
ECC_MODELS = ("A100", "H100", "H200", "B200", "A30", "A40", "A10", "L40", "V100", "T4")


def has_ecc(gpu: dict) -> bool:
    if "ecc" in gpu:
        return bool(gpu["ecc"])
    return any(model in gpu.get("name", "") for model in ECC_MODELS)


def _ecc(g: dict, nu: bool) -> str:
    # Cards without ECC (or with it off) report [N/A]; a fault sets a count.
    if "ecc_uncorrected" in g:
        return str(g["ecc_uncorrected"])
    return "0" if has_ecc(g) else "[N/A]"


def _thermal(g: dict) -> str:
    return "Active" if g.get("throttle") else "Not Active"


def _reasons(g: dict) -> int:
    """NVML's clocks-event bits: idle when nothing runs, HW slowdown + thermal when throttled."""
    return (0 if g["processes"] else 0x1) | (0x48 if g.get("throttle") else 0)


def _lost_message(gpu: dict) -> str:
    # Real drivers print the 4-digit-domain address right after "GPU".
    return f"Unable to determine the device handle for GPU{gpu['pci_bus_id'][4:]}: Unknown Error"


# --- --query-gpu / --query-compute-apps ----------------------------------------------------


def _num(value, unit: str, nounits: bool, digits: int = 0) -> str:
    if value is None:
        return "[N/A]"
    text = f"{value:.{digits}f}"
    return text if nounits or not unit else f"{text} {unit}"


# Field -> (unit in the header, value of a GPU state as text given nounits).
GPU_FIELDS = {
    "timestamp": ("", lambda g, n, nu: time.strftime("%Y/%m/%d %H:%M:%S.")
                  + f"{int(time.time() * 1000) % 1000:03d}"),
    "index": ("", lambda g, n, nu: str(g["index"])),
    "uuid": ("", lambda g, n, nu: g["uuid"]),
    "name": ("", lambda g, n, nu: g["name"]),
    "pci.bus_id": ("", lambda g, n, nu: g["pci_bus_id"]),
    "memory.total": ("MiB", lambda g, n, nu: _num(g["memory_total_mb"], "MiB", nu)),
    "memory.used": ("MiB", lambda g, n, nu: _num(g["memory_used_mb"], "MiB", nu)),
    "memory.free": ("MiB", lambda g, n, nu: _num(g["memory_total_mb"] - g["memory_used_mb"], "MiB", nu)),
    "utilization.gpu": ("%", lambda g, n, nu: _num(g["util"], "%", nu)),
    "utilization.memory": ("%", lambda g, n, nu: _num(g["util"] * 0.4, "%", nu)),
    "temperature.gpu": ("", lambda g, n, nu: _num(g["temp_c"], "", nu)),
    "power.draw": ("W", lambda g, n, nu: _num(g["power_w"], "W", nu, 2)),
    "power.limit": ("W", lambda g, n, nu: _num(g["power_limit_w"], "W", nu, 2)),
    "fan.speed": ("%", lambda g, n, nu: _num(g["fan_pct"], "%", nu)),
    "clocks.sm": ("MHz", lambda g, n, nu: _num(g["sm_clock_mhz"], "MHz", nu)),
    "clocks.mem": ("MHz", lambda g, n, nu: _num(g["mem_clock_mhz"], "MHz", nu)),
    "clocks.max.sm": ("MHz", lambda g, n, nu: _num(g.get("max_sm_clock_mhz"), "MHz", nu)),
    "clocks.max.mem": ("MHz", lambda g, n, nu: _num(g.get("max_mem_clock_mhz"), "MHz", nu)),
    "clocks_event_reasons.active": ("", lambda g, n, nu: "0x%016X" % _reasons(g)),
    "ecc.errors.corrected.volatile.total": ("", lambda g, n, nu: "0" if has_ecc(g) else "[N/A]"),
    "pcie.link.gen.max": ("", lambda g, n, nu: _num(g.get("pcie_gen"), "", nu)),
    "pcie.link.width.max": ("", lambda g, n, nu: _num(g.get("pcie_width"), "", nu)),
    "mig.mode.current": ("", lambda g, n, nu: "Disabled" if "A100" in g["name"] or "H100" in g["name"]
                         else "[N/A]"),
    "persistence_mode": ("", lambda g, n, nu: "Enabled" if g.get("persistence") else "Disabled"),
    "clocks.default_applications.graphics": ("MHz", lambda g, n, nu: _num(base_sm_clock(g), "MHz", nu)),
    "clocks_event_reasons.hw_thermal_slowdown": ("", lambda g, n, nu: _thermal(g)),
    "ecc.errors.uncorrected.volatile.total": ("", lambda g, n, nu: _ecc(g, nu)),
    "pcie.link.gen.current": ("", lambda g, n, nu: _num(g.get("pcie_gen"), "", nu)),
    "pcie.link.width.current": ("", lambda g, n, nu: _num(g.get("pcie_width"), "", nu)),
    "pstate": ("", lambda g, n, nu: g["pstate"]),
    "driver_version": ("", lambda g, n, nu: n["driver_version"]),
    "compute_cap": ("", lambda g, n, nu: g["compute_cap"]),
}
_GPU_ALIASES = {"gpu_name": "name", "gpu_uuid": "uuid", "gpu_bus_id": "pci.bus_id",
                "clocks.current.sm": "clocks.sm", "clocks.current.memory": "clocks.mem",
                "clocks.default_applications.gr": "clocks.default_applications.graphics",
                "clocks_throttle_reasons.hw_thermal_slowdown": "clocks_event_reasons.hw_thermal_slowdown",
                "clocks_throttle_reasons.active": "clocks_event_reasons.active",
                "clocks.max.memory": "clocks.max.mem"}

# Apps field -> (unit in the header, value of (gpu state, process) as text given nounits).
APPS_FIELDS = {
    "gpu_uuid": ("", lambda g, p, nu: g["uuid"]),
    "gpu_name": ("", lambda g, p, nu: g["name"]),
    "gpu_bus_id": ("", lambda g, p, nu: g["pci_bus_id"]),
    "pid": ("", lambda g, p, nu: str(p["pid"])),
    "process_name": ("", lambda g, p, nu: p["name"]),
    "used_gpu_memory": ("MiB", lambda g, p, nu: _num(p["memory_mb"], "MiB", nu)),
}
_APPS_ALIASES = {"name": "process_name", "used_memory": "used_gpu_memory"}


def _resolve_fields(spec: str, table: dict, aliases: dict, option: str) -> list[tuple[str, str]]:
    """(name as asked, canonical name) pairs. Raises SmiError on an unknown field."""
    pairs = []
    for asked in (item.strip() for item in spec.split(",")):
        canonical = aliases.get(asked.lower(), asked.lower())
        if canonical not in table:
            raise SmiError(f'Field "{asked}" is not a valid field to query.\n\n'
                           f"Please run 'nvidia-smi --help-{option}' for more information.\n",
                           EXIT_BAD_ARGUMENT)
        pairs.append((asked, canonical))
    return pairs


def _header(pairs, table) -> str:
    # The header keeps the unit even with nounits, as the real tool does.
    cells = [f"{asked} [{table[c][0]}]" if table[c][0] else asked for asked, c in pairs]
    return ", ".join(cells)


def _csv(rows: list[list[str]], pairs, table, options: set[str]) -> str:
    lines = [] if "noheader" in options else [_header(pairs, table)]
    lines += [", ".join(row) for row in rows]
    return "".join(line + "\n" for line in lines)


def query_gpu(node: dict, states: list[dict], spec: str, options: set[str]) -> tuple[str, int]:
    pairs = _resolve_fields(spec, GPU_FIELDS, _GPU_ALIASES, "query-gpu")
    nounits = "nounits" in options
    out, code = [], 0
    rows = []
    for g in states:
        if g["lost"]:
            out.append(_lost_message(g) + "\n")
            code = EXIT_GPU_LOST
            continue
        rows.append([GPU_FIELDS[c][1](g, node, nounits) for _, c in pairs])
    return "".join(out) + _csv(rows, pairs, GPU_FIELDS, options), code


def query_apps(node: dict, states: list[dict], spec: str, options: set[str]) -> tuple[str, int]:
    pairs = _resolve_fields(spec, APPS_FIELDS, _APPS_ALIASES, "query-compute-apps")
    nounits = "nounits" in options
    rows = [[APPS_FIELDS[c][1](g, p, nounits) for _, c in pairs]
            for g in states if not g["lost"] for p in g["processes"]]
    code = EXIT_GPU_LOST if any(g["lost"] for g in states) else 0
    return _csv(rows, pairs, APPS_FIELDS, options), code


# --- -L, topo -m, the table ----------------------------------------------------------------


def list_gpus(node: dict, states: list[dict]) -> str:
    return "".join(f"GPU {g['index']}: {g['name']} (UUID: {g['uuid']})\n" for g in states)


TOPO_LEGEND = """
Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks
"""


def topo_matrix(node: dict, states: list[dict]) -> str:
    """``topo -m`` as 5xx drivers print it: tab separated, NUMA cell followed by two tabs."""
    names = [f"GPU{g['index']}" for g in node["gpus"]]
    topo = node.get("topo", {})
    lines = ["\t" + "\t".join(names + ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"])]
    for row in names:
        cells = [" X " if col == row else topo.get(row, {}).get(col, "SYS") for col in names]
        tail = [node.get("cpu_affinity", "0"), node.get("numa_affinity", "0"), "", "N/A"]
        lines.append("\t".join([row] + cells + tail))
    return "\n".join(lines) + "\n" + TOPO_LEGEND


_RULE = "+" + "-" * 41 + "+" + "-" * 24 + "+" + "-" * 22 + "+"


def _truncate(text: str, width: int, keep_end: bool = False) -> str:
    """Fit a name in a column the way the tool does (``…`` after the head, or before the tail)."""
    if len(text) <= width:
        return text
    return "..." + text[-(width - 3):] if keep_end else text[: width - 4] + " ..."


def _gpu_rows(g: dict) -> list[str]:
    # A name too long for its 31 columns is cut to 27 ("NVIDIA GeForce RTX 4060 ..."),
    # as drivers print laptop cards.
    name = _truncate(g["name"], 27) if len(g["name"]) > 31 else g["name"]
    fan = "N/A" if g["fan_pct"] is None else f"{g['fan_pct']:.0f}%"
    power = f"{g['power_w']:.0f}W"
    limit = f"{g['power_limit_w']:.0f}W"
    return [
        f"| {g['index']:>3}  {name:<31}{'On' if g.get('persistence') else 'Off':<3} "
        f"| {g['pci_bus_id']:>18} {'Off':>3} | {'N/A':>20} |",
        f"| {fan:>3} {str(g['temp_c']) + 'C':>5} {g['pstate']:>5} {power:>15} / {limit:>5} "
        f"| {str(g['memory_used_mb']) + 'MiB':>10} / {str(g['memory_total_mb']) + 'MiB':>9} "
        f"| {g['util']:>6.0f}%      Default |",
        f"| {'':39} | {'':22} | {'N/A':>20} |",
        _RULE,
    ]


def _process_rows(states: list[dict]) -> list[str]:
    rows = [f"|  {g['index']:>3}   N/A  N/A  {p['pid']:>8}      C   "
            f"{_truncate(p['name'], 40, keep_end=True):<40}  "
            f"{('N/A' if p['memory_mb'] is None else str(p['memory_mb']) + 'MiB'):>10} |"
            for g in states for p in g["processes"]]
    return rows or [f"|  {'No running processes found':<87}|"]


def table(node: dict, states: list[dict]) -> str:
    """The default table, 91 columns wide, as 550/560 drivers print it."""
    smi = node.get("smi_version") or node["driver_version"]  # WSL2: the Linux tool, Windows' driver
    full_rule = "+" + "-" * 89 + "+"
    lines = [
        time.strftime("%a %b ") + f"{time.localtime().tm_mday:>2}" + time.strftime(" %H:%M:%S %Y") + " " * 7,
        full_rule,
        f"| NVIDIA-SMI {smi:<23}Driver Version: {node['driver_version']:<15}"
        f"CUDA Version: {node['cuda_version']:<9}|",
        "|" + "-" * 41 + "+" + "-" * 24 + "+" + "-" * 22 + "+",
        "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |",
        "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |",
        "|                                         |                        |               MIG M. |",
        "|" + "=" * 41 + "+" + "=" * 24 + "+" + "=" * 22 + "|",
    ]
    for g in states:
        lines += _gpu_rows(g)
    lines += [
        " " * 89,
        full_rule,
        f"| {'Processes:':<88}|",
        "|  GPU   GI   CI        PID   Type   Process name                              GPU Memory |",
        "|        ID   ID                                                               Usage      |",
        "|" + "=" * 89 + "|",
    ]
    lines += _process_rows(states)
    lines.append(full_rule)
    return "\n".join(lines) + "\n"


# --- command line --------------------------------------------------------------------------


def _bad_option(option: str) -> SmiError:
    return SmiError(f"ERROR: Option {option} is not recognized. Please run 'nvidia-smi -h'.\n",
                    EXIT_BAD_ARGUMENT)


def parse_args(argv: list[str]) -> dict:
    """argv -> {"mode", "fields", "format", "ids"}. Raises SmiError as the tool would."""
    args = {"mode": "table", "fields": None, "format": None, "ids": None}
    if argv[:1] == ["topo"]:
        if argv[1:] not in (["-m"], ["--matrix"]):
            raise _bad_option(" ".join(argv[1:]) or "topo")
        return dict(args, mode="topo")
    i = 0
    while i < len(argv):
        arg = argv[i]
        key, sep, value = arg.partition("=")
        takes_value = key in ("--query-gpu", "--query-compute-apps", "--format", "-i", "--id")
        if takes_value and not sep:
            if i + 1 >= len(argv):
                raise SmiError(f"Option {key} requires a value. Please run 'nvidia-smi -h'.\n",
                               EXIT_BAD_ARGUMENT)
            i += 1
            value = argv[i]
        if key in ("--query-gpu", "--query-compute-apps"):
            args.update(mode="gpu" if key == "--query-gpu" else "apps", fields=value)
        elif key == "--format":
            args["format"] = {item.strip() for item in value.split(",")}
        elif key in ("-i", "--id"):
            args["ids"] = [item.strip() for item in value.split(",")]
        elif arg in ("-L", "--list-gpus"):
            args["mode"] = "list"
        elif arg in ("-r", "--gpu-reset"):
            args["mode"] = "reset"
        else:
            raise _bad_option(arg)
        i += 1
    if args["mode"] in ("gpu", "apps"):
        fmt = args["format"]
        if not fmt or "csv" not in fmt or not fmt <= {"csv", "noheader", "nounits"}:
            raise SmiError("Invalid combination of input arguments. Please run 'nvidia-smi -h' "
                           "for help.\n", EXIT_BAD_ARGUMENT)
    return args


def select(states: list[dict], ids: list[str] | None) -> list[dict]:
    """GPUs named by ``-i`` (index, UUID or PCI bus id). Raises SmiError for an unknown id."""
    if ids is None:
        return states
    chosen = []
    for wanted in ids:
        match = [g for g in states if wanted in (str(g["index"]), g["uuid"], g["pci_bus_id"])]
        if not match:
            raise SmiError("No devices were found\n", EXIT_NOT_FOUND)
        chosen += match
    return chosen


def update_faults(sim_dir: str, change) -> dict:
    """Apply ``change(gpus)`` to faults.json under a lock, written atomically (a reader
    never sees half a file). Shared with ``nebula_tui.sim.faults``."""
    path = os.path.join(sim_dir, "faults.json")
    with open(os.path.join(sim_dir, "faults.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            with open(path, encoding="utf-8") as handle:
                doc = json.load(handle)
        except (OSError, ValueError):
            doc = {}
        gpus = doc.setdefault("gpus", {})
        change(gpus)
        for key in [k for k, v in gpus.items() if not v]:
            del gpus[key]
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump(doc, handle, indent=2, sort_keys=True)
        os.replace(tmp, path)
        # The same faults flat, for the simulated NVML (a C library reads them).
        with open(tmp, "w", encoding="utf-8") as handle:
            for index, fields in sorted(gpus.items()):
                for key, value in sorted(fields.items()):
                    text = str(value).lower() if isinstance(value, bool) else str(value)
                    handle.write(f"{index}\t{key}\t{text}\n")
        os.replace(tmp, os.path.join(sim_dir, "faults.tsv"))
    return doc


def reset(sim_dir: str, states: list[dict]) -> tuple[str, int]:
    """``-r``: reset each chosen GPU, or say why not (in use, lost, a failing card)."""
    out, code, done = [], 0, []
    for g in states:
        bus = g["pci_bus_id"]
        if g["lost"] or g.get("reset_fails"):
            out.append(f"Unable to reset GPU {bus}: Unknown Error\n")
            code = EXIT_GPU_LOST if g["lost"] else EXIT_OTHER
        elif g["processes"]:
            out.append(f"GPU {bus} is currently in use by another process.\n\n"
                       "1 device is currently being used by one or more other processes "
                       "(e.g., Fabric Manager, CUDA application, graphics application such as "
                       "an X server, or a monitoring application such as another instance of "
                       "nvidia-smi). Please first kill all processes using this device and all "
                       "compute applications running in the system.\n")
            code = EXIT_OTHER
        else:
            out.append(f"GPU {bus} was successfully reset.\n")
            done.append(str(g["index"]))
    if done:
        def clear(gpus: dict) -> None:
            for index in done:
                gpus.pop(index, None)

        update_faults(sim_dir, clear)
    if code == 0:
        out.append("All done.\n")
    return "".join(out), code


# --- a sick node's tools ---------------------------------------------------------------------

#: What a tool of a release the parsers do not know prints (``tool_faults.json``: "newer").
NEWER = {
    "amd-smi": '{"gpu_data": [{"gpu": 0, "asic": {"market_name": "AMD Instinct MI210"}}]}\n',
    "rocm-smi": "ROCm SMI 9.0: the concise table is retired; use amd-smi\n",
    "xpu-smi": "| DeviceId | Name | Usage |\n| 0 | Arc | 10 |\n",
    "npu-smi": '{"npu": [{"id": 0, "chips": [{"hbm_usage": "1/2"}]}]}\n',
    "nvidia-smi": "index;uuid;name\n0;GPU-0;NVIDIA Future GPU\n",
}


def misbehaviour(sim_dir: str, tool: str) -> str:
    """How ``$NEBULA_SIM_DIR/tool_faults.json`` (``{"xpu-smi": "hang"}``) says ``tool`` acts up."""
    try:
        with open(os.path.join(sim_dir, "tool_faults.json"), encoding="utf-8") as handle:
            return str(json.load(handle).get(tool) or "")
    except (OSError, ValueError, AttributeError):
        return ""


def act_up(tool: str, how: str) -> tuple[str, int] | None:
    """(stdout, exit code) of a misbehaving tool, or None to behave. ``hang`` never returns;
    ``slow`` behaves after 5 s (a loaded node); ``fail`` exits 1 with an error, ``garbage``
    prints noise, ``newer`` another layout."""
    if how == "hang":
        while True:
            time.sleep(3600)
    if how == "slow":
        time.sleep(5)
        return None
    if how == "fail":
        sys.stderr.write(f"{tool}: failed to initialize the driver (code 0xdead)\n")
        return "", 1
    if how == "garbage":
        return "\x00\x13\x7f garbled #### %%%% ~~~~\n" * 3, 0
    if how == "newer":
        return NEWER.get(tool, "version 99\n"), 0
    return None


def run(argv: list[str]) -> tuple[str, int]:
    """Everything but printing: argv -> (stdout text, exit code). Raises SmiError."""
    args = parse_args(argv)
    node, faults = load_node(os.environ.get("NEBULA_SIM_DIR", "."))
    processes = scan_processes(node)
    woken = woken_at(os.environ.get("NEBULA_SIM_DIR", "."))
    states = [gpu_state(g, processes, faults.get(str(g["index"]), {}), woken.get(g["index"], 0.0))
              for g in node["gpus"]]
    if node.get("wsl"):  # WSL2's nvidia-smi gets no per-process memory from the Windows driver
        for state in states:
            state["processes"] = [dict(p, memory_mb=None) for p in state["processes"]]
    states = select(states, args["ids"])
    mode = args["mode"]
    if mode == "reset":
        return reset(os.environ.get("NEBULA_SIM_DIR", "."), states)
    if mode == "gpu":
        return query_gpu(node, states, args["fields"], args["format"])
    if mode == "apps":
        return query_apps(node, states, args["fields"], args["format"])
    lost = [g for g in states if g["lost"]]
    if lost:  # the whole-device views give up on a lost GPU, like the real tool
        return "".join(_lost_message(g) + "\n" for g in lost), EXIT_GPU_LOST
    if mode == "list":
        return list_gpus(node, states), 0
    if mode == "topo":
        return topo_matrix(node, states), 0
    return table(node, states), 0


def main(argv: list[str] | None = None) -> int:
    acted = act_up("nvidia-smi", misbehaviour(os.environ.get("NEBULA_SIM_DIR", "."), "nvidia-smi"))
    if acted is not None:
        sys.stdout.write(acted[0])
        return acted[1]
    try:
        text, code = run(sys.argv[1:] if argv is None else argv)
    except SmiError as exc:
        sys.stdout.write(str(exc))
        return exc.code
    sys.stdout.write(text)
    return code


if __name__ == "__main__":
    sys.exit(main())
