"""How long a running job holds its cards, when nobody said: the one estimate the
scheduler's reservations (R25) and the start forecast share.

A job with ``--time`` ends by it. One without gets, in this order: the cluster's
``limits.max_time`` (no job may ask longer), the user's own history of similar jobs (the
longest of their recent runs of the same size), or :data:`DEFAULT_UNTIMED_S`. A job
already past its estimate runs at least as long again as it has (the longer it ran, the
longer it runs), so an estimate is never in the past and a reservation behind a service
moves forward instead of vanishing. Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

#: a job without --time, max_time or history: what it is assumed to run (a day: the public
#: traces' long jobs; a shorter guess would hold cards for a gang that cannot yet start)
DEFAULT_UNTIMED_S = 86400.0


@dataclass(frozen=True)
class Estimate:
    """How long a job runs from its start, and what that comes from (said in reasons)."""

    seconds: float
    basis: str  # "--time", "limits.max_time", "its user's history", "the default"


def run_estimate(time_limit_s: float | None, max_time_s: float | None = None,
                 history_s: Sequence[float] = ()) -> Estimate:
    """A job's run length: its --time, else max_time, else the user's history, else the default."""
    if time_limit_s is not None:
        return Estimate(time_limit_s, "--time")
    if max_time_s:
        return Estimate(max_time_s, "limits.max_time")
    if history_s:
        return Estimate(max(history_s), "its user's history")
    return Estimate(DEFAULT_UNTIMED_S, "the default")


def expected_end(started_at: float, now: float, estimate: Estimate) -> float:
    """When a running job ends by ``estimate``; once past it, as long again as it has run.
    A job with --time ends by it whatever (the limit is enforced)."""
    end = started_at + estimate.seconds
    if end > now or estimate.basis == "--time":
        return end
    return now + (now - started_at)

