"""What a newcomer met trying the tool: each defect found on the way, against the real head
on the simulated lab's sshd nodes (the CLI as a process, the TUI under Pilot)."""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
import sys
import time

import pytest
from support.tui import until
from labkit.harness import wait_for

from nebula_tui.api import ApiError
from nebula_tui.screens.app import HelpScreen, make_app
from nebula_tui.screens.widgets.nodecards import NodeCards
from nebula_tui.screens.nodes import DrainPrompt, NodesScreen
from nebula_tui.screens.overview import OverviewScreen
try:
    from nebula_tui.screens.render import CARD_MODEL, card_model
except ImportError:
    CARD_MODEL, card_model = 15, None


def screen_text(app) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", app.export_screenshot())).replace("\xa0", " ")


def submitted(done: subprocess.CompletedProcess) -> int:
    match = re.search(r"Submitted job (\d+)", done.stdout)
    assert match, done.stdout + done.stderr
    return int(match.group(1))


# ============================================================================ the TUI
@pytest.mark.slow
@pytest.mark.parametrize("size", [(80, 24), (160, 48)])
async def test_help_shows_every_key_and_command_and_scrolls(size):
    """`?` was cut off at 80x24 and at 160x48: the global keys and the `:` commands never
    showed, and it did not scroll."""
    app = make_app("/nonexistent/nebula.sock")  # help needs no head
    async with app.run_test(size=size) as pilot:
        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen), what="help")
        await pilot.pause()
        assert "Keys — Overview" in screen_text(app)
        seen = screen_text(app)
        for _ in range(60):  # j scrolls a line at a time, to the end
            await pilot.press("j")
            seen += screen_text(app)
        for words in ("Command palette", "Light / dark theme", ":drain NODE [REASON]", ":quit",
                      "leave the TUI", "esc closes this help"):
            assert words in seen, words
        await pilot.press("g")  # back to the top (it may glide there)
        await until(pilot, lambda: "Keys — Overview" in screen_text(app), what="the top again")


def test_a_card_names_its_model_by_the_words_that_tell_cards_apart():
    assert card_model("AMD Instinct MI210") == "Instinct MI210"
    assert card_model("NVIDIA GeForce RTX 4090") == "RTX 4090"
    assert card_model("AMD Radeon RX 7900 XTX") == "RX 7900 XTX"
    assert card_model("Intel(R) Data Center GPU Max 1550") == "GPU Max 1550"
    assert card_model("X" * 40) == "X" * (CARD_MODEL - 1) + "…"


async def test_the_overview_puts_node_cards_side_by_side_when_wide(head):
    """At 120 columns the cards stood in one column, two thirds of the panel empty."""
    app = make_app(head.socket)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.cluster.connected and len(app.cluster.nodes) == 3,
                    what="the snapshot")
        await until(pilot, lambda: isinstance(app.screen, OverviewScreen), what="overview")
        cards = app.screen.query_one("#cards", NodeCards)
        await until(pilot, lambda: len(cards.names) == 3, what="3 cards")
        # the first cards may be laid out before the panel has its width; its resize
        # lays them out again
        await until(pilot, lambda: cards._columns >= 2, what="two columns of cards")
        rows = [line for line in screen_text(app).splitlines() if "node0" in line and " up" in line]
        assert any(line.count("node0") >= 2 for line in rows), rows  # two titles on one line
    async with make_app(head.socket).run_test(size=(80, 24)) as pilot:  # narrow: one column
        app = pilot.app
        await until(pilot, lambda: len(app.cluster.nodes) == 3, what="the snapshot")
        cards = app.screen.query_one("#cards", NodeCards)
        await until(pilot, lambda: len(cards.names) == 3, what="3 cards")
        assert cards._columns == 1


async def test_the_nodes_screen_says_when_each_node_was_last_heard_from(head):
    """"Seen" said 11 min for nodes seen 0.8 s ago: it was the time of the snapshot."""
    app = make_app(head.socket)
    async with app.run_test(size=(160, 40)) as pilot:
        await until(pilot, lambda: app.cluster.connected and len(app.cluster.nodes) == 3,
                    what="the snapshot")
        first = {n: app.cluster.nodes[n]["last_seen"] for n in app.cluster.nodes}
        await pilot.press("5")
        await until(pilot, lambda: isinstance(app.screen, NodesScreen), what="nodes")
        await pilot.pause(4.0)  # the lab's nodes report every second
        for name, node in app.cluster.nodes.items():
            assert node["last_seen"] > first[name] and time.time() - node["last_seen"] < 3, name
        table = app.screen.query_one("#nodes-table")
        await until(pilot, lambda: all(re.fullmatch(r"[0-3]s", str(table.get_row(n)[6]))
                                       for n in ("node01", "node02", "node03")),
                    timeout=5, what="'Seen' a second or so ago")


async def test_the_drain_prompt_keeps_the_node_on_a_habit_enter(head):
    app = make_app(head.socket)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.cluster.connected and len(app.cluster.nodes) == 3,
                    what="the snapshot")
        app.ask_drain("node03")
        await until(pilot, lambda: isinstance(app.screen, DrainPrompt), what="the drain question")
        await pilot.press("enter")  # no reason typed: the safe answer takes the focus
        await pilot.pause(0.3)
        assert isinstance(app.screen, DrainPrompt)
        await pilot.press("enter")  # on "Keep taking jobs"
        await until(pilot, lambda: not isinstance(app.screen, DrainPrompt), what="answered")
        await pilot.pause(0.5)
        assert not next(n for n in head.call("status")["nodes"] if n["name"] == "node03")["drained"]
        # With a reason typed, Enter drains (what was meant, said).
        app.ask_drain("node03")
        await until(pilot, lambda: isinstance(app.screen, DrainPrompt), what="asked again")
        await pilot.press(*"fan", "enter")
        try:
            await until(pilot, lambda: app.cluster.nodes["node03"].get("drained"), what="drained")
        finally:
            head.call("resume", node="node03")
        # the resume's node event and log line reach the app before it closes
        await until(pilot, lambda: not app.cluster.nodes["node03"].get("drained"), what="resumed")
        await pilot.pause(0.5)


# ============================================================================ the CLI
def test_cancel_takes_several_ids_like_scancel(head):
    blocker = submitted(head.run("submit", "--gpu-count", "4", "--gpu-mem", "70G", "--",
                                 "sleep", "300", check=True))
    waiting = [submitted(head.run("submit", "--gpu-count", "4", "--gpu-mem", "70G", "--",
                                  "sleep", "1", check=True)) for _ in range(2)]
    done = head.run("cancel", str(waiting[1]), str(waiting[0]), str(blocker))
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("Cancel") == 3
    for job in (blocker, *waiting):
        wait_for(lambda j=job: head.job(j)["state"] == "cancelled", 30, what=f"job {job} cancelled")
    mixed = head.run("cancel", str(blocker), "999999")  # one unknown: said, the rest done
    assert mixed.returncode == 1 and "job 999999" in mixed.stderr and "no job" in mixed.stderr


def test_job_prints_text_by_default_and_json_with_the_flag(head):
    job = submitted(head.run("submit", "--gpu-mem", "4G", "--name", "texty", "--", "sleep", "60",
                             check=True))
    try:
        wait_for(lambda: head.job(job)["state"] == "running", 30, what="running")
        text = head.run("job", str(job), check=True).stdout
        assert text.startswith(f"job {job}  texty  ") and "running" in text.splitlines()[0]
        assert "  command:   sleep 60" in text and "  asks:      1 GPU, 4 GB each" in text
        assert re.search(r"^    NEBULA_JOB_ID=%d$" % job, text, re.M), text
        as_json = json.loads(head.run("job", str(job), "--json", check=True).stdout)
        assert as_json["id"] == job and as_json["name"] == "texty"
    finally:
        head.run("cancel", str(job))


def test_the_preview_refuses_what_submit_refuses(head):
    """The form's preview of --gpu-mem 8T said "would wait" while submit refused it."""
    refused = head.run("submit", "--gpu-mem", "8T", "--", "true")
    assert refused.returncode == 2
    with pytest.raises(ApiError) as err:
        head.call("plan", command=["true"], shell=True, gpu_count=1, gpu_mem_mb=8 * 1024 ** 2)
    assert str(err.value) in refused.stderr


def test_node_add_refuses_a_second_node_at_a_nodes_address(head, openssh_lab):
    port = openssh_lab.port("node01")
    done = head.run("node", "add", "node09", "127.0.0.1", "--port", str(port), "--trust", "SHA256:x")
    assert done.returncode == 1 and "node01 is already at 127.0.0.1" in done.stderr, done.stderr
    assert all(n["name"] != "node09" for n in head.call("status")["nodes"])


def test_nebula_sim_finds_the_demos_lab_from_nebula_home(openssh_lab, tmp_path):
    """`nebula sim` needed NEBULA_CONFIG as well; the demo keeps its lab in <home>/lab."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "lab").symlink_to(openssh_lab.root)
    env = {k: v for k, v in os.environ.items() if k not in ("NEBULA_CONFIG", "NEBULA_SOCKET")}
    env["NEBULA_HOME"] = str(home)
    run = lambda *a: subprocess.run([sys.executable, "-m", "nebula_tui", "sim", *a], env=env,  # noqa: E731
                                    capture_output=True, text=True, timeout=60)
    on = run("throttle", "node03", "1")
    try:
        assert on.returncode == 0 and "node03:1 throttles" in on.stdout, on.stderr
    finally:
        off = run("throttle", "node03", "1", "--off")
    assert off.returncode == 0 and "runs normally again" in off.stdout, off.stderr


# ============================================================================ the head
def test_every_multi_gpu_job_gets_the_torchrun_variables_however_placed(head):
    """`--nodes 2` on a job that fits one node got no MASTER_ADDR/PORT/NNODES; a gang split
    4+2 gave its ranks different NEBULA_GPU_MEM_MB."""
    one = submitted(head.run("submit", "--gpu-count", "2", "--gpu-mem", "4G", "--nodes", "2", "--",
                             "sleep", "300", check=True))
    try:
        job = wait_for(lambda: (j := head.job(one))["state"] == "running" and j, 30, what="running")
        (env,) = job["environment"].values()  # it fits one node
        assert {k: env.get(k) for k in ("NNODES", "NODE_RANK", "WORLD_SIZE", "NPROC_PER_NODE")} == {
            "NNODES": "1", "NODE_RANK": "0", "WORLD_SIZE": "2", "NPROC_PER_NODE": "2"}
        assert env["MASTER_ADDR"] and env["MASTER_PORT"].isdigit()
    finally:
        head.run("cancel", str(one))
        wait_for(lambda: head.job(one)["state"] == "cancelled", 30, what="cancelled")
    # Whole cards of different sizes across two nodes.
    gang = submitted(head.run("submit", "--gpu-count", "5", "--nodes", "2", "--", "sleep", "300",
                              check=True))
    try:
        job = wait_for(lambda: (j := head.job(gang))["state"] == "running" and j, 30, what="the gang")
        envs = list(job["environment"].values())
        assert len(envs) == 2
        assert len({e["NEBULA_GPU_MEM_MB"] for e in envs}) == 1, envs
        assert {e["WORLD_SIZE"] for e in envs} == {"5"}
        for node, env in job["environment"].items():
            assert env["NPROC_PER_NODE"] == str(sum(g["node"] == node for g in job["gpus"]))
        assert {e["MASTER_ADDR"] for e in envs} == {envs[0]["MASTER_ADDR"]}
    finally:
        head.run("cancel", str(gang))
        wait_for(lambda: head.job(gang)["state"] == "cancelled", 60, what="cancelled")
