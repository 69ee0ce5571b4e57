"""GPU inventories of the simulated lab: the ``node.json`` contents the emulated tools read.

Everything is deterministic (UUIDs come from node name + index) so tests and screenshots
see the same cluster every run.
"""

from __future__ import annotations

import uuid

_UUID_NAMESPACE = uuid.UUID("6f1e8c52-3d7a-4b8e-9c1d-2a5b7e0f4c33")

# Per model: the facts a real card of that model reports (name, MiB, cc, limits, clocks).
_MODELS: dict[str, dict] = {
    "rtx4090": {"name": "NVIDIA GeForce RTX 4090", "memory_total_mb": 24564, "compute_cap": "8.9",
                "power_limit_w": 450.0, "idle_power_w": 18.0, "base_temp_c": 32,
                "max_sm_clock_mhz": 2520, "max_mem_clock_mhz": 10501, "pcie_gen": 4,
                "pcie_width": 16, "has_fan": True},
    "rtx4060l": {"name": "NVIDIA GeForce RTX 4060 Laptop GPU", "memory_total_mb": 8188,
                 "compute_cap": "8.9", "power_limit_w": 80.0, "idle_power_w": 3.0,
                 "base_temp_c": 38, "max_sm_clock_mhz": 2370, "max_mem_clock_mhz": 8001,
                 "pcie_gen": 4, "pcie_width": 8, "has_fan": False},
    "a100": {"name": "NVIDIA A100-SXM4-80GB", "memory_total_mb": 81920, "compute_cap": "8.0",
             "power_limit_w": 400.0, "idle_power_w": 62.0, "base_temp_c": 29,
             "max_sm_clock_mhz": 1410, "max_mem_clock_mhz": 1593, "pcie_gen": 4,
             "pcie_width": 16, "has_fan": False},
    "rtx3090": {"name": "NVIDIA GeForce RTX 3090", "memory_total_mb": 24576, "compute_cap": "8.6",
                "power_limit_w": 350.0, "idle_power_w": 20.0, "base_temp_c": 30,
                "max_sm_clock_mhz": 2100, "max_mem_clock_mhz": 9751, "pcie_gen": 4,
                "pcie_width": 16, "has_fan": True},
}

_DRIVER = {"driver_version": "550.54.15", "cuda_version": "12.4"}

# Other vendors' devices, as their tools report them (``devices`` in node.json; each
# vendor numbers its own from 0). Memory is MiB; clocks MHz; power W.
_DEVICES: dict[str, dict] = {
    "arc_a770": {"vendor": "intel", "name": "Intel(R) Arc(TM) A770 Graphics",
                 "memory_total_mb": 16288, "power_limit_w": 225.0, "idle_power_w": 36.0,
                 "base_temp_c": 38, "max_sm_clock_mhz": 2400, "max_mem_clock_mhz": 2000,
                 "pcie_gen": 4, "pcie_width": 16, "device_id": "0x56a0", "has_fan": True},
    "ascend_910b2": {"vendor": "ascend", "name": "910B2", "memory_total_mb": 65536,
                     "power_limit_w": 400.0, "idle_power_w": 92.0, "base_temp_c": 36,
                     "max_sm_clock_mhz": 1800, "max_mem_clock_mhz": 1600, "has_fan": False},
    "mi210": {"vendor": "amd", "name": "AMD Instinct MI210", "memory_total_mb": 65520,
              "power_limit_w": 300.0, "idle_power_w": 41.0, "base_temp_c": 34,
              "max_sm_clock_mhz": 1700, "max_mem_clock_mhz": 1600, "pcie_gen": 4,
              "pcie_width": 16, "device_id": "0x740f", "series": "Aldebaran/MI200 [Instinct MI210]",
              "has_fan": False},
}


def model_facts() -> list[dict]:
    """Every card model the simulated lab has, with the facts its tool reports and its vendor."""
    return [{**facts, "vendor": "nvidia", **_DRIVER} for facts in _MODELS.values()] + \
        [dict(facts) for facts in _DEVICES.values()]


def gpu_uuid(node: str, index: int) -> str:
    """``GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx``, the same for the same node and index."""
    return "GPU-" + str(uuid.uuid5(_UUID_NAMESPACE, f"{node}/{index}"))


def _gpu(node: str, node_number: int, index: int, model: str) -> dict:
    # Bus numbers differ per node and GPU so no two simulated GPUs share an address.
    bus = 0x01 + index * 0x20 + node_number
    return {"index": index, "uuid": gpu_uuid(node, index),
            "pci_bus_id": f"00000000:{bus:02X}:00.0", **_MODELS[model]}


def _topo(count: int, link) -> dict:
    """The ``topo -m`` matrix as {"GPUi": {"GPUj": link(i, j)}}; no link without two GPUs."""
    return {f"GPU{i}": {f"GPU{j}": link(i, j) for j in range(count) if j != i}
            for i in range(count)}


def _node(name: str, number: int, models: list[str], link, cpus: str = "0-15",
          devices: list[str] = ()) -> dict:
    return {"name": name, **_DRIVER,
            "gpus": [_gpu(name, number, i, model) for i, model in enumerate(models)],
            "devices": _devices(name, number, devices),
            "topo": _topo(len(models), link), "cpu_affinity": cpus, "numa_affinity": "0"}


def _devices(node: str, number: int, models: list[str]) -> list[dict]:
    """Other vendors' devices, numbered per vendor, ids derived from node and place."""
    out, counts = [], {}
    for model in models:
        facts = _DEVICES[model]
        index = counts[facts["vendor"]] = counts.get(facts["vendor"], -1) + 1
        key = uuid.uuid5(_UUID_NAMESPACE, f"{node}/{facts['vendor']}/{index}")
        bus = f"0000:{(0x03 + index * 0x10 + number * 0x20) % 0x100:02x}:00.0"
        device = {"index": index, "pci_bus_id": bus, **facts}
        if facts["vendor"] == "intel":  # xpu-smi's SOC UUID (vendor 8086, device 56a0 at its end)
            device["uuid"] = f"00000000-0000-{index:04x}-0000-{key.hex[:4]}{facts['device_id'][2:]}8086"
        elif facts["vendor"] == "amd":  # the nodes name AMD cards by bus (amd-smi shows no id)
            device["uuid"] = "AMD-" + bus
            device["unique_id"] = "0x" + key.hex[:16]
        else:  # npu-smi names no id: the nodes derive one from the bus, as here
            device["uuid"] = "NPU-" + bus
        out.append(device)
    return out


def _core() -> list[dict]:
    # The laptop-class card hangs off the chipset, so reaching it crosses the CPU's
    # interconnect; the two 4090s share the CPU's host bridge.
    node01 = _node("node01", 1, ["rtx4090", "rtx4090", "rtx4060l"],
                   lambda i, j: "PHB" if max(i, j) < 2 else "SYS", cpus="0-31")
    node02 = _node("node02", 2, ["a100"] * 4, lambda i, j: "NV12", cpus="0-63")
    node03 = _node("node03", 3, ["rtx3090"] * 2, lambda i, j: "NV4", cpus="0-23")
    # node03's NVML does not load: it is read through nvidia-smi, so the lab (and the
    # tests on it) always has both NVIDIA paths.
    node03["nvml"] = False
    return [node01, node02, node03]


def _demo() -> list[dict]:
    """The documents' lab: the three NVIDIA nodes, an Intel Arc A770, two Ascend 910B2 and
    two AMD MI210s joined by XGMI (each with its vendor's emulated tool)."""
    node04 = _node("node04", 4, [], None, devices=["arc_a770"])
    node05 = _node("node05", 5, [], None, devices=["ascend_910b2"] * 2, cpus="0-47")
    node06 = _node("node06", 6, [], None, devices=["mi210"] * 2, cpus="0-63")
    node06["amd_links"] = {"0-1": "XGMI"}
    return _core() + [node04, node05, node06]


def _mixed() -> list[dict]:
    """One node with an NVIDIA card and an Intel iGPU-class card: two vendors, one node."""
    node = _node("node01", 1, ["rtx4090"], None, devices=["arc_a770"])
    node["topo"] = {}
    return [node]


def _four_by_four() -> list[dict]:
    # GPUs 0/1 and 2/3 sit behind one PCIe switch each; across switches via the host bridge.
    link = lambda i, j: "PIX" if i // 2 == j // 2 else "PHB"  # noqa: E731
    return [_node(f"node0{n}", n, ["rtx4090"] * 4, link, cpus="0-31") for n in range(1, 5)]


def _wsl() -> list[dict]:
    """A Windows laptop joined as a WSL2 node: its RTX 4060 Laptop GPU served by the Windows
    driver (572.16, CUDA 12.8) through /usr/lib/wsl/lib, whose Linux nvidia-smi is 570.86.16
    (as microsoft/WSL issue 12584 shows such a laptop); per-process memory reads [N/A]."""
    node = _node("laptop01", 7, ["rtx4060l"], None, cpus="0-15")
    node.update(wsl=True, driver_version="572.16", smi_version="570.86.16", cuda_version="12.8",
                osrelease="5.15.167.4-microsoft-standard-WSL2", topo={})
    return [node]


_LAYOUTS = {"demo": _demo, "core": _core, "4x4": _four_by_four, "mixed": _mixed, "wsl": _wsl}
#: The layouts ``nebula demo --layout`` and ``python -m nebula_tui.sim.lab`` offer.
LAYOUTS = tuple(_LAYOUTS)


def uniform_nodes(count: int, gpus: int = 8, model: str = "a100") -> list[dict]:
    """``count`` alike nodes (node001, node002, …) of ``gpus`` NVLinked cards each: the
    benches' big labs."""
    # Bus numbers only need to differ within a node; n % 31 keeps them within one byte.
    return [_node(f"node{n:03d}", n % 31, [model] * gpus, lambda i, j: "NV12", cpus="0-63")
            for n in range(1, count + 1)]


def node_specs(layout: str) -> list[dict]:
    """node.json dicts for a lab layout (one of LAYOUTS). Raises ValueError for others."""
    try:
        return _LAYOUTS[layout]()
    except KeyError:
        raise ValueError(
            f"unknown lab layout '{layout}'; choose one of {', '.join(sorted(_LAYOUTS))}"
        ) from None
