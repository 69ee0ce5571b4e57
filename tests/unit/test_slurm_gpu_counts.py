"""How many GPUs a Slurm job holds and a partition has free, read as the pool reads them,
against a real Slurm 22.05's answers (tests/data/slurm/gpus/SOURCES.md: jobs asked with
``--gres=gpu:2``, ``--gpus-per-node``, ``--gpus``, a shard, in a second partition, and one
waiting). ``squeue %b`` is the request per node (N/A for ``--gpus``, SkyPilot#10283); the
allocation's TRES is what the job holds; a partition's free GPUs are counted per partition
as ``sinfo -O partition,gres,gresused`` counts them (SkyPilot#10317)."""

from __future__ import annotations

from pathlib import Path

from nebula_tui.config.pools import PoolConfig
from nebula_tui.pools import slurm_parse as parse
from nebula_tui.pools.slurm import capacity_of
from nebula_tui.pools.status import pool_view
from nebula_tui.screens import render
from support.head import sinfo_partitions

DATA = Path(__file__).parents[1] / "data" / "slurm" / "gpus"


def read(name: str) -> str:
    return (DATA / name).read_text()


def by_token(jobs) -> dict:
    return {job.comment.removeprefix("nebula-token-"): job for job in jobs}


def accounted() -> dict:
    """Each job's AllocTRES as the cluster's accounting holds it (by token)."""
    listed = by_token(parse.parse_squeue_json(read("squeue.json")))
    ids = {job.slurm_id: token for token, job in listed.items()}
    return {ids[i]: job.gpus for i, job in parse.parse_sacct(read("sacct.txt")).items()}


def test_a_jobs_gpus_are_its_allocation_however_it_asked():
    """--gpus read N/A in %b and --gpus-per-node one node's share: the pool's squeue reads
    the allocation, the same as the accounting's AllocTRES, in JSON and in text."""
    truth = accounted()
    assert truth["gpus"] == 3 and truth["per-node"] == 2 and truth["gres"] == 2
    for jobs in (parse.parse_squeue_json(read("squeue.json")),
                 parse.parse_squeue_text(read("squeue.txt"))):
        jobs = by_token(jobs)
        assert set(jobs) == set(truth)
        for token, job in jobs.items():
            assert job.gpus == truth[token], (token, job.gpus, truth[token])
    # why not %b: the request per node, N/A for --gpus
    asked = {line.split("|")[4].removeprefix("nebula-token-"): line.split("|")[2]
             for line in read("squeue_b.txt").splitlines()}
    assert asked["gpus"] == "N/A" and parse.gres_gpus(asked["per-node"]) == 1


def test_a_shard_job_and_a_waiting_one_hold_no_gpus():
    """A shard is no whole GPU (its TRES names none) and a waiting job holds nothing yet
    (squeue -O tres-alloc gives its request: 16)."""
    for jobs in (parse.parse_squeue_json(read("squeue.json")),
                 parse.parse_squeue_text(read("squeue.txt"))):
        jobs = by_token(jobs)
        assert jobs["shard"].gpus is None and jobs["pending"].gpus is None
        assert jobs["pending"].waiting and jobs["pending"].reason == "Resources"
    assert "gres/gpu=16" in next(line for line in read("squeue.txt").splitlines()
                                 if "nebula-token-pending" in line)


def test_free_gpus_per_partition_as_sinfo_counts_them():
    """n1-n2 are in both partitions: `small` has none free while `gpu` has 8; one total for
    the cluster would say 8 free to a job sent to `small`."""
    truth = sinfo_partitions(read("sinfo_partitions.txt"))
    assert truth == {"gpu": (16, 8), "small": (8, 0)}
    version = parse.parse_version(read("sinfo_version.txt"))
    nodes = parse.parse_sinfo_text(read("sinfo.txt"))
    capacity = capacity_of(version, nodes, "", "sacct")
    assert {p.name: (p.gpus, p.idle) for p in capacity.partitions} == truth
    assert (capacity.gpus_total, capacity.gpus_idle) == (16, 8)  # each node once
    small = capacity_of(version, nodes, "small", "sacct")
    assert [(p.name, p.gpus, p.idle) for p in small.partitions] == [("small", 8, 0)]
    assert (small.gpus_total, small.gpus_idle) == (8, 0)
    capacity = capacity_of(version, parse.parse_sinfo_text(read("sinfo.txt")), "", "sacct")
    config = PoolConfig(name="hpc", kind="slurm", host="login", user="ann", identity=None,
                        known_hosts="~/.ssh/known_hosts")
    view = pool_view(config, "slurm", capacity, None, "", 0, 0, 0.0)
    assert "16 GPUs, 8 idle (gpu 8 of 16 idle, small 0 of 8 idle)" in view["line"]
    assert view["partitions"] == [{"name": "gpu", "gpus": 16, "gpus_idle": 8},
                                  {"name": "small", "gpus": 8, "gpus_idle": 0}]
    # the TUI's pool card draws the head's view: each partition's free GPUs on a line
    card = render.pool_card({**view, "reachable": True, "max_jobs": 50}).plain
    assert "8/16 idle" in card and "\n gpu 8/16 idle, small 0/8 idle\n" in card


def test_gres_with_no_type_name_still_counts():
    """22.05 writes an untyped GRES in use as ``shard:(null):1(IDX:3)``: the "(null)" is no
    count (a greedy cut of the parentheses lost the number)."""
    assert parse.gres_gpus("gpu:(null):4(IDX:0-3),shard:(null):1(IDX:3)") == 4
    assert parse.gres_gpus("gpu:4,shard:(null):1(IDX:3)") == 4
