"""Container jobs on the simulated lab: its NVIDIA cards as CDI devices that podman passes.

A real node's driver ships a CDI spec (``nvidia-ctk cdi generate``) naming each card by UUID
(``nvidia.com/gpu=GPU-…``), so ``podman run --device nvidia.com/gpu=UUID`` puts exactly that
card's device node in the container. The lab does the same with stand-in device nodes:
``/run/nebula-sim/dev/nvidia<N>`` (character devices 195:N, the NVIDIA driver's numbers; no
driver answers them) appear in the container as ``/dev/nvidia<N>``, so a test sees which
cards a job was given. Several labs share a machine and podman reads one CDI registry, where
two files naming the same device conflict: every lab merges its cards into the one spec
file, under a lock. A card's entry is a function of its UUID (which fixes its index), so
two labs never disagree about it.

Only as root, and only where podman exists; elsewhere container tests skip.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import stat
from pathlib import Path

DEV_DIR = Path("/run/nebula-sim/dev")
CDI_SPEC = Path("/var/run/cdi/nebula-sim.json")
NVIDIA_MAJOR = 195
CONTROL_MINOR = 255  # /dev/nvidiactl
#: Variables of the node's environment every container gets: fake_smi finds a job's
#: processes (and their memory) on this node by them, as it does for plain jobs.
PASSENV = "NEBULA_SIM_DIR:NEBULA_SIM_NODE"


def available() -> bool:
    return os.getuid() == 0 and shutil.which("podman") is not None


def _device_node(minor: int, name: str) -> str:
    path = DEV_DIR / name
    try:
        st = path.stat()
        if stat.S_ISCHR(st.st_mode) and os.major(st.st_rdev) == NVIDIA_MAJOR \
                and os.minor(st.st_rdev) == minor:
            return str(path)
        path.unlink()
    except FileNotFoundError:
        pass
    os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(NVIDIA_MAJOR, minor))
    path.chmod(0o666)
    return str(path)


def register(gpus: list[dict]) -> None:
    """Add these cards (``uuid`` and ``index`` each) to the shared CDI spec."""
    DEV_DIR.mkdir(parents=True, exist_ok=True)
    CDI_SPEC.parent.mkdir(parents=True, exist_ok=True)
    control = _device_node(CONTROL_MINOR, "nvidiactl")
    with open(DEV_DIR.parent / "cdi.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            spec = json.loads(CDI_SPEC.read_text())
        except (OSError, ValueError):
            spec = {}
        devices = {d["name"]: d for d in spec.get("devices", [])}
        for gpu in gpus:
            index = int(gpu["index"])
            devices[gpu["uuid"]] = {"name": gpu["uuid"], "containerEdits": {"deviceNodes": [
                {"path": f"/dev/nvidia{index}", "hostPath": _device_node(index, f"nvidia{index}")}]}}
        spec = {"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu",
                "devices": sorted(devices.values(), key=lambda d: d["name"]),
                "containerEdits": {"deviceNodes": [{"path": "/dev/nvidiactl", "hostPath": control}]}}
        tmp = CDI_SPEC.with_suffix(".tmp")
        tmp.write_text(json.dumps(spec, indent=1) + "\n")
        tmp.rename(CDI_SPEC)
