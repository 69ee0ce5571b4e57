"""Shared fixtures: a real simulated lab (OpenSSH sshd nodes) and a real head service.

``head`` starts ``nebula serve`` as its own process against the session's lab, with a
fresh home (SQLite store, socket) per test module, and drives it through the real CLI.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from labfixtures import asyncssh_lab, openssh_lab  # noqa: E402,F401  (fixtures)

from nebula_tui.sim.harness import HeadProcess, wait_for  # noqa: E402,F401

#: real tool outputs captured on real machines (the steering repo's shared/samples; a
#: worktree under /work/wt has it at /work/shared)
SAMPLES = Path(__file__).resolve().parents[2] / "shared" / "samples"
if not SAMPLES.is_dir():
    SAMPLES = Path("/work/shared/samples")


async def until(pilot, predicate, timeout: float = 30.0, what: str = "condition"):
    """Let the app run (events, renders) until ``predicate()`` is truthy."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        await pilot.pause(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")



@pytest.fixture(scope="module")
def head(openssh_lab, tmp_path_factory):
    """A fresh head service (own store and socket) on the session's OpenSSH lab."""
    h = HeadProcess(tmp_path_factory.mktemp("home"), openssh_lab)
    h.start()
    try:
        yield h
    finally:
        h.stop()
