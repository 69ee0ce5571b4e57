"""A bounded await, the one way the package waits with a time limit.

Not ``asyncio.wait_for``: on Python 3.11 it swallows a cancel that arrives while the thing
awaited has just finished (CPython gh-86296, fixed by 3.12's rewrite), so a loop cancelled
at that moment runs on. A TUI's event stream did: the worker outlived its app, and the
test's event loop waited for it until pytest's timeout. ``asyncio.timeout`` keeps every
cancel, on every version the package supports.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def within(seconds: float | None, awaitable: Awaitable[T]) -> T:
    """``await awaitable``; TimeoutError after ``seconds`` (None: no limit)."""
    async with asyncio.timeout(seconds):
        return await awaitable
