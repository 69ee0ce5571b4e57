"""`nebula node add` / `node remove` (R21): edit nodes.yaml in place and trust host keys.

Adding a node has an explicit trust step: its host key is read, its fingerprint shown,
and it is written to known_hosts only when the admin confirms that fingerprint (the CLI
asks, or takes ``--trust SHA256:…``; the TUI shows it and asks). The head service does the
edit (on a shared box the file is the service account's). A node whose known key differs is
never silently re-trusted. The file is edited as text, so its comments stay; the result
is validated before it replaces the old file, so a failed edit loses nothing.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path

import yaml

from .config.cluster import ClusterConfig, load_config
from .config.nodes import DEFAULT_PORT
from .model import ConfigError
from .waits import within
from .wire import ReloadReply

class NodeAdminError(Exception):
    """An add or remove that cannot be done; str() says why and what to do."""


async def read_host_key(host: str, port: int, timeout: float = 10) -> tuple[str, str]:
    """(``type base64`` line, ``SHA256:…`` fingerprint) of the key the node presents,
    read without logging in."""
    import asyncssh

    try:
        key = await within(timeout, asyncssh.get_server_host_key(host, port))
    except (OSError, asyncio.TimeoutError, asyncssh.Error) as err:
        raise NodeAdminError(f"cannot reach {host}:{port} to read its host key: {err}") from None
    if key is None:
        raise NodeAdminError(f"{host}:{port} presented no host key")
    line = " ".join(key.export_public_key().decode().split()[:2])
    return line, key.get_fingerprint()


def known_hosts_name(host: str, port: int) -> str:
    return host if port == 22 else f"[{host}]:{port}"


def known_key(known_hosts: Path, host: str, port: int) -> str | None:
    """The key known_hosts already holds for this host (``type base64``), or None."""
    name = known_hosts_name(host, port)
    try:
        lines = known_hosts.read_text().splitlines()
    except FileNotFoundError:
        return None
    for line in lines:
        parts = line.split()
        if len(parts) >= 3 and name in parts[0].split(","):
            return f"{parts[1]} {parts[2]}"
    return None


def trust(known_hosts: Path, host: str, port: int, key_line: str) -> None:
    """Append the node's key to known_hosts (created 0600 when missing)."""
    known_hosts.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(known_hosts, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(fd, "a") as f:
        f.write(f"{known_hosts_name(host, port)} {key_line}\n")


def _replace_file(path: Path, text: str) -> ClusterConfig:
    """Validate ``text`` as a cluster file, then put it in place atomically."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".nodes-", suffix=".yaml")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    try:
        os.chmod(tmp, path.stat().st_mode & 0o777)
        load_config(tmp)  # refuses a file the head would not start on
    except ConfigError as err:
        os.unlink(tmp)
        raise NodeAdminError(f"the edited file would not load ({err}); {path} is unchanged") from None
    os.replace(tmp, path)
    return load_config(path)


def _nodes_value(text: str):
    root = yaml.compose(text)
    if root is None or not isinstance(root, yaml.MappingNode):
        return None, None
    for key, value in root.value:
        if key.value == "nodes":
            return key, value
    return None, None


def add_node_text(text: str, entry: dict[str, object]) -> str:
    """``text`` with one more node appended to its ``nodes:`` list, comments kept."""
    key, value = _nodes_value(text)
    fields = [f"{k}: {yaml.safe_dump(v, default_flow_style=True).strip().removesuffix('...').strip()}"
              for k, v in entry.items()]
    if value is None:
        return text.rstrip("\n") + "\nnodes:\n" + _item(fields, 2)
    if isinstance(value, yaml.SequenceNode) and value.value and not value.flow_style:
        column = value.value[0].start_mark.column - 2
        lines = text.splitlines(keepends=True)
        last = value.value[-1].end_mark
        # The last item ends where the next top-level content starts; insert right there.
        insert_at = last.line if last.column == 0 else last.line + 1
        return "".join(lines[:insert_at]) + _item(fields, column) + "".join(lines[insert_at:])
    # `nodes: []`, `nodes:` or a flow list: replace the value with a block list.
    start, end = value.start_mark.index, value.end_mark.index
    if isinstance(value, yaml.SequenceNode) and value.value:
        raise NodeAdminError("nodes: is written as a [flow, list]; write it one '- name:' per node")
    return text[:start].rstrip(" ") + "\n" + _item(fields, 2) + text[end:].lstrip("\n")


def _item(fields: list[str], column: int) -> str:
    pad = " " * column
    return f"{pad}- {fields[0]}\n" + "".join(f"{pad}  {field}\n" for field in fields[1:])


def remove_node_text(text: str, name: str) -> str:
    """``text`` without the node called ``name``."""
    _, value = _nodes_value(text)
    if not isinstance(value, yaml.SequenceNode):
        raise NodeAdminError(f"no node {name} in the file")
    lines = text.splitlines(keepends=True)
    items = value.value
    for i, item in enumerate(items):
        names = [v.value for k, v in getattr(item, "value", []) if getattr(k, "value", None) == "name"]
        if names != [name]:
            continue
        first = item.start_mark.line
        if i + 1 < len(items):
            last = items[i + 1].start_mark.line
        else:
            end = item.end_mark
            last = end.line if end.column == 0 else end.line + 1
        remaining = lines[:first] + lines[last:]
        if len(items) == 1:  # the list is now empty: say so explicitly
            key_line = value.start_mark.line - 1 if value.start_mark.column else value.start_mark.line
            remaining = [l if j != key_line or not l.lstrip().startswith("nodes:") else "nodes: []\n"
                         for j, l in enumerate(remaining)]
        return "".join(remaining)
    raise NodeAdminError(f"no node {name} in the file")


def check_address_free(config: ClusterConfig, host: str, port: int) -> None:
    """Refuse a new node at the address of one the file has: two names for one machine
    would have the scheduler hand its cards out twice."""
    for node in config.nodes:
        if node.host.lower() == host.lower() and node.port == port:
            raise NodeAdminError(f"{node.name} is already at {host}:{port}; a second node there "
                                 f"would share its GPUs (`nebula node remove {node.name}` first "
                                 "to rename it)")


def add_node(config_path: Path, name: str, host: str, port: int, user: str | None,
             identity: str | None, key_line: str, fingerprint: str,
             trust_fingerprint: str) -> ClusterConfig:
    """Trust the node's host key (``key_line``, just read from it) and add the node.

    The admin's ``trust_fingerprint`` must be the fingerprint the node presents: the
    explicit trust step. Raises NodeAdminError with what to do; nothing is changed then.
    """
    config = load_config(config_path)
    if any(n.name == name for n in config.nodes):
        raise NodeAdminError(f"{config_path} already has a node {name}")
    check_address_free(config, host, port)
    known_hosts = Path(config.known_hosts)
    already = known_key(known_hosts, host, port)
    if already is not None and already != key_line:
        raise NodeAdminError(
            f"{known_hosts} holds another key for {known_hosts_name(host, port)}; if the node was "
            f"reinstalled, check its new key ({fingerprint}) on the node and remove the old line "
            f"with ssh-keygen -R '{known_hosts_name(host, port)}' -f {known_hosts}")
    if trust_fingerprint != fingerprint:
        raise NodeAdminError(f"{host}:{port} presents {fingerprint}, not {trust_fingerprint}; "
                             "not trusted, nothing was changed")
    entry: dict[str, object] = {"name": name, "host": host}
    if port != DEFAULT_PORT:  # nodes.yaml's default needs no line
        entry["port"] = port
    if user:
        entry["user"] = user
    if identity:
        entry["identity"] = identity
    text = add_node_text(config_path.read_text(), entry)  # fails before anything is written
    if already is None:
        trust(known_hosts, host, port, key_line)
    return _replace_file(config_path, text)


def remove_node(config_path: Path, name: str) -> ClusterConfig:
    return _replace_file(config_path, remove_node_text(config_path.read_text(), name))


def cannot_write(err: OSError, path: Path) -> str:
    """Why the cluster file (or known_hosts) could not be rewritten, and the way out: it is
    read-only for the service (systemd's ProtectSystem, or the file's owner)."""
    return (f"the service cannot write {err.filename or path} ({err.strerror or err}); nothing "
            f"was changed: make {Path(path).parent} the service account's and writable for it "
            "(deploy/nebula.service has ReadWritePaths=/etc/nebula)")


#: the sections of nodes.yaml a reload applies at once, and those that wait for a restart
RELOADED_SECTIONS = ("scheduler", "limits")
RESTART_SECTIONS = ("health", "accounting", "notify", "pools")


def changed_sections(old: ClusterConfig, new: ClusterConfig) -> tuple[list[str], list[str]]:
    """(sections a reload applies that changed, changed sections that need a restart)"""
    return ([s for s in RELOADED_SECTIONS if getattr(old, s) != getattr(new, s)],
            [s for s in RESTART_SECTIONS if getattr(old, s) != getattr(new, s)])


def drained_changes(old: ClusterConfig, new: ClusterConfig) -> list[tuple[str, bool]]:
    """(node, drained) for each node whose ``drained:`` the file changed: one the file
    leaves as it was keeps what an admin set meanwhile (``nebula node drain``)."""
    was = {n.name: n.drained for n in old.nodes}
    return [(n.name, n.drained) for n in new.nodes if n.name in was and was[n.name] != n.drained]


def reload_said(path, result: ReloadReply) -> str:
    """The service log's line for a reload: what changed, or that nothing did."""
    parts = [f"{name} {what}" for what in ("added", "removed", "drained", "resumed")
             for name in result.get(what, ())]
    parts += [f"{name} changed" for name in result.get("sections", ())]
    parts += [f"{name} changed (applies at the next restart)" for name in result.get("restart_for", ())]
    return f"reloaded {path}: {'; '.join(parts) or 'nothing changed'}"
