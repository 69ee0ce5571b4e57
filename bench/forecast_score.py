"""The start forecast's score on a month, without the baselines: NebulaGrid's replay with a
forecast at every submit (as ``nebula simulate`` makes them), scored as its table's line
"start forecast at submit" (``month.metrics.forecast_score``).

    python bench/forecast_score.py [TRACE.csv] [--days 30] [--layout demo] [--dump FILE.csv]

Without a trace: the built-in month (seed 2026 unless ``--seed``). ``--days`` replays only
the first days (a shorter try while iterating; final figures are full months). ``--dump``
writes each started job's submit, forecast, interval and first start, to look at.
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nebula_tui.head.replay import Replay  # noqa: E402
from nebula_tui.month import inventory, metrics, setup, workload  # noqa: E402


def month_parser(description: str) -> argparse.ArgumentParser:
    """The arguments that name a month: a trace, or the built-in month's seed; its days and lab."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("trace", nargs="?", help="a trace CSV (default: the built-in month)")
    parser.add_argument("--days", type=float, default=30.0)
    parser.add_argument("--layout", default="demo")
    parser.add_argument("--seed", type=int, default=None)
    return parser


def month(args: argparse.Namespace) -> tuple:
    """(cards, links, cluster config, requests) of the month ``args`` name."""
    inv = inventory.layout(args.layout)
    links = inventory.layout_links(args.layout)
    cluster = setup.replay_config(inv, None, [])
    if args.trace:
        requests = [r for r in workload.read(Path(args.trace)) if r.submit_s < args.days * 86400]
    else:
        extra = {} if args.seed is None else {"seed": args.seed}
        requests = workload.lab_month(len(inventory.card_list(inv)), inventory.largest_node(inv),
                                      users=max(12, len(inv)), days=args.days, **extra)
    return inv, links, cluster, requests


def main() -> int:
    parser = month_parser(__doc__.splitlines()[0])
    parser.add_argument("--dump", help="write each started job's forecast and start here")
    args = parser.parse_args()
    inv, links, cluster, requests = month(args)
    started, cpu = time.perf_counter(), time.process_time()
    outcomes = Replay(cluster, inv, requests, setup.REPLAY_EPOCH, args.days * 86400, links,
                      forecasts=True).run()
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    score = metrics.forecast_score(requests, outcomes)
    name = Path(args.trace).name if args.trace else "built-in month"
    print(f"{name}, {args.days:g} days, {len(requests)} jobs: "
          f"{score.text() if score else 'no forecast'} (replay {wall:.0f} s wall, {cpu:.0f} s CPU)")
    if args.dump:
        with open(args.dump, "w", newline="") as f:
            out = csv.writer(f)
            out.writerow(["key", "user", "gpus", "time_limit_s", "submit_s", "forecast_s", "early_s",
                          "late_s", "started_s"])
            for r in requests:
                o = outcomes[r.key]
                began = o.started_s if o.first_started_s is None else o.first_started_s
                if o.forecast is None or began is None:
                    continue
                out.writerow([r.key, r.user, r.gpus, r.time_limit_s, r.submit_s, *o.forecast, began])
    return 0


if __name__ == "__main__":
    sys.exit(main())
