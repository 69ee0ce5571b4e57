"""A Slurm cluster as a pool: its own commands over SSH to its login node, nothing installed.

One asyncssh connection per cluster account (one in all with a project account; one per
lab user who submitted with ``user: submitter``), host keys verified against known_hosts
as for a node. A job is ``sbatch --parsable`` with its batch script on stdin, its token in
``--comment``; from then on the Slurm id sbatch answered is what names it. Each owner's
jobs are asked of ``squeue``/``sacct`` in that owner's account, and only the lines Slurm
lists under that user are believed (22.05's ``squeue --json`` ignores ``-u``, and anyone
can write any comment): nothing one account prints moves another's jobs. Every answer is
read with a byte bound while it is read (``MAX_OUTPUT``); a longer or malformed one is
``PoolDegraded``; squeue's other users' job records are dropped as each is read, outside
that bound (anyone may queue thousands of long ones). The job's command reaches the
compute node in its environment, never on a command line, and its output is 0600 in a
0700 workdir (``umask 077``). Every word of ours that reaches the remote shell is quoted
with ``shlex.quote``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import time
from dataclasses import replace
from pathlib import Path

import asyncssh

from ..config.cluster import ClusterConfig
from ..config.pools import PoolConfig
from ..remote.ssh import encryption_preference, known_hosts
from ..wire import PoolAuthorize
from ..waits import within
from . import slurm_parse as parse
from .authorize import authorize_view, head_address
from .base import (Capacity, PollResult, PoolDegraded, PoolNode, PoolNotAuthorised, PoolRefusal,
                   PoolSilent, PoolSubmission, PoolUnavailable, RemoteJob, sent_order)
from .slurm_script import batch_script, sbatch_argv
from .squeue_stream import SqueueJsonStream

#: bytes of a job's output one ``logs`` call reads at most
LOG_CHUNK = 64 * 1024
#: the output of a cluster command we read at most (squeue --json of 50 jobs is ~150 KB;
#: 22.05's lists the whole cluster's queue, whatever -u says: other users' records are read
#: and dropped, never counted here); more is PoolDegraded
MAX_OUTPUT = 8 << 20
#: the error text of a cluster command we keep (the rest is read and dropped)
MAX_ERROR = 4096
#: squeue --json's whole answer, other users' records included, read at most: some 60,000
#: jobs of 4 KiB (Slurm's MaxJobCount is 10,000 by default). Read at about 100 MB/s and
#: dropped as read: time, not memory (a member's key line may send this much each poll)
MAX_QUEUE_OUTPUT = 256 << 20


def remote_path(path: str) -> str:
    """``~/x`` or ``/x`` as a shell word: the home part left to the shell, the rest quoted."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


def capacity_of(version: tuple[int, ...], nodes: list[parse.SlurmNode], partition: str,
                ends_from: str) -> Capacity:
    """What sinfo's nodes offer a pool sent to ``partition`` ("": the cluster's default,
    every partition counted)."""
    if partition:  # only our partition's nodes count here (what -p listed: a node's other ones too)
        nodes = [replace(n, partitions=(partition,)) for n in nodes
                 if not n.partitions or partition in n.partitions]
    return Capacity(parse.version_text(version),
                    tuple(PoolNode(n.name, n.state, n.gpus, n.gpus_used, n.usable, n.partitions)
                          for n in nodes), ends_from=ends_from)


class SlurmPool:
    """One Slurm cluster (see the module docstring). ``key`` is the head's pool key, which a
    ``user: submitter`` pool without ``identity:`` logs in with."""

    kind = "slurm"

    def __init__(self, config: PoolConfig, cluster: ClusterConfig, key: Path | None = None):
        self.config = config
        self.name = config.name
        self.cluster = cluster
        self.key = key
        self._conns: dict[str, asyncssh.SSHClientConnection] = {}
        self._opening: dict[str, asyncio.Lock] = {}
        self._workdirs: dict[str, str] = {}  # account -> its workdir, resolved there once
        # Each read in, and believed for, one account alone: any may be a member's own key
        # line, whose forced command answers what it likes.
        self._versions: dict[str, tuple[int, ...]] = {}
        self._accounting: dict[str, bool] = {}  # account -> its sacct answers
        #: the head's address as the login node sees it (the local end of a connection)
        self.address: str | None = None

    # ------------------------------------------------------------------- connections
    def account_for(self, user: str) -> str:
        return user if self.config.per_submitter else self.config.user

    def _identity(self) -> str | None:
        if self.config.identity:
            return self.config.identity
        return str(self.key) if self.config.per_submitter and self.key else None

    async def _conn(self, account: str) -> asyncssh.SSHClientConnection:
        conn = self._conns.get(account)
        if conn is not None and not conn.is_closed():
            return conn
        lock = self._opening.setdefault(account, asyncio.Lock())
        async with lock:
            conn = self._conns.get(account)
            if conn is not None and not conn.is_closed():
                return conn
            options = {"known_hosts": known_hosts(self.config.known_hosts), "username": account,
                       "connect_timeout": self.cluster.connect_timeout, "keepalive_interval": 15,
                       "encryption_algs": list(encryption_preference())}
            identity = self._identity()
            if identity:
                options["client_keys"] = [identity]
                options["agent_path"] = None  # the pool key alone: what the user authorised
            try:
                conn = await within(self.cluster.connect_timeout,
                                    asyncssh.connect(self.config.host, self.config.port, **options))
            except asyncssh.PermissionDenied:
                key = "the head's pool key" if self.config.per_submitter else identity or "the default SSH keys"
                raise PoolNotAuthorised(f"pool {self.name} refused login as {account} with {key}") from None
            except asyncssh.HostKeyNotVerifiable:
                raise PoolUnavailable(
                    f"the host key of pool {self.name}'s login node ({self.config.host}:"
                    f"{self.config.port}) is not the one in {self.config.known_hosts}") from None
            except (OSError, asyncio.TimeoutError, asyncssh.Error) as err:
                raise PoolUnavailable(self._why(err)) from None
            self._conns[account] = conn
            self.address = (conn.get_extra_info("sockname") or (None,))[0]
            return conn

    def authorize(self) -> PoolAuthorize:
        """What ``nebula pool authorize`` shows: the line of the key a submitter logs in
        with (its ``.pub`` beside it), from the head's address (``pools/authorize.py``)."""
        identity, public_key = self._identity(), None
        if identity:
            with contextlib.suppress(OSError):
                public_key = Path(identity + ".pub").read_text().strip()
        address = self.address or head_address(self.config.host, self.config.port, resolve=False)
        return authorize_view(self.config, public_key, address)

    def _why(self, err: BaseException) -> str:
        where = f"{self.config.host}:{self.config.port}"
        if isinstance(err, (asyncio.TimeoutError, TimeoutError)):
            return f"pool {self.name}'s login node ({where}) did not answer in time"
        if isinstance(err, OSError) and err.errno:
            return f"cannot connect to pool {self.name}'s login node ({where}): {os.strerror(err.errno)}"
        return f"pool {self.name}'s login node ({where}): {type(err).__name__}: {err}"

    async def run(self, account: str, command: str, stdin: str | None = None,
                  timeout: float | None = None) -> tuple[int, str, str]:
        """``command`` in a shell there as ``account``: (exit status, stdout, stderr)."""
        status, out, err = await self.run_bytes(account, command, stdin, timeout)
        return status, out.decode("utf-8", errors="replace"), err

    async def run_bytes(self, account: str, command: str, stdin: str | None = None,
                        timeout: float | None = None, limit: int = MAX_OUTPUT, sink=None
                        ) -> tuple[int, bytes, str]:
        """As ``run``, its output as bytes; more than ``limit`` of it is PoolDegraded, found
        while reading (the rest is never read: the command is closed). ``sink``: a
        ``squeue_stream.SqueueJsonStream`` the output is fed to as it comes instead (b"" returned), whose
        ``own`` bytes ``limit`` bounds."""
        conn = await self._conn(account)
        limit_s = timeout or self.cluster.command_timeout
        try:
            return await within(limit_s, self._bounded(conn, command, stdin, limit, sink))
        except asyncio.TimeoutError:  # logged in: the command there is what kept silent
            self._drop(account)
            raise PoolSilent(f"pool {self.name}: `{' '.join(command.split()[:3])[:60]}` did not "
                             f"answer in {limit_s:g} s as {account}") from None
        except (OSError, asyncssh.Error) as err:
            self._drop(account)
            raise PoolUnavailable(self._why(err)) from None

    async def _bounded(self, conn: asyncssh.SSHClientConnection, command: str,
                       stdin: str | None, limit: int, sink=None) -> tuple[int, bytes, str]:
        process = await conn.create_process(command, encoding=None)
        errors = None
        try:
            if stdin is not None:
                process.stdin.write(stdin.encode())
            process.stdin.write_eof()
            errors = asyncio.ensure_future(_read(process.stderr, MAX_ERROR, drain=True))
            out = await (_feed(process.stdout, sink, limit) if sink is not None
                         else _read(process.stdout, limit))
            if out is None:
                raise PoolDegraded(f"pool {self.name}: `{command.split()[0]}` answered more than "
                                   f"{limit >> 10} KiB, more than Slurm would; not read further")
            err = await errors
            await process.wait_closed()
        finally:
            if errors is not None and not errors.done():
                errors.cancel()
            process.close()
        status = process.exit_status if process.exit_status is not None else 255
        return status, out, (err or b"").decode("utf-8", errors="replace")

    def _drop(self, account: str) -> None:
        conn = self._conns.pop(account, None)
        if conn is not None:
            conn.close()

    async def close(self) -> None:
        for account in list(self._conns):
            self._drop(account)

    async def check_login(self, account: str) -> None:
        """PoolNotAuthorised when ``account`` does not let the head's key in; PoolUnavailable
        when the login node does not answer."""
        await self._conn(account)

    async def workdir(self, account: str) -> str:
        """The pool's workdir as ``account`` sees it there (made if missing), resolved once."""
        known = self._workdirs.get(account)
        if known is None:
            where = remote_path(self.config.workdir)
            # 0700: the jobs' output in it is for their owner's eyes (0600, sbatch's umask)
            status, out, err = await self.run(
                account, f"umask 077 && mkdir -p {where} && chmod 700 {where} && cd {where} "
                         "&& pwd -P")
            lines = out.strip().splitlines()
            if status != 0 or not lines or not lines[-1].startswith("/"):
                raise PoolRefusal(f"pool {self.name}: cannot make its workdir "
                                  f"{self.config.workdir} as {account}: {err.strip()[:200]}")
            known = self._workdirs[account] = lines[-1]
        return known

    async def hello(self, account: str) -> tuple[int, ...]:
        """The cluster's Slurm version (``sinfo --version``), read once per connection."""
        if account not in self._versions:
            status, out, err = await self.run(account, "sinfo --version")
            try:
                self._versions[account] = parse.parse_version(out)
            except ValueError:
                raise PoolRefusal(f"pool {self.name}: sinfo --version answered "
                                  f"{(out or err).strip()[:120]!r}; is Slurm on its PATH?") from None
        return self._versions[account]

    def accounting(self, account: str) -> bool | None:
        """Whether the cluster keeps accounting, as ``account``'s sacct says (None: not
        asked yet)."""
        return self._accounting.get(account)

    # ------------------------------------------------------------------------ submit
    def log_path(self, workdir: str, submission: PoolSubmission) -> str:
        return f"{workdir}/job-{submission.job.id}-{submission.token}.out"

    def slices_note(self, spec) -> str:
        """What --gpu-mem becomes here, for the line that says the job was sent."""
        if spec.gpu_mem_mb is None:
            return ""
        shards = self.config.shards_per_gpu
        if shards:
            return f"; --gpu-mem asks for a shard (1/{shards} of a GPU, its memory not fenced)"
        return f"; pool {self.name} has no GPU shards: --gpu-mem gets whole GPUs there"

    async def submit(self, submission: PoolSubmission) -> str:
        account = submission.account
        await self.hello(account)
        workdir = await self.workdir(account)
        argv = sbatch_argv(self.config, submission, workdir, self.log_path(workdir, submission))
        # umask 077: Slurm creates the job's output file with the umask sbatch ran under;
        # the folder made again (0700) each time: its owner may have deleted it since
        status, out, err = await self.run(
            account, f"umask 077 && mkdir -p {shlex.quote(workdir)} && " + shlex.join(argv),
            stdin=batch_script(self.config, submission))
        if status != 0:
            said = (err or out).strip()
            raise PoolRefusal(f"pool {self.name}: sbatch refused the job: "
                              f"{said.splitlines()[-1][:300] if said else f'exit status {status}'}")
        try:
            return parse.parse_sbatch(out)
        except ValueError as why:
            raise PoolRefusal(f"pool {self.name}: {why}") from None

    # ------------------------------------------------------------------------- poll
    async def _squeue(self, account: str) -> list[parse.SlurmJob]:
        """The jobs Slurm lists under ``account``, asked as ``account``; whatever else it
        prints (22.05's --json ignores -u: every user's jobs) is left out here."""
        version = await self.hello(account)
        user = shlex.quote(account)
        try:
            if parse.has_json(version):
                # Read as it comes, other users' records dropped as each ends: anyone may
                # queue thousands of long ones, which bound nothing of ours.
                stream = SqueueJsonStream(account)
                status, _, err = await self.run_bytes(account, f"squeue --json -t all -u {user}",
                                                      sink=stream)
                listed = parse.squeue_json_jobs(stream.close()) if status == 0 else []
            else:
                status, out, err = await self.run(
                    account, f"squeue -h -t all -u {user} -O {shlex.quote(parse.SQUEUE_FORMAT)}")
                listed = parse.parse_squeue_text(out) if status == 0 else []
        except ValueError as why:
            raise PoolDegraded(f"pool {self.name}: {why}") from None
        if status != 0:
            raise PoolUnavailable(f"pool {self.name}: squeue failed: {err.strip()[:200]}")
        return [job for job in listed if job.user == account]

    def _report(self, job: parse.SlurmJob, accounted: parse.SlurmJob | None,
                token: str) -> RemoteJob:
        final = accounted or job
        end = parse.end_of(final, self.name)
        return RemoteJob(
            remote_id=job.slurm_id, token=token, waiting=job.waiting and end is None,
            running=job.running and end is None, reason=job.reason, nodes=job.nodes,
            started_at=final.start or job.start, ended_at=final.end or job.end, end=end,
            exit_code=final.exit_code, preempted=final.state == "PREEMPTED",
            elapsed_s=final.elapsed_s, gpus=final.gpus, qos=final.qos or job.qos,
            partition=final.partition or job.partition, token_ok=not job.comment or job.comment == token,
            earlier_runs=accounted.earlier if accounted else (),
            requested_gpus=job.requested_gpus, requested_nodes=job.requested_nodes)

    async def _sacct(self, account: str, ids: list[str]) -> dict[str, parse.SlurmJob]:
        """The ends ``account``'s accounting holds for ``ids`` that are ``account``'s ({}
        without accounting)."""
        if not ids or self._accounting.get(account) is False:
            return {}
        status, out, err = await self.run(
            account, f"sacct -X -D -n -P --format={parse.SACCT_FORMAT} -j {shlex.quote(','.join(ids))}")
        if status != 0 or "accounting storage is disabled" in (out + err).lower():
            self._accounting[account] = False
            return {}
        self._accounting[account] = True
        return {slurm_id: job for slurm_id, job in parse.parse_sacct(out).items()
                if job.user == account}

    async def poll(self, jobs: dict[tuple[str, str], str], poller: str | None) -> PollResult:
        """Each owner's jobs asked in that owner's account (see ``Pool.poll``), all owners at
        once: listed by squeue under that user with that id, or ended by that user's
        accounting. One account that does not answer, or answers what Slurm would not (a
        member's own key line may run anything), is that account's trouble alone
        (``PollResult.troubled``): nobody else's jobs wait for it or on it."""
        result = PollResult()
        owners: dict[str, dict[str, str]] = {}
        for (account, remote), token in jobs.items():
            owners.setdefault(account, {})[remote] = token
        await asyncio.gather(*(self._poll_one(account, theirs, result)
                               for account, theirs in sorted(owners.items())))
        readers = sorted(owners) if self.config.per_submitter else [poller] if poller else []
        for account in readers:
            if account in result.refused or account in result.troubled:
                continue
            try:
                result.capacities[account] = await self.capacity(account)
            except PoolNotAuthorised:
                result.refused.add(account)
            except PoolUnavailable as err:
                result.troubled[account] = err
        if poller in result.capacities:
            result.capacity = result.capacities[poller]
        return result

    async def _poll_one(self, account: str, theirs: dict[str, str], result: PollResult) -> None:
        try:
            listed = {job.slurm_id: job for job in await self._squeue(account)
                      if job.slurm_id in theirs}
            settled = [remote for remote in theirs if remote not in listed
                       or parse.end_of(listed[remote], self.name) is not None]
            accounted = await self._sacct(account, settled)
        except PoolNotAuthorised:  # that user revoked the key: their jobs wait
            result.refused.add(account)
            return
        except PoolUnavailable as err:  # PoolDegraded too
            result.troubled[account] = err
            return
        except PoolRefusal as err:  # sinfo --version not Slurm's, in that account
            result.troubled[account] = PoolDegraded(str(err))
            return
        for remote, token in theirs.items():
            found, final = listed.get(remote), accounted.get(remote)
            if found is not None or final is not None:
                result.jobs[(account, remote)] = self._report(found or final, final, token)

    async def runs(self, account: str, remote_id: str, token: str) -> RemoteJob | None:
        """What ``account``'s accounting holds of its job ``remote_id``, every run of the id
        (None without accounting, or none of ``account``'s)."""
        final = (await self._sacct(account, [remote_id])).get(remote_id)
        return self._report(final, final, token) if final is not None else None

    async def find(self, account: str, token: str) -> RemoteJob | None:
        """The job of ``account`` sent with ``token`` (an intent whose sbatch answer was
        lost: the one time a token finds a job, and only among that user's own; of several
        carrying it, the first sent: comments are public, and a copy comes after)."""
        found = [job for job in await self._squeue(account) if job.comment == token]
        return self._report(min(found, key=lambda job: sent_order(job.slurm_id)), None, token) if found else None

    async def ours(self, account: str, prefix: str, since: float | None = None) -> list[parse.SlurmJob]:
        """``account``'s jobs whose comment starts with ``prefix`` (this head's tokens), as
        squeue lists them (after a restore: what was sent since the backup), and, from
        ``since``, those its accounting has that squeue forgot (ended past MinJobAge), found
        by the ``--comment`` of their submit line (sacct keeps no comment by default)."""
        listed = [job for job in await self._squeue(account) if job.comment.startswith(prefix)]
        if since is None or self._accounting.get(account) is False:
            return listed
        start = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(since))
        status, out, err = await self.run(
            account, f"sacct -X -n -P -u {shlex.quote(account)} -S {start} "
                     f"--format={parse.SACCT_FORMAT},SubmitLine")
        if status != 0 or "accounting storage is disabled" in (out + err).lower():
            return listed
        seen = {job.slurm_id for job in listed}
        ended = parse.parse_sacct(out)
        for line in parse.lines(out):  # a job's name may hold \r: never a line of its own
            fields = line.split("|")
            comment = parse.submit_line_comment("|".join(fields[10:]))
            job = ended.get(fields[0].strip())
            if (job is not None and comment and job.user == account and job.slurm_id not in seen
                    and comment.startswith(prefix)):
                listed.append(replace(job, comment=comment))
        return listed

    async def capacity(self, account: str) -> Capacity:
        """The nodes' GPUs, as ``account`` reads them: one short line per node (and
        partition) with the five fields used, not ``sinfo --json`` (some 1.3 KiB a node:
        a cluster of 6,500 nodes passed MAX_OUTPUT, and its capacity was never read)."""
        version = await self.hello(account)
        partition = f" -p {shlex.quote(self.config.partition)}" if self.config.partition else ""
        status, out, err = await self.run(
            account, f"sinfo -h -N{partition} -O {shlex.quote(parse.SINFO_FORMAT)}")
        if status != 0:
            raise PoolUnavailable(f"pool {self.name}: sinfo failed: {err.strip()[:200]}")
        nodes = parse.parse_sinfo_text(out)
        return capacity_of(version, nodes, self.config.partition,
                           "sacct" if self._accounting.get(account) else "squeue")

    # ----------------------------------------------------------------- the job's life
    async def _scontrol(self, account: str, words: list[str], what: str) -> None:
        status, out, err = await self.run(account, shlex.join(words))
        if status != 0:
            raise PoolRefusal(f"pool {self.name}: {what} failed: {(err or out).strip()[:200]}")

    async def cancel(self, account: str, remote_id: str) -> None:
        await self._scontrol(account, ["scancel", remote_id], "scancel")

    async def hold(self, account: str, remote_id: str, hold: bool) -> None:
        await self._scontrol(account, ["scontrol", "hold" if hold else "release", remote_id],
                             "scontrol hold" if hold else "scontrol release")

    async def requeue(self, account: str, remote_id: str) -> None:
        await self._scontrol(account, ["scontrol", "requeue", remote_id], "scontrol requeue")

    async def logs(self, account: str, path: str, offset: int) -> tuple[str, int, int]:
        """(text from byte ``offset``, the next offset, the file's size when read): a regular
        file only, opened without blocking (the job may make its output a FIFO)."""
        where = shlex.quote(path)
        command = (f"[ -f {where} ] || exit 0; stat -L -c %s -- {where}; dd if={where} iflag=nonblock,"
                   f"skip_bytes,count_bytes skip={int(offset)} count={LOG_CHUNK} bs=65536 status=none")
        _, out, _ = await self.run_bytes(account, command, limit=LOG_CHUNK + 64)
        size_line, _, data = out.partition(b"\n")
        size = int(size_line) if size_line.strip().isdigit() else 0
        # A full chunk is cut at its last whole character: the rest comes with the next read.
        cut = len(data) - _partial_tail(data) if len(data) >= LOG_CHUNK else len(data)
        return data[:cut].decode("utf-8", errors="replace"), int(offset) + cut, size


async def _read(stream, limit: int, drain: bool = False) -> bytes | None:
    """What ``stream`` gives until its end, at most ``limit`` bytes: None past that, the
    first ``limit`` with ``drain`` (the rest read and dropped, so the command never blocks
    on it)."""
    data = bytearray()
    while True:
        chunk = await stream.read(65536)
        if not chunk:
            return bytes(data)
        if len(data) + len(chunk) > limit:
            if not drain:
                return None
            chunk = chunk[:max(0, limit - len(data))]
        data += chunk


async def _feed(stream, sink, limit: int) -> bytes | None:
    """``stream`` fed to ``sink`` until its end: None once more than ``limit`` of it is not
    other users' records; ValueError once the whole passes MAX_QUEUE_OUTPUT."""
    while True:
        chunk = await stream.read(65536)
        if not chunk:
            return b""
        sink.feed(chunk)
        if sink.own > limit:
            return None
        if sink.total > MAX_QUEUE_OUTPUT:
            raise ValueError(f"squeue --json listed more than {MAX_QUEUE_OUTPUT >> 20} MiB of jobs")


def _partial_tail(data: bytes) -> int:
    """How many bytes at the end of ``data`` begin a UTF-8 character not yet whole."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 != 0x80:  # a lead byte (or ASCII)
            need = 1 if byte < 0x80 else 2 if byte >> 5 == 0b110 else 3 if byte >> 4 == 0b1110 else 4
            return back if need > back else 0
    return 0

