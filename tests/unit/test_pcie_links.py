"""R9 with the PCIe link: a pair runs at its slower card's link, so a 4090 on x16 with a
laptop card on x8 scores as x8; AMD's XGMI ranks with an NVLink bridge. From the hello
(devices with their PCIe links, the links by node index) to the scheduler's ranks."""

from __future__ import annotations

from nebula_tui.remote.readings import hello_topology
from nebula_tui.scheduler.topology import best_set, link_rank, rank_table


def device(index: int, gen: int, width: int) -> dict:
    return {"index": index, "pcie_gen_max": gen, "pcie_width_max": width}


def test_a_narrower_or_older_link_ranks_lower_on_the_same_path_only():
    assert link_rank("PHB/g4x16") > link_rank("PHB/g4x8") > link_rank("PHB/g3x8") > link_rank("NODE")
    assert link_rank("PHB/g5x16") == link_rank("PHB")  # full width: the path's own rank
    assert link_rank("PIX/g1x1") > link_rank("PXB/g5x16")  # the path still comes first
    assert link_rank("SYS/g4x8") > link_rank(None)
    assert link_rank("XGMI") == link_rank("NV4") > link_rank("PIX")
    assert link_rank("NV12") > link_rank("XGMI")


def test_the_hello_marks_each_pcie_pair_with_its_slower_card():
    hello = {"links": {"GPU0": {"GPU1": "PHB", "GPU2": "SYS"}, "GPU1": {"GPU0": "PHB", "GPU2": "SYS"},
                       "GPU2": {"GPU0": "SYS", "GPU1": "SYS"}},
             "devices": [device(0, 4, 16), device(1, 4, 16), device(2, 4, 8)]}
    links = hello_topology(hello)["links"]
    assert links["GPU0"] == {"GPU1": "PHB/g4x16", "GPU2": "SYS/g4x8"}
    assert links["GPU2"]["GPU1"] == "SYS/g4x8"
    nvlink = hello_topology({"links": {"GPU0": {"GPU1": "NV4"}, "GPU1": {"GPU0": "NV4"}},
                             "devices": [device(0, 4, 16), device(1, 3, 8)]})
    assert nvlink["links"]["GPU0"]["GPU1"] == "NV4"  # NVLink does not go through the slot


def test_a_two_card_job_gets_the_x16_pair_when_a_card_is_on_x8():
    # Three cards behind one host bridge; the third sits in an x8 slot.
    same_path = {f"GPU{i}": {f"GPU{j}": "PHB" for j in range(3) if j != i} for i in range(3)}
    hello = {"links": same_path, "devices": [device(2, 4, 8), device(0, 4, 16), device(1, 4, 16)]}
    links = hello_topology(hello)["links"]
    assert best_set(links, 2) == ["GPU0", "GPU1"]
    ranks = rank_table(links)
    assert ranks[(0, 2)] == ranks[(1, 2)] == link_rank("PHB/g4x8") < ranks[(0, 1)]


def test_no_devices_or_no_widths_leave_the_codes_as_they_are():
    links = {"GPU0": {"GPU1": "PIX"}, "GPU1": {"GPU0": "PIX"}}
    assert hello_topology({"links": links})["links"] == links
    assert hello_topology({"links": links, "devices": [{"index": 0}, {"index": 1}]})["links"] == links
    assert hello_topology({}) is None
