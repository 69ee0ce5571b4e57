"""The store's side of the pools (``head/pools.py``): a job sent to a pool (the intent
first, then the pool's id for it), running there, or let go.
"""

from __future__ import annotations

from ..model import Placement
from .base import StaleDecision, StoreBase


class Pools(StoreBase):
    """The ``pool_jobs`` table and a pool job's row in ``jobs``."""

    def send_to_pool(self, job_id: int, pool: str, account: str, token: str, log_path: str,
                     reason: str, t: float) -> None:
        """The intent of sending a waiting job to a pool, before the pool is asked: the job
        is the pool's from now on, and ``token`` names the submission there (a head that
        restarts before the pool's answer finds the job by it). StaleDecision when the job
        no longer waits (cancelled, or placed here meanwhile)."""
        with self.transaction():
            changed = self.db.execute(
                "UPDATE jobs SET pool = ?, reason = ? WHERE id = ? AND state = 'pending' "
                "AND held_by IS NULL", [pool, reason, job_id]).rowcount
            if not changed:
                raise StaleDecision(f"job {job_id} is no longer waiting")
            self.db.execute(
                "INSERT OR REPLACE INTO pool_jobs (job_id, pool, account, token, remote_id, "
                "log_path, sent_at, note) VALUES (?, ?, ?, ?, NULL, ?, ?, '')",
                [job_id, pool, account, token, log_path, t])
            attempt = self.db.execute("SELECT attempt FROM jobs WHERE id = ?", [job_id]).fetchone()[0]
            self.db.execute("INSERT OR IGNORE INTO launches (token, job_id, attempt, t) "
                            "VALUES (?, ?, ?, ?)", [token, job_id, attempt, t])
            self._event(t, "pool", f"job {job_id} {reason}", job_id=job_id)

    def pool_submitted(self, job_id: int, remote_id: str, log_path: str, t: float) -> None:
        """The pool took the job as ``remote_id``; its output goes to ``log_path`` there."""
        with self.transaction():
            self.db.execute("UPDATE pool_jobs SET remote_id = ?, log_path = ? WHERE job_id = ?",
                            [remote_id, log_path, job_id])
            pool = self.db.execute("SELECT pool FROM pool_jobs WHERE job_id = ?", [job_id]).fetchone()
            self._event(t, "pool", f"job {job_id} is job {remote_id} in pool {pool[0] if pool else '?'}",
                        job_id=job_id)

    def pool_jobs(self) -> dict[int, dict]:
        """Job id -> its pool row, for every job sent to a pool that has not ended."""
        rows = self.db.execute(
            "SELECT p.job_id, p.pool, p.account, p.token, p.remote_id, p.log_path, p.sent_at "
            "FROM pool_jobs p JOIN jobs j ON j.id = p.job_id "
            "WHERE j.state IN ('pending', 'launching', 'running')").fetchall()
        keys = ("job_id", "pool", "account", "token", "remote_id", "log_path", "sent_at")
        return {r[0]: dict(zip(keys, r)) for r in rows}

    def charge_pool_runs(self, job_id: int, gpu_hours: float, t: float, why: str) -> float:
        """Charge a pool job for runs of its Slurm id the head never saw end (requeued there
        between two polls): ``gpu_hours`` times its charge, to the job and its user; returns
        what was charged."""
        with self.transaction():
            row = self.db.execute("SELECT user, charge FROM jobs WHERE id = ?", [job_id]).fetchone()
            if row is None:
                return 0.0
            charged = max(0.0, gpu_hours) * (1.0 if row[1] is None else row[1])
            self.db.execute("UPDATE jobs SET gpu_hours = gpu_hours + ? WHERE id = ?", [charged, job_id])
            self.db.execute("UPDATE users SET gpu_hours = gpu_hours + ? WHERE name = ?", [charged, row[0]])
            self._event(t, "pool", f"job {job_id} {why}", job_id=job_id)
        return charged

    def leave_pool(self, job_id: int, t: float, why: str) -> None:
        """The pool let the job go without ending it (preempted, not requeued there): it
        waits here again as the lab's, and a later send gives it a new token."""
        with self.transaction():
            self.db.execute("UPDATE jobs SET pool = NULL WHERE id = ?", [job_id])
            self.db.execute("DELETE FROM pool_jobs WHERE job_id = ?", [job_id])
            self._event(t, "pool", f"job {job_id} {why}", job_id=job_id)

    def pool_job(self, job_id: int) -> dict | None:
        """A job's pool row, ended or not."""
        row = self.db.execute(
            "SELECT job_id, pool, account, token, remote_id, log_path, sent_at FROM pool_jobs "
            "WHERE job_id = ?", [job_id]).fetchone()
        keys = ("job_id", "pool", "account", "token", "remote_id", "log_path", "sent_at")
        return dict(zip(keys, row)) if row else None

    def pool_running(self, job_id: int, placements: tuple[Placement, ...], started_at: float,
                     t: float) -> None:
        """A pool job started there (its nodes' GPUs as ``placements``, ``pool:node``)."""
        with self.transaction():
            changed = self.db.execute(
                "UPDATE jobs SET state = 'running', node = ?, reason = '', started_at = ?, "
                "launch_token = (SELECT token FROM pool_jobs WHERE job_id = ?) "
                "WHERE id = ? AND state = 'pending'",
                [placements[0].node, started_at, job_id, job_id]).rowcount
            if not changed:
                return
            self._allocate(job_id, placements, t)
            nodes = ", ".join(dict.fromkeys(p.node for p in placements))
            self._event(t, "start", f"job {job_id} started on {nodes}", job_id=job_id,
                        node=placements[0].node)
