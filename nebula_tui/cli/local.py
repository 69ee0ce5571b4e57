"""The commands that run here rather than ask a service: parse, completion, backup (on
the head's own files: it must work while no head can start), and those that start one
(serve, demo, and the TUI, which opens the demo lab when no cluster is given), or run the
head's own code in virtual time (simulate)."""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys
from pathlib import Path

from ..homedir import Home
from .args import USAGE_ERROR
from .common import show
from .parser import build_parser


def cmd_parse(args: argparse.Namespace, home: Home, config: str | None) -> int:
    from ..remote import documents

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
        if args.best is not None and isinstance(result, dict):  # (topo's: a dict)
            from ..scheduler.topology import best_set

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


def cmd_completion(args: argparse.Namespace, home: Home, config: str | None) -> int:
    from .completion import script

    sys.stdout.write(script(build_parser(), args.shell))
    return 0


def cmd_serve(args: argparse.Namespace, home: Home, config: str | None) -> int:
    from ..config.cluster import find_config
    from ..model import ConfigError
    from ..head.serve import serve

    try:
        path = find_config(config, home.root)
    except ConfigError as err:
        print(f"nebula serve: {err}", file=sys.stderr)
        return USAGE_ERROR
    return serve(home, path, shared_group=args.shared_group, metrics=args.metrics)


def cmd_backup(args: argparse.Namespace, home: Home, config: str | None) -> int:
    """``nebula backup``: on the head's own files, as the account it runs as (no service
    request: a head that cannot start, its database lost, must still be restorable)."""
    from ..backups import BackupError, Backups, head_stopped

    os.umask(0o077)  # a backup, or an empty database, is the service account's alone
    backups = Backups(home.db)
    try:
        if args.list:
            found = [{"name": b.name, "path": str(b.path), "taken_at": b.taken_at, "size": b.size,
                      **backups.summary(b)} for b in backups.list()]
            return show(args, found, lambda shown: _backup_table(shown, backups.folder))
        if args.restore or args.start_empty:
            with head_stopped(home.lock):
                done = backups.restore(args.restore) if args.restore else backups.start_empty()
            return show(args, {"message": done}, f"nebula backup: {done}")
        if not home.db.exists():
            print(f"nebula backup: there is no database at {home.db} (give --home?)", file=sys.stderr)
            return USAGE_ERROR
        made = backups.make()
        return show(args, {"path": str(made.path), "taken_at": made.taken_at, "size": made.size},
                    f"nebula backup: {made.path} ({_size(made.size)}; the newest {backups.keep} "
                    "are kept)")
    except BackupError as err:
        print(f"nebula backup: {err}", file=sys.stderr)
        return 1
    except OSError as err:  # the home is not this account's (run it as the head's)
        print(f"nebula backup: {err.strerror or err}: {err.filename or home.root}", file=sys.stderr)
        return 1


def _backup_table(found: list[dict], folder) -> str:
    import time

    if not found:
        return f"no backups in {folder}"
    lines = [f"{'NAME':<28} {'TAKEN':<20} {'SIZE':>9}  JOBS"]
    for backup in found:
        jobs = (f"damaged: {backup['damaged']}" if "damaged" in backup else
                f"{backup['jobs']} (newest {backup['newest_job'] or '-'}; {backup['running']} "
                f"running, {backup['waiting']} waiting)")
        taken = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(backup["taken_at"]))
        lines.append(f"{backup['name']:<28} {taken:<20} {_size(backup['size']):>9}  {jobs}")
    return "\n".join(lines)


def _size(size: int) -> str:
    return f"{size / 1e6:.1f} MB" if size >= 100_000 else f"{size / 1e3:.1f} kB"


def cmd_demo(args: argparse.Namespace, home: Home, config: str | None) -> int:
    from .demo import demo_owner, run_demo

    if not (getattr(args, "home", None) or os.environ.get("NEBULA_HOME")):
        home = Home.resolve("~/.nebula/demo", getattr(args, "socket", None))
    metrics = f"{args.metrics[0]}:{args.metrics[1]}" if args.metrics else None
    if args.slurm and (refusal := _slurm_demo_refusal(args, home)):
        print(f"nebula demo: {refusal}", file=sys.stderr)
        return 1
    return run_demo(home, args.layout, headless=args.headless, shared_group=args.shared_group,
                    metrics=metrics, slurm=args.slurm, owner=demo_owner(home.root))


def _slurm_demo_refusal(args: argparse.Namespace, home: Home) -> str | None:
    """What stops ``demo --slurm`` before anything is installed or started, or None. Not
    root: the one sudo line, with this installation's own ``nebula`` (sudo's PATH does not
    have the venv) and this user's home for the demo (sudo's HOME is root's)."""
    from ..sim.lab import LabError, find_sshd

    if os.geteuid() != 0:
        here = Path(sys.executable).parent / "nebula"
        program = str(here) if here.exists() else f"{sys.executable} -m nebula_tui"
        line = " ".join(shlex.quote(a) for a in (
            *program.split(" "), "demo", "--slurm", "--home", str(home.root),
            *(["--headless"] if args.headless else [])))
        return ("--slurm runs Slurm's daemons, which need root (slurmd starts each job as its "
                f"user), and installs Slurm when missing; run:\n  sudo {line}")
    try:
        find_sshd()  # the Slurm cluster's login node is a real sshd
    except LabError as err:
        return f"--slurm needs {err}"
    return None


def cmd_tui(args: argparse.Namespace, home: Home, config: str | None) -> int:
    from ..config.cluster import find_config

    path = find_config(config, home.root)  # a ConfigError is main's one-line usage error
    if path is None and not home.socket.exists():
        # No cluster given: the TUI opens on the built-in simulated lab (R26).
        from .demo import run_demo

        return run_demo(Home.resolve("~/.nebula/demo"), "demo", headless=False)
    from ..screens.app import run_tui

    return run_tui(home, config)


def cmd_simulate(args: argparse.Namespace, home: Home, config: str | None) -> int:
    """``nebula simulate``: a lab month through the head's own scheduler in virtual time
    (``head/replay.py``), against the spreadsheet and Slurm-like baselines."""
    from ..model import ConfigError
    from ..head.replay import Replay, ReplayStalled
    from ..month import compare, inventory, plots, setup, workload

    # Bounded, so a replay's memory and time are: a year, up to 100 times the cards'
    # hours of demand, a lab's users (each drawn job is built and replayed).
    for flag, value, low, high in (("--days", args.days, 0.0, 366.0), ("--load", args.load, 0.0, 100.0),
                                   ("--users", args.users or 1, 0, 10_000)):
        if not math.isfinite(value) or not low < value <= high:
            print(f"nebula simulate: {flag} is {value:g}; give a number above {low:g}, at most {high:g}",
                  file=sys.stderr)
            return USAGE_ERROR
    try:
        inv = inventory.from_gpus_json(Path(args.gpus_json)) if args.gpus_json else inventory.layout(args.layout)
        links = {} if args.gpus_json else inventory.layout_links(args.layout)
        # The built-in month is the lab's as it is: --add/--remove change the cards, not the
        # jobs (a capacity question asks how the same work fares on other cards).
        asked = inv
        for what in args.add:
            inv = inventory.add(inv, what)
        for node in args.remove:
            inv = inventory.remove(inv, node)
        cluster = setup.replay_config(inv, Path(config) if config else None, args.set)
        horizon = args.days * 86400
        if args.workload:
            requests = workload.read(Path(args.workload))
        else:
            requests = workload.lab_month(len(inventory.card_list(asked)), inventory.largest_node(asked),
                                          users=args.users or max(12, len(inv)),
                                          days=args.days, load=args.load, seed=args.seed)
    except (inventory.InventoryError, workload.WorkloadError, setup.SetupError, ConfigError) as err:
        print(f"nebula simulate: {err}", file=sys.stderr)
        return USAGE_ERROR
    if args.save_trace:
        workload.write_trace(requests, Path(args.save_trace))

    def nebula(reqs, cards, horizon_s):
        return Replay(cluster, cards, reqs, setup.REPLAY_EPOCH, horizon_s, links, forecasts=True).run()

    try:
        result = compare.compare(requests, inv, horizon, cluster.scheduler.half_life_s, nebula)
    except ReplayStalled as err:
        print(f"nebula simulate: {err}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(plots.as_json(result), indent=2))
    else:
        if (args.add or args.remove) and not args.workload:
            print(f"the same jobs as on the lab's {len(inventory.card_list(asked))} cards, "
                  f"replayed on {len(inventory.card_list(inv))} (--add/--remove change the cards, "
                  "not the workload)\n")
        print(result.text())
        print()
        print(plots.text_chart(result, color=sys.stdout.isatty()))
    if args.plot:
        try:
            plots.png(result, Path(args.plot))
        except plots.PlotError as err:
            print(f"nebula simulate: {err}", file=sys.stderr)
            return 1
        print(f"plot: {args.plot}")
    return 0
