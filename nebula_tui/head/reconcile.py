"""Reconcile: after every (re)connect of a node, the node and the store are made to agree.

What the store has launching, running or being cancelled on the node is held against the
node's own list of its job directories and live sessions (the nodelet's ``list``): launches
it never saw are made, cancels sent again, stale sessions of this store's stopped, and ends
the store lost recorded. After a restore of the store from a backup, what the node ran
since is taken in (``JobTransitions.adopt_unknown``) once what the store holds there is
settled, before anything is scheduled.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from ..model import FINISHED_STATES, Cancelling, Evicting, JobState, NodeState, Stopping, launching
from ..remote.protocol import Exit, job_number, node_time
from ..remote.ssh import NodeUnavailable
from ..store import StoreUnavailable
from .jobs import CANCEL_GRACE_S, JobTransitions
from .state import HeadState, job_nodes

log = logging.getLogger(__name__)


class Reconciler:
    #: how long after a store failure a reconcile is tried again, the node still connected
    retry_s = 15.0

    def __init__(self, state: HeadState, transitions: JobTransitions):
        self.state = state
        self.transitions = transitions
        self._retrying: set[str] = set()

    async def reconcile(self, node: str) -> None:
        """After (re)connecting, make the node and the store agree (R23).

        Launch intents the node never saw are carried out (the launch token makes that
        idempotent); cancels it missed are sent again; sessions of launches this store
        issued whose job is no longer this node's (declared lost and requeued meanwhile) are
        stopped, so no job runs twice. Exits the node recorded while we were away arrive as
        exit messages; a job running here by the store that the node has no record of, or
        whose end the node has and the store lost, is ended (no job "runs" without a
        process). After a restore of the store, the ends the node has of jobs the store has
        running are recorded first, then launches it does not know are taken in
        (``JobTransitions.adopt_unknown``), before anything is scheduled.
        """
        state, transitions = self.state, self.transitions
        try:
            if state.owes_restore_reconcile(node):  # first: before any relaunch of an older attempt
                held = self._held_here(node)
                late = node in state.late_after_restore
                listing = await state.links[node].request("list", records=True)
                attempts = listing.get("attempts") or {}
                # Ends before starts: a launch after the backup may hold a card only because
                # a job the backup has running (or launching: the backup was taken between
                # its intent and its node's answer) there ended meanwhile. Recorded after it
                # was taken in, that end would leave both on the card for the store.
                self._confirm_the_launched(node, attempts, held)
                self._end_the_unrecorded(node, attempts, held, listing.get("session_tokens") or {},
                                         unacked=True)
                transitions.adopt_unknown(node, attempts, listing.get("session_tokens") or {})
                if late:
                    self._stop_the_untaken(node, listing.get("session_tokens") or {})
                state.reconciled_after_restore(node)
            for job in state.jobs.on(node):
                if node in job_nodes(job) and job.state == JobState.LAUNCHING:
                    await transitions.launch(job, only=node)
                if node in job_nodes(job) and isinstance(job.status, Cancelling):
                    state.spawn(transitions.cancel_on_node(job, only=node), f"cancel-{job.id}")
            # Only launches the node had answered before it was asked for its list can be
            # missing from the list: one that starts while the list is on its way is not.
            running = self._running_here(node)
            listing = await state.links[node].request("list")
            self._stop_the_stale(node, listing.get("session_tokens") or {})
            self._end_the_unrecorded(node, listing.get("attempts") or {}, running,
                                     listing.get("session_tokens") or {})
        except (NodeUnavailable, asyncio.TimeoutError):
            return  # the next connection reconciles again
        except StoreUnavailable as err:
            log.warning("reconcile of %s stopped: %s", node, err)
            if node not in self._retrying:  # else a node owed a restore's answer stays blocked
                self._retrying.add(node)
                state.spawn(self._again(node), f"reconcile-again-{node}")

    async def _again(self, node: str) -> None:
        """The reconcile the store stopped, after ``retry_s``, while the node is still up (a
        reconnect reconciles anyway)."""
        try:
            await asyncio.sleep(self.retry_s)
        finally:
            self._retrying.discard(node)
        view = self.state.nodes.get(node)
        if view is not None and view.state == NodeState.UP:
            await self.reconcile(node)

    def _stop_the_stale(self, node: str, sessions: dict) -> None:
        state = self.state
        for job_id, token in _live(sessions):
            current = state.jobs.get(job_id)
            if state.ours(token) and (current is None or node not in job_nodes(current)
                                      or token != state.token(current)):
                log.warning("stopping stale session of job %s on %s", job_id, node)
                self._stop_copy(node, job_id, token, f"stopped a stale copy of job {job_id} on {node}",
                                "stale")

    def _stop_the_untaken(self, node: str, sessions: dict) -> None:
        """A node back after the restore wait: a live session of a launch made since the
        backup that ``adopt_unknown`` did not take in is of a job the head has given other
        cards (or ended) while it went on without this node. Nothing accounts for this copy,
        and the cards it holds look free: it is stopped, as a lost node's stale copies are."""
        state = self.state
        for job_id, token in _live(sessions):
            if not isinstance(token, str) or state.ours(token):
                continue
            where = state.jobs.get(job_id)
            now = (f"it runs on {', '.join(job_nodes(where))}" if where is not None and job_nodes(where)
                   else "the head has it otherwise")
            log.warning("stopping job %s's copy on %s launched after the backup: %s", job_id, node, now)
            self._stop_copy(node, job_id, token, f"stopped a copy of job {job_id} on {node} launched "
                            f"after the restored backup; {now}", "untaken")

    def _stop_copy(self, node: str, job_id: int, token: str, said: str, kind: str) -> None:
        """Stop the session of ``job_id``'s launch ``token`` on ``node``, ``said`` in the log."""
        self.state.record("reconcile", said, job_id=job_id, node=node)
        self.state.spawn(self._stop_stale(node, job_id, token), f"{kind}-{job_id}")

    def _running_here(self, node: str) -> dict[int, str | None]:
        """The jobs (id -> token) the store has running on ``node`` now."""
        return {j.id: self.state.token(j) for j in self.state.jobs.on(node)
                if j.state == JobState.RUNNING and node in job_nodes(j)}

    def _held_here(self, node: str) -> dict[int, str | None]:
        """The jobs (id -> token) the store has launching or running on ``node`` now."""
        return {j.id: self.state.token(j) for j in self.state.jobs.on(node)
                if j.state.holds_gpus and node in job_nodes(j)}

    def _confirm_the_launched(self, node: str, attempts: dict, held: dict[int, str | None]) -> None:
        """After a restore: a job the store has launching whose launch this node started (the
        backup was taken before the node's answer) is confirmed here, as ``launch`` would
        have, and running once every node of it has, from when its node started it (so its
        run is charged); its end, if it has one, is then recorded like any running job's."""
        for job_id, token in held.items():
            job = self.state.jobs.get(job_id)
            if job is None or job.state != JobState.LAUNCHING or self.state.token(job) != token:
                continue
            found = _attempt(attempts, job_id, token)
            if found is None or not found.get("started"):
                continue  # the launch never got here, or not that far: it is made below
            confirmed = launching(job.status).confirmed | {node}
            if confirmed >= set(job_nodes(job)):
                at = found.get("started_at")
                self.transitions.mark_running(job, at if isinstance(at, (int, float)) else None)
            else:
                self.transitions.confirm(job, confirmed)

    def _end_the_unrecorded(self, node: str, attempts: dict, running: dict[int, str | None], sessions: dict,
                            unacked: bool = False) -> None:
        """Running jobs of this node the node itself says are over: it has no record of
        their launch (its job directory went), or it has their end, acknowledged, which the
        store lost (a restore: settled as the head had recorded it, ``_end_from_record``).
        Unacknowledged ends it reports by itself, unless ``unacked`` (after a restore: they
        must be recorded before what ran later is taken in). ``running``: the jobs (id ->
        token) that ran here before the node was asked for ``attempts``; ``sessions``: the
        live sessions' launches (job -> token) then."""
        for job_id, token in running.items():
            job = self.state.jobs.get(job_id)
            if job is None or not job.state.holds_gpus or self.state.token(job) != token:
                continue  # ended or launched again meanwhile: the list says nothing of it
            found = _attempt(attempts, job.id, token)
            if job.state == JobState.LAUNCHING and found is None:
                continue  # its launch has not reached the node: reconcile makes it
            if found is None and token:
                self.transitions.finish(job, JobState.FAILED, None, f"{node} has no record of "
                                        "its launch (its job directory was removed?)")
            elif found is not None and (unacked or found.get("acked")):
                self._end_from_record(node, job, found, sessions.get(str(job.id)) in (token, ""), unacked)

    def _end_from_record(self, node: str, job, found: dict, live: bool, unacked: bool) -> None:
        """The end the head recorded and acked (``ended_as``: a restore lost it), else the exit
        the node has: its code, or none once its session is gone (killed after a cancel's grace)."""
        code = found.get("exit_code") if isinstance(found.get("exit_code"), int) else None
        ended_as = found.get("ended_as")
        end: dict[str, Any] = ended_as if isinstance(ended_as, dict) else {}
        if end.get("state") in FINISHED_STATES:
            at = end.get("at") if isinstance(end.get("at"), (int, float)) else None
            at = at if at is not None and (job.started_at or 0) <= at <= self.state.clock() else None
            self.state.record("reconcile", f"job {job.id}'s end on {node} taken from the node's record",
                              job_id=job.id, node=node)
            self.transitions.finish(job, JobState(end["state"]), code, str(end.get("reason") or "")[:500], at=at)
        elif code is not None or not (live or (not unacked and isinstance(job.status, (Stopping, Evicting)))):
            # (a job the head stops itself is acked at its SIGKILL: the stop ends it)
            ended = found.get("ended_at")
            self.transitions.on_exit(node, Exit(job=job.id, token=found.get("token"), code=code,
                                                reason=str(found.get("reason") or ""),
                                                at=node_time(ended)))

    async def _stop_stale(self, node: str, job_id: int, token: str) -> None:
        # With its token: a relaunch that took the session's place meanwhile is left alone.
        with contextlib.suppress(NodeUnavailable, asyncio.TimeoutError):
            await self.state.links[node].request("cancel", timeout=CANCEL_GRACE_S + 30, job=job_id,
                                                 grace=CANCEL_GRACE_S, token=token)


def _live(sessions: dict):
    """(job id, token) of each live session in a node's ``list`` (job -> token), names that
    are not a job's number left out."""
    for name, token in sessions.items():
        job_id = job_number(int(name) if name.isdigit() else 0)
        if job_id:
            yield job_id, token


def _attempt(attempts: dict, job_id: int, token: str | None) -> dict | None:
    """The node's record of the launch of job ``job_id`` with ``token`` (the nodelet's
    ``list``: job -> attempt -> record), or None when it has none."""
    return next((a for a in (attempts.get(str(job_id)) or {}).values()
                 if isinstance(a, dict) and a.get("token") == token), None)
