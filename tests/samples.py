"""Where the real tool outputs are: the nearest ``shared/samples`` above this checkout
(``/work/main`` and a worktree in ``/work/wt/NAME`` both find ``/work/shared/samples``),
or ``$NEBULA_SAMPLES``."""

from __future__ import annotations

import os
from pathlib import Path


def find_samples() -> Path:
    if os.environ.get("NEBULA_SAMPLES"):
        return Path(os.environ["NEBULA_SAMPLES"])
    for parent in Path(__file__).resolve().parents:
        candidate = parent / "shared" / "samples"
        if candidate.is_dir():
            return candidate
    return Path(__file__).resolve().parents[2] / "shared" / "samples"


SAMPLES = find_samples()
