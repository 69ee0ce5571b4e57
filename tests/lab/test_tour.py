"""The README's tour, line by line, on `nebula demo --headless`: what a newcomer types
first must run (it named a `train.py` nobody had)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest


pytestmark = pytest.mark.lab  # a demo of its own

REPO = Path(__file__).resolve().parents[2]


def tour_commands() -> list[str]:
    """The tour's shell block, its continuation lines joined, comments kept (bash drops them)."""
    text = (REPO / "README.md").read_text()
    block = text.split("## A short tour", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    return [line for line in re.sub(r"\\\n\s*", "", block).splitlines() if line.strip()]


@pytest.mark.slow
def test_the_readmes_tour_runs_on_the_demo(headless_demo, tmp_path):  # noqa: F811
    _, client_env, _ = headless_demo
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "nebula").write_text(f'#!/bin/sh\nexec {sys.executable} -m nebula_tui "$@"\n')
    (shim / "nebula").chmod(0o755)
    env = {**client_env, "PATH": f"{shim}:{os.environ['PATH']}"}
    ran = []
    for line in tour_commands():
        words = line.split("#")[0].split()
        if words[:2] == ["nebula", "demo"] or words[0] == "export" or words == ["nebula"]:
            continue  # the demo runs already (its own home); the TUI is tested elsewhere
        follows = "-f" in words
        # a variable a line sets (`job=$(nebula submit …)`) is there for the lines after it
        kept = tmp_path / "vars"
        keep = f'for v in $(compgen -v); do case $v in [a-z]*) printf "%s=%s\\n" "$v" "${{!v}}";; esac; done > {kept}'
        script = (f"timeout 8 {line}" if follows else line) + f"\nrc=$?; {keep}; exit $rc"
        done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True,
                              timeout=120, cwd=tmp_path)
        env.update(dict(v.split("=", 1) for v in kept.read_text().splitlines() if "=" in v and v[0].islower()))
        if follows:  # follows the job until it ends: cut short, having shown its lines
            assert done.returncode == 124 and "cards: " in done.stdout, (line, done.stderr)
        else:
            assert done.returncode == 0, (line, done.stdout, done.stderr)
        ran.append(words[1] if words[0] == "nebula" else line.split("$(", 1)[1].split()[1])
    assert {"status", "submit", "queue", "logs", "job", "cancel", "gpus", "doctor", "sim"} <= set(ran)
    assert env.get("job", "").isdigit(), "the tour's job id, printed and kept"
    assert not any(re.search(r"nebula (logs|job|cancel) \d", line) for line in tour_commands()), \
        "the tour names its job by the id it printed, never a number that depends on the history"
