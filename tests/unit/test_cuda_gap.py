"""A card newer than the node's CUDA (an RTX 5070 Laptop, sm_120, on a CUDA 11.8 node): the
head says why on the card and the node's page, with what to install."""

from __future__ import annotations

import pytest

from nebula_tui.cli import text
from nebula_tui.scheduler.filters import cuda_gap


@pytest.mark.parametrize("cc, cuda, needs", [
    ("12.0", "11.8", "sm_120 needs CUDA 12.8 or newer, and this node's driver serves CUDA 11.8: "
                     "install an NVIDIA driver of the 570 series or newer"),
    ("12.0", "12.6", "sm_120 needs CUDA 12.8 or newer, and this node's driver serves CUDA 12.6"),
    ("8.9", "11.4", "sm_89 needs CUDA 11.8 or newer"),
    ("9.0", "11.7", "520 series"),
])
def test_a_card_the_nodes_cuda_cannot_serve_says_what_to_install(cc, cuda, needs):
    assert needs in cuda_gap(cc, cuda)


@pytest.mark.parametrize("cc, cuda", [("12.0", "12.8"), ("8.9", "12.4"), ("8.0", "11.0"),
                                      (None, "11.8"), ("12.0", None), ("gfx90a", "6.0"),
                                      ("5.2", "8.0")])  # unknown to the table: no guess
def test_no_gap_where_the_cuda_serves_it_or_nothing_is_known(cc, cuda):
    assert cuda_gap(cc, cuda) is None


def test_the_nodes_page_names_the_card_and_the_fix():
    gpu = {"node": "lap02", "index": 0, "model": "NVIDIA GeForce RTX 5070 Laptop GPU",
           "memory_used_mb": 0, "total_memory_mb": 8151, "utilization_pct": 0, "temperature_c": 40,
           "power_w": 5, "status": "idle", "jobs": [], "cuda_gap": cuda_gap("12.0", "11.8")}
    page = text.node_text({"name": "lap02", "host": "h", "port": 22, "state": "up",
                            "health_score": 1.0, "cuda_version": "11.8", "detail": "",
                            "gpus": [gpu], "jobs": [], "events": []})
    assert "lap02:0 (RTX 5070 Laptop): sm_120 needs CUDA 12.8 or newer" in page
    assert "570 series" in page
