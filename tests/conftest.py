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

#: The helpers beside this file (labfixtures, support, inprocess…) and the test modules of
#: each layer's folder are imported by name, also across folders (a lab test takes a fixture
#: of a unit test's module), so each is on ``sys.path`` once, under its own name.
HERE = Path(__file__).resolve().parent
LAYERS = ("unit", "tui", "lab")
sys.path[:0] = [str(HERE), *(str(HERE / layer) for layer in LAYERS)]

from labfixtures import asyncssh_lab, openssh_lab  # noqa: E402,F401  (fixtures)
from slurmfixtures import slurm_lab  # noqa: E402,F401  (fixture)

from labkit.harness import HeadProcess, wait_for  # noqa: E402,F401

#: A test reaches the simulated lab (real sshd, tmux, a head process, Slurm) when it asks for
#: one of these; it is then marked ``lab``, in whichever folder it is. Tests that start a lab
#: or a demo of their own say so with ``pytest.mark.lab`` themselves.
LAB_FIXTURES = frozenset({"openssh_lab", "asyncssh_lab", "slurm_lab"})

#: Every test under tests/lab/ is a lab test, whatever it asks for: its module's other
#: tests reach the lab (a module goes to the folder of its majority).
LAB_FOLDER = HERE / "lab"

#: Modules whose tests share something of the whole machine, so that under pytest-xdist
#: they run in one worker, one after another: one real Slurm cluster (and the demo's own),
#: and the Unix users and groups made with test_multiuser's ``lab_users`` (modules borrow
#: each other's, by the same names, and each removes them when it ends).
MACHINE_WIDE = {
    "test_pools_e2e": "slurm", "test_pool_authorize": "slurm", "test_tui_pools": "slurm",
    "test_slurm_lab": "slurm", "test_demo_slurm": "slurm", "test_pool_trust": "slurm",
    "test_slurm_oracle": "slurm",
    **dict.fromkeys(("test_multiuser", "test_accounting", "test_remote_host", "test_attach",
                     "test_shared_box_paths", "test_node_command_lines", "test_install"),
                    "unix-users"),
    "test_box": "slurm",  # its pool job runs on the session's Slurm, one at a time
}


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config, items):
    """Marks each test that reaches the lab, or lives in tests/lab/, ``lab``, and gives each
    an xdist group: its module (a module's head and lab are set up once, in one worker) or
    the machine-wide thing it shares. The groups with the most ``slow`` tests come first, then the other lab
    groups, so that no long group starts last (with ``--no-loadscope-reorder``: `make test`)."""
    for item in items:
        if LAB_FIXTURES & set(item.fixturenames) or LAB_FOLDER in item.path.resolve().parents:
            item.add_marker(pytest.mark.lab)
    groups: dict[str, list] = {}
    for item in items:
        module = item.module.__name__.rpartition(".")[2] if item.module else item.nodeid
        group = MACHINE_WIDE.get(module, module)
        item.add_marker(pytest.mark.xdist_group(group))
        groups.setdefault(group, []).append(item)

    def weight(group: list) -> tuple[int, int]:
        return (-sum(1 for i in group if i.get_closest_marker("slow")),
                -sum(1 for i in group if i.get_closest_marker("lab")))

    items[:] = [item for group in sorted(groups.values(), key=weight) for item in group]


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
