"""What the head knows of each GPU vendor, one row each, as the node side's backends are one
row each in ``node/registry.py``: the variables that show a job its cards, how a container
is given them, whether the warm-up wakes them, and the tool a new node's smoke test runs.

The launcher (``launcher.visible_devices``), the container lines (``containers``) and the
smoke test (``head/smoke.py``) read this table; none of them names a vendor. A vendor more
is a row more here (and a backend on the node side).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..model import DEFAULT_VENDOR


@dataclass(frozen=True)
class Visibility:
    """A variable that names the cards a job may use, in allocation order."""

    name: str
    prefix: str = ""  # written before the list: oneAPI's "level_zero:"
    #: on the node: "node" (the node's own numbers, or a MIG instance's UUID), "order"
    #: (0…k-1: the numbers a runtime gives the cards another variable left it)
    outside: str = "node"
    #: inside a container that holds only the job's cards: "uuid" (the cards' UUIDs),
    #: "order" (0…k-1), None (kept as the node numbers them)
    inside: str | None = "order"


@dataclass(frozen=True)
class Vendor:
    name: str
    visibility: tuple[Visibility, ...]
    #: the smoke test's command: what a person would type to see the cards
    smoke: tuple[str, ...]
    #: how podman/docker get each card: "cdi" (``nvidia.com/gpu=UUID``, docker's
    #: ``--gpus``), "render" (its render node, by its PCI address), "davinci" (``/dev/davinciN``)
    card_device: str
    #: set, empty, for a job with none of its cards, so it never grabs the node's — unless
    #: the job has cards of a vendor whose runtime reads them too (``reads``)
    hides_when_absent: bool = False
    #: other vendors' variables its runtime obeys as well (HIP reads CUDA_VISIBLE_DEVICES)
    reads: tuple[str, ...] = ()
    #: device nodes a container with any of its cards gets, with their group, before the
    #: cards (ROCm's /dev/kfd), and without, after them (Ascend's managers)
    shared_devices: tuple[str, ...] = ()
    manager_devices: tuple[str, ...] = ()
    #: the driver's files a container needs, bound read-only where they exist
    driver_mounts: tuple[str, ...] = ()
    #: apptainer/singularity's flag that binds its devices and libraries
    apptainer_flag: str | None = None
    #: the warm-up (R27) wakes its cards through libcuda
    warms_up: bool = False


#: Every vendor, in the order their variables and container flags are written.
VENDORS = (
    Vendor("nvidia", (Visibility("CUDA_VISIBLE_DEVICES", inside="uuid"),), ("nvidia-smi",), "cdi",
           hides_when_absent=True, apptainer_flag="--nv", warms_up=True),
    Vendor("amd", (Visibility("ROCR_VISIBLE_DEVICES"), Visibility("HIP_VISIBLE_DEVICES")), ("rocm-smi",),
           "render", reads=("CUDA_VISIBLE_DEVICES",), shared_devices=("/dev/kfd",), apptainer_flag="--rocm"),
    Vendor("intel", (Visibility("ZE_AFFINITY_MASK"),
                     # SYCL numbers the devices Level Zero reports, and ZE_AFFINITY_MASK
                     # has already left it only the job's: they are 0…k-1, on the node too
                     Visibility("ONEAPI_DEVICE_SELECTOR", prefix="level_zero:", outside="order")),
           ("xpu-smi", "discovery"), "render"),
    Vendor("ascend", (Visibility("ASCEND_RT_VISIBLE_DEVICES"),), ("npu-smi", "info"), "davinci",
           manager_devices=("/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc"),
           driver_mounts=("/usr/local/Ascend/driver", "/usr/local/dcmi", "/usr/local/bin/npu-smi",
                          "/etc/ascend_install.info")),
)
BY_NAME = {v.name: v for v in VENDORS}
#: the vendor of a card whose vendor is not said (``model.DEFAULT_VENDOR``)
DEFAULT = BY_NAME[DEFAULT_VENDOR]


def present(names) -> tuple[Vendor, ...]:
    """The vendors of ``names`` (cards' vendors), in the table's order."""
    names = set(names)
    return tuple(v for v in VENDORS if v.name in names)


def smoke_command(vendor: str | None) -> tuple[str, ...]:
    """The smoke test's command on a card of ``vendor``."""
    return BY_NAME.get(vendor, DEFAULT).smoke
