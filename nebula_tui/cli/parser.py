"""The whole grammar of ``nebula``: every sub-command, its flags and their help, in one
parser (help, completion and the did-you-mean all read it). What each command does is its
family's module."""

from __future__ import annotations

import argparse
import getpass
import os

from .. import environments
from ..api import ARCH_RE, CUDA_RE, EVENT_KINDS
from ..model import VENDORS
from . import sim
from .args import (FINISHED_STATES, REPORT_TABLES, STATES, OneLineParser, address, ahead, array,
                   checked, count, duration, ended_states, job_id, job_states, pattern, size_mb,
                   users, when)
from .slurm import (GpuRequest, MailType, Qos, add_unhonoured, after, check_format, dependency, export,
                    gpus, gres, slurm_states)


def add_world_flags(p: argparse.ArgumentParser) -> None:
    """What the job runs in: a container, a conda env or a venv (R24), and warm-up (R27)."""
    p.add_argument("--image", type=checked(environments.image_reference), default=None,
                   help="run in this container image (podman, docker or apptainer on the node)")
    p.add_argument("--runtime", choices=environments.RUNTIMES, default=None,
                   help="with --image: this container runtime (default: the node's)")
    p.add_argument("--data-mount", dest="data_mounts", action="append", default=[],
                   type=checked(environments.data_mount), metavar="SRC:DST[:ro]",
                   help="with --image: mount the node's SRC at DST (repeatable)")
    p.add_argument("--conda", type=checked(environments.conda_env), default=None,
                   help="activate this conda env (name or path) on the node first")
    p.add_argument("--venv", type=os.path.abspath, default=None,
                   help="activate this Python venv on the node first")
    p.add_argument("--warmup", action="store_true",
                   help="wake the cards from their idle state before the command starts")


def add_submit_flags(p: argparse.ArgumentParser) -> None:
    """What a job asks for: `nebula submit` and `nebula run` take the same, under
    NebulaGrid's names and Slurm's (sbatch/srun's short and long ones, `cli/slurm.py`)."""
    p.add_argument("--name", "-J", "--job-name", default="")
    p.add_argument("--gpu-count", "-G", "--gpus", type=gpus, action=GpuRequest, default=1,
                   metavar="[TYPE:]N",
                   help="GPUs the job needs in all (default 1); a TYPE (a100, h100, nvidia, "
                        "sm_89…) sets --arch or --vendor")
    p.add_argument("--gres", "--gpus-per-node", dest="gpus_per_node", type=gres,
                   action=GpuRequest, default=None, metavar="gpu[:TYPE]:N",
                   help="GPUs per node, as Slurm's --gres: the job gets N times --nodes")
    p.add_argument("--gpu-mem", "--mem-per-gpu", type=size_mb, default=None,
                   help="memory per GPU, e.g. 8G (default: whole cards)")
    p.add_argument("--workdir", "-D", "--chdir", default=None,
                   help="directory on the node (default: this directory where the node has "
                        "it, else the home)")
    p.add_argument("--command", "--wrap", dest="shell_command", default=None,
                   help="a shell command line instead of `-- cmd args…`")
    p.add_argument("--arch", type=pattern(ARCH_RE, "sm_89, '>=sm_80' or gfx90a"), default=None,
                   help="compute capability: sm_89 exactly, or '>=sm_80'")
    p.add_argument("--cuda", type=pattern(CUDA_RE, "12.1"), default=None,
                   help="the driver must support at least this CUDA, e.g. 12.1")
    p.add_argument("--vendor", default=None, choices=(*VENDORS, "any"),
                   help="the cards' vendor (default: nodes.yaml's scheduler.default_vendor, else any)")
    p.add_argument("--nodes", "-N", type=count, default=1,
                   help="how many nodes the GPUs may span (default 1)")
    p.add_argument("--priority", type=int, default=0, help="admins: higher runs first")
    p.add_argument("--after", type=after, action="append", default=[],
                   help="start once these jobs succeeded (12,13), ended (any:12), failed "
                        "(notok:12) or started (started:12); repeatable")
    p.add_argument("--dependency", "-d", dest="after", type=dependency, action="append",
                   metavar="TYPE:ID[:ID…]",
                   help="Slurm's form of --after: afterok:12:13, afterany:12, afternotok:12, "
                        "after:12 (started); a bare id is afterany")
    p.add_argument("--time", "-t", dest="time_limit", type=duration, default=None,
                   help="it is stopped then (SIGUSR1, SIGKILL after the grace); as in Slurm, "
                        "a bare number is minutes (90), or 1:30:00, 2-12, 30m, 2h, 90s; "
                        "lets it use reserved GPUs meanwhile")
    p.add_argument("--output", "-o", default=None, metavar="FILE",
                   help="write its output to FILE on the node (relative: to its workdir), as "
                        "sbatch: %%j job id, %%x name, %%u user, %%a task, %%A array id")
    p.add_argument("--error", "-e", default=None, metavar="FILE",
                   help="its error output to FILE (default: with --output's)")
    p.add_argument("--service", action="store_true",
                   help="a long-running inference service: its card keeps 2 GB spare")
    p.add_argument("--no-requeue", action="store_true",
                   help="fail instead of restarting elsewhere when its GPU is isolated")
    p.add_argument("--reservation", default=None, metavar="BOOKING",
                   help="run on that booking's GPUs only, inside its window (`nebula reservations`)")
    p.add_argument("--preemptible", action="store_true",
                   help="run on any free GPU now, whatever your fair share; stopped (SIGUSR1, "
                        "grace, SIGKILL) and requeued when a normal job needs the GPU; charged less")
    p.add_argument("--nodelist", "-w", default=None, metavar="NODES",
                   help="run only on these nodes, as Slurm's hostlist: gpu1,gpu2 or gpu[01-04]")
    p.add_argument("--exclude", "-x", default=None, metavar="NODES",
                   help="never run on these nodes (same form as --nodelist)")
    p.add_argument("--export", dest="export", type=export, action="append", default=[],
                   metavar="[ALL|NONE,]VAR=val,…",
                   help="set these variables in the job's environment on its node (ALL and "
                        "NONE: the node's own environment; yours is never copied whole)")
    p.add_argument("--qos", action=Qos, default=None, metavar="QOS",
                   help="Slurm's: scavenger is --preemptible")
    p.add_argument("--pool", "-p", "--partition", dest="pool", default=None, metavar="NAME",
                   help="run it in this pool (a Slurm cluster in nodes.yaml's pools:), or "
                        "'local' to keep it on the lab's nodes (default: here, or a pool once "
                        "it waited past the pool's burst_after)")
    add_world_flags(p)
    add_unhonoured(p)


def build_parser() -> OneLineParser:
    common = OneLineParser(add_help=False)
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
    printing = OneLineParser(add_help=False)
    printing.add_argument("--json", action="store_true",
                          help="print JSON instead of text (shapes: docs/reference.md, \"JSON output\")")
    parser = OneLineParser(prog="nebula", parents=[common],
                           description="NebulaGrid: GPU cluster manager for labs. "
                                       "Without a command, opens the TUI.")
    parser.add_argument("--version", action=_Version, help="print the version and exit")
    sub = parser.add_subparsers(dest="command", parser_class=OneLineParser)

    def command(name: str, help_text: str, prints: bool = True, **kw) -> OneLineParser:
        return sub.add_parser(name, help=help_text,
                              parents=[common, printing] if prints else [common], **kw)

    p = command("submit", "submit a job: nebula submit [options] -- cmd args…, or nebula "
                          "submit [options] script.sh [args…] (its #SBATCH/#NEBULA lines read)",
                aliases=["sbatch"])
    add_submit_flags(p)
    p.add_argument("--array", "-a", type=array, default=None,
                   help="run it as tasks 0-99 (NEBULA_ARRAY_TASK_ID), at most 8 at once with 0-99%%8")
    p.add_argument("--wait", "-W", action="store_true", help="wait for the end; exit with its code")
    p.add_argument("--notify", action="store_true",
                   help="mail you (and the lab's job webhooks) when it ends or is requeued")
    p.add_argument("--mail-type", dest="notify", action=MailType, metavar="TYPE",
                   help="Slurm's: any type but NONE is --notify")
    p.add_argument("--parsable", action="store_true",
                   help="print the job id alone (as sbatch --parsable), for scripts")
    p.add_argument("script", nargs=argparse.REMAINDER, metavar="script.sh [args…]",
                   help="a job script: its #SBATCH and #NEBULA lines at the top are read as "
                        "flags (those given here win), and the node runs it by its path")
    p = command("run", "run a command once it has its GPUs, as srun: its output here as it "
                       "runs, its exit code this command's, Ctrl-C cancels it; --pty: this "
                       "terminal is the job's (nebula run --pty -- bash)", prints=False,
                aliases=["srun"])
    add_submit_flags(p)
    p.add_argument("--pty", action="store_true",
                   help="give the job this terminal, as srun --pty (Ctrl-b d detaches)")

    command("status", "the cluster overview")
    # -h is squeue's --noheader here (--help still helps)
    p = command("queue", "running and waiting jobs (as squeue: nebula squeue, or -o FORMAT)",
                aliases=["squeue"], conflict_handler="resolve")
    p.add_argument("--expand", action="store_true", help="one line per task of an array")
    p.add_argument("--user", "-u", default=None, help="only this user's jobs")
    p.add_argument("--me", dest="user", action="store_const", const=getpass.getuser(),
                   help="only your jobs")
    p.add_argument("--state", type=job_states, default=None, metavar="STATE[,STATE]",
                   help=f"only jobs in these states ({', '.join(STATES)})")
    p.add_argument("--states", "-t", dest="state", type=slurm_states, metavar="STATE[,STATE]",
                   help="squeue's: PENDING, RUNNING, R, PD…, or all")
    p.add_argument("--jobs", "-j", type=lambda t: {job_id(w) for w in t.split(",")},
                   default=None, metavar="ID[,ID]", help="only these jobs")
    p.add_argument("--format", "-o", type=check_format, default=None, metavar="FORMAT",
                   help="squeue's fields: %%i id, %%j name, %%u user, %%T state, %%t short "
                        "state, %%M time, %%l limit, %%D nodes, %%R reason or nodes, %%P pool…")
    p.add_argument("--noheader", "-h", action="store_true", help="with squeue's shape: no header line")
    p.add_argument("--all", action="store_true",
                   help="ended jobs too (the newest --limit of them, as in `nebula history`)")
    p.add_argument("--limit", type=count, default=100, help="with --all: how many ended jobs")
    command("gpus", "every GPU: memory, utilisation, temperature, who holds it")
    p = command("report", "GPU-hours, efficiency and waits per user and month; capacity and "
                "utilisation per node and day")
    p.add_argument("--since", type=when, default=None, metavar="WHEN",
                   help="from (a date or a time ago; default: the start of this month)")
    p.add_argument("--until", type=when, default=None, metavar="WHEN", help="until (default: now)")
    p.add_argument("--months", type=count, default=None, metavar="N",
                   help="the last N calendar months, this one included")
    p.add_argument("--csv", choices=REPORT_TABLES, default=None,
                   help="print one of its tables as CSV instead")
    p = command("history", "ended jobs: what each held, waited, ran, cost and did")
    p.add_argument("--user", default=None, help="only this user's jobs")
    p.add_argument("--since", type=when, default=None, metavar="WHEN",
                   help="ended since: a date (2026-12-01, '2026-12-01 14:00') or a time ago (7d, 6h)")
    p.add_argument("--until", type=when, default=None, metavar="WHEN", help="ended before")
    p.add_argument("--state", type=ended_states, default=None, metavar="STATE[,STATE]",
                   help=f"only these end states ({', '.join(FINISHED_STATES)})")
    p.add_argument("--node", default=None, help="only jobs that ran on this node")
    p.add_argument("--limit", type=count, default=100, help="the newest this many (default 100)")
    for name, help_text in (("wait", "wait for a job to end; exit with its code"),
                            ("job", "one job in full (--json: as JSON)"),
                            ("hold", "keep a waiting job from starting"),
                            ("requeue", "stop a running job and put it back in the queue"),
                            ("release", "let a held job start again")):
        command(name, help_text).add_argument("job", type=job_id)
    p = command("why", "why a job waits (or runs), and what would start it sooner; "
                       "--user: a user's fair share")
    p.add_argument("job", type=job_id, nargs="?", default=None)
    p.add_argument("--user", default=None, help="explain this user's standing instead")
    command("cancel", "cancel jobs (several ids at once, like scancel)",
            aliases=["scancel"]).add_argument(
        "jobs", type=job_id, nargs="+", metavar="job")
    p = command("attach", "attach this terminal to a running job's tmux session "
                          "(detach: Ctrl-b d, or Ctrl-b Ctrl-b d inside your own tmux; the job runs on)", prints=False)
    p.add_argument("job", type=job_id)
    p.add_argument("--rank", type=int, default=0, help="which node of a multi-node job (0 first)")
    p = command("node", "node administration (admins)", prints=False)
    node_sub = p.add_subparsers(dest="node_command", required=True, parser_class=OneLineParser)

    def node_command(name: str, help_text: str) -> OneLineParser:
        return node_sub.add_parser(name, help=help_text, parents=[printing])

    p = node_command("drain", "no new jobs on this node; running ones go on")
    p.add_argument("node")
    p.add_argument("--reason", default="")
    node_command("resume", "take new jobs again").add_argument("node")
    p = node_command("add", "add a node to nodes.yaml, trusting its host key")
    p.add_argument("node")
    p.add_argument("host")
    p.add_argument("--port", type=count, default=22)
    p.add_argument("--user", default=None, help="login user (default: the cluster's)")
    p.add_argument("--identity", default=None, help="client key (default: the cluster's)")
    p.add_argument("--trust", default=None, metavar="SHA256:…",
                   help="trust the host key only if it has this fingerprint (no question asked)")
    p.add_argument("--no-smoke", action="store_true",
                   help="skip the smoke test (a 4 GB job of the vendor's tool on the new node)")
    node_command("remove", "remove a node from nodes.yaml").add_argument("node")
    node_command("show", "one node in full: why it is in its state, its GPUs, jobs and "
                 "latest events").add_argument("node")
    p = command("pool", "the pools (batch clusters in nodes.yaml's pools:)", prints=False)
    pool_sub = p.add_subparsers(dest="pool_command", required=True, parser_class=OneLineParser)
    p = pool_sub.add_parser("authorize", parents=[printing],
                            help="print the line that lets the head submit to this pool as you "
                                 "(for your ~/.ssh/authorized_keys on its login node)")
    p.add_argument("pool", metavar="NAME")
    p = command("doctor", "check what each node needs (SSH, python3, tmux, GPU tools, clock, "
                          "disk…), one line a check with the fix; exit 1 when one fails")
    p.add_argument("nodes", nargs="*", metavar="node", help="only these nodes (default: all)")
    p = command("gpu", "one GPU", prints=False)
    gpu_sub = p.add_subparsers(dest="gpu_command", required=True, parser_class=OneLineParser)
    p = gpu_sub.add_parser("history", help="a GPU's recorded temperature, load, memory and power",
                           parents=[printing])
    p.add_argument("gpu", help="uuid or node:index")
    p.add_argument("--since", type=duration, default=3600, help="how far back, e.g. 30m, 6h, 2d")
    p = gpu_sub.add_parser("resume", help="put a GPU in maintenance back in service once it "
                           "passes its self-test (admins)", parents=[printing])
    p.add_argument("gpu", help="uuid or node:index")
    p.add_argument("--force", action="store_true",
                   help="without the self-test, even while the driver reports it lost (an event "
                        "records who)")
    sim.add_sim_commands(sub, lambda name, text: command(name, text, prints=False))
    p = command("events", "what happened, newest last")
    p.add_argument("--limit", type=count, default=50, help="the newest this many (default 50)")
    p.add_argument("--kind", default=None, choices=EVENT_KINDS, metavar="KIND",
                   help=f"only this kind: {', '.join(EVENT_KINDS)}")
    p.add_argument("--node", default=None, help="only this node's")
    p.add_argument("--job", type=job_id, default=None, help="only this job's")
    p.add_argument("--user", default=None, help="only what this user did and what their jobs did")
    p.add_argument("--since", type=when, default=None, metavar="WHEN",
                   help="only since then (a date or a time ago: 6h, 2d)")
    command("users", "fair-share weights and usage per user")
    p = command("logs", "a job's output", prints=False)
    p.add_argument("job", type=job_id)
    p.add_argument("-f", "--follow", action="store_true", help="keep printing until the job ends")
    p.add_argument("--rank", type=int, default=None,
                   help="one node of a multi-node job (0 first); default: every node's, "
                        "each line prefixed with its rank")
    p.add_argument("-n", "--tail", type=count, default=None, metavar="N",
                   help="only the last N lines (with -f: then follow)")
    p.add_argument("--attempt", type=count, default=None, metavar="N",
                   help="a requeued job's earlier run: 1 is its first (default: the latest)")
    p = command("parse", "print what NebulaGrid understands from a saved tool output", prints=False)
    p.add_argument("kind", help="smi-csv, smi-apps, smi-plain, smi-q, smi-xml, amd-smi, "
                   "rocm-smi, xpu-smi, npu-smi, topo, xid")
    p.add_argument("file", help="the saved output ('-' for stdin)")
    p.add_argument("--fields", default=None,
                   help="smi-csv/smi-apps without a header: the query's fields, comma-separated")
    p.add_argument("--best", type=count, default=None,
                   help="with topo: the K GPUs a K-GPU job would get on that machine")
    p = command("reserve", "book GPUs for some users through a window: nebula reserve --gpus "
                           "node02:0-3 --start '2026-12-11 09:00' --duration 10h --users alice,bob")
    p.add_argument("--gpus", default=None, metavar="NODE:INDEXES", help="these GPUs, e.g. node02:0-3")
    p.add_argument("--gpu-count", type=count, default=None, help="or this many GPUs (one node)")
    p.add_argument("--gpu-mem", type=size_mb, default=None, help="with --gpu-count: at least this memory each")
    p.add_argument("--start", type=ahead, default=None, metavar="WHEN",
                   help="'2026-12-11 09:00' (local time), now, or +2h")
    p.add_argument("--duration", type=duration, default=None, help="how long, e.g. 10h")
    p.add_argument("--users", type=users, default=None, help="whose jobs may use them (default: you)")
    p.add_argument("--name", default=None, help="the booking's name (default: yours and its start)")
    p.add_argument("--delete", default=None, metavar="NAME", help="end this booking now")
    command("reservations", "the bookings under way or ahead")
    p = command("quota", "set a user's GPU-hours per month (admins)")
    p.add_argument("user")
    p.add_argument("hours", type=float)
    p = command("serve", "run the head service in the foreground", prints=False)
    p.add_argument("--shared-group", default=None,
                   help="shared box: members of this Unix group may use the service")
    p.add_argument("--metrics", type=address, default=None, metavar="HOST:PORT",
                   help="serve Prometheus metrics there, e.g. 127.0.0.1:9400 (off by default)")
    p = command("backup", "back up the head's database now (admins, on the head's machine); "
                "or list, restore one, start an empty one")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--list", action="store_true", help="the backups kept, newest first")
    what.add_argument("--restore", default=None, metavar="NAME",
                      help="put this backup (a name from --list, latest, or a file's path) in "
                           "place of the database; the head must be stopped")
    what.add_argument("--start-empty", action="store_true",
                      help="put an empty database in place of a lost one; the head takes in "
                           "the jobs the nodes still run; the head must be stopped")
    p = command("demo", "start the simulated lab and open the TUI on it", prints=False)
    p.add_argument("--headless", action="store_true", help="no TUI: keep the lab up until Ctrl-C")
    p.add_argument("--layout", default="demo", choices=("demo", "core", "4x4", "mixed"))
    p.add_argument("--shared-group", default=None,
                   help="let members of this Unix group use the demo's service")
    p.add_argument("--metrics", type=address, default=None, metavar="HOST:PORT",
                   help="the demo's service serves Prometheus metrics there, e.g. 127.0.0.1:9400")
    p.add_argument("--slurm", action="store_true",
                   help="add pool hpc: a real Slurm (4 nodes x 4 fake GPUs, installed when "
                        "missing) behind a login node on 127.0.0.1; needs root")
    p = command("simulate", "replay a lab month through the scheduler in virtual time, against "
                "two baselines", prints=False)
    p.add_argument("workload", nargs="?", default=None,
                   help="a trace CSV, `nebula history --json` output or a `sacct --parsable2` "
                   "export (default: the built-in lab month)")
    p.add_argument("--days", type=float, default=30.0, help="how long to replay (default 30)")
    p.add_argument("--gpus", dest="gpus_json", default=None, metavar="FILE",
                   help="the cards: `nebula gpus --json` saved from a head (default: the demo lab's)")
    p.add_argument("--layout", default="demo", choices=("demo", "core", "4x4", "mixed"),
                   help="the simulated lab whose cards to replay on, without --gpus")
    p.add_argument("--add", action="append", default=[], metavar="'Nx MODEL@NODE'",
                   help="what if: more cards, e.g. '2x NVIDIA GeForce RTX 4090@node07'")
    p.add_argument("--remove", action="append", default=[], metavar="NODE",
                   help="what if: without this node")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="what if: another setting, e.g. scheduler.half_life=3d")
    p.add_argument("--load", type=float, default=0.8,
                   help="the built-in month's demand as a share of the cards' GPU-hours (default 0.8)")
    p.add_argument("--users", type=count, default=None,
                   help="the built-in month's users (default: 12, or one per node on a larger lab)")
    p.add_argument("--seed", type=int, default=2026, help="the built-in month's seed")
    p.add_argument("--save-trace", default=None, metavar="FILE",
                   help="write the workload replayed as a trace CSV")
    p.add_argument("--plot", default=None, metavar="FILE.png",
                   help="draw utilisation over the month and the wait CDF per policy (needs matplotlib: "
                   "pip install 'nebula-tui[plot]')")
    p.add_argument("--json", action="store_true", help="the figures as JSON")
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
        from ..release import running

        print(f"nebula {running()}")
        parser.exit()
