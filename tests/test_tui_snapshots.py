"""Named screenshots of the main screens at 80x24 and 160x48, against the real head.

Not pixel snapshots (pytest-textual-snapshot is not a dependency): each screen is exported
as Textual's SVG and the test asserts on the text in it, so a layout that hides the key
facts at either size fails. With NEBULA_SAVE_SCREENSHOTS=1 the SVGs are also written to
docs/screenshots/ for the README.
"""

from __future__ import annotations

import html
import os
import re
import time
from pathlib import Path

import pytest
from textual.pilot import Pilot

from nebula_tui.api import ApiError
from nebula_tui.screens.app import make_app
from nebula_tui.screens.job import JobScreen
from nebula_tui.screens.submit import SubmitScreen

DOCS = Path(__file__).resolve().parent.parent / "docs" / "screenshots"
SIZES = [(80, 24), (160, 48)]

#: Screen (key to reach it) -> text that must be visible at every size.
EXPECTED = {
    "overview": ("1", ["Cluster Overview:", "GPUs: 9", "node01", "Events", "Queue", "shot-job"]),
    "gpus": ("2", ["node01:0", "RTX 4090", "sorted by node", "°C"]),
    "queue": ("3", ["shot-job", "running", "1 running"]),
    "users": ("4", ["Weight", "GPU-hours"]),
    "nodes": ("5", ["node01", "node03", "Events log"]),
}


async def until(pilot: Pilot, predicate, timeout: float = 30.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        await pilot.pause(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def svg_text(svg: str) -> str:
    """The characters an SVG screenshot shows, tags dropped, one string."""
    return html.unescape(re.sub(r"<[^>]+>", "", svg)).replace("\xa0", " ")


def keep(name: str, svg: str, tmp_path: Path) -> None:
    (tmp_path / f"{name}.svg").write_text(svg)
    if os.environ.get("NEBULA_SAVE_SCREENSHOTS") == "1":
        DOCS.mkdir(parents=True, exist_ok=True)
        (DOCS / f"{name}.svg").write_text(svg)


@pytest.fixture
def running_job(head):
    done = head.run("submit", "--name", "shot-job", "--gpu-mem", "4G", "--command",
                    "echo epoch 1 loss 0.93; echo epoch 2 loss 0.71; sleep 120", check=True)
    job_id = int(re.search(r"Submitted job (\d+)", done.stdout).group(1))
    yield job_id
    try:
        head.call("cancel", job=job_id)
    except ApiError:
        pass
    head.wait_job(job_id)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
async def test_main_screens_at_both_sizes(head, running_job, size, tmp_path):
    width, height = size
    app = make_app(head.socket, cluster_name="demo-lab")
    async with app.run_test(size=size) as pilot:
        await until(pilot, lambda: len(app.cluster.gpus) == 9
                    and (app.cluster.jobs.get(running_job) or {}).get("state") == "running",
                    what="snapshot with the job running")
        for name, (key, words) in EXPECTED.items():
            await pilot.press(key)
            await pilot.pause(0.5)
            await until(pilot, lambda: all(w in svg_text(app.export_screenshot()) for w in words),
                        timeout=15, what=f"{name} at {width}x{height}: {words}")
            keep(f"{name}-{width}x{height}", app.export_screenshot(), tmp_path)

        await pilot.press("3")
        app.push_screen(JobScreen(running_job))
        await until(pilot, lambda: isinstance(app.screen, JobScreen), what="job screen")
        await until(pilot, lambda: all(w in svg_text(app.export_screenshot())
                                       for w in ("epoch 2 loss", "shot-job", "Environment")),
                    what="the job's spec and log on screen")
        keep(f"job-{width}x{height}", app.export_screenshot(), tmp_path)
        await pilot.press("escape")

        await pilot.press("n")
        await until(pilot, lambda: isinstance(app.screen, SubmitScreen), what="submit form")
        await pilot.press(*"train")
        await pilot.press("tab", "tab", *"8G", "tab", "tab", *"python train.py")
        await until(pilot, lambda: "Would" in svg_text(app.export_screenshot())
                    or "not available" in svg_text(app.export_screenshot()), what="preview")
        shown = svg_text(app.export_screenshot())
        assert "GPU memory" in shown and "Command" in shown and "Submit" in shown
        keep(f"submit-{width}x{height}", app.export_screenshot(), tmp_path)
