"""A real head (``Engine``, store file, probe parsing, publishing) in the test's own event
loop, its nodes played by ``QuietNode`` links fed the nodelet's messages directly (as
``bench/tui.py`` does): for tests of what the head does, without SSH."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from nebula_tui.config.cluster import load_config
from nebula_tui.head.engine import Engine
from nebula_tui.model import NodeState
from nebula_tui.remote.protocol import request_problems
from nebula_tui.store import Store

NODES = ("node01", "node02")
MODEL = "NVIDIA A100-SXM4-80GB"


def gpu_row(node: str, index: int, util: float = 0, temp: float = 30, used: int = 0,
            driver: str = "550.54.15") -> dict:
    """One card's vendor-neutral reading, as the nodelet's NVIDIA backends send it."""
    return {"index": index, "uuid": f"GPU-{node}-{index}", "name": MODEL, "vendor": "nvidia",
            "pci_bus_id": f"00000000:{index + 7:02X}:00.0", "memory_total_mb": 81920,
            "memory_used_mb": used, "utilization_pct": float(util), "temperature_c": float(temp),
            "power_w": 60.0, "power_limit_w": 400.0, "fan_pct": None, "sm_clock_mhz": 1410.0,
            "mem_clock_mhz": 1593.0, "pstate": "P0", "driver_version": driver,
            "compute_cap": "8.0", "visible_env": "CUDA_VISIBLE_DEVICES",
            "visible_id": str(index)}


def probe(node: str, rows: list[dict]) -> dict:
    return {"type": "probe", "t": 1.0, "error": "", "devices": rows, "processes": [],
            "problems": [], "clamped": [], "pid_jobs": {}, "pid_users": {}}


class QuietNode:
    """A node link whose nodelet runs nothing: the engine's requests (reconcile, launch)
    get the nodelet's empty replies, and are kept in ``requests`` as (op, fields), each
    held to its shape (``protocol.REQUESTS``) as the real link holds it."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict]] = []

    async def request(self, op: str, timeout: float | None = None, **fields) -> dict:
        assert not request_problems(op, fields), request_problems(op, fields)  # as NodeLink
        self.requests.append((op, fields))
        return {"ok": True, "sessions": [], "jobs": {}}

    async def run_check(self, command: str, timeout: float) -> str:
        """The doctor's script, which prints nothing here (each check it reads fails)."""
        self.requests.append(("run_check", {"command": command}))
        return ""

    async def close(self) -> None:
        pass


def cluster_file(path, nodes, extra: str = "") -> None:
    """nodes.yaml for ``nodes``; ``extra``: more top-level sections, as YAML text."""
    lines = "\n".join(f"  - {{name: {n}, host: 127.0.0.1, port: {2200 + i}}}" for i, n in enumerate(nodes))
    path.write_text(f"cluster:\n  name: t\n  known_hosts: {path.parent / 'kh'}\nnodes:\n{lines}\n{extra}")


def up_engine(tmp_path, extra: str = "", clock=time.time) -> Engine:
    """A head with two up nodes of two A100s each, no job yet (``extra``: nodes.yaml
    sections, such as a ``scheduler:`` policy; ``clock``: the head's clock, which a test
    may move). The caller stops it and closes its store."""
    cluster_file(tmp_path / "nodes.yaml", NODES, extra)
    head = Engine(load_config(tmp_path / "nodes.yaml"), Store(tmp_path / "state.db"), clock)
    for node in NODES:
        head.links[node] = QuietNode()
        head.on_node_message(node, {"type": "hello", "hostname": node, "smi_table": "CUDA Version: 12.4"})
        head.on_node_message(node, probe(node, [gpu_row(node, i) for i in range(2)]))
        head.on_node_state(node, NodeState.UP, "")
    return head


@pytest.fixture
async def engine(tmp_path):
    """A head with two up nodes of two A100s each, no job yet."""
    head = up_engine(tmp_path)
    yield head
    await head.stop()
    head.state.store.close()


def drain(queue: asyncio.Queue) -> list[dict]:
    """The events waiting in a subscriber's queue, as they cross the socket."""
    events = []
    while not queue.empty():
        events.append(json.loads(json.dumps(queue.get_nowait())))
    return events


@pytest.fixture
async def served(engine, tmp_path):
    """``engine`` answering on a real Unix socket (the head's own ``ApiServer``): its path."""
    from nebula_tui.head.server import ApiServer

    server = ApiServer(engine, tmp_path / "nebula.sock")
    await server.start()
    yield server.path
    await server.close()
