"""AMD's backends: ``amd-smi`` (its default view), falling back to ``rocm-smi --json``.

Jobs get ``ROCR_VISIBLE_DEVICES`` and ``HIP_VISIBLE_DEVICES`` (the launcher sets both);
the link matrix comes from ``rocm-smi --showtopo --json`` where rocm-smi is installed
(XGMI links, else the PCIe path by hop count). Travels to the nodes with the nodelet:
stdlib only, Python 3.6 syntax.
"""

from .backends import amd
from .hardware import OneRunBackend, links_from

#: What rocm-smi is asked each probe: ids, memory, use, temperature, power, clocks, fan, pids.
ROCM_SMI_ARGV = ("rocm-smi", "--showid", "--showuniqueid", "--showbus", "--showproductname",
                 "--showmeminfo", "vram", "--showuse", "--showtemp", "--showpower",
                 "--showmaxpower", "--showclocks", "--showfan", "--showpids", "--json")


def _links():
    return links_from(["rocm-smi", "--showtopo", "--json"],
                      lambda out: amd.parse_rocm_smi_json(out)[2]["links"])


class AmdSmiBackend(OneRunBackend):
    name = "amd-smi"
    vendor = "amd"
    argv = ("amd-smi",)

    def parse(self, out):
        return amd.parse_amd_smi(out)

    def facts(self):
        return dict(OneRunBackend.facts(self), links=_links())


class RocmSmiBackend(OneRunBackend):
    name = "rocm-smi"
    vendor = "amd"
    argv = ROCM_SMI_ARGV
    things = "card"

    def parse(self, out):
        return amd.parse_rocm_smi_json(out)

    def facts(self):
        return dict(OneRunBackend.facts(self), links=_links())
