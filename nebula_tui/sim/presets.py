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


def gpu_uuid(node: str, index: int) -> str:
    """``GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx``, the same for the same node and index."""
    return "GPU-" + str(uuid.uuid5(_UUID_NAMESPACE, f"{node}/{index}"))


def _gpu(node: str, node_number: int, index: int, model: str) -> dict:
    # Bus numbers differ per node and GPU so no two simulated GPUs share an address.
    bus = 0x01 + index * 0x20 + node_number
    return {"index": index, "uuid": gpu_uuid(node, index),
            "pci_bus_id": f"00000000:{bus:02X}:00.0", **_MODELS[model]}


def _topo(count: int, link) -> dict:
    """The ``topo -m`` matrix as {"GPUi": {"GPUj": link(i, j)}}."""
    return {f"GPU{i}": {f"GPU{j}": link(i, j) for j in range(count) if j != i}
            for i in range(count)}


def _node(name: str, number: int, models: list[str], link, cpus: str = "0-15") -> dict:
    return {"name": name, **_DRIVER,
            "gpus": [_gpu(name, number, i, model) for i, model in enumerate(models)],
            "topo": _topo(len(models), link), "cpu_affinity": cpus, "numa_affinity": "0"}


def _demo() -> list[dict]:
    # The laptop-class card hangs off the chipset, so reaching it crosses the CPU's
    # interconnect; the two 4090s share the CPU's host bridge.
    node01 = _node("node01", 1, ["rtx4090", "rtx4090", "rtx4060l"],
                   lambda i, j: "PHB" if max(i, j) < 2 else "SYS", cpus="0-31")
    node02 = _node("node02", 2, ["a100"] * 4, lambda i, j: "NV12", cpus="0-63")
    node03 = _node("node03", 3, ["rtx3090"] * 2, lambda i, j: "NV4", cpus="0-23")
    return [node01, node02, node03]


def _four_by_four() -> list[dict]:
    # GPUs 0/1 and 2/3 sit behind one PCIe switch each; across switches via the host bridge.
    link = lambda i, j: "PIX" if i // 2 == j // 2 else "PHB"  # noqa: E731
    return [_node(f"node0{n}", n, ["rtx4090"] * 4, link, cpus="0-31") for n in range(1, 5)]


_LAYOUTS = {"demo": _demo, "4x4": _four_by_four}


def uniform_nodes(count: int, gpus: int = 8, model: str = "a100") -> list[dict]:
    """``count`` alike nodes (node001, node002, …) of ``gpus`` NVLinked cards each: the
    benches' big labs."""
    # Bus numbers only need to differ within a node; n % 31 keeps them within one byte.
    return [_node(f"node{n:03d}", n % 31, [model] * gpus, lambda i, j: "NV12", cpus="0-63")
            for n in range(1, count + 1)]


def node_specs(layout: str) -> list[dict]:
    """node.json dicts for a lab layout ("demo" or "4x4"). Raises ValueError for others."""
    try:
        return _LAYOUTS[layout]()
    except KeyError:
        raise ValueError(
            f"unknown lab layout '{layout}'; choose one of {', '.join(sorted(_LAYOUTS))}"
        ) from None
