"""Cards that lie or vanish, as the node reads them: a card the driver lost (nvidia-smi's
"Unable to determine the device handle … Unknown Error", a card gone from its list, NVML's
GPU-is-lost) and fields written as ERR! — each a reading with ``lost`` set and its values
missing, never zeros. The head's side (isolation, resume) is in ``test_health_e2e.py``."""

from __future__ import annotations

from nebula_tui.remote.backends import nvidia_smi
from nebula_tui.remote.probes import vendor_nvidia
from nebula_tui.remote.readings import gpu_reading

FIELDS = ("index", "uuid", "name", "pci.bus_id", "memory.total", "memory.used",
          "utilization.gpu", "temperature.gpu", "power.draw", "fan.speed")
ROW0 = "0, GPU-aaaa, NVIDIA GeForce RTX 4090, 00000000:01:00.0, 24564, 100, 3, 40, 20.5, 30"
ROW1 = "1, GPU-bbbb, NVIDIA GeForce RTX 4090, 00000000:02:00.0, 24564, 100, 3, 41, 21.5, 31"


def test_err_fields_are_missing_values_and_make_the_card_lost():
    row = "1, GPU-bbbb, NVIDIA GeForce RTX 4090, 00000000:02:00.0, 24564, 100, ERR!, ERR!, ERR!, ERR!"
    readings, _ = nvidia_smi.parse_query_gpu_lines([ROW0, row], FIELDS)
    bad = readings[1]
    assert (bad["utilization_pct"], bad["temperature_c"], bad["power_w"], bad["fan_pct"]) == \
        (None, None, None, None)
    assert bad["err_fields"] == ["utilization.gpu", "temperature.gpu", "power.draw", "fan.speed"]
    assert gpu_reading(bad).lost == ("nvidia-smi shows ERR! for utilization.gpu, temperature.gpu, "
                                     "power.draw, fan.speed")
    assert gpu_reading(readings[0]).lost is None and readings[0]["err_fields"] is None


def test_the_lost_lines_name_the_whole_pci_address():
    lines = ["Unable to determine the device handle for GPU0000:02:00.0: Unknown Error",
             "Unable to determine the device handle for GPU 00000000:03:00.0: GPU is lost"]
    assert nvidia_smi.lost_devices(lines) == [("0000:02:00.0", "Unknown Error"),
                                              ("00000000:03:00.0", "GPU is lost")]
    _, warnings = nvidia_smi.parse_query_gpu_lines([ROW0, *lines], FIELDS)
    assert warnings[0] == "GPU 0000:02:00.0 could not be read: Unknown Error"


class _Smi(vendor_nvidia.NvidiaSmiBackend):
    """The real backend with the tool's output given (the rest is the backend's own)."""

    def __init__(self, fields):
        super().__init__()
        self.fields = list(fields)
        self.out = ""

    def _query(self):
        return self.out


def test_a_card_the_tool_lost_or_no_longer_lists_is_reported_lost(tmp_path, monkeypatch):
    monkeypatch.setattr(vendor_nvidia, "PCI_DEVICES", str(tmp_path))
    (tmp_path / "0000:02:00.0").mkdir()  # the kernel still lists the second card
    smi = _Smi(FIELDS)
    smi.out = f"{ROW0}\n{ROW1}\n"
    assert [r.get("lost") for r in smi.status()] == [None, None]

    smi.out = f"{ROW0}\nUnable to determine the device handle for GPU0000:02:00.0: Unknown Error\n"
    lost = smi.status()[1]
    assert (lost["uuid"], lost["index"], lost["lost"]) == ("GPU-bbbb", 1, "nvidia-smi: Unknown Error")
    assert lost["temperature_c"] is None and lost["memory_used_mb"] is None

    smi.out = f"{ROW0}\n"  # gone from its list without a word, still on the bus
    assert smi.status()[1]["lost"] == "still on the PCI bus, but nvidia-smi no longer shows it"
    (tmp_path / "0000:02:00.0").rmdir()
    assert smi.status()[1]["lost"] == "gone from the PCI bus (nvidia-smi no longer shows it)"

    smi.out = f"{ROW0}\n{ROW1}\n"  # back
    assert [r.get("lost") for r in smi.status()] == [None, None]
