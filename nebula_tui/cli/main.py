"""``nebula``'s entry: parse, pick the command, run it here or through ``--host``'s
tunnel, and turn what any command may raise into a one-line error and its exit code."""

from __future__ import annotations

import os
import sys

from ..api import ApiError
from ..client.service import ServiceUnavailable
from ..homedir import Home
from ..model import ConfigError
from ..printable import printable
from . import accounting, bookings, cluster, jobs, local, logs, pools, sim
from .args import USAGE_ERROR, leaf_parser
from .parser import build_parser
from .slurm import with_directives

#: Exit code of a command whose output pipe closed early, as if SIGPIPE had ended it.
BROKEN_PIPE = 128 + 13
#: The hidden first word with which completion scripts ask for job ids and node names.
COMPLETE_COMMAND = "__complete"

COMMANDS = {
    "submit": jobs.cmd_submit, "run": jobs.cmd_run, "wait": jobs.cmd_wait, "queue": jobs.cmd_queue,
    "job": jobs.cmd_job, "why": jobs.cmd_why, "cancel": jobs.cmd_cancel, "hold": jobs.cmd_hold,
    "release": jobs.cmd_release, "requeue": jobs.cmd_requeue, "attach": jobs.cmd_attach,
    "logs": logs.cmd_logs,
    "status": cluster.cmd_status, "gpus": cluster.cmd_gpus, "events": cluster.cmd_events,
    "node": cluster.cmd_node, "gpu": cluster.cmd_gpu, "doctor": cluster.cmd_doctor,
    "pool": pools.cmd_pool,
    "history": accounting.cmd_history, "report": accounting.cmd_report,
    "users": accounting.cmd_users, "quota": accounting.cmd_quota,
    "reserve": bookings.cmd_reserve, "reservations": bookings.cmd_reservations,
    "parse": local.cmd_parse, "serve": local.cmd_serve, "demo": local.cmd_demo,
    "tui": local.cmd_tui, "completion": local.cmd_completion, "sim": sim.cmd_sim,
    "simulate": local.cmd_simulate, "backup": local.cmd_backup,
    # Slurm's names, for hands and scripts that type them
    "sbatch": jobs.cmd_submit, "srun": jobs.cmd_run, "squeue": jobs.cmd_queue,
    "scancel": jobs.cmd_cancel,
}
#: Commands that never talk to a service, so ``--host`` does not apply to them.
LOCAL_COMMANDS = ("parse", "serve", "demo", "sim", "completion", "simulate", "backup")


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
        leaf_parser(parser, args).unrecognized(extras)
    if getattr(args, "script", None):  # `nebula submit train.sh`: its #SBATCH lines too
        args = with_directives(parser, leaf_parser(parser, args), argv, args)
    args.trailing = trailing
    if trailing and args.command not in ("submit", "run", "sbatch", "srun"):
        parser.error("`--` is only for `nebula submit` and `nebula run`")
    command = args.command or "tui"
    host = getattr(args, "remote_host", None) or os.environ.get("NEBULA_HOST")
    try:
        if host and command not in LOCAL_COMMANDS:
            from ..client.tunnel import open_tunnel

            with open_tunnel(host, getattr(args, "socket", None) or os.environ.get("NEBULA_SOCKET")) as tunnel:
                args.tunnel = tunnel
                home = Home.resolve(getattr(args, "home", None), str(tunnel.local_socket))
                return COMMANDS[command](args, home, getattr(args, "config", None))
        if host and command in ("serve", "demo", "backup"):
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
    except BrokenPipeError:
        raise  # main's to end quietly
    except OSError as err:  # a file or folder this user may not touch: the reason, no traceback
        print(f"nebula: {printable(err)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
