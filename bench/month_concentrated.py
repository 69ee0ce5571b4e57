"""The second lab month, kept as a trace file: ``bench/months/concentrated.csv``.

    python bench/month_concentrated.py [--check]

The built-in month's own generator (``nebula_tui/month/workload.py``, seed 13, the demo
lab's 14 cards) with two things a lab meets that the built-in month has little of:

- **one concentrated user**: user01 is drawn for 40% of the jobs and holds about 40% of
  the month's GPU-hours (the first draw within 2 points of it; 42%), the other eleven
  share the rest by Zipf 1.0 — the concentration issue 35 names from the Helios study
  (the built-in month's Zipf 2.2 gives its top user 56–87% by seed);
- **a long multi-card service**: user03's 2-card inference service from day 1 at 09:00
  to the month's end (no ``--time``), holding two whole cards for 29 days.

Replay it as a lab would: ``nebula simulate bench/months/concentrated.csv``. The file is
what this script writes; ``--check`` says whether the file in the repository still is.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))

from nebula_tui.month import inventory, workload  # noqa: E402
from nebula_tui.month.records import Request  # noqa: E402

TRACE = BENCH / "months" / "concentrated.csv"
DAYS = 30
SEED = 13
HEAVY, HEAVY_SHARE, OTHERS_SKEW = "user01", 0.4, 1.0
SERVICE = Request(0, 86400 + 9 * 3600, "user03", 2, None, (DAYS - 1) * 86400 - 9 * 3600, None, 1, True)


def month() -> list[workload.Request]:
    inv = inventory.layout("demo")
    jobs = workload.lab_month(len(inventory.card_list(inv)), inventory.largest_node(inv), users=12,
                              days=DAYS, seed=SEED)
    others = [f"user{n:02d}" for n in range(2, 13)]
    weights = [1 / n ** OTHERS_SKEW for n in range(1, len(others) + 1)]
    total = sum(map(gpu_hours, jobs)) + gpu_hours(SERVICE)
    # user01 is drawn for each job with probability HEAVY_SHARE, the others by Zipf. Which
    # user gets the few longest jobs swings a draw's share of GPU-hours (15-35% on this
    # month), so the draw kept is the first, by seed, within 2 points of HEAVY_SHARE.
    for draw in range(1000):
        rng = random.Random(SEED * 1000 + draw)
        users = [HEAVY if rng.random() < HEAVY_SHARE else rng.choices(others, weights)[0] for _ in jobs]
        if abs(sum(gpu_hours(r) for r, u in zip(jobs, users) if u == HEAVY) / total - HEAVY_SHARE) <= 0.02:
            break
    jobs = [replace(r, user=u) for r, u in zip(jobs, users)]
    jobs.append(SERVICE)
    return sorted(jobs, key=lambda r: r.submit_s)


def gpu_hours(r: workload.Request) -> float:
    return (0.25 if r.gpu_mem_mb else r.gpus) * min(r.duration_s, DAYS * 86400 - r.submit_s) / 3600


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the file, write nothing")
    args = parser.parse_args()
    jobs = month()
    total = sum(map(gpu_hours, jobs))
    heavy = sum(gpu_hours(r) for r in jobs if r.user == HEAVY)
    print(f"{len(jobs)} jobs, {total:,.0f} GPU-hours asked ({total / (14 * 24 * DAYS):.2f} of the demo lab's), "
          f"{HEAVY} {heavy / total:.0%} of them")
    if args.check:
        with tempfile.TemporaryDirectory() as tmp:
            fresh = Path(tmp) / "month.csv"
            workload.write_trace(jobs, fresh)
            same = fresh.read_text() == TRACE.read_text()
        print(f"{TRACE.name}: {'as this script writes it' if same else 'differs from what this script writes'}")
        return 0 if same else 1
    TRACE.parent.mkdir(exist_ok=True)
    workload.write_trace(jobs, TRACE)
    print(f"wrote {TRACE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
