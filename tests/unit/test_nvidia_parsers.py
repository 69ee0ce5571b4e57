"""nvidia-smi parsers against real outputs captured on real machines (shared/samples)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.samples import SAMPLES

from nebula_tui.remote.backends.nvidia import (
    QUERY_GPU_FIELDS,
    ParseError,
    parse_plain_table,
    parse_query_apps,
    parse_query_gpu,
    query_apps_argv,
    query_gpu_argv,
)
from nebula_tui.node.backends.nvidia_smi import parse_query_gpu_lines
from nebula_tui.remote.documents import parse_text

CSV = SAMPLES / "smi_csv"
PLAIN = SAMPLES / "smi_plain"


def _is_apps(path: Path) -> bool:
    return path.read_text().split(",")[0].strip() in ("pid", "gpu_uuid")


CSV_FILES = sorted(CSV.glob("*.csv"))
PLAIN_FILES = sorted(PLAIN.glob("*.txt"))


@pytest.mark.parametrize("path", CSV_FILES, ids=lambda p: p.name)
def test_every_csv_sample_parses_to_json(path):
    kind = "smi-apps" if _is_apps(path) else "smi-csv"
    result = parse_text(kind, path.read_text())
    json.dumps(result)
    assert "warnings" in result


@pytest.mark.parametrize("path", PLAIN_FILES, ids=lambda p: p.name)
def test_every_plain_sample_parses_to_json(path):
    result = parse_text("smi-plain", path.read_text())
    json.dumps(result)
    assert result["gpus"]


def test_argv_asks_for_the_fields_without_header_or_units():
    assert query_gpu_argv() == ["nvidia-smi", "--query-gpu=" + ",".join(QUERY_GPU_FIELDS),
                                "--format=csv,noheader,nounits"]
    assert query_apps_argv()[1] == "--query-compute-apps=gpu_uuid,pid,process_name,used_gpu_memory"


def test_h200_eight_gpus_with_units_in_values():
    gpus = parse_query_gpu((CSV / "h200_8gpu_index_name_memtotal_driver_powerlimit_pstate.csv").read_text())
    assert [g.index for g in gpus] == list(range(8))
    assert {g.memory_total_mb for g in gpus} == {143771}
    assert gpus[0].name == "NVIDIA H200" and gpus[0].power_limit_w == 700.0
    assert gpus[0].driver_version == "570.211.01" and gpus[0].pstate == "P0"
    assert gpus[0].memory_used_mb is None and gpus[0].uuid == ""


def test_p100_fan_na_and_nounits_with_header():
    (gpu,) = parse_query_gpu((CSV / "tesla_p100_query_gpu_fan_na_no_trailing_newline.csv").read_text())
    assert gpu.name == "Tesla P100-PCIE-16GB"
    assert gpu.uuid == "GPU-ef1b2c9b-38d8-2090-2bd1-f567a3eb42a6"
    assert gpu.fan_pct is None
    assert gpu.power_w == 28.16 and gpu.temperature_c == 37
    assert gpu.sm_clock_mhz == 405 and gpu.mem_clock_mhz == 715  # clocks.current.* aliases


def test_gb10_memory_na_keeps_power_and_temperature():
    (gpu,) = parse_query_gpu((CSV / "gb10_dgx_spark_mem_na_power_temp.csv").read_text())
    assert gpu.memory_total_mb is None and gpu.memory_used_mb is None
    assert gpu.power_w == 11.17 and gpu.temperature_c == 35 and gpu.utilization_pct == 0


def test_lms_loop_is_one_reading_per_gpu_the_latest_sample_kept():
    # Four A10s (the post's machine): rows 1-4 are one sample, 4-5 ms apart; row 5, 105 ms
    # later, is GPU 0 again (21 MiB used, 25 C, as in row 1) in the next sample.
    gpus = parse_query_gpu((CSV / "a10_lms_loop_timestamp_pstate_mem.csv").read_text())
    assert [g.index for g in gpus] == [0, 1, 2, 3]
    assert [g.memory_used_mb for g in gpus] == [21, 7, 7, 7]
    assert [g.temperature_c for g in gpus] == [25, 24, 23, 26]
    assert {g.memory_total_mb for g in gpus} == {23028}
    assert gpus[0].pstate == "P8" and gpus[0].utilization_pct == 0


def test_loop_grouped_by_uuid_keeps_the_last_row_of_each_gpu():
    header = "timestamp, index, uuid, memory.used [MiB]\n"
    rows = ["2024/01/16 14:44:1%d.000, %d, GPU-%d, %d MiB\n" % (second, gpu, gpu, 100 * second + gpu)
            for second in range(3) for gpu in range(2)]
    gpus = parse_query_gpu(header + "".join(rows) + header + rows[0])
    assert [(g.uuid, g.memory_used_mb) for g in gpus] == [("GPU-0", 0), ("GPU-1", 201)]


def test_noheader_with_unknown_layout_raises_but_document_parser_warns():
    text = (CSV / "rtx3080_noheader_many_na_zabbix.csv").read_text()
    with pytest.raises(ParseError, match="27 values but 16 fields"):
        parse_query_gpu(text)
    result = parse_text("smi-csv", text)
    assert result["gpus"] == [] and len(result["rows"]) == 1
    assert result["rows"][0][2] == "NVIDIA GeForce RTX 3080" and result["rows"][0][4] is None
    assert result["warnings"]


def test_noheader_with_given_fields():
    text = "0, GPU-abc, NVIDIA GeForce RTX 4090, [Not Supported], 24564\n"
    (gpu,) = parse_query_gpu(text, ["index", "uuid", "name", "fan.speed", "memory.total"])
    assert gpu.fan_pct is None and gpu.memory_total_mb == 24564 and gpu.uuid == "GPU-abc"


def test_each_bad_field_is_none_alone():
    fields = list(QUERY_GPU_FIELDS)
    row = ["1", "GPU-x", "Card", "00000000:01:00.0", "24564", "[Unknown Error]", "", "N/A",
           "garbage", "450.00", "[N/A]", "210", "405", "P8", "550.54.15", "8.9"]
    (gpu,) = parse_query_gpu(", ".join(row), fields)
    assert gpu.index == 1 and gpu.memory_total_mb == 24564
    assert gpu.memory_used_mb is None and gpu.utilization_pct is None
    assert gpu.temperature_c is None and gpu.power_w is None and gpu.fan_pct is None
    assert gpu.power_limit_w == 450.0 and gpu.compute_cap == "8.9"
    assert gpu.pci_bus_id == "00000000:01:00.0"


def test_lost_gpu_line_is_skipped():
    text = ("Unable to determine the device handle for GPU0000:01:00.0: Unknown Error\n"
            "1, GPU-y, Card\n")
    (gpu,) = parse_query_gpu(text, ["index", "uuid", "name"])
    assert gpu.index == 1


def test_a_lost_gpu_is_named_by_its_whole_pci_address():
    """It read "GPU 0000 could not be read: 04:00.0: Unknown Error" (split at the first colon)."""
    for line in ("Unable to determine the device handle for GPU0000:04:00.0: Unknown Error",
                 "Unable to determine the device handle for GPU 0000:04:00.0: Unknown Error"):
        _, warnings = parse_query_gpu_lines([line, "1, GPU-y, Card"], ["index", "uuid", "name"])
        assert warnings == ["GPU 0000:04:00.0 could not be read: Unknown Error"]


def test_apps_samples():
    vllm = parse_query_apps((CSV / "compute_apps_vllm_enginecore.csv").read_text())
    assert [(p.pid, p.name, p.used_memory_mb) for p in vllm] == [
        (3858903, "VLLM::EngineCore", 6265), (3880364, "VLLM::EngineCore", 5530)]
    assert vllm[0].gpu_uuid is None
    h200 = parse_query_apps((CSV / "h200class_compute_apps_gpu_uuid_not_found.csv").read_text())
    assert len(h200) == 8
    assert h200[-1].name is None and h200[-1].pid == 1758887 and h200[-1].used_memory_mb == 58060
    assert h200[0].gpu_uuid == "GPU-a44622e3-2296-6285-0a86-84d0f6c67900"
    assert parse_query_apps((CSV / "rtxpro6000_compute_apps_header_only_no_procs.csv").read_text()) == []
    assert parse_query_apps("") == []


def test_plain_h100_no_processes_no_trailing_newline():
    table = parse_plain_table((PLAIN / "h100_sxm_8gpu_550_no_procs_no_trailing_newline.txt").read_text())
    assert table["driver_version"] == "550.90.07" and table["cuda_version"] == "12.4"
    assert len(table["gpus"]) == 8 and table["processes"] == []
    last = table["gpus"][7]
    assert last["index"] == 7 and last["pci_bus_id"] == "00000000:DB:00.0"
    assert last["memory_total_mb"] == 81559 and last["power_limit_w"] == 700
    assert last["fan_pct"] is None and last["mig_mode"] == "Disabled"


def test_plain_mig_table():
    table = parse_plain_table((PLAIN / "a100_sxm4_40gb_535_mig_enabled_one_mig_device.txt").read_text())
    assert table["driver_version"] == "535.161.08" and table["cuda_version"] == "12.2"
    (gpu,) = table["gpus"]
    assert gpu["name"] == "NVIDIA A100-SXM4-40GB" and gpu["utilization_pct"] is None
    assert gpu["memory_used_mb"] == 75 and gpu["memory_total_mb"] == 40960
    assert table["mig_devices"] == [{"gpu": 0, "gpu_instance": 5, "compute_instance": 0,
                                     "mig_device": 0, "memory_used_mb": 25,
                                     "memory_total_mb": 9856, "sm_count": 28}]
    assert table["processes"] == []


def test_plain_processes():
    table = parse_plain_table((PLAIN / "rtx3090_2gpu_560_vllm_processes.txt").read_text())
    assert table["driver_version"] == "560.35.05" and table["cuda_version"] == "12.6"
    assert [g["temperature_c"] for g in table["gpus"]] == [24, 23]
    assert [g["memory_used_mb"] for g in table["gpus"]] == [22943, 22943]
    assert [(p["gpu"], p["pid"], p["name"], p["used_memory_mb"]) for p in table["processes"]] == [
        (0, 2921, "VLLM::Worker_TP0", 22934), (1, 2922, "VLLM::Worker_TP1", 22934)]
