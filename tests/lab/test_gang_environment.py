"""A gang job's page shows each node's environment as the head computes it, and that is
exactly what the job's command got on each node (the real head on the simulated lab's
sshd nodes; the TUI under Pilot)."""

from __future__ import annotations

import re

from support.tui import until
from labkit.harness import wait_for

from nebula_tui.screens.app import make_app
from nebula_tui.screens.job import JobScreen
from support.head import submitted_id

SIZE = (160, 60)


def shown_environment(text: str) -> dict[str, dict[str, str]]:
    """The job page's environment panel read back: node -> variables."""
    found: dict[str, dict[str, str]] = {}
    node = None
    for line in text.splitlines():
        heading = re.fullmatch(r"(\S+) \(rank \d+\)", line.strip())
        if heading:
            node = heading.group(1)
            found[node] = {}
        elif "=" in line and node:
            key, _, value = line.strip().partition("=")
            found[node][key] = value
    return found


async def test_a_gang_jobs_environment_on_its_page_is_what_each_node_gave_it(head):
    # Five cards with ≥20 GB exist only across nodes: node02's four A100s and a 24 GB card.
    done = head.run("submit", "--gpu-count", "5", "--gpu-mem", "20G", "--nodes", "2", "--",
                    "sh", "-c", 'env > "$NEBULA_SIM_DIR/env-$NEBULA_JOB_ID"; sleep 300', check=True)
    job_id = submitted_id(done.stdout)
    try:
        job = wait_for(lambda: (j := head.job(job_id))["state"] == "running" and j, 30,
                       what="the gang to run")
        nodes = list(dict.fromkeys(g["node"] for g in job["gpus"]))
        assert len(nodes) == 2
        files = {n: head.lab.node_dir(n) / f"env-{job_id}" for n in nodes}
        wait_for(lambda: all(f.exists() and f.read_text().endswith("\n") for f in files.values()),
                 30, what="each node's part to write its environment")
        received = {n: dict(line.split("=", 1) for line in f.read_text().splitlines() if "=" in line)
                    for n, f in files.items()}

        app = make_app(head.socket)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.cluster.connected, what="the snapshot")
            app.open_job(job_id)
            await until(pilot, lambda: isinstance(app.screen, JobScreen), what="the job page")
            text = await until(pilot, lambda: "NODE_RANK" in (t := "\n".join(
                str(w.content) for w in app.screen.query("#job-env"))) and t, what="its environment")
        shown = shown_environment(text)
        assert list(shown) == nodes  # rank 0 first
        for rank, node in enumerate(nodes):
            assert shown[node]["NODE_RANK"] == str(rank)
            assert {k: received[node].get(k) for k in shown[node]} == shown[node], node
    finally:
        head.run("cancel", str(job_id))
        wait_for(lambda: head.job(job_id)["state"] == "cancelled", 60, what="the cancel")
