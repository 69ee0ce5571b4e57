"""The simulator's vendor tools print what the real ones print.

Each view of nebula_tui/sim/fake_vendors.py is given the values a real sample in
tests/data/samples/other_vendors shows and must render that sample's text byte for byte;
the one sample that is not compared whole says what is left out and why. ``rocm-smi
--json`` has no view (its values are the simulator's own), so its keys are compared.
"""

from __future__ import annotations

import json

from nebula_tui.node.backends import reading
from nebula_tui.sim import fake_smi, presets
from nebula_tui.sim import fake_vendors as fv
from support.samples import SAMPLES

OTHER = SAMPLES / "other_vendors"


def sample(name: str) -> str:
    return (OTHER / name).read_text(encoding="utf-8")  # "°C" in the AMD ones


def test_amd_smi_default_view_matches_the_mi300x_sample():
    versions = {"amd_smi": "26.2.0+021c61fc", "amdgpu": "6.16.6", "rocm": "7.1.1",
                "vbios": "00114328", "platform": "Linux Baremetal"}
    gpu = {"bdf": "0000:a6:00.0", "name": "AMD Instinct MI300X", "gpu": 0, "hip": 0, "oam": 2,
           "partition": "SPX/NPS1", "mem_util": "0 %", "temp": "46 °C", "uec": "0", "power": "129",
           "cap": "750", "gfx_util": "0 %", "fan": "N/A", "used_mb": 283, "total_mb": 196592}
    # processes=None: the sample ends with the GPU box (amd-smi printed no process box).
    assert fv.amd_smi_view(versions, [gpu], None) == sample("amd_smi_mi300x_baremetal.txt")


def test_rocm_smi_concise_view_matches_the_4x_mi210_sample_leading_blank_lines_included():
    shared = {"did": "0x740f", "sclk": "800Mhz", "mclk": "1600Mhz", "fan": "0%", "perf": "auto",
              "cap": "300.0W", "vram": "0%", "use": "0%"}
    rows = [dict(shared, device=device, node=node, guid=guid, temp=temp, power=power)
            for device, node, guid, temp, power in [
                (0, 4, "12261", "33.0°C", "42.0W"), (1, 5, "13566", "38.0°C", "40.0W"),
                (2, 3, "57300", "34.0°C", "42.0W"), (3, 2, "1997", "38.0°C", "41.0W")]]
    assert fv.rocm_concise_view(rows) == sample("rocm_smi_concise_4x_mi210_leading_blank_lines.txt")


def test_xpu_smi_discovery_view_matches_the_arc_a770_sample():
    info = ["Device Name: Intel(R) Arc(TM) A770 Graphics", "Vendor Name: Intel(R) Corporation",
            "SOC UUID: 00000000-0000-0003-0000-000856a08086", "PCI BDF Address: 0000:03:00.0",
            "DRM Device: /dev/dri/card0", "Function Type: physical"]
    assert fv.xpu_discovery_view([(0, info)]) == sample("xpu_smi_discovery_arc_a770.txt")


def boxes(text: str) -> list[list[tuple[str, str]]]:
    """The (key, value) rows of each box of an xpu-smi table, read with the parsers' own
    cell reader (a value may be empty)."""
    found: list[list[tuple[str, str]]] = [[]]
    for line in text.splitlines():
        cells = reading.box_cells(line)
        if line.startswith("+"):
            found.append([])
        elif cells is not None:
            found[-1].append(tuple(cells))
    return [box for box in found if box]


def test_xpu_smi_stats_view_matches_the_flex170_sample_empty_cells_and_final_blank_line_included():
    real = sample("xpu_smi_stats_d0_flex170_empty_fields.txt")
    assert fv.xpu_stats_view(boxes(real)) == real


def npus(name: str, rows: list[tuple[str, str, str, int]]) -> list[dict]:
    """npu_smi_view's NPUs from (power, temp, bus, HBM used) rows; the rest is the same on
    every NPU of both samples: ids from 0, chip 0, OK, AICore 0, 65536 MB of HBM."""
    return [{"npu": number, "name": name, "health": "OK", "power": power, "temp": temp, "chip": 0,
             "bus": bus, "aicore": "0", "hbm_used": used, "hbm_total": 65536}
            for number, (power, temp, bus, used) in enumerate(rows)]


def test_npu_smi_info_view_matches_the_8x_910b2_sample_without_processes():
    eight = npus("910B2", [
        ("96.5", "36", "0000:C1:00.0", 29954), ("98.7", "37", "0000:01:00.0", 29951),
        ("94.2", "35", "0000:C2:00.0", 29950), ("91.5", "38", "0000:02:00.0", 29951),
        ("96.6", "36", "0000:81:00.0", 3347), ("96.0", "39", "0000:41:00.0", 3350),
        ("97.5", "35", "0000:82:00.0", 3347), ("93.8", "37", "0000:42:00.0", 3347)])
    assert fv.npu_smi_view("23.0.7", eight, {}) == sample("npu_smi_info_8x_910b2_no_procs.txt")


def test_npu_smi_info_view_matches_the_2x_910b2c_sample_up_to_where_its_capture_stops():
    # Two things in this capture (nputop's test fixture) are not npu-smi's to copy:
    # - every line ends with one space (SOURCES.md: "as captured"): it is removed;
    # - it stops after NPU 0's process row under a "-" rule, with no row for the idle NPU 1.
    #   The other captures (the 8x sample here; nputop's 24.1 and 25.2 fixtures beside this
    #   one) close each NPU's rows with a "=" rule and give an idle NPU its "No running
    #   processes found" row, as the view does. That last line is left out; every line
    #   before it, the process row included, must be the view's, to the byte.
    captured = sample("npu_smi_info_2x_910b2c_with_process_trailing_space.txt").splitlines(keepends=True)
    assert all(line.endswith(" \n") for line in captured)
    *kept, cut = [line[:-2] + "\n" for line in captured]
    assert cut == fv.NPU_SPLIT + "\n"
    two = npus("910B2C", [("88.6", "51", "0000:5A:00.0", 20701), ("99.6", "50", "0000:19:00.0", 20687)])
    view = fv.npu_smi_view("23.0.2.1", two, {0: [{"pid": 124528, "name": "python3.8", "memory_mb": 17400}]})
    assert "".join(view.splitlines(keepends=True)[:len(kept)]) == "".join(kept)


def test_rocm_smi_json_writes_only_keys_the_real_tool_writes_and_in_its_order():
    # The values are the simulator's (clock levels, junction temperature...), not a
    # sample's; the keys are compared with the telegraf MI100 sample's (made with many
    # --show flags, so it has more keys than the fake writes).
    real = json.loads(sample("rocm_smi_json_4x_mi100_rocm602_telegraf.json"))
    node = presets.node_specs("demo")[5]  # node06: two MI210s joined by XGMI
    states = [fake_smi.gpu_state(device, [], {}) for device in node["devices"]]
    cards = json.loads(fv.rocm_smi(node, states, ["--json"]))
    topology = json.loads(fv.rocm_smi(node, states, ["--json", "--showtopo"]))
    assert set(cards) == {"card0", "card1", "system"}
    for card in (cards["card0"], cards["card1"]):
        assert list(card) == [key for key in real["card0"] if key in card]
    assert set(cards["system"]) | set(topology["system"]) <= set(real["system"])
