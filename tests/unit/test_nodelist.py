"""-w/--nodelist and -x/--exclude: Slurm's hostlist expanded, and the scheduler keeping a
job on the nodes it named (never on the ones it excluded), snapshot in, decisions out."""

from __future__ import annotations

import pytest

from nebula_tui.scheduler import Start, Wait
from nebula_tui.scheduler.admission import refusal
from nebula_tui.scheduler.filters import expand_hostlist

from support.scheduling import card, job, run


@pytest.mark.parametrize("text, names", [
    ("a,b", ("a", "b")),
    ("node[01-03]", ("node01", "node02", "node03")),
    ("gpu[1-2,7],cpu", ("gpu1", "gpu2", "gpu7", "cpu")),
    ("n[8-10]x", ("n8x", "n9x", "n10x")),
    ("a,a", ("a",)),
])
def test_hostlist_expands_as_slurm(text, names):
    assert expand_hostlist(text) == names


@pytest.mark.parametrize("text", ["", "a[", "a]", "a[3-1]", "a[x]", "a,,b", "a b", "n[0-99999]"])
def test_hostlist_refuses_what_is_no_hostlist(text):
    with pytest.raises(ValueError, match="--nodelist"):
        expand_hostlist(text)


def cluster():
    return [card("n1", 0), card("n2", 0), card("n3", 0)]


def test_nodelist_keeps_the_job_on_the_named_node():
    got = run(cluster(), [job(1, nodelist=("n3",))])
    assert isinstance(got[1], Start) and {p.node for p in got[1].placements} == {"n3"}


def test_exclude_keeps_the_job_off_the_excluded_nodes():
    got = run(cluster(), [job(1, exclude=("n1", "n2"))])
    assert isinstance(got[1], Start) and {p.node for p in got[1].placements} == {"n3"}


def test_a_job_whose_named_node_is_busy_waits_though_others_are_free():
    busy = [card("n1", 0), card("n2", 0), card("n3", 0, blocked="draining")]
    got = run(busy, [job(1, nodelist=("n3",))])
    assert isinstance(got[1], Wait)
    assert "(on n3)" in got[1].reason and "held by -w/-x alone" in got[1].reason, got[1].reason
    got = run(busy, [job(2, exclude=("n1", "n2"))])
    assert "not on n1,n2" in got[2].reason and "held by -w/-x alone" in got[2].reason, got[2].reason


def test_a_job_whose_nodes_are_as_busy_as_the_rest_is_not_said_to_be_held_by_them():
    busy = [card("n1", 0, blocked="draining"), card("n2", 0, blocked="draining"),
            card("n3", 0, blocked="draining")]
    got = run(busy, [job(1, nodelist=("n3",))])
    assert isinstance(got[1], Wait) and "-w/-x" not in got[1].reason, got[1].reason


def test_two_cards_on_one_named_node_are_not_taken_across_nodes():
    got = run(cluster(), [job(1, count=2, max_nodes=2, nodelist=("n1", "n2"))])
    assert isinstance(got[1], Start) and {p.node for p in got[1].placements} == {"n1", "n2"}
    got = run(cluster(), [job(2, count=3, max_nodes=3, exclude=("n2",))])
    assert not isinstance(got[2], Start)


def test_refused_at_submit_when_the_choice_leaves_no_card():
    assert "-w/-x" in refusal(job(1, nodelist=("n1",), exclude=("n1",)), cluster())
    assert refusal(job(1, count=2, nodelist=("n1",)), cluster()) is not None
    assert refusal(job(1, nodelist=("n1",)), cluster()) is None
