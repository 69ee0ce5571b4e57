"""The TUI shows a pool like the lab: a card per pool on the Overview and the pool's nodes,
read-only, on the Nodes screen — against a real head whose pool is the ``slurm_lab``
fixture's real Slurm, at 80x24, driven with Pilot."""

from __future__ import annotations

import re

import pytest
import yaml
from support.tui import until
from support.labfixtures import cancel_left_and_stop

from nebula_tui.screens.app import make_app
from nebula_tui.screens.widgets.nodecards import NodeCards
from nebula_tui.screens.nodes import NodesScreen
from labkit.harness import HeadProcess, wait_for

SIZE = (80, 24)


@pytest.fixture(scope="module")
def pool_head(slurm_lab, tmp_path_factory):
    home = tmp_path_factory.mktemp("tuipool")
    entry = slurm_lab.pool_entry("hpc", identity=str(slurm_lab.identity_path),
                                 known_hosts=str(slurm_lab.known_hosts_path),
                                 workdir=str(home / "hpc-work"), poll_interval="1s")
    (home / "nodes.yaml").write_text(yaml.safe_dump({"cluster": {"name": "tuipool"},
                                                     "pools": [entry]}))
    head = HeadProcess(home, None, config=home / "nodes.yaml")
    head.start(wait_nodes=False)
    wait_for(lambda: head.call("status")["pools"][0]["reachable"], 60, what="the pool's first poll")
    try:
        yield head
    finally:
        cancel_left_and_stop(head)


def notices(app) -> str:
    """The app's notifications' messages, as one line of words."""
    return " ".join(" ".join(str(n.message).split()) for n in app._notifications)


def pool_card(pilot) -> str:
    cards = pilot.app.screen.query(NodeCards)
    texts = cards.first().texts() if cards else []
    return next((t for t in texts if t.startswith("hpc")), "")


@pytest.mark.slow
async def test_the_overview_has_a_card_for_the_pool_that_follows_its_polls(pool_head):
    app = make_app(pool_head.socket)
    async with app.run_test(size=SIZE) as pilot:
        # (the session's Slurm is shared: an earlier test's job may still be ending there)
        card = await until(pilot, lambda: "16/16 idle" in pool_card(pilot) and pool_card(pilot),
                           60, what="the pool's card, every GPU idle")
        title = card.splitlines()[0]
        assert re.match(r"hpc  pool · Slurm \d+\.\d+\.\d+ · partition gpu  16/16 idle", title), card
        assert "ours: 0 running, 0 pending" in card
        assert all(re.search(rf"\bn{i} \S+ 0/4\b", card) for i in range(1, 5)), card
        done = pool_head.run("submit", "--pool", "hpc", "--gpu-count", "2", "--", "sleep", "120",
                             check=True)
        job = re.search(r"job (\d+)", done.stdout).group(1)
        try:  # the head's next poll reaches the card through the stream
            card = await until(pilot, lambda: "ours: 1 running" in pool_card(pilot)
                               and pool_card(pilot), 60, what="the pool job on the card")
            assert "14/16 idle" in card.splitlines()[0]
        finally:
            pool_head.run("cancel", job)


async def test_the_nodes_screen_lists_the_pools_nodes_read_only(pool_head):
    app = make_app(pool_head.socket)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.cluster.pools, what="the snapshot's pools")
        await pilot.press("5")
        await until(pilot, lambda: isinstance(app.screen, NodesScreen), what="the Nodes screen")
        table = app.screen.query_one("#nodes-table")
        await until(pilot, lambda: len(table.row_keys) == 4, what="the pool's four nodes")
        assert list(table.row_keys) == ["hpc:n1", "hpc:n2", "hpc:n3", "hpc:n4"]
        # (a job an earlier test cancelled may hold n1 until the pool's next poll)
        row = await until(pilot, lambda: (r := [str(c) for c in table.get_row("hpc:n1")])[2]
                          == "0/4 used" and r, 60, what="n1 idle again")
        assert row[0] == "hpc:n1" and "idle" in row[1] and row[7] == "pool hpc"
        assert "read-only" in row[8]
        table.focus()
        table.move_cursor(row=0)
        await pilot.press("d")  # drain: not ours to do
        await until(pilot, lambda: "is a node of pool hpc" in notices(app), what="the refusal")
        assert isinstance(app.screen, NodesScreen)  # no drain prompt opened
