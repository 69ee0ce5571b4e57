"""Argument parsing for every ``nebula`` sub-command. Thin: each command calls the service.

Errors are one line on stderr: usage errors exit 2, refusals by the service exit 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from . import cli_health, environments
from .api import ARCH_RE, CUDA_RE, ApiError
from .model import FINISHED_STATES, ConfigError, fmt, format_mb
from .units import parse_array, parse_duration_s, parse_size_mb
from .printable import printable, printable_log
from .service import Home, ServiceUnavailable

USAGE_ERROR = 2


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line naming the flag, not a usage dump."""

    def error(self, message: str) -> None:
        print(f"{self.prog}: {message} (see `{self.prog} --help`)", file=sys.stderr)
        raise SystemExit(USAGE_ERROR)


def _size(text: str) -> int:
    try:
        return parse_size_mb(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _count(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of 1 or more, not '{text}'")
    return int(text)


def _pattern(regex, example: str):
    def check(text: str) -> str:
        if not regex.match(text):
            raise argparse.ArgumentTypeError(f"'{text}' is not valid; write it like {example}")
        return text
    return check


def _duration(text: str) -> float:
    try:
        return parse_duration_s(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _job_id(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"'{text}' is not a job id (a number, as `nebula queue` shows)")
    return int(text)


def _after(text: str) -> tuple[str, list[int]]:
    """``12``, ``12,13``, ``any:12``, ``notok:12,13``, ``started:12`` -> (kind, ids)."""
    kind, _, ids = text.rpartition(":")
    kind = kind or "ok"
    if kind not in ("ok", "any", "notok", "started"):
        raise argparse.ArgumentTypeError(f"'{text}': the kinds are ok, any, notok and started, "
                                         "e.g. any:12")
    return kind, [_job_id(part) for part in ids.split(",")]


def _array(text: str) -> str:
    try:
        parse_array(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def _checked(check):
    """An argparse type from an ``environments`` check: its sentence is the usage error."""
    def convert(text: str) -> str:
        try:
            return check(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err).split(": ", 1)[-1]) from None
    return convert


def add_world_flags(p: argparse.ArgumentParser) -> None:
    """What the job runs in: a container, a conda env or a venv (R24), and warm-up (R27)."""
    p.add_argument("--image", type=_checked(environments.image_reference), default=None,
                   help="run in this container image (podman, docker or apptainer on the node)")
    p.add_argument("--runtime", choices=environments.RUNTIMES, default=None,
                   help="with --image: this container runtime (default: the node's)")
    p.add_argument("--data-mount", dest="data_mounts", action="append", default=[],
                   type=_checked(environments.data_mount), metavar="SRC:DST[:ro]",
                   help="with --image: mount the node's SRC at DST (repeatable)")
    p.add_argument("--conda", type=_checked(environments.conda_env), default=None,
                   help="activate this conda env (name or path) on the node first")
    p.add_argument("--venv", type=os.path.abspath, default=None,
                   help="activate this Python venv on the node first")
    p.add_argument("--warmup", action="store_true",
                   help="wake the cards from their idle state before the command starts")


def world_request(args) -> dict:
    """The submit fields of ``add_world_flags``, plus where this was submitted from; a
    combination that cannot work is a usage error here."""
    try:
        environments.combination(args.image, args.conda, args.venv, tuple(args.data_mounts),
                                 args.runtime)
    except ValueError as err:
        print(f"nebula {args.command}: {err}", file=sys.stderr)
        raise SystemExit(USAGE_ERROR) from None
    try:
        submit_dir = os.getcwd()
    except OSError:  # the directory was removed under the shell
        submit_dir = None
    return {"image": args.image, "runtime": args.runtime, "data_mounts": args.data_mounts,
            "conda": args.conda, "venv": args.venv, "submit_dir": submit_dir,
            "warmup": args.warmup}


def add_submit_flags(p: argparse.ArgumentParser) -> None:
    """What a job asks for: `nebula submit` and `nebula run` take the same."""
    p.add_argument("--name", default="")
    p.add_argument("--gpu-count", type=_count, default=1, help="GPUs the job needs (default 1)")
    p.add_argument("--gpu-mem", type=_size, default=None,
                   help="memory per GPU, e.g. 8G (default: whole cards)")
    p.add_argument("--workdir", default=None,
                   help="directory on the node (default: this directory where the node has "
                        "it, else the home)")
    p.add_argument("--command", dest="shell_command", default=None,
                   help="a shell command line instead of `-- cmd args…`")
    p.add_argument("--arch", type=_pattern(ARCH_RE, "sm_89, '>=sm_80' or gfx90a"), default=None,
                   help="compute capability: sm_89 exactly, or '>=sm_80'")
    p.add_argument("--cuda", type=_pattern(CUDA_RE, "12.1"), default=None,
                   help="the driver must support at least this CUDA, e.g. 12.1")
    p.add_argument("--vendor", default=None, choices=("nvidia", "intel", "ascend", "amd"))
    p.add_argument("--nodes", type=_count, default=1, help="how many nodes the GPUs may span (default 1)")
    p.add_argument("--priority", type=int, default=0, help="admins: higher runs first")
    p.add_argument("--after", type=_after, action="append", default=[],
                   help="start once these jobs succeeded (12,13), ended (any:12), failed "
                        "(notok:12) or started (started:12); repeatable")
    p.add_argument("--time", dest="time_limit", type=_duration, default=None,
                   help="it is stopped then (SIGUSR1, SIGKILL after the grace), e.g. 30m, 2h; "
                        "lets it use reserved GPUs meanwhile")
    p.add_argument("--service", action="store_true",
                   help="a long-running inference service: its card keeps 2 GB spare")
    p.add_argument("--no-requeue", action="store_true",
                   help="fail instead of restarting elsewhere when its GPU is isolated")
    add_world_flags(p)


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--home", default=argparse.SUPPRESS,
                        help="state directory (default $NEBULA_HOME or ~/.nebula)")
    common.add_argument("--config", default=argparse.SUPPRESS,
                        help="cluster file nodes.yaml (default $NEBULA_CONFIG)")
    common.add_argument("--socket", default=argparse.SUPPRESS,
                        help="the head service's socket (default $NEBULA_SOCKET, then the "
                             "one under the home, then /run/nebula/nebula.sock)")
    parser = OneLineParser(prog="nebula", parents=[common],
                           description="NebulaGrid: GPU cluster manager for labs. "
                                       "Without a command, opens the TUI.")
    sub = parser.add_subparsers(dest="command", parser_class=OneLineParser)

    def command(name: str, help_text: str, **kw) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help_text, parents=[common], **kw)

    p = command("submit", "submit a job: nebula submit [options] -- cmd args…")
    add_submit_flags(p)
    p.add_argument("--array", type=_array, default=None,
                   help="run it as tasks 0-99 (NEBULA_ARRAY_TASK_ID), at most 8 at once with 0-99%%8")
    p.add_argument("--wait", action="store_true", help="wait for the end; exit with its code")
    p = command("run", "run a command on a terminal once it has its GPUs, like srun --pty: "
                       "nebula run [submit options] -- bash")
    add_submit_flags(p)

    command("status", "the cluster overview").add_argument("--json", action="store_true")

    p = command("queue", "running and waiting jobs")
    p.add_argument("--json", action="store_true")
    p.add_argument("--expand", action="store_true", help="one line per task of an array")
    p = command("gpus", "every GPU with its descriptor")
    p.add_argument("--json", action="store_true")
    for name, help_text in (("wait", "wait for a job to end; exit with its code"),
                            ("cancel", "cancel a job"), ("job", "one job as JSON"),
                            ("hold", "keep a waiting job from starting"),
                            ("requeue", "stop a running job and put it back in the queue"),
                            ("release", "let a held job start again")):
        command(name, help_text).add_argument("job", type=_job_id)
    p = command("attach", "attach this terminal to a running job's tmux session "
                          "(detach: Ctrl-b d; the job runs on)")
    p.add_argument("job", type=_job_id)
    p.add_argument("--rank", type=int, default=0, help="which node of a multi-node job (0 first)")
    p = command("node", "node administration (admins)")
    node_sub = p.add_subparsers(dest="node_command", required=True, parser_class=OneLineParser)
    p = node_sub.add_parser("drain", help="no new jobs on this node; running ones go on")
    p.add_argument("node")
    p.add_argument("--reason", default="")
    node_sub.add_parser("resume", help="take new jobs again").add_argument("node")
    p = node_sub.add_parser("add", help="add a node to nodes.yaml, trusting its host key")
    p.add_argument("node")
    p.add_argument("host")
    p.add_argument("--port", type=_count, default=22)
    p.add_argument("--user", default=None, help="login user (default: the cluster's)")
    p.add_argument("--identity", default=None, help="client key (default: the cluster's)")
    p.add_argument("--trust", default=None, metavar="SHA256:…",
                   help="trust the host key only if it has this fingerprint (no question asked)")
    node_sub.add_parser("remove", help="remove a node from nodes.yaml").add_argument("node")
    p = command("gpu", "one GPU")
    gpu_sub = p.add_subparsers(dest="gpu_command", required=True, parser_class=OneLineParser)
    p = gpu_sub.add_parser("history", help="a GPU's recorded temperature, load, memory and power")
    p.add_argument("gpu", help="uuid or node:index")
    p.add_argument("--since", type=_duration, default=3600, help="how far back, e.g. 30m, 6h, 2d")
    p.add_argument("--json", action="store_true")
    cli_health.add_gpu_commands(gpu_sub)  # gpu resume
    cli_health.add_sim_commands(sub, command)  # sim inject|node|throttle
    p = command("events", "what happened, newest last")
    p.add_argument("--limit", type=_count, default=50)
    command("users", "fair-share weights and usage per user").add_argument("--json", action="store_true")
    p = command("logs", "a job's output")
    p.add_argument("job", type=_job_id)
    p.add_argument("-f", "--follow", action="store_true", help="keep printing until the job ends")
    p.add_argument("--rank", type=int, default=None,
                   help="one node of a multi-node job (0 first); default: every node's, "
                        "each line prefixed with its rank")
    p = command("parse", "print what NebulaGrid understands from a saved tool output")
    p.add_argument("kind", help="smi-csv, smi-apps, smi-plain, smi-q, smi-xml, amd-smi, "
                   "rocm-smi, xpu-smi, npu-smi, topo, xid")
    p.add_argument("file", help="the saved output ('-' for stdin)")
    p.add_argument("--fields", default=None,
                   help="smi-csv/smi-apps without a header: the query's fields, comma-separated")
    p.add_argument("--best", type=_count, default=None,
                   help="with topo: the K GPUs a K-GPU job would get on that machine")
    p = command("quota", "set a user's GPU-hours per month (admins)")
    p.add_argument("user")
    p.add_argument("hours", type=float)
    p = command("serve", "run the head service in the foreground")
    p.add_argument("--shared-group", default=None,
                   help="shared box: members of this Unix group may use the service")
    p = command("demo", "start the simulated lab and open the TUI on it")
    p.add_argument("--headless", action="store_true", help="no TUI: keep the lab up until Ctrl-C")
    p.add_argument("--layout", default="demo", choices=("demo", "core", "4x4", "mixed"))
    p.add_argument("--shared-group", default=None,
                   help="let members of this Unix group use the demo's service")
    command("tui", "open the TUI (the default)")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    trailing: list[str] = []
    if "--" in argv:  # everything after `--` is the job's command, never our flags
        cut = argv.index("--")
        argv, trailing = argv[:cut], argv[cut + 1:]
    parser = build_parser()
    args = parser.parse_args(argv)
    args.trailing = trailing
    if trailing and args.command not in ("submit", "run"):
        parser.error("`--` is only for `nebula submit` and `nebula run`")
    home = Home.resolve(getattr(args, "home", None), getattr(args, "socket", None))
    config = getattr(args, "config", None)
    try:
        return COMMANDS.get(args.command or "tui")(args, home, config)
    except (ApiError, ServiceUnavailable) as err:
        print(f"nebula: {printable(err)}", file=sys.stderr)  # may quote another user's text
        return USAGE_ERROR if getattr(err, "usage", False) else 1
    except ConfigError as err:
        print(f"nebula: {printable(err)}", file=sys.stderr)
        return USAGE_ERROR
    except KeyboardInterrupt:
        return 130


def _client(home: Home, config: str | None):
    from .service import connect

    return connect(home, config)


# ------------------------------------------------------------------ commands
def submit_request(args) -> dict | None:
    """The submit request of `nebula submit`/`run`'s flags; None after a usage error."""
    prog = f"nebula {args.command}"
    if args.shell_command is not None and args.trailing:
        print(f"{prog}: give either --command \"…\" or `-- cmd args…`, not both", file=sys.stderr)
        return None
    if args.shell_command is None and not args.trailing:
        print(f"{prog}: nothing to run; add `-- cmd args…` or --command \"…\"", file=sys.stderr)
        return None
    kinds = {kind for kind, _ in args.after}
    if len(kinds) > 1:
        print(f"{prog}: --after: give one kind of dependency for all its jobs", file=sys.stderr)
        return None
    return {
        "command": [args.shell_command] if args.shell_command is not None else args.trailing,
        "shell": args.shell_command is not None, "name": args.name,
        "gpu_count": args.gpu_count, "gpu_mem_mb": args.gpu_mem,
        "workdir": os.path.abspath(args.workdir) if args.workdir else None,
        "arch": args.arch, "cuda": args.cuda, "vendor": args.vendor, "nodes": args.nodes,
        "priority": args.priority, "time_limit_s": args.time_limit,
        "service": args.service, "no_requeue": args.no_requeue, **world_request(args),
        "after": [job for _, ids in args.after for job in ids],
        "after_type": kinds.pop() if kinds else "ok", "array": getattr(args, "array", None),
    }


def cmd_submit(args, home, config) -> int:
    request = submit_request(args)
    if request is None:
        return USAGE_ERROR
    with _client(home, config) as client:
        reply = client.call("submit", **request)
        job = reply["job"]
        if args.array:
            print(f"Submitted array job {job['id']} ({reply.get('tasks', 1)} tasks)", flush=True)
        else:
            print(f"Submitted job {job['id']}", flush=True)
        if not args.wait:
            return 0
        return _wait(client, job["id"])


def cmd_run(args, home, config) -> int:
    """Submit an interactive job, wait for its GPUs, attach this terminal to it (R33)."""
    from .attach_client import attach

    if not sys.stdin.isatty():
        print("nebula run: needs a terminal; without one use `nebula submit`", file=sys.stderr)
        return USAGE_ERROR
    request = submit_request(args)
    if request is None:
        return USAGE_ERROR
    with _client(home, config) as client:
        job = client.call("submit", interactive=True, **request)["job"]
        print(f"Submitted job {job['id']}", file=sys.stderr, flush=True)
        said = None
        while job["state"] in ("pending", "launching"):
            if job["reason"] and job["reason"] != said:
                said = job["reason"]
                print(f"Waiting: {said}", file=sys.stderr, flush=True)
            time.sleep(0.2)
            job = client.call("job", job=job["id"])["job"]
        path = client.path
    ended = job["state"] != "running" or attach(path, job["id"])
    with _client(home, config) as client:
        job = client.call("job", job=job["id"])["job"]
        if job["state"] == "running" and not ended:  # a detach: the job runs on
            print(f"Detached; job {job['id']} runs on: `nebula attach {job['id']}`", file=sys.stderr)
            return 0
        return _wait(client, job["id"])


def _wait(client, job_id: int) -> int:
    job = client.call("wait", timeout=None, job=job_id)["job"]
    detail = f" with exit code {job['exit_code']}" if job["exit_code"] is not None else ""
    reason = f": {printable(job['reason'])}" if job["reason"] else ""
    print(f"Job {job_id} {job['state']}{detail}{reason}", file=sys.stderr)
    if job["exit_code"] is not None:
        return job["exit_code"]
    return 0 if job["state"] == "succeeded" else 1


def cmd_wait(args, home, config) -> int:
    with _client(home, config) as client:
        return _wait(client, args.job)


def cmd_status(args, home, config) -> int:
    from .views import status_text

    with _client(home, config) as client:
        reply = client.call("status")
    print(json.dumps(reply["summary"], indent=2) if args.json else status_text(reply["summary"]))
    return 0


def cmd_queue(args, home, config) -> int:
    from .views import queue_text

    with _client(home, config) as client:
        jobs = client.call("queue")["jobs"]
    print(json.dumps(jobs, indent=2) if args.json else queue_text(jobs, time.time(), args.expand))
    return 0


def cmd_gpus(args, home, config) -> int:
    with _client(home, config) as client:
        gpus = client.call("gpus")["gpus"]
    if args.json:
        print(json.dumps(gpus, indent=2))
        return 0
    for g in gpus:
        used = f"{format_mb(g['memory_used_mb'])} / {format_mb(g['total_memory_mb'])}"
        print(f"{printable(g['node'])}:{g['index']}  {printable(g['model']):<36} {used:>18}  {g['status']:<11} "
              f"jobs {','.join(map(str, g['jobs'])) or '-'}")
    return 0


def cmd_job(args, home, config) -> int:
    with _client(home, config) as client:
        print(json.dumps(client.call("job", job=args.job)["job"], indent=2))
    return 0


def cmd_cancel(args, home, config) -> int:
    with _client(home, config) as client:
        job = client.call("cancel", job=args.job)["job"]
    print(f"Cancelling job {job['id']}" if job["state"] != "cancelled" else f"Cancelled job {job['id']}")
    return 0


def _on_job(home, config, op: str, job: int, done: str) -> int:
    """A request about one job whose answer is only that it was done: say ``done``."""
    with _client(home, config) as client:
        client.call(op, job=job)
    print(done)
    return 0


def cmd_requeue(args, home, config) -> int:
    return _on_job(home, config, "requeue", args.job,
                   f"Requeueing job {args.job}: SIGUSR1 now, then back in the queue")


def cmd_hold(args, home, config) -> int:
    return _on_job(home, config, "hold", args.job,
                   f"Held job {args.job}; `nebula release {args.job}` lets it run")


def cmd_release(args, home, config) -> int:
    return _on_job(home, config, "release", args.job, f"Released job {args.job}")


def cmd_attach(args, home, config) -> int:
    from .attach_client import attach

    with _client(home, config) as client:  # finds (or starts) the service
        path = client.path
    attach(path, args.job, args.rank)
    return 0


def cmd_node(args, home, config) -> int:
    if args.node_command in ("add", "remove"):
        return _edit_nodes(args, home, config)
    with _client(home, config) as client:
        if args.node_command == "drain":
            client.call("drain", node=args.node, reason=args.reason)
            print(f"Drained {args.node}: running jobs go on, no new ones start there")
        else:
            client.call("resume", node=args.node)
            print(f"Resumed {args.node}")
    return 0


def _edit_nodes(args, home, config) -> int:
    """node add/remove: the service edits its cluster file; adding asks to trust the key."""
    with _client(home, config) as client:
        if args.node_command == "remove":
            client.call("node_remove", node=args.node)
            print(f"Removed {args.node}")
            return 0
        fingerprint = client.call("node_key", host=args.host, port=args.port)["fingerprint"]
        trust = args.trust
        if trust is None:
            if not sys.stdin.isatty():
                print(f"nebula node: {args.host}:{args.port} presents {fingerprint}; cannot ask "
                      "whether to trust it (no terminal): pass --trust with the fingerprint you "
                      "checked on the node", file=sys.stderr)
                return 1
            answer = input(f"{args.host}:{args.port} presents host key {fingerprint}.\n"
                           "Compare it with the node's own (ssh-keygen -lf "
                           "/etc/ssh/ssh_host_ed25519_key.pub on the node). Trust it? [y/N] ")
            if answer.strip().lower() not in ("y", "yes"):
                print("nebula node: host key not trusted; nothing was changed", file=sys.stderr)
                return 1
            trust = fingerprint
        client.call("node_add", timeout=60, node=args.node, host=args.host, port=args.port,
                    user=args.user, identity=args.identity, trust=trust)
    print(f"Added {args.node} ({args.host}:{args.port}, host key {fingerprint})")
    return 0


def cmd_gpu(args, home, config) -> int:
    if args.gpu_command == "resume":
        return cli_health.cmd_gpu_resume(args, home, config)
    with _client(home, config) as client:
        reply = client.call("history", gpu=args.gpu, since=args.since)
    if args.json:
        print(json.dumps(reply, indent=2))
        return 0
    print(f"GPU {reply['gpu']}")
    print(f"{'TIME':<20} {'TEMP':>5} {'UTIL':>5} {'MEM MiB':>8} {'POWER':>6} {'FAN':>4} {'SM MHz':>7} {'MEM MHz':>8}")
    for s in reply["samples"]:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(s["t"]))
        print(f"{when:<20} {fmt(s['temperature_c'], 'C'):>5} {fmt(s['utilization_pct'], '%'):>5} "
              f"{fmt(s['memory_used_mb']):>8} {fmt(s['power_w'], 'W'):>6} {fmt(s['fan_pct'], '%'):>4} "
              f"{fmt(s['sm_clock_mhz']):>7} {fmt(s['mem_clock_mhz']):>8}")
    if not reply["samples"]:
        print("(no samples yet: one is taken every 30 s)")
    return 0


def cmd_events(args, home, config) -> int:
    with _client(home, config) as client:
        events = client.call("events", limit=args.limit)["events"]
    for e in events:
        print(f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(e['t']))}  {e['kind']:<7} "
              f"{printable(e['message'])}")
    return 0


def cmd_quota(args, home, config) -> int:
    with _client(home, config) as client:
        client.call("quota", user=args.user, hours=args.hours)
    print(f"Quota of {args.user}: {args.hours:g} GPU-hours a month")
    return 0


def cmd_users(args, home, config) -> int:
    with _client(home, config) as client:
        users = client.call("users")["users"]
    if args.json:
        print(json.dumps(users, indent=2))
        return 0
    print(f"{'USER':<16} {'WEIGHT':>7} {'FINISHED':>8} {'RUNNING':>8} {'GPU-H MONTH':>12} {'QUOTA':>8}")
    for u in users:
        print(f"{printable(u['name']):<16} {u['weight']:>7.3f} {u['jobs_finished']:>8} {u['running_jobs']:>8} "
              f"{u['month_gpu_hours']:>12.2f} {u['quota_gpu_hours']:>8g}")
    return 0


def cmd_logs(args, home, config) -> int:
    """One node's output as it is; a multi-node job's every rank, a prefix on each line."""
    if args.rank is not None:
        with _client(home, config) as client:
            return _follow_one(client, args)
    offsets: list[int] = []
    pending: dict[int, str] = {}
    with _client(home, config) as client:
        while True:
            reply = client.call("logs", job=args.job, offset=0, offsets=offsets)
            parts = reply.get("parts") or [{"rank": 0, "node": "", **reply}]
            offsets = [p["offset"] for p in parts]
            # To a terminal, a job's output cannot retitle it or fake the prompt; to a pipe
            # or a file it goes exactly as the job wrote it.
            shown = printable_log if sys.stdout.isatty() else str
            for part in parts:
                if len(parts) == 1:
                    sys.stdout.write(shown(part["data"]))
                    continue
                lines = (pending.pop(part["rank"], "") + part["data"]).split("\n")
                pending[part["rank"]] = lines.pop()  # an unfinished line waits for its end
                for line in lines:
                    sys.stdout.write(f"[{part['rank']} {part['node']}] {shown(line)}\n")
            sys.stdout.flush()
            got = any(p["data"] for p in parts)
            if not args.follow or (reply["state"] in FINISHED_STATES and not got):
                for rank, rest in pending.items():
                    if rest:
                        sys.stdout.write(f"[{rank}] {rest}\n")
                return 0
            if not got:
                time.sleep(0.3)


def _follow_one(client, args) -> int:
    offset = 0
    while True:
        reply = client.call("logs", job=args.job, offset=offset, rank=args.rank)
        sys.stdout.write(reply["data"])
        sys.stdout.flush()
        offset = reply["offset"]
        finished = reply["state"] in FINISHED_STATES
        if not args.follow or (finished and not reply["data"]):
            return 0
        if not reply["data"]:
            time.sleep(0.3)


def cmd_parse(args, home, config) -> int:
    from .remote import documents

    kind = documents.KINDS.get(args.kind)
    if kind is None:
        print(f"nebula parse: unknown kind '{args.kind}'; known: {', '.join(documents.KINDS)}",
              file=sys.stderr)
        return USAGE_ERROR
    if args.best is not None and args.kind != "topo":
        print("nebula parse: --best goes with the topo kind", file=sys.stderr)
        return USAGE_ERROR
    fields = [f.strip() for f in args.fields.split(",") if f.strip()] if args.fields else None
    if fields and not kind.takes_fields:
        print(f"nebula parse: --fields goes with the smi-csv and smi-apps kinds, not {args.kind}",
              file=sys.stderr)
        return USAGE_ERROR
    try:
        stream = sys.stdin.buffer if args.file == "-" else open(args.file, "rb")
    except OSError as err:
        print(f"nebula parse: cannot read {args.file}: {err.strerror}", file=sys.stderr)
        return USAGE_ERROR
    try:
        with stream:
            result = documents.parse_stream(args.kind, stream, fields)
        if args.best is not None:
            from .scheduler.topology import best_set

            result["best"] = best_set(result["links"], args.best, result["gpus"])
    except documents.InputTooLarge as err:
        mib = err.limit // (1024 * 1024)
        what = "the input" if args.file == "-" else args.file
        print(f"nebula parse: {what} is larger than {mib} MiB, more than a saved {args.kind} "
              f"output should be; parse a part of it (e.g. tail -c {mib // 2}M FILE > part)",
              file=sys.stderr)
        return 1
    except OSError as err:
        print(f"nebula parse: cannot read {args.file}: {err.strerror}", file=sys.stderr)
        return USAGE_ERROR
    except ValueError as err:
        print(f"nebula parse: {args.file}: {err}", file=sys.stderr)
        return 1
    print(documents.to_json(result))
    return 0


def cmd_serve(args, home, config) -> int:
    from .config import ConfigError, find_config
    from .head.serve import serve

    try:
        path = find_config(config, home.root)
    except ConfigError as err:
        print(f"nebula serve: {err}", file=sys.stderr)
        return USAGE_ERROR
    return serve(home, path, shared_group=args.shared_group)


def cmd_demo(args, home, config) -> int:
    from .demo import run_demo

    if not (getattr(args, "home", None) or os.environ.get("NEBULA_HOME")):
        home = Home.resolve("~/.nebula/demo", getattr(args, "socket", None))
    return run_demo(home, args.layout, headless=args.headless, shared_group=args.shared_group)


def cmd_tui(args, home, config) -> int:
    from .config import ConfigError, find_config

    try:
        path = find_config(config, home.root)
    except ConfigError as err:
        print(f"nebula: {err}", file=sys.stderr)
        return USAGE_ERROR
    if path is None and not home.socket.exists():
        # No cluster given: the TUI opens on the built-in simulated lab (R26).
        from .demo import run_demo

        return run_demo(Home.resolve("~/.nebula/demo"), "demo", headless=False)
    from .screens.app import run_tui

    return run_tui(home, config)


COMMANDS = {
    "submit": cmd_submit, "run": cmd_run, "wait": cmd_wait, "status": cmd_status, "queue": cmd_queue,
    "gpus": cmd_gpus, "job": cmd_job, "cancel": cmd_cancel, "logs": cmd_logs,
    "parse": cmd_parse, "serve": cmd_serve, "demo": cmd_demo, "tui": cmd_tui,
    "hold": cmd_hold, "release": cmd_release, "requeue": cmd_requeue, "attach": cmd_attach, "node": cmd_node,
    "gpu": cmd_gpu, "events": cmd_events, "users": cmd_users, "quota": cmd_quota,
    "sim": cli_health.cmd_sim,
}
