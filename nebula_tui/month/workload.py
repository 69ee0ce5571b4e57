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
#: Bounds on what a workload may ask, so a replay's memory and time stay bounded whatever
#: the file says (a job of 10^12 cards is built card by card by the figures): a job's cards
#: and nodes (far above any lab's; the head refuses above its own 64 as it would on a lab),
#: a card's memory (16 TB, the head's bound), a duration or time limit (10 years), a time
#: (the year 9999), the jobs in one file and the file's size.
MAX_JOB_GPUS = 4096
MAX_GPU_MEM_MB = 16 << 20
MAX_SPAN_S = 10 * 366 * 86400.0
MAX_TIME_S = 253402300799.0
MAX_REQUESTS = 1_000_000
MAX_FILE_BYTES = 256 << 20
USER_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}")


class WorkloadError(ValueError):
    """A workload that cannot be read; str() names the file and line and what to write."""


def read(path: Path) -> list[Request]:
    """Any workload file, told apart by its content: a trace CSV (its header), the JSON of
    ``nebula history --json``, or ``sacct --parsable2`` output (``|``-separated)."""
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as err:
        raise WorkloadError(f"{path}: cannot read it ({err.strerror})") from None
    if len(raw) > MAX_FILE_BYTES:
        raise WorkloadError(f"{path}: larger than {MAX_FILE_BYTES >> 20} MB; replay a shorter workload")
    text = raw.decode("utf-8", "replace")
    if text.lstrip()[:1] in ("[", "{"):
        requests = from_history(path, text)
    elif "|" in text.partition("\n")[0]:
        requests = from_sacct(path, text)
    else:
        requests = from_trace(path, text)
    if len(requests) > MAX_REQUESTS:
        raise WorkloadError(f"{path}: {len(requests)} jobs; a replay takes at most {MAX_REQUESTS}")
    return requests


def checked(where: str, r: Request) -> Request:
    """``r`` if every field is within bounds (finite, not negative, not huge); else a
    ``WorkloadError`` naming ``where`` (the file and line, or job) and the field."""
    def bad(field: str, value, bounds: str):
        raise WorkloadError(f"{where}: {field} is {value!r}; it must be {bounds}")

    def span(field: str, value, high: float, allow_none: bool = False):
        if value is None and allow_none:
            return
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) \
                or not 0 <= value <= high:
            bad(field, value, f"a number from 0 to {high:.0f}")

    span("submit time", r.submit_s, MAX_TIME_S)
    span("duration", r.duration_s, MAX_SPAN_S)
    span("time limit", r.time_limit_s, MAX_SPAN_S, allow_none=True)
    for field, value in (("gpus", r.gpus), ("nodes", r.nodes)):
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_JOB_GPUS:
            bad(field, value, f"a whole number from 1 to {MAX_JOB_GPUS}")
    if r.gpu_mem_mb is not None and (not isinstance(r.gpu_mem_mb, int) or isinstance(r.gpu_mem_mb, bool)
                                     or not 1 <= r.gpu_mem_mb <= MAX_GPU_MEM_MB):
        bad("GPU memory (MiB)", r.gpu_mem_mb, f"a whole number from 1 to {MAX_GPU_MEM_MB}")
    if not isinstance(r.user, str) or not USER_RE.fullmatch(r.user):
        bad("user", r.user, "a user name")
    return r


def _number(path: Path, line: int, field: str, value: str, kind=float, empty=None):
    if value is None or value.strip() == "":
        return empty
    try:
        number = kind(value)
    except ValueError:
        raise WorkloadError(f"{path}:{line}: {field} is {value!r}, not a number") from None
    if isinstance(number, float) and not math.isfinite(number) or number < 0:
        raise WorkloadError(f"{path}:{line}: {field} is {value!r}; it must be 0 or more")
    if number > MAX_TIME_S:  # before a huge value is built into anything
        raise WorkloadError(f"{path}:{line}: {field} is {value!r}; it is far too large")
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
        if not USER_RE.fullmatch(user):
            raise WorkloadError(f"{path}:{line}: user {user!r} is not a user name")
        gpus = _number(path, line, "gpus", row.get("gpus"), int, 1)
        mem = _number(path, line, "gpu_mem_gb", row.get("gpu_mem_gb"))
        if gpus < 1:
            raise WorkloadError(f"{path}:{line}: gpus is {gpus}; a job asks for 1 or more")
        requests.append(checked(f"{path}:{line}", Request(
            key=line, submit_s=_number(path, line, "submit_s", row.get("submit_s"), empty=0.0), user=user,
            gpus=gpus, gpu_mem_mb=None if mem is None else max(1, round(mem * MIB_PER_GB)),
            duration_s=_number(path, line, "duration_s", row.get("duration_s"), empty=0.0),
            time_limit_s=_number(path, line, "time_limit_s", row.get("time_limit_s")),
            nodes=max(1, _number(path, line, "nodes", row.get("nodes"), int, 1)),
            service=(row.get("service") or "0").strip() in ("1", "true", "yes"))))
    return _from_zero(requests)


def from_history(path: Path, text: str) -> list[Request]:
    """``nebula history --json``: each ended job that ran, as it was asked for."""
    def refuse_constant(name: str):
        raise ValueError(f"{name} is not a number JSON allows")

    try:
        data = json.loads(text, parse_constant=refuse_constant)
    except RecursionError:
        raise WorkloadError(f"{path}: not JSON nested as `nebula history --json` prints it") from None
    except ValueError as err:
        raise WorkloadError(f"{path}: not JSON ({str(err)[:200]})") from None
    rows = data.get("jobs") if isinstance(data, dict) else data
    if not isinstance(rows, list):
        raise WorkloadError(f"{path}: no list of jobs; save `nebula history --json` as it prints")
    requests = []
    for n, job in enumerate(rows, start=1):
        where = f"{path}: job {n}"
        try:
            started, ended = job.get("started_at"), job.get("ended_at")
            if started is None or ended is None:
                continue  # never ran: nothing says how long it would have
            started, ended = _json_number(where, "started_at", started), _json_number(where, "ended_at", ended)
            if ended < started:
                raise WorkloadError(f"{where}: ended_at is before started_at; save `nebula history --json` "
                                    f"as it prints")
            limit = job.get("time_limit_s")
            request = Request(
                key=int(job.get("id", n)), submit_s=_json_number(where, "submitted_at", job["submitted_at"]),
                user=job["user"], gpus=job.get("gpu_count") or 1, gpu_mem_mb=job.get("gpu_mem_mb"),
                duration_s=ended - started,
                time_limit_s=None if limit is None else _json_number(where, "time_limit_s", limit),
                nodes=job.get("nodes") or 1, service=bool(job.get("service")))
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as err:
            if isinstance(err, WorkloadError):
                raise
            raise WorkloadError(f"{where} lacks submitted_at, user or its times; "
                                f"save `nebula history --json` as it prints") from None
        requests.append(checked(where, request))
    return _from_zero(requests)


def _json_number(where: str, field: str, value) -> float:
    """A history's time field as a float: a finite JSON number, not negative."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) \
            or not 0 <= value <= MAX_TIME_S:
        raise WorkloadError(f"{where}: {field} is {value!r}; it must be a time in seconds, 0 or more")
    return float(value)


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
        limit, nodes = field("Timelimit"), field("NNodes") or "1"
        if not (nodes.isascii() and nodes.isdigit()) or len(gpus[1]) > 12 or len(nodes) > 12:
            raise WorkloadError(f"{path}:{line}: NNodes {nodes!r} or AllocTRES's gres/gpu is not a count")
        requests.append(checked(f"{path}:{line}", Request(
            key=line, submit_s=submit or start, user=field("User") or "unknown", gpus=int(gpus[1]),
            gpu_mem_mb=None, duration_s=max(0.0, end - start),
            time_limit_s=_slurm_time(limit), nodes=int(nodes))))
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


#: The built-in lab month's parameters. Each one names the study and the figure its value
#: was taken from, or says plainly that no study measures it and why the value was chosen.
#: Philly: Jeon et al., "Analysis of Large-Scale Multi-Tenant GPU Clusters for DNN Training
#: Workloads", USENIX ATC '19. Helios: Hu et al., "Characterization and Prediction of Deep
#: Learning Workloads in Large-Scale GPU Datacenters", SC '21. PAI: Weng et al., "MLaaS in
#: the Wild: Workload Analysis and Scheduling in Large-Scale Heterogeneous GPU Clusters",
#: NSDI '22.
#: The job tables themselves could not be read here (Helios ``data.zip``, Philly
#: ``trace-data.tar.gz`` and PAI's ``pai_job_table`` are download-only), so the figures come
#: from what the authors published beside them:
#: - Philly: the 83,154 run times the PAI authors compare with
#:   (github.com/alibaba/clusterdata, cluster-trace-gpu-v2020/analysis/philly_runtime.csv);
#: - Helios: the figures drawn by the authors' notebooks, embedded in the notebooks' saved
#:   output (github.com/S-Lab-System-Group/HeliosArtifact, analysis/2_cluster characterization,
#:   3_job characterization, 4_user characterization), and its per-cluster summary CSV;
#: - PAI: the figures drawn by the authors' notebook, embedded in its saved output
#:   (github.com/alibaba/clusterdata, cluster-trace-gpu-v2020/analysis/analysis.ipynb, whose
#:   cells are headed with the paper's figure numbers).
#: Values "read off" a figure were measured from the plot's pixels against its axis ticks
#: (about ±2 points of a percentage, ±5 jobs an hour); the Helios figures are named by the
#: file the notebook saves, because the paper's figure numbers were not checked here.
PARAMETERS = {
    # GPUs per job: Helios, the CDF of GPU jobs by GPU number (HeliosArtifact
    # job_cdf_gpunum.pdf, panel a), read off for its four clusters (Venus, Earth, Saturn,
    # Uranus) at 1, 2, 4 and 8 GPUs: 53/89/73/67%, 57/90/74/70%, 66/92/79/76%,
    # 88/95/95/92%. Their mean: 70% of GPU jobs ask for 1 GPU, 2% for 2, 6% for 3-4, 14% for
    # 5-8 and 8% for more than 8 (the summary CSV: median 1 GPU, mean 3.7). 3-GPU jobs are
    # counted as 4 and 5-7 as 8; jobs past 8 are folded into 8 here and, like every size,
    # into the lab's largest machine by ``lab_month``.
    "gpus": Measured({1: 0.70, 2: 0.02, 4: 0.06, 8: 0.22},
                     "Helios job_cdf_gpunum (a), mean of 4 clusters: 1 GPU 70%, 2: 2%, 3-4: 6%, "
                     "5-8: 14%, >8: 8% (folded into 8)"),
    # Durations (checked): the Philly run times have a median of 1,186 s (20 min), a p90 of
    # 12,860 s, 9.3% past 4 hours and 3.5% past a day. A log-normal with a median of 20
    # minutes and sigma 1.8 gives a p90 of 12,050 s, 8.4% past 4 hours but only 0.9% past a
    # day: the real tail is heavier. Helios's GPU jobs are shorter (median 206 s).
    "duration_median_s": Measured(1200.0, "checked: Philly run times, median 1,186 s (Helios: 206 s)"),
    "duration_sigma": Measured(1.8, "checked: Philly run times, p90 12,860 s (this gives 12,050 s)"),
    "duration_cap_s": Measured(5 * 86400.0, "checked: 0.6% of Philly jobs run past 5 days (cut there for a month)"),
    # Slices: PAI Fig. 5, the proportion of tasks by GPU request (the notebook's bar chart),
    # read off: 14.6% ask for under 25% of a GPU, 26.3% for 25-50%, 13.1% for 50-100%, 42.8%
    # for one GPU and 2.6% for more. So of the tasks asking for at most one GPU, 56% ask for
    # part of one: 54.0 / (54.0 + 42.8). (PAI Fig. 6's data: 98% of tasks use less GPU than
    # they plan.) Applied to the month's 1-GPU jobs.
    "slice_share": Measured(0.56, "PAI Fig. 5: 54.0% of tasks ask <1 GPU, 42.8% one GPU; 54.0/96.8 = 56%"),
    # Slice sizes: the shares are PAI Fig. 5's three fractional buckets (14.6 : 26.3 : 13.1
    # of 54.0). PAI counts a share of a GPU, not gigabytes: each bucket is put at one size
    # inside it on a 24 GB card (under 6 GB: 4; 6-12 GB: 8; 12-24 GB: 16), which is ours.
    "slice_gb": Measured({4: 0.27, 8: 0.49, 16: 0.24},
                         "PAI Fig. 5: <25% of a GPU 27%, 25-50% 49%, 50-100% 24% of sliced tasks; "
                         "the GB per bucket (on a 24 GB card) is ours"),
    # By hour: Helios, average GPU jobs submitted per hour of day (HeliosArtifact
    # cluster_diurnal.pdf, panel b), read off and summed over the four clusters: 329 at
    # midnight, a trough of 179 at 7:00, a peak of 544 at 16:00; below, each hour over the
    # day's mean (403). PAI Fig. 3's tasks per hour have the same trough (3-5 am) and peaks
    # (10-11, 14-17).
    "hourly": Measured([0.91, 0.84, 0.67, 0.58, 0.55, 0.55, 0.54, 0.49, 0.55, 0.82, 1.12, 1.24,
                        1.19, 1.24, 1.33, 1.42, 1.50, 1.33, 1.11, 1.21, 1.32, 1.23, 1.16, 1.09],
                       "Helios cluster_diurnal (b): GPU jobs submitted per hour, 4 clusters summed, "
                       "over their mean"),
    # By weekday, Monday first: PAI Fig. 3, tasks submitted per hour over one week (Sunday
    # to Saturday), read off and averaged per day: Sun 569, Mon 720, Tue 768, Wed 732,
    # Thu 766, Fri 706, Sat 540; each over the week's mean. Neither Philly nor Helios
    # publishes a weekday figure.
    "weekday": Measured([1.05, 1.12, 1.07, 1.12, 1.03, 0.79, 0.83],
                        "PAI Fig. 3: tasks per hour over a week, Mon 720 ... Sat 540, Sun 569, over the mean"),
    # Time limits: no study measures them, because no trace records a requested limit
    # (Philly's cluster_job_log, Helios's cluster_log.csv and PAI's job and task tables have
    # no such field; Helios only has a TIMEOUT state, "very rare" in its README). 70%, at
    # 1.5-4x the run time, is ours: a lab on Slurm states one for most jobs, generously.
    "time_limit_share": Measured(0.7, "none: the Philly, Helios and PAI traces record no time limit; 70% is ours"),
    # A deadline week: no study measures one. The nearest figure is Helios's monthly trend
    # (HeliosArtifact cluster_monthly.pdf, panel a): a cluster's GPU jobs vary from month to
    # month by up to about 3x (Saturn: about 200,000 in April, about 70,000 in May). The
    # week and the doubling are ours.
    "deadline_factor": Measured(2.0, "none: Philly, Helios and PAI measure no deadline week; Helios "
                                     "cluster_monthly (a) shows up to ~3x between months; 2x is ours"),
    # Users: Helios, the CDF of users by their share of GPU time (HeliosArtifact
    # user_cdf_time.pdf, panel a), read off at 1, 2, 3 and 4 twelfths of the users: the
    # top 8% of users hold 60-76% of GPU time (mean 68%), the top 17% 83%, the top 25% 90%,
    # the top 33% 96%. With 12 users a Zipf exponent of 2.2 gives 69%, 84%, 90%, 93%.
    "user_skew": Measured(2.2, "Helios user_cdf_time (a): top 1/12 of users 68% of GPU time, "
                               "top 3/12 90%; Zipf 2.2 over 12 users gives 69%, 90%"),
    # Services: no figure. Philly and Helios are training clusters; PAI mixes training and
    # inference, but its notebook's figures give no share of long-running services. 2% is
    # ours: a lab's few demo and notebook servers.
    "services": Measured(0.02, "none: Philly and Helios are training-only; PAI publishes no "
                               "service share; 2% is ours"),
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
