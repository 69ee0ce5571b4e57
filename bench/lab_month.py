"""A lab month, measured: the built-in month (``nebula_tui/month/workload.py``, every
parameter from a published trace study) replayed through the head's own scheduler in
virtual time against the spreadsheet and Slurm-like baselines, on the demo lab's cards and
on a 20-node lab of 4 × RTX 4090 each.

    python bench/lab_month.py [--days 30] [--only demo|lab20] [--plot FILE.png]

Prints each lab's table and last line (``lab month: …``), how long each replay took, and
the replay's speed as a ratio of virtual to wall time; the goal for the 20-node lab is a
month in under 2 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))

from nebula_tui.head.replay import Replay  # noqa: E402
from nebula_tui.month import compare, inventory, plots, setup, workload  # noqa: E402
from nebula_tui.sim import presets  # noqa: E402


def lab20() -> tuple[dict, dict]:
    specs = presets.uniform_nodes(20, gpus=4, model="rtx4090")
    return ({s["name"]: inventory.node_devices(s) for s in specs},
            {s["name"]: s["topo"] for s in specs})


def run(name: str, inv: dict, links: dict, days: float, plot: str | None) -> None:
    cluster = setup.replay_config(inv, None, [])
    requests = workload.lab_month(len(inventory.card_list(inv)), inventory.largest_node(inv),
                                  users=max(12, len(inv)), days=days)

    def nebula(reqs, cards, horizon):
        return Replay(cluster, cards, reqs, setup.REPLAY_EPOCH, horizon, links).run()

    started = time.perf_counter()
    result = compare.compare(requests, inv, days * 86400, cluster.scheduler.half_life_s, nebula)
    took = time.perf_counter() - started
    print(f"== {name}: {result.text()}")
    print(f"{name}: the month took {took:.1f} s in all; NebulaGrid's replay ran "
          f"{days * 86400 / result.seconds['NebulaGrid']:,.0f}x faster than real time")
    if plot:
        plots.png(result, Path(plot))
        print(f"{name}: plot {plot}")
    print()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=float, default=30.0)
    parser.add_argument("--only", choices=("demo", "lab20"), default=None)
    parser.add_argument("--plot", default=None, help="the demo lab's plot (needs the [plot] extra)")
    args = parser.parse_args()
    if args.only in (None, "demo"):
        run("demo lab", inventory.layout("demo"), inventory.layout_links("demo"), args.days, args.plot)
    if args.only in (None, "lab20"):
        run("20-node lab", *lab20(), args.days, None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
