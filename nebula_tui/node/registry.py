"""Every backend the nodelet knows, as (name, vendor, detector, loader), preferred first for
each vendor (see hardware.py for what a backend does). A detector is a cheap look — is the
library or the tool on this node? — and the loader makes the backend.

Travels to the nodes with the nodelet: stdlib only, Python 3.6 syntax, no annotations.
"""

from . import vendor_amd, vendor_ascend, vendor_intel, vendor_nvidia
from .hardware import on_path

REGISTRY = (
    ("nvml", "nvidia", vendor_nvidia.nvml_detected, vendor_nvidia.NvmlBackend),
    ("nvidia-smi", "nvidia", on_path("nvidia-smi"), vendor_nvidia.NvidiaSmiBackend),
    ("amd-smi", "amd", on_path("amd-smi"), vendor_amd.AmdSmiBackend),
    ("rocm-smi", "amd", on_path("rocm-smi"), vendor_amd.RocmSmiBackend),
    ("xpu-smi", "intel", on_path("xpu-smi"), vendor_intel.XpuSmiBackend),
    ("npu-smi", "ascend", on_path("npu-smi"), vendor_ascend.NpuSmiBackend),
)
