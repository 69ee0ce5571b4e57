"""Group commit: a submit is answered only once it is on the disk, but submits that come
together share one sync of the store's WAL, done off the head's loop.

The head is the real ``Engine`` over a real store file (``inprocess``); the sync is the
store's own, slowed down so that submits pile up behind it as they do behind a slow disk.
"""

from __future__ import annotations

import asyncio
import getpass
import threading
import time

import pytest


from nebula_tui.model import JobSpec
from nebula_tui.store import StoreUnavailable

ME = getpass.getuser()


async def test_submits_that_come_together_share_a_sync_and_each_waits_for_one_after_it(engine):
    store = engine.store
    committed: list[int] = []  # ids in commit order (the loop's thread)
    syncs: list[tuple[int, float]] = []  # (commits it covers, when it ended)
    add_job, sync = store.add_job, store.sync_to_disk
    on_loop = threading.get_ident()

    def counting_add_job(*args, **kwargs):
        job = add_job(*args, **kwargs)
        committed.append(job.id)
        return job

    def slow_sync():
        assert threading.get_ident() != on_loop  # the loop goes on meanwhile
        covered = len(committed)  # every commit made before the sync began
        time.sleep(0.05)
        sync()
        syncs.append((covered, time.monotonic()))

    store.add_job, store.sync_to_disk = counting_add_job, slow_sync

    async def submit() -> tuple[int, float]:
        job = await engine.submit_on_disk(ME, JobSpec(command=("true",)))
        return job.id, time.monotonic()

    answers = []
    for _ in range(4):  # four bursts, the next arriving while the last one's sync is on its way
        answers += [asyncio.ensure_future(submit()) for _ in range(10)]
        await asyncio.sleep(0.02)
    answered = await asyncio.gather(*answers)

    assert len(answered) == 40 and len(syncs) < 10, syncs  # one sync serves many submits
    for job_id, at in answered:
        place = committed.index(job_id) + 1
        assert any(covered >= place and ended <= at for covered, ended in syncs), (job_id, syncs)
    assert sorted(j.id for j in store.jobs()) == sorted(committed)


async def test_a_sync_that_fails_is_said_to_the_submit_in_one_sentence(engine):
    def failing_sync():
        raise StoreUnavailable("the head could not write its database (x): the disk failed "
                               "(I/O error); the jobs just submitted may be lost if the machine "
                               "crashes now")

    engine.store.sync_to_disk = failing_sync
    with pytest.raises(StoreUnavailable, match="may be lost if the machine crashes"):
        await engine.submit_on_disk(ME, JobSpec(command=("true",)))
    engine.store.sync_to_disk = lambda: None
    await engine.submit_on_disk(ME, JobSpec(command=("true",)))  # the next sync is a new one
