"""``nodes.yaml`` → validated, frozen cluster configuration (R21, R22).

The file is read with :func:`yaml.compose`, not ``yaml.safe_load``: the node tree keeps
the line of every key and value, so each mistake is reported as one line
``path:LINE: what is wrong and how to fix it`` (no traceback), and duplicate keys, which
PyYAML would silently collapse to the last one, are caught.

Format (every key but ``nodes[].name`` and ``nodes[].host`` is optional)::

    cluster:
      name: lab
      known_hosts: ~/.ssh/known_hosts   # host keys are verified against this (R22)
      identity: ~/.ssh/id_ed25519       # default: the SSH client's own defaults
      user: nebula                      # default: the current Unix user
      probe_interval: 5                 # a duration > 0: 5, 5s, 1m … (as on the command line)
      missed_probes: 3                  # int >= 1
      connect_timeout: 10               # a duration > 0
      command_timeout: 30s              # a duration > 0
      admins: [alice]
      admin_group: gpuadmins            # members of this Unix group are admins too
      run_as: login                     # or "submitter"
      node_lease: 10m                   # how long a silent node keeps its jobs before they are requeued
      job_dir_retention: 7d             # how long a node keeps an ended job's directory (log, exit code)
      commands_visible_to: owner        # or "everyone": who sees a job's command line (admins always)
    scheduler: …                        # typed by settings.py (weights, quota, half_life)
    health: …                           # typed by settings.py (xid_policies, isolation_grace)
    accounting: …                       # typed by settings.py (history, telemetry_every)
    notify: …                           # typed by settings.py (webhooks, admins, mail_domain …)
    nodes:
      - name: node01
        host: 10.0.0.11
        port: 22
        user: ...                       # overrides cluster.user
        identity: ...                   # overrides cluster.identity
        known_hosts: ...                # overrides cluster.known_hosts
        env: {PATH: /usr/local/nvidia/bin:/usr/bin:/bin}
        drained: false
        runtime: podman                 # --image jobs use this one (default: the first found)
        warmup: false                   # wake each job's cards before its command starts
    pools:                              # batch clusters behind the same queue (pools/)
      - name: hpc
        kind: slurm                     # the one kind there is
        host: login.hpc.example.edu     # its login node, reached like a node (port, identity,
        user: submitter                 # known_hosts); "submitter": each user's own account
        partition: gpu                  # --partition; account: --account
        max_jobs: 50                    # at most this many of ours pending or running there
        burst_after: 10m                # a job waiting this long here may go there (absent: only --pool)
        workdir: ~/nebula               # where its scripts' output lives on the cluster
        runtime: none                   # pyxis | apptainer | none: what --image becomes
        shards_per_gpu: 0               # >0: --gpu-mem asks for shards of a GPU
        poll_interval: 10s              # squeue/sinfo no more often than this

Relative paths are taken from the config file's directory and ``~`` is expanded, so the
objects built here hold absolute paths only. An explicitly empty value (``identity:``)
means "use the default". Durations and sizes are read by ``units.py``, the CLI's parsers.

Why one module: every rule of the file's cluster, node and pool sections, each with the line
and the fix it names, is here and nowhere else (the other sections are ``settings.py``'s).
"""

from __future__ import annotations

import difflib
import getpass
import os
import pwd
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from ..environments import RUNTIMES
from ..model import ConfigError  # defined beside the plain data so clients need no yaml
from ..units import DURATION_EXAMPLES, parse_duration_s
from .settings import (AccountingSettings, HealthSettings, LimitsSettings, NotifySettings,
                       SchedulerSettings, SettingError, accounting_settings, health_settings,
                       limits_settings, notify_settings, scheduler_settings)

__all__ = [
    "ClusterConfig",
    "ConfigError",
    "NodeConfig",
    "SYSTEM_CONFIG",
    "empty_config",
    "find_config",
    "load_config",
    "parse_config",
]

#: Looked at last by :func:`find_config` (a module attribute so tests can point it elsewhere).
SYSTEM_CONFIG = Path("/etc/nebula/nodes.yaml")
#: Environment variable naming the config file; second in :func:`find_config`'s order.
CONFIG_ENV = "NEBULA_CONFIG"

DEFAULT_NAME = "lab"
DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"
DEFAULT_NODE_LEASE = 600.0
DEFAULT_JOB_DIR_RETENTION = 7 * 86400.0
DEFAULT_PORT = 22
DEFAULT_PROBE_INTERVAL = 5.0
DEFAULT_MISSED_PROBES = 3
DEFAULT_CONNECT_TIMEOUT = 10.0
DEFAULT_COMMAND_TIMEOUT = 30.0
RUN_AS_CHOICES = ("login", "submitter")
Settings = TypeVar("Settings", SchedulerSettings, HealthSettings, LimitsSettings,
                   AccountingSettings, NotifySettings)
COMMANDS_VISIBLE_CHOICES = ("owner", "everyone")

_NODE_NAME_RE = re.compile(r"[a-z0-9][a-z0-9_.-]*\Z")
_NODE_NAME_MAX = 63
# Host names, IPv4 and IPv6 (with an optional %zone). A leading "-" is refused so a host
# can never be read as an option by ssh (R22: no injection through the config either).
_HOST_RE = re.compile(r"[A-Za-z0-9_.:%\[\]][A-Za-z0-9_.:%\[\]-]*\Z")
_USER_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@-]*\$?\Z")
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

_TOP_KEYS = ("cluster", "nodes", "scheduler", "health", "limits", "accounting", "notify", "pools")
_CLUSTER_KEYS = (
    "name",
    "known_hosts",
    "identity",
    "user",
    "probe_interval",
    "missed_probes",
    "connect_timeout",
    "command_timeout",
    "admins",
    "admin_group",
    "run_as",
    "node_lease",
    "job_dir_retention",
    "commands_visible_to",
)
_NODE_KEYS = ("name", "host", "port", "user", "identity", "known_hosts", "env", "drained",
              "power_budget_w", "runtime", "warmup")

_POOL_KEYS = ("name", "kind", "host", "port", "user", "identity", "known_hosts", "partition",
              "account", "max_jobs", "burst_after", "workdir", "runtime", "shards_per_gpu",
              "poll_interval")
POOL_KINDS = ("slurm",)
POOL_RUNTIMES = ("pyxis", "apptainer", "none")
#: ``user: submitter``: the head logs in to the pool as the user who submitted the job
SUBMITTER = "submitter"
DEFAULT_POOL_MAX_JOBS = 50
DEFAULT_POOL_WORKDIR = "~/nebula"
DEFAULT_POOL_POLL_S = 10.0
# A partition or an account as Slurm names them: no spaces, quotes or shell characters.
_SLURM_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.,-]*\Z")
# A workdir on the cluster: ~/rel or /abs, no whitespace, quotes or shell characters.
_POOL_WORKDIR_RE = re.compile(r"(~|~/[A-Za-z0-9_./+-]*|/[A-Za-z0-9_./+-]*)\Z")

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


@dataclass(frozen=True)
class NodeConfig:
    """One node as the head reaches it over SSH; every default already applied."""

    name: str
    host: str
    port: int
    user: str
    #: Absolute path of the client key, or ``None`` for the SSH client's defaults.
    identity: str | None
    #: Absolute path of the known-hosts file the node's host key is verified against.
    known_hosts: str
    #: Extra environment for everything run on the node, in file order.
    env: tuple[tuple[str, str], ...]
    #: Start drained: no new jobs are placed here until ``nebula node resume``.
    drained: bool
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


@dataclass(frozen=True)
class PoolConfig:
    """A batch cluster reached over SSH at its login node (``pools:``); defaults applied."""

    name: str
    kind: str
    host: str
    port: int
    #: the account the head logs in as, or ``SUBMITTER``: each user's own
    user: str
    #: the key it logs in with; None: a submitter pool's is the head's pool key
    #: (``pools.keys.head_pool_key``), another's the SSH client's defaults
    identity: str | None
    known_hosts: str
    partition: str | None = None
    account: str | None = None
    max_jobs: int = DEFAULT_POOL_MAX_JOBS
    #: a job waiting this long here may be sent there; None: only ``--pool``
    burst_after_s: float | None = None
    workdir: str = DEFAULT_POOL_WORKDIR
    runtime: str = "none"
    shards_per_gpu: int = 0
    poll_interval_s: float = DEFAULT_POOL_POLL_S
    #: the line of its ``name:`` in nodes.yaml (for messages that point at it)
    line: int | None = None

    @property
    def per_submitter(self) -> bool:
        return self.user == SUBMITTER


@dataclass(frozen=True)
class ClusterConfig:
    """The whole cluster: head settings and the nodes, in file order."""

    path: Path | None
    name: str
    nodes: tuple[NodeConfig, ...]
    probe_interval: float
    missed_probes: int
    connect_timeout: float
    command_timeout: float
    admins: tuple[str, ...]
    run_as: str
    #: Cluster-wide defaults that nodes inherit (kept so ``nebula node add`` can apply them).
    user: str = ""
    identity: str | None = None
    known_hosts: str = ""
    #: members of this Unix group are admins too (R22); None = no group
    admin_group: str | None = None
    #: seconds a node may stay silent before its running jobs are declared lost and
    #: requeued (a short drop never costs anyone their job)
    node_lease: float = DEFAULT_NODE_LEASE
    #: the ``scheduler:`` section: scoring weights, quota, fair-share decay
    scheduler: SchedulerSettings = field(default_factory=SchedulerSettings, hash=False,
                                         compare=False)
    #: the ``health:`` section: Xid policies, isolation grace, the self-test command
    health: HealthSettings = field(default_factory=HealthSettings, hash=False, compare=False)
    #: the ``limits:`` section: time limits, the memory guard, idle cards
    limits: LimitsSettings = field(default_factory=LimitsSettings, hash=False, compare=False)
    #: seconds a node keeps the directory (run script, log, exit code) of a job attempt
    #: after the head recorded its end; a restored store learns from it what ran meanwhile
    job_dir_retention: float = DEFAULT_JOB_DIR_RETENTION
    #: who sees a job's command line besides admins: its "owner", or "everyone" (a command
    #: line can hold a password or a token)
    commands_visible_to: str = "owner"
    #: the ``accounting:`` section: who sees whose history, how often GPUs are sampled
    accounting: AccountingSettings = field(default_factory=AccountingSettings, hash=False,
                                           compare=False)
    #: the ``notify:`` section: webhooks and mail told of jobs' ends and GPUs' isolation
    notify: NotifySettings = field(default_factory=NotifySettings, hash=False, compare=False)
    #: the ``pools:`` section: batch clusters the queue may send jobs to
    pools: tuple[PoolConfig, ...] = ()

    def node(self, name: str) -> NodeConfig:
        """The node called ``name``; raises ``KeyError`` if there is none."""
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)


# ---------------------------------------------------------------------------- public API


#: libyaml's parser where PyYAML has it: ten times faster on a big file, same nodes and marks
_FAST_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
#: A cluster file is at most this big (a few thousand nodes fit in a tenth of it); bigger
#: ones are refused before they are parsed, which would take the head minutes.
MAX_CONFIG_BYTES = 1 << 20
#: nested mappings and lists, at most (the format itself needs four)
MAX_CONFIG_DEPTH = 20
#: values the file stands for once its aliases (``*name``) are expanded, at most
MAX_CONFIG_VALUES = 200_000


def load_config(path: str | Path) -> ClusterConfig:
    """Read and validate the file at ``path``; raises :class:`ConfigError`."""
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
    return parse_config(text, path)


def parse_config(text: str, path: str | Path = "<string>") -> ClusterConfig:
    """Validate config ``text``; ``path`` names it in errors and anchors relative paths.

    With the default ``"<string>"`` relative paths are taken from the current directory.
    Raises :class:`ConfigError`.
    """
    shown = str(path)
    real = shown != "<string>"
    base = Path(path).expanduser().absolute().parent if real else Path.cwd()
    ctx = _Ctx(shown, base)
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
    return _build(ctx, root, Path(path).expanduser().absolute() if real else None)


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


def find_config(explicit: str | None, home: Path) -> Path | None:
    """Which config file to use, or ``None`` when there is none.

    Order: ``explicit`` (``--config``), ``$NEBULA_CONFIG``, ``<home>/nodes.yaml``,
    :data:`SYSTEM_CONFIG`. The current directory is never searched, so the example
    ``nodes.yaml`` in a checkout is not picked up by accident. A file named explicitly
    or by the environment that does not exist raises :class:`ConfigError`.
    """
    if explicit:
        found = Path(explicit).expanduser()
        if not found.is_file():
            raise ConfigError(
                "cannot read: No such file (given with --config; check the path)", explicit
            )
        return found
    from_env = os.environ.get(CONFIG_ENV, "")
    if from_env:
        found = Path(from_env).expanduser()
        if not found.is_file():
            raise ConfigError(
                f"cannot read: No such file (named by ${CONFIG_ENV}; fix or unset it)",
                from_env,
            )
        return found
    for candidate in (Path(home) / "nodes.yaml", SYSTEM_CONFIG):
        if candidate.is_file():
            return candidate
    return None


def empty_config() -> ClusterConfig:
    """A cluster with no nodes and every default (the simulated lab starts from this)."""
    return ClusterConfig(
        path=None,
        name=DEFAULT_NAME,
        nodes=(),
        probe_interval=DEFAULT_PROBE_INTERVAL,
        missed_probes=DEFAULT_MISSED_PROBES,
        connect_timeout=DEFAULT_CONNECT_TIMEOUT,
        command_timeout=DEFAULT_COMMAND_TIMEOUT,
        admins=(),
        run_as="login",
        user=_current_user(),
        identity=None,
        known_hosts=os.path.expanduser(DEFAULT_KNOWN_HOSTS),
    )


# ------------------------------------------------------------------------------ helpers


def _current_user() -> str:
    # The passwd entry of our uid, not $USER: the login name must match who really runs us.
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:  # a uid with no passwd entry (some containers)
        return getpass.getuser()


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


def _describe(node: Node) -> str:
    """``string 'abc'``, ``list``, ``empty value``: what the user actually wrote."""
    kind = _kind(node)
    if isinstance(node, ScalarNode) and kind != "empty value":
        value = node.value if len(node.value) <= 40 else node.value[:37] + "..."
        return f"{kind} {value!r}"
    return kind


def _is(node: Node, tag: str) -> bool:
    return node.tag == _TAG + tag


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """" (did you mean 'node01'?)" for the known name closest to a mistyped one, or ""."""
    close = difflib.get_close_matches(str(word), list(known), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


class _Ctx:
    """Where we are: the file's name (for messages) and its directory (for paths)."""

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
                node, f"{where} must be a mapping of 'key: value' lines, found {_describe(node)}"
            )
        seen: dict[str, tuple[ScalarNode, Node]] = {}
        for key, value in node.value:
            if _is(key, "merge"):
                raise self.error(
                    key, f"{where}: merge keys ('<<') are not supported; write the keys out"
                )
            if not isinstance(key, ScalarNode):
                raise self.error(key, f"{where}: keys must be plain names, found {_describe(key)}")
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
        if node is None or _is(node, "null"):
            return None
        # Numbers are fine as text (a host "10.0.0.11", a node "01"); the raw spelling is kept.
        if isinstance(node, ScalarNode) and (
            _is(node, "str") or _is(node, "int") or _is(node, "float")
        ):
            return node.value
        hint = " (put it in quotes)" if isinstance(node, ScalarNode) else ""
        raise self.error(node, f"{what} must be a string, found {_describe(node)}{hint}")

    def integer(self, node: Node | None, what: str, low: int, high: int | None) -> int | None:
        if node is None or _is(node, "null"):
            return None
        rng = f"from {low} to {high}" if high is not None else f">= {low}"
        if not _is(node, "int"):
            raise self.error(node, f"{what} must be an integer {rng}, found {_describe(node)}")
        value = self.construct(node)
        if value < low or (high is not None and value > high):
            raise self.error(node, f"{what} must be an integer {rng}, found {value}")
        return value

    def seconds(self, node: Node | None, what: str) -> float | None:
        """A duration, written as the CLI takes one: 600 (seconds), 90s, 10m, 1h, 7d."""
        if node is None or _is(node, "null"):
            return None
        value = self.construct(node) if isinstance(node, ScalarNode) else None
        try:
            return parse_duration_s(value)
        except ValueError:
            raise self.error(node, f"{what} must be a duration > 0 such as {DURATION_EXAMPLES}, "
                                   f"found {_describe(node)}") from None

    def boolean(self, node: Node | None, what: str) -> bool | None:
        if node is None or _is(node, "null"):
            return None
        if not _is(node, "bool"):
            raise self.error(node, f"{what} must be true or false, found {_describe(node)}")
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


# ----------------------------------------------------------------------------- building


def _build(ctx: _Ctx, root: Node | None, path: Path | None) -> ClusterConfig:
    top: dict[str, tuple[ScalarNode, Node]] = {}
    if root is not None and not _is(root, "null"):  # an empty file is an empty cluster
        if not isinstance(root, MappingNode):
            raise ctx.error(
                root,
                f"the file must be a mapping with 'cluster:' and 'nodes:' sections,"
                f" found {_describe(root)}",
            )
        top = ctx.mapping(root, "top level", _TOP_KEYS)

    c: dict[str, tuple[ScalarNode, Node]] = {}
    if "cluster" in top and not _is(top["cluster"][1], "null"):
        c = ctx.mapping(top["cluster"][1], "cluster", _CLUSTER_KEYS)

    def get(section: dict[str, tuple[ScalarNode, Node]], key: str) -> Node | None:
        return section[key][1] if key in section else None

    name = ctx.text(get(c, "name"), "cluster.name")
    if name is not None and not name.strip():
        raise ctx.error(get(c, "name"), "cluster.name must not be empty")
    run_as = ctx.text(get(c, "run_as"), "cluster.run_as")
    if run_as is not None and run_as not in RUN_AS_CHOICES:
        raise ctx.error(
            get(c, "run_as"),
            f"cluster.run_as must be one of {', '.join(RUN_AS_CHOICES)}, found {run_as!r}",
        )
    visible = ctx.text(get(c, "commands_visible_to"), "cluster.commands_visible_to")
    if visible is not None and visible not in COMMANDS_VISIBLE_CHOICES:
        raise ctx.error(get(c, "commands_visible_to"), "cluster.commands_visible_to must be one of "
                        f"{', '.join(COMMANDS_VISIBLE_CHOICES)}, found {visible!r}")
    known_hosts = ctx.path(get(c, "known_hosts"), "cluster.known_hosts")
    if known_hosts is None:
        known_hosts = os.path.expanduser(DEFAULT_KNOWN_HOSTS)
    identity = ctx.path(get(c, "identity"), "cluster.identity")
    user = ctx.user(get(c, "user"), "cluster.user") or _current_user()

    cluster_defaults = {"user": user, "identity": identity, "known_hosts": known_hosts}
    nodes = _nodes(ctx, get(top, "nodes"), cluster_defaults)
    scheduler = _section(ctx, get(top, "scheduler"), scheduler_settings)
    health = _section(ctx, get(top, "health"), health_settings)
    limits = _section(ctx, get(top, "limits"), limits_settings)
    accounting = _section(ctx, get(top, "accounting"), accounting_settings)
    notify = _section(ctx, get(top, "notify"), notify_settings)
    pools = _pools(ctx, get(top, "pools"), cluster_defaults, {n.name for n in nodes})

    def pick(value: Any, default: Any) -> Any:
        return default if value is None else value

    return ClusterConfig(
        path=path,
        name=pick(name, DEFAULT_NAME),
        nodes=nodes,
        probe_interval=pick(
            ctx.seconds(get(c, "probe_interval"), "cluster.probe_interval"),
            DEFAULT_PROBE_INTERVAL,
        ),
        missed_probes=pick(
            ctx.integer(get(c, "missed_probes"), "cluster.missed_probes", 1, None),
            DEFAULT_MISSED_PROBES,
        ),
        connect_timeout=pick(
            ctx.seconds(get(c, "connect_timeout"), "cluster.connect_timeout"),
            DEFAULT_CONNECT_TIMEOUT,
        ),
        command_timeout=pick(
            ctx.seconds(get(c, "command_timeout"), "cluster.command_timeout"),
            DEFAULT_COMMAND_TIMEOUT,
        ),
        admins=_admins(ctx, get(c, "admins")),
        run_as=pick(run_as, "login"),
        user=user,
        identity=identity,
        known_hosts=known_hosts,
        admin_group=ctx.user(get(c, "admin_group"), "cluster.admin_group"),
        scheduler=scheduler,
        health=health,
        limits=limits,
        accounting=accounting,
        notify=notify,
        node_lease=pick(ctx.seconds(get(c, "node_lease"), "cluster.node_lease"), DEFAULT_NODE_LEASE),
        job_dir_retention=pick(ctx.seconds(get(c, "job_dir_retention"), "cluster.job_dir_retention"),
                               DEFAULT_JOB_DIR_RETENTION),
        commands_visible_to=pick(visible, "owner"),
        pools=pools,
    )


def _section(ctx: _Ctx, node: Node | None, build: Callable[[Any], Settings]) -> Settings:
    """``scheduler:``, ``health:``, ``limits:``, ``accounting:`` or ``notify:``, validated by
    its builder in settings.py; an error points at the line of the key it names."""
    try:
        return build(None if node is None else ctx.construct(node))
    except SettingError as err:
        raise ctx.error(_node_at(node, err.keys), str(err)) from None
    except ValueError as err:
        raise ctx.error(node, str(err)) from None


def _node_at(node: Node, keys: tuple) -> Node:
    """The YAML node under ``node`` at the path ``keys`` (as far as it goes)."""
    for key in keys:
        if not isinstance(node, MappingNode):
            break
        found = [value for k, value in node.value if isinstance(k, ScalarNode) and k.value == str(key)]
        if not found:
            break
        node = found[0]
    return node


def _admins(ctx: _Ctx, node: Node | None) -> tuple[str, ...]:
    if node is None or _is(node, "null"):
        return ()
    if not isinstance(node, SequenceNode):
        raise ctx.error(
            node,
            "cluster.admins must be a list of user names like [alice, bob],"
            f" found {_describe(node)}",
        )
    admins: list[str] = []
    for item in node.value:
        admin = ctx.user(item, "each of cluster.admins")
        if admin is None:
            raise ctx.error(item, "cluster.admins has an empty entry; remove it")
        if admin not in admins:
            admins.append(admin)
    return tuple(admins)


def _nodes(ctx: _Ctx, seq: Node | None, defaults: dict[str, Any]) -> tuple[NodeConfig, ...]:
    if seq is None or _is(seq, "null"):
        return ()
    if not isinstance(seq, SequenceNode):
        raise ctx.error(
            seq,
            "nodes must be a list of nodes, each starting with '- name: ...',"
            f" found {_describe(seq)}",
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


def _named(ctx: _Ctx, item: Node, number: int, what: str, known: tuple[str, ...],
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
    if not _NODE_NAME_RE.match(name) or len(name) > _NODE_NAME_MAX:
        raise ctx.error(
            get("name"),
            f"{where}: {what} name {name!r} is not valid; use lowercase letters, digits,"
            f" '_', '.', '-', starting with a letter or digit, at most {_NODE_NAME_MAX} characters",
        )
    return get, name, f"{what} '{name}'"


def _node(ctx: _Ctx, item: Node, number: int, defaults: dict[str, Any]) -> NodeConfig:
    get, name, where = _named(ctx, item, number, "node", _NODE_KEYS, "node01")

    host = ctx.text(get("host"), f"{where}: host")
    if host is None:
        raise ctx.error(
            item,
            f"{where}: missing required key 'host'"
            " (its hostname or IP address, e.g. host: 10.0.0.11)",
        )
    if not _HOST_RE.match(host):
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
        port=DEFAULT_PORT if port is None else port,
        user=user or defaults["user"],
        identity=identity or defaults["identity"],
        known_hosts=known_hosts or defaults["known_hosts"],
        env=_env(ctx, get("env"), where),
        drained=bool(drained),
        power_budget_w=budget,
        runtime=runtime,
        warmup=bool(ctx.boolean(get("warmup"), f"{where}: warmup")),
    )


def _env(ctx: _Ctx, node: Node | None, where: str) -> tuple[tuple[str, str], ...]:
    if node is None or _is(node, "null"):
        return ()
    if not isinstance(node, MappingNode):
        raise ctx.error(
            node, f"{where}: env must be a mapping of NAME: value lines, found {_describe(node)}"
        )
    pairs: list[tuple[str, str]] = []
    seen: dict[str, int] = {}
    for key, value in node.value:
        if not isinstance(key, ScalarNode) or not _ENV_NAME_RE.match(key.value):
            shown = key.value if isinstance(key, ScalarNode) else _describe(key)
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


def _pools(ctx: _Ctx, seq: Node | None, defaults: dict[str, Any],
           node_names: set[str]) -> tuple[PoolConfig, ...]:
    if seq is None or _is(seq, "null"):
        return ()
    if not isinstance(seq, SequenceNode):
        raise ctx.error(seq, "pools must be a list of pools, each starting with '- name: ...',"
                        f" found {_describe(seq)}")
    built: list[PoolConfig] = []
    for number, item in enumerate(seq.value, start=1):
        pool = _pool(ctx, item, number, defaults)
        name_node = next(v for k, v in item.value if k.value == "name")
        if pool.name in node_names or pool.name == "local":
            raise ctx.error(name_node, f"pool name '{pool.name}' is taken by "
                            + ("a node" if pool.name != "local" else "`--pool local`")
                            + "; give the pool a name of its own")
        for other in built:
            if other.name == pool.name:
                raise ctx.error(name_node, f"duplicate pool name '{pool.name}' (first defined on "
                                f"line {other.line}); pool names must be unique")
        built.append(pool)
    return tuple(built)


def _pool(ctx: _Ctx, item: Node, number: int, defaults: dict[str, Any]) -> PoolConfig:
    get, name, where = _named(ctx, item, number, "pool", _POOL_KEYS, "hpc")
    kind = ctx.text(get("kind"), f"{where}: kind")
    if kind is None:
        raise ctx.error(item, f"{where}: missing required key 'kind' (kind: slurm)")
    if kind not in POOL_KINDS:
        raise ctx.error(get("kind"), f"{where}: kind {kind!r} is not a pool kind NebulaGrid "
                        f"drives; use one of {', '.join(POOL_KINDS)}")
    host = ctx.text(get("host"), f"{where}: host")
    if host is None:
        raise ctx.error(item, f"{where}: missing required key 'host' (its login node, e.g. "
                        "host: login.hpc.example.edu)")
    if not _HOST_RE.match(host):
        raise ctx.error(get("host"), f"{where}: host {host!r} is not a hostname or IP address "
                        "(no spaces, no leading '-'; put user and port in 'user:' and 'port:')")
    port = ctx.integer(get("port"), f"{where}: port", 1, 65535)
    user = ctx.user(get("user"), f"{where}: user")
    words = {}
    for key in ("partition", "account"):
        value = ctx.text(get(key), f"{where}: {key}")
        if value is not None and not _SLURM_NAME_RE.match(value):
            raise ctx.error(get(key), f"{where}: {key} {value!r} is not a name Slurm takes "
                            "(letters, digits, '_', '.', ',', '-')")
        words[key] = value
    workdir = ctx.text(get("workdir"), f"{where}: workdir")
    if workdir is not None and not _POOL_WORKDIR_RE.match(workdir):
        raise ctx.error(get("workdir"), f"{where}: workdir {workdir!r} must be ~/a/path or "
                        "/a/path (letters, digits, '_', '.', '/', '+', '-')")
    runtime = ctx.text(get("runtime"), f"{where}: runtime")
    if runtime is not None and runtime not in POOL_RUNTIMES:
        raise ctx.error(get("runtime"), f"{where}: runtime {runtime!r} is not one a pool "
                        f"declares; use one of {', '.join(POOL_RUNTIMES)}")
    max_jobs = ctx.integer(get("max_jobs"), f"{where}: max_jobs", 1, 100_000)
    shards = ctx.integer(get("shards_per_gpu"), f"{where}: shards_per_gpu", 0, 1024)
    poll = ctx.seconds(get("poll_interval"), f"{where}: poll_interval")
    identity = ctx.path(get("identity"), f"{where}: identity")
    if identity is None and user != SUBMITTER:  # a submitter pool uses the head's pool key
        identity = defaults["identity"]
    return PoolConfig(
        name=name, kind=kind, host=host, port=DEFAULT_PORT if port is None else port,
        user=user or defaults["user"],
        identity=identity,
        known_hosts=ctx.path(get("known_hosts"), f"{where}: known_hosts") or defaults["known_hosts"],
        partition=words["partition"], account=words["account"],
        max_jobs=DEFAULT_POOL_MAX_JOBS if max_jobs is None else max_jobs,
        burst_after_s=ctx.seconds(get("burst_after"), f"{where}: burst_after"),
        workdir=workdir or DEFAULT_POOL_WORKDIR, runtime=runtime or "none",
        shards_per_gpu=shards or 0,
        poll_interval_s=DEFAULT_POOL_POLL_S if poll is None else poll,
        line=item.start_mark.line + 1)
