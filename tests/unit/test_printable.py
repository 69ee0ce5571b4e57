"""Text from anyone made safe for a terminal; the stream's plain lines taken as they are."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from nebula_tui.printable import printable_json, printable_tree

TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
TREES = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | TEXT,
                     lambda inner: st.lists(inner, max_size=4)
                     | st.dictionaries(TEXT, inner, max_size=4), max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(TREES, st.booleans())
def test_a_json_line_reads_as_printable_tree_makes_it(value, ascii_only) -> None:
    line = json.dumps(value, ensure_ascii=ascii_only)
    assert printable_json(line.encode()) == printable_tree(json.loads(line))


def test_plain_lines_are_kept_and_every_way_of_writing_a_control_is_shown() -> None:
    plain = {"type": "job", "job": {"name": "train-7", "util": 93.5, "gpus": []}}
    assert printable_json(json.dumps(plain).encode()) == plain
    for name in ("a\x1b]52;c;x\x07b", "a\x7fb", "a\u202eb", "a\nb", "a\x9bb"):
        for ascii_only in (True, False):
            line = json.dumps({"job": {"name": name}}, ensure_ascii=ascii_only).encode()
            shown = printable_json(line)["job"]["name"]
            assert shown.isprintable() and shown.startswith("a") and shown.endswith("b"), shown
    # a log's data keeps its lines; its colours go (the widget would pass them on)
    assert printable_json(b'{"data": "one\\ntwo\\u001b[31m"}') == {"data": "one\ntwo"}
