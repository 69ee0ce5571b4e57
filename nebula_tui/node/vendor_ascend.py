"""Huawei Ascend's backend: ``npu-smi info`` every probe, each chip a device. Jobs get
``ASCEND_RT_VISIBLE_DEVICES`` (the chip's logical id). Travels to the nodes with the
nodelet: stdlib only, Python 3.6 syntax.
"""

from .backends import ascend
from .hardware import OneRunBackend


class NpuSmiBackend(OneRunBackend):
    name = "npu-smi"
    vendor = "ascend"
    argv = ("npu-smi", "info")
    things = "NPU"

    def parse(self, out):
        return ascend.parse_npu_smi(out)
