"""The head's own stops of a running job — its time limit, the memory guard, idleness,
``nebula requeue`` — carried out: SIGUSR1 on each of its nodes (checkpoint now), SIGKILL
once the grace is over if it still runs, and then its end (a killed session reports no
exit). The transitions themselves are ``JobTransitions``' (``begin_stop``, ``undo_stop``,
``regrace_stop``, ``end_stop``); this room keeps their time.

A stop is in the store from its start, with when its SIGKILL is due: a head restarted
during the grace kills the job when that grace ends (``resume``), without a second SIGUSR1
and a fresh grace. The store has the stop before its SIGUSR1 goes, so a head that died in
between left a job that never got one: each node marks the SIGUSR1 it sent, the restarted
head asks for it "once", and a job that gets it only then has its whole grace. Within one
head the grace is counted on the monotonic clock; across a restart only the wall clock is
common, so the time left is the stored due time less now, held between none and one whole
grace whatever the wall clock did meanwhile.
"""

from __future__ import annotations

import asyncio
import time

from ..model import Job, JobState, Stopping, stopping
from .jobs import JobTransitions
from .state import HeadState, job_nodes

STOP_POLL_S = 0.2  # how often a stop looks whether the job ended within its grace
KILL_RETRY_MAX_S = 30.0  # the longest pause between SIGKILLs to a node that did not answer


class Stops:
    def __init__(self, state: HeadState, jobs: JobTransitions):
        self.state = state
        self.jobs = jobs

    def stop(self, job: Job, ends: JobState, why: str, grace_s: float, requeue: bool = False,
             preemption: bool = False) -> bool:
        """Stop a launched or running job: SIGUSR1 now, SIGKILL after ``grace_s`` if it
        still runs; its exit (or the kill) ends it as ``ends`` with ``why`` (``requeue``:
        back in the queue; ``preemption``: a preemptible job's, counted). False (nothing
        done) for a job already cancelling, evicting or stopping, or no longer holding
        GPUs, or while the store cannot take the stop."""
        stopping = self.jobs.begin_stop(job, ends, why, requeue, self.state.clock() + grace_s, preemption)
        if stopping is None:
            return False
        self.state.spawn(self._signal_then_kill(stopping, grace_s), f"stop-{job.id}")
        return True

    def resume(self, grace_s: float) -> None:
        """The head starts with stops under way (it was restarted during their grace):
        each job is killed when its grace ends, at most ``grace_s`` from now — once its
        nodes have been asked for its SIGUSR1 again, which they send only where it never
        went (the last head stored the stop and died before sending it); then the grace
        is a whole one, counted from that SIGUSR1."""
        for job in list(self.state.jobs.values()):
            if isinstance(job.status, Stopping):
                self.state.spawn(self._resume(job, grace_s), f"stop-{job.id}")

    async def _resume(self, job: Job, grace_s: float) -> None:
        late = await self._until_heard(job, "USR1", once=True)
        current = self._current(job)
        if current is None:
            return
        if late:
            message = (f"job {job.id} got its SIGUSR1 only after the head restarted "
                       f"({stopping(current.status).why}): SIGKILL in {grace_s:g} s if still running")
            self.state.record("reconcile", message, job_id=job.id, node=job.node)
            self.jobs.note(current, message)
            current = self.jobs.regrace_stop(current, self.state.clock() + grace_s)
        now = self.state.clock()
        await self._kill_after(job, min(grace_s, max(0.0, (stopping(current.status).kill_at or now) - now)))

    def _current(self, job: Job) -> Job | None:
        """The job as it is now, if this attempt's stop is still under way."""
        current = self.state.jobs.get(job.id)
        if current is None or current.attempt != job.attempt or not isinstance(current.status, Stopping):
            return None  # it ended (or was requeued, or cancelled) meanwhile
        return current

    async def _signal_then_kill(self, job: Job, grace_s: float) -> None:
        replies = await asyncio.gather(*(self.jobs.signal(n, job.id, "USR1") for n in job_nodes(job)))
        if not any(r.get("ok") for r in replies):
            current = self._current(job)
            if current is not None:
                self.jobs.undo_stop(current)
            return
        await self._kill_after(job, grace_s)

    async def _kill_after(self, job: Job, grace_s: float) -> None:
        """SIGKILL on each of the job's nodes after ``grace_s`` unless its stop is over by
        then; then its end. A node away (or not yet connected to a head that just
        started) is asked again, less and less often, for as long as the job is stopping."""
        deadline = time.monotonic() + grace_s
        while self._current(job) is not None and time.monotonic() < deadline:
            await asyncio.sleep(min(STOP_POLL_S, max(0.0, deadline - time.monotonic())))
        await self._until_heard(job, "KILL")
        pause = STOP_POLL_S
        while (current := self._current(job)) is not None and not self.jobs.end_stop(current):
            await asyncio.sleep(pause)  # the store cannot take its end yet
            pause = min(2 * pause, KILL_RETRY_MAX_S)

    async def _until_heard(self, job: Job, name: str, once: bool = False) -> bool:
        """SIG``name`` to each of the job's nodes, and again, less and less often, to those
        that did not answer (away, or not yet connected to a head that just started), for
        as long as its stop is under way. True if a node sent its first SIGUSR1 only now."""
        left, pause, first = job_nodes(job), STOP_POLL_S, False
        while self._current(job) is not None:
            replies = await asyncio.gather(*(self.jobs.signal(n, job.id, name, once) for n in left))
            first = first or any(r.get("first") for r in replies)
            left = [n for n, r in zip(left, replies) if not r.get("ok")]
            if not left:
                break
            await asyncio.sleep(pause)
            pause = min(2 * pause, KILL_RETRY_MAX_S)
        return first
