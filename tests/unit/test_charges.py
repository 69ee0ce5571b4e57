"""What a run is charged: GPU-hours only, nothing per job, and a slice by its gigabytes
against the reference card (24 GB) wherever it landed — the same figure in the quota,
fair share, ``nebula report``, Prometheus and the replay."""

from __future__ import annotations

import pytest
from support.inprocess import QuietNode, cluster_file, gpu_row, probe

from nebula_tui.config.cluster import load_config
from nebula_tui.head.engine import Engine
from nebula_tui.head.replay import Replay
from nebula_tui.model import JobSpec, JobState, NodeState, Placement
from nebula_tui.month import inventory, setup
from nebula_tui.month.records import Request
from nebula_tui.store import Store

GB = 1024
#: node01: two A100s of 80 GB; node02: two 4090s of 24 GB
CARDS = {"node01": 81920, "node02": 24564}


@pytest.fixture
async def mixed(tmp_path):
    """A real head (store file and all) on a lab of 80 GB and 24 GB cards, its clock ours."""
    clock = [1_800_000_000.0]
    cluster_file(tmp_path / "nodes.yaml", tuple(CARDS))
    head = Engine(load_config(tmp_path / "nodes.yaml"), Store(tmp_path / "state.db"), lambda: clock[0])
    for node, total in CARDS.items():
        head.links[node] = QuietNode()
        head.on_node_message(node, {"type": "hello", "hostname": node, "smi_table": "CUDA Version: 12.4"})
        head.on_node_message(node, probe(node, [{**gpu_row(node, i), "memory_total_mb": total}
                                                for i in range(2)]))
        head.on_node_state(node, NodeState.UP, "")
    yield head, clock
    await head.stop()
    head.state.store.close()


def run(head, user: str, placements: tuple[Placement, ...], mem: int | None = None) -> int:
    job = head.submit(user, JobSpec(command=("true",), gpu_mem_mb=mem, gpu_count=len(placements)))
    head.transitions.begin_launch(head.jobs[job.id], placements)
    head.transitions.mark_running(head.jobs[job.id])
    return job.id


async def test_a_slice_costs_the_same_on_an_a100_and_a_4090_in_every_figure(mixed):
    """An 8 GB slice for 3 hours is 1 GPU-hour (8 of the reference card's 24 GB) on an
    80 GB A100 and on a 24 GB 4090 alike — it was 0.3 and 1.0, so alice on the A100 paid a
    third of what bob paid for the same work. Held, ended, in the quota, the weight, the
    report and Prometheus: the same number."""
    head, clock = mixed
    alice = run(head, "alice", (Placement("GPU-node01-0", "node01", 0, 8 * GB, False),), 8 * GB)
    bob = run(head, "bob", (Placement("GPU-node02-0", "node02", 0, 8 * GB, False),), 8 * GB)
    began = clock[0]
    clock[0] += 3 * 3600
    held = {u: head.shares.standing(u)["held_gpu_hours"] for u in ("alice", "bob")}
    assert held == {"alice": pytest.approx(1.0, abs=1e-3), "bob": pytest.approx(1.0, abs=1e-3)}
    for job in (alice, bob):
        head.transitions.finish(head.jobs[job], JobState.SUCCEEDED, 0, "")
    clock[0] += 60
    store = head.state.store
    assert store.charged_hours([alice, bob]) == {alice: pytest.approx(1.0), bob: pytest.approx(1.0)}
    standing = {u: head.shares.standing(u) for u in ("alice", "bob")}
    for u in ("alice", "bob"):
        assert standing[u]["month_gpu_hours"] == pytest.approx(1.0)  # what the quota counts
        assert standing[u]["decayed_gpu_hours"] == pytest.approx(1.0, rel=1e-3)  # fair share's
    weights = head.shares.shares()
    assert weights["alice"].weight == pytest.approx(weights["bob"].weight)
    report = await head.accounting.report("alice", began - 60, clock[0])
    assert {r["user"]: r["gpu_hours"] for r in report["users"]} == {"alice": pytest.approx(1.0),
                                                                    "bob": pytest.approx(1.0)}
    metrics = {(f.name, s.labels.get("user")): s.value for f in head.metrics._user_families()
               for s in f.samples}
    for u in ("alice", "bob"):
        assert metrics[("nebula_user_gpu_hours", u)] == pytest.approx(1.0)
        assert metrics[("nebula_user_month_gpu_hours", u)] == pytest.approx(1.0)


async def test_a_sweep_of_short_jobs_weighs_what_one_job_of_the_same_hours_weighs(mixed):
    """Fair share counts GPU-hours only: carol's ten 6-minute jobs on a whole card and
    dave's one 1-hour job are 1 GPU-hour each, and weigh the same (the 0.1 per finished
    job made carol's sweep weigh as 50 GPU-hours more)."""
    head, clock = mixed
    card = (Placement("GPU-node01-1", "node01", 1, 81920, True),)
    for _ in range(10):
        job = run(head, "carol", card)
        clock[0] += 360
        head.transitions.finish(head.jobs[job], JobState.SUCCEEDED, 0, "")
    job = run(head, "dave", card)
    clock[0] += 3600
    head.transitions.finish(head.jobs[job], JobState.SUCCEEDED, 0, "")
    weights = head.shares.shares()
    assert weights["carol"].weight == pytest.approx(weights["dave"].weight, rel=1e-3)


def test_the_charge_reference_is_a_setting(tmp_path):
    cluster_file(tmp_path / "nodes.yaml", ("node01",), "scheduler:\n  charge_reference: 8G\n")
    assert load_config(tmp_path / "nodes.yaml").scheduler.charge_reference_mb == 8 * GB
    cluster_file(tmp_path / "nodes.yaml", ("node01",), "scheduler:\n  charge_reference: lots\n")
    with pytest.raises(Exception, match="scheduler.charge_reference: 'lots' is not a size"):
        load_config(tmp_path / "nodes.yaml")


def test_the_replay_charges_a_slice_as_the_live_head_does_wherever_it_lands():
    """``nebula simulate`` runs the head's own code: an 8 GB slice for 3 hours is charged
    1 GPU-hour on a lab of one A100 and on a lab of one 4090."""
    core = inventory.layout("core")
    charged = {}
    for node, card in (("node02", 0), ("node01", 0)):  # an A100, a 4090
        inv = {node: core[node][card:card + 1]}
        out = Replay(setup.replay_config(inv, None, []), inv, [Request(1, 0, "alice", 1, 8 * GB, 3 * 3600)],
                     setup.REPLAY_EPOCH, 86400).run()
        assert out[1].state == "succeeded"
        charged[core[node][card]["name"]] = out[1].charged_gpu_hours
    assert charged == {"NVIDIA A100-SXM4-80GB": pytest.approx(1.0), "NVIDIA GeForce RTX 4090": pytest.approx(1.0)}


async def test_the_report_splits_each_users_hours_in_and_over_their_quota(tmp_path):
    """quota_mode scavenge: alice's first job (2 h on a card) takes her past a 1 GPU-hour
    quota; her next runs as preemptible work on an idle card, 4 h charged at a quarter.
    `nebula report` says 2 GPU-hours in quota and 1 over, in --json and in its text."""
    from support.inprocess import up_engine

    from nebula_tui.cli.accounting import report_text

    clock = [1_800_000_000.0]
    head = up_engine(tmp_path, "scheduler:\n  quota_gpu_hours: 1\n", clock=lambda: clock[0])
    try:
        began = clock[0]
        for hours, over in ((2, 0.0), (4, 1.0)):
            job = head.submit("alice", JobSpec(command=("true",)))
            head.scheduling.schedule_pass()
            head.transitions.mark_running(head.jobs[job.id])
            clock[0] += hours * 3600
            # while it runs, `nebula why --user` counts its hours over the quota already
            assert head.shares.standing("alice")["over_quota_gpu_hours"] == pytest.approx(over)
            head.transitions.finish(head.jobs[job.id], JobState.SUCCEEDED, 0, "")
        assert head.state.store.job(job.id).spec.preemptible  # the second ran as scavenger work
        clock[0] += 60
        report = await head.accounting.report("alice", began - 60, clock[0])
        (alice,) = report["users"]
        assert (alice["gpu_hours"], alice["in_quota_gpu_hours"], alice["over_quota_gpu_hours"]) == (
            pytest.approx(3.0), pytest.approx(2.0), pytest.approx(1.0))
        share = head.shares.standing("alice")  # `nebula why --user alice`: the same split
        assert (share["in_quota_gpu_hours"], share["over_quota_gpu_hours"]) == (pytest.approx(2.0),
                                                                                pytest.approx(1.0))
        text = report_text(report)
        header = next(line for line in text.splitlines() if line.startswith("MONTH"))
        row = next(line for line in text.splitlines() if " alice " in line).split()
        assert header.split()[3:7] == ["GPU-H", "IN", "QUOTA", "OVER"]
        assert row[3:6] == ["3.000", "2.000", "1.000"]
    finally:
        await head.stop()
        head.state.store.close()


def test_the_forecast_charges_a_running_slice_against_the_labs_reference_card(tmp_path):
    """The forecast grows each user's fair share by what their running jobs are charged,
    with the reference card the lab set (it read the built-in 24 GB whatever the setting)."""
    from nebula_tui.head import forecast
    from nebula_tui.scheduler import RunningJob
    cluster_file(tmp_path / "nodes.yaml", ("node01",), "scheduler:\n  charge_reference: 8G\n")
    config = load_config(tmp_path / "nodes.yaml").scheduler.config
    a_slice = RunningJob(1, "alice", (Placement("GPU-node01-1", "node01", 1, 8 * GB, False),), 0.0)
    assert forecast._cards(a_slice, config) == pytest.approx(1.0)
    assert forecast._cards(a_slice, type(config)()) == pytest.approx(8 / 24)
