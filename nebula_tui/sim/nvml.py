"""The simulated lab's NVML: build ``nvml_shim.c`` into ``libnvidia-ml.so.1`` and give each
NVIDIA node its ``nvml.tsv`` (the GPUs' static facts the library reads).

Built once per source version with the system C compiler (``sim/shims.py``). Without a
compiler there is no library: the nodes' nodelets then fall back to the emulated
``nvidia-smi``, as on a real node whose NVML cannot load (``nebula demo`` needs no compiler).
"""

from __future__ import annotations

from pathlib import Path

from . import shims

SOURCE = Path(__file__).resolve().parent / "nvml_shim.c"
LIBRARY = "libnvidia-ml.so.1"
#: "old": a driver without the calls added since R460/R510 (remapped rows, …).
VARIANTS = {"current": [], "old": ["-DSIM_OLD_DRIVER"]}


def build(variant: str = "current") -> Path | None:
    """The library built from the current source (cached), or None without a C compiler
    or when it does not build (then the lab has no NVML, and says nothing more)."""
    if variant not in VARIANTS:
        return None
    return shims.build(SOURCE, LIBRARY, tuple(VARIANTS[variant]), variant, ("-lm", "-lpthread"))


def gpu_table(spec: dict) -> str:
    """node.json's NVIDIA GPUs as ``nvml.tsv``: a driver line, then one line per GPU and one
    per MIG instance a GPU's ``mig`` lists (``{"uuid", "profile", "memory_total_mb"}``)."""
    from .fake_smi import base_sm_clock, has_ecc

    major, _, minor = spec.get("cuda_version", "12.4").partition(".")
    lines = [f"driver\t{spec.get('driver_version', '550.54.15')}\tcuda\t"
             f"{int(major) * 1000 + int(minor or 0) * 10}\twsl\t{int(bool(spec.get('wsl')))}"]
    for g in spec.get("gpus", []):
        cc_major, _, cc_minor = g.get("compute_cap", "8.0").partition(".")
        fields = ["gpu", g["index"], g["uuid"], g["name"], g["pci_bus_id"], g["memory_total_mb"],
                  g.get("power_limit_w", 250.0), g.get("idle_power_w", 15.0),
                  g.get("base_temp_c", 30), g.get("max_sm_clock_mhz", 1800),
                  g.get("max_mem_clock_mhz", 5000), base_sm_clock(g), g.get("pcie_gen", 4),
                  g.get("pcie_width", 16), cc_major, cc_minor or 0,
                  int(g.get("has_fan", True)), int(has_ecc(g)), int(bool(g.get("persistence")))]
        lines.append("\t".join(str(f) for f in fields))
    for g in spec.get("gpus", []):  # MIG instances, devices of their own, after every card
        for slot, mig in enumerate(g.get("mig", [])):
            lines.append("\t".join(str(f) for f in ("mig", g["index"], mig["uuid"],
                                                      f"{g['name']} MIG {mig['profile']}",
                                                      mig["memory_total_mb"], slot)))
    return "\n".join(lines) + "\n"


def install(node_dir: Path, spec: dict) -> bool:
    """Give an NVIDIA node its NVML (``lib/libnvidia-ml.so.1`` and ``nvml.tsv``) unless its
    spec says ``"nvml": false``; ``"nvml": "old"`` gives it an old driver's. Returns whether
    it has one."""
    wanted = spec.get("nvml", True)
    built = None
    if spec.get("gpus") and wanted is not False:
        built = build("old" if wanted == "old" else "current")
    if built is not None:
        (node_dir / "nvml.tsv").write_text(gpu_table(spec))
    return shims.link(built, node_dir, LIBRARY)
