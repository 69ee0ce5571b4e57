"""The suite's fixture plugin (``pytest_plugins`` in ``tests/conftest.py``): every fixture
more than one test module uses is registered here, so a test names it as an argument and
imports nothing for it. Each is defined beside the helpers it goes with."""

from __future__ import annotations

import pytest

from labkit.harness import HeadProcess
from support.demo import headless_demo  # noqa: F401  (fixture)
from support.inprocess import engine, served  # noqa: F401  (fixtures)
from support.labfixtures import asyncssh_lab, openssh_lab, small_cluster  # noqa: F401  (fixtures)
from support.nodelets import nodelet  # noqa: F401  (fixture)
from support.slurmfixtures import slurm_lab  # noqa: F401  (fixture)
from support.stores import db_path, store  # noqa: F401  (fixtures)
from support.users import ALICE, BOB, BOX_GROUP, GROUP, MALLORY, STRANGER, VICTOR, lab_users, shared_head


@pytest.fixture(scope="module")
def head(openssh_lab, tmp_path_factory):
    """A fresh head service (own store and socket) on the session's OpenSSH lab."""
    h = HeadProcess(tmp_path_factory.mktemp("home"), openssh_lab)
    h.start()
    try:
        yield h
    finally:
        h.stop()


@pytest.fixture(scope="module")
def users():
    """Alice and Bob in ``GROUP`` and Eve outside it, for the module (root only)."""
    yield from lab_users(GROUP, (ALICE, BOB), (STRANGER,))


@pytest.fixture(scope="module")
def shared(openssh_lab, users, tmp_path_factory):
    """A shared-box head for ``GROUP`` on the session's lab."""
    yield from shared_head(openssh_lab, tmp_path_factory, GROUP)


@pytest.fixture(scope="module")
def box_users():
    """Mallory and Victor in ``BOX_GROUP``, for the module (root only)."""
    yield from lab_users(BOX_GROUP, (MALLORY, VICTOR), ())


@pytest.fixture(scope="module")
def box_shared(openssh_lab, box_users, tmp_path_factory):
    """A shared-box head for ``BOX_GROUP`` on the session's lab."""
    yield from shared_head(openssh_lab, tmp_path_factory, BOX_GROUP)
