"""``nebula serve``: the head service process (lock, signals, the socket, the engine).

One service per home: a second one sees the lock and leaves. With ``--shared-group`` the
socket's directory is opened to that Unix group only (``share_socket_dir``). A database the
home had that is gone, emptied or unreadable stops the start with one line and the way out
(``backups.Backups.way_out``); while it serves, the head keeps backups of it (hourly and at a
clean stop: ``keep_backing_up``).
"""

from __future__ import annotations

import asyncio
import fcntl
import grp
import logging
import os
import signal
import sys
import time
from pathlib import Path

from ..backups import BackupError, Backups
from ..config.cluster import ClusterConfig, load_config
from ..homedir import Home
from ..model import ConfigError, RequestError
from ..node_admin import reload_said
from ..store import DatabaseDamaged, Store, StoreUnavailable
from ..waits import within
from .engine import Engine
from .server import ApiServer, SocketTaken, socket_answers

log = logging.getLogger(__name__)


def share_socket_dir(home: Home, group: str) -> None:
    """Shared-box mode: members of ``group`` may reach the socket, nothing else of the home.

    The socket's directory becomes group-owned 0750; a home holding it becomes traversable
    only (0711) so the database and keys in it stay the service account's alone.
    Raises ValueError for an unknown group.
    """
    try:
        gid = grp.getgrnam(group).gr_gid
    except KeyError:
        raise ValueError(f"no Unix group '{group}'; create it (groupadd {group}) or pick another") from None
    folder = home.socket.parent
    folder.mkdir(mode=0o750, parents=True, exist_ok=True)
    if folder == home.root:
        os.chmod(folder, 0o711)
    else:
        os.chown(folder, -1, gid)
        os.chmod(folder, 0o750)
        if folder.parent == home.root:
            os.chmod(home.root, 0o711)


def shared_mode_refusal(config: ClusterConfig) -> str | None:
    """Why the lab's users may not share a head with this config, or None."""
    if config.run_as != "submitter":
        return ("--shared-group needs `run_as: submitter` in the cluster: section of "
                f"{config.path or 'nodes.yaml'}: with run_as: {config.run_as} every user's job "
                "runs as the nodes' login account, so one user's job could read another's "
                "log, forge its exit code and read that account's SSH keys")
    for pool in config.pools:  # a pool is a node too: each member runs as themselves there
        if pool.user == "root":
            return (f"pool {pool.name} logs in as root: on a shared head every member's pool job "
                    f"would run as root there; give it `user: submitter` in the pools: section "
                    f"of {config.path or 'nodes.yaml'}")
        if not pool.per_submitter and not pool.shared_account:
            return (f"pool {pool.name} runs every member's job as one account ({pool.user}): "
                    "members could read, end and impersonate each other's jobs there; give it "
                    "`user: submitter`, or `shared_account: true` if they may share that account "
                    f"(pools: section of {config.path or 'nodes.yaml'})")
    return None


#: the exit code of a head whose home's files it cannot open: deploy/nebula.service does not
#: restart on it (RestartPreventExitStatus), since only an admin's chown helps
CANNOT_OPEN = 78
#: the exit code of a head that refuses its store (damaged, or a failing disk): its one line
#: says why and the way out, which a client that started it prints at once (1 means another
#: head already serves this home: that client waits for that one instead)
REFUSED = 3


def serve(home: Home, config_path: Path | None, shared_group: str | None = None,
          metrics: tuple[str, int] | None = None) -> int:
    """Run the head service in the foreground until SIGTERM/SIGINT. Returns an exit code.
    ``metrics``: (host, port) to serve Prometheus metrics on."""
    if socket_answers(home.socket):
        print(f"nebula serve: {SocketTaken.at(home.socket)}", file=sys.stderr)
        return 1
    os.umask(0o077)  # the store, its WAL and the logs: the service account's alone
    home.ensure()
    if shared_group:
        try:
            share_socket_dir(home, shared_group)
        except ValueError as err:
            print(f"nebula serve: {err}", file=sys.stderr)
            return 2
    if config_path is None:
        print("nebula serve: no cluster configured; give --config nodes.yaml (or NEBULA_CONFIG), "
              "or run `nebula demo --headless` for the simulated lab", file=sys.stderr)
        return 2
    try:
        config = load_config(config_path)
    except ConfigError as err:
        print(f"nebula serve: {err}", file=sys.stderr)
        return 2
    if shared_group and (refusal := shared_mode_refusal(config)):
        print(f"nebula serve: {refusal}", file=sys.stderr)
        return 2
    backups = Backups(home.db)
    if problem := backups.unusable(home.lock):
        # Not a crash loop: the unit does not restart on this code (an admin must act).
        print(f"nebula serve: {problem}", file=sys.stderr)
        return CANNOT_OPEN
    lock_file = open(home.lock, "w")
    try:
        fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print(f"nebula serve: a service already runs for {home.root}", file=sys.stderr)
        return 1
    lock_file.write(str(os.getpid()))
    lock_file.flush()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("asyncssh").setLevel(logging.WARNING)  # one line per channel otherwise
    for handler in logging.getLogger().handlers:
        handler.addFilter(RepeatFilter())
    try:
        store = Store(home.db)
    except DatabaseDamaged as err:
        print(f"nebula serve: {err}: the head will not start over it; {backups.way_out()}",
              file=sys.stderr)
        return REFUSED
    except StoreUnavailable as err:  # a full or failing disk
        print(f"nebula serve: {err}", file=sys.stderr)
        return REFUSED
    try:
        return asyncio.run(_serve(home, config, store, backups, shared_group, metrics))
    except SocketTaken as err:  # another head took the path between the look and the bind
        print(f"nebula serve: {err}", file=sys.stderr)
        return 1
    except DatabaseDamaged as err:
        print(f"nebula serve: {err}: the head will not go on with it; {backups.way_out()}",
              file=sys.stderr)
        return REFUSED


class RepeatFilter(logging.Filter):
    """At most BURST lines of one kind (logger and first line of the message) per WINDOW_S;
    the next one let through says how many were left out. The log lives on the disk the
    store does: asyncio's accept retry once wrote 13.6 MB of it in 18 s."""

    WINDOW_S = 10.0
    BURST = 5

    def __init__(self) -> None:
        super().__init__()
        self._kinds: dict[tuple[str, str], list] = {}  # kind -> [window start, lines]

    def filter(self, record: logging.LogRecord) -> bool:
        kind = (record.name, str(record.msg).split("\n", 1)[0][:200])
        now = time.monotonic()
        window = self._kinds.setdefault(kind, [now, 0])
        if now - window[0] > self.WINDOW_S:
            left_out = window[1] - self.BURST
            window[:] = [now, 0]
            if left_out > 0 and isinstance(record.args, tuple):
                record.msg = f"{record.msg} (and {left_out} more like this in {self.WINDOW_S:.0f} s, left out)"
        window[1] += 1
        return window[1] <= self.BURST


#: how long a stopping head waits for its node and pool links to close (seconds)
STOP_LINKS_S = 10.0
#: how often the head looks whether a backup is due (``Backups.due``)
BACKUP_LOOK_S = 300.0


async def keep_backing_up(backups: Backups) -> None:
    """A backup whenever the newest is an hour old, off the loop (a failure is logged:
    the head goes on, and tries again at the next look)."""
    while True:
        if backups.due():
            try:
                made = await asyncio.to_thread(backups.make)
                log.info("backup %s made (%d bytes)", made.path, made.size)
            except BackupError as err:
                log.warning("%s", err)
        await asyncio.sleep(BACKUP_LOOK_S)


def backup_at_stop(backups: Backups, store: Store) -> None:
    try:
        made = backups.make(store)
        log.info("backup %s made at the stop", made.path)
    except BackupError as err:
        log.warning("%s", err)


async def reload_on_hangup(engine: Engine) -> None:
    """SIGHUP: read the cluster file again; the log says what changed, or why the file was
    refused (``file:line``), the running configuration staying then."""
    path = engine.config.path
    try:
        result = await engine.reload(engine.state.owner)
    except RequestError as err:
        log.warning("refused %s; the running one stays", err)
        return
    log.info("%s", reload_said(path, result))


async def _serve(home: Home, config: ClusterConfig, store: Store, backups: Backups,
                 shared_group: str | None, metrics: tuple[str, int] | None) -> int:
    engine = Engine(config, store)
    stop = asyncio.Event()
    server = ApiServer(engine, home.socket, on_shutdown=stop.set, group=shared_group)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # systemctl reload (ExecReload sends SIGHUP): nodes.yaml read again, as its owner asks.
    loop.add_signal_handler(signal.SIGHUP, lambda: engine.state.spawn(reload_on_hangup(engine), "reload"))
    if metrics:
        try:
            engine.metrics.serve_http(*metrics)
        except OSError as err:
            print(f"nebula serve: cannot serve metrics on {metrics[0]}:{metrics[1]}: "
                  f"{err.strerror or err}", file=sys.stderr)
            store.close()
            return 2
    try:
        await engine.start()
    except Exception as err:  # a page of the database that cannot be read
        store.close()
        if (damaged := store.damage(err)) is not None:
            raise damaged from None
        raise
    await server.start()
    backing_up = loop.create_task(keep_backing_up(backups))
    log.info("serving %d nodes from %s on %s", len(config.nodes), config.path, home.socket)
    try:
        await stop.wait()
    finally:
        backing_up.cancel()
        engine.metrics.close()
        await server.close()
        try:  # a stop is bounded: systemd, or an admin's kill, waits for no link
            await within(STOP_LINKS_S, engine.stop())
        except asyncio.TimeoutError:
            log.warning("the links did not close within %.0f s; stopping without them", STOP_LINKS_S)
        backup_at_stop(backups, store)
        store.close()
    return 0
