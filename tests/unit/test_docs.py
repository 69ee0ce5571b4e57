"""The documents a newcomer reads: the README stays a newcomer's page, every link between
the documents leads somewhere, and the reference names every command and nodes.yaml key
the program knows."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from nebula_tui.config.cluster import CLUSTER_KEYS, TOP_KEYS, load_config
from nebula_tui.config.nodes import NODE_KEYS
from nebula_tui.config.pools import POOL_KEYS
from nebula_tui.cli.parser import build_parser
from nebula_tui.head.serve import shared_mode_refusal

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def test_the_readme_is_short_and_starts_with_the_two_commands():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    block = text.split("```sh\n", 1)[1].split("```", 1)[0].splitlines()
    assert [line.split()[:2] for line in block] == [["make", "demo"], ["make", "test"]]


def test_the_number_of_test_workers_is_said_once_in_the_makefile():
    """``make test``'s workers are the Makefile's ``JOBS``; no document or comment counts them again."""
    assert re.search(r"^JOBS \?= \d+$", (REPO / "Makefile").read_text(), re.MULTILINE)
    for path in [*DOCS, REPO / "pyproject.toml"]:
        counted = re.findall(r"\b(\d+|one|two|three|four|five|six|eight) workers\b", path.read_text())
        assert counted == [], f"{path.name} counts the test workers ({counted}); say the Makefile's JOBS"


def paths_outside(text: str, doc: Path) -> list[str]:
    """The paths a document names that lead outside the repository to what lies beside it: a
    link (relative to the document) or a path in backticks (relative to the repository's
    root, as they are written) that leaves it, or an absolute path into the folder that holds
    it (``/etc/…`` and the like are the system's, which a document may name)."""
    found = []
    for quoted, linked in re.findall(r"`([^`\s]+)`|\]\(([^)\s#]+)", text):
        path = quoted or linked
        if re.match(r"[a-z]+:", path) or "/" not in path:
            continue  # a web address, or a word
        start = doc.parent if linked else REPO
        if path.startswith("/"):
            # into a folder beside the clone (the folder that holds it may be /tmp itself)
            beside = Path(path).relative_to(REPO.parent).parts[:1] if Path(path).is_relative_to(REPO.parent) else ()
            if (beside and beside[0] != REPO.name and (REPO.parent / beside[0]).exists()) \
                    or path.startswith(("/work/", "/home/")):
                found.append(path)
        elif not (start / path).resolve().is_relative_to(REPO):
            found.append(path)
    return found


def test_the_outside_path_check_can_fail():
    doc = REPO / "docs" / "x.md"
    # A folder beside the clone, named by a made-up word: the self-containment test refuses
    # any test that names the real one.
    text = ("see `../beside/DESIGN.md`, [it](../../beside/x.md), `/work/beside/a`, `docs/speed.md` "
            "and [the readme](../README.md)")
    assert paths_outside(text, doc) == ["../beside/DESIGN.md", "../../beside/x.md", "/work/beside/a"]


def test_no_document_points_outside_the_repository():
    """A clone of the repository is all a reader has: no document sends them beside it."""
    for doc in DOCS:
        assert paths_outside(doc.read_text(), doc) == [], doc.name


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_link_between_the_documents_leads_somewhere():
    for doc in DOCS:
        for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
            if re.match(r"[a-z]+:", target):
                continue  # a web address
            path, _, anchor = target.partition("#")
            found = (doc.parent / path).resolve() if path else doc
            assert found.exists(), f"{doc.name}: {target}"
            if anchor and found.suffix == ".md":
                headings = re.findall(r"^#+ (.*)$", found.read_text(), re.M)
                assert anchor in {_anchor(h) for h in headings}, f"{doc.name}: {target}"


def _commands(parser, prefix="nebula"):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield f"{prefix} {name}"
                yield from _commands(sub, f"{prefix} {name}")


def test_the_reference_names_every_command_and_nodes_yaml_key():
    text = (REPO / "docs" / "reference.md").read_text()
    missing = [c for c in _commands(build_parser()) if f"`{c}`" not in text]
    assert not missing, f"docs/reference.md lacks {missing}"
    for key in (*TOP_KEYS, *CLUSTER_KEYS, *NODE_KEYS, *POOL_KEYS):
        assert f"`{key}`" in text, key


def test_the_example_nodes_yaml_serves_a_shared_head():
    example = load_config(REPO / "nodes.yaml")
    assert shared_mode_refusal(example) is None
