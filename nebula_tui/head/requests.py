"""What a request may hold: each request line parsed and checked, field by field.

``parse_request`` turns a line into a JSON object or refuses it in one line (not JSON,
nested deeper than ``MAX_JSON_DEPTH``, text that is not Unicode); ``spec_from_request``
checks a submit's fields, each against its bounds (sizes, counts, NUL, numbers that are
whole and finite). Every refusal is an ``InvalidRequest`` (the client exits 2) that names the field and says how
to fix it. The server (``head/server.py``) answers what passes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any, Literal, TypeGuard, cast, overload

from .. import environments
from ..api import ARCH_RE, CUDA_RE, MAX_GPU_COUNT
from ..config.nodes import DEFAULT_PORT, valid_name
from ..model import OUTPUT_PATTERNS, VENDORS, InvalidRequest, JobSpec
from ..scheduler.filters import expand_hostlist
from ..scheduler.snapshot import AFTER_TYPES
from ..units import TaskArray

MAX_JSON_DEPTH = 32

#: one argument of a command, and the whole command (the kernel refuses an argument over
#: 128 KiB at exec: refused here, at submit, instead of failing on the node)
MAX_ARG_BYTES = 64 * 1024
MAX_COMMAND_BYTES = 256 * 1024
MAX_ARGS = 4096
MAX_JOB_ID = (1 << 63) - 1  # SQLite's integers
MAX_GPU_MEM_MB = 16 << 20   # 16 TB, far above any card
MAX_TIME_LIMIT_S = 366 * 86400.0


#: the latest time a request may name (the end of year 9999), in Unix seconds
MAX_UNIX_TIME = 253402300799.0


def whole(value: object, low: int, high: int) -> TypeGuard[int]:
    """A JSON number that is a whole number in [low, high] (true and false are not)."""
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def number(value: object, low: float, high: float) -> TypeGuard[float]:
    """A JSON number in [low, high] (true and false are not; NaN fails every comparison,
    so finite bounds keep out NaN and the infinities too)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and low <= value <= high


@overload
def unix_time(req: Mapping[str, object], key: str, required: Literal[True]) -> float: ...
@overload
def unix_time(req: Mapping[str, object], key: str, required: bool = False) -> float | None: ...


def unix_time(req: Mapping[str, object], key: str, required: bool = False) -> float | None:

    """Field ``key`` as a time in Unix seconds (None when absent and not ``required``)."""
    value = req.get(key)
    if value is None and not required:
        return None
    if not number(value, 0, MAX_UNIX_TIME):
        raise InvalidRequest(f"{key} must be a time in Unix seconds")
    return float(value)


def spec_from_request(req: Mapping[str, object], default_vendor: str | None = None) -> JobSpec:
    """Validate a submit request field by field; raise InvalidRequest naming the field. A
    request naming neither a vendor nor an arch gets ``default_vendor`` (nodes.yaml's);
    "any" asks for none."""
    command = req.get("command")
    if not isinstance(command, list) or not command or not all(isinstance(a, str) for a in command):
        raise InvalidRequest("command: give the program to run after `--`, or --command \"…\"")
    sizes = [len(a.encode()) for a in command]
    if len(command) > MAX_ARGS or max(sizes) > MAX_ARG_BYTES or sum(sizes) > MAX_COMMAND_BYTES:
        raise InvalidRequest(f"command: at most {MAX_ARGS} arguments of at most {MAX_ARG_BYTES // 1024} KB "
                           f"each, {MAX_COMMAND_BYTES // 1024} KB in all (this one: "
                           f"{len(command)} arguments, the longest {max(sizes) // 1024} KB); "
                           "put long input in a file the job reads")
    if any("\0" in a for a in command):
        raise InvalidRequest("command: an argument holds a NUL character, which no program can be given")
    shell = bool(req.get("shell"))
    if shell and len(command) != 1:
        raise InvalidRequest("command: --command takes one shell command line")
    gpu_count = req.get("gpu_count", 1)
    if not whole(gpu_count, 1, MAX_GPU_COUNT):
        raise InvalidRequest(f"--gpu-count must be a whole number from 1 to {MAX_GPU_COUNT}")
    gpu_mem = req.get("gpu_mem_mb")
    if gpu_mem is not None and not whole(gpu_mem, 1, MAX_GPU_MEM_MB):
        raise InvalidRequest("--gpu-mem must be a positive size such as 8G (at most 16 TB)")
    name = req.get("name") or ""
    if not isinstance(name, str) or len(name) > 128 or "\n" in name or "\0" in name:
        raise InvalidRequest("--name must be one line of at most 128 characters")
    workdir = req.get("workdir")
    if workdir is not None and (not isinstance(workdir, str) or not workdir.startswith("/")
                                or "\0" in workdir or len(workdir) > 4096):
        raise InvalidRequest("--workdir must be an absolute path on the node (no NUL, at most 4096 characters)")
    after = req.get("after") or []
    if not isinstance(after, list) or len(after) > 1000 or not all(whole(a, 1, MAX_JOB_ID) for a in after):
        raise InvalidRequest("--after takes job ids (numbers)")
    after_type = req.get("after_type") or "ok"
    if after_type not in AFTER_TYPES:
        raise InvalidRequest(f"--after {str(after_type)[:40]!r}: the kinds are {', '.join(AFTER_TYPES)} "
                           "(e.g. any:12)")
    array = req.get("array")
    if array is not None:
        if not isinstance(array, str) or len(array) > 200:
            raise InvalidRequest("--array takes task numbers like 0-99 or 0-99%8")
        try:
            array = TaskArray.parse(array)
        except ValueError as err:
            raise InvalidRequest(str(err)) from None
    time_limit = req.get("time_limit_s")
    if time_limit is not None and (isinstance(time_limit, bool) or not isinstance(time_limit, (int, float))
                                   or not 0 < time_limit <= MAX_TIME_LIMIT_S):
        raise InvalidRequest("--time must be a duration such as 30m or 2h (at most a year)")
    nodes = req.get("nodes", 1)
    if not whole(nodes, 1, MAX_GPU_COUNT):
        raise InvalidRequest(f"--nodes must be a whole number from 1 to {MAX_GPU_COUNT}")
    priority = req.get("priority", 0)
    if not whole(priority, -1000, 1000):
        raise InvalidRequest("--priority must be a whole number from -1000 to 1000")
    texts = {}
    for key, flag, pattern in (("arch", "--arch", ARCH_RE), ("cuda", "--cuda", CUDA_RE),
                               ("vendor", "--vendor", _VENDOR)):
        value = req.get(key)
        if value is not None and (not isinstance(value, str) or not pattern.match(value)):
            raise InvalidRequest(f"{flag}: {value!r} is not valid; e.g. {_EXAMPLES[key]}")
        texts[key] = value
    reservation = req.get("reservation")
    if reservation is not None and (not isinstance(reservation, str) or not _BOOKING.match(reservation)):
        raise InvalidRequest("--reservation must name a booking: 1-64 letters, digits, dots, dashes or underscores")
    files = {key: _output_pattern(req, key) for key in ("output", "error")}
    if (files["output"] or files["error"]) and (req.get("image") is not None or req.get("interactive")
                                                or req.get("pool") not in (None, "local")):
        raise InvalidRequest("-o/-e: a job in a container (--image), in a pool (-p) or on a "
                             "terminal (nebula run) has its output in `nebula logs` only")
    if texts["vendor"] == ANY_VENDOR:
        texts["vendor"] = None
    elif texts["vendor"] is None and texts["arch"] is None:  # an arch says whose cards
        texts["vendor"] = default_vendor
    hosts = _node_choice(req)
    return JobSpec(command=tuple(command), name=name, gpu_count=gpu_count,
                   gpu_mem_mb=gpu_mem, workdir=workdir, shell=shell, nodes=nodes,
                   priority=priority, after=tuple(after), after_type=after_type, array=array,
                   time_limit_s=time_limit,
                   service=bool(req.get("service")), no_requeue=bool(req.get("no_requeue")),
                   notify=bool(req.get("notify")), preemptible=bool(req.get("preemptible")),
                   reservation=reservation, nodelist=hosts["nodelist"], exclude=hosts["exclude"],
                   export_env=_export(req),
                   arch=texts["arch"], cuda=texts["cuda"], vendor=texts["vendor"],
                   output=files["output"], error=files["error"], **_world_fields(req))


#: --export: at most this many variables, each value at most this many bytes
MAX_EXPORTS = 64
MAX_EXPORT_BYTES = 4096
_VARIABLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


def _node_choice(req: Mapping[str, object]) -> dict[str, tuple[str, ...]]:
    """-w/--nodelist and -x/--exclude: Slurm's hostlists (``a,b``, ``gpu[01-03]``) -> names."""
    fields: dict[str, tuple[str, ...]] = {}
    for key, flag in (("nodelist", "-w/--nodelist"), ("exclude", "-x/--exclude")):
        value = req.get(key)
        try:
            # (it refuses what is not text with the same sentence)
            fields[key] = expand_hostlist(cast(str, value), flag) if value is not None else ()
        except ValueError as err:
            raise InvalidRequest(str(err)) from None
    return fields


def _export(req: Mapping[str, object]) -> tuple[tuple[str, str], ...]:
    """--export's variables: [[NAME, value], …], names as a shell has them, values bounded
    (the run script quotes them); NEBULA_* are the job's own and cannot be set."""
    pairs = req.get("export") or []
    if not isinstance(pairs, list) or len(pairs) > MAX_EXPORTS:
        raise InvalidRequest(f"--export takes at most {MAX_EXPORTS} VAR=value pairs")
    found = {}
    for pair in pairs:
        if (not isinstance(pair, list) or len(pair) != 2
                or not all(isinstance(p, str) for p in pair)):
            raise InvalidRequest("--export takes VAR=value pairs")
        name, value = pair
        if not _VARIABLE.match(name) or name.startswith("NEBULA_"):
            raise InvalidRequest(f"--export: {name[:80]!r} is no variable name you may set "
                                 "(letters, digits, '_'; NEBULA_* are the job's own)")
        if "\0" in value or len(value.encode()) > MAX_EXPORT_BYTES:
            raise InvalidRequest(f"--export {name}: a value holds no NUL and at most "
                                 f"{MAX_EXPORT_BYTES} bytes")
        found[name] = value
    return tuple(found.items())


def _output_pattern(req: Mapping[str, object], key: str) -> str | None:
    """-o/-e: a file name with sbatch's patterns (%j, %x, %u, %a, %A, %%) and no others."""
    value = req.get(key)
    flag = "--output" if key == "output" else "--error"
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > 4096 or "\0" in value or "\n" in value:
        raise InvalidRequest(f"{flag} must be a file name on one line (at most 4096 characters)")
    unknown = sorted(set(re.findall(r"%(.)", value.replace("%%", ""))) - set(OUTPUT_PATTERNS))
    if unknown:
        raise InvalidRequest(f"{flag} {value[:80]!r}: %{unknown[0]} is not a pattern NebulaGrid fills; "
                             "it fills %j (job id), %x (name), %u (user), %a (task), %A (array id), %%")
    return value


def _world_fields(req: Mapping[str, object]) -> dict[str, Any]:
    """What the job runs in (image, mounts, conda/venv, submit dir), each checked by
    ``environments``; a bad value is refused with its sentence."""
    checks: dict[str, Callable[[Any], str]] = {
        "image": environments.image_reference, "runtime": environments.runtime_name,
        "conda": environments.conda_env, "venv": environments.venv_path,
        "submit_dir": lambda d: environments.absolute(d, "the submit directory")}
    fields: dict[str, Any] = {}
    try:
        for key, check in checks.items():
            if req.get(key) is not None:
                fields[key] = check(req[key])
        mounts = req.get("data_mounts") or []
        if not isinstance(mounts, list):
            raise ValueError("--data-mount: give SRC:DST or SRC:DST:ro, once per mount")
        fields["data_mounts"] = tuple(environments.data_mount(m) for m in mounts)
        environments.combination(fields.get("image"), fields.get("conda"), fields.get("venv"),
                                 fields["data_mounts"], fields.get("runtime"))
    except ValueError as err:
        raise InvalidRequest(str(err)) from None
    pool = req.get("pool")
    if pool is not None and (not isinstance(pool, str) or not valid_name(pool)):
        raise InvalidRequest("--pool: give a pool's name from nodes.yaml (lowercase letters, digits, "
                           "'_', '.', '-') or 'local'")
    fields["pool"] = pool
    fields["warmup"] = bool(req.get("warmup"))
    fields["interactive"] = bool(req.get("interactive"))
    return fields



#: a job's --vendor that takes any card, whatever nodes.yaml gives as the default
ANY_VENDOR = "any"
_BOOKING = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")  # as head/bookings.py names them
_VENDOR = re.compile(f"^({'|'.join((*VENDORS, ANY_VENDOR))})$")
_EXAMPLES = {"arch": "sm_89, '>=sm_80' or gfx90a", "cuda": "12.1",
             "vendor": "nvidia, amd, intel, ascend or any"}


def text_field(req: Mapping[str, object], field: str) -> str:
    value = req.get(field)
    if not isinstance(value, str) or not value:
        raise InvalidRequest(f"{field}: give a name")
    return value


def port_field(req: Mapping[str, object]) -> int:
    port = req.get("port", DEFAULT_PORT)
    if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
        raise InvalidRequest("port must be a number from 1 to 65535")
    return port


def job_id(req: Mapping[str, object]) -> int:
    value = req.get("job")
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if not whole(value, 1, MAX_JOB_ID):
        shown = repr(value)[:40]
        raise InvalidRequest(f"{shown} is not a job id (a number, as `nebula queue` shows)")
    return value


def attach_fields(req: Mapping[str, object]) -> tuple[int, int, tuple[int, int]]:
    """(job, rank, (columns, rows)) of an attach request."""
    rank, cols, rows = req.get("rank") or 0, req.get("cols") or 80, req.get("rows") or 24
    if not whole(rank, 0, MAX_GPU_COUNT) or not whole(cols, 1, 1 << 16) or not whole(rows, 1, 1 << 16):
        raise InvalidRequest("attach takes a job id, a rank and a terminal size (whole numbers)")
    return job_id(req), rank, (cols, rows)


def refusal(err: Exception) -> dict[str, object]:
    """The reply to a refused request: ``usage`` when it could never be valid as written
    (``InvalidRequest``: the client exits 2, as on a mistake it catches itself), not for a
    refusal of what is now (no such job, not theirs, a store that fails: exit 1)."""
    return {"ok": False, "error": str(err), "usage": isinstance(err, InvalidRequest)}


def parse_request(line: bytes) -> dict[str, Any]:
    """A request line as a JSON object; InvalidRequest (one line) for anything else: not
    JSON, nested deeper than MAX_JSON_DEPTH (which would exhaust Python's recursion), or
    text that is not Unicode (a lone surrogate, which no store or terminal can take)."""
    if line.count(b"[") + line.count(b"{") > MAX_JSON_DEPTH and _depth(line) > MAX_JSON_DEPTH:
        raise InvalidRequest(f"the request is nested deeper than {MAX_JSON_DEPTH} levels")
    try:
        req = json.loads(line)
    except (ValueError, RecursionError):
        raise InvalidRequest("request is not a JSON object") from None
    if not isinstance(req, dict):
        raise InvalidRequest("request is not a JSON object")
    _check_text(req, "request")
    return req


def _depth(line: bytes) -> int:
    """How deep brackets nest in a JSON text, strings skipped."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in line:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):
            depth += 1
            deepest = max(deepest, depth)
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return deepest


def _check_text(value: object, where: str) -> None:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidRequest(f"{where}: text holds a lone surrogate (\\u{ord(value[_bad(value)]):04x}), "
                               "which is not Unicode") from None
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_text(key, where)
            _check_text(item, f"{key}" if where == "request" else where)
    elif isinstance(value, list):
        for item in value:
            _check_text(item, where)


def _bad(text: str) -> int:
    return next(i for i, c in enumerate(text) if 0xD800 <= ord(c) <= 0xDFFF)
