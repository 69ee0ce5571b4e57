"""A clone of the repository alone passes ``make test``: what the tests read lives inside it."""

from __future__ import annotations

import re
from pathlib import Path

from support.samples import SAMPLES

REPO = Path(__file__).resolve().parents[2]


def test_samples_are_in_the_repository_with_their_sources():
    assert SAMPLES.resolve().is_relative_to(REPO), SAMPLES
    folders = [p for p in SAMPLES.iterdir() if p.is_dir()]
    assert len(folders) >= 7
    for folder in folders:
        assert (folder / "SOURCES.md").is_file(), folder


def test_no_test_reads_outside_the_repository():
    """Neither a test nor a file beside them (data, their sources) names the ``shared``
    folder that sits beside a checkout but not beside a clone."""
    outside = re.compile(r"""\.\./shared|parents\[[2-9]\]\s*/\s*["']shared""")
    offenders = [str(p.relative_to(REPO)) for p in REPO.joinpath("tests").rglob("*")
                 if p.is_file() and p.suffix in (".py", ".md", ".json", ".txt", ".csv")
                 and outside.search(p.read_text(errors="replace"))]
    assert offenders == []
