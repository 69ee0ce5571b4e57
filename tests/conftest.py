"""Shared fixtures: a real simulated lab (OpenSSH sshd nodes) and a real head service.

``head`` starts ``nebula serve`` as its own process against the session's lab, with a
fresh home (SQLite store, socket) per test module, and drives it through the real CLI.
"""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from labfixtures import asyncssh_lab, openssh_lab  # noqa: E402,F401  (fixtures)
from slurmfixtures import slurm_lab  # noqa: E402,F401  (fixture)

from labkit.harness import HeadProcess, wait_for  # noqa: E402,F401


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now: nothing listens there until something binds it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def until(pilot, predicate, timeout: float = 30.0, what: str = "condition"):
    """Let the app run (events, renders) until ``predicate()`` is truthy."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        await pilot.pause(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")



def palette_options(app) -> str:
    """The command palette's current entries, as text."""
    found = app.screen.query("CommandList")
    if not found:
        return ""
    options = found.first()
    return "\n".join(str(options.get_option_at_index(i).prompt) for i in range(options.option_count))


async def palette_pick(pilot, typed: str, entry: str) -> None:
    """Open the command palette, type ``typed``, and choose once ``entry`` is offered."""
    await pilot.press("ctrl+p")
    await until(pilot, lambda: pilot.app.screen.query("CommandInput"), what="the palette")
    await pilot.press(*typed)
    await until(pilot, lambda: entry in palette_options(pilot.app), what=f"the palette's {entry!r}")
    await pilot.press("enter")


def has_op(head, op: str, **fields) -> bool:
    """Whether the service knows ``op`` (any answer but "unknown request" means yes)."""
    from nebula_tui.api import ApiError

    try:
        head.call(op, **fields)
    except ApiError as err:
        return not str(err).startswith("unknown request")
    return True


@pytest.fixture(scope="module")
def head(openssh_lab, tmp_path_factory):
    """A fresh head service (own store and socket) on the session's OpenSSH lab."""
    h = HeadProcess(tmp_path_factory.mktemp("home"), openssh_lab)
    h.start()
    try:
        yield h
    finally:
        h.stop()
