"""``nebula parse KIND FILE`` run as users run it, on every real tool output we keep.

The samples are real outputs collected from public sources (``shared/samples/*/SOURCES.md``),
with their oddities: [N/A] fields, no header, trailing spaces, NIC columns, old legends.
"""

from __future__ import annotations

import functools
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from support.samples import SAMPLES

REPO = Path(__file__).resolve().parents[2]

def nebula_parse(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nebula_tui", "parse", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=60)


def csv_kind(path: Path) -> str:
    """Process lists (compute-apps) start with pid or gpu_uuid; GPU queries are the rest."""
    header = path.read_text(errors="replace").lstrip().split(",", 1)[0].strip().lower()
    return "smi-apps" if header in ("pid", "gpu_uuid") else "smi-csv"


def samples(folder: str) -> list[Path]:
    return sorted(p for p in (SAMPLES / folder).iterdir() if p.is_file() and p.suffix != ".md")


def vendor_kind(path: Path) -> str:
    """other_vendors/ files are named after their tool: amd_smi_…, rocm_smi_…, xpu_smi_…"""
    return path.name.split("_smi")[0] + "-smi"


CASES = ([pytest.param(csv_kind(p), p, id=f"smi_csv/{p.name}") for p in samples("smi_csv")]
         + [pytest.param("smi-plain", p, id=f"smi_plain/{p.name}") for p in samples("smi_plain")]
         # what nvidia-smi prints for a lost card: --query-gpu's reading reports it as a warning
         + [pytest.param("smi-csv", p, id=f"smi_lost/{p.name}") for p in samples("smi_lost")]
         + [pytest.param("smi-q", p, id=f"smi_q/{p.name}") for p in samples("smi_q")]
         + [pytest.param("smi-xml", p, id=f"smi_xml/{p.name}") for p in samples("smi_xml")]
         + [pytest.param(vendor_kind(p), p, id=f"other_vendors/{p.name}")
            for p in samples("other_vendors")]
         + [pytest.param("xid", p, id=f"xid/{p.name}") for p in samples("xid")]
         + [pytest.param("topo", p, id=f"topo/{p.name}") for p in samples("topo")])


@functools.cache
def _parse_once(kind: str, path: Path) -> subprocess.CompletedProcess:
    # One real CLI run per (kind, file): several tests read facts from the same output.
    return nebula_parse(kind, str(path))


def parsed(kind: str, path: Path):
    done = _parse_once(kind, path)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize(("kind", "path"), CASES)
def test_every_sample_parses(kind, path):
    result = parsed(kind, path)
    assert isinstance(result, list if kind == "xid" else dict)
    if kind == "smi-apps":
        assert isinstance(result["processes"], list)
    elif kind == "xid":
        assert result and all(isinstance(e["text"], str) for e in result)
    elif kind != "topo":
        assert isinstance(result["gpus"], list) and isinstance(result["processes"], list)
        # The same shape as smi-csv for every vendor: one reading per device, nothing lost.
        for gpu in result["gpus"]:
            assert {"index", "uuid", "name", "vendor", "pci_bus_id", "memory_total_mb",
                    "memory_used_mb", "utilization_pct", "visible_env"} <= set(gpu)


def test_there_are_samples_of_every_kind():
    kinds = [c.values[0] for c in CASES]
    assert {"smi-csv", "smi-apps", "smi-plain", "smi-q", "smi-xml", "amd-smi", "rocm-smi",
            "xpu-smi", "npu-smi", "xid", "topo"} <= set(kinds)
    covered = {c.values[1] for c in CASES}
    every = {p for folder in SAMPLES.iterdir() if folder.is_dir() for p in samples(folder.name)}
    assert every == covered, "a sample no kind reads"
    assert kinds.count("topo") >= 8


# ------------------------------------------------------------------ facts: topo
TOPO = {p.name: p for p in samples("topo")}


def gpu_rows(path: Path) -> list[str]:
    """The matrix rows named GPUn, counted by hand from the file.

    A row starts at the line's first character; the header line starts with blanks.
    """
    return re.findall(r"^(GPU\d+)\s", path.read_text(), flags=re.MULTILINE)


@pytest.mark.parametrize("name", sorted(TOPO))
def test_topo_gpus_match_the_rows_in_the_file(name):
    result = parsed("topo", TOPO[name])
    rows = gpu_rows(TOPO[name])
    assert result["gpus"] == rows
    assert sorted(result["links"]) == sorted(rows)
    for gpu, links in result["links"].items():
        assert set(links) == set(rows) - {gpu}  # every other GPU, never itself
        assert all(re.fullmatch(r"NV\d+|PIX|PXB|PHB|NODE|SYS|SOC", v) for v in links.values()), links


@pytest.mark.parametrize(("name", "count"), [
    ("rtx3090_2gpu_nv4_bridge.txt", 2), ("h100nvl_8gpu_nv12_pairs_2nic.txt", 8),
    ("k80_4gpu_pix_pairs_mlx4_old_soc_legend.txt", 4), ("power9_v100_1gpu_4mlx5_traverse.txt", 1),
    ("dgx1_v100_8gpu_mlx5_oneflow.txt", 8), ("rtx4090_8gpu_pcie_sys_4nic_nps4.txt", 8),
    ("a10_4gpu_sys_2nic.txt", 4), ("gtx1080ti_2gpu_phb_numa_na.txt", 2),
])
def test_topo_gpu_counts(name, count):
    assert len(parsed("topo", TOPO[name])["gpus"]) == count


@pytest.mark.parametrize(("name", "a", "b", "link"), [
    ("rtx3090_2gpu_nv4_bridge.txt", "GPU0", "GPU1", "NV4"),
    ("rtx3090_2gpu_nv4_bridge.txt", "GPU1", "GPU0", "NV4"),
    ("h100nvl_8gpu_nv12_pairs_2nic.txt", "GPU0", "GPU1", "NV12"),
    ("h100nvl_8gpu_nv12_pairs_2nic.txt", "GPU0", "GPU4", "SYS"),
    ("h100nvl_8gpu_nv12_pairs_2nic.txt", "GPU0", "GPU2", "NODE"),
    ("h100nvl_8gpu_nv12_pairs_2nic.txt", "GPU6", "GPU7", "NV12"),
    ("k80_4gpu_pix_pairs_mlx4_old_soc_legend.txt", "GPU0", "GPU1", "PIX"),
    ("k80_4gpu_pix_pairs_mlx4_old_soc_legend.txt", "GPU0", "GPU2", "PHB"),
])
def test_topo_links(name, a, b, link):
    assert parsed("topo", TOPO[name])["links"][a][b] == link


@pytest.mark.parametrize("name", sorted(TOPO))
def test_topo_nic_columns_never_appear_as_gpus(name):
    result = parsed("topo", TOPO[name])
    named = set(result["gpus"]) | set(result["links"])
    named |= {peer for links in result["links"].values() for peer in links}
    assert all(re.fullmatch(r"GPU\d+", n) for n in named), named


def test_single_gpu_topo_has_no_links():
    result = parsed("topo", TOPO["power9_v100_1gpu_4mlx5_traverse.txt"])
    assert result == {"gpus": ["GPU0"], "links": {"GPU0": {}}}


# ------------------------------------------------------------------ facts: nvidia-smi
def test_h200_csv_has_eight_gpus_with_memory():
    path = SAMPLES / "smi_csv" / "h200_8gpu_index_name_memtotal_driver_powerlimit_pstate.csv"
    gpus = parsed("smi-csv", path)["gpus"]
    assert [g["index"] for g in gpus] == list(range(8))
    assert {(g["name"], g["memory_total_mb"], g["driver_version"]) for g in gpus} == {
        ("NVIDIA H200", 143771, "570.211.01")}


def test_na_fields_are_null_not_lost():
    path = SAMPLES / "smi_csv" / "gb10_dgx_spark_mem_na_power_temp.csv"
    (gpu,) = parsed("smi-csv", path)["gpus"]
    assert gpu["memory_total_mb"] is None and gpu["memory_used_mb"] is None
    assert gpu["power_w"] == pytest.approx(11.17)
    assert gpu["temperature_c"] == 35


def test_header_only_apps_is_no_processes():
    path = SAMPLES / "smi_csv" / "rtxpro6000_compute_apps_header_only_no_procs.csv"
    assert parsed("smi-apps", path)["processes"] == []


def test_apps_rows_keep_uuid_and_memory():
    path = SAMPLES / "smi_csv" / "h200class_compute_apps_gpu_uuid_not_found.csv"
    first = parsed("smi-apps", path)["processes"][0]
    assert first == {"gpu_uuid": "GPU-a44622e3-2296-6285-0a86-84d0f6c67900", "pid": 1328667,
                     "name": "/usr/local/bin/python3.10", "used_memory_mb": 130004}


@pytest.mark.parametrize(("name", "gpus"), [
    ("a100_sxm4_40gb_535_mig_enabled_one_mig_device.txt", 1),
    ("h100_sxm_8gpu_550_no_procs_no_trailing_newline.txt", 8),
    ("rtx3090_2gpu_560_vllm_processes.txt", 2),
])
def test_smi_plain_gpu_counts(name, gpus):
    assert len(parsed("smi-plain", SAMPLES / "smi_plain" / name)["gpus"]) == gpus


# ------------------------------------------------------------------ errors
def test_unknown_kind_is_a_usage_error_naming_the_kinds():
    done = nebula_parse("smi-yaml", str(TOPO["rtx3090_2gpu_nv4_bridge.txt"]))
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "smi-yaml" in lines[0]
    for kind in ("smi-csv", "smi-apps", "smi-plain", "smi-q", "smi-xml", "amd-smi", "rocm-smi",
                 "xpu-smi", "npu-smi", "topo", "xid"):
        assert kind in lines[0]


def test_missing_file_is_a_usage_error_in_one_line(tmp_path):
    missing = tmp_path / "nope.csv"
    done = nebula_parse("smi-csv", str(missing))
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and str(missing) in lines[0]
    assert "Traceback" not in done.stderr


def test_stdin_dash(tmp_path):
    text = TOPO["rtx3090_2gpu_nv4_bridge.txt"].read_text()
    done = subprocess.run([sys.executable, "-m", "nebula_tui", "parse", "topo", "-"], cwd=REPO,
                          input=text, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["links"]["GPU0"]["GPU1"] == "NV4"


# ------------------------------------------------------------------ input bounds
def test_a_file_past_the_bound_is_one_line_without_reading_it(tmp_path):
    big = tmp_path / "loop.csv"
    with open(big, "wb") as handle:
        handle.truncate(300 * 1024 * 1024)  # sparse: no disk, no time
    done = nebula_parse("smi-csv", str(big))
    assert done.returncode == 1 and done.stdout == ""
    (line,) = done.stderr.strip().splitlines()
    assert str(big) in line and "256 MiB" in line and "Traceback" not in done.stderr


def test_stdin_past_the_bound_is_one_line():
    done = subprocess.run([sys.executable, "-m", "nebula_tui", "parse", "smi-q", "-"], cwd=REPO,
                          input=b"x" * (17 * 1024 * 1024), capture_output=True, timeout=60)
    assert done.returncode == 1
    (line,) = done.stderr.decode().strip().splitlines()
    assert "the input is larger than 16 MiB" in line


def test_a_long_loop_is_read_in_constant_memory(tmp_path):
    """A 10 MB -l loop of 8 GPUs: one reading per GPU, and the process grows no more than a
    few MB past what one sample costs (it read the whole file into lists before: 5.8 GB
    for 300 MB, so about 200 MB for this one)."""
    header = "timestamp, index, uuid, utilization.gpu [%], memory.used [MiB]\n"
    sample = "".join(f"2024/01/16 14:44:16.977, {i}, GPU-{i}, 50 %, 1234 MiB\n" for i in range(8))
    # The child's own peak: a forked child's high-water mark starts at its parent's (pytest),
    # so it is reset first (clear_refs 5) and read from VmHWM after.
    probe = ("import runpy, sys; sys.argv = ['nebula', 'parse', 'smi-csv', sys.argv[1]]\n"
             "open('/proc/self/clear_refs', 'w').write('5')\n"
             "try:\n    runpy.run_module('nebula_tui', run_name='__main__')\n"
             "except SystemExit:\n    pass\n"
             "hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM')][0]\n"
             "print(hwm.split()[1], file=sys.stderr)")

    def peak_mb(samples: int) -> float:
        path = tmp_path / f"loop{samples}.csv"
        with open(path, "w") as handle:
            handle.write(header + sample * samples)
        done = subprocess.run([sys.executable, "-c", probe, str(path)], cwd=REPO,
                              capture_output=True, text=True, timeout=240)
        assert len(json.loads(done.stdout)["gpus"]) == 8
        return int(done.stderr.strip().splitlines()[-1]) / 1024

    one, many = peak_mb(1), peak_mb(10 * 1024 * 1024 // len(sample))
    assert many - one < 20, f"peak {many:.0f} MB for a 10 MB file, {one:.0f} MB for one sample"
