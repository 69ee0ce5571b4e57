"""Slurm's words on NebulaGrid's command line: the value forms sbatch and srun take
(``-G a100:2``, ``--gres=gpu:2``, ``-d afterok:12:13``, ``--qos=scavenger``,
``--mail-type=END``), the Slurm options NebulaGrid cannot honour (each said in one line,
never silently dropped), and the ``#SBATCH``/``#NEBULA`` lines at the top of a job script,
which go through the same parser as the command line."""

from __future__ import annotations

import argparse
import os
import re
import shlex
import time
from collections.abc import Sequence

from ..model import VENDORS
from ..wire import QueueRow
from .args import job_id

#: ``-G TYPE:N``: a card model (as Slurm's gres types name them) -> the --arch it means
GPU_MODELS = {
    "v100": "sm_70", "t4": "sm_75", "a100": "sm_80", "a30": "sm_80", "a40": "sm_86",
    "a10": "sm_86", "a6000": "sm_86", "3090": "sm_86", "rtx3090": "sm_86", "l4": "sm_89",
    "l40": "sm_89", "l40s": "sm_89", "4090": "sm_89", "rtx4090": "sm_89", "h100": "sm_90",
    "h200": "sm_90", "gh200": "sm_90", "b200": "sm_100", "mi100": "gfx908", "mi210": "gfx90a",
    "mi250": "gfx90a", "mi250x": "gfx90a", "mi300": "gfx942", "mi300x": "gfx942",
}
_ARCH = re.compile(r"^(sm_\d{2,3}|gfx\d{1,2}[0-9a-f]{2})$")


def gpu_type(kind: str) -> dict:
    """A gres type -> the flags it stands for: a vendor (``nvidia``), a model (``a100``:
    --arch sm_80) or an arch itself (``sm_89``)."""
    word = kind.lower()
    if word in VENDORS:
        return {"vendor": word}
    if word in GPU_MODELS:
        return {"arch": GPU_MODELS[word]}
    if _ARCH.match(word):
        return {"arch": word}
    raise argparse.ArgumentTypeError(
        f"GPU type '{kind}' is not a vendor ({', '.join(VENDORS)}), a model (a100, h100, "
        "l40s, 4090, mi250…) or an arch (sm_89, gfx90a)")


def _count(text: str, flag: str, example: str) -> int:
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{flag}: '{text}' is not a GPU count of 1 or more; "
                                         f"write it like {example}")
    return int(text)


def gpus(text: str) -> tuple[int, dict]:
    """``-G 2`` or ``-G a100:2`` (Slurm's ``--gpus=[type:]count``) -> (count, flags)."""
    kind, _, number = text.rpartition(":")
    return _count(number, "--gpus", "2 or a100:2"), gpu_type(kind) if kind else {}


def gres(text: str) -> tuple[int, dict]:
    """``--gres=gpu``, ``gpu:2``, ``gpu:a100:2`` (per node, as in Slurm) -> (count, flags)."""
    parts = text.split(":")
    if "," in text or parts[0] != "gpu" or len(parts) > 3:
        raise argparse.ArgumentTypeError(
            f"--gres '{text}': only GPUs can be asked for here, as gpu:2 or gpu:a100:2")
    if len(parts) == 1:
        return 1, {}
    if len(parts) == 2 and not parts[1].isdigit():
        return 1, gpu_type(parts[1])
    return _count(parts[-1], "--gres", "gpu:2 or gpu:a100:2"), gpu_type(parts[1]) if len(parts) == 3 else {}


class GpuRequest(argparse.Action):
    """``--gpu-count``/``-G``/``--gpus`` (the job's GPUs in all) and ``--gres``/
    ``--gpus-per-node`` (per node, times --nodes): the last one given wins, as in Slurm;
    a type sets --vendor or --arch."""

    def __call__(self, parser, namespace, values, option_string=None):
        number, flags = values
        per_node = self.dest == "gpus_per_node"
        namespace.gpu_count = number
        namespace.gpus_per_node = number if per_node else None
        for key, value in flags.items():
            setattr(namespace, key, value)


#: Slurm's dependency words -> NebulaGrid's --after kinds
_KINDS = {"afterok": "ok", "afterany": "any", "afternotok": "notok", "after": "started",
          "ok": "ok", "any": "any", "notok": "notok", "started": "started"}


def dependency(text: str, bare: str = "any") -> tuple[str, list[int]]:
    """``afterok:12:13``, ``afterany:12``, ``afternotok:12``, ``after:12`` (and the words of
    ``--after``: ``ok``, ``any``, ``notok``, ``started``) -> (kind, ids). Ids follow their
    kind after ``:`` or ``,``; a bare id is ``bare`` (Slurm: afterany). One kind a job."""
    kinds: set[str] = set()
    ids: list[int] = []
    for part in text.split(","):
        words = part.split(":")
        if not words[0].isdigit():
            word = words.pop(0)
            if word not in _KINDS:
                raise argparse.ArgumentTypeError(
                    f"'{text}': '{word}' is not a dependency NebulaGrid keeps; the kinds are "
                    "afterok, afterany, afternotok and after (or ok, any, notok, started)")
            kinds.add(_KINDS[word])
            if not words:
                raise argparse.ArgumentTypeError(f"'{text}': give the job ids after {word}:, "
                                                 f"e.g. {word}:12")
        elif not kinds:
            kinds.add(bare)
        ids += [job_id(w) for w in words]
    if len(kinds) > 1:
        raise argparse.ArgumentTypeError(f"'{text}': give one kind of dependency for all its jobs")
    return kinds.pop(), ids


def after(text: str) -> tuple[str, list[int]]:
    """``--after``: NebulaGrid's words, a bare id waiting for success (``12``, ``12,13``,
    ``any:12``, ``notok:12,13``, ``started:12``), and Slurm's (``afterok:12:13``)."""
    return dependency(text, bare="ok")


class Qos(argparse.Action):
    """``--qos=scavenger`` is --preemptible; ``normal`` asks for nothing more; any other
    quality of service is not one NebulaGrid has (said, then ignored)."""

    def __call__(self, parser, namespace, values, option_string=None):
        if values in ("scavenger", "preemptible"):
            namespace.preemptible = True
        elif values != "normal":
            Unhonoured.note(namespace, f"{option_string}={values}",
                            "the only qualities of service here are normal and scavenger "
                            "(= --preemptible)")


def export(text: str) -> list[list[str]]:
    """``--export``: ``ALL`` (the default), ``NONE``, ``ALL,VAR=val,…``, ``VAR=val`` or a
    bare ``VAR`` (its value here, as Slurm takes it) -> [[VAR, val], …]. ALL and NONE mean
    the same here: a job never gets the submitter's whole environment."""
    pairs = []
    for word in text.split(","):
        if word in ("ALL", "NONE", ""):
            continue
        name, eq, value = word.partition("=")
        if not eq:
            if name not in os.environ:
                raise argparse.ArgumentTypeError(f"--export {name}: not set here; give {name}=value")
            value = os.environ[name]
        pairs.append([name, value])
    return pairs


class MailType(argparse.Action):
    """``--mail-type=END,FAIL…`` is --notify (NONE: no mail)."""

    def __call__(self, parser, namespace, values, option_string=None):
        namespace.notify = values.upper() != "NONE"


#: Slurm options NebulaGrid cannot honour: (flags, takes a value, why)
UNHONOURED = (
    (("-n", "--ntasks"), True, "a job here is one command per node; start ranks with torchrun"),
    (("--ntasks-per-node",), True, "a job here is one command per node; start ranks with torchrun"),
    (("-c", "--cpus-per-task"), True, "a job gets its node's CPUs, shared"),
    (("--cpus-per-gpu",), True, "a job gets its node's CPUs, shared"),
    (("--mem",), True, "host memory is not reserved here; --gpu-mem is GPU memory"),
    (("--mem-per-cpu",), True, "host memory is not reserved here; --gpu-mem is GPU memory"),
    (("-A", "--account"), True, "usage is charged to the user"),
    (("-C", "--constraint"), True, "ask with --arch, --cuda or --vendor"),
    (("--exclusive",), False, "whole cards are exclusive already; nodes are shared"),
    (("--requeue",), False, "jobs are requeued when a GPU fails unless --no-requeue"),
    (("--signal",), True, "at the time limit a job gets SIGUSR1, SIGKILL after the grace"),
    (("--open-mode",), True, "-o/-e files are appended to"),
    (("--mail-user",), True, "mail goes to the job's user"),
    (("--begin",), True, "a job is queued at once; book cards with `nebula reserve`"),
    (("-H", "--hold"), False, "hold it after submitting: `nebula hold JOB`"),
    (("--comment",), True, "jobs carry a name only (-J)"),
    (("--gpus-per-task",), True, "ask for GPUs per job (-G) or per node (--gres)"),
    (("-i", "--input"), True, "a batch job reads no input"),
    (("-M", "--clusters"), True, "choose a pool with -p"),
    (("--nice",), True, "admins set --priority"),
)


class Unhonoured(argparse.Action):
    """A Slurm option NebulaGrid cannot honour: kept to be said in one line, then ignored
    (a script written for sbatch still runs)."""

    def __init__(self, option_strings, dest, why: str = "", **kwargs):
        super().__init__(option_strings, dest, **kwargs)
        self.why = why

    def __call__(self, parser, namespace, values, option_string=None):
        shown = option_string if values in (None, []) else f"{option_string}={values}"
        Unhonoured.note(namespace, shown, self.why)

    @staticmethod
    def note(namespace, shown: str, why: str) -> None:
        notes = getattr(namespace, "unhonoured", None) or []
        namespace.unhonoured = [*notes, f"{shown} is Slurm's and not honoured here ({why}); ignored"]


def add_unhonoured(p: argparse.ArgumentParser) -> None:
    group = p.add_argument_group("Slurm options NebulaGrid cannot honour",
                                 "each is said in one line on stderr, then ignored: "
                                 + ", ".join(flags[-1] for flags, _, _ in UNHONOURED))
    for flags, takes_value, why in UNHONOURED:
        group.add_argument(*flags, action=Unhonoured, why=why, dest="unhonoured_flag",
                           nargs=None if takes_value else 0, help=argparse.SUPPRESS)


#: The directive prefixes read at the top of a job script
DIRECTIVES = ("#SBATCH", "#NEBULA")


def script_directives(text: str) -> list[str]:
    """The flags of a job script's ``#SBATCH``/``#NEBULA`` lines, read as sbatch does: from
    the top, after the ``#!`` line, up to the first line that is neither a comment nor
    blank; a ``#`` after the flags starts a comment. Raises ValueError (a sentence) for a
    line whose quotes do not close."""
    words: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if number == 1 and stripped.startswith("#!"):
            continue
        if stripped and not stripped.startswith("#"):
            break
        prefix = next((p for p in DIRECTIVES if stripped.startswith(p + " ") or stripped == p), None)
        if prefix is None:
            continue
        try:
            words += shlex.split(stripped[len(prefix):], comments=True)
        except ValueError as err:
            raise ValueError(f"line {number}: {stripped[:60]!r}: {err}") from None
    return words


def with_directives(parser: argparse.ArgumentParser, leaf: argparse.ArgumentParser,
                    argv: list[str], args) -> argparse.Namespace:
    """``nebula submit [flags] script.sh``: the flags of the script's directives put before
    the command line's (so that those win, as in sbatch) and the whole parsed again. A
    script that cannot be read, or a directive that is no flag here, is a usage error."""
    path = args.script[0]
    hint = f"; the command to run goes after `--` (nebula {args.command} -- {shlex.join(args.script)})"
    try:
        with open(path, "rb") as f:
            text = f.read(1 << 20).decode(errors="replace")
        if not text.startswith("#!"):  # as sbatch, which says the same
            leaf.error(f"{path} does not look like a job script: its first line must be #! and "
                       f"an interpreter{hint}")
        words = script_directives(text)
    except FileNotFoundError:
        leaf.error(f"{path}: no such script{hint}")
    except (OSError, ValueError) as err:
        leaf.error(f"{path}: {getattr(err, 'strerror', None) or err}")
    if not words:
        return args
    at = len(argv) - len(args.script)  # the script and its arguments end the command line
    head = argv[:at]
    cut = max(i for i, w in enumerate(head) if w == args.command)  # the sub-command's word
    again, extras = parser.parse_known_args([*head[:cut + 1], *words, *head[cut + 1:], *argv[at:]])
    if extras:
        leaf.error(f"{path}: its {'/'.join(DIRECTIVES)} lines hold what is no flag here: "
                     f"{' '.join(extras)}")
    return again


#: NebulaGrid's job states as squeue names them (%T), and squeue's short forms (%t)
SLURM_STATES = {"pending": "PENDING", "launching": "CONFIGURING", "running": "RUNNING",
                "succeeded": "COMPLETED", "failed": "FAILED", "cancelled": "CANCELLED",
                "timeout": "TIMEOUT"}
_SHORT_STATES = {"PENDING": "PD", "CONFIGURING": "CF", "RUNNING": "R", "COMPLETED": "CD",
                 "FAILED": "F", "CANCELLED": "CA", "TIMEOUT": "TO"}
#: squeue's default -o
SQUEUE_FORMAT = "%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R"
_FIELD = re.compile(r"%(\.)?(\d*)([a-zA-Z%])")


def slurm_states(text: str) -> tuple[str, ...]:
    """squeue's ``-t PENDING,R`` (names or short forms, any case; ``all``) -> our states."""
    wanted: list[str] = []
    for word in (w.strip().upper() for w in text.split(",") if w.strip()):
        if word == "ALL":
            return tuple(SLURM_STATES)
        found = [ours for ours, name in SLURM_STATES.items()
                 if word in (name, _SHORT_STATES[name], ours.upper())]
        if not found:
            raise argparse.ArgumentTypeError(
                f"'{word}' is not a state here; states: {', '.join(SLURM_STATES.values())} or all")
        wanted += found
    return tuple(wanted)


def slurm_clock(seconds: float | None) -> str:
    """A time as squeue prints it: 0:00, 5:07, 1:02:03, 2-01:02:03."""
    s = int(max(0, seconds or 0))
    days, hours, minutes, secs = s // 86400, s % 86400 // 3600, s % 3600 // 60, s % 60
    if days:
        return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def _nodes(job: QueueRow) -> list[str]:
    return list(dict.fromkeys(g["node"] for g in job.get("gpus") or ()))


def _field(letter: str, job: QueueRow, now: float) -> str | None:
    """One squeue field of a job (as ``nebula queue --json`` gives it); None: not one of
    the fields NebulaGrid fills."""
    state = SLURM_STATES.get(job["state"], job["state"].upper())
    array = job.get("array_id")
    started = job.get("started_at")
    moment = lambda t: time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t)) if t else "N/A"  # noqa: E731
    values = {
        "i": f"{array}_{job['array_index']}" if array is not None else str(job["id"]),
        "A": str(array if array is not None else job["id"]),
        "a": str(job["array_index"]) if array is not None else "N/A",
        "j": job.get("name") or "", "u": job["user"], "T": state,
        "t": _SHORT_STATES.get(state, state[:2]),
        "M": slurm_clock((job.get("ended_at") or now) - started if started else 0),
        "l": slurm_clock(job["time_limit_s"]) if job.get("time_limit_s") else "UNLIMITED",
        "D": str(len(_nodes(job)) or job.get("nodes") or 1),
        "N": ",".join(_nodes(job)),
        "R": ",".join(_nodes(job)) if _nodes(job) else f"({job.get('reason') or 'None'})",
        "P": job.get("pool") or "local", "b": f"gres/gpu:{job['gpu_count']}",
        "V": moment(job.get("submitted_at")), "S": moment(started), "%": "%",
    }
    return values.get(letter)


_HEADERS = {"i": "JOBID", "A": "ARRAY_JOB_ID", "a": "ARRAY_TASK_ID", "j": "NAME", "u": "USER",
            "T": "STATE", "t": "ST", "M": "TIME", "l": "TIME_LIMIT", "D": "NODES",
            "N": "NODELIST", "R": "NODELIST(REASON)", "P": "PARTITION", "b": "TRES_PER_NODE",
            "V": "SUBMIT_TIME", "S": "START_TIME", "%": "%"}


def check_format(text: str) -> str:
    """squeue's ``-o``: every field one NebulaGrid fills."""
    unknown = [m.group(3) for m in _FIELD.finditer(text) if m.group(3) not in _HEADERS]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"%{unknown[0]} is not a field NebulaGrid fills; fields: "
            + " ".join(f"%{k}" for k in _HEADERS if k != "%"))
    return text


def squeue_text(jobs: Sequence[QueueRow], fmt: str, header: bool, now: float) -> str:
    """Jobs as squeue prints them with ``-o fmt``: each field cut to its width and padded
    (``%.8j``: right-aligned); a header line of the field names unless ``-h``."""
    def line(get) -> str:
        def one(m: re.Match) -> str:
            value = get(m.group(3))
            width = int(m.group(2) or 0)
            if width:
                value = value[:width]
                return value.rjust(width) if m.group(1) else value.ljust(width)
            return value
        return _FIELD.sub(one, fmt)

    lines = [line(_HEADERS.__getitem__)] if header else []
    lines += [line(lambda k, j=j: _field(k, j, now)) for j in jobs]
    return "\n".join(lines)
