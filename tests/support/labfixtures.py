"""Session-wide simulated labs for the test suite (imported by conftest.py).

``openssh_lab``  the three NVIDIA nodes of the demo ("core"), each a real OpenSSH sshd on 127.0.0.1.
``asyncssh_lab`` the same three nodes served by in-process asyncssh servers
                 (their event loop runs in a background thread of the test process).

Both yield a started :class:`nebula_tui.sim.lab.Lab` with ``probe_interval`` 1.0 and
stop it (servers, sessions, per-node tmux servers) at the end of the session.  Point the
head service at ``lab.config_path``; open a raw session with
``async with lab.connect("node01") as conn``.  A test that uses ``lab.stop_node`` or
leaves tmux sessions behind must undo it (``start_node`` / ``kill_node_tmux``): the lab is
shared by the whole session. ``lab_config`` writes the lab's cluster file with sections of
a test's own (a head whose limits act within seconds, say), ``serving`` runs a head on it
for a module's fixture.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import asyncssh
import pytest
import yaml

from nebula_tui.api import ApiError
from labkit.harness import HeadProcess
from nebula_tui.sim.lab import Lab


# One lab per kind per session, even if both conftest.py and a test module import these
# fixtures (pytest then holds two definitions of the same session fixture).
_LABS: dict[str, list] = {}


def _shared(tmp_path_factory, ssh: str):
    entry = _LABS.get(ssh)
    if entry is None:
        lab = Lab(tmp_path_factory.mktemp(ssh[0] + "lab"), layout="core", ssh=ssh,
                  probe_interval=1.0)
        lab.prepare()
        lab.start()
        entry = _LABS[ssh] = [lab, 0]
    entry[1] += 1
    try:
        yield entry[0]
    finally:
        entry[1] -= 1
        if entry[1] == 0:
            del _LABS[ssh]
            entry[0].stop()


@pytest.fixture(scope="session")
def openssh_lab(tmp_path_factory):
    """A started three-node lab served by real sshd processes."""
    yield from _shared(tmp_path_factory, "openssh")


@pytest.fixture(scope="session")
def asyncssh_lab(tmp_path_factory):
    """A started three-node lab served by in-process asyncssh servers."""
    yield from _shared(tmp_path_factory, "asyncssh")


def lab_config(lab: Lab, name: str, **sections: dict) -> Path:
    """The lab's cluster file with ``sections`` (``health=…``, ``limits=…``) set, written as
    ``nodes-<name>.yaml`` in the lab directory (where ``nebula sim`` finds the lab)."""
    config = yaml.safe_load(lab.config_path.read_text())
    config.update(sections)
    path = lab.root / f"nodes-{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def serving(lab: Lab, home: Path, config: Path) -> Iterator[HeadProcess]:
    """A started head on ``lab`` with cluster file ``config`` (for ``yield from`` in a
    fixture); at the end the jobs a test left are cancelled and the head stopped."""
    head = HeadProcess(home, lab, config=config)
    head.start()
    try:
        yield head
    finally:
        cancel_left_and_stop(head)


def cancel_left_and_stop(head: HeadProcess) -> None:
    """The end of a head a test served: the jobs the test left cancelled, then the head
    stopped (also when it stopped answering)."""
    try:
        for job in head.call("queue")["jobs"]:
            with contextlib.suppress(ApiError):
                head.call("cancel", job=job["id"])
    finally:
        head.stop()


@pytest.fixture
def small_cluster(openssh_lab, tmp_path):
    """The lab without node03, with a known_hosts of its own that does not know node03."""
    config = yaml.safe_load(openssh_lab.config_path.read_text())
    config["nodes"] = [n for n in config["nodes"] if n["name"] != "node03"]
    known = tmp_path / "known_hosts"
    port3 = openssh_lab.port("node03")
    known.write_text("".join(l + "\n" for l in openssh_lab.known_hosts_path.read_text().splitlines()
                             if not l.startswith(f"[127.0.0.1]:{port3} ")))
    config["cluster"]["known_hosts"] = str(known)
    path = tmp_path / "nodes.yaml"
    path.write_text("# our lab\n" + yaml.safe_dump(config, sort_keys=False))
    head = HeadProcess(tmp_path / "home", openssh_lab, config=path)
    head.start(wait_nodes=False)
    head.path, head.known = path, known
    try:
        yield head
    finally:
        head.stop()


def fingerprint(lab, node: str) -> str:
    """The node's host key's fingerprint, as ``nebula node add`` shows it to be checked."""
    return asyncssh.read_private_key(str(lab.host_key_path(node))).get_fingerprint()
