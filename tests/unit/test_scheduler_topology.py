"""R9 on real ``nvidia-smi topo -m`` outputs: every sample parses to the right GPU×GPU
matrix, and ``best_set`` picks the cards the checked-in table (tests/data/topo_best.json)
derives by hand for each machine."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from support.samples import SAMPLES as SHARED_SAMPLES
from nebula_tui.node.backends.topo import parse_topo
from nebula_tui.scheduler.topology import best_set, link_rank

_HERE = Path(__file__).resolve()
SAMPLES = SHARED_SAMPLES / "topo"
TABLE = json.loads((_HERE.parents[1] / "data" / "topo_best.json").read_text())
FILES = sorted(p.name for p in SAMPLES.glob("*.txt"))
_CODE = re.compile(r"(?<!\S)(X|NV\d+|SYS|SOC|NODE|PHB|PXB|PIX)(?!\S)")


def test_every_sample_is_in_the_table():
    assert FILES and set(FILES) == {k for k in TABLE if not k.startswith("_")}


def _raw_rows(text: str) -> dict[str, list[str]]:
    """An independent reading: GPU rows by regex, their codes in column order."""
    rows = {}
    for line in text.splitlines():
        match = re.match(r"^(GPU\d+)\s", line)
        if match:
            rows[match.group(1)] = _CODE.findall(line[match.end():])
    return rows


@pytest.mark.parametrize("name", FILES)
def test_sample_parses_to_the_gpu_matrix(name):
    text = (SAMPLES / name).read_text()
    topo = parse_topo(text)
    expected = TABLE[name]
    n = expected["gpus"]
    assert topo["gpus"] == [f"GPU{i}" for i in range(n)]
    assert set(topo["links"]) == set(topo["gpus"])
    raw = _raw_rows(text)
    assert len(raw) == n
    for i, gpu in enumerate(topo["gpus"]):
        codes = raw[gpu][:n]  # GPU columns come first; NIC columns follow
        assert codes[i] == "X"
        assert topo["links"][gpu] == {f"GPU{j}": c for j, c in enumerate(codes) if j != i}
        for peer, code in topo["links"][gpu].items():
            assert topo["links"][peer][gpu] == code  # symmetric
            assert link_rank(code) > 0  # every code is one we rank
    for gpu, peers in expected["links"].items():
        for peer, code in peers.items():
            assert topo["links"][gpu][peer] == code


@pytest.mark.parametrize("name", FILES)
def test_best_sets_match_the_table(name):
    topo = parse_topo((SAMPLES / name).read_text())
    for k, best in TABLE[name]["best"].items():
        assert best_set(topo["links"], int(k), topo["gpus"]) == best, (name, k)


def test_best_set_refuses_more_than_the_machine_has():
    topo = parse_topo((SAMPLES / "rtx3090_2gpu_nv4_bridge.txt").read_text())
    with pytest.raises(ValueError, match="has 2 GPUs"):
        best_set(topo["links"], 3)
    assert best_set(topo["links"], 2) == ["GPU0", "GPU1"]  # gpus default to those the links name
