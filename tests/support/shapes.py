"""A reply held to its shape in ``nebula_tui/wire.py`` at run time: every key the shape
requires, no key it does not name, and each value of its declared type, all the way down
(nested shapes, lists, maps, unions, literals). What mypy checks of the head's builders,
this checks of what a real head sent over its socket, as JSON decoded it."""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints, is_typeddict


def mismatches(value: object, shape: Any, where: str = "") -> list[str]:
    """Where ``value`` is not of ``shape``, one line each ([]: it is)."""
    where = where or getattr(shape, "__name__", str(shape))
    origin, args = get_origin(shape), get_args(shape)
    if shape is Any or shape is object:
        return []
    if is_typeddict(shape):
        if not isinstance(value, dict):
            return [f"{where}: {type(value).__name__}, not an object"]
        required, optional = shape.__required_keys__, shape.__optional_keys__
        found = []
        if missing := required - value.keys():
            found.append(f"{where}: no {', '.join(sorted(missing))}")
        if extra := value.keys() - required - optional:
            found.append(f"{where}: {', '.join(sorted(extra))} not in {shape.__name__}")
        hints = get_type_hints(shape)
        for key in sorted(value.keys() & hints.keys()):
            found += mismatches(value[key], hints[key], f"{where}.{key}")
        return found
    if origin in (Union, types.UnionType):
        tried = [mismatches(value, arm, where) for arm in args]
        return [] if any(not found for found in tried) else min(tried, key=len)
    if origin is Literal:
        return [] if value in args else [f"{where}: {value!r}, not one of {args}"]
    if origin is list:
        if not isinstance(value, list):
            return [f"{where}: {type(value).__name__}, not a list"]
        return [line for i, item in enumerate(value) for line in mismatches(item, args[0], f"{where}[{i}]")]
    if origin in (dict, Mapping):
        if not isinstance(value, dict):
            return [f"{where}: {type(value).__name__}, not an object"]
        return [line for k, v in value.items()
                for line in mismatches(k, args[0], f"{where} key") + mismatches(v, args[1], f"{where}[{k!r}]")]
    if shape is type(None) or shape is None:
        return [] if value is None else [f"{where}: {value!r}, not null"]
    if shape is float:  # JSON writes 2.0 as 2.0, but a whole number a head computed as int is a float too
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif shape in (int, str, bool):
        ok = isinstance(value, shape) and (shape is bool or not isinstance(value, bool))
    else:
        raise TypeError(f"{where}: no check for {shape!r}")
    return [] if ok else [f"{where}: {value!r} ({type(value).__name__}), not {shape.__name__}"]


def reply_mismatches(reply: dict, shape: Any, op: str) -> list[str]:
    """``mismatches`` of a request's reply, less the ``ok`` every reply has."""
    assert reply.get("ok") is True, reply
    return mismatches({k: v for k, v in reply.items() if k != "ok"}, shape, op)

