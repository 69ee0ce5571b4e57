"""Slurm's outputs as plain data: pure functions, no I/O (tests/data/slurm holds real ones).

Slurm 22.05 has ``--json`` for ``squeue``; older ones only the ``-O`` format, which a pool
falls back on (``has_json``, from ``sinfo --version`` read at connect). ``sinfo`` is read
in its ``-O`` format everywhere: its ``--json`` is some 1.3 KiB a node. A
job's GPUs are its allocation's TRES (``gres/gpu=N``), never ``squeue %b``: that is the
request per node (N/A for ``--gpus``, one node's share for ``--gpus-per-node``). A
job's end comes from ``sacct`` where the cluster keeps accounting, else from ``squeue -t
all`` while the job is still listed (``MinJobAge``, 300 s by default). Any text gives an
answer or ``ValueError``: the cluster's output is never trusted to be well-formed, nor
to be ours — each job carries the user Slurm lists it under, which the pool checks.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace

from ..model import JobState

#: what ``squeue -O`` prints per job when a cluster has no ``--json`` (one line, each field
#: ended by ``|``, none cut); ``-o`` has no allocated TRES (its ``%b`` is the request per node)
SQUEUE_FORMAT = ("JobID:|,State:|,Reason:|,NodeList:|,Comment:|,StartTime:|,EndTime:|,UserName:|,"
                 "QOS:|,Partition:|,tres-alloc:|")
#: what ``sinfo -N -O`` prints per node and partition, the fields the capacity uses and no
#: more (``-o`` has no GPUs in use)
SINFO_FORMAT = "NodeList:|,Gres:|,StateLong:|,Partition:|,GresUsed:|"
#: the fields ``sacct`` is asked for, in this order
SACCT_FORMAT = "JobID,State,ExitCode,Elapsed,AllocTRES,Start,End,User,QOS,Partition"


#: Slurm's states in which a job waits, runs, or has ended (``JOB_STATE_STRING``)
WAITING = frozenset({"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD",
                     "RESV_DEL_HOLD", "SPECIAL_EXIT"})
RUNNING = frozenset({"RUNNING", "COMPLETING", "SUSPENDED", "STOPPED", "RESIZING", "SIGNALING",
                     "STAGE_OUT"})


@dataclass(frozen=True)
class SlurmJob:
    """One job as ``squeue`` (or ``sacct``) lists it."""

    slurm_id: str
    state: str  # Slurm's word: PENDING, RUNNING, COMPLETED, TIMEOUT …
    reason: str = ""  # Slurm's reason: Resources, Priority, TimeLimit … ("" for None)
    nodes: tuple[str, ...] = ()
    comment: str = ""  # where NebulaGrid's token is
    start: float | None = None
    end: float | None = None
    exit_code: int | None = None  # the command's exit status
    signal: int | None = None  # the signal that killed it, if one did
    elapsed_s: float | None = None  # sacct's Elapsed
    user: str = ""  # the account Slurm lists it under ("" where the output does not say)
    gpus: int | None = None  # its allocation's GPUs (AllocTRES gres/gpu; None before one)
    qos: str = ""
    partition: str = ""
    #: what the job asks of Slurm now (its owner may ``scontrol update`` a waiting job's
    #: request): its GPUs in all, its nodes (None: the output does not say)
    requested_gpus: int | None = None
    requested_nodes: int | None = None
    #: sacct -D: the runs of this job id before its last (requeued), each (elapsed, GPUs,
    #: start)
    earlier: tuple[tuple[float, int | None, float | None], ...] = ()

    @property
    def waiting(self) -> bool:
        return self.state in WAITING

    @property
    def running(self) -> bool:
        return self.state in RUNNING


@dataclass(frozen=True)
class SlurmNode:
    """One node as ``sinfo -N`` lists it."""

    name: str
    state: str  # idle, mixed, allocated, drained, down …
    gpus: int
    gpus_used: int | None  # None: this output does not say
    partitions: tuple[str, ...] = ()

    @property
    def usable(self) -> bool:
        """Whether it takes jobs at all (not down, drained or failing)."""
        bad = ("down", "drain", "fail", "maint", "reboot", "unknown", "not_responding",
               "power_down", "powered_down", "inval", "future")
        return not any(word in self.state.lower() for word in bad)


# ------------------------------------------------------------------------- small words
def parse_sbatch(text: str) -> str:
    """``sbatch --parsable``'s answer (``jobid[;cluster]``) -> the job id."""
    line = text.strip().splitlines()[-1] if text.strip() else ""
    slurm_id = line.split(";", 1)[0].strip()
    if not slurm_id.isdigit():
        raise ValueError(f"sbatch did not answer a job id: {text.strip()[:200]!r}")
    return slurm_id


def parse_version(text: str) -> tuple[int, ...]:
    """``sinfo --version`` ("slurm-wlm 22.05.8", "slurm 23.11.4") -> (22, 5, 8)."""
    found = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    if not found:
        raise ValueError(f"not a Slurm version: {text.strip()[:80]!r}")
    return tuple(int(part) for part in found.groups() if part is not None)


def version_text(version: tuple[int, ...]) -> str:
    return ".".join(f"{part:02d}" if i == 1 else str(part) for i, part in enumerate(version))


def has_json(version: tuple[int, ...]) -> bool:
    """``squeue --json`` came with 21.08 (its openapi plugin)."""
    return version >= (21, 8)


def expand_hostlist(text: str) -> tuple[str, ...]:
    """Slurm's compressed host list ("n[1-3,5],gpu-[08-09]") -> each name, in order."""
    if (text or "").count("[") != (text or "").count("]"):
        raise ValueError(f"not a Slurm host list: {text[:200]!r}")
    names: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\][^,\[]*)*", text or ""):
        part = part.strip()
        if not part:
            continue
        found = re.fullmatch(r"([^\[]*)\[([^\]]*)\](.*)", part)
        if not found:
            names.append(part)
            continue
        prefix, ranges, rest = found.groups()
        for piece in ranges.split(","):
            low, _, high = piece.partition("-")
            if not low.isdigit() or (high and not high.isdigit()):
                raise ValueError(f"not a Slurm host list: {text[:200]!r}")
            width = len(low)
            for number in range(int(low), int(high or low) + 1):
                for tail in expand_hostlist(rest) if "[" in rest else (rest,):
                    names.append(f"{prefix}{number:0{width}d}{tail}")
                if len(names) > 100_000:
                    raise ValueError("host list too long")
    return tuple(names)


#: a duration as Slurm writes one: [D-][[HH:]MM:]SS[.fff], digits only (no sign, no "nan")
_DURATION = re.compile(r"(?:\d{1,6}-)?(?:\d{1,9}:){0,2}\d{1,9}(?:\.\d{1,6})?")
#: more GPUs than any one job's allocation holds: not Slurm's answer
MAX_JOB_GPUS = 100_000


def parse_elapsed(text: str) -> float:
    """Slurm's durations ("1-02:03:04", "02:03:04", "03:04") -> seconds; anything else
    (a sign, "nan", an exponent: not Slurm's) is ValueError."""
    text = text.strip()
    if not _DURATION.fullmatch(text):
        raise ValueError(f"not a Slurm duration: {text[:40]!r}")
    days = 0
    if "-" in text:
        day, _, text = text.partition("-")
        days = int(day)
    parts = [float(p) for p in text.split(":")]
    if not 1 <= len(parts) <= 3:
        raise ValueError(f"not a Slurm duration: {text!r}")
    while len(parts) < 3:
        parts.insert(0, 0.0)
    hours, minutes, seconds = parts
    return days * 86400 + hours * 3600 + minutes * 60 + seconds


def gres_gpus(text: str) -> int:
    """The GPUs a gres string holds ("gpu:4", "gpu:a100:2(S:0-1),shard:8", "gres:gpu:2")."""
    total = 0
    for item in re.split(r",(?![^()]*\))", text or ""):
        item = re.sub(r"\([^)]*\)", "", item.strip())  # "(IDX:0-1)", a "(null)" type
        if item.startswith("gres:"):
            item = item[len("gres:"):]
        words = item.split(":")
        if words[0] == "gpu" and len(words) >= 2 and words[-1].isdigit():
            total += int(words[-1])
    return total


def tres_gpus(text: str) -> int | None:
    """The GPUs a TRES list holds ("billing=1,cpu=1,gres/gpu=4,node=1" -> 4); where it has
    typed counts alone (``AccountingStorageTRES=gres/gpu:a100``, no untyped ``gres/gpu``),
    their sum; None when it names none (a pending job's is empty)."""
    found = re.search(r"(?:^|,)gres/gpu=(\d{1,9})(?:,|$)", text or "")
    if found:
        count = int(found.group(1))
    else:
        typed = re.findall(r"(?:^|,)gres/gpu:[^=,]+=(\d{1,9})(?=,|$)", text or "")
        if not typed:
            return None
        count = sum(int(n) for n in typed)
    return count if count <= MAX_JOB_GPUS else None


def _exit_and_signal(raw: int | None) -> tuple[int | None, int | None]:
    """squeue --json's ``exit_code`` is a wait status: the code in its high byte, or the
    signal in its low bits."""
    if raw is None:
        return None, None
    if raw & 0x7F:
        return None, raw & 0x7F
    return (raw >> 8) & 0xFF, None


def _time(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and 0 < value < 4e9 else None


def _iso_time(text: str) -> float | None:
    """squeue -o %S / sacct Start ("2026-12-03T18:05:00", "N/A", "Unknown", "None")."""
    import datetime

    try:
        return datetime.datetime.fromisoformat(text.strip()).timestamp()
    except ValueError:
        return None


# ------------------------------------------------------------------------------- squeue
def _json_items(text: str, key: str, needed: str, what: str) -> list[dict]:
    """The objects of the list ``key`` of a --json document that have ``needed``."""
    try:
        listed = json.loads(text)[key]
    except RecursionError:
        # The depth bound: json's C decoder counts its nesting against the interpreter's
        # recursion limit (about 1,000; Slurm's answers nest 9 deep) and stops there, in
        # constant stack, before reading on.
        raise ValueError(f"{what} nests deeper than any Slurm answer") from None
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{what} gave no {key} list: {err}") from None
    if not isinstance(listed, list):
        raise ValueError(f"{what} gave no {key} list")
    return [item for item in listed if isinstance(item, dict) and needed in item]


def parse_squeue_json(text: str) -> list[SlurmJob]:
    """``squeue --json`` (22.05's openapi v0.0.38 and its neighbours)."""
    return squeue_json_jobs(_json_items(text, "jobs", "job_id", "squeue --json"))


def squeue_json_jobs(items: list[dict]) -> list[SlurmJob]:
    """The jobs of ``squeue --json``'s ``jobs`` list (each a dict with a ``job_id``)."""
    jobs = []
    for item in items:
        state = item.get("job_state")
        if isinstance(state, list):  # newer openapi versions give a list of flags
            state = state[0] if state else ""
        code, signal = _exit_and_signal(item.get("exit_code") if isinstance(item.get("exit_code"), int)
                                        else None)
        jobs.append(_listed(str(item["job_id"]), str(state or ""), str(item.get("state_reason") or ""),
                            str(item.get("nodes") or ""), str(item.get("comment") or ""),
                            _time(item.get("start_time")), _time(item.get("end_time")), code, signal,
                            user=str(item.get("user_name") or ""), qos=str(item.get("qos") or ""),
                            partition=str(item.get("partition") or ""),
                            gpus=tres_gpus(str(item.get("tres_alloc_str") or ""))))
        jobs[-1] = replace(jobs[-1], requested_nodes=_count(item.get("node_count")),
                           requested_gpus=_requested_gpus(item, _count(item.get("node_count"))))
    return jobs


def _count(value) -> int | None:
    """A count of squeue --json's (a number, or newer openapi's {"set", "number"})."""
    if isinstance(value, dict):
        value = value.get("number") if value.get("set", True) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_JOB_GPUS \
        else None


def _requested_gpus(item: dict, nodes: int | None) -> int | None:
    """The GPUs a job asks for in all: its requested TRES's (``gres/gpu=N``), else its
    per-node gres (``gres:gpu:N``) times its nodes."""
    asked = tres_gpus(str(item.get("tres_req_str") or ""))
    if asked is not None:
        return asked
    per_node = gres_gpus(str(item.get("tres_per_node") or ""))
    return per_node * nodes if per_node and nodes else None


def _listed(slurm_id: str, state: str, reason: str, nodes: str, comment: str, start: float | None,
            end: float | None, code: int | None = None, signal: int | None = None,
            user: str = "", qos: str = "", partition: str = "", gpus: int | None = None) -> SlurmJob:
    """A job as squeue lists it: a start only once it started, an end only once it ended
    (squeue gives the expected ones before), GPUs once allocated (``-O tres-alloc`` gives a
    waiting job's request)."""
    state = state.upper()
    return SlurmJob(slurm_id=slurm_id, state=state, reason="" if reason == "None" else reason,
                    nodes=expand_hostlist(nodes), comment=comment,
                    start=start if state != "PENDING" else None,
                    end=end if state not in WAITING | RUNNING else None,
                    exit_code=code, signal=signal, user=user, qos=qos, partition=partition,
                    gpus=gpus if state not in WAITING else None)


def parse_squeue_text(text: str) -> list[SlurmJob]:
    """``squeue -h -O SQUEUE_FORMAT`` (clusters without --json; the first seven fields are
    also ``-o '%i|%T|%r|%N|%k|%S|%e'``'s); no exit codes there."""
    jobs = []
    for line in lines(text):
        fields = line.split("|")
        if len(fields) < 7 or not fields[0].strip():
            continue
        slurm_id, state, reason, nodes, comment, start, end = (f.strip() for f in fields[:7])
        user, qos, partition, tres = (f.strip() for f in (fields[7:11] + [""] * 4)[:4])
        jobs.append(_listed(slurm_id, state, reason, nodes, comment, _iso_time(start), _iso_time(end),
                            user=user, qos=qos, partition=partition, gpus=tres_gpus(tres)))
    return jobs


# -------------------------------------------------------------------------------- sinfo
def parse_sinfo_text(text: str) -> list[SlurmNode]:
    """``sinfo -h -N -O SINFO_FORMAT``: one line per node and partition (merged here). The
    older ``-o '%N|%G|%T|%P'`` has no GPUs in use (``gpus_used`` None)."""
    merged: dict[str, SlurmNode] = {}
    for line in lines(text):
        fields = line.split("|")
        if len(fields) < 4 or not fields[0].strip():
            continue
        name, gres, state, partition = (f.strip() for f in fields[:4])
        used = fields[4].strip() if len(fields) > 4 else ""
        partition = partition.rstrip("*")  # the default partition's mark
        known = merged.get(name)
        parts = (known.partitions if known else ()) + ((partition,) if partition else ())
        merged[name] = SlurmNode(name, state.lower(), gres_gpus(gres),
                                 gres_gpus(used) if used else None, parts)
    return list(merged.values())


# -------------------------------------------------------------------------------- sacct
def parse_sacct(text: str) -> dict[str, SlurmJob]:
    """``sacct -X -n -P --format=SACCT_FORMAT``: job id -> its state, exit code, signal,
    elapsed time ("CANCELLED by 1000" is CANCELLED). With ``-D`` a requeued job has a line
    per run: its last run's (the latest start), the ones before in its ``earlier``."""
    runs: dict[str, list[SlurmJob]] = {}
    for job in _sacct_lines(text):
        runs.setdefault(job.slurm_id, []).append(job)
    found = {}
    for slurm_id, each in runs.items():
        each.sort(key=lambda job: float("inf") if job.start is None else job.start)
        found[slurm_id] = replace(each[-1], earlier=tuple((job.elapsed_s or 0.0, job.gpus, job.start)
                                                          for job in each[:-1]))
    return found


def submit_line_comment(text: str) -> str | None:
    """The ``--comment`` our sbatch gave, from sacct's ``SubmitLine`` (the command line as
    typed, its words joined by spaces, nothing quoted): the last one, since a job's name
    comes before it and may hold `` --comment=…`` itself; None without one."""
    found = re.findall(r"(?:^| )--comment=(\S+)", text)
    return found[-1] if found else None


def lines(text: str) -> list[str]:
    """A command's output lines: cut at newlines only. ``str.splitlines`` also cuts at
    \\r, \\x1c-\\x1e and \\x85, which a job's name (in sacct's SubmitLine) may hold: a
    line a user wrote would be read as one of Slurm's."""
    return text.split("\n")


def _sacct_lines(text: str) -> list[SlurmJob]:
    found = []
    for line in lines(text):
        fields = line.split("|")
        if len(fields) < 4 or not fields[0].strip():
            continue
        slurm_id, state, exit_field, elapsed = (f.strip() for f in fields[:4])
        code_text, _, signal_text = exit_field.partition(":")
        try:
            code, signal = int(code_text), int(signal_text or 0)
            elapsed_s = parse_elapsed(elapsed)
        except ValueError:
            continue
        start = _iso_time(fields[5]) if len(fields) > 5 else None
        end = _iso_time(fields[6]) if len(fields) > 6 else None
        user, qos, partition = (f.strip() for f in (fields[7:10] + ["", "", ""])[:3])
        word = state.split()[0].upper() if state else ""
        found.append(SlurmJob(slurm_id=slurm_id, state=word,
                              reason=state if word != state.upper() else "",
                              exit_code=None if signal else code, signal=signal or None,
                              elapsed_s=elapsed_s, start=start, end=end, user=user,
                              gpus=tres_gpus(fields[4]) if len(fields) > 4 else None,
                              qos=qos, partition=partition))
    return found


# ------------------------------------------------------------------------------ our end
def end_of(job: SlurmJob, pool: str) -> tuple[JobState, str] | None:
    """How a job Slurm reports ended ends here (state, reason in our words with Slurm's),
    or None while it waits or runs. PREEMPTED is for the caller: requeued or failed as the
    job asked (``PREEMPTED`` comes back as FAILED here with that reason)."""
    state = job.state
    if state in WAITING or state in RUNNING or not state:
        return None
    code = f"exit code {job.exit_code}" if job.exit_code is not None else (
        f"killed by signal {job.signal}" if job.signal else "")
    if state == "COMPLETED":
        return (JobState.SUCCEEDED, "") if job.exit_code in (0, None) else (JobState.FAILED, code)
    if state in ("TIMEOUT", "DEADLINE"):
        return JobState.TIMEOUT, f"its time limit was reached in pool {pool} ({state})"
    if state == "CANCELLED":
        by = f" ({job.reason})" if job.reason.upper().startswith("CANCELLED BY") else ""
        return JobState.CANCELLED, f"cancelled in pool {pool}{by}"
    if state == "OUT_OF_MEMORY":
        return JobState.FAILED, f"out of memory in pool {pool} (OUT_OF_MEMORY)"
    if state == "NODE_FAIL":
        return JobState.FAILED, f"a node of pool {pool} failed under it (NODE_FAIL)"
    if state == "PREEMPTED":
        return JobState.FAILED, f"preempted in pool {pool} (PREEMPTED)"
    if state == "BOOT_FAIL":
        return JobState.FAILED, f"its node in pool {pool} failed to boot (BOOT_FAIL)"
    if state == "FAILED":
        why = job.reason if job.reason and job.reason != "NonZeroExitCode" else ""
        text = ", ".join(part for part in (code, why) if part)
        return JobState.FAILED, f"failed in pool {pool}" + (f": {text}" if text else "")
    return JobState.FAILED, f"ended in pool {pool} as {state}"
