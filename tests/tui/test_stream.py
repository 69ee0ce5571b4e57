"""The event stream's "gpus" events: only what changed, and a client that folds them in
always holds what the head holds.

The head here is the real ``Engine`` (store, probe parsing, publishing) fed the nodelet's
probe messages directly, as ``bench/tui.py`` does; the client is the TUI's ``Cluster``,
and on screen the real app under Pilot (no head at its socket: messages are posted as the
event worker posts them).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import pytest
from support.tui import until
from support.inprocess import MODEL, NODES, cluster_file, drain, gpu_row, probe

from nebula_tui.head import server
from nebula_tui.head.engine import Engine
from nebula_tui.head.state import JobTable, Maintenance
from nebula_tui.model import Job, JobSpec, Launching, NodeState, Pending, Placement, Running
from nebula_tui.screens.app import make_app
from nebula_tui.client.cluster import Cluster
from nebula_tui.screens.gpus import GpusScreen
from nebula_tui.screens.messages import GpusChanged, SnapshotArrived
from nebula_tui.screens.widgets.rowtable import RowTable


def gpu_events(events: list[dict]) -> list[dict]:
    return [e for e in events if e["type"] == "gpus"]


def client_of(snapshot: dict) -> Cluster:
    cluster = Cluster()
    cluster.apply_snapshot(json.loads(json.dumps(snapshot)))
    return cluster


def fold(cluster: Cluster, events: list[dict]) -> None:
    for event in gpu_events(events):
        cluster.apply_gpus(event["node"], event["gpus"], event.get("gone", ()), event.get("seen"))


def head_gpus(head: Engine) -> dict[str, dict]:
    return {g["uuid"]: json.loads(json.dumps(g)) for g in head.gpus_json(raw=False)}


async def test_a_reading_that_moved_is_all_that_is_sent(engine):
    queue: asyncio.Queue = asyncio.Queue()
    client = client_of(engine.subscribe(queue))
    engine.on_node_message("node01", probe("node01", [gpu_row("node01", 0, util=55, temp=61),
                                                      gpu_row("node01", 1)]))
    (event,) = gpu_events(drain(queue))
    assert event == {"type": "gpus", "node": "node01", "seen": engine.state.nodes["node01"].last_seen,
                     "gpus": {"GPU-node01-0": {"utilization_pct": 55.0, "temperature_c": 61.0}}}
    fold(client, [event])
    assert client.gpus == head_gpus(engine)
    # when the head last heard from the node, which no node event repeats (the Nodes
    # screen's "Seen")
    assert client.nodes["node01"]["last_seen"] == engine.state.nodes["node01"].last_seen

    # The same readings again: the node reported, nothing changed, nothing is sent for a GPU.
    engine.on_node_message("node01", probe("node01", [gpu_row("node01", 0, util=55, temp=61),
                                                      gpu_row("node01", 1)]))
    assert gpu_events(drain(queue)) == [{"type": "gpus", "node": "node01", "gpus": {},
                                         "seen": engine.state.nodes["node01"].last_seen}]


async def test_a_static_field_change_reaches_the_client(engine):
    queue: asyncio.Queue = asyncio.Queue()
    client = client_of(engine.subscribe(queue))
    engine.on_node_message("node02", probe("node02", [gpu_row("node02", 0, driver="560.28.03"),
                                                      gpu_row("node02", 1, driver="560.28.03")]))
    (event,) = gpu_events(drain(queue))
    assert event["gpus"] == {f"GPU-node02-{i}": {"driver_version": "560.28.03"} for i in range(2)}
    fold(client, [event])
    assert client.gpus["GPU-node02-1"]["driver_version"] == "560.28.03"
    assert client.gpus == head_gpus(engine)


async def test_job_and_node_changes_fold_to_the_heads_state(engine):
    """Whatever the head publishes, snapshot + events = the head's GPUs, for a subscriber
    from the start and one that joined after changes nobody was sent."""
    early: asyncio.Queue = asyncio.Queue()
    first = client_of(engine.subscribe(early))
    job = engine.submit("alice", JobSpec(command=("true",)))
    placed = engine.jobs[job.id]
    engine.transitions.begin_launch(placed, (Placement("GPU-node01-1", "node01", 1, 81920, True),))
    engine.on_node_state("node02", NodeState.UNKNOWN, "silent")
    fold(first, drain(early))
    assert first.gpus == head_gpus(engine)
    assert first.gpus["GPU-node01-1"]["jobs"] == [job.id]
    assert first.gpus["GPU-node02-0"]["status"] == "unreachable"

    # Changes while the only subscriber is gone are not sent; the next one starts from them.
    engine.unsubscribe(early)
    engine.on_node_state("node02", NodeState.UP, "")
    engine.on_node_message("node02", probe("node02", [gpu_row("node02", 0, util=99), gpu_row("node02", 1)]))
    late: asyncio.Queue = asyncio.Queue()
    second = client_of(engine.subscribe(late))
    assert second.gpus == head_gpus(engine) and second.gpus["GPU-node02-0"]["utilization_pct"] == 99.0
    engine.on_node_message("node02", probe("node02", [gpu_row("node02", 0, util=98), gpu_row("node02", 1)]))
    (event,) = gpu_events(drain(late))
    assert event["gpus"] == {"GPU-node02-0": {"utilization_pct": 98.0}}


async def test_a_late_subscriber_brings_the_others_up_to_date_first(engine):
    """The snapshot of a new subscriber is what the others hold: a GPU that changed with
    no event yet (health decays, say) reaches the others before the newcomer's snapshot."""
    early: asyncio.Queue = asyncio.Queue()
    first = client_of(engine.subscribe(early))
    live = engine.gpus["GPU-node01-0"]
    engine.gpus["GPU-node01-0"] = replace(live, maintenance=Maintenance("a test"))  # not published
    second = client_of(engine.subscribe(asyncio.Queue()))
    assert second.gpus["GPU-node01-0"]["status"] == "maintenance"
    fold(first, drain(early))
    assert first.gpus == second.gpus == head_gpus(engine)


async def test_the_gpus_of_a_removed_node_leave_the_client(engine, tmp_path):
    queue: asyncio.Queue = asyncio.Queue()
    client = client_of(engine.subscribe(queue))
    cluster_file(tmp_path / "nodes.yaml", NODES[:1])
    assert (await engine.reload(engine.owner))["removed"] == ["node02"]
    events = drain(queue)
    assert {"type": "gpus", "node": "node02", "gpus": {},
            "gone": ["GPU-node02-0", "GPU-node02-1"]} in events
    fold(client, events)
    assert client.gpus == head_gpus(engine) and set(client.gpus) == {"GPU-node01-0", "GPU-node01-1"}


def test_gpus_that_go_or_move_leave_their_old_node():
    cluster = Cluster()
    gpu = {"uuid": "GPU-a", "node": "n1", "index": 0, "model": MODEL, "utilization_pct": 5.0,
           "status": "idle", "total_memory_mb": 1, "slices": [], "jobs": []}
    cluster.apply_snapshot({"nodes": [], "gpus": [gpu, dict(gpu, uuid="GPU-b", index=1)], "jobs": []})
    assert cluster.apply_gpus("n2", {"GPU-a": dict(gpu, node="n2")})  # moved: a whole GPU
    assert cluster.node_gpus("n2") == [dict(gpu, node="n2")]
    assert [g["uuid"] for g in cluster.node_gpus("n1")] == ["GPU-b"]
    assert cluster.apply_gpus("n1", {}, gone=["GPU-a", "GPU-b"])  # (GPU-a now lives on n2)
    assert set(cluster.gpus) == {"GPU-a"} and cluster.node_gpus("n1") == []


def test_an_older_heads_whole_gpu_lists_still_fold():
    """A head from before this stream sends every GPU of the node, whole, in a list."""
    cluster = Cluster()
    gpu = {"uuid": "GPU-a", "node": "n1", "index": 0, "utilization_pct": 5.0, "status": "idle"}
    cluster.apply_snapshot({"nodes": [], "jobs": [], "gpus": [gpu, dict(gpu, uuid="GPU-b", index=1)]})
    assert cluster.apply_gpus("n1", [dict(gpu, utilization_pct=70.0)])
    assert cluster.node_gpus("n1") == [dict(gpu, utilization_pct=70.0)] and "GPU-b" not in cluster.gpus


def test_an_unchanged_node_changes_nothing_once_its_trend_is_flat():
    cluster = Cluster()
    cluster.apply_snapshot({"nodes": [], "jobs": [], "gpus": [
        {"uuid": "GPU-a", "node": "n1", "index": 0, "utilization_pct": 0.0}]})
    before = cluster.gpus["GPU-a"]
    # The trend line fills up (it moves), then stays flat: nothing to redraw.
    assert all(cluster.apply_gpus("n1", {}) for _ in range(12))
    assert not cluster.apply_gpus("n1", {})
    assert cluster.gpus["GPU-a"] is before
    assert cluster.apply_gpus("n1", {"GPU-a": {"utilization_pct": 40.0}})
    assert cluster.gpus["GPU-a"] == dict(before, utilization_pct=40.0) and before["utilization_pct"] == 0.0


def test_the_jobs_index_follows_every_change():
    table = JobTable()
    spec = JobSpec(command=("true",))
    p = Placement("GPU-a", "n1", 0, 100, False)
    table[1] = Job(1, "u", spec, submitted_at=0.0, status=Pending())
    assert table.held("GPU-a") == ()
    table[1] = Job(1, "u", spec, submitted_at=0.0, status=Running((p,), started_at=0.0))
    table[2] = Job(2, "u", spec, submitted_at=0.0, status=Launching((p,)))
    assert table.held("GPU-a") == ((1, p), (2, p))
    table.pop(1)
    del table[2]
    assert table.held("GPU-a") == () and not table.holding
    with pytest.raises(TypeError):
        table.update({})


async def test_only_the_rows_of_changed_gpus_are_recomputed():
    """On the GPU table, readings that moved are recomputed and shown; a node whose
    readings did not move costs no row."""
    nodes = [{"name": n, "host": "h", "port": 22, "state": "up", "reason": ""} for n in NODES]
    gpus = [{"uuid": f"GPU-{n}-{i}", "node": n, "index": i, "model": MODEL, "vendor": "nvidia",
             "total_memory_mb": 81920, "memory_used_mb": 0, "utilization_pct": 0.0,
             "temperature_c": 30.0, "power_w": 60.0, "status": "idle", "jobs": [], "slices": [],
             "processes": []} for n in NODES for i in range(2)]
    app = make_app("/nonexistent/nebula.sock")
    async with app.run_test(size=(120, 30)) as pilot:
        app.post_message(SnapshotArrived({"type": "snapshot", "nodes": nodes, "gpus": gpus,
                                          "jobs": [], "events": []}))
        await until(pilot, lambda: len(app.cluster.gpus) == 4, what="the snapshot")
        await pilot.press("2")
        await until(pilot, lambda: isinstance(app.screen, GpusScreen), what="the GPU screen")
        table = app.screen.query_one("#gpu-table", RowTable)
        await until(pilot, lambda: table.row_count == 4, what="4 rows")
        for _ in range(12):  # every trend line full and flat
            app.post_message(GpusChanged([{"type": "gpus", "node": n, "gpus": {}} for n in NODES]))
        trends = app.cluster.util_trend
        await until(pilot, lambda: len(trends) == 4 and all(len(t) == 12 for t in trends.values())
                    and not app.screen._telemetry, what="flat trends, shown")
        computed: list[str] = []
        cells_of = table.cells_of
        table.cells_of = lambda key: computed.append(key) or cells_of(key)
        app.post_message(GpusChanged([
            {"type": "gpus", "node": "node01", "gpus": {"GPU-node01-1": {"temperature_c": 81.0}}},
            {"type": "gpus", "node": "node02", "gpus": {}}]))
        temp = table.column_keys.index("temp")
        await until(pilot, lambda: "81°C" in str(table.get_row("GPU-node01-1")[temp]),
                    what="the new reading in its row")
        assert computed and set(computed) <= {"GPU-node01-0", "GPU-node01-1"}


async def test_telemetry_is_written_in_batches_and_anything_else_at_once(monkeypatch):
    monkeypatch.setattr(server, "STREAM_GATHER_S", 3600.0)  # only another kind of event ends it
    queue: asyncio.Queue = asyncio.Queue()
    loop = asyncio.get_running_loop()
    reading = {"type": "gpus", "node": "node01", "gpus": {}}
    job = {"type": "job", "job": {"id": 1}}
    queue.put_nowait(reading)
    loop.call_soon(queue.put_nowait, dict(reading, node="node02"))
    loop.call_later(0.05, lambda: [queue.put_nowait(job), queue.put_nowait(reading)])
    got = await asyncio.wait_for(server.gather_events(queue), 600)
    assert got == [reading, dict(reading, node="node02"), job, reading]

    queue.put_nowait(job)  # not telemetry: written at once, with nothing else waiting
    assert await asyncio.wait_for(server.gather_events(queue), 600) == [job]
