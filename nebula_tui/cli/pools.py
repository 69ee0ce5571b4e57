"""The pools' commands: ``nebula pool authorize NAME`` (the line a user adds on a cluster's
login node so that the head submits there as them). The head computes the view (it alone
reads its key: ``pools/authorize.py``); this prints it."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from typing import Any

from ..wire import StatusReply
from ..homedir import Home
from .args import USAGE_ERROR
from .common import service_client, show


def cmd_pool(args: argparse.Namespace, home: Home, config: str | None) -> int:
    with service_client(home, config) as client:
        pools = client.call("status", StatusReply).get("pools") or []
    found = {p["name"]: p for p in pools}
    pool = found.get(args.pool)
    if pool is None:
        known = ", ".join(sorted(found)) or "none (nodes.yaml has no pools: section)"
        print(f"nebula pool: no pool named {args.pool!r}; pools: {known}", file=sys.stderr)
        return USAGE_ERROR
    view = pool.get("authorize")
    if view is None:
        print(f"nebula pool: this head does not say its pool key; update NebulaGrid on the "
              f"head (pool {args.pool!r})", file=sys.stderr)
        return 1
    return show(args, view, authorize_text)


def authorize_text(view: Mapping[str, Any]) -> str:
    """What a user does with the view (already made printable by ``show``)."""
    where = view["host"] if view["port"] == 22 else f"{view['host']} (port {view['port']})"
    if not view["per_submitter"]:
        return (f"Pool {view['pool']} logs in to {where} as one account, {view['account']}, with "
                f"the head's own key: nothing for you to authorise. Its administrators keep that "
                f"account's authorized_keys.")
    if not view["line"]:
        return f"Pool {view['pool']}: the head has no pool key yet; ask its administrator."
    origin = (f"only from {view['address']} (the head's address as the login node should see "
              f"it; behind a NAT, put the address the cluster sees in from=\"…\")"
              if view["address"] else "from any address (the head could not tell its own: "
              "add from=\"HEAD-ADDRESS\", in front of restrict)")
    return (f"On {where}, as your own account there, add this line to ~/.ssh/authorized_keys:\n\n"
            f"{view['line']}\n\n"
            f"It lets NebulaGrid's head log in as you {origin}, to run Slurm's commands for your "
            f"jobs: no terminal, no forwarding. Slurm then runs and charges your pool jobs as "
            f"you.\n"
            f"To revoke it, delete that line (it ends in {view['comment'] or 'the key above'}) "
            f"from ~/.ssh/authorized_keys there; the head can no longer submit as you.")
