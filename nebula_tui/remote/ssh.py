"""One persistent SSH link per node: connection, the node's nodelet, requests and heartbeat.

A :class:`NodeLink` connects with asyncssh (host key verified against known_hosts, never
accepted silently), starts the nodelet (its script sent over stdin, nothing installed),
and from then on every probe, job start and job exit arrives as a message on one stream.
Requests to the node (launch, cancel, log, …) are JSON lines on the same process, so they
cost no new SSH channel. A silent stream is a missed heartbeat (R15).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import itertools
import json
import logging
import os
import shlex
import time
from collections.abc import Callable

import asyncssh
from asyncssh.encryption import get_default_encryption_algs

from ..config.cluster import ClusterConfig
from ..config.nodes import NodeConfig
from ..model import NodeState
from ..waits import within
from . import preflight, protocol, shipping
from .launcher import TMUX_SOCKET

log = logging.getLogger(__name__)

#: Reconnect back-off: first retry after this many seconds, doubling up to the cap.
RETRY_FIRST_S = 0.5
RETRY_CAP_S = 10.0
#: SSH handshakes under way at once, all links of a head together. A head starting with
#: 500 nodes began 500 key exchanges at once: on a busy 2-core machine none ended within
#: connect_timeout, all retried together, and the nodes never came up (bench/scale.py).
#: A bound lets some finish, whatever the load. The wait for a turn counts in
#: connect_timeout, so a node that swallows packets holds a turn no longer than that and
#: a link waiting behind such nodes retries like any other timed-out attempt.
MAX_HANDSHAKES = 32

_handshakes: dict[asyncio.AbstractEventLoop, asyncio.Semaphore] = {}


def handshake_turn() -> asyncio.Semaphore:
    """This event loop's bound on handshakes at once (a head has one loop; tests start many)."""
    loop = asyncio.get_running_loop()
    turn = _handshakes.get(loop)
    if turn is None:
        for old in [other for other in _handshakes if other.is_closed()]:
            del _handshakes[old]
        turn = _handshakes[loop] = asyncio.Semaphore(MAX_HANDSHAKES)
    return turn


class NodeUnavailable(Exception):
    """The node cannot take a request now (not connected, or the link broke meanwhile)."""


@functools.cache
def nodelet_source() -> bytes:
    """The script the node runs: the shipped modules (hardware layer, parsers, the node
    side's helpers, pynvml), then the nodelet that imports them (see remote/shipping.py)."""
    return shipping.script().encode("utf-8")


_known_hosts: dict[str, tuple[tuple[int, int], asyncssh.SSHKnownHosts]] = {}


def known_hosts(path: str | None) -> asyncssh.SSHKnownHosts | str | None:
    """``path``'s host keys, read once while the file stays the same (same size and
    modification time). asyncssh reads the file again for every connection: 100 nodes
    starting at once parsed 100 lines 100 times, a fifth of the head's restart. A file
    changed since (``nebula node add``, ``ssh-keygen -R``) is read again."""
    if path is None:
        return None
    try:
        stat = os.stat(path)
    except OSError:
        return path  # asyncssh says what is wrong with it
    stamp = (stat.st_mtime_ns, stat.st_size)
    cached = _known_hosts.get(path)
    if cached is None or cached[0] != stamp:
        cached = _known_hosts[path] = (stamp, asyncssh.read_known_hosts(path))
    return cached[1]


@functools.cache
def encryption_preference() -> tuple[str, ...]:
    """asyncssh's ciphers with AES-GCM first. Every message to and from a node is one SSH
    packet, and asyncssh's chacha20-poly1305 (the default first choice) costs about five
    times as much per packet in Python as AES-GCM, which the cryptography library does in
    one call: at a few hundred job starts and ends a second that was a third of the head's
    CPU. AES-128 is the cheaper key size. Every OpenSSH since 6.2 offers AES-GCM; the
    others stay as fallbacks."""
    algs = [alg.decode() for alg in get_default_encryption_algs()]
    gcm = sorted((alg for alg in algs if "-gcm@" in alg), key=lambda alg: "128" not in alg)
    return tuple(gcm + [alg for alg in algs if alg not in gcm])


def describe_connect_error(node: NodeConfig, err: BaseException) -> str:
    """One line that says why a node could not be reached and what to do about it."""
    where = f"{node.host}:{node.port}"
    if isinstance(err, asyncssh.HostKeyNotVerifiable):
        return (f"host key of {node.name} ({where}) is not the one in {node.known_hosts}; "
                f"if the node was reinstalled, check its new key and remove the old line with "
                f"ssh-keygen -R '[{node.host}]:{node.port}' -f {node.known_hosts}")
    if isinstance(err, asyncssh.PermissionDenied):
        key = node.identity or "the default SSH keys"
        return f"{node.name} ({where}) refused login as {node.user} with {key}"
    if isinstance(err, (asyncio.TimeoutError, TimeoutError)):
        return f"{node.name} ({where}) did not answer in time"
    if isinstance(err, OSError) and err.filename:  # one of the head's own files
        return local_file_problem(node, str(err.filename), err)
    if isinstance(err, OSError):
        # asyncio's strerror is "Connect call failed (addr)"; the errno says why.
        why = os.strerror(err.errno) if err.errno else (err.strerror or str(err))
        return f"cannot connect to {node.name} ({where}): {why}"
    return f"{node.name} ({where}): {type(err).__name__}: {err}"


def local_file_problem(node: NodeConfig, path: str, err: OSError) -> str:
    """The head's SSH key or known_hosts file for ``node`` is missing or unreadable: which
    file, what nodes.yaml calls it, and what makes it."""
    why = "does not exist" if err.errno == errno.ENOENT else f"cannot be read ({os.strerror(err.errno or 0)})"
    if node.identity and os.path.abspath(os.path.expanduser(node.identity)) == os.path.abspath(path):
        return (f"{node.name}: its SSH key {path} (identity in nodes.yaml) {why}; make one with "
                f"ssh-keygen -t ed25519 -f {path} and let it in with ssh-copy-id -i {path}.pub "
                f"-p {node.port} {node.user}@{node.host}")
    if os.path.abspath(path) == os.path.abspath(node.known_hosts):
        return (f"{node.name}: the known_hosts file {path} (known_hosts in nodes.yaml) {why}; "
                f"`nebula node add` writes it as it trusts each node's host key (or, once the "
                f"node's fingerprint is checked: ssh-keyscan -p {node.port} {node.host} >> {path})")
    return f"cannot connect to {node.name} ({node.host}:{node.port}): {path} {why}"


class NodeLink:
    """The head's link to one node. ``run()`` keeps it up until ``close()``.

    ``on_message(node, message)`` gets every message the nodelet sends except replies;
    ``on_state(node, state, reason)`` gets every change of the node's reachability.
    ``head`` names the head's store on the node: its job directories and tmux sessions are
    that head's alone (``launcher.session_name``).
    """

    def __init__(self, node: NodeConfig, cluster: ClusterConfig,
                 on_message: Callable[[str, dict], None],
                 on_state: Callable[[str, NodeState, str], None], head: str = "local"):
        self.node = node
        self.cluster = cluster
        self.head = head
        self.on_message = on_message
        self.on_state = on_state
        self.state = NodeState.CONNECTING
        self._conn: asyncssh.SSHClientConnection | None = None
        self._process: asyncssh.SSHClientProcess | None = None
        self._pending: dict[int, asyncio.Future] = {}
        self._ids = itertools.count(1)
        self._last_heard = 0.0
        self._closed = False
        self._task: asyncio.Task | None = None

    # ------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self._task = asyncio.create_task(self.run(), name=f"node-link-{self.node.name}")

    async def close(self) -> None:
        self._closed = True
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        self._drop()

    async def run(self) -> None:
        delay = RETRY_FIRST_S
        while not self._closed:
            try:
                await self._connect()
                delay = RETRY_FIRST_S
                await self._serve()
                reason = "the node's probe stream ended"
            except asyncio.CancelledError:
                raise
            except Exception as err:  # every failure ends in a reconnect, never a crash
                reason = describe_connect_error(self.node, err)
            self._drop()
            if self._closed:
                return
            # A node that never answered is down; one that went silent is unknown (R15).
            self._set_state(NodeState.UNKNOWN if self.state in (NodeState.UP, NodeState.UNKNOWN)
                            else NodeState.DOWN, reason)
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_CAP_S)

    async def _connect(self) -> None:
        node, cluster = self.node, self.cluster
        options = {"known_hosts": known_hosts(node.known_hosts), "username": node.user,
                   "connect_timeout": cluster.connect_timeout, "keepalive_interval": 15,
                   "encryption_algs": list(encryption_preference())}
        if node.identity:
            options["client_keys"] = [node.identity]
        async def handshake() -> asyncssh.SSHClientConnection:
            async with handshake_turn():
                return await asyncssh.connect(node.host, node.port, **options)

        self._conn = await within(cluster.connect_timeout, handshake())
        source = shipping.payload()
        settings = {"interval": cluster.probe_interval, "conda_lookup": preflight.CONDA_LOOKUP,
                    "head": self.head, "tmux_socket": TMUX_SOCKET,
                    "retention_s": cluster.job_dir_retention}
        command = self._with_env(shipping.boot_command(len(source), settings))
        self._process = await self._conn.create_process(command, encoding=None)
        self._process.stdin.write(source)

    def _with_env(self, command: str) -> str:
        """``command`` run in place of the login shell, with the node's ``env`` from
        nodes.yaml (``exec env K=V cmd``: env cannot run the shell's own ``exec``)."""
        env_prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.node.env)
        return f"exec env {env_prefix} {command}" if env_prefix else f"exec {command}"

    async def open_terminal(self, argv: list[str], term_type: str,
                            size: tuple[int, int]) -> asyncssh.SSHClientProcess:
        """A process with a terminal on this node's own connection (``nebula attach``):
        bytes both ways; ``change_terminal_size`` follows the user's window. Raises
        NodeUnavailable when the node is not connected."""
        if self._conn is None or self.state != NodeState.UP:
            raise NodeUnavailable(f"{self.node.name} is {self.state.value}")
        return await self._conn.create_process(
            self._with_env(shlex.join(argv)), term_type=term_type, term_size=size, encoding=None)

    async def run_check(self, command: str, timeout: float) -> str:
        """A short read-only command on this node's connection, with its ``env`` from
        nodes.yaml as the nodelet has it (``nebula doctor``): its output. Raises
        NodeUnavailable when the node is not connected, TimeoutError past ``timeout``."""
        if self._conn is None or self.state != NodeState.UP:
            raise NodeUnavailable(f"{self.node.name} is {self.state.value}")
        done = await within(timeout, self._conn.run(self._with_env(command), check=False))
        return done.stdout if isinstance(done.stdout, str) else ""

    async def _serve(self) -> None:
        assert self._process is not None
        self._last_heard = time.monotonic()
        watchdog = asyncio.create_task(self._watch_heartbeat())
        try:
            while True:
                line = await self._process.stdout.readline()
                if not line:
                    err = (await self._read_stderr()).strip()
                    if "python3" in err and "not found" in err:
                        raise RuntimeError(f"{self.node.name} has no python3 on PATH; "
                                           "NebulaGrid needs python3 (3.6+) on every node")
                    raise RuntimeError(err.splitlines()[-1] if err else "probe stream closed")
                self._last_heard = time.monotonic()
                self._dispatch(line)
        finally:
            watchdog.cancel()

    async def _read_stderr(self) -> str:
        try:
            data = await within(1, self._process.stderr.read(4096))
        except Exception:
            return ""
        return data.decode("utf-8", "replace") if isinstance(data, bytes) else data

    def _dispatch(self, line: bytes) -> None:
        try:
            message = json.loads(line)
        except ValueError:
            log.warning("%s sent a line that is not JSON: %r", self.node.name, line[:200])
            return
        kind = message.get("type")
        if kind == "reply":
            future = self._pending.pop(message.get("id"), None)
            if future and not future.done():
                future.set_result(message)
            return
        if kind in ("hello", "probe") and self.state != NodeState.UP:
            self._set_state(NodeState.UP, "")
        self._call(self.on_message, self.node.name, message)

    async def _watch_heartbeat(self) -> None:
        """R15: ``missed_probes`` intervals of silence make the node ``unknown``."""
        limit = self.cluster.probe_interval * self.cluster.missed_probes
        while True:
            await asyncio.sleep(min(1.0, self.cluster.probe_interval / 2))
            silent = time.monotonic() - self._last_heard
            if silent > limit and self.state == NodeState.UP:
                self._set_state(NodeState.UNKNOWN,
                                f"missed {self.cluster.missed_probes} probes ({silent:.0f}s silent)")

    def _set_state(self, state: NodeState, reason: str) -> None:
        self.state = state
        self._call(self.on_state, self.node.name, state, reason)

    def _call(self, callback, *args) -> None:
        """A callback's failure (the head's store refused a write) is the head's to report:
        it must never end this link, which would leave the node unknown until a restart."""
        try:
            callback(*args)
        except Exception:
            log.exception("%s: the head could not take in what the node said", self.node.name)

    def _drop(self) -> None:
        for future in self._pending.values():
            if not future.done():
                future.set_exception(NodeUnavailable(f"{self.node.name}: connection lost"))
        self._pending.clear()
        if self._process is not None:
            with contextlib.suppress(Exception):
                self._process.close()
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
        self._process = None
        self._conn = None

    # -------------------------------------------------------------- requests
    async def request(self, op: str, timeout: float | None = None, **fields) -> dict:
        """Send one request to the nodelet and wait for its reply.

        Raises NodeUnavailable when the node is not connected or the link breaks, and
        asyncio.TimeoutError when it does not answer within ``timeout`` (default: the
        cluster's command_timeout). A request that is not of its op's shape
        (``protocol.REQUESTS``) is the head's own mistake: ValueError, and nothing is sent.
        """
        problems = protocol.request_problems(op, fields)
        if problems:
            raise ValueError("; ".join(problems))
        if self._process is None or self.state != NodeState.UP:
            raise NodeUnavailable(f"{self.node.name} is {self.state.value}")
        request_id = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        payload = json.dumps({"id": request_id, "op": op, **fields}) + "\n"
        try:
            self._process.stdin.write(payload.encode())
            return await within(timeout or self.cluster.command_timeout, future)
        finally:
            self._pending.pop(request_id, None)
