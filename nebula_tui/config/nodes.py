"""The ``nodes:`` section of nodes.yaml: each node as the head reaches it over SSH."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from ..environments import RUNTIMES
from .reader import Reader, describe, given, is_tag

NODE_KEYS = ("name", "host", "port", "user", "identity", "known_hosts", "env", "drained",
             "power_budget_w", "runtime", "warmup")
DEFAULT_PORT = 22
#: a node's or a pool's name
_NODE_NAME_RE = re.compile(r"[a-z0-9][a-z0-9_.-]*\Z")
_NODE_NAME_MAX = 63
# Host names, IPv4 and IPv6 (with an optional %zone). A leading "-" is refused so a host
# can never be read as an option by ssh (R22: no injection through the config either).
HOST_RE = re.compile(r"[A-Za-z0-9_.:%\[\]][A-Za-z0-9_.:%\[\]-]*\Z")
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@dataclass(frozen=True, kw_only=True)
class NodeConfig:
    """One node as the head reaches it over SSH; every default already applied (a field's
    default is the key's; ``user``, ``identity`` and ``known_hosts`` are the cluster's)."""

    name: str
    host: str
    port: int = DEFAULT_PORT
    user: str
    #: Absolute path of the client key, or ``None`` for the SSH client's defaults.
    identity: str | None
    #: Absolute path of the known-hosts file the node's host key is verified against.
    known_hosts: str
    #: Extra environment for everything run on the node, in file order.
    env: tuple[tuple[str, str], ...] = ()
    #: Start drained: no new jobs are placed here until ``nebula node resume``.
    drained: bool = False
    #: R27: the most power its GPUs may draw together, as the scheduler counts it (a busy
    #: card at its power limit); None = no budget
    power_budget_w: int | None = None
    #: The container runtime ``--image`` jobs use here (None: the first the node has).
    runtime: str | None = None
    #: Wake every job's cards from their idle P-state before its command starts (R27).
    warmup: bool = False

    @property
    def env_dict(self) -> dict[str, str]:
        return dict(self.env)


def valid_name(name: str) -> bool:
    """Whether nodes.yaml takes ``name`` for a node or a pool (a request naming a pool is
    held to the same rule)."""
    return bool(_NODE_NAME_RE.match(name)) and len(name) <= _NODE_NAME_MAX


def parse_nodes(ctx: Reader, seq: Node | None, defaults: dict[str, Any]) -> tuple[NodeConfig, ...]:
    """The ``nodes:`` list; ``defaults`` are the cluster's user, identity and known_hosts,
    which a node that names none inherits."""
    if seq is None or is_tag(seq, "null"):
        return ()
    if not isinstance(seq, SequenceNode):
        raise ctx.error(
            seq,
            "nodes must be a list of nodes, each starting with '- name: ...',"
            f" found {describe(seq)}",
        )
    built: list[NodeConfig] = []
    first_line: dict[str, int] = {}
    for number, item in enumerate(seq.value, start=1):
        node = _node(ctx, item, number, defaults)
        name_node = next(v for k, v in item.value if k.value == "name")
        if node.name in first_line:
            raise ctx.error(
                name_node,
                f"duplicate node name '{node.name}' (first defined on line"
                f" {first_line[node.name]}); node names must be unique",
            )
        first_line[node.name] = name_node.start_mark.line + 1
        built.append(node)
    return tuple(built)


def named_entry(ctx: Reader, item: Node, number: int, what: str, known: tuple[str, ...],
                example: str) -> tuple[Callable[[str], Node | None], str, str]:
    """A list entry with a ``name:`` (a node, a pool): its keys checked, then (get, name,
    where) — ``where`` names it in every message, even one about a key before 'name:'."""
    where = f"{what} #{number}"
    if isinstance(item, MappingNode):
        for key, value in item.value:
            if key.value == "name" and isinstance(value, ScalarNode):
                if _NODE_NAME_RE.match(value.value):
                    where = f"{what} '{value.value}'"
    keys = ctx.mapping(item, where, known)

    def get(key: str) -> Node | None:
        return keys[key][1] if key in keys else None

    name = ctx.text(get("name"), f"{where}: name")
    if name is None:
        raise ctx.error(item, f"{where}: missing required key 'name' (e.g. name: {example})")
    if not valid_name(name):
        raise ctx.error(
            get("name"),
            f"{where}: {what} name {name!r} is not valid; use lowercase letters, digits,"
            f" '_', '.', '-', starting with a letter or digit, at most {_NODE_NAME_MAX} characters",
        )
    return get, name, f"{what} '{name}'"


def _node(ctx: Reader, item: Node, number: int, defaults: dict[str, Any]) -> NodeConfig:
    get, name, where = named_entry(ctx, item, number, "node", NODE_KEYS, "node01")

    host = ctx.text(get("host"), f"{where}: host")
    if host is None:
        raise ctx.error(
            item,
            f"{where}: missing required key 'host'"
            " (its hostname or IP address, e.g. host: 10.0.0.11)",
        )
    if not HOST_RE.match(host):
        raise ctx.error(
            get("host"),
            f"{where}: host {host!r} is not a hostname or IP address"
            " (no spaces, no leading '-'; put user and port in 'user:' and 'port:')",
        )

    port = ctx.integer(get("port"), f"{where}: port", 1, 65535)
    user = ctx.user(get("user"), f"{where}: user")
    identity = ctx.path(get("identity"), f"{where}: identity")
    known_hosts = ctx.path(get("known_hosts"), f"{where}: known_hosts")
    drained = ctx.boolean(get("drained"), f"{where}: drained")
    budget = ctx.integer(get("power_budget_w"), f"{where}: power_budget_w", 1, 1_000_000)
    runtime = ctx.text(get("runtime"), f"{where}: runtime")
    if runtime is not None and runtime not in RUNTIMES:
        raise ctx.error(get("runtime"), f"{where}: runtime {runtime!r} is not a container "
                        f"runtime; use one of {', '.join(RUNTIMES)}")
    return NodeConfig(
        name=name,
        host=host,
        user=user or defaults["user"],
        identity=identity or defaults["identity"],
        known_hosts=known_hosts or defaults["known_hosts"],
        **given(
            port=port,
            env=_env(ctx, get("env"), where),
            drained=drained,
            power_budget_w=budget,
            runtime=runtime,
            warmup=ctx.boolean(get("warmup"), f"{where}: warmup"),
        ),
    )


def _env(ctx: Reader, node: Node | None, where: str) -> tuple[tuple[str, str], ...]:
    if node is None or is_tag(node, "null"):
        return ()
    if not isinstance(node, MappingNode):
        raise ctx.error(
            node, f"{where}: env must be a mapping of NAME: value lines, found {describe(node)}"
        )
    pairs: list[tuple[str, str]] = []
    seen: dict[str, int] = {}
    for key, value in node.value:
        if not isinstance(key, ScalarNode) or not _ENV_NAME_RE.match(key.value):
            shown = key.value if isinstance(key, ScalarNode) else describe(key)
            raise ctx.error(
                key,
                f"{where}: env name {shown!r} is not a valid environment variable name"
                " (letters, digits and '_', not starting with a digit)",
            )
        if key.value in seen:
            raise ctx.error(
                key,
                f"{where}: duplicate env key '{key.value}' (first set on line"
                f" {seen[key.value]}); keep only one",
            )
        seen[key.value] = key.start_mark.line + 1
        text = ctx.text(value, f"{where}: env {key.value}")
        if text is None:
            raise ctx.error(
                value,
                f"{where}: env {key.value} has no value; give one ('' for empty) or remove it",
            )
        if "\0" in text:
            raise ctx.error(value, f"{where}: env {key.value} must not contain a NUL character")
        pairs.append((key.value, text))
    return tuple(pairs)
