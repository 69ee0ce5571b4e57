"""Build the simulated lab's C libraries (the NVML and CUDA driver stand-ins) with the
system C compiler (``cc``), once per source version, into a cache shared by every lab of
this user, so a test session compiles each once.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path


def build(source: Path, library: str, flags: tuple[str, ...] = (), tag: str = "",
          libs: tuple[str, ...] = ()) -> Path | None:
    """``library`` built from ``source`` (and the headers beside it) with ``flags``, cached
    by their contents; None without a C compiler or when it does not build (the lab then
    goes without that library)."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    text = source.read_bytes() + b"".join(h.read_bytes() for h in sorted(source.parent.glob("*.h")))
    digest = hashlib.sha256(text + " ".join(flags).encode()).hexdigest()[:16]
    target = (Path(tempfile.gettempdir()) / f"nebula-{source.stem}-{os.getuid()}"
              / f"{digest}{'-' + tag if tag else ''}" / library)
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = target.with_name(f".{library}.{os.getpid()}")
    done = subprocess.run([compiler, "-shared", "-fPIC", "-O2", *flags, "-o", str(scratch),
                           str(source), *libs], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        scratch.unlink(missing_ok=True)
        return None
    os.replace(scratch, target)  # atomic: two labs building at once both end with one file
    return target


def link(built: Path | None, node_dir: Path, library: str) -> bool:
    """Put ``built`` in the node's ``lib/`` (on its LD_LIBRARY_PATH) as ``library``; None
    leaves it without one. Returns whether it has one."""
    lib = node_dir / "lib"
    lib.mkdir(exist_ok=True)
    (lib / library).unlink(missing_ok=True)
    if built is None:
        return False
    os.symlink(built, lib / library)
    return True
