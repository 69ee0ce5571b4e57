"""What a job's cards' utilisation readings say of its idleness (head/limits.py), and how
the queue says it — a card that reports no utilisation (N/A) makes it unknown."""

from __future__ import annotations

import pytest

from nebula_tui.head.limits import BUSY, IDLE, UNKNOWN, idleness
from nebula_tui.model import IDLE_UTIL_PCT
from nebula_tui.cli.text import queue_text
from nebula_tui.views import IDLE_UNKNOWN_TEXT, running_idle_text


@pytest.mark.parametrize(("readings", "said"), [
    ([], None),                       # no card read yet: nothing said
    ([0.0], IDLE),
    ([IDLE_UTIL_PCT, 1.0], IDLE),     # at the threshold is idle
    ([0.0, 40.0], BUSY),              # one card at work is enough
    ([None], UNKNOWN),                # N/A: cannot tell
    ([None, 0.0], UNKNOWN),           # one idle card, one that cannot tell
    ([None, 90.0], BUSY),             # a card at work says it is not idle whatever the other
])
def test_idleness_from_readings(readings, said):
    assert idleness(readings) == said


RUNNING = {"id": 7, "user": "alice", "name": "train", "state": "running", "command": ["python", "t.py"],
           "gpus": [{"node": "node01", "index": 0}, {"node": "node01", "index": 1}],
           "reason": "", "gpu_count": 2, "gpu_mem_mb": None}


@pytest.mark.parametrize(("fields", "said"), [
    ({"idle_since": 1000.0 - 3 * 3600, "idle_unknown": False}, "idle 3 h on 2 GPUs"),
    ({"idle_since": None, "idle_unknown": True}, IDLE_UNKNOWN_TEXT),
    ({"idle_since": None, "idle_unknown": False}, ""),
    ({"state": "pending", "idle_since": None, "idle_unknown": True}, ""),
])
def test_the_queue_says_idle_idle_unknown_or_nothing(fields, said):
    job = {**RUNNING, **fields}
    assert running_idle_text(job, 1000.0) == said
    line = queue_text([job], now=1000.0).splitlines()[1]
    assert (f"{said} · python t.py" in line) if said else "idle" not in line
