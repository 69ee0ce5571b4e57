"""The cards a replay runs on: the demo lab's (or another simulated layout's), a running
head's (``nebula gpus --json``), and an admin's what-ifs on top (``--add``, ``--remove``).

An inventory is node name -> the device dicts a nodelet's probe carries, so the head of a
replay reads them exactly as it reads a real node's.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from ..model import DEFAULT_VENDOR

from ..sim import presets

#: Cards ``--add`` knows by name: each model the simulated lab has, by its full name.
_KNOWN = {facts["name"]: facts for facts in presets.model_facts()}


#: bounds on an inventory file, so a replay's memory stays bounded: its size, its cards,
#: a card's index on its node and its memory (16 TB)
MAX_FILE_BYTES = 64 << 20
MAX_CARDS = 10_000
MAX_INDEX = 1024
MAX_CARD_MB = 16 << 20


class InventoryError(ValueError):
    """A what-if or an inventory file that cannot be read; str() says what to write."""


def layout(name: str = "demo") -> dict[str, list[dict]]:
    """A simulated lab layout's cards (``nebula demo --layout``), as probes report them."""
    return {spec["name"]: node_devices(spec) for spec in presets.node_specs(name)}


def layout_links(name: str = "demo") -> dict[str, dict]:
    """A simulated layout's link matrices (``topo -m`` as the nodes' hellos carry it), so a
    replay's head scores topology as the lab's does."""
    return {spec["name"]: spec["topo"] for spec in presets.node_specs(name) if spec.get("topo")}


def node_devices(spec: dict) -> list[dict]:
    """One simulated node's cards: NVIDIA ones with the driver's facts, other vendors' as
    their tools report them."""
    nvidia = [{**gpu, "vendor": "nvidia", "compute_cap": gpu.get("compute_cap"),
               "driver_version": spec.get("driver_version")} for gpu in spec.get("gpus", [])]
    return nvidia + [dict(device) for device in spec.get("devices", [])]


def from_gpus_json(path: Path) -> dict[str, list[dict]]:
    """A head's cards from ``nebula gpus --json`` saved to a file."""
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
        if len(raw) > MAX_FILE_BYTES:
            raise ValueError(f"larger than {MAX_FILE_BYTES >> 20} MB")
        rows = json.loads(raw)
    except (OSError, ValueError, RecursionError) as err:
        raise InventoryError(f"{path}: not the output of `nebula gpus --json` ({str(err)[:200]})") from None
    rows = rows.get("gpus", rows) if isinstance(rows, dict) else rows
    if isinstance(rows, list) and len(rows) > MAX_CARDS:
        raise InventoryError(f"{path}: {len(rows)} GPUs; a replay takes at most {MAX_CARDS}")
    inventory: dict[str, list[dict]] = {}
    for row in rows if isinstance(rows, list) else []:
        index, total = (row.get(k) if isinstance(row, dict) else None for k in ("index", "total_memory_mb"))
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (index, total)) \
                or not 0 <= index < MAX_INDEX or not 1 <= total <= MAX_CARD_MB:
            raise InventoryError(f"{path}: a GPU row's index ({index!r}) or total_memory_mb ({total!r}) is not "
                                 f"a card's; save `nebula gpus --json` as it prints")
        try:
            cc = str(row.get("compute_capability") or "").removeprefix("sm_")
            inventory.setdefault(str(row["node"]), []).append({
                "index": int(row["index"]), "uuid": str(row["uuid"]), "name": str(row["model"]),
                "vendor": str(row.get("vendor") or DEFAULT_VENDOR),
                "memory_total_mb": int(row["total_memory_mb"]),
                "compute_cap": f"{cc[:-1]}.{cc[-1]}" if cc.isdigit() and len(cc) >= 2 else None,
                "driver_version": row.get("driver_version")})
        except (KeyError, TypeError, ValueError, AttributeError):
            raise InventoryError(f"{path}: a GPU row without node, index, uuid, model or "
                                 f"total_memory_mb; save `nebula gpus --json` as it prints") from None
    if not inventory:
        raise InventoryError(f"{path}: no GPUs in it; save `nebula gpus --json` from a head that has some")
    return inventory


_ADD = re.compile(r"^\s*(\d+)\s*x\s*(.+?)\s*@\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*$")


def add(inventory: dict[str, list[dict]], what: str) -> dict[str, list[dict]]:
    """``2x NVIDIA GeForce RTX 4090@node07``: that many cards of that model on that node
    (a new node when it is not there)."""
    match = _ADD.match(what)
    if not match:
        raise InventoryError(f"--add {what!r}: write COUNTxMODEL@NODE, e.g. "
                             f"'2x NVIDIA GeForce RTX 4090@node07'")
    count, model, node = int(match[1]), match[2], match[3]
    facts = _KNOWN.get(model) or next((f for name, f in _KNOWN.items() if name.lower() == model.lower()), None)
    if facts is None:
        raise InventoryError(f"--add: no card called {model!r} is known; one of: {', '.join(sorted(_KNOWN))}")
    if not 1 <= count <= 64:
        raise InventoryError(f"--add {what!r}: between 1 and 64 cards at a time")
    cards = [dict(d) for d in inventory.get(node, [])]
    start = 1 + max((d["index"] for d in cards if d.get("vendor", DEFAULT_VENDOR) == facts["vendor"]), default=-1)
    for i in range(start, start + count):
        cards.append({**facts, "index": i, "uuid": presets.gpu_uuid(f"whatif-{node}", i),
                      "pci_bus_id": f"00000000:{0x80 + i:02X}:00.0"})
    return {**inventory, node: cards}


def remove(inventory: dict[str, list[dict]], node: str) -> dict[str, list[dict]]:
    if node not in inventory:
        raise InventoryError(f"--remove {node}: no such node; the nodes are {', '.join(sorted(inventory))}")
    return {name: cards for name, cards in inventory.items() if name != node}


def largest_node(inventory: dict[str, list[dict]]) -> int:
    """The most cards one node has: the largest job a lab month asks for."""
    return max((len(cards) for cards in inventory.values()), default=0)


def card_list(inventory: dict[str, list[dict]]) -> list[tuple[str, str, int]]:
    """(node, uuid, memory MiB) of every card, in node then index order."""
    return [(node, d["uuid"], int(d["memory_total_mb"])) for node in sorted(inventory)
            for d in sorted(inventory[node], key=lambda d: (d.get("vendor", ""), d["index"]))]


def config_text(inventory: dict[str, list[dict]], settings: str = "", known_hosts: str = "/dev/null") -> str:
    """A nodes.yaml naming the inventory's nodes (never connected to: a replay plays them),
    with ``settings`` (the scheduler:, limits: … sections of a real one) appended."""
    nodes = "\n".join(f"  - {{name: {name}, host: 127.0.0.1, port: {20000 + i}}}"
                      for i, name in enumerate(sorted(inventory)))
    return f"cluster:\n  name: replay\n  known_hosts: {known_hosts}\nnodes:\n{nodes}\n{settings}"
