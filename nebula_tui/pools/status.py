"""A pool as `nebula status` and the TUI show it: one dict, its ``line`` written here once."""

from __future__ import annotations

import time

from ..config.pools import PoolConfig
from ..printable import printable
from ..units import duration_text
from ..wire import PoolAuthorize, PoolWire
from .base import Capacity


def pool_view(config: PoolConfig, kind: str, capacity: Capacity | None,
              unreachable_since: float | None, reason: str, running: int, pending: int,
              now: float, authorize: PoolAuthorize | None = None,
              degraded_since: float | None = None, troubled: dict[str, str] | None = None) -> PoolWire:
    """The pool's view: what it has (its last poll), whether it answers, ours there."""
    version = capacity.version if capacity else None
    where = f"Slurm {version}" if version else "Slurm"
    if config.partition:
        where += f", partition {config.partition}"
    if unreachable_since is not None:
        since = time.strftime("%H:%M:%S", time.localtime(unreachable_since))
        line = (f"{config.name} ({where}): unreachable since {since} "
                f"({duration_text(now - unreachable_since)}): {reason}")
    elif degraded_since is not None:
        since = time.strftime("%H:%M:%S", time.localtime(degraded_since))
        line = (f"{config.name} ({where}): degraded since {since} "
                f"({duration_text(now - degraded_since)}), its jobs left as they are: {reason}")
    elif capacity is None:
        line = f"{config.name} ({where}): not reached yet" + (f" ({reason})" if reason else "")
    else:
        idle = capacity.gpus_idle
        line = (f"{config.name} ({where}): {capacity.gpus_total} GPUs, "
                f"{'?' if idle is None else idle} idle")
        parts = capacity.partitions
        if len(parts) > 1:  # nodes shared by partitions: each one's own, as sinfo counts
            line += " (" + ", ".join(f"{p.name} {'?' if p.idle is None else p.idle} of {p.gpus} idle"
                                     for p in parts) + ")"
    if troubled and unreachable_since is None and degraded_since is None:
        # one account's answers (a member's own key line may answer anything): theirs alone
        line += "; " + "; ".join(f"as {account}: {why}, their jobs left as they are"
                                 for account, why in sorted(troubled.items()))
    line += f"; ours: {running} running, {pending} pending"
    return {
        "name": config.name, "kind": kind, "host": config.host, "version": version,
        "partition": config.partition,
        "reachable": unreachable_since is None and capacity is not None,
        "degraded_since": degraded_since,
        "unreachable_since": unreachable_since, "reason": reason,
        "troubled": dict(troubled or {}),
        "gpus_total": capacity.gpus_total if capacity else None,
        "gpus_idle": capacity.gpus_idle if capacity else None,
        "nodes": [{"name": n.name, "state": n.state, "gpus": n.gpus, "gpus_used": n.gpus_used,
                   "usable": n.usable, "partitions": list(n.partitions)}
                  for n in (capacity.nodes if capacity else ())],
        "partitions": [{"name": p.name, "gpus": p.gpus, "gpus_idle": p.idle}
                       for p in (capacity.partitions if capacity else ())],
        "running": running, "pending": pending, "max_jobs": config.max_jobs,
        "burst_after_s": config.burst_after_s,
        "ends_from": capacity.ends_from if capacity else None, "line": printable(line),
        "authorize": authorize}
