"""The CLI's text (``cli/text.py``) from a real head's replies, read off its socket as the
commands read them."""

from __future__ import annotations

import getpass

from nebula_tui.api import AsyncClient
from nebula_tui.cli.text import queue_text
from nebula_tui.wire import HistoryReply, JobReply, QueueReply, SubmitReply


async def test_queue_all_shows_an_arrays_ended_task_on_its_own_line_not_as_one_waiting(served):
    """`nebula queue --all` puts the ended jobs (``job_history``) before the live ones: an
    array's cancelled task is a line of its own, and the array's line counts the tasks left
    (before, it counted the cancelled one as left and waiting)."""
    client = AsyncClient(served)
    first = (await client.call("submit", SubmitReply, command=["true"], gpu_count=2, array="0-2%1"))["job"]
    second = first["id"] + 1  # (the first task's id is the array's: cancelling it ends them all)
    await client.call("cancel", JobReply, job=second)
    ended = (await client.call("job_history", HistoryReply, user=getpass.getuser()))["jobs"]
    live = (await client.call("queue", QueueReply))["jobs"]
    assert [j["id"] for j in ended] == [second] and len(live) == 2
    lines = queue_text([*ended, *live], 0.0).splitlines()[1:]
    assert len(lines) == 2, lines
    assert lines[0].split()[:4] == [f"{first['array_id']}_1", getpass.getuser(), "-", "cancelled"]
    assert "array of 2 tasks left (0-2%1): 0 running, 2 waiting" in lines[1], lines[1]
