"""The head's requests are a table (``head.ops.OPS``), one module per family: every request a
client sends is in it, no two families answer one, and each family's handlers are its own."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from nebula_tui.head import ops

PACKAGE = Path(ops.__file__).resolve().parents[2]


def test_no_two_families_answer_one_request():
    listed = [name for family in ops.FAMILIES for name in family.OPS]
    assert len(listed) == len(set(listed)) == len(ops.OPS)


def test_every_family_answers_with_handlers_of_its_own():
    for family in ops.FAMILIES:
        for name, handler in family.OPS.items():
            assert inspect.iscoroutinefunction(handler), name
            assert handler.__module__ == family.__name__, f"{name} is answered from {handler.__module__}"
            assert handler.__name__ == name, f"{name} is answered by {handler.__name__}"


def test_every_request_a_client_sends_is_answered():
    sent = set()
    for path in PACKAGE.rglob("*.py"):
        if "head" not in path.relative_to(PACKAGE).parts:
            sent.update(re.findall(r"""\bcall\(\s*["']([a-z_]+)["']""", path.read_text()))
    assert len(sent) > 20
    assert sent - set(ops.OPS) == set()


async def test_a_head_without_a_cluster_file_refuses_to_remove_a_node_in_one_line(tmp_path):
    """Adding and reloading said so already; removing failed on the missing path instead (a
    traceback in the head's log, "the head service failed…" to the admin)."""
    from nebula_tui.api import ApiError, AsyncClient
    from nebula_tui.config.cluster import parse_config
    from nebula_tui.head.engine import Engine
    from nebula_tui.head.server import ApiServer
    from nebula_tui.store import Store
    from support.inprocess import cluster_file

    cluster_file(tmp_path / "nodes.yaml", ("node01",))
    engine = Engine(parse_config((tmp_path / "nodes.yaml").read_text()), Store(tmp_path / "state.db"))
    assert engine.state.config.path is None  # read from text, as no file
    server = ApiServer(engine, tmp_path / "nebula.sock")
    await server.start()
    try:
        with pytest.raises(ApiError) as refused:
            await AsyncClient(server.path).call("node_remove", node="node01")
    finally:
        await server.close()
        await engine.stop()
        engine.state.store.close()
    assert str(refused.value) == "this service was started without a cluster file"
