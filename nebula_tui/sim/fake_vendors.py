#!/usr/bin/env python3
"""Emulated ``amd-smi``, ``rocm-smi``, ``xpu-smi`` and ``npu-smi`` for the simulated lab:
``python3 fake_vendors.py TOOL ARGS…``.

Like ``fake_smi.py`` (whose node state, process scan and readings it shares) it is stdlib
only and never imports nebula_tui. The node's devices of each vendor are node.json's
``devices`` (``{"vendor": "intel", "index": 0, …}``); a process is on one when its
environment names this node and the vendor's variable lists the device
(``ROCR_VISIBLE_DEVICES``/``HIP_VISIBLE_DEVICES``, ``ZE_AFFINITY_MASK``,
``ASCEND_RT_VISIBLE_DEVICES``). Faults are faults.json entries keyed ``"<vendor>:<index>"``.

The layouts follow the real tools' outputs in ``tests/data/samples/other_vendors``:
``tests/unit/test_fake_vendors.py`` gives each view the values its sample shows and
compares the text byte for byte: ``amd_smi_view`` (``amd-smi``'s default view, MI300X),
``rocm_concise_view`` (``rocm-smi``'s concise table, its two leading blank lines included),
``xpu_discovery_view`` and ``xpu_stats_view`` (``xpu-smi discovery``; ``stats -d N`` with
its empty cells and closing blank line) and ``npu_smi_view`` (``npu-smi info``, 8x 910B2
with no process). Against the 2x 910B2C sample, which has a process row, ``npu_smi_view``
is compared after two normalisations: that capture's one trailing space per line is
removed, and its last line (a ``-`` rule where the capture stops, with no row for the idle
NPU 1) is left out; other real captures (nputop's npu-smi 24.1 and 25.2 fixtures) close
each NPU's process rows with a ``=`` rule and list an idle NPU, as the view does.
``rocm-smi --json``'s values are the simulator's own, so only its keys are compared with
the telegraf MI100 sample's: each key of a card (in the sample's order) and of ``system``
(``Driver version``, ``--showtopo``'s ``(Topology)`` keys) is one the sample has. Outputs
no sample shows (``amd-smi``'s process box, ``xpu-smi discovery -d N``'s extra lines,
``xpu-smi ps``) follow the same conventions.

``$NEBULA_SIM_DIR/tool_faults.json`` (``{"xpu-smi": "hang"}``) makes a tool misbehave, as
tools on a sick node do (``fake_smi.act_up``).
"""

from __future__ import annotations

import json
import os
import sys

try:
    from . import fake_smi
except ImportError:  # run as a script: the sim directory is sys.path[0]
    import fake_smi

#: The variables each vendor's runtime reads (the first is the one the launcher sets first).
VARIABLES = {"amd": ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"), "intel": ("ZE_AFFINITY_MASK",),
             "ascend": ("ASCEND_RT_VISIBLE_DEVICES",)}
TOOL_VENDOR = {"amd-smi": "amd", "rocm-smi": "amd", "xpu-smi": "intel", "npu-smi": "ascend"}


class ToolError(Exception):
    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


# --- state ------------------------------------------------------------------------------------


def vendor_states(node: dict, faults: dict, vendor: str) -> list[dict]:
    """Each device of ``vendor`` with its live readings (fake_smi.gpu_state's keys)."""
    devices = [d for d in node.get("devices", []) if d.get("vendor") == vendor]
    processes = []
    for variable in VARIABLES[vendor]:
        for process in fake_smi.scan_processes(node, variable, devices):
            if all(p["pid"] != process["pid"] for p in processes):
                processes.append(process)
    return [fake_smi.gpu_state(d, processes, faults.get("%s:%d" % (vendor, d["index"]), {}))
            for d in devices]


# --- amd-smi -----------------------------------------------------------------------------------

AMD_RULE = "+" + "-" * 78 + "+"
AMD_SPLIT = "+" + "-" * 37 + "+" + "-" * 40 + "+"


def amd_smi_view(versions: dict, gpus: list[dict], processes: list[dict]) -> str:
    """The default view of amd-smi 26: the header box, two rows per GPU, then processes.

    Each GPU dict: bdf, name, gpu, hip, oam, partition, mem_util, temp, uec, power, cap,
    gfx_util, fan, used_mb, total_mb (values as printed, "N/A" included)."""
    lines = [AMD_RULE,
             "| " + ("AMD-SMI " + versions["amd_smi"]).ljust(29)
             + ("amdgpu version: " + versions["amdgpu"]).ljust(25)
             + ("ROCm version: " + versions["rocm"]).ljust(23) + "|",
             "| " + ("VBIOS version: " + versions["vbios"]).ljust(77) + "|",
             "| " + ("Platform: " + versions["platform"]).ljust(77) + "|",
             "|" + "-" * 37 + "+" + "-" * 40 + "|",
             "| BDF                        GPU-Name | Mem-Uti   Temp   UEC       Power-Usage |",
             "| GPU  HIP-ID  OAM-ID  Partition-Mode | GFX-Uti    Fan               Mem-Usage |",
             "|" + "=" * 37 + "+" + "=" * 40 + "|"]
    for g in gpus:
        first = "%s%s" % (g["bdf"], g["name"].rjust(23))
        right = "%s%s%s%s" % (g["mem_util"].ljust(9), g["temp"].ljust(8), g["uec"],
                              ("%s/%s W" % (g["power"], g["cap"])).rjust(20))
        second = "%s%s%s%s" % (str(g["gpu"]).rjust(3), str(g["hip"]).rjust(8), str(g["oam"]).rjust(8),
                               g["partition"].rjust(16))
        right2 = "%s%s%s" % (g["gfx_util"].ljust(11), g["fan"].ljust(3),
                             ("%s/%s MB" % (g["used_mb"], g["total_mb"])).rjust(24))
        lines += ["| %s | %s |" % (first, right), "| %s | %s |" % (second, right2), AMD_SPLIT]
    if processes is not None:
        lines += ["", AMD_RULE, "| " + "Processes:".ljust(77) + "|",
                  "|  GPU        PID  Process Name          GTT_MEM  VRAM_MEM  MEM_USAGE     CU % |",
                  "|" + "=" * 78 + "|"]
        for p in processes:
            vram = "%.1f GB" % (p["memory_mb"] / 1024.0)
            lines.append("| %4d %10d  %-20s %8s %9s %10s %8s |" % (
                p["gpu"], p["pid"], p["name"][:20], "0.0 B", vram, vram, "%.1f %%" % p["util"]))
        if not processes:
            lines.append("|  " + "No running processes found".ljust(76) + "|")
        lines.append(AMD_RULE)
    return "\n".join(lines) + "\n"


def amd_smi(node: dict, states: list[dict], argv: list[str]) -> str:
    if argv:
        raise ToolError("amd-smi: this simulated amd-smi answers only its default view, not %s"
                        % " ".join(argv), 2)
    versions = dict({"amd_smi": "26.2.0+021c61fc", "amdgpu": "6.16.6", "rocm": "7.1.1",
                     "vbios": "00114328", "platform": "Linux Baremetal"}, **node.get("amd_versions", {}))
    gpus, processes = [], []
    for g in states:
        gpus.append({"bdf": g["pci_bus_id"].lower(), "name": g["name"], "gpu": g["index"],
                     "hip": g["index"], "oam": g.get("oam_id", "N/A"),
                     "partition": g.get("partition", "SPX/NPS1"),
                     "mem_util": "%d %%" % round(g["util"] * 0.4),
                     "temp": "%d °C" % g["temp_c"], "uec": str(g.get("ecc_uncorrected", 0)),
                     "power": "%d" % round(g["power_w"]), "cap": "%d" % round(g["power_limit_w"]),
                     "gfx_util": "%d %%" % round(g["util"]), "fan": "N/A",
                     "used_mb": g["memory_used_mb"], "total_mb": g["memory_total_mb"]})
        processes += [dict(p, gpu=g["index"]) for p in g["processes"]]
    return amd_smi_view(versions, gpus, processes)


# --- rocm-smi ----------------------------------------------------------------------------------

ROCM_TITLE = "=" * 41 + " ROCm System Management Interface " + "=" * 41
ROCM_CONCISE = "=" * 51 + " Concise Info " + "=" * 51
ROCM_RULE = "=" * 116
ROCM_END = "=" * 47 + " End of ROCm SMI Log " + "=" * 48


def rocm_concise_view(rows: list[dict]) -> str:
    """``rocm-smi`` (6.x): each row dict has device, node, did, guid, temp, power, sclk, mclk,
    fan, perf, cap, vram, use (values as printed)."""
    lines = ["", "", ROCM_TITLE, ROCM_CONCISE,
             "Device  Node  IDs              Temp    Power  Partitions          SCLK    MCLK     "
             "Fan  Perf  PwrCap  VRAM%  GPU%",
             "              (DID,     GUID)  (Edge)  (Avg)  (Mem, Compute, ID)", ROCM_RULE]
    for r in rows:
        lines.append("%-8s%-6s%-10s%-7s%-8s%-7s%-20s%-8s%-9s%-5s%-6s%-8s%-7s%s" % (
            r["device"], r["node"], r["did"] + ",", r["guid"], r["temp"], r["power"], "N/A, N/A, 0",
            r["sclk"], r["mclk"], r["fan"], r["perf"], r["cap"], r["vram"], r["use"]))
    lines += [ROCM_RULE, ROCM_END]
    return "\n".join(lines) + "\n"


def _rocm_card(g: dict) -> dict:
    levels = {str(i + 1): "%dMhz" % (495 + i * (g["max_sm_clock_mhz"] - 495) // 14) for i in range(15)}
    return dict([
        ("Device ID", g.get("device_id", "0x740f")), ("Device Rev", "0x2"),
        ("Unique ID", g["unique_id"]), ("VBIOS version", g.get("vbios", "113-D67301-063")),
        ("Temperature (Sensor edge) (C)", "%.1f" % g["temp_c"]),
        ("Temperature (Sensor junction) (C)", "%.1f" % (g["temp_c"] + 3)),
        ("Temperature (Sensor memory) (C)", "%.1f" % (g["temp_c"] + 1)),
        ("fclk clock speed:", "(1402Mhz)"), ("fclk clock level:", "0"),
        ("mclk clock speed:", "(%dMhz)" % g["mem_clock_mhz"]), ("mclk clock level:", "0"),
        ("sclk clock speed:", "(%dMhz)" % g["sm_clock_mhz"]), ("sclk clock level:", "0"),
        ("socclk clock speed:", "(1000Mhz)"), ("socclk clock level:", "0"),
        ("pcie clock level", "0 (%s x%d)" % (_GTS[g.get("pcie_gen", 4)], g.get("pcie_width", 16))),
        ("sclk clock level", "0 (%dMhz)" % g["sm_clock_mhz"]),
        ("Performance Level", "auto"),
        ("Max Graphics Package Power (W)", "%.1f" % g["power_limit_w"]),
        ("Average Graphics Package Power (W)", "%.1f" % g["power_w"]),
        ("0", "%s x%d *" % (_GTS[g.get("pcie_gen", 4)], g.get("pcie_width", 16)))]
        + sorted(levels.items(), key=lambda item: int(item[0])) + [
        ("GPU use (%)", "%d" % round(g["util"])), ("GPU memory use (%)", "%d" % round(
            100.0 * g["memory_used_mb"] / g["memory_total_mb"])),
        ("PCI Bus", g["pci_bus_id"].upper()),
        ("VRAM Total Memory (B)", str(g["memory_total_mb"] * 2**20)),
        ("VRAM Total Used Memory (B)", str(g["memory_used_mb"] * 2**20)),
        ("Card series", g.get("series", g["name"])), ("Card model", g.get("model_id", "0x0c34")),
        ("Card vendor", "Advanced Micro Devices, Inc. [AMD/ATI]"), ("Card SKU", g.get("sku", "D67301")),
    ])


_GTS = {1: "2.5GT/s", 2: "5.0GT/s", 3: "8.0GT/s", 4: "16.0GT/s", 5: "32.0GT/s"}


def _rocm_links(node: dict, states: list[dict]) -> dict:
    system = {}
    links = node.get("amd_links", {})
    for a in states:
        for b in states:
            if a["index"] < b["index"]:
                kind = links.get("%d-%d" % (a["index"], b["index"]), "PCIE")
                pair = "between DRM devices %d and %d" % (a["index"], b["index"])
                system["(Topology) Weight " + pair] = "15" if kind == "XGMI" else "40"
                system["(Topology) Hops " + pair] = "1" if kind == "XGMI" else "2"
                system["(Topology) Link type " + pair] = kind
    return system


def rocm_smi(node: dict, states: list[dict], argv: list[str]) -> str:
    if "--json" not in argv:
        if argv:
            raise ToolError("rocm-smi: this simulated rocm-smi answers its concise table and "
                            "--json only, not %s" % " ".join(argv), 2)
        return rocm_concise_view([{
            "device": g["index"], "node": g["index"] + 2, "did": g.get("device_id", "0x740f"),
            "guid": str(g.get("guid", 10000 + g["index"])), "temp": "%.1f°C" % g["temp_c"],
            "power": "%.1fW" % g["power_w"], "sclk": "%dMhz" % g["sm_clock_mhz"],
            "mclk": "%dMhz" % g["mem_clock_mhz"], "fan": "0%", "perf": "auto",
            "cap": "%.1fW" % g["power_limit_w"],
            "vram": "%d%%" % round(100.0 * g["memory_used_mb"] / g["memory_total_mb"]),
            "use": "%d%%" % round(g["util"])} for g in states])
    if "--showtopo" in argv:
        document = {"system": _rocm_links(node, states)}
    else:
        document = dict(("card%d" % g["index"], _rocm_card(g)) for g in states)
        system = {"Driver version": node.get("amd_versions", {}).get("amdgpu", "6.3.6")}
        for g in states:
            for p in g["processes"]:
                system["PID%d" % p["pid"]] = "%s, %d, %d, 0, 0" % (p["name"], g["index"],
                                                                    p["memory_mb"] * 2**20)
        document["system"] = system
    return json.dumps(document, indent=4) + "\n"


# --- xpu-smi -----------------------------------------------------------------------------------

XPU_DISCOVERY_RULE = "+" + "-" * 11 + "+" + "-" * 86 + "+"
XPU_STATS_RULE = "+" + "-" * 29 + "+" + "-" * 68 + "+"


def xpu_discovery_view(devices: list[tuple[int, list[str]]]) -> str:
    """``xpu-smi discovery``: per device, its id and ``Key: value`` lines."""
    lines = [XPU_DISCOVERY_RULE, "| Device ID | " + "Device Information".ljust(85) + "|",
             XPU_DISCOVERY_RULE]
    for number, info in devices:
        for position, text in enumerate(info):
            lines.append("| %s| %s|" % ((str(number) if position == 0 else "").ljust(10), text.ljust(85)))
        lines.append(XPU_DISCOVERY_RULE)
    return "\n".join(lines) + "\n"


def xpu_stats_view(rows: list[list[tuple[str, str]]]) -> str:
    """``xpu-smi stats -d N``: boxes of (key, value) rows, each list one box."""
    lines = [XPU_STATS_RULE]
    for box in rows:
        lines += ["| %s| %s|" % (key.ljust(28), value.ljust(67)) for key, value in box]
        lines.append(XPU_STATS_RULE)
    return "\n".join(lines) + "\n\n"


def _xpu_info(g: dict, detailed: bool) -> list[str]:
    info = ["Device Name: " + g["name"], "Vendor Name: Intel(R) Corporation",
            "SOC UUID: " + g["uuid"], "PCI BDF Address: " + g["pci_bus_id"],
            "DRM Device: " + g.get("drm", "/dev/dri/card%d" % g["index"]),
            "Function Type: physical"]
    if detailed:
        info[1:1] = ["PCI Device ID: " + g.get("device_id", "0x56a0")]
        info += ["Core Clock Rate: %d MHz" % g["max_sm_clock_mhz"],
                 "PCIe Generation: %d" % g.get("pcie_gen", 4),
                 "PCIe Max Link Width: %d" % g.get("pcie_width", 16),
                 "Memory Physical Size: %.2f MiB" % g["memory_total_mb"],
                 "Number of Tiles: 1"]
    return info


def xpu_smi(node: dict, states: list[dict], argv: list[str]) -> str:
    def device(args: list[str]) -> dict:
        if "-d" not in args or args.index("-d") + 1 >= len(args):
            raise ToolError("xpu-smi: option -d requires a device id", 1)
        wanted = args[args.index("-d") + 1]
        for g in states:
            if str(g["index"]) == wanted:
                return g
        raise ToolError("Error: device %s is not found" % wanted, 1)

    if argv[:1] == ["discovery"]:
        chosen = [device(argv)] if "-d" in argv else states
        return xpu_discovery_view([(g["index"], _xpu_info(g, "-d" in argv)) for g in chosen])
    if argv[:1] == ["stats"]:
        g = device(argv)
        util = "%d" % round(g["util"])
        return xpu_stats_view([
            [("Device ID", str(g["index"]))],
            [("GPU Utilization (%)", util), ("EU Array Active (%)", ""), ("EU Array Stall (%)", ""),
             ("EU Array Idle (%)", ""), ("", ""),
             ("Compute Engine Util (%)", "%s; Engine 0: %s, Engine 1: 0, Engine 2: 0, Engine 3: 0" % (util, util)),
             ("Render Engine Util (%)", "0; Engine 0: 0"), ("Media Engine Util (%)", "0"),
             ("Decoder Engine Util (%)", "Engine 0: 0, Engine 1: 0"),
             ("Encoder Engine Util (%)", "Engine 0: 0, Engine 1: 0"),
             ("Copy Engine Util (%)", "0; Engine 0: 0"),
             ("Media EM Engine Util (%)", "Engine 0: 0, Engine 1: 0"), ("3D Engine Util (%)", "")],
            [("Reset", ""), ("Programming Errors", ""), ("Driver Errors", ""),
             ("Cache Errors Correctable", ""), ("Cache Errors Uncorrectable", ""),
             ("Mem Errors Correctable", ""), ("Mem Errors Uncorrectable", "")],
            [("GPU Power (W)", "%d" % round(g["power_w"])),
             ("GPU Frequency (MHz)", "%d" % g["sm_clock_mhz"]),
             ("GPU Core Temperature (C)", "%d" % g["temp_c"]),
             ("GPU Memory Temperature (C)", ""), ("GPU Memory Read (kB/s)", "0"),
             ("GPU Memory Write (kB/s)", "0"), ("GPU Memory Bandwidth (%)", "0"),
             ("GPU Memory Used (MiB)", str(g["memory_used_mb"])),
             ("Xe Link Throughput (kB/s)", "")]])
    if argv[:1] == ["ps"]:
        lines = ["%-10s%-20s%-15s%-12s%s" % ("PID", "Command", "DeviceID", "SHR", "MEM")]
        for g in states:
            for p in g["processes"]:
                lines.append("%-10d%-20s%-15d%-12d%d" % (p["pid"], os.path.basename(p["name"])[:19],
                                                          g["index"], 0, p["memory_mb"] * 1024))
        return "\n".join(lines) + "\n"
    raise ToolError("xpu-smi: this simulated xpu-smi answers discovery, stats and ps, not %s"
                    % " ".join(argv), 1)


# --- npu-smi -----------------------------------------------------------------------------------

NPU_RULE = "+" + "-" * 96 + "+"
NPU_SPLIT = "+" + "-" * 27 + "+" + "-" * 15 + "+" + "-" * 52 + "+"
NPU_DOUBLE = "+" + "=" * 27 + "+" + "=" * 15 + "+" + "=" * 52 + "+"


def npu_smi_view(version: str, npus: list[dict], processes: dict) -> str:
    """``npu-smi info`` (23.0.x): each NPU dict has npu, name, health, power, temp, chip,
    bus, aicore, hbm_used, hbm_total; ``processes`` maps an NPU id to its rows."""
    lines = [NPU_RULE, "| " + ("npu-smi " + version).ljust(33) + ("Version: " + version).ljust(62) + "|",
             NPU_SPLIT,
             "| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|",
             "| Chip                      | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |",
             NPU_DOUBLE]
    for n in npus:
        hbm = "%s/ %s" % (str(n["hbm_used"]).ljust(5), n["hbm_total"])
        lines += ["| %s| %s| %s%s%s|" % (("%-6s%s" % (n["npu"], n["name"])).ljust(26), n["health"].ljust(14),
                                          n["power"].ljust(12), n["temp"].ljust(18), "0    / 0".ljust(21)),
                  "| %s| %s| %s%s%s|" % (str(n["chip"]).ljust(26), n["bus"].ljust(14), n["aicore"].ljust(12),
                                          "0    / 0".ljust(18), hbm.ljust(21)),
                  NPU_DOUBLE]
    lines += [NPU_SPLIT,
              "| NPU     Chip              | Process id    | Process name             | Process memory(MB)      |",
              NPU_DOUBLE]
    for n in npus:
        rows = processes.get(n["npu"], [])
        for p in rows:
            lines.append("| %s| %s| %s| %s|" % (("%-8s%s" % (n["npu"], n["chip"])).ljust(26),
                                                  str(p["pid"]).ljust(14), p["name"][:24].ljust(25),
                                                  str(p["memory_mb"]).ljust(24)))
        if not rows:
            lines.append("| " + ("No running processes found in NPU %s" % n["npu"]).ljust(95) + "|")
        lines.append(NPU_DOUBLE)
    return "\n".join(lines) + "\n"


def npu_smi(node: dict, states: list[dict], argv: list[str]) -> str:
    if argv != ["info"]:
        raise ToolError("Error: this simulated npu-smi answers 'npu-smi info' only", 1)
    npus, processes = [], {}
    for g in states:
        npus.append({"npu": g["index"], "name": g["name"], "health": g.get("health", "OK"),
                     "power": "%.1f" % g["power_w"], "temp": "%d" % g["temp_c"], "chip": 0,
                     "bus": g["pci_bus_id"].upper(), "aicore": "%d" % round(g["util"]),
                     "hbm_used": g["memory_used_mb"], "hbm_total": g["memory_total_mb"]})
        processes[g["index"]] = [dict(p, name=os.path.basename(p["name"])) for p in g["processes"]]
    return npu_smi_view(node.get("npu_smi_version", "23.0.7"), npus, processes)


# --- misbehaviour and the command line -----------------------------------------------------------

TOOLS = {"amd-smi": amd_smi, "rocm-smi": rocm_smi, "xpu-smi": xpu_smi, "npu-smi": npu_smi}


def run(tool: str, argv: list[str]) -> tuple[str, int]:
    sim_dir = os.environ.get("NEBULA_SIM_DIR", ".")
    acted = fake_smi.act_up(tool, fake_smi.misbehaviour(sim_dir, tool))
    if acted is not None:
        return acted
    node, faults = fake_smi.load_node(sim_dir)
    states = vendor_states(node, faults, TOOL_VENDOR[tool])
    if not states:
        raise ToolError("%s: no device found" % tool, 1)
    return TOOLS[tool](node, states, argv), 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in TOOLS:
        sys.stderr.write("usage: fake_vendors.py {amd-smi,rocm-smi,xpu-smi,npu-smi} ARGS…\n")
        return 2
    try:
        text, code = run(argv[0], argv[1:])
    except (ToolError, fake_smi.SmiError) as err:
        sys.stderr.write(str(err).rstrip("\n") + "\n")
        return getattr(err, "code", 1)
    sys.stdout.write(text)
    return code


if __name__ == "__main__":
    sys.exit(main())
