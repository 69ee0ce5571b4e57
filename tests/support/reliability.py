"""What the reliability tests need besides the lab: a small disk to fill, and a clock of
the head's own (``HeadProcess(own_clock=True)``; see labkit.harness).

``small_disk(path, mb)`` mounts a tmpfs of that size at ``path`` (root only; CI runs as
root) and skips the test, saying why, where mounting is not allowed. ``fill(path)`` fills
the filesystem holding ``path`` to the last byte and returns the file that did it; delete
that file to give the room back.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from labkit.harness import libfaketime


@contextlib.contextmanager
def small_disk(path: Path, mb: int = 16) -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("the full-disk case mounts a small tmpfs, which needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mb}m,mode=0700", "nebula-test",
                           str(path)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill(path: Path) -> Path:
    filler = path / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for size in (1 << 20, 65536, 4096, 1):
            with contextlib.suppress(OSError):
                while os.write(fd, b"\0" * size):
                    pass
    finally:
        os.close(fd)
    return filler


def needs_own_clock() -> None:
    if libfaketime() is None:
        pytest.skip("stepping the head's clock needs libfaketime (apt-get install libfaketime)")
