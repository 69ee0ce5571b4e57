"""R6 fair share and R7 quotas: pure arithmetic the engine feeds from the store.

A user's weight grows with what they used: 1.0 + 0.02 per GPU-hour charged, and nothing per
job (a sweep of many short jobs weighs what one job of the same GPU-hours weighs). What a
run is charged is ``model.charged_gpu_hours``, the one function the store (quota, ``nebula
report``, Prometheus, the replay) and the live standings both use: a whole card counts 1
whatever its size; a slice counts its gigabytes over the reference card's
(``scheduler.charge_reference``, 24 GB unless set), at most 1, so it costs the same on
whichever card it landed. Only jobs that ran count: one cancelled while it waited, or
failed because its ``--after`` job failed, used nothing (the store hands over only jobs
that held GPUs). The queue runs the lowest weight first. With a half-life, each finished
job's contribution halves every ``half_life_s`` seconds, so old usage is forgiven; hours
held by jobs still running count in full.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

BASE_WEIGHT = 1.0
PER_GPU_HOUR = 0.02
#: the half-life we recommend: last week's usage counts half, last month's about a twentieth
DEFAULT_HALF_LIFE_S = 7 * 24 * 3600.0
#: R7: GPU-hours per user per calendar month unless an admin set another quota
DEFAULT_QUOTA_GPU_HOURS = 2000.0


def user_weight(finished: Sequence[tuple[float, float]], held_gpu_hours: float, now: float,
                half_life_s: float | None = DEFAULT_HALF_LIFE_S) -> float:
    """R6 weight from finished jobs ``(ended_at, gpu_hours)`` and hours held right now.

    ``half_life_s`` None (or <= 0) means no decay: every job counts forever.
    """
    weight = BASE_WEIGHT + PER_GPU_HOUR * max(0.0, held_gpu_hours)
    for ended_at, hours in finished:
        decay = 1.0
        if half_life_s and half_life_s > 0:
            decay = 2.0 ** (-max(0.0, now - ended_at) / half_life_s)
        weight += PER_GPU_HOUR * max(0.0, hours) * decay
    return weight


def hours_text(value: float) -> str:
    """GPU-hours with enough precision to be true: one decimal from 100 h up (2012.5),
    three significant digits below (12.3, 0.25, 0.01, 0.00417), no trailing zeros; a value
    that is not zero never reads "0"."""
    if value == 0:
        return "0"
    if abs(value) >= 100:
        text = f"{value:.1f}"
    else:
        digits = max(0, 2 - math.floor(math.log10(abs(value))))
        text = f"{value:.{digits}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


def quota_refusal(user: str, month_gpu_hours: float, quota_gpu_hours: float,
                  admins: Sequence[str]) -> str | None:
    """R7: the one-line refusal of a submit by a user at or over quota, else None."""
    if month_gpu_hours < quota_gpu_hours:
        return None
    # Suggest the next round thousand above both the quota and the usage.
    raise_to = (math.floor(max(month_gpu_hours, quota_gpu_hours) / 1000) + 1) * 1000
    who = f"an admin ({', '.join(admins)})" if admins else "an admin"
    return (f"{user} has used {hours_text(month_gpu_hours)} of {hours_text(quota_gpu_hours)} GPU-hours "
            f"this month; {who} can raise the quota with `nebula quota {user} {raise_to}`")


def order_key(priority: int, weight: float, submitted_at: float, job_id: int) -> tuple[int, float, float, int]:
    """The queue order (R6, R25): priority first, then lowest weight, then submit time, id."""
    return (-priority, weight, submitted_at, job_id)
