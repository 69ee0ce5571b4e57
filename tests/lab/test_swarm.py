"""The swarm (many simulated nodes in one process, for the scale bench) speaks the nodelet's
protocol well enough for the real head: nodes come up with their GPUs, a job launches,
its process shows on its GPU, a cancel ends it, and jobs given at start are seen running."""

from __future__ import annotations

import pytest

from labkit.harness import wait_for
from labkit.harness import HeadProcess
from nebula_tui.sim.presets import uniform_nodes
from labkit.swarm import SwarmProcess

pytestmark = pytest.mark.lab  # a swarm and a head of its own


@pytest.fixture
def swarm(tmp_path):
    swarm = SwarmProcess(tmp_path / "swarm", nodes=2, gpus=2, probe_interval=1,
                         running={"node002": {900: [1]}})
    swarm.start(timeout=30)
    try:
        yield swarm
    finally:
        swarm.stop()


def test_the_head_runs_and_cancels_a_job_on_the_swarm(swarm, tmp_path):
    head = HeadProcess(tmp_path / "home", swarm)
    head.start(wait_nodes=False)
    try:
        wait_for(lambda: [n["state"] for n in head.call("status")["nodes"]] == ["up", "up"], 30,
                 what="both nodes up")
        gpus = wait_for(lambda: len(g := head.call("gpus")["gpus"]) == 4 and g, 10,
                        what="every GPU reported")
        assert {g["uuid"] for g in gpus} == {g["uuid"] for s in uniform_nodes(2, 2) for g in s["gpus"]}
        # The job the swarm was told runs already: its process on node002's GPU 1, ours
        # by the probe's pid map (so its memory is not counted as someone else's).
        busy = next(g for g in gpus if g["node"] == "node002" and g["index"] == 1)
        assert [p["job_id"] for p in busy["processes"]] == [900]

        job = head.call("submit", command=["sleep", "600"])["job"]["id"]
        placed = wait_for(lambda: (j := head.job(job))["state"] == "running" and j, 10,
                          what="the job to run")

        def on_its_gpu():
            return any(p["job_id"] == job for g in head.call("gpus")["gpus"]
                       if g["node"] == placed["node"] for p in g["processes"])
        wait_for(on_its_gpu, 10, what="the job's process in a probe")
        head.call("cancel", job=job)
        assert head.wait_job(job, 10)["state"] == "cancelled"
    finally:
        head.stop()


def test_links_take_turns_at_their_handshakes(tmp_path, monkeypatch):
    """A head starting with many nodes runs at most MAX_HANDSHAKES SSH handshakes at once
    (500 at once on a busy machine all ran past connect_timeout, again and again), and
    every node still comes up."""
    import asyncio

    import asyncssh

    from nebula_tui.config.cluster import load_config
    from nebula_tui.model import NodeState
    from nebula_tui.remote import ssh

    swarm = SwarmProcess(tmp_path / "swarm", nodes=8, gpus=1, probe_interval=1)
    swarm.start(timeout=60)
    under_way, most = 0, 0
    real_connect = asyncssh.connect

    async def counted_connect(*args, **kwargs):
        nonlocal under_way, most
        under_way += 1
        most = max(most, under_way)
        try:
            await asyncio.sleep(0.2)  # each handshake long enough for the others to pile up
            return await real_connect(*args, **kwargs)
        finally:
            under_way -= 1

    monkeypatch.setattr(ssh, "MAX_HANDSHAKES", 3)
    monkeypatch.setattr(ssh.asyncssh, "connect", counted_connect)
    config = load_config(swarm.config_path)
    states: dict[str, NodeState] = {}

    async def run() -> None:
        links = [ssh.NodeLink(node, config, lambda *_: None,
                              lambda name, state, _: states.__setitem__(name, state))
                 for node in config.nodes]
        for link in links:
            link.start()
        try:
            async with asyncio.timeout(60):
                while sum(s == NodeState.UP for s in states.values()) < len(links):
                    await asyncio.sleep(0.1)
        finally:
            for link in links:
                await link.close()

    try:
        asyncio.run(run())
    finally:
        swarm.stop()
    assert len(states) == 8 and most == 3
