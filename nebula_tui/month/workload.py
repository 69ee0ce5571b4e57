"""What a replay runs: a lab's jobs from a trace file, a head's history, a Slurm export, or
the built-in lab month.

Every reader gives ``Request``s (``head/replay.py``'s): when it was submitted, by whom,
how many cards and how much of each, how long it ran and its time limit. A bad line is a
one-line ``WorkloadError`` naming the file, the line and what to write.
"""

from __future__ import annotations

import csv
import json
import math
import random
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

from .records import Request

TRACE_FIELDS = ("submit_s", "user", "gpus", "gpu_mem_gb", "duration_s", "time_limit_s", "nodes", "service")
MIB_PER_GB = 1024


class WorkloadError(ValueError):
    """A workload that cannot be read; str() names the file and line and what to write."""


def read(path: Path) -> list[Request]:
    """Any workload file, told apart by its content: a trace CSV (its header), the JSON of
    ``nebula history --json``, or ``sacct --parsable2`` output (``|``-separated)."""
    try:
        text = path.read_text()
    except OSError as err:
        raise WorkloadError(f"{path}: cannot read it ({err.strerror})") from None
    if text.lstrip()[:1] in ("[", "{"):
        return from_history(path, text)
    if "|" in text.partition("\n")[0]:
        return from_sacct(path, text)
    return from_trace(path, text)


def _number(path: Path, line: int, field: str, value: str, kind=float, empty=None):
    if value is None or value.strip() == "":
        return empty
    try:
        number = kind(value)
    except ValueError:
        raise WorkloadError(f"{path}:{line}: {field} is {value!r}, not a number") from None
    if isinstance(number, float) and not math.isfinite(number) or number < 0:
        raise WorkloadError(f"{path}:{line}: {field} is {value!r}; it must be 0 or more")
    return number


def from_trace(path: Path, text: str) -> list[Request]:
    """The trace CSV: ``submit_s,user,gpus,gpu_mem_gb,duration_s,time_limit_s,nodes,service``
    (empty gpu_mem_gb: whole cards; empty time_limit_s: none; nodes 1; service 0/1)."""
    rows = csv.DictReader(text.splitlines())
    missing = [f for f in ("submit_s", "user", "gpus", "duration_s") if f not in (rows.fieldnames or [])]
    if missing:
        raise WorkloadError(f"{path}:1: the header lacks {', '.join(missing)}; "
                            f"write {','.join(TRACE_FIELDS)}")
    requests = []
    for line, row in enumerate(rows, start=2):
        user = (row.get("user") or "").strip()
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}", user):
            raise WorkloadError(f"{path}:{line}: user {user!r} is not a user name")
        gpus = _number(path, line, "gpus", row.get("gpus"), int, 1)
        mem = _number(path, line, "gpu_mem_gb", row.get("gpu_mem_gb"))
        if gpus < 1:
            raise WorkloadError(f"{path}:{line}: gpus is {gpus}; a job asks for 1 or more")
        requests.append(Request(
            key=line, submit_s=_number(path, line, "submit_s", row.get("submit_s"), empty=0.0), user=user,
            gpus=gpus, gpu_mem_mb=None if mem is None else max(1, round(mem * MIB_PER_GB)),
            duration_s=_number(path, line, "duration_s", row.get("duration_s"), empty=0.0),
            time_limit_s=_number(path, line, "time_limit_s", row.get("time_limit_s")),
            nodes=max(1, _number(path, line, "nodes", row.get("nodes"), int, 1)),
            service=(row.get("service") or "0").strip() in ("1", "true", "yes")))
    return _from_zero(requests)


def from_history(path: Path, text: str) -> list[Request]:
    """``nebula history --json``: each ended job that ran, as it was asked for."""
    try:
        data = json.loads(text)
    except ValueError as err:
        raise WorkloadError(f"{path}: not JSON ({err})") from None
    rows = data.get("jobs", []) if isinstance(data, dict) else data
    requests = []
    for n, job in enumerate(rows if isinstance(rows, list) else [], start=1):
        try:
            started, ended = job.get("started_at"), job.get("ended_at")
            if started is None or ended is None:
                continue  # never ran: nothing says how long it would have
            requests.append(Request(
                key=int(job.get("id", n)), submit_s=float(job["submitted_at"]), user=str(job["user"]),
                gpus=int(job.get("gpu_count") or 1), gpu_mem_mb=job.get("gpu_mem_mb"),
                duration_s=max(0.0, float(ended) - float(started)),
                time_limit_s=job.get("time_limit_s"), nodes=int(job.get("nodes") or 1),
                service=bool(job.get("service"))))
        except (KeyError, TypeError, ValueError, AttributeError):
            raise WorkloadError(f"{path}: job {n} lacks submitted_at, user or its times; "
                                f"save `nebula history --json` as it prints") from None
    return _from_zero(requests)


#: ``sacct --parsable2 --format=`` fields a Slurm export must have (and those it may).
SACCT_FIELDS = ("JobID", "User", "Submit", "Start", "End", "AllocTRES")
SACCT_OPTIONAL = ("Timelimit", "NNodes", "State")


def from_sacct(path: Path, text: str) -> list[Request]:
    """``sacct -a -X --parsable2 --format=JobID,User,Submit,Start,End,AllocTRES,Timelimit,NNodes,State``
    (with its header line): each job that started, its GPUs from ``gres/gpu=N``."""
    lines = [line for line in text.splitlines() if line.strip()]
    header = lines[0].split("|") if lines else []
    missing = [f for f in SACCT_FIELDS if f not in header]
    if missing:
        raise WorkloadError(f"{path}:1: the header lacks {', '.join(missing)}; export with "
                            f"sacct -a -X --parsable2 --format={','.join(SACCT_FIELDS + SACCT_OPTIONAL)}")
    column = {name: i for i, name in enumerate(header)}

    def when(value: str, line: int) -> float | None:
        if value in ("", "Unknown", "None"):
            return None
        try:
            return datetime.fromisoformat(value).timestamp()
        except ValueError:
            raise WorkloadError(f"{path}:{line}: {value!r} is not a time like 2026-11-02T09:15:00") from None

    requests = []
    for line, raw in enumerate(lines[1:], start=2):
        cells = raw.split("|")
        if len(cells) < len(header):
            raise WorkloadError(f"{path}:{line}: {len(cells)} fields where the header has {len(header)}")
        field = lambda name: cells[column[name]] if name in column else ""  # noqa: E731
        if "." in field("JobID"):
            continue  # a step of a job, not a job
        submit, start, end = (when(field(n), line) for n in ("Submit", "Start", "End"))
        gpus = re.search(r"gres/gpu(?::[^=,]+)?=(\d+)", field("AllocTRES"))
        if start is None or end is None or not gpus:
            continue  # never ran, or ran without GPUs
        limit = field("Timelimit")
        requests.append(Request(
            key=line, submit_s=submit or start, user=field("User") or "unknown", gpus=int(gpus[1]),
            gpu_mem_mb=None, duration_s=max(0.0, end - start),
            time_limit_s=_slurm_time(limit), nodes=int(field("NNodes") or 1)))
    return _from_zero(requests)


def _slurm_time(value: str) -> float | None:
    """Slurm's ``[D-]HH:MM:SS`` (or ``MM:SS``, ``UNLIMITED``) in seconds."""
    match = re.fullmatch(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)", value.strip())
    if not match:
        return None
    days, hours, minutes, seconds = (int(g or 0) for g in match.groups())
    return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)


def _from_zero(requests: list[Request]) -> list[Request]:
    """Submit times from the first submit on (a history's are Unix times)."""
    if not requests:
        return requests
    first = min(r.submit_s for r in requests)
    return [replace(r, submit_s=r.submit_s - first) for r in requests]


def write_trace(requests: Iterable[Request], path: Path) -> None:
    """A workload as a trace CSV (what ``from_trace`` reads)."""
    with path.open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(TRACE_FIELDS)
        for r in requests:
            writer.writerow([f"{r.submit_s:.0f}", r.user, r.gpus,
                             "" if r.gpu_mem_mb is None else f"{r.gpu_mem_mb / MIB_PER_GB:g}",
                             f"{r.duration_s:.0f}", "" if r.time_limit_s is None else f"{r.time_limit_s:.0f}",
                             r.nodes, int(r.service)])


# ------------------------------------------------------------------ the built-in month
@dataclass(frozen=True)
class Measured:
    """A parameter of the built-in month and where its figure comes from."""

    value: object
    source: str


#: The built-in lab month's parameters. Each one names where its figure comes from, and
#: whether it was checked against the study's own data (``checked``) or is our reading of
#: a study's shape (``shape``) or our own choice for a lab (``lab``). Philly: Jeon et al.,
#: "Analysis of Large-Scale Multi-Tenant GPU Clusters for DNN Training Workloads", USENIX
#: ATC '19. Helios: Hu et al., "Characterization and Prediction of Deep Learning Workloads
#: in Large-Scale GPU Datacenters", SC '21. PAI: Weng et al., "MLaaS in the Wild: Workload
#: Analysis and Scheduling in Large-Scale Heterogeneous GPU Clusters", NSDI '22.
#: The checks used the studies' published artefacts: the 83,154 Philly job run times that
#: the PAI authors compare with (github.com/alibaba/clusterdata,
#: cluster-trace-gpu-v2020/analysis/philly_runtime.csv, from msr-fiddle/philly-traces) and
#: the Helios authors' per-cluster summary (github.com/S-Lab-System-Group/HeliosArtifact,
#: analysis/1_compare with Philly trace/helios_cluster_summary.csv).
PARAMETERS = {
    # GPUs per job (shape): single-GPU jobs are the majority in each study and a few
    # multi-GPU jobs hold most GPU time. Checked only in part: the Helios summary gives a
    # median of 1 GPU per GPU job and a mean of 3.7 (its tail goes far past 8, which a lab
    # folds into its largest machine); the 70/15/10/5 split itself is ours.
    "gpus": Measured({1: 0.70, 2: 0.15, 4: 0.10, 8: 0.05},
                     "shape: Helios summary median 1 GPU per GPU job (mean 3.7); the split is ours"),
    # Durations (checked): the Philly run times have a median of 1,186 s (20 min), a p90 of
    # 12,860 s, 9.3% past 4 hours and 3.5% past a day. A log-normal with a median of 20
    # minutes and sigma 1.8 gives a p90 of 12,050 s, 8.4% past 4 hours but only 0.9% past a
    # day: the real tail is heavier. Helios's GPU jobs are shorter (median 206 s).
    "duration_median_s": Measured(1200.0, "checked: Philly run times, median 1,186 s (Helios: 206 s)"),
    "duration_sigma": Measured(1.8, "checked: Philly run times, p90 12,860 s (this gives 12,050 s)"),
    "duration_cap_s": Measured(5 * 86400.0, "checked: 0.6% of Philly jobs run past 5 days (cut there for a month)"),
    # Memory (shape): PAI's tasks use far less GPU than they ask for (its Fig. 6 data: 98%
    # of tasks plan more GPU than they use), which is what slices serve; the share of jobs
    # asking for a slice and the sizes of 4-24 GB are ours.
    "slice_share": Measured(0.45, "shape: PAI Fig. 6, 98% of tasks use less GPU than they ask; 45% is ours"),
    "slice_gb": Measured({4: 0.35, 8: 0.35, 16: 0.2, 24: 0.1}, "lab: the sizes are ours; PAI (Fig. 6) shows tasks need a fraction of a card"),
    # When people submit (shape): by hour of day and weekday (Helios and PAI both show a
    # diurnal submission pattern with quieter weekends; the numbers are ours).
    "hourly": Measured([0.3, 0.2, 0.15, 0.1, 0.1, 0.15, 0.3, 0.5, 0.8, 1.0, 1.2, 1.2,
                        1.0, 1.2, 1.4, 1.5, 1.5, 1.4, 1.2, 1.0, 0.9, 0.8, 0.6, 0.4],
                       "shape: Helios and PAI (Fig. 3) submissions follow the working day; numbers ours"),
    "weekday": Measured([1.0, 1.0, 1.0, 1.0, 0.9, 0.45, 0.4],
                        "shape: fewer weekend submissions (Helios, PAI Fig. 3); numbers ours"),
    # Time limits (lab): users state one for most jobs, generously; a job without one
    # never backfills.
    "time_limit_share": Measured(0.7, "lab: ours (1.5-4x the run time); the Helios and Philly traces record no time limits"),
    # A deadline week (lab): submissions double in the week before a deadline.
    "deadline_factor": Measured(2.0, "lab: ours; Philly and Helios report submission bursts, not measured here"),
    # Users (shape): a few heavy users submit most of the work (Helios §4 reports GPU time
    # concentrated in few users); the Zipf exponent is ours.
    "user_skew": Measured(1.2, "shape: GPU time concentrated in few users (Helios); Zipf 1.2 is ours"),
    "services": Measured(0.02, "shape: inference shares the cluster with training (PAI); 2% is ours"),
}


def lab_month(cards: int, largest: int, users: int = 12, days: float = 30, load: float = 0.8,
              seed: int = 2026, deadline_week: int | None = 3) -> list[Request]:
    """A month of a lab's jobs for ``cards`` GPUs, offering ``load`` × their GPU-hours of
    work, every shape drawn from ``PARAMETERS``. A lab's jobs are as large as its largest
    machine (``largest`` cards): the studies' larger sizes are folded into it. Deterministic
    for a seed."""
    rng = random.Random(seed)
    p = {name: m.value for name, m in PARAMETERS.items()}
    folded: dict[int, float] = {}
    for size, share in p["gpus"].items():
        size = min(size, max(1, largest))
        folded[size] = folded.get(size, 0.0) + share
    p["gpus"] = folded
    names = [f"user{n:02d}" for n in range(1, users + 1)]
    user_weights = [1 / (n ** p["user_skew"]) for n in range(1, users + 1)]
    sizes, size_weights = zip(*p["gpus"].items())
    slices, slice_weights = zip(*p["slice_gb"].items())
    # The rate is set so the month's jobs ask for about ``load`` × the cards' GPU-hours
    # (a slice counts as a quarter of a card): drawn at a first guess, then thinned.
    mean_hours = math.exp(math.log(p["duration_median_s"]) + p["duration_sigma"] ** 2 / 2) / 3600
    mean_gpus = sum(s * w for s, w in p["gpus"].items())
    base_rate = 2 * load * cards / (mean_hours * mean_gpus)  # jobs per hour at an average hour
    hourly, weekday = p["hourly"], p["weekday"]
    norm = sum(hourly) / 24 * sum(weekday) / 7
    requests, t, key = [], 0.0, 0
    peak = max(hourly) * max(weekday) * p["deadline_factor"] / norm
    while True:  # thinning: a Poisson process whose rate follows the hour and the weekday
        t += rng.expovariate(base_rate * peak / 3600)
        if t >= days * 86400:
            break
        day = int(t // 86400)
        rate = hourly[int(t % 86400 // 3600)] * weekday[day % 7] / norm
        if deadline_week is not None and day // 7 == deadline_week:
            rate *= p["deadline_factor"]
        if rng.random() * peak > rate:
            continue
        key += 1
        gpus = rng.choices(sizes, size_weights)[0]
        duration = min(p["duration_cap_s"], rng.lognormvariate(math.log(p["duration_median_s"]), p["duration_sigma"]))
        service = rng.random() < p["services"]
        mem = None
        if gpus == 1 and (service or rng.random() < p["slice_share"]):
            mem = rng.choices(slices, slice_weights)[0] * MIB_PER_GB
        limit = None
        if rng.random() < p["time_limit_share"] and not service:
            limit = math.ceil(duration * rng.uniform(1.5, 4.0) / 600) * 600
        requests.append(Request(key, t, rng.choices(names, user_weights)[0], gpus, mem,
                                duration if not service else days * 86400 - t, limit,
                                1, service))
    asked = sum((0.25 if r.gpu_mem_mb else r.gpus) * min(r.duration_s, days * 86400 - r.submit_s)
                for r in requests) / 3600
    keep = min(1.0, load * cards * days * 24 / asked) if asked else 1.0
    return [r for r in requests if rng.random() < keep]
