"""Cards that lie or vanish, as the node reads them: a card the driver lost (nvidia-smi's
"Unable to determine the device handle … Unknown Error", a card gone from its list, NVML's
GPU-is-lost) and fields written as ERR! — each a reading with ``lost`` set and its values
missing, never zeros. The head's side (isolation, resume) is in ``test_health_e2e.py``."""

from __future__ import annotations

from nebula_tui.node.backends import nvidia_smi
from nebula_tui.node import vendor_nvidia
from nebula_tui.remote.readings import gpu_reading
from support.samples import SAMPLES

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


def test_the_2011_layout_of_driver_270_parses_to_its_gpu():
    """``nvidia-smi -q`` of driver 270.41.19 (Tesla M2090, 2011): bus id without domain
    width, ``Memory Usage`` in Mb, ``Temperature/Gpu``, ``Power State`` under the power
    readings. The temperature the card does not report is missing, not zero."""
    readings, processes, facts = nvidia_smi.parse_q(
        (SAMPLES / "smi_q" / "tesla_m2090_270_q_2011.txt").read_text())
    assert facts["driver_version"] == "270.41.19"
    (gpu,) = readings
    assert (gpu["name"], gpu["pci_bus_id"], gpu["memory_total_mb"], gpu["memory_used_mb"]) == \
        ("Tesla M2090", "0:2:0", 5375, 9)
    assert (gpu["pstate"], gpu["power_w"], gpu["power_limit_w"], gpu["sm_clock_mhz"]) == \
        ("P12", 31.57, 225.0, 100.0)
    assert gpu["temperature_c"] is None and gpu["fan_pct"] is None
    assert (gpu["ecc_uncorrected"], gpu["ecc_corrected"], gpu["err_fields"]) == (0, 0, None)
    assert gpu["uuid"].startswith("GPU-2b1486407f70") and processes == []


def test_err_in_a_q_report_is_a_missing_value_named_as_such():
    text = (SAMPLES / "smi_q" / "tesla_m2090_270_q_2011.txt").read_text() \
        .replace("Power Draw              : 31.57 W", "Power Draw              : ERR!") \
        .replace("Fan Speed                   : N/A", "Fan Speed                   : ERR!")
    (gpu,), _, _ = nvidia_smi.parse_q(text)
    assert gpu["power_w"] is None and gpu["fan_pct"] is None
    assert gpu["err_fields"] == ["Fan Speed", "Power Readings/Power Draw"]
    assert gpu_reading(gpu).lost == "nvidia-smi shows ERR! for Fan Speed, Power Readings/Power Draw"


def test_the_real_lost_card_outputs_name_their_card():
    """Real `nvidia-smi` outputs of a lost card (old and new spacing, the -a view): each
    names the card's whole PCI address and the driver's words."""
    found = {p.name: nvidia_smi.lost_devices(p.read_text().splitlines())
             for p in sorted((SAMPLES / "smi_lost").glob("*.txt"))}
    assert found == {
        "nvidia_smi_2015_space_after_gpu_unknown_error.txt": [("0000:0B:00.0", "Unknown Error")],
        "nvidia_smi_a_i0_unknown_error.txt": [("0000:09:00.0", "Unknown Error")],
        "tesla_p4_2024_unknown_error.txt": [("0000:07:00.0", "Unknown Error")],
    }


def test_every_view_of_nvidia_smi_warns_of_a_lost_card():
    """`nebula parse` of a lost card's output says it, whichever view it was taken from."""
    from nebula_tui.remote.documents import parse_text

    text = (SAMPLES / "smi_lost" / "nvidia_smi_a_i0_unknown_error.txt").read_text()
    for kind in ("smi-csv", "smi-plain", "smi-q"):
        assert parse_text(kind, text)["warnings"] == ["GPU 0000:09:00.0 could not be read: Unknown Error"], kind
