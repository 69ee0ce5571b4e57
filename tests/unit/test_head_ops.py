"""The head's requests are a table (``head.ops.OPS``), one module per family: every request a
client sends is in it, no two families answer one, and each family's handlers are its own."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

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
