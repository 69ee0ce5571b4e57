"""Every vendor tool's real output (tests/data/samples, copied from shared/samples) parses to the facts in the file.

The expected values were read off the files by hand (see each sample's SOURCES.md); the
parsers yield the vendor-neutral reading the nodes send, so the same facts reach the head.
"""

from __future__ import annotations

import pytest

from nebula_tui.remote.documents import parse_text
from support.samples import SAMPLES

OTHER = SAMPLES / "other_vendors"


def parse(kind: str, path) -> dict:
    return parse_text(kind, path.read_text())


def test_amd_smi_mi300x():
    doc = parse("amd-smi", OTHER / "amd_smi_mi300x_baremetal.txt")
    (gpu,) = doc["gpus"]
    assert (gpu["vendor"], gpu["name"], gpu["pci_bus_id"]) == ("amd", "AMD Instinct MI300X", "0000:a6:00.0")
    assert (gpu["memory_used_mb"], gpu["memory_total_mb"]) == (283, 196592)
    assert (gpu["temperature_c"], gpu["power_w"], gpu["power_limit_w"]) == (46, 129, 750)
    assert gpu["utilization_pct"] == 0 and gpu["fan_pct"] is None  # "N/A" fan
    assert gpu["ecc_uncorrected"] == 0 and gpu["compute_cap"] == "gfx942"
    assert (gpu["visible_env"], gpu["visible_id"]) == ("ROCR_VISIBLE_DEVICES", "0")  # HIP-ID
    assert gpu["uuid"] and doc["processes"] == []
    assert (doc["amd_smi_version"], doc["driver_version"], doc["rocm_version"]) == (
        "26.2.0+021c61fc", "6.16.6", "7.1.1")


def test_rocm_smi_concise_mi210():
    doc = parse("rocm-smi", OTHER / "rocm_smi_concise_4x_mi210_leading_blank_lines.txt")
    gpus = doc["gpus"]
    assert [g["index"] for g in gpus] == [0, 1, 2, 3]
    assert [g["temperature_c"] for g in gpus] == [33, 38, 34, 38]
    assert [g["power_w"] for g in gpus] == [42, 40, 42, 41]
    assert {(g["power_limit_w"], g["sm_clock_mhz"], g["mem_clock_mhz"], g["compute_cap"])
            for g in gpus} == {(300, 800, 1600, "gfx90a")}  # 0x740f is an MI210
    assert {(g["utilization_pct"], g["fan_pct"]) for g in gpus} == {(0, 0)}
    assert all(g["memory_total_mb"] is None for g in gpus)  # the concise table has only VRAM%


def test_rocm_smi_json_mi100():
    doc = parse("rocm-smi", OTHER / "rocm_smi_json_4x_mi100_rocm602_telegraf.json")
    gpus = doc["gpus"]
    assert [g["pci_bus_id"] for g in gpus] == ["0000:83:00.0", "0000:A3:00.0", "0000:C3:00.0",
                                               "0000:E3:00.0"]
    assert gpus[0]["uuid"] == "AMD-0000:83:00.0"  # as amd-smi's view would name it
    assert gpus[0]["unique_id"] == "0x79ccd55167a2124a"
    assert len({g["uuid"] for g in gpus}) == 4
    assert {g["name"] for g in gpus} == {"AMD Instinct MI100"}
    assert {(g["memory_total_mb"], g["memory_used_mb"]) for g in gpus} == {
        (34342961152 // 2**20, 6750208 // 2**20)}
    assert [g["temperature_c"] for g in gpus] == [53, 55, 54, 51]
    assert [g["power_w"] for g in gpus] == [36, 44, 43, 39]
    assert {(g["power_limit_w"], g["pcie_gen"], g["pcie_width"], g["sm_clock_mhz"],
             g["mem_clock_mhz"], g["max_sm_clock_mhz"], g["compute_cap"]) for g in gpus} == {
        (290, 4, 16, 300, 1200, 1502, "gfx908")}
    assert doc["driver_version"] == "6.3.6"
    # The system block: every pair is PCIE with 2 hops (through the CPU).
    assert doc["links"]["GPU0"] == {"GPU1": "PHB", "GPU2": "PHB", "GPU3": "PHB"}
    assert set(doc["links"]) == {"GPU0", "GPU1", "GPU2", "GPU3"}


def test_xpu_smi_discovery_arc_a770():
    doc = parse("xpu-smi", OTHER / "xpu_smi_discovery_arc_a770.txt")
    (gpu,) = doc["gpus"]
    assert (gpu["index"], gpu["vendor"], gpu["name"]) == (0, "intel", "Intel(R) Arc(TM) A770 Graphics")
    assert gpu["uuid"] == "00000000-0000-0003-0000-000856a08086"
    assert gpu["pci_bus_id"] == "0000:03:00.0"
    assert (gpu["visible_env"], gpu["visible_id"]) == ("ZE_AFFINITY_MASK", "0")


def test_xpu_smi_stats_flex170_empty_cells_are_missing():
    doc = parse("xpu-smi", OTHER / "xpu_smi_stats_d0_flex170_empty_fields.txt")
    (gpu,) = doc["gpus"]
    assert (gpu["index"], gpu["utilization_pct"], gpu["power_w"], gpu["sm_clock_mhz"],
            gpu["temperature_c"], gpu["memory_used_mb"]) == (0, 0, 44, 2050, 40, 26)
    assert gpu["ecc_uncorrected"] is None and gpu["ecc_corrected"] is None  # blank cells


def test_npu_smi_two_910b2c_with_a_process_and_trailing_spaces():
    doc = parse("npu-smi", OTHER / "npu_smi_info_2x_910b2c_with_process_trailing_space.txt")
    gpus = doc["gpus"]
    assert [(g["pci_bus_id"], g["power_w"], g["temperature_c"], g["memory_used_mb"],
             g["memory_total_mb"], g["health"]) for g in gpus] == [
        ("0000:5A:00.0", 88.6, 51, 20701, 65536, "OK"), ("0000:19:00.0", 99.6, 50, 20687, 65536, "OK")]
    assert {g["name"] for g in gpus} == {"Ascend 910B2C"}
    assert [g["visible_id"] for g in gpus] == ["0", "1"]
    assert {g["visible_env"] for g in gpus} == {"ASCEND_RT_VISIBLE_DEVICES"}
    assert doc["processes"] == [{"gpu_uuid": gpus[0]["uuid"], "pid": 124528, "name": "python3.8",
                                 "used_memory_mb": 17400}]
    assert doc["npu_smi_version"] == "23.0.2.1"


def test_npu_smi_eight_910b2_no_processes():
    doc = parse("npu-smi", OTHER / "npu_smi_info_8x_910b2_no_procs.txt")
    gpus = doc["gpus"]
    assert [g["pci_bus_id"][5:7] for g in gpus] == ["C1", "01", "C2", "02", "81", "41", "82", "42"]
    assert [g["memory_used_mb"] for g in gpus] == [29954, 29951, 29950, 29951, 3347, 3350, 3347, 3347]
    assert [g["power_w"] for g in gpus] == [96.5, 98.7, 94.2, 91.5, 96.6, 96.0, 97.5, 93.8]
    assert len({g["uuid"] for g in gpus}) == 8
    assert doc["processes"] == []


def test_smi_q_a10_remapped_rows_pending():
    doc = parse("smi-q", SAMPLES / "smi_q" / "a10_535_q_remapped_rows_pending.txt")
    (gpu,) = doc["gpus"]
    assert gpu["uuid"] == "GPU-73d12ef7-f589-f867-4259-c7090ab44736"
    assert (gpu["name"], gpu["pci_bus_id"]) == ("NVIDIA A10", "00000000:07:00.0")
    assert (gpu["memory_total_mb"], gpu["memory_used_mb"], gpu["utilization_pct"]) == (23028, 4, 0)
    assert (gpu["temperature_c"], gpu["power_w"], gpu["power_limit_w"], gpu["fan_pct"]) == (
        33, 43.89, 150, 0)
    assert (gpu["sm_clock_mhz"], gpu["mem_clock_mhz"], gpu["base_sm_clock_mhz"],
            gpu["max_sm_clock_mhz"], gpu["max_mem_clock_mhz"]) == (225, 405, 1695, 1695, 6251)
    assert (gpu["pcie_gen"], gpu["pcie_width"], gpu["pcie_gen_max"], gpu["pcie_width_max"]) == (
        4, 16, 4, 16)
    assert (gpu["remapped_rows_correctable"], gpu["remapped_rows_uncorrectable"],
            gpu["remapped_rows_pending"], gpu["remapped_rows_failure"]) == (0, 4, True, False)
    assert gpu["ecc_uncorrected"] == 0 and gpu["pstate"] == "P8"
    assert gpu["throttle_reasons"] == ["gpu_idle"]
    assert (doc["driver_version"], doc["cuda_version"]) == ("535.129.03", "12.2")
    assert doc["processes"] == []  # "Processes : None"


def test_smi_q_processes_blocks():
    text = (SAMPLES / "smi_q" / "a10_535_q_remapped_rows_pending.txt").read_text().replace(
        "    Processes                             : None",
        "    Processes\n"
        "        GPU instance ID                   : N/A\n"
        "        Compute instance ID               : N/A\n"
        "        Process ID                        : 4242\n"
        "            Type                          : C\n"
        "            Name                          : python3\n"
        "            Used GPU Memory               : 1234 MiB\n")
    assert parse_text("smi-q", text)["processes"] == [
        {"gpu_uuid": "GPU-73d12ef7-f589-f867-4259-c7090ab44736", "pid": 4242, "name": "python3",
         "used_memory_mb": 1234}]


def test_smi_xml_a100_with_four_mig_instances():
    doc = parse("smi-xml", SAMPLES / "smi_xml" / "a100_sxm4_80gb_mig_enabled_4x1g_v12.xml")
    (gpu,) = doc["gpus"]  # attached_gpus says 4, the contributor kept one <gpu>
    assert doc["attached_gpus"] == 4
    assert gpu["uuid"] == "GPU-513536b6-7d19-9063-b049-1e69664bb298"
    assert (gpu["memory_total_mb"], gpu["memory_used_mb"]) == (81920, 50)
    assert gpu["utilization_pct"] is None  # N/A under MIG
    assert (gpu["temperature_c"], gpu["power_w"], gpu["power_limit_w"]) == (27, 67.03, 500)
    assert (gpu["sm_clock_mhz"], gpu["base_sm_clock_mhz"], gpu["max_sm_clock_mhz"]) == (1275, 1275, 1410)
    assert (gpu["pcie_gen_max"], gpu["pcie_width_max"], gpu["mig_mode"]) == (4, 16, "Enabled")
    assert gpu["fan_pct"] is None and gpu["throttle_reasons"] == []
    migs = doc["mig_devices"]
    assert [(m["memory_total_mb"], m["memory_used_mb"], m["sm_count"]) for m in migs] == [
        (19968, 12, 14)] * 4
    assert [m["gpu_instance"] for m in migs] == [3, 4, 5, 6]
    assert {m["parent_uuid"] for m in migs} == {gpu["uuid"]}
    assert (doc["driver_version"], doc["cuda_version"]) == ("535.54.03", "12.2")


def test_smi_xml_garbage_is_one_error():
    with pytest.raises(ValueError, match="not nvidia-smi XML"):
        parse_text("smi-xml", "<html><body>502 Bad Gateway</body></html>")


def test_plain_line_with_one_odd_cell_keeps_the_rest():
    # GB10 (unified memory) prints "Not Supported" where the memory cell would be.
    text = (SAMPLES / "smi_plain" / "rtx3090_2gpu_560_vllm_processes.txt").read_text().replace(
        "   22943MiB /  24576MiB |      0%      Default |",
        "      Not Supported     |      0%      Default |", 1)
    first, second = parse_text("smi-plain", text)["gpus"]
    assert first["memory_used_mb"] is None and first["memory_total_mb"] is None
    assert (first["temperature_c"], first["power_w"], first["power_limit_w"], first["pstate"],
            first["utilization_pct"], first["fan_pct"]) == (24, 33, 350, "P8", 0, 0)
    assert second["memory_used_mb"] == 22943


def test_plain_power_cap_na_and_fan_na():
    text = (SAMPLES / "smi_plain" / "h100_sxm_8gpu_550_no_procs_no_trailing_newline.txt").read_text()
    gpus = parse_text("smi-plain", text)["gpus"]
    assert len(gpus) == 8
    assert {(g["fan_pct"], g["power_limit_w"], g["memory_total_mb"]) for g in gpus} == {(None, 700, 81559)}
    assert gpus[0]["power_w"] == 72 and gpus[0]["temperature_c"] == 27


def test_headerless_csv_with_a_given_field_list():
    # The post did not give its 27 fields; these are the ones its values fit.
    fields = ["timestamp", "index", "name", "uuid", "a", "b", "c", "memory.total", "memory.free",
              "memory.used", "d", "e", "utilization.gpu", "temperature.gpu", "compute_mode"] + [
        f"x{i}" for i in range(5)] + ["pstate"] + [f"y{i}" for i in range(6)]
    text = (SAMPLES / "smi_csv" / "rtx3080_noheader_many_na_zabbix.csv").read_text()
    (gpu,) = parse_text("smi-csv", text, fields)["gpus"]
    assert (gpu["index"], gpu["name"], gpu["uuid"]) == (
        0, "NVIDIA GeForce RTX 3080", "GPU-8fe3a97d-51f6-a669-0d80-b4530b81b816")
    assert (gpu["memory_total_mb"], gpu["memory_used_mb"], gpu["temperature_c"], gpu["pstate"]) == (
        10240, 1211, 54, "P3")
    unmapped = parse_text("smi-csv", text)
    assert unmapped["gpus"] == [] and "--fields" in unmapped["warnings"][0]


def test_impossible_values_are_clamped_with_a_warning():
    text = "index, uuid, name, utilization.gpu [%], memory.total [MiB], memory.used [MiB]\n" \
           "0, GPU-1, Card, 200 %, 1000 MiB, 1200 MiB\n"
    doc = parse_text("smi-csv", text)
    (gpu,) = doc["gpus"]
    assert gpu["utilization_pct"] == 100 and gpu["memory_used_mb"] == 1000
    assert len(doc["warnings"]) == 2 and "200" in doc["warnings"][1] + doc["warnings"][0]


def test_a_rocm_process_named_with_commas_keeps_its_own_card_and_memory():
    """rocm-smi --showpids prints "name, card, VRAM bytes, SDMA, CU" unquoted: a job named
    "x, 0, 25769803776" once put 24 GB of its own on card 0, which it never held."""
    import json

    document = json.loads((OTHER / "rocm_smi_json_4x_mi100_rocm602_telegraf.json").read_text())
    document.setdefault("system", {})["PID4242"] = "x, 0, 25769803776, 2, 1048576, 0, 0"
    parsed = parse_text("rocm-smi", json.dumps(document))
    (process,) = parsed["processes"]
    assert (process["pid"], process["name"], process["used_memory_mb"]) == (4242, "x, 0, 25769803776", 1)
    assert process["gpu_uuid"] == next(g["uuid"] for g in parsed["gpus"] if g["index"] == 2)


# ------------------------------------------------------------------ process names as data
# A tool prints a process's argv[0] (the process's own to set) unquoted: a line break in it
# starts rows of its own, a made-up process on another job's pid that the memory guard
# would kill. A table whose structure a name broke is believed not at all.

NPU_WITH_PROCESS = OTHER / "npu_smi_info_2x_910b2c_with_process_trailing_space.txt"
# (GPU, PID, name, GTT, VRAM, MEM, CU %) as amd-smi's process box prints them
AMD_ROW = "| %4d %10d  %-20s %8s %9s %10s %8s |"


def npu_row(npu: int, chip: int, pid: int, name: str, mb: int) -> str:
    """A process row as npu-smi 23 prints it: the sample's columns and trailing space."""
    return "| %s| %s| %s| %s| " % (("%-8s%s" % (npu, chip)).ljust(26), str(pid).ljust(14),
                                   name.ljust(25), str(mb).ljust(24))


def with_npu_row(row: str) -> str:
    text = NPU_WITH_PROCESS.read_text()
    real = npu_row(0, 0, 124528, "python3.8", 17400)
    assert real in text  # the format is the sample's own
    return text.replace(real, row)


def amd_smi_with_processes(*rows: tuple) -> str:
    """The MI300X sample with the process box amd-smi prints below it."""
    rule = "+" + "-" * 78 + "+"
    box = ["", rule, "| " + "Processes:".ljust(77) + "|",
           "|  GPU        PID  Process Name          GTT_MEM  VRAM_MEM  MEM_USAGE     CU % |",
           "|" + "=" * 78 + "|"] + [AMD_ROW % row for row in rows] + [rule]
    return (OTHER / "amd_smi_mi300x_baremetal.txt").read_text() + "\n".join(box) + "\n"


def xpu_ps(*rows: tuple) -> str:
    """``xpu-smi ps``: (pid, command, device, SHR KiB, MEM KiB) rows."""
    lines = ["%-10s%-20s%-15s%-12s%s" % ("PID", "Command", "DeviceID", "SHR", "MEM")]
    return "\n".join(lines + ["%-10d%-20s%-15d%-12d%d" % row for row in rows]) + "\n"


@pytest.mark.parametrize("name", [
    "x\n| 1       0                 | 4242          | python3.8                | 24576 |",  # a row of its own
    "x\n| 1 0 | 4242 | p | 24576 | 0",  # one with a cell too many
    "x\nhello",  # a line no row at all
    "x | 7",  # a cell too many in its own row
])
def test_npu_smi_a_name_that_breaks_the_table_makes_its_process_list_unreadable(name):
    doc = parse_text("npu-smi", with_npu_row(npu_row(0, 0, 124528, name, 17400)))
    assert doc["processes"] == []
    assert "npu-smi's process list is unreadable: line " in doc["processes_unreadable"]
    assert len(doc["gpus"]) == 2  # the readings stay
    assert "processes_unreadable" not in parse("npu-smi", NPU_WITH_PROCESS)


@pytest.mark.parametrize("row", [npu_row(0, 0, 124528, "p", "1e5"), npu_row(0, 0, "١٢٣", "p", 5),
                                 npu_row(7, 0, 124528, "p", 5), npu_row(0, 0, 0, "p", 5)])
def test_npu_smi_a_row_whose_numbers_are_not_strictly_numbers_is_not_believed(row):
    """Memory as a float, a pid in other digits, a chip not listed, pid 0."""
    assert parse_text("npu-smi", with_npu_row(row))["processes"] == []


def test_amd_smi_process_rows_are_read_for_their_numbers_and_a_forged_one_breaks_the_list():
    uuid = parse("amd-smi", OTHER / "amd_smi_mi300x_baremetal.txt")["gpus"][0]["uuid"]
    good = parse_text("amd-smi", amd_smi_with_processes((0, 4242, "python3 train.py", "0.0 B", "6.0 GB",
                                                         "6.0 GB", "12.0 %")))
    assert good["processes"] == [{"gpu_uuid": uuid, "pid": 4242, "name": "python3 train.py",
                                  "used_memory_mb": 6144}]
    forged = "x\n" + AMD_ROW % (0, 77, "python3", "0.0 B", "24.0 GB", "24.0 GB", "0.0 %")
    broken = parse_text("amd-smi", amd_smi_with_processes((0, 4242, forged, "0.0 B", "6.0 GB", "6.0 GB", "1.0 %")))
    assert broken["processes"] == [] and "amd-smi's process list is unreadable" in broken["processes_unreadable"]
    assert broken["gpus"] == good["gpus"]
    unknown_card = parse_text("amd-smi", amd_smi_with_processes((3, 4242, "p", "0.0 B", "6.0 GB", "6.0 GB", "1.0 %")))
    assert unknown_card["processes"] == [] and unknown_card["processes_unreadable"]
    after_the_box = amd_smi_with_processes((0, 4242, "p", "0.0 B", "6.0 GB", "6.0 GB", "1.0 %")) + "| 0 77 |\n"
    assert parse_text("amd-smi", after_the_box)["processes"] == []


def test_xpu_smi_ps_reads_from_both_ends_and_a_forged_line_breaks_the_list():
    from nebula_tui.node.backends import intel

    found, why = intel.parse_ps(xpu_ps((4242, "python 3 2 1", 0, 0, 6291456)), {0})
    assert why is None and [(p["pid"], p["device"], p["used_memory_mb"]) for p in found] == [(4242, 0, 6144)]
    for name in ("x\nnonsense", "x\n77 python"):  # a line no row, and a row too short
        found, why = intel.parse_ps(xpu_ps((4242, name, 0, 0, 6291456)), {0})
        assert found == [] and "xpu-smi ps's process list is unreadable: line 2" in why
    found, why = intel.parse_ps(xpu_ps((4242, "p", 5, 0, 6291456)), {0})  # no device 5 here
    assert found == [] and why


def test_a_forgery_every_line_of_which_parses_is_caught_by_the_forgers_own_name(tmp_path):
    """A name can make each line a well-formed row (its own with 1 MiB, another's pid with
    its memory on another chip); the node names every listed process from /proc, and one
    whose own name holds a line break or a column bar makes the whole list unreadable."""
    import subprocess

    from nebula_tui.node.hardware import vouched

    victim = subprocess.Popen(["sleep", "30"])
    forger_name = ("x" + " " * 24 + "| 1" + " " * 22 + "|\n| 1       0                 | %d"
                   % victim.pid + " " * 8 + "| python3.8")
    forger = subprocess.Popen(["bash", "-c", 'exec -a "$0" sleep 30', forger_name])
    try:
        import time
        time.sleep(0.3)  # the exec done
        doc = parse_text("npu-smi", with_npu_row(npu_row(0, 0, forger.pid, forger_name, 17400)))
        assert sorted(p["pid"] for p in doc["processes"]) == sorted([forger.pid, victim.pid])  # it parses
        kept, why = vouched(doc["processes"], "npu-smi")
        assert kept == [] and f"process {forger.pid}'s name holds a line break" in why
        honest = [p for p in doc["processes"] if p["pid"] == victim.pid] + [
            dict(doc["processes"][0], pid=2**22 + 7)]  # no such process: dropped
        kept, why = vouched(honest, "npu-smi")
        assert why is None and [(p["pid"], p["name"]) for p in kept] == [(victim.pid, "sleep")]
    finally:
        for child in (victim, forger):
            child.kill()
            child.wait()
