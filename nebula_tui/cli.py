"""Argument parsing for every ``nebula`` sub-command. Thin: each command calls the service.

Conventions every command follows:

* errors are one line on stderr: usage errors exit 2 and name the sub-command's own
  ``--help`` (with "did you mean …?" for a mistyped command, choice or flag), refusals by
  the service exit 1;
* every command that prints data takes ``--json`` (shapes: README, "JSON output");
* output may go to a pipe that closes early (``| head``): the command stops quietly;
* ``--host BOX`` (or ``NEBULA_HOST``) runs the command against the service on another
  machine, over SSH (``tunnel.py``); only then is asyncssh imported.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
import time

from . import cli_health, environments
from .api import ARCH_RE, CUDA_RE, ApiError
from .model import ConfigError, JobState, fmt
from .printable import printable, printable_log, printable_tree
from .service import Home, ServiceUnavailable
from .units import parse_array, parse_duration_s, parse_size_mb

USAGE_ERROR = 2


#: Exit code of a command whose output pipe closed early, as if SIGPIPE had ended it.
BROKEN_PIPE = 128 + 13


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line naming the flag and this (sub-)command's own
    ``--help``, not a usage dump; a mistyped choice gets "did you mean …?"."""

    def error(self, message: str) -> None:
        print(f"{self.prog}: {message} (see `{self.prog} --help`)", file=sys.stderr)
        raise SystemExit(USAGE_ERROR)

    def _check_value(self, action, value):
        # argparse's own check of a choice (a sub-command is a choice too), plus a suggestion.
        try:
            super()._check_value(action, value)
        except argparse.ArgumentError:
            choices = [str(c) for c in action.choices]
            what = "command" if isinstance(action, argparse._SubParsersAction) else "choice"
            message = f"unknown {what} '{value}'" + _did_you_mean(str(value), choices)
            if not _close(str(value), choices):
                message += f"; choose from {', '.join(choices)}"
            # A sub-command's error needs no "argument command:" in front of it.
            raise argparse.ArgumentError(None if what == "command" else action, message) from None

    def unrecognized(self, extras: list[str]) -> None:
        """Words this (sub-)command does not know: the error names them and, for a
        mistyped flag, the closest one it has."""
        message = f"unrecognized arguments: {' '.join(extras)}"
        flags = [s for a in self._actions for s in a.option_strings if s.startswith("--")]
        first_flag = next((e.split("=")[0] for e in extras if e.startswith("-")), None)
        if first_flag:
            message += _did_you_mean(first_flag, flags)
        elif self.prog == "nebula submit":
            message += "; the command to run goes after `--`"
        self.error(message)


def _close(word: str, choices: list[str]) -> list[str]:
    return difflib.get_close_matches(word, choices, n=1, cutoff=0.6)


def _did_you_mean(word: str, choices: list[str]) -> str:
    match = _close(word, choices)
    return f" (did you mean '{match[0]}'?)" if match else ""


def _leaf_parser(parser: argparse.ArgumentParser, args) -> argparse.ArgumentParser:
    """The innermost sub-command parser that ``args`` went through (``nebula node drain``)."""
    while True:
        sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        name = getattr(args, sub.dest, None) if sub else None
        if name is None:
            return parser
        parser = sub.choices[name]


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


STATES = tuple(s.value for s in JobState)
FINISHED_STATES = tuple(s.value for s in JobState if s.finished)
#: The tables of ``nebula report`` (``--csv`` prints one).
REPORT_TABLES = ("users", "nodes", "days")
#: The hidden first word with which completion scripts ask for job ids and node names.
COMPLETE_COMMAND = "__complete"


def _states(text: str) -> tuple[str, ...]:
    states = tuple(s.strip() for s in text.split(",") if s.strip())
    for state in states:
        if state not in STATES:
            raise argparse.ArgumentTypeError(
                f"'{state}' is not a state{_did_you_mean(state, list(STATES))}; "
                f"states: {', '.join(STATES)}")
    return states


def _ended_states(text: str) -> tuple[str, ...]:
    states = _states(text)
    for state in states:
        if state not in FINISHED_STATES:
            raise argparse.ArgumentTypeError(
                f"'{state}' is not an end state; end states: {', '.join(FINISHED_STATES)}")
    return states


def _when(text: str) -> float:
    """A moment: a date or date and time (local time), or a duration ago (7d, 6h)."""
    for pattern in ("%Y-%m-%d", "%Y-%m-%d %H:%M", "%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M:%S",
                    "%Y-%m-%dT%H:%M:%S", "%Y-%m"):
        try:
            return time.mktime(time.strptime(text, pattern))
        except ValueError:
            continue
    try:
        return time.time() - _duration(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"'{text}' is not a time; write a date (2026-12-01, '2026-12-01 14:00') or a time "
            "ago (90m, 6h, 7d)") from None


def _address(text: str) -> tuple[str, int]:
    """HOST:PORT ([::1]:9400 for IPv6) of a listening socket."""
    host, _, port = text.rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"'{text}' is not HOST:PORT; write it like 127.0.0.1:9400")
    return host, int(port)


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
                             "one under the home, then /run/nebula/nebula.sock); with --host, "
                             "the socket on that machine")
    common.add_argument("--host", dest="remote_host", default=argparse.SUPPRESS, metavar="[USER@]BOX",
                        help="use the service on another machine, over SSH with your own login "
                             "there (default $NEBULA_HOST; ~/.ssh/config applies)")
    printing = argparse.ArgumentParser(add_help=False)
    printing.add_argument("--json", action="store_true",
                          help="print JSON instead of text (shapes: README, \"JSON output\")")
    parser = OneLineParser(prog="nebula", parents=[common],
                           description="NebulaGrid: GPU cluster manager for labs. "
                                       "Without a command, opens the TUI.")
    parser.add_argument("--version", action=_Version, help="print the version and exit")
    sub = parser.add_subparsers(dest="command", parser_class=OneLineParser)

    def command(name: str, help_text: str, prints: bool = True, **kw) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help_text,
                              parents=[common, printing] if prints else [common], **kw)

    p = command("submit", "submit a job: nebula submit [options] -- cmd args…")
    add_submit_flags(p)
    p.add_argument("--array", type=_array, default=None,
                   help="run it as tasks 0-99 (NEBULA_ARRAY_TASK_ID), at most 8 at once with 0-99%%8")
    p.add_argument("--wait", action="store_true", help="wait for the end; exit with its code")
    p.add_argument("--notify", action="store_true",
                   help="mail you (and the lab's job webhooks) when it ends or is requeued")
    p = command("run", "run a command on a terminal once it has its GPUs, like srun --pty: "
                       "nebula run [submit options] -- bash", prints=False)
    add_submit_flags(p)

    command("status", "the cluster overview")
    p = command("queue", "running and waiting jobs")
    p.add_argument("--expand", action="store_true", help="one line per task of an array")
    p.add_argument("--user", default=None, help="only this user's jobs")
    p.add_argument("--state", type=_states, default=None, metavar="STATE[,STATE]",
                   help=f"only jobs in these states ({', '.join(STATES)})")
    p.add_argument("--all", action="store_true",
                   help="ended jobs too (the newest --limit of them, as in `nebula history`)")
    p.add_argument("--limit", type=_count, default=100, help="with --all: how many ended jobs")
    command("gpus", "every GPU: memory, utilisation, temperature, who holds it")
    p = command("report", "GPU-hours, efficiency and waits per user and month; capacity and "
                "utilisation per node and day")
    p.add_argument("--since", type=_when, default=None, metavar="WHEN",
                   help="from (a date or a time ago; default: the start of this month)")
    p.add_argument("--until", type=_when, default=None, metavar="WHEN", help="until (default: now)")
    p.add_argument("--months", type=_count, default=None, metavar="N",
                   help="the last N calendar months, this one included")
    p.add_argument("--csv", choices=REPORT_TABLES, default=None,
                   help="print one of its tables as CSV instead")
    p = command("history", "ended jobs: what each held, waited, ran, cost and did")
    p.add_argument("--user", default=None, help="only this user's jobs")
    p.add_argument("--since", type=_when, default=None, metavar="WHEN",
                   help="ended since: a date (2026-12-01, '2026-12-01 14:00') or a time ago (7d, 6h)")
    p.add_argument("--until", type=_when, default=None, metavar="WHEN", help="ended before")
    p.add_argument("--state", type=_ended_states, default=None, metavar="STATE[,STATE]",
                   help=f"only these end states ({', '.join(FINISHED_STATES)})")
    p.add_argument("--node", default=None, help="only jobs that ran on this node")
    p.add_argument("--limit", type=_count, default=100, help="the newest this many (default 100)")
    for name, help_text in (("wait", "wait for a job to end; exit with its code"),
                            ("cancel", "cancel a job"), ("job", "one job as JSON"),
                            ("hold", "keep a waiting job from starting"),
                            ("requeue", "stop a running job and put it back in the queue"),
                            ("release", "let a held job start again")):
        command(name, help_text).add_argument("job", type=_job_id)
    p = command("attach", "attach this terminal to a running job's tmux session "
                          "(detach: Ctrl-b d; the job runs on)", prints=False)
    p.add_argument("job", type=_job_id)
    p.add_argument("--rank", type=int, default=0, help="which node of a multi-node job (0 first)")
    p = command("node", "node administration (admins)", prints=False)
    node_sub = p.add_subparsers(dest="node_command", required=True, parser_class=OneLineParser)

    def node_command(name: str, help_text: str) -> argparse.ArgumentParser:
        return node_sub.add_parser(name, help=help_text, parents=[printing])

    p = node_command("drain", "no new jobs on this node; running ones go on")
    p.add_argument("node")
    p.add_argument("--reason", default="")
    node_command("resume", "take new jobs again").add_argument("node")
    p = node_command("add", "add a node to nodes.yaml, trusting its host key")
    p.add_argument("node")
    p.add_argument("host")
    p.add_argument("--port", type=_count, default=22)
    p.add_argument("--user", default=None, help="login user (default: the cluster's)")
    p.add_argument("--identity", default=None, help="client key (default: the cluster's)")
    p.add_argument("--trust", default=None, metavar="SHA256:…",
                   help="trust the host key only if it has this fingerprint (no question asked)")
    p.add_argument("--no-smoke", action="store_true",
                   help="skip the smoke test (a 4 GB job of the vendor's tool on the new node)")
    node_command("remove", "remove a node from nodes.yaml").add_argument("node")
    node_command("show", "one node in full: why it is in its state, its GPUs, jobs and "
                 "latest events").add_argument("node")
    p = command("gpu", "one GPU", prints=False)
    gpu_sub = p.add_subparsers(dest="gpu_command", required=True, parser_class=OneLineParser)
    p = gpu_sub.add_parser("history", help="a GPU's recorded temperature, load, memory and power",
                           parents=[printing])
    p.add_argument("gpu", help="uuid or node:index")
    p.add_argument("--since", type=_duration, default=3600, help="how far back, e.g. 30m, 6h, 2d")
    p = gpu_sub.add_parser("resume", help="put a GPU in maintenance back in service (admins)",
                           parents=[printing])
    p.add_argument("gpu", help="uuid or node:index")
    cli_health.add_sim_commands(sub, lambda name, text: command(name, text, prints=False))
    p = command("events", "what happened, newest last")
    p.add_argument("--limit", type=_count, default=50, help="the newest this many (default 50)")
    p.add_argument("--kind", default=None,
                   help="only this kind (submit, place, start, end, requeue, node, health, xid, admin …)")
    p.add_argument("--node", default=None, help="only this node's")
    p.add_argument("--job", type=_job_id, default=None, help="only this job's")
    p.add_argument("--user", default=None, help="only those of this user")
    p.add_argument("--since", type=_when, default=None, metavar="WHEN",
                   help="only since then (a date or a time ago: 6h, 2d)")
    command("users", "fair-share weights and usage per user")
    p = command("logs", "a job's output", prints=False)
    p.add_argument("job", type=_job_id)
    p.add_argument("-f", "--follow", action="store_true", help="keep printing until the job ends")
    p.add_argument("--rank", type=int, default=None,
                   help="one node of a multi-node job (0 first); default: every node's, "
                        "each line prefixed with its rank")
    p.add_argument("-n", "--tail", type=_count, default=None, metavar="N",
                   help="only the last N lines (with -f: then follow)")
    p = command("parse", "print what NebulaGrid understands from a saved tool output", prints=False)
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
    p = command("serve", "run the head service in the foreground", prints=False)
    p.add_argument("--shared-group", default=None,
                   help="shared box: members of this Unix group may use the service")
    p.add_argument("--metrics", type=_address, default=None, metavar="HOST:PORT",
                   help="serve Prometheus metrics there, e.g. 127.0.0.1:9400 (off by default)")
    p = command("demo", "start the simulated lab and open the TUI on it", prints=False)
    p.add_argument("--headless", action="store_true", help="no TUI: keep the lab up until Ctrl-C")
    p.add_argument("--layout", default="demo", choices=("demo", "core", "4x4", "mixed"))
    p.add_argument("--shared-group", default=None,
                   help="let members of this Unix group use the demo's service")
    p.add_argument("--metrics", type=_address, default=None, metavar="HOST:PORT",
                   help="the demo's service serves Prometheus metrics there, e.g. 127.0.0.1:9400")
    command("tui", "open the TUI (the default)", prints=False)
    p = command("completion", "print the shell completion script: "
                "eval \"$(nebula completion bash)\"", prints=False)
    p.add_argument("shell", choices=("bash", "zsh"))
    return parser


class _Version(argparse.Action):
    """``--version``: looked up only when asked (every command builds the parser)."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        from importlib.metadata import PackageNotFoundError, version

        try:
            found = version("nebula-tui")
        except PackageNotFoundError:  # run from a source tree that was never installed
            found = "unknown"
        print(f"nebula {found}")
        parser.exit()


def main(argv: list[str] | None = None) -> int:
    """Run one command. A pipe that closes early (``nebula queue | head``) ends it quietly:
    handled here, once, for every command."""
    try:
        try:
            return _main(list(sys.argv[1:] if argv is None else argv))
        finally:  # a closed pipe may show only at the last flush (also after --help): here
            sys.stdout.flush()
    except BrokenPipeError:
        # Nothing more can be said on stdout; keep Python's exit-time flush from saying it.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return BROKEN_PIPE


def _main(argv: list[str]) -> int:
    if argv[:1] == [COMPLETE_COMMAND]:  # the shell asks for job ids or node names
        from .completion import complete_words

        return complete_words(argv[1:])
    trailing: list[str] = []
    if "--" in argv:  # everything after `--` is the job's command, never our flags
        cut = argv.index("--")
        argv, trailing = argv[:cut], argv[cut + 1:]
    parser = build_parser()
    args, extras = parser.parse_known_args(argv)
    if extras:
        _leaf_parser(parser, args).unrecognized(extras)
    args.trailing = trailing
    if trailing and args.command not in ("submit", "run"):
        parser.error("`--` is only for `nebula submit` and `nebula run`")
    command = args.command or "tui"
    host = getattr(args, "remote_host", None) or os.environ.get("NEBULA_HOST")
    try:
        if host and command not in LOCAL_COMMANDS:
            from .tunnel import open_tunnel

            with open_tunnel(host, getattr(args, "socket", None) or os.environ.get("NEBULA_SOCKET")) as tunnel:
                args.tunnel = tunnel
                home = Home.resolve(getattr(args, "home", None), str(tunnel.local_socket))
                return COMMANDS[command](args, home, getattr(args, "config", None))
        if host and command in ("serve", "demo"):
            print(f"nebula {command}: runs on the machine itself; drop --host (or NEBULA_HOST)",
                  file=sys.stderr)
            return USAGE_ERROR
        home = Home.resolve(getattr(args, "home", None), getattr(args, "socket", None))
        return COMMANDS[command](args, home, getattr(args, "config", None))
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
def _show(args, data, text) -> int:
    """Print ``data`` as JSON with ``--json``, else ``text`` (a string, or a function of
    ``data`` giving one)."""
    if getattr(args, "json", False):
        print(json.dumps(data, indent=2))
    else:
        # Every string in it may be another user's or a node's: shown as what it is.
        print(text(printable_tree(data)) if callable(text) else text)
    return 0


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
        "service": args.service, "no_requeue": args.no_requeue,
        "notify": getattr(args, "notify", False), **world_request(args),
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
        said = (f"Submitted array job {job['id']} ({reply.get('tasks', 1)} tasks)" if args.array
                else f"Submitted job {job['id']}")
        if not args.wait:
            return _show(args, job, said)
        if not args.json:  # the id at once; with --json, one document: the ended job
            print(said, flush=True)
        return _wait(client, job["id"], args.json)


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


def _wait(client, job_id: int, as_json: bool = False) -> int:
    job = client.call("wait", timeout=None, job=job_id)["job"]
    detail = f" with exit code {job['exit_code']}" if job["exit_code"] is not None else ""
    reason = f": {printable(job['reason'])}" if job["reason"] else ""
    if as_json:
        print(json.dumps(job, indent=2))
    else:
        print(f"Job {job_id} {job['state']}{detail}{reason}", file=sys.stderr)
    if job["exit_code"] is not None:
        return job["exit_code"]
    return 0 if job["state"] == "succeeded" else 1


def cmd_wait(args, home, config) -> int:
    with _client(home, config) as client:
        return _wait(client, args.job, args.json)


def cmd_status(args, home, config) -> int:
    from .views import status_text

    with _client(home, config) as client:
        reply = client.call("status")
    return _show(args, reply["summary"], status_text)


def cmd_queue(args, home, config) -> int:
    from .views import queue_text

    with _client(home, config) as client:
        jobs = client.call("queue")["jobs"]
        if args.all:
            ended = [s for s in (args.state or FINISHED_STATES) if s in FINISHED_STATES]
            jobs = (client.call("job_history", user=args.user, state=ended, limit=args.limit)["jobs"]
                    if ended else []) + jobs
    jobs = [j for j in jobs if (args.user is None or j["user"] == args.user)
            and (args.state is None or j["state"] in args.state)]
    return _show(args, jobs, lambda shown: queue_text(shown, time.time(), args.expand))


def cmd_report(args, home, config) -> int:
    from .views import report_text

    if args.months is not None and args.since is not None:
        print("nebula report: give --since or --months, not both", file=sys.stderr)
        return USAGE_ERROR
    now = time.time()
    since = args.since if args.since is not None else _month_start(now, back=(args.months or 1) - 1)
    with _client(home, config) as client:
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
    return _show(args, report, report_text)


def _month_start(now: float, back: int = 0) -> float:
    """The first moment of the local calendar month ``back`` months before ``now``'s."""
    t = time.localtime(now)
    months = t.tm_year * 12 + t.tm_mon - 1 - back
    return time.mktime((months // 12, months % 12 + 1, 1, 0, 0, 0, 0, 0, -1))


def cmd_history(args, home, config) -> int:
    from .views import history_text

    with _client(home, config) as client:
        jobs = client.call("job_history", user=args.user, since=args.since, until=args.until,
                           state=list(args.state) if args.state else None, node=args.node,
                           limit=args.limit)["jobs"]
    return _show(args, jobs, history_text)


def cmd_gpus(args, home, config) -> int:
    from .views import gpus_text

    with _client(home, config) as client:
        gpus = client.call("gpus")["gpus"]
    return _show(args, gpus, gpus_text)


def cmd_job(args, home, config) -> int:
    with _client(home, config) as client:
        print(json.dumps(client.call("job", job=args.job)["job"], indent=2))
    return 0


def cmd_cancel(args, home, config) -> int:
    with _client(home, config) as client:
        job = client.call("cancel", job=args.job)["job"]
    return _show(args, job, f"Cancelling job {job['id']}" if job["state"] != "cancelled"
                 else f"Cancelled job {job['id']}")


def _on_job(args, home, config, op: str, done: str) -> int:
    """A request about one job whose answer is the job: ``done`` (or it, with --json)."""
    with _client(home, config) as client:
        job = client.call(op, job=args.job)["job"]
    return _show(args, job, done)


def cmd_requeue(args, home, config) -> int:
    return _on_job(args, home, config, "requeue",
                   f"Requeueing job {args.job}: SIGUSR1 now, then back in the queue")


def cmd_hold(args, home, config) -> int:
    return _on_job(args, home, config, "hold",
                   f"Held job {args.job}; `nebula release {args.job}` lets it run")


def cmd_release(args, home, config) -> int:
    return _on_job(args, home, config, "release", f"Released job {args.job}")


def cmd_attach(args, home, config) -> int:
    from .attach_client import attach

    with _client(home, config) as client:  # finds (or starts) the service
        path = client.path
    attach(path, args.job, args.rank)
    return 0


def cmd_node(args, home, config) -> int:
    if args.node_command in ("add", "remove"):
        return _edit_nodes(args, home, config)
    if args.node_command == "show":
        from .views import node_text

        with _client(home, config) as client:
            return _show(args, client.call("node_show", node=args.node)["node"], node_text)
    with _client(home, config) as client:
        if args.node_command == "drain":
            node = client.call("drain", node=args.node, reason=args.reason)["node"]
            return _show(args, node, f"Drained {args.node}: running jobs go on, no new ones start there")
        node = client.call("resume", node=args.node)["node"]
    return _show(args, node, f"Resumed {args.node}")


def _edit_nodes(args, home, config) -> int:
    """node add/remove: the service edits its cluster file; adding asks to trust the key."""
    with _client(home, config) as client:
        if args.node_command == "remove":
            client.call("node_remove", node=args.node)
            return _show(args, {"node": args.node, "removed": True}, f"Removed {args.node}")
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
        added = {"node": args.node, "host": args.host, "port": args.port, "fingerprint": fingerprint}
        if not args.json:
            print(f"Added {args.node} ({args.host}:{args.port}, host key {fingerprint})", flush=True)
        if args.no_smoke:
            return _show(args, added, "") if args.json else 0
        if not args.json:
            print(f"Smoke test: a 4 GB job of the vendor's tool on {args.node} …", flush=True)
        try:
            smoke = client.call("node_smoke", timeout=180, node=args.node)
        except ApiError as err:
            smoke = {"error": str(err)}
    return _smoke_result(args, {**added, "smoke": smoke})


def _smoke_result(args, added: dict) -> int:
    """The smoke test's verdict, and the job's output: exit 0 only when it succeeded."""
    smoke, node = added["smoke"], added["node"]
    ok = smoke.get("ended") and smoke["job"]["state"] == "succeeded"
    if args.json:
        print(json.dumps(added, indent=2))
        return 0 if ok else 1
    if "error" in smoke:
        print(f"nebula node: {node} was added, but its smoke test could not run: {smoke['error']}",
              file=sys.stderr)
        return 1
    job = smoke["job"]
    where = f"job {job['id']} ({' '.join(job['command'])}) on {smoke['gpu']} ({smoke['model']})"
    if not smoke["ended"]:
        print(f"nebula node: the smoke test, {where}, has not ended yet; `nebula logs {job['id']} -f` "
              "follows it", file=sys.stderr)
        return 1
    print(f"Smoke test: {where} {job['state']}"
          + (f" with exit code {job['exit_code']}" if job["exit_code"] not in (None, 0) else ""))
    sys.stdout.write("".join(f"  | {line}\n" for line in smoke["output"].splitlines()))
    if not ok:
        print(f"nebula node: {node} failed its smoke test; it stays in the cluster: drain it "
              f"(nebula node drain {node}) until it is fixed", file=sys.stderr)
    return 0 if ok else 1


def cmd_gpu(args, home, config) -> int:
    if args.gpu_command == "resume":
        with _client(home, config) as client:
            gpu = client.call("gpu_resume", gpu=args.gpu)["gpu"]
        return _show(args, gpu, f"Resumed {gpu['node']}:{gpu['index']} ({gpu['uuid']}): "
                                "it takes new jobs again")
    with _client(home, config) as client:
        reply = client.call("history", gpu=args.gpu, since=args.since)
    return _show(args, reply, _gpu_history_text)


def _gpu_history_text(reply: dict) -> str:
    from .views import table

    rows = [(time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(s["t"])),
             fmt(s["temperature_c"], "C"), fmt(s["utilization_pct"], "%"), fmt(s["memory_used_mb"]),
             fmt(s["power_w"], "W"), fmt(s["fan_pct"], "%"), fmt(s["sm_clock_mhz"]),
             fmt(s["mem_clock_mhz"])) for s in reply["samples"]]
    text = f"GPU {reply['gpu']}\n" + table(
        ("TIME", "TEMP", "UTIL", "MEM MiB", "POWER", "FAN", "SM MHz", "MEM MHz"), rows,
        right=range(1, 8))
    return text if rows else text + "\n(no samples yet: one is taken every 30 s)"


def cmd_events(args, home, config) -> int:
    from .views import one_line

    with _client(home, config) as client:
        events = client.call("events", limit=args.limit, kind=args.kind, node=args.node,
                             job=args.job, user=args.user, since=args.since)["events"]
    return _show(args, events, lambda events: "\n".join(
        f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(e['t']))}  {e['kind']:<7} "
        f"{one_line(e['message'], limit=1000)}"
        for e in events))


def cmd_quota(args, home, config) -> int:
    with _client(home, config) as client:
        client.call("quota", user=args.user, hours=args.hours)
    return _show(args, {"user": args.user, "quota_gpu_hours": args.hours},
                 f"Quota of {args.user}: {args.hours:g} GPU-hours a month")


def cmd_users(args, home, config) -> int:
    from .views import format_duration, table

    with _client(home, config) as client:
        users = client.call("users")["users"]
    return _show(args, users, lambda users: table(
        ("USER", "WEIGHT", "FINISHED", "RUNNING", "GPU-H MONTH", "QUOTA", "JOBS MONTH",
         "EFFICIENCY", "IDLE GPU-H", "MEAN WAIT"),
        [(u["name"], f"{u['weight']:.3f}", u["jobs_finished"], u["running_jobs"],
          f"{u['month_gpu_hours']:.2f}", f"{u['quota_gpu_hours']:g}", u.get("month_jobs", 0),
          fmt(u.get("month_efficiency_pct"), "%"), f"{u.get('month_idle_gpu_hours') or 0:.2f}",
          format_duration(u.get("month_mean_wait_s"))) for u in users],
        right=range(1, 10)))


def cmd_logs(args, home, config) -> int:
    """One node's output as it is; a multi-node job's every rank, a prefix on each line."""
    if args.rank is not None or args.tail is not None:
        with _client(home, config) as client:
            offset = 0
            if args.tail is not None:  # the last lines of one node's log (rank 0 by default)
                offset = _print_tail(client, args.job, args.tail, args.rank or 0)
                if not args.follow:
                    return 0
            return _follow_one(client, args, offset)
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


def _follow_one(client, args, offset: int = 0) -> int:
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


def _print_tail(client, job_id: int, lines: int, rank: int) -> int:
    """Print the last ``lines`` lines of one node's log of the job as it is now (``rank``:
    which node of a multi-node job, 0 first); returns the offset
    where it ends. The log is read through (the node sends it in pieces); only the tail is
    kept, so a long log costs time, never memory."""
    from collections import deque

    kept: deque[str] = deque(maxlen=lines + 1)  # +1: the unfinished last line, if any
    offset, partial = 0, ""
    while True:
        reply = client.call("logs", job=job_id, offset=offset, rank=rank)
        if not reply["data"]:
            break
        offset = reply["offset"]
        *complete, partial = (partial + reply["data"]).split("\n")
        kept.extend(line + "\n" for line in complete)
    if partial:
        kept.append(partial)
    tail = list(kept)[-lines:]
    sys.stdout.write("".join(tail))
    return offset


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


def cmd_completion(args, home, config) -> int:
    from .completion import script

    sys.stdout.write(script(build_parser(), args.shell))
    return 0


def cmd_serve(args, home, config) -> int:
    from .config import ConfigError, find_config
    from .head.serve import serve

    try:
        path = find_config(config, home.root)
    except ConfigError as err:
        print(f"nebula serve: {err}", file=sys.stderr)
        return USAGE_ERROR
    return serve(home, path, shared_group=args.shared_group, metrics=args.metrics)


def cmd_demo(args, home, config) -> int:
    from .demo import run_demo

    if not (getattr(args, "home", None) or os.environ.get("NEBULA_HOME")):
        home = Home.resolve("~/.nebula/demo", getattr(args, "socket", None))
    metrics = f"{args.metrics[0]}:{args.metrics[1]}" if args.metrics else None
    return run_demo(home, args.layout, headless=args.headless, shared_group=args.shared_group,
                    metrics=metrics)


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
    "gpus": cmd_gpus, "history": cmd_history, "report": cmd_report, "job": cmd_job, "cancel": cmd_cancel, "logs": cmd_logs,
    "parse": cmd_parse, "serve": cmd_serve, "demo": cmd_demo, "tui": cmd_tui,
    "hold": cmd_hold, "release": cmd_release, "requeue": cmd_requeue, "attach": cmd_attach, "node": cmd_node,
    "gpu": cmd_gpu, "events": cmd_events, "users": cmd_users, "quota": cmd_quota,
    "sim": cli_health.cmd_sim, "completion": cmd_completion,
}
#: Commands that never talk to a service, so ``--host`` does not apply to them.
LOCAL_COMMANDS = ("parse", "serve", "demo", "sim", "completion")
