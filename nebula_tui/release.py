"""The release that runs (``nebula --version``, and what the store writes in its database),
and the order of two releases: a database a newer release wrote is refused by an older one."""

from __future__ import annotations

import functools
import re


@functools.cache
def running() -> str:
    """This installation's version ("unknown" in a source tree never installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("nebula-tui")
    except PackageNotFoundError:
        return "unknown"


def _key(text: str) -> tuple[int, ...] | None:
    found = re.match(r"(\d+(?:\.\d+)*)", text or "")
    return tuple(int(p) for p in found.group(1).split(".")) if found else None


def newer(than: str, version: str) -> bool:
    """Whether ``version`` is a later release than ``than`` (unknowns are never newer)."""
    a, b = _key(than), _key(version)
    return a is not None and b is not None and b > a
