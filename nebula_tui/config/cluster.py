"""``nodes.yaml`` → validated, frozen cluster configuration (R21, R22): the file found and
read, its ``cluster:`` section, and every section put together into a :class:`ClusterConfig`.

Each mistake is one line ``path:LINE: what is wrong and how to fix it`` (``reader.py``
keeps the lines).

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
    notify: …                           # typed by notify.py (webhooks, admins, mail_domain …)
    nodes:                              # typed by nodes.py
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
    pools:                              # typed by pools.py: batch clusters behind the queue
      - name: hpc
        kind: slurm                     # the one kind there is
        host: login.hpc.example.edu     # its login node, reached like a node (port, identity,
        user: submitter                 # known_hosts); "submitter": each user's own account
        partition: gpu                  # --partition; account: --account
        max_jobs: 50                    # at most this many of ours pending or running there
        max_jobs_per_user: 25           # of them one lab user's (default: half where several send)
        burst_after: 10m                # a job waiting this long here may go there (absent: only --pool)
        workdir: ~/nebula               # where its scripts' output lives on the cluster
        runtime: none                   # pyxis | apptainer | none: what --image becomes
        shards_per_gpu: 0               # >0: --gpu-mem asks for shards of a GPU
        poll_interval: 10s              # squeue/sinfo no more often than this

Relative paths are taken from the config file's directory and ``~`` is expanded, so the
objects built here hold absolute paths only. An explicitly empty value (``identity:``)
means "use the default". Durations and sizes are read by ``units.py``, the CLI's parsers.
"""

from __future__ import annotations

import getpass
import os
import pwd
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from ..model import ConfigError  # defined beside the plain data so clients need no yaml
from .nodes import NodeConfig, parse_nodes
from .notify import NotifySettings, notify_settings
from .pools import PoolConfig, parse_pools
from .reader import Reader, compose, describe, given, is_tag, node_at, read_file
from .settings import (AccountingSettings, HealthSettings, LimitsSettings, SchedulerSettings,
                       SettingError, accounting_settings, health_settings, limits_settings,
                       scheduler_settings)

#: Looked at last by :func:`find_config` (a module attribute so tests can point it elsewhere).
SYSTEM_CONFIG = Path("/etc/nebula/nodes.yaml")
#: Environment variable naming the config file; second in :func:`find_config`'s order.
CONFIG_ENV = "NEBULA_CONFIG"

RUN_AS_CHOICES = ("login", "submitter")
Settings = TypeVar("Settings", SchedulerSettings, HealthSettings, LimitsSettings,
                   AccountingSettings, NotifySettings)
COMMANDS_VISIBLE_CHOICES = ("owner", "everyone")
TOP_KEYS = ("cluster", "nodes", "scheduler", "health", "limits", "accounting", "notify", "pools")
CLUSTER_KEYS = (
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


def current_user() -> str:
    """``cluster.user`` unless nodes.yaml says otherwise: the login name of our uid."""
    # The passwd entry of our uid, not $USER: the login name must match who really runs us.
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:  # a uid with no passwd entry (some containers)
        return getpass.getuser()


def default_known_hosts() -> str:
    """``cluster.known_hosts`` unless nodes.yaml says otherwise."""
    return os.path.expanduser("~/.ssh/known_hosts")


@dataclass(frozen=True)
class ClusterConfig:
    """The whole cluster: head settings and the nodes, in file order. Each field's default
    is the key's default when nodes.yaml leaves it out (or empty): written here only."""

    #: the file it was read from; None: a text or no file (``empty_config``)
    path: Path | None = None
    name: str = "lab"
    nodes: tuple[NodeConfig, ...] = ()
    #: seconds between a node's probes
    probe_interval: float = 5.0
    #: probe intervals a node may stay silent before it is ``unknown``
    missed_probes: int = 3
    connect_timeout: float = 10.0
    #: seconds a request to a node's nodelet may take
    command_timeout: float = 30.0
    admins: tuple[str, ...] = ()
    #: whose account runs a job's command on the node: the head's "login", or its "submitter"
    run_as: str = "login"
    #: Cluster-wide defaults that nodes inherit (kept so ``nebula node add`` can apply them).
    user: str = field(default_factory=current_user)
    identity: str | None = None
    known_hosts: str = field(default_factory=default_known_hosts)
    #: members of this Unix group are admins too (R22); None = no group
    admin_group: str | None = None
    #: seconds a node may stay silent before its running jobs are declared lost and
    #: requeued (a short drop never costs anyone their job)
    node_lease: float = 600.0
    #: the ``scheduler:`` section: scoring weights, quota, fair-share decay
    scheduler: SchedulerSettings = field(default_factory=SchedulerSettings, hash=False,
                                         compare=False)
    #: the ``health:`` section: Xid policies, isolation grace, the self-test command
    health: HealthSettings = field(default_factory=HealthSettings, hash=False, compare=False)
    #: the ``limits:`` section: time limits, the memory guard, idle cards
    limits: LimitsSettings = field(default_factory=LimitsSettings, hash=False, compare=False)
    #: seconds a node keeps the directory (run script, log, exit code) of a job attempt
    #: after the head recorded its end; a restored store learns from it what ran meanwhile
    job_dir_retention: float = 7 * 86400.0
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


def load_config(path: str | Path) -> ClusterConfig:
    """Read and validate the file at ``path``; raises :class:`ConfigError`."""
    return parse_config(read_file(path), path)


def parse_config(text: str, path: str | Path = "<string>") -> ClusterConfig:
    """Validate config ``text``; ``path`` names it in errors and anchors relative paths.

    With the default ``"<string>"`` relative paths are taken from the current directory.
    Raises :class:`ConfigError`.
    """
    shown = str(path)
    real = shown != "<string>"
    base = Path(path).expanduser().absolute().parent if real else Path.cwd()
    ctx = Reader(shown, base)
    root = compose(text, shown)
    return _build(ctx, root, Path(path).expanduser().absolute() if real else None)


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
    """A cluster with no nodes and every default (what an empty nodes.yaml gives)."""
    return ClusterConfig()


# ----------------------------------------------------------------------------- building


def _build(ctx: Reader, root: Node | None, path: Path | None) -> ClusterConfig:
    top: dict[str, tuple[ScalarNode, Node]] = {}
    if root is not None and not is_tag(root, "null"):  # an empty file is an empty cluster
        if not isinstance(root, MappingNode):
            raise ctx.error(
                root,
                f"the file must be a mapping with 'cluster:' and 'nodes:' sections,"
                f" found {describe(root)}",
            )
        top = ctx.mapping(root, "top level", TOP_KEYS)

    c: dict[str, tuple[ScalarNode, Node]] = {}
    if "cluster" in top and not is_tag(top["cluster"][1], "null"):
        c = ctx.mapping(top["cluster"][1], "cluster", CLUSTER_KEYS)

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
    known_hosts = ctx.path(get(c, "known_hosts"), "cluster.known_hosts") or default_known_hosts()
    identity = ctx.path(get(c, "identity"), "cluster.identity")
    user = ctx.user(get(c, "user"), "cluster.user") or current_user()

    cluster_defaults = {"user": user, "identity": identity, "known_hosts": known_hosts}
    nodes = parse_nodes(ctx, get(top, "nodes"), cluster_defaults)
    scheduler = _section(ctx, get(top, "scheduler"), scheduler_settings)
    health = _section(ctx, get(top, "health"), health_settings)
    limits = _section(ctx, get(top, "limits"), limits_settings)
    accounting = _section(ctx, get(top, "accounting"), accounting_settings)
    notify = _section(ctx, get(top, "notify"), notify_settings)
    pools = parse_pools(ctx, get(top, "pools"), cluster_defaults, {n.name for n in nodes})

    return ClusterConfig(
        path=path,
        nodes=nodes,
        user=user,
        identity=identity,
        known_hosts=known_hosts,
        scheduler=scheduler,
        health=health,
        limits=limits,
        accounting=accounting,
        notify=notify,
        pools=pools,
        **given(
            name=name,
            run_as=run_as,
            commands_visible_to=visible,
            probe_interval=ctx.seconds(get(c, "probe_interval"), "cluster.probe_interval"),
            missed_probes=ctx.integer(get(c, "missed_probes"), "cluster.missed_probes", 1, None),
            connect_timeout=ctx.seconds(get(c, "connect_timeout"), "cluster.connect_timeout"),
            command_timeout=ctx.seconds(get(c, "command_timeout"), "cluster.command_timeout"),
            admins=_admins(ctx, get(c, "admins")),
            admin_group=ctx.user(get(c, "admin_group"), "cluster.admin_group"),
            node_lease=ctx.seconds(get(c, "node_lease"), "cluster.node_lease"),
            job_dir_retention=_retention(ctx, get(c, "job_dir_retention")),
        ),
    )


#: The head's backups (backups.py): one when the newest is this old, this many kept.
BACKUP_EVERY_S = 3600.0
BACKUPS_KEPT = 5
#: A node keeps an acked end at least as long as the oldest backup kept goes back (and an
#: hour more): a head restored from it settles the jobs that ended since from those records.
MIN_JOB_DIR_RETENTION_S = (BACKUPS_KEPT + 1) * BACKUP_EVERY_S


def _retention(ctx: Reader, node: Node | None) -> float | None:
    value = ctx.seconds(node, "cluster.job_dir_retention")
    if value is not None and value < MIN_JOB_DIR_RETENTION_S:
        raise ctx.error(node, f"cluster.job_dir_retention must be at least {MIN_JOB_DIR_RETENTION_S / 3600:g}h: "
                              "a head restored from its oldest backup settles the jobs that ended since from "
                              f"the nodes' records of them; found {value:g}s")
    return value


def _section(ctx: Reader, node: Node | None, build: Callable[[Any], Settings]) -> Settings:
    """``scheduler:``, ``health:``, ``limits:``, ``accounting:`` or ``notify:``, validated by
    its builder in settings.py or notify.py; an error points at the line of the key it names."""
    try:
        return build(None if node is None else ctx.construct(node))
    except SettingError as err:
        raise ctx.error(node_at(node, err.keys), str(err)) from None
    except ValueError as err:
        raise ctx.error(node, str(err)) from None


def _admins(ctx: Reader, node: Node | None) -> tuple[str, ...]:
    if node is None or is_tag(node, "null"):
        return ()
    if not isinstance(node, SequenceNode):
        raise ctx.error(
            node,
            "cluster.admins must be a list of user names like [alice, bob],"
            f" found {describe(node)}",
        )
    admins: list[str] = []
    for item in node.value:
        admin = ctx.user(item, "each of cluster.admins")
        if admin is None:
            raise ctx.error(item, "cluster.admins has an empty entry; remove it")
        if admin not in admins:
            admins.append(admin)
    return tuple(admins)
