"""The accounting commands: what ended jobs cost (history, report) and what each user may
still use (users, quota)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..model import NOT_AVAILABLE, fmt, format_mb
from ..units import duration_short
from ..wire import (HistoryJob, HistoryReply, JobHistoryRequest, NoReply, QuotaRequest, Report, ReportNodeRow,
                    ReportReply, ReportRequest, UsersReply)
from ..homedir import Home
from .args import USAGE_ERROR
from .common import service_client, show


def cmd_report(args: argparse.Namespace, home: Home, config: str | None) -> int:
    from ..views import month_start

    if args.months is not None and args.since is not None:
        print("nebula report: give --since or --months, not both", file=sys.stderr)
        return USAGE_ERROR
    now = time.time()
    since = args.since if args.since is not None else month_start(now, back=(args.months or 1) - 1)
    with service_client(home, config) as client:
        report = client.call("report", ReportReply, timeout=120, **ReportRequest(
            since=since, until=args.until if args.until is not None else now))["report"]
    if args.csv:
        import csv

        tables: Mapping[str, Any] = report
        rows = tables[args.csv]
        columns = list(rows[0]) if rows else []
        writer = csv.DictWriter(sys.stdout, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        return 0
    return show(args, report, report_text)


def cmd_history(args: argparse.Namespace, home: Home, config: str | None) -> int:

    with service_client(home, config) as client:
        jobs = client.call("job_history", HistoryReply, **JobHistoryRequest(
            user=args.user, since=args.since, until=args.until,
            state=list(args.state) if args.state else None, node=args.node, limit=args.limit))["jobs"]
    return show(args, jobs, history_text)


def cmd_quota(args: argparse.Namespace, home: Home, config: str | None) -> int:
    with service_client(home, config) as client:
        client.call("quota", NoReply, **QuotaRequest(user=args.user, hours=args.hours))
    return show(args, {"user": args.user, "quota_gpu_hours": args.hours},
                 f"Quota of {args.user}: {args.hours:g} GPU-hours a month")


def cmd_users(args: argparse.Namespace, home: Home, config: str | None) -> int:
    from ..units import duration_short
    from .text import table

    with service_client(home, config) as client:
        users = client.call("users", UsersReply)["users"]
    return show(args, users, lambda users: table(
        ("USER", "WEIGHT", "FINISHED", "RUNNING", "GPU-H MONTH", "QUOTA", "JOBS MONTH",
         "EFFICIENCY", "IDLE GPU-H", "MEAN WAIT"),
        [(u["name"], f"{u['weight']:.3f}", u["jobs_finished"], u["running_jobs"],
          f"{u['month_gpu_hours']:.2f}", f"{u['quota_gpu_hours']:g}", u.get("month_jobs", 0),
          fmt(u.get("month_efficiency_pct"), "%"), f"{u.get('month_idle_gpu_hours') or 0:.2f}",
          duration_short(u.get("month_mean_wait_s"))) for u in users],
        right=range(1, 10)))


def history_text(jobs: Sequence[HistoryJob]) -> str:
    """`nebula history`: one ended job a line, oldest first."""
    from ..views import gpu_list
    from .text import table

    if not jobs:
        return "No ended jobs match."
    rows = [(j["id"], j["user"], j["name"] or "-", j["state"], fmt(j["exit_code"]),
             gpu_list(j["gpus"]) or "-", duration_short(j["wait_s"]), duration_short(j["run_s"]),
             f"{j['gpu_hours']:.3f}", fmt(j["mean_util_pct"], "%"),
             f"{format_mb(j['mem_used_mb_mean'])}/{format_mb(j['mem_used_mb_peak'])}"
             if j["mem_used_mb_peak"] is not None else NOT_AVAILABLE,
             time.strftime("%Y-%m-%d %H:%M", time.localtime(j["ended_at"])))
            for j in jobs]
    return table(("ID", "USER", "NAME", "STATE", "EXIT", "GPUS", "WAIT", "RUN", "GPU-H", "UTIL",
                  "MEM MEAN/PEAK", "ENDED"), rows, right={0, 4, 6, 7, 8, 9})


def _pct(value: float | None) -> str:
    return NOT_AVAILABLE if value is None else f"{value:.0f}%"


def report_text(report: Report) -> str:
    """`nebula report`: per user and month, then capacity per node and month, then the
    cluster day by day."""
    from .text import table

    def stamp(t: float) -> str:
        return time.strftime("%Y-%m-%d %H:%M", time.localtime(t))

    since, until = stamp(report["since"]), stamp(report["until"])
    users = table(("MONTH", "USER", "JOBS", "GPU-H", "IN QUOTA", "OVER QUOTA", "EFFICIENCY", "IDLE GPU-H",
                   "MEAN WAIT"),
                  [(u["month"], u["user"], u["jobs"], f"{u['gpu_hours']:.3f}", f"{u['in_quota_gpu_hours']:.3f}",
                    f"{u['over_quota_gpu_hours']:.3f}", _pct(u["efficiency_pct"]), f"{u['idle_gpu_hours']:.3f}",
                    duration_short(u["mean_wait_s"])) for u in report["users"]],
                  right={2, 3, 4, 5, 6, 7, 8}) if report["users"] else "(no job ended in this period)"
    capacity = ("PERIOD", "NODE", "GPUS", "AVAILABLE GPU-H", "ALLOCATED GPU-H", "ALLOCATED", "UTILISATION")

    def rows(items: Iterable[ReportNodeRow]) -> list[tuple[str, str, int, str, str, str, str]]:
        return [(r["period"], r["node"], r["gpus"], f"{r['available_gpu_hours']:.3f}",
                 f"{r['allocated_gpu_hours']:.3f}", _pct(r["allocated_pct"]), _pct(r["util_pct"]))
                for r in items]

    days = [r for r in report["days"] if r["node"] == "cluster"]
    booked = table(("BOOKING", "USERS", "FROM", "TO", "BOOKED GPU-H", "USED GPU-H", "USED"), [
        (b["name"], ",".join(b["users"]), stamp(b["start"]), stamp(b["end"]), f"{b['booked_gpu_hours']:.3f}",
         f"{b['used_gpu_hours']:.3f}", _pct(b["used_pct"])) for b in report.get("bookings", [])],
        right={4, 5, 6}) if report.get("bookings") else "(no booking in this period)"
    return "\n".join([
        f"Report {since} to {until}", "",
        "Users (jobs that ended; GPU-hours charged, in their quota and over it — run as preemptible "
        "work on idle cards, charged at its rate; efficiency: utilisation of their cards while they held them)",
        users, "",
        "Nodes (GPU-hours their cards had, held by jobs, and how busy the cards really were)",
        table(capacity, rows(report["nodes"]), right={2, 3, 4, 5, 6}), "",
        "Cluster by day",
        table(capacity, rows(days), right={2, 3, 4, 5, 6}), "",
        "Bookings (GPU-hours booked in this period, and those their users' jobs held on them)",
        booked])
