"""A store on a real SQLite file with two 24 GiB cards registered, and a job to put in it:
the fixtures ``db_path`` and ``store``, and the constants the store's tests charge by; and a replay of
every allocation a store ever made, for the tests that kill a head again and again."""

from __future__ import annotations

import sqlite3
from collections import defaultdict

import pytest

from nebula_tui.model import JobSpec, Placement
from nebula_tui.store import Store

T0 = 1_700_000_000.0
HOUR = 3600.0
CARD_MB = 24576

SPEC = JobSpec(command=("python", "train.py", "--lr", "3e-4"), name="train", gpu_count=2,
               gpu_mem_mb=8192, workdir="/data/x", shell=False)
SLICES = (Placement("GPU-a", "node01", 0, 8192, False),   # a third of a 24 GiB card
          Placement("GPU-b", "node01", 1, CARD_MB, True))  # the whole card


@pytest.fixture
def db_path(tmp_path):
    return tmp_path / "state.db"


@pytest.fixture
def store(db_path):
    s = Store(db_path)
    s.register_gpus("node01", [
        {"uuid": "GPU-a", "idx": 0, "model": "RTX 4090", "total_mb": CARD_MB},
        {"uuid": "GPU-b", "idx": 1, "model": "RTX 4090", "total_mb": CARD_MB},
    ], T0)
    yield s
    s.close()


def never_overcommitted(db_path) -> None:
    """Replay every allocation ever made: at no moment was a GPU promised twice."""
    db = sqlite3.connect(db_path)
    totals = dict(db.execute("SELECT uuid, total_mb FROM gpus"))
    changes = defaultdict(list)
    for gpu, mem, excl, start, end in db.execute(
            "SELECT gpu_uuid, memory_mb, exclusive, created_at, COALESCE(released_at, 1e18) FROM allocations"):
        changes[gpu] += [(start, 1, mem, excl), (end, -1, mem, excl)]
    for gpu, events in changes.items():
        held = count = exclusive = 0
        for _, sign, mem, excl in sorted(events, key=lambda e: (e[0], e[1])):  # releases first
            held += sign * mem
            count += sign
            exclusive += sign * excl
            assert held <= totals[gpu] and count <= 4, f"{gpu} over-committed"
            assert not exclusive or count == 1, f"{gpu}: an exclusive card was shared"
