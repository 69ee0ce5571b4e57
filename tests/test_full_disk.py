"""A full disk under the head's home: refused with what it is, nothing stored is lost, and
nothing is handed out twice once there is room again."""

from __future__ import annotations

import sqlite3

import pytest

from reliability import fill, small_disk
from nebula_tui.model import JobSpec
from nebula_tui.store import Store


def test_a_submit_on_a_full_disk_fails_and_loses_nothing(tmp_path):
    with small_disk(tmp_path / "home", mb=8) as home:
        store = Store(home / "state.db")
        kept = [store.add_job("alice", JobSpec(command=("true",)), float(t)).id for t in range(20)]
        filler = fill(home)
        with pytest.raises(sqlite3.OperationalError, match="full"):
            for t in range(2000):  # the WAL's free pages take a few
                store.add_job("alice", JobSpec(command=("x" * 4000,)), 100.0 + t)
        filler.unlink()
        after = store.add_job("alice", JobSpec(command=("true",)), 9999.0).id
        assert [j.id for j in store.jobs()][:20] == kept
        assert after not in {j.id for j in store.jobs()[:-1]}
        store.close()
        reopened = Store(home / "state.db")
        assert reopened.add_job("alice", JobSpec(command=("true",)), 10000.0).id == after + 1
        reopened.close()
