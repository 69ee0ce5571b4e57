"""Releases: `nebula --version` says the installed one, the database notes which release
wrote it, and an older release refuses a database a newer one wrote, in one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from nebula_tui import release
from nebula_tui.head.serve import REFUSED
from nebula_tui.store import DatabaseNewer, Store

REPO = Path(__file__).resolve().parents[2]


def test_version_is_the_one_in_pyproject():
    declared = next(line.split('"')[1] for line in (REPO / "pyproject.toml").read_text().splitlines()
                    if line.startswith("version = "))
    done = subprocess.run([sys.executable, "-m", "nebula_tui", "--version"], capture_output=True,
                          text=True, check=True)
    assert done.stdout == f"nebula {declared}\n"


def test_releases_are_ordered_by_number_not_text():
    assert release.newer("0.2.0", "0.10.0") and not release.newer("0.10.0", "0.2.0")
    assert not release.newer("0.2.0", "0.2.0") and not release.newer("0.2.0", "unknown")


def _written_by(path: Path, version: str) -> None:
    store = Store(path)
    with store.transaction():
        store._set_meta("release", version)
    store.close()


def test_the_store_notes_its_release_and_refuses_a_newer_ones_database(tmp_path):
    db = tmp_path / "nebula.db"
    store = Store(db)
    assert store._meta("release") == release.running()
    store.close()
    _written_by(db, "99.0.0")
    with pytest.raises(DatabaseNewer, match=r"written by NebulaGrid 99\.0\.0, newer than this one"):
        Store(db)
    _written_by(tmp_path / "old.db", "0.0.1")  # an older release's opens, and is this one's now
    assert Store(tmp_path / "old.db")._meta("release") == release.running()


def test_serve_refuses_a_newer_database_in_one_line(tmp_path):
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    _written_by(home / "state.db", "99.0.0")
    (tmp_path / "nodes.yaml").write_text("cluster: {name: t}\nnodes: []\n")
    done = subprocess.run([sys.executable, "-m", "nebula_tui", "serve", "--config",
                           str(tmp_path / "nodes.yaml")], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "NEBULA_HOME": str(home)})
    assert done.returncode == REFUSED
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "written by NebulaGrid 99.0.0" in lines[0], done.stderr
