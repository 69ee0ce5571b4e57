"""What a client says of the head's start forecasts and of its answer to `nebula why`:
words only, every figure the head's (``head/forecast.py``)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from .wire import StartForecast, Standing, WhyJob, WhyJobRow, WhySooner, WhyUser


def clock_text(t: float, now: float) -> str:
    """A time as the reader's clock shows it: "14:20" within the day ahead, else "Tue 14:20"."""
    fmt = "%H:%M" if abs(t - now) < 20 * 3600 else "%a %H:%M"
    return time.strftime(fmt, time.localtime(t))


def starts_text(starts: StartForecast | None, now: float) -> str:
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


def first_start(tasks: Sequence[Mapping[str, Any]]) -> StartForecast | None:
    """The earliest forecast start among an array's tasks (``QueueRow``s; a row without
    ``starts``, as ``job_history``'s, has none)."""
    known = [t["starts"] for t in tasks if (t.get("starts") or {}).get("start_at") is not None]
    return min(known, key=lambda s: s["start_at"], default=None)


#: each rule of ``head/why.py`` in words
RULE_TEXT = {
    "running": "it runs", "ended": "it ended", "held": "held (`nebula release` lets it run)",
    "dependency": "a dependency (--after)", "quota": "its user's quota",
    "array_limit": "its array's limit of tasks at once",
    "reservation": "cards reserved for a job ahead of it (backfill)",
    "booking": "a booking of the cards", "blocked": "cards that take no new work (drained, "
    "in maintenance or isolated, unknown)", "fair_share": "fair share: jobs ahead take the cards",
    "fit": "fit: no set of cards it fits is free now", "pool": "it waits in a pool",
    "new": "not considered yet (the next pass decides)"}


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def _hours(value: float) -> str:
    return f"{value:.1f}" if value >= 10 or value == 0 else f"{value:.2g}"


def share_text(share: Standing) -> str:
    """A user's fair share in one paragraph."""
    half = share.get("half_life_s")
    decay = f"half-life {half / 86400:g} days" if half else "no decay"
    return (f"{share['user']}'s fair share: weight {share['weight']:g} ({_ordinal(share['rank'])} lightest of "
            f"{share['users']} users; the lightest runs first); {_hours(share['decayed_gpu_hours'])} "
            f"GPU-hours of {share['runs_counted']} ended runs counted after decay ({decay}), "
            f"{_hours(share['held_gpu_hours'])} held now; this month {_hours(share['month_gpu_hours'])} of "
            f"{_hours(share['quota_gpu_hours'])} GPU-hours (in quota {_hours(share['in_quota_gpu_hours'])}, "
            f"over {_hours(share['over_quota_gpu_hours'])})")


def _row_text(row: WhyJobRow, now: float) -> str:
    mem = row.get("gpu_mem_mb")
    what = (f"{row['gpu_count']} GPU{'s' if row['gpu_count'] != 1 else ''}" if mem is None
            else f"{mem // 1024} GB slice")
    where = f" on {', '.join(row['gpus'])}" if row.get("gpus") else ""
    when = ""
    if ends_by := row.get("ends_by"):
        when = f", ends by {clock_text(ends_by, now)}"
    elif row.get("state") in ("running", "launching"):
        when = ", no --time"
    elif row.get("starts"):
        when = f", starts {starts_text(row['starts'], now)}"
    return f"job {row['id']} ({row['user']}, {what}{where}{when})"


def why_text(why: WhyJob) -> str:
    """`nebula why JOB`: the head's answer as one screen."""
    now = why.get("now") or time.time()
    pos = why.get("queue_pos")
    place = f": {_ordinal(pos)} of {why['waiting']} waiting" if pos else ""
    lines = [f"Job {why['job']} ({why['user']}) is {why['state']}{place}.",
             f"Held by: {RULE_TEXT.get(why['rule'], why['rule'])}"
             + (f" — {why['reason']}" if why.get("reason") and why["rule"] not in ("running", "ended") else "")]
    if start := why.get("starts"):
        node = f" (on {start['node']})" if start.get("node") and start.get("start_at") else ""
        lines.append(f"Starts: {starts_text(start, now)}{node}")
    lines.append(share_text(why["share"]))
    if why.get("ahead"):
        lines.append("Ahead in the queue: " + "; ".join(_row_text(r, now) for r in why["ahead"]))
    if why.get("holding"):
        lines.append("Holding the cards it is forecast to get: " + "; ".join(_row_text(r, now) for r in why["holding"]))
    if why.get("sooner"):
        lines.append("Sooner:")
        for change in why["sooner"]:
            lines.append(f"  {sooner_text(change, now)}")
    elif why["state"] == "pending":
        lines.append("Sooner: no change tried (smaller slice, fewer GPUs, --time 1:00:00, "
                     "--preemptible) starts it sooner")
    return "\n".join(lines)


def sooner_text(change: WhySooner, now: float) -> str:
    """"with --gpu-mem 16G it would start now on node03", "as --preemptible it would …"."""
    flag = change["change"]
    if change.get("pool"):
        return f"on pool {change['pool']}: {change['gpus_idle']} GPUs idle there now ({flag})"
    start = change.get("starts")
    words = "as --preemptible" if flag == "--preemptible" else f"with {flag}"
    when = starts_text(start, now)
    node = f" on {start['node']}" if start and start.get("node") else ""
    return f"{words} it would start {when}{node}"


def why_user_text(why: WhyUser) -> str:
    """`nebula why --user NAME`: their fair share and jobs."""
    now = time.time()
    lines = [share_text(why["share"])]
    if why["share"].get("refusal"):
        lines.append(f"Refused now: {why['share']['refusal']}")
    lines.append(f"Running: {len(why['running'])}" + (": " + "; ".join(_row_text(r, now) for r in why["running"][:5])
                                                      if why["running"] else ""))
    lines.append(f"Waiting: {len(why['waiting'])}")
    for row in why["waiting"][:10]:
        pos = f"{_ordinal(place)} in the queue" if (place := row.get("queue_pos")) else "not ordered yet"
        lines.append(f"  {_row_text(row, now)}: {pos}; {row.get('reason') or ''}".rstrip("; "))
    return "\n".join(lines)
