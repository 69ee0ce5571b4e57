"""Import hygiene (STYLE rule 1): the pure core and the CLI entry stay light.

Each check imports in a fresh interpreter, so modules loaded by other tests (or by pytest
plugins) in this process cannot hide or fake a result.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


REPO = Path(__file__).resolve().parents[2]


def loaded_after_import(module: str, watched: tuple[str, ...]) -> list[str]:
    """The top-level packages among ``watched`` present in sys.modules after importing."""
    code = (
        "import importlib, json, sys\n"
        f"importlib.import_module({module!r})\n"
        f"watched = {watched!r}\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} & set(watched))))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_probe_detects_a_loaded_module():
    # The check itself must be able to fail: json is surely loaded by its own print.
    assert loaded_after_import("nebula_tui.scheduler", ("json",)) == ["json"]


def test_scheduler_imports_no_io_or_ui_library():
    forbidden = ("textual", "asyncssh", "sqlite3", "sqlite_utils", "yaml", "rich")
    assert loaded_after_import("nebula_tui.scheduler", forbidden) == []


def test_cli_entry_imports_no_tui_ssh_or_store():
    # `nebula status` is a small client of the head service: it must start fast.
    forbidden = ("textual", "asyncssh", "sqlite_utils")
    assert loaded_after_import("nebula_tui.cli", forbidden) == []
