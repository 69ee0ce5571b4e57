"""Where the real tool outputs are: ``tests/data/samples`` in this repository, copied
unchanged from the real machines' outputs (each folder's ``SOURCES.md`` says where from),
so a clone of the repository alone runs the tests. ``$NEBULA_SAMPLES`` points elsewhere."""

from __future__ import annotations

import os
from pathlib import Path

SAMPLES = Path(os.environ.get("NEBULA_SAMPLES") or Path(__file__).resolve().parent / "data" / "samples")
