"""What a client says of the head's start forecasts and of its answer to `nebula why`:
words only, every figure the head's (``head/forecast.py``)."""

from __future__ import annotations

import time


def clock_text(t: float, now: float) -> str:
    """A time as the reader's clock shows it: "14:20" within the day ahead, else "Tue 14:20"."""
    fmt = "%H:%M" if abs(t - now) < 20 * 3600 else "%a %H:%M"
    return time.strftime(fmt, time.localtime(t))


def starts_text(starts: dict | None, now: float) -> str:
    """A forecast start (``forecast.Start.json``) in words: "now", "~14:20, 13:50–16:40",
    "after job 42 ends (~14:20), 13:50–16:40", "not within 7 days"; "" without one."""
    if not starts:
        return ""
    at, early, late = starts.get("start_at"), starts.get("early"), starts.get("late")
    within = f"{(starts.get('within_s') or 7 * 86400) / 86400:.0f} days"
    if at is None:
        return f"not within {within}" + (f" (earliest {clock_text(early, now)})" if early else "")
    if at <= now + 60:
        return "now"
    point = f"~{clock_text(at, now)}"
    if starts.get("after_job") is not None:
        point = f"after job {starts['after_job']} ends ({point})"
    if early is None or (late is not None and late - early < 120):
        return point
    return f"{point}, {clock_text(early, now)}–{clock_text(late, now) if late is not None else 'later'}"


def first_start(tasks: list[dict]) -> dict | None:
    """The earliest forecast start among an array's tasks."""
    known = [t["starts"] for t in tasks if (t.get("starts") or {}).get("start_at") is not None]
    return min(known, key=lambda s: s["start_at"], default=None)
