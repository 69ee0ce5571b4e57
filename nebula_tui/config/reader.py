"""nodes.yaml read with the line of every key and value: the one reader every section's
rules use.

The file is read with :func:`yaml.compose`, not ``yaml.safe_load``: the node tree keeps
the line of every key and value, so each mistake is reported as one line
``path:LINE: what is wrong and how to fix it`` (no traceback), and duplicate keys, which
PyYAML would silently collapse to the last one, are caught. :class:`Reader` reads the
values off that tree, each kind with its own one-line error (a string, an integer in a
range, a duration, a boolean, a path made absolute, a Unix user name).
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode

from ..model import ConfigError  # defined beside the plain data so clients need no yaml
from ..units import SECONDS_EXAMPLES, parse_duration_s

_USER_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@-]*\$?\Z")
_TAG = "tag:yaml.org,2002:"
_KIND = {
    "str": "string",
    "int": "integer",
    "float": "number",
    "bool": "boolean",
    "null": "empty value",
    "timestamp": "date",
    "binary": "binary value",
    "seq": "list",
    "map": "mapping",
    "omap": "mapping",
    "set": "set",
}

#: libyaml's parser where PyYAML has it: ten times faster on a big file, same nodes and marks
_FAST_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
#: A cluster file is at most this big (a few thousand nodes fit in a tenth of it); bigger
#: ones are refused before they are parsed, which would take the head minutes.
MAX_CONFIG_BYTES = 1 << 20
#: nested mappings and lists, at most (the format itself needs four)
MAX_CONFIG_DEPTH = 20
#: values the file stands for once its aliases (``*name``) are expanded, at most
MAX_CONFIG_VALUES = 200_000


def read_file(path: str | Path) -> str:
    """The text of the file at ``path``; raises :class:`ConfigError`."""
    shown = str(path)
    try:
        size = Path(path).expanduser().stat().st_size
        if size > MAX_CONFIG_BYTES:
            raise ConfigError(f"cannot read: the file is {size / (1 << 20):.1f} MB; a cluster "
                              f"file holds at most {MAX_CONFIG_BYTES >> 20} MB", shown)
        text = Path(path).expanduser().read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"cannot read: not UTF-8 text (bad byte at offset {exc.start}); save it as UTF-8",
            shown,
        ) from None
    except OSError as exc:
        reason = exc.strerror or str(exc)
        if isinstance(exc, FileNotFoundError):
            reason = "No such file"
        raise ConfigError(f"cannot read: {reason}", shown) from None
    return text


def compose(text: str, shown: str) -> Node | None:
    """``text`` as YAML's node tree (None for an empty file); ``shown`` names it in errors.
    Raises :class:`ConfigError`."""
    try:
        _check_shape(text, shown)
        root = yaml.compose(text, Loader=_FAST_LOADER)
    except yaml.YAMLError:
        # PyYAML's own parser says more about a mistake (and hints follow its words).
        try:
            _check_shape(text, shown, yaml.SafeLoader)
            root = yaml.compose(text, Loader=yaml.SafeLoader)
        except yaml.MarkedYAMLError as exc:
            raise _syntax_error(exc, shown) from None
        except yaml.YAMLError as exc:  # e.g. ReaderError: a control character in the text
            raise ConfigError("YAML error: " + " ".join(str(exc).split()), shown) from None
    return root


def _check_shape(text: str, shown: str, loader=_FAST_LOADER) -> None:
    """Refuse, before anything is built, a file nested too deep (PyYAML's composer would
    recurse until Python gives up) or whose aliases stand for too many values (a few
    lines of ``*name`` can stand for billions)."""
    depth, values = 0, 0
    sizes: dict[str, int] = {}  # anchor -> values it stands for
    open_anchors: list[tuple[str | None, int]] = []
    for event in yaml.parse(text, Loader=loader):
        if isinstance(event, yaml.AliasEvent):
            values += sizes.get(event.anchor, 1)
        elif isinstance(event, (yaml.ScalarEvent, yaml.CollectionStartEvent)):
            values += 1
            if isinstance(event, yaml.ScalarEvent):
                if event.anchor:
                    sizes[event.anchor] = 1
            else:
                depth += 1
                open_anchors.append((event.anchor, values))
                if depth > MAX_CONFIG_DEPTH:
                    raise ConfigError(f"nested deeper than {MAX_CONFIG_DEPTH} levels; a cluster "
                                      "file needs four", shown, event.start_mark.line + 1)
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
            anchor, first = open_anchors.pop()
            if anchor:
                sizes[anchor] = values - first + 1
        if values > MAX_CONFIG_VALUES:
            raise ConfigError(f"the file stands for more than {MAX_CONFIG_VALUES} values "
                              "(aliases expanded); a cluster file needs far fewer", shown,
                              event.start_mark.line + 1)


def _syntax_error(exc: yaml.MarkedYAMLError, shown: str) -> ConfigError:
    mark = exc.problem_mark or exc.context_mark
    parts = [p for p in (exc.context, exc.problem) if p]
    text = "; ".join(" ".join(p.split()) for p in parts) or "invalid YAML"
    if exc.context_mark is not None and exc.problem_mark is not None:
        if exc.context_mark.line != exc.problem_mark.line:
            text += f" (started on line {exc.context_mark.line + 1})"
    hint = ""
    if "'\\t'" in text or " tab" in text.lower():
        hint = "; indent with spaces, not tabs"
    elif "block" in text:
        hint = "; check the indentation of this line against the lines above it"
    elif "mapping values are not allowed" in text:
        hint = "; put quotes around a value that contains ': '"
    line = mark.line + 1 if mark is not None else None
    column = mark.column + 1 if mark is not None else None
    return ConfigError(f"YAML syntax error: {text}{hint}", shown, line, column)


def _kind(node: Node) -> str:
    tag = node.tag[len(_TAG):] if node.tag.startswith(_TAG) else node.tag
    return _KIND.get(tag, tag)


def describe(node: Node) -> str:
    """``string 'abc'``, ``list``, ``empty value``: what the user actually wrote."""
    kind = _kind(node)
    if isinstance(node, ScalarNode) and kind != "empty value":
        value = node.value if len(node.value) <= 40 else node.value[:37] + "..."
        return f"{kind} {value!r}"
    return kind


def is_tag(node: Node, tag: str) -> bool:
    return node.tag == _TAG + tag


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """" (did you mean 'node01'?)" for the known name closest to a mistyped one, or ""."""
    close = difflib.get_close_matches(str(word), list(known), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def node_at(node: Node, keys: tuple) -> Node:
    """The YAML node under ``node`` at the path ``keys`` (as far as it goes)."""
    for key in keys:
        if not isinstance(node, MappingNode):
            break
        found = [value for k, value in node.value if isinstance(k, ScalarNode) and k.value == str(key)]
        if not found:
            break
        node = found[0]
    return node


def given(**values: Any) -> dict[str, Any]:
    """The values the file gave: a key left out or empty reads as None and is dropped, so the
    field's default in its dataclass holds (the one place each default is written)."""
    return {key: value for key, value in values.items() if value is not None}


class Reader:
    """Values off the node tree, each with its one-line error: where we are is the file's
    name (for messages) and its directory (for paths)."""

    def __init__(self, shown: str, base: Path) -> None:
        self.shown = shown
        self.base = base
        self._loader = yaml.SafeLoader("")

    def error(self, node: Node, message: str) -> ConfigError:
        return ConfigError(message, self.shown, node.start_mark.line + 1)

    def construct(self, node: ScalarNode) -> Any:
        try:
            return self._loader.construct_object(node, deep=True)
        except yaml.YAMLError as exc:
            raise self.error(node, f"cannot read value {node.value!r}: {exc}") from None

    # -- shapes

    def mapping(
        self, node: Node, where: str, known: tuple[str, ...]
    ) -> dict[str, tuple[ScalarNode, Node]]:
        """Keys of a mapping → (key node, value node); rejects duplicates and unknown keys."""
        if not isinstance(node, MappingNode):
            raise self.error(
                node, f"{where} must be a mapping of 'key: value' lines, found {describe(node)}"
            )
        seen: dict[str, tuple[ScalarNode, Node]] = {}
        for key, value in node.value:
            if is_tag(key, "merge"):
                raise self.error(
                    key, f"{where}: merge keys ('<<') are not supported; write the keys out"
                )
            if not isinstance(key, ScalarNode):
                raise self.error(key, f"{where}: keys must be plain names, found {describe(key)}")
            name = key.value
            if name in seen:
                first = seen[name][0].start_mark.line + 1
                raise self.error(
                    key,
                    f"{where}: duplicate key '{name}' (first set on line {first}); keep only one",
                )
            if name not in known:
                raise self.error(
                    key,
                    f"{where}: unknown key '{name}'{did_you_mean(name, known)}"
                    f"; known keys: {', '.join(known)}",
                )
            seen[name] = (key, value)
        return seen

    # -- scalars (``None`` means the key was absent or left empty: use the default)

    def text(self, node: Node | None, what: str) -> str | None:
        if node is None or is_tag(node, "null"):
            return None
        # Numbers are fine as text (a host "10.0.0.11", a node "01"); the raw spelling is kept.
        if isinstance(node, ScalarNode) and (
            is_tag(node, "str") or is_tag(node, "int") or is_tag(node, "float")
        ):
            return node.value
        hint = " (put it in quotes)" if isinstance(node, ScalarNode) else ""
        raise self.error(node, f"{what} must be a string, found {describe(node)}{hint}")

    def integer(self, node: Node | None, what: str, low: int, high: int | None) -> int | None:
        if node is None or is_tag(node, "null"):
            return None
        rng = f"from {low} to {high}" if high is not None else f">= {low}"
        if not is_tag(node, "int"):
            raise self.error(node, f"{what} must be an integer {rng}, found {describe(node)}")
        value = self.construct(node)
        if value < low or (high is not None and value > high):
            raise self.error(node, f"{what} must be an integer {rng}, found {value}")
        return value

    def seconds(self, node: Node | None, what: str) -> float | None:
        """A duration, written as the CLI takes one: 600 (seconds), 90s, 10m, 1h, 7d."""
        if node is None or is_tag(node, "null"):
            return None
        value = self.construct(node) if isinstance(node, ScalarNode) else None
        try:
            return parse_duration_s(value, bare="s")
        except ValueError:
            raise self.error(node, f"{what} must be a duration > 0 such as {SECONDS_EXAMPLES}, "
                                   f"found {describe(node)}") from None

    def boolean(self, node: Node | None, what: str) -> bool | None:
        if node is None or is_tag(node, "null"):
            return None
        if not is_tag(node, "bool"):
            raise self.error(node, f"{what} must be true or false, found {describe(node)}")
        return bool(self.construct(node))

    def path(self, node: Node | None, what: str) -> str | None:
        raw = self.text(node, what)
        if raw is None:
            return None
        if not raw.strip():
            raise self.error(node, f"{what} must be a file path, found an empty string")
        expanded = Path(os.path.expanduser(raw))
        if not expanded.is_absolute():
            expanded = self.base / expanded
        return os.path.normpath(expanded)

    def user(self, node: Node | None, what: str) -> str | None:
        raw = self.text(node, what)
        if raw is not None and not _USER_RE.match(raw):
            raise self.error(
                node,
                f"{what} must be a Unix user name (letters, digits, '_', '.', '-';"
                f" not starting with '-'), found {raw!r}",
            )
        return raw
