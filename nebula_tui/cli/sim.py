"""The simulated lab's fault injection (``nebula sim …``).

``parser.py`` hands its top-level sub-parsers to :func:`add_sim_commands`; ``main.py``
dispatches ``sim`` to :func:`cmd_sim`. ``nebula sim`` works on the lab whose cluster file it
is given (``--config``, ``$NEBULA_CONFIG``, as every command); what it does to the lab is
``sim/control.py``'s. Like the rest of the CLI this imports neither asyncssh nor textual."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ..homedir import Home


# ----------------------------------------------------------------------------- parsers
def _code(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise argparse.ArgumentTypeError(f"'{text}' is not an Xid code (a number such as 79)")
    return int(text)


def add_sim_commands(sub, command) -> None:
    """``nebula sim inject|node|throttle`` (``command`` is ``parser.py``'s sub-parser factory)."""
    p = command("sim", "faults for the simulated lab: Xid errors, silent nodes, throttling")
    sim_sub = p.add_subparsers(dest="sim_command", required=True, parser_class=type(p))
    inject = sim_sub.add_parser("inject", help="log a fault on a simulated node")
    inject_sub = inject.add_subparsers(dest="fault", required=True, parser_class=type(p))
    p = inject_sub.add_parser("xid", help="the kernel lines of an Xid error, and its effect")
    p.add_argument("code", type=_code, help="the Xid number, e.g. 79 (fell off the bus)")
    p.add_argument("--node", required=True, help="the simulated node, e.g. node01")
    p.add_argument("--gpu", required=True, help="index or uuid on that node")
    p.add_argument("--pid", type=int, default=None,
                   help="the process the driver names (default for 13/31/43/94: one on that GPU)")
    p = sim_sub.add_parser("node", help="make a node go silent, or come back")
    p.add_argument("action", choices=("down", "up"), help="down: silent (its jobs run on); up: back")
    p.add_argument("node", help="the simulated node, e.g. node01")
    p.add_argument("--reboot", action="store_true",
                   help="with up: it comes back as a new boot (new boot id, empty kernel log, "
                        "its jobs gone, GPU faults cleared)")
    p = sim_sub.add_parser("throttle", help="make a GPU run hot, idle and below its base clock")
    p.add_argument("node", help="the simulated node, e.g. node01")
    p.add_argument("gpu", help="index or uuid on that node")
    p.add_argument("--off", action="store_true", help="end the throttling")


# ---------------------------------------------------------------------------- commands
def _lab_config(config: str | None, home_root: Path) -> Path | None:
    """The lab's cluster file: the one named (``--config``, ``$NEBULA_CONFIG``), else the
    demo's lab in this home (``nebula demo`` keeps it in ``<home>/lab``), else as any command."""
    from ..config.cluster import CONFIG_ENV, find_config

    demo_lab = Path(home_root) / "lab" / "nodes.yaml"
    if not config and not os.environ.get(CONFIG_ENV) and demo_lab.is_file():
        return demo_lab
    return find_config(config, home_root)


def cmd_sim(args: argparse.Namespace, home: Home, config: str | None) -> int:
    from ..sim import control, faults

    try:
        lab = control.lab_dir(_lab_config(config, home.root))
        if args.sim_command == "inject":
            print("\n".join(control.inject_xid(lab, args.node, args.gpu, args.code, args.pid)))
        elif args.sim_command == "throttle":
            control.set_throttle(lab, args.node, args.gpu, not args.off)
            print(f"{args.node}:{args.gpu} " + ("runs normally again" if args.off else
                  f"throttles: {faults.THROTTLE_TEMP_C} °C, {faults.THROTTLE_UTIL_PCT:g} % busy, "
                  "SM clock below base"))
        elif args.action == "down":
            control.node_down(lab, args.node)
            print(f"{args.node} is silent: its SSH server is stopped, its jobs keep running")
        else:
            control.node_up(lab, args.node, reboot=args.reboot)
            print(f"{args.node} answers again" + (" (rebooted)" if args.reboot else ""))
        return 0
    except (control.SimError, ValueError) as err:
        print(f"nebula sim: {err}", file=sys.stderr)
        return 1
