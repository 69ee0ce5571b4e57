"""The accounting commands: what ended jobs cost (history, report) and what each user may
still use (users, quota)."""

from __future__ import annotations

import sys
import time

from ..model import fmt
from .args import USAGE_ERROR
from .common import service_client, show


def cmd_report(args, home, config) -> int:
    from ..views import month_start, report_text

    if args.months is not None and args.since is not None:
        print("nebula report: give --since or --months, not both", file=sys.stderr)
        return USAGE_ERROR
    now = time.time()
    since = args.since if args.since is not None else month_start(now, back=(args.months or 1) - 1)
    with service_client(home, config) as client:
        report = client.call("report", timeout=120, since=since,
                             until=args.until if args.until is not None else now)["report"]
    if args.csv:
        import csv

        rows = report[args.csv]
        columns = list(rows[0]) if rows else []
        writer = csv.DictWriter(sys.stdout, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        return 0
    return show(args, report, report_text)


def cmd_history(args, home, config) -> int:
    from ..views import history_text

    with service_client(home, config) as client:
        jobs = client.call("job_history", user=args.user, since=args.since, until=args.until,
                           state=list(args.state) if args.state else None, node=args.node,
                           limit=args.limit)["jobs"]
    return show(args, jobs, history_text)


def cmd_quota(args, home, config) -> int:
    with service_client(home, config) as client:
        client.call("quota", user=args.user, hours=args.hours)
    return show(args, {"user": args.user, "quota_gpu_hours": args.hours},
                 f"Quota of {args.user}: {args.hours:g} GPU-hours a month")


def cmd_users(args, home, config) -> int:
    from ..units import duration_short
    from ..views import table

    with service_client(home, config) as client:
        users = client.call("users")["users"]
    return show(args, users, lambda users: table(
        ("USER", "WEIGHT", "FINISHED", "RUNNING", "GPU-H MONTH", "QUOTA", "JOBS MONTH",
         "EFFICIENCY", "IDLE GPU-H", "MEAN WAIT"),
        [(u["name"], f"{u['weight']:.3f}", u["jobs_finished"], u["running_jobs"],
          f"{u['month_gpu_hours']:.2f}", f"{u['quota_gpu_hours']:g}", u.get("month_jobs", 0),
          fmt(u.get("month_efficiency_pct"), "%"), f"{u.get('month_idle_gpu_hours') or 0:.2f}",
          duration_short(u.get("month_mean_wait_s"))) for u in users],
        right=range(1, 10)))
