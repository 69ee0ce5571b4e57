"""A bounded wait keeps every cancel: the TUI's event stream, cancelled while the head's
lines pour in, ends, and so does the worker that reads it.

On Python 3.11 ``asyncio.wait_for`` returned the line it had just read instead of the
cancel, so a cancelled stream read on; one such worker kept a test's event loop alive
until pytest's timeout in CI.
"""

from __future__ import annotations

import asyncio
import sys

import pytest

from nebula_tui.api import AsyncClient
from nebula_tui.waits import within


async def cancelled_as_it_completes(wait) -> str:
    """What a task waiting with ``wait`` does when its cancel comes in the same turn of the
    loop as what it awaited: "cancelled", or "returned" (the cancel lost)."""
    done = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(wait(done))
    await asyncio.sleep(0)  # the task now waits
    done.set_result("a line")
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        return "cancelled"
    return "returned"


async def test_a_cancel_that_meets_a_finished_wait_is_kept():
    assert await cancelled_as_it_completes(lambda f: within(10, f)) == "cancelled"


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="3.12 rewrote wait_for on asyncio.timeout")
async def test_the_check_can_fail_with_the_wait_it_replaced():
    assert await cancelled_as_it_completes(lambda f: asyncio.wait_for(f, 10)) == "returned"


async def test_a_subscription_cancelled_while_lines_pour_in_ends(tmp_path):
    """A peer that answers a subscribe with lines as fast as it can: 40 subscriptions, each
    cancelled after a different pause, all end."""
    path = tmp_path / "s.sock"
    pouring = True

    async def flood(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readline()
        try:
            while pouring:
                writer.write(b'{"type": "tick"}\n')
                await writer.drain()
                await asyncio.sleep(0)
        except ConnectionError:
            pass
        finally:
            writer.close()  # a stream that read on past its cancel ends here

    server = await asyncio.start_unix_server(flood, str(path))
    client = AsyncClient(path)

    async def read_on() -> None:
        async for _ in client.events():
            pass

    reading_on = []
    try:
        for i in range(40):
            task = asyncio.create_task(read_on())
            await asyncio.sleep(0.001 * (i % 8))
            task.cancel()
            done, _ = await asyncio.wait([task], timeout=5)
            if not done:
                reading_on.append(task)
                break
    finally:
        pouring = False
        await asyncio.gather(*reading_on, return_exceptions=True)
        server.close()
    assert reading_on == [], "a cancelled subscription read on"
