"""The store's accounting: what a run is charged when it ends (its GPU-hours, and what its
cards did meanwhile, from telemetry), users and their quotas, and the sums the head's
reports, fair share and quotas read.
"""

from __future__ import annotations

from ..model import DEFAULT_CHARGE_REFERENCE_MB, IDLE_UTIL_PCT, JobState, charged_gpu_hours
from .base import StoreBase, chunks
from .telemetry import SAMPLE_WEIGHT_SQL

FINISHED_SQL = ", ".join(f"'{s.value}'" for s in JobState if s.finished)
#: A job that counts towards its user's fair share (R6): finished after it ran (one
#: cancelled while it waited, or failed because its --after job failed, used nothing).
COUNTED_SQL = f"state IN ({FINISHED_SQL}) AND (started_at IS NOT NULL OR gpu_hours > 0)"
#: jobs submitted without --preemptible (the spec is the job's JSON)
_NOT_PREEMPTIBLE = "AND NOT COALESCE(json_extract(spec, '$.preemptible'), 0) "


class Accounting(StoreBase):
    """Charging runs; the ``users`` table; sums over ``jobs``, ``allocations`` and
    ``telemetry``."""

    #: What accounting keeps of a job besides the job itself (see ``_charge_run``).
    USAGE_COLUMNS = ("gpu_hours", "sampled_gpu_hours", "busy_gpu_hours", "idle_gpu_hours",
                     "mem_used_mb_mean", "mem_used_mb_peak", "forecast_at", "forecast_early",
                     "forecast_late")

    def _charge_run(self, job_id: int, started_at: float | None, t: float,
                    gpus: int | None = None,
                    reference_mb: int = DEFAULT_CHARGE_REFERENCE_MB) -> float:
        """Charge the job's run that ends at ``t`` (a requeue ends one too) what
        ``model.charged_gpu_hours`` says (its cards, a slice by its gigabytes against
        the ``reference_mb`` card, times its ``charge``), and add what its cards did
        meanwhile (whole hours), from telemetry; returns the GPU-hours charged. ``gpus``:
        the cards its allocation had as the cluster's own accounting says (a pool's job),
        instead of its placements."""
        if started_at is None:
            cards: list[tuple[int, bool]] = []
        elif gpus is None:
            cards = self.db.execute("SELECT memory_mb, exclusive FROM allocations "
                                    "WHERE job_id = ? AND released_at IS NULL", [job_id]).fetchall()
        else:
            cards = [(0, True)] * gpus
        seconds = 0.0 if started_at is None else t - started_at
        hours = charged_gpu_hours(cards, seconds, reference_mb)
        charge = self.db.execute("SELECT charge FROM jobs WHERE id = ?", [job_id]).fetchone()
        charged = hours * (1.0 if charge is None or charge[0] is None else charge[0])
        usage = self._run_usage(job_id, started_at, t) if hours > 0 else None
        if usage is None:
            self.db.execute("UPDATE jobs SET gpu_hours = gpu_hours + ? WHERE id = ?", [charged, job_id])
            return charged
        busy, idle, mem_mean, mem_peak = usage
        sampled, old_mean, old_peak = self.db.execute(
            "SELECT sampled_gpu_hours, mem_used_mb_mean, mem_used_mb_peak FROM jobs WHERE id = ?",
            [job_id]).fetchone()
        if mem_mean is not None and old_mean is not None and sampled:
            mem_mean = (old_mean * sampled + mem_mean * hours) / (sampled + hours)
        peaks = [v for v in (old_peak, mem_peak) if v is not None]
        self.db.execute(
            "UPDATE jobs SET gpu_hours = gpu_hours + ?, sampled_gpu_hours = sampled_gpu_hours + ?, "
            "busy_gpu_hours = busy_gpu_hours + ?, idle_gpu_hours = idle_gpu_hours + ?, "
            "mem_used_mb_mean = ?, mem_used_mb_peak = ? WHERE id = ?",
            [charged, hours, busy * hours, idle * hours, old_mean if mem_mean is None else mem_mean,
             max(peaks) if peaks else None, job_id])
        return charged

    def _run_usage(self, job_id: int, started_at: float,
                   t: float) -> tuple[float, float, float | None, float | None] | None:
        """Telemetry of the cards a job holds now, between ``started_at`` and ``t``: the
        busy fraction (mean utilisation), the idle fraction (time at or below IDLE_UTIL_PCT),
        mean and peak memory used; each sample weighs the seconds it stands for (a
        10-minute average weighs 20 samples of 30 s). None when no sample has a utilisation."""
        weight = SAMPLE_WEIGHT_SQL
        weighed, busy, idle, mem_weight, mem, peak = self.db.execute(
            f"SELECT SUM(CASE WHEN t.utilization_pct IS NULL THEN 0 ELSE {weight} END), "
            f"SUM({weight} * t.utilization_pct), "
            f"SUM(CASE WHEN t.utilization_pct <= ? THEN {weight} ELSE 0 END), "
            f"SUM(CASE WHEN t.memory_used_mb IS NULL THEN 0 ELSE {weight} END), "
            f"SUM({weight} * t.memory_used_mb), MAX(t.memory_used_mb) "
            "FROM allocations a JOIN telemetry t ON t.gpu = a.gpu_uuid "
            "WHERE a.job_id = ? AND a.released_at IS NULL AND t.t >= ? AND t.t <= ?",
            [IDLE_UTIL_PCT, job_id, started_at, t]).fetchone()
        if not weighed:
            return None
        return (busy / weighed / 100, idle / weighed, mem / mem_weight if mem_weight else None, peak)

    # ------------------------------------------------------------------ users
    def users(self) -> list[dict]:
        return [dict(r) for r in self.db["users"].rows_where(order_by="name")]

    def set_quota(self, user: str, hours: float, by: str, t: float) -> None:
        with self.transaction():
            self._ensure_user(user, t)
            self.db.execute("UPDATE users SET quota_gpu_hours = ? WHERE name = ?", [hours, user])
            self._event(t, "admin", f"quota of {user} set to {hours:g} GPU-hours a month by {by}",
                        user=by)

    # ------------------------------------------------------------------ sums
    def user_months(self, since: float, until: float) -> list[dict]:
        """Per user and calendar month (local time) of the jobs that ended in [since,
        until): how many, GPU-hours charged (and of them, those of jobs that ran as
        preemptible work past their user's quota), sampled, busy and idle GPU-hours, and
        the sum and count of the waits of those that started."""
        rows = self.db.execute(
            "SELECT user, strftime('%Y-%m', ended_at, 'unixepoch', 'localtime') AS month, "
            "COUNT(*), SUM(gpu_hours), SUM(CASE WHEN over_quota THEN gpu_hours ELSE 0 END), "
            "SUM(sampled_gpu_hours), SUM(busy_gpu_hours), "
            "SUM(idle_gpu_hours), SUM(started_at - submitted_at), COUNT(started_at) "
            "FROM jobs WHERE ended_at >= ? AND ended_at < ? GROUP BY user, month "
            "ORDER BY month, user", [since, until]).fetchall()
        keys = ("user", "month", "jobs", "gpu_hours", "over_quota_gpu_hours", "sampled_gpu_hours",
                "busy_gpu_hours", "idle_gpu_hours", "wait_s_sum", "started")
        return [dict(zip(keys, r)) for r in rows]

    def held_between(self, since: float, until: float) -> list[tuple[str, float, float | None, float]]:
        """(node, from, to or None while held, share of a card) of every allocation held
        at some time in [since, until); a slice counts its share of the card (R7)."""
        return self.db.execute(
            "SELECT a.node, a.created_at, a.released_at, "
            "CASE WHEN a.exclusive OR g.total_mb IS NULL OR g.total_mb = 0 THEN 1.0 "
            "ELSE MIN(1.0, CAST(a.memory_mb AS REAL) / g.total_mb) END "
            "FROM allocations a LEFT JOIN gpus g ON g.uuid = a.gpu_uuid "
            "WHERE a.created_at < ? AND (a.released_at IS NULL OR a.released_at >= ?)",
            [until, since]).fetchall()

    #: Telemetry is summed per quarter hour (every time zone's offset is a multiple of it),
    #: and the caller puts each quarter in its local day: cheaper than a date per sample.
    QUARTER_S = 900

    def utilisation_by_quarter(self, since: float, until: float) -> list[tuple[str, float, float, float]]:
        """(node, start of the quarter hour, seconds sampled, busy seconds) of every node's
        cards in [since, until), from telemetry (a sample weighs its span)."""
        weight = SAMPLE_WEIGHT_SQL
        return self.db.execute(
            f"SELECT g.node, CAST(t.t / {self.QUARTER_S} AS INTEGER) * {self.QUARTER_S} AS q, "
            f"SUM({weight}), SUM({weight} * t.utilization_pct / 100.0) "
            "FROM telemetry t JOIN gpus g ON g.uuid = t.gpu "
            "WHERE t.t >= ? AND t.t < ? AND t.utilization_pct IS NOT NULL "
            "GROUP BY g.node, q", [since, until]).fetchall()

    def ended_counts(self) -> dict[str, int]:
        """How many jobs ended in each end state, ever."""
        finished = [s.value for s in JobState if s.finished]
        return dict(self.db.execute(
            f"SELECT state, COUNT(*) FROM jobs WHERE state IN ({','.join('?' * len(finished))}) "
            "GROUP BY state", finished).fetchall())

    def usage_since(self, since: float, preemptible: bool = True) -> dict[str, float]:
        """GPU-hours per user charged to jobs that ended since ``since`` or still hold or
        wait (a requeued job keeps what it was charged); without ``preemptible``, those of
        preemptible jobs left out (a quota they do not count against)."""
        rows = self.db.execute(
            "SELECT user, SUM(gpu_hours) FROM jobs WHERE (ended_at >= ? OR ended_at IS NULL) "
            f"{'' if preemptible else _NOT_PREEMPTIBLE}GROUP BY user", [since]).fetchall()
        return {user: hours or 0.0 for user, hours in rows}

    def over_quota_usage(self, user: str, since: float) -> tuple[float, set[int]]:
        """``user``'s jobs that ran as preemptible work past their quota, of those
        ``usage_since`` counts: the GPU-hours they were charged, and the ids of those not
        ended (their runs now are not charged yet)."""
        hours, ids = 0.0, set()
        for job_id, charged, ended in self.db.execute(
                "SELECT id, gpu_hours, ended_at FROM jobs WHERE user = ? AND over_quota "
                "AND (ended_at >= ? OR ended_at IS NULL)", [user, since]):
            hours += charged or 0.0
            if ended is None:
                ids.add(job_id)
        return hours, ids

    def finished_usage(self, since: float) -> dict[str, list[tuple[float, float]]]:
        """(ended_at, gpu_hours) of every job each user finished since ``since`` after it
        ran (R6): one cancelled while it waited, or failed because its --after job failed,
        used nothing and counts nothing."""
        found: dict[str, list[tuple[float, float]]] = {}
        for user, ended_at, hours in self.db.execute(
                f"SELECT user, ended_at, gpu_hours FROM jobs WHERE ended_at >= ? AND {COUNTED_SQL} "
                "ORDER BY ended_at", [since]):
            found.setdefault(user, []).append((ended_at, hours or 0.0))
        return found

    def counted_run(self, job_id: int) -> tuple[float, float] | None:
        """(ended_at, gpu_hours) of one job as ``finished_usage`` lists it, or None when it
        does not count (not finished, or finished without having run)."""
        row = self.db.execute(f"SELECT ended_at, gpu_hours FROM jobs WHERE id = ? AND {COUNTED_SQL}",
                              [job_id]).fetchone()
        return (row[0], row[1] or 0.0) if row else None

    def job_outcomes(self, job_ids: list[int]) -> dict[int, tuple[str, bool]]:
        """(state, whether it ever ran) of each of these jobs, for --after."""
        found: dict[int, tuple[str, bool]] = {}
        for chunk in chunks(job_ids, 500):
            for job_id, state, ran in self.db.execute(
                    f"SELECT id, state, started_at IS NOT NULL OR gpu_hours > 0 FROM jobs "
                    f"WHERE id IN ({','.join('?' * len(chunk))})", chunk):
                found[job_id] = (state, bool(ran))
        return found

    def charged_hours(self, job_ids: list[int]) -> dict[int, float]:
        """The GPU-hours each of these jobs was charged for its runs that ended."""
        return self._column_of("gpu_hours", job_ids)

    def job_states(self, job_ids: list[int]) -> dict[int, str]:
        return self._column_of("state", job_ids)

    def _column_of(self, column: str, job_ids: list[int]) -> dict:
        """job id -> one column of the ``jobs`` row of each of these jobs."""
        found: dict = {}
        for chunk in chunks(job_ids, 500):
            found.update(self.db.execute(
                f"SELECT id, {column} FROM jobs WHERE id IN ({','.join('?' * len(chunk))})", chunk).fetchall())
        return found
