"""The ``pools:`` section of nodes.yaml: batch clusters behind the same queue, each reached
over SSH at its login node (``nebula_tui/pools/`` drives them)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from yaml.nodes import Node, SequenceNode

from .nodes import DEFAULT_PORT, HOST_RE, named_entry
from .reader import Reader, describe, given, is_tag

POOL_KEYS = ("name", "kind", "host", "port", "user", "identity", "known_hosts", "partition",
             "account", "max_jobs", "max_jobs_per_user", "burst_after", "workdir", "runtime", "shards_per_gpu",
             "poll_interval", "scavenger_qos", "scavenger_partition", "shared_account")
POOL_KINDS = ("slurm",)
POOL_RUNTIMES = ("pyxis", "apptainer", "none")
#: ``user: submitter``: the head logs in to the pool as the user who submitted the job
SUBMITTER = "submitter"
# A partition or an account as Slurm names them: no spaces, quotes or shell characters.
_SLURM_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.,-]*\Z")
# A workdir on the cluster: ~/rel or /abs, no whitespace, quotes or shell characters.
_POOL_WORKDIR_RE = re.compile(r"(~|~/[A-Za-z0-9_./+-]*|/[A-Za-z0-9_./+-]*)\Z")


@dataclass(frozen=True, kw_only=True)
class PoolConfig:
    """A batch cluster reached over SSH at its login node (``pools:``); defaults applied (a
    field's default is the key's; ``user``, ``identity`` and ``known_hosts`` come from the
    cluster's)."""

    name: str
    kind: str
    host: str
    port: int = DEFAULT_PORT
    #: the account the head logs in as, or ``SUBMITTER``: each user's own
    user: str
    #: the key it logs in with; None: a submitter pool's is the head's pool key
    #: (``pools.keys.head_pool_key``), another's the SSH client's defaults
    identity: str | None
    known_hosts: str
    partition: str | None = None
    account: str | None = None
    #: at most this many of our jobs pending or running there
    max_jobs: int = 50
    #: at most this many of them one lab user's; None: half of max_jobs (rounded up) where
    #: several members send there (``user: submitter``, ``shared_account``), else max_jobs
    max_jobs_per_user: int | None = None
    #: a job waiting this long here may be sent there; None: only ``--pool``
    burst_after_s: float | None = None
    #: where its scripts' output lives on the cluster
    workdir: str = "~/nebula"
    #: what ``--image`` becomes there (one of ``POOL_RUNTIMES``)
    runtime: str = "none"
    #: >0: ``--gpu-mem`` asks for shards of a GPU
    shards_per_gpu: int = 0
    #: squeue/sinfo no more often than this (seconds)
    poll_interval_s: float = 10.0
    #: where ``--preemptible`` jobs go there (a QOS, a partition or both); neither: the
    #: pool refuses ``--preemptible``, which would run at full price there
    scavenger_qos: str | None = None
    scavenger_partition: str | None = None
    #: the admin's explicit yes to one cluster account for every member on a shared head
    #: (``shared_account: true``): they then share its files, jobs and keys there
    shared_account: bool = False
    #: the line of its ``name:`` in nodes.yaml (for messages that point at it)
    line: int | None = None

    @property
    def per_submitter(self) -> bool:
        return self.user == SUBMITTER

    @property
    def user_cap(self) -> int:
        """How many of the pool's ``max_jobs`` places one lab user may hold: one member's
        waiting (or held) jobs there must not keep every other member out."""
        if self.max_jobs_per_user is not None:
            return min(self.max_jobs_per_user, self.max_jobs)
        return -(-self.max_jobs // 2) if self.per_submitter or self.shared_account else self.max_jobs



def parse_pools(ctx: Reader, seq: Node | None, defaults: dict[str, Any],
           node_names: set[str]) -> tuple[PoolConfig, ...]:
    if seq is None or is_tag(seq, "null"):
        return ()
    if not isinstance(seq, SequenceNode):
        raise ctx.error(seq, "pools must be a list of pools, each starting with '- name: ...',"
                        f" found {describe(seq)}")
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


def _pool(ctx: Reader, item: Node, number: int, defaults: dict[str, Any]) -> PoolConfig:
    get, name, where = named_entry(ctx, item, number, "pool", POOL_KEYS, "hpc")
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
    if not HOST_RE.match(host):
        raise ctx.error(get("host"), f"{where}: host {host!r} is not a hostname or IP address "
                        "(no spaces, no leading '-'; put user and port in 'user:' and 'port:')")
    port = ctx.integer(get("port"), f"{where}: port", 1, 65535)
    user = ctx.user(get("user"), f"{where}: user")
    words = {}
    for key in ("partition", "account", "scavenger_qos", "scavenger_partition"):
        value = ctx.text(get(key), f"{where}: {key}")
        if value is not None and not _SLURM_NAME_RE.match(value):
            raise ctx.error(get(key), f"{where}: {key} {value!r} is not a name Slurm takes "
                            "(letters, digits, '_', '.', ',', '-')")
        words[key] = value
    workdir = ctx.text(get("workdir"), f"{where}: workdir")
    if workdir is not None and not _POOL_WORKDIR_RE.match(workdir):
        raise ctx.error(get("workdir"), f"{where}: workdir {workdir!r} must be ~/a/path or "
                        "/a/path (letters, digits, '_', '.', '/', '+', '-')")
    if workdir is not None and not workdir.startswith("~") and (user or defaults["user"]) == SUBMITTER:
        # One folder for every member: the first to make it owns it (0700), every other
        # member's jobs are refused there, and a cluster user who makes it first refuses all.
        raise ctx.error(get("workdir"), f"{where}: workdir {workdir} would be one folder for every "
                        "member (user: submitter), made by the first and refused to the others; "
                        "give a path under ~ (each member's own home there)")
    runtime = ctx.text(get("runtime"), f"{where}: runtime")
    if runtime is not None and runtime not in POOL_RUNTIMES:
        raise ctx.error(get("runtime"), f"{where}: runtime {runtime!r} is not one a pool "
                        f"declares; use one of {', '.join(POOL_RUNTIMES)}")
    max_jobs = ctx.integer(get("max_jobs"), f"{where}: max_jobs", 1, 100_000)
    per_user = ctx.integer(get("max_jobs_per_user"), f"{where}: max_jobs_per_user", 1, 100_000)
    shards = ctx.integer(get("shards_per_gpu"), f"{where}: shards_per_gpu", 0, 1024)
    poll = ctx.seconds(get("poll_interval"), f"{where}: poll_interval")
    identity = ctx.path(get("identity"), f"{where}: identity")
    if identity is None and user != SUBMITTER:  # a submitter pool uses the head's pool key
        identity = defaults["identity"]
    return PoolConfig(
        name=name, kind=kind, host=host,
        user=user or defaults["user"],
        identity=identity,
        known_hosts=ctx.path(get("known_hosts"), f"{where}: known_hosts") or defaults["known_hosts"],
        partition=words["partition"], account=words["account"],
        scavenger_qos=words["scavenger_qos"], scavenger_partition=words["scavenger_partition"],
        shared_account=bool(ctx.boolean(get("shared_account"), f"{where}: shared_account")),
        line=item.start_mark.line + 1,
        **given(port=port, max_jobs=max_jobs, max_jobs_per_user=per_user,
                burst_after_s=ctx.seconds(get("burst_after"), f"{where}: burst_after"),
                workdir=workdir, runtime=runtime, shards_per_gpu=shards, poll_interval_s=poll))

