"""``nebula serve``: the head service process, and how clients find or start it.

The home directory (``--home`` / ``NEBULA_HOME``, default ``~/.nebula``) holds the store
(``state.db``), the socket (``nebula.sock``), the service's log and its lock. One service
per home: a second one sees the lock and leaves.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import grp
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from typing import TYPE_CHECKING

from .api import ApiError, ApiServer, Client

if TYPE_CHECKING:  # config needs yaml; a client of a running service does not
    from .config import ClusterConfig

log = logging.getLogger(__name__)

START_TIMEOUT_S = 20.0


#: Where the shipped systemd unit (deploy/nebula.service) puts the shared service's socket.
SYSTEM_SOCKET = Path("/run/nebula/nebula.sock")


@dataclass(frozen=True)
class Home:
    """Where one head keeps its state. Everything is derived from the directory.

    The socket is ``--socket`` / ``NEBULA_SOCKET`` when given; else the one under the home
    when that exists or nothing else does; else the system-wide one of a shared box.
    """

    root: Path
    socket_override: Path | None = None

    @classmethod
    def resolve(cls, explicit: str | None, socket: str | None = None) -> "Home":
        root = explicit or os.environ.get("NEBULA_HOME") or "~/.nebula"
        override = socket or os.environ.get("NEBULA_SOCKET")
        return cls(Path(root).expanduser().resolve(),
                   Path(override).expanduser() if override else None)

    @property
    def socket(self) -> Path:
        if self.socket_override:
            return self.socket_override
        own = self.root / "nebula.sock"
        if not own.exists() and SYSTEM_SOCKET.exists():
            return SYSTEM_SOCKET
        return own

    @property
    def db(self) -> Path:
        return self.root / "state.db"

    @property
    def log(self) -> Path:
        return self.root / "serve.log"

    @property
    def lock(self) -> Path:
        return self.root / "serve.lock"

    def ensure(self) -> None:
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)


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


class ServiceUnavailable(Exception):
    """The service is not running and could not be started; str() says why."""


def serve(home: Home, config_path: Path | None, shared_group: str | None = None) -> int:
    """Run the head service in the foreground until SIGTERM/SIGINT. Returns an exit code."""
    from .config import ConfigError, load_config

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
    asyncio.run(_serve(home, config, shared_group))
    return 0


async def _serve(home: Home, config: "ClusterConfig", shared_group: str | None) -> None:
    from .engine import Engine
    from .store import Store

    store = Store(home.db)
    engine = Engine(config, store)
    stop = asyncio.Event()
    server = ApiServer(engine, home.socket, on_shutdown=stop.set, group=shared_group)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await engine.start()
    await server.start()
    log.info("serving %d nodes from %s on %s", len(config.nodes), config.path, home.socket)
    try:
        await stop.wait()
    finally:
        await server.close()
        await engine.stop()
        store.close()


def connect(home: Home, config_arg: str | None, autostart: bool = True) -> Client:
    """A client for the home's service, starting the service in the background if needed.

    Raises ServiceUnavailable (one line) when there is no service and none can start, and
    ConfigError when the cluster file that would start it is broken.
    """
    try:
        return Client(home.socket)
    except ApiError as err:
        if "Permission denied" in str(err):
            # A shared service that this user may not use: starting another helps nobody.
            raise ServiceUnavailable(f"{err}; ask an admin to add you to the lab's group") from None
        if not autostart:
            raise ServiceUnavailable(f"no head service is running for {home.root}") from None
    from .config import find_config, load_config

    config_path = find_config(config_arg, home.root)
    if config_path is None:
        raise ServiceUnavailable(
            "no cluster configured and no service running: start the simulated lab with "
            "`nebula demo --headless`, or give --config nodes.yaml (or NEBULA_CONFIG)")
    load_config(config_path)  # a broken file is the user's to fix: say so here, in one line
    start_background(home, config_path)
    return Client(home.socket)


def start_background(home: Home, config_path: Path, shared_group: str | None = None) -> subprocess.Popen:
    """Start ``nebula serve`` detached (like tmux starts its server) and wait until it answers."""
    home.ensure()
    argv = [sys.executable, "-m", "nebula_tui", "serve", "--home", str(home.root),
            "--config", str(config_path)]
    if home.socket_override:
        argv += ["--socket", str(home.socket_override)]
    if shared_group:
        argv += ["--shared-group", shared_group]
    with open(home.log, "ab") as out:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True,
        )
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        with contextlib.suppress(ApiError):
            Client(home.socket, timeout=2).close()
            return process
        # Exit code 1 means another client's service won the race: wait for that one.
        if process.poll() is not None and process.returncode not in (0, 1):
            raise ServiceUnavailable(_last_error_line(home.log) or
                                     f"nebula serve exited with code {process.returncode}")
        time.sleep(0.05)
    raise ServiceUnavailable(f"nebula serve did not start within {START_TIMEOUT_S:.0f}s; see {home.log}")


def _last_error_line(path: Path) -> str:
    with contextlib.suppress(OSError):
        lines = [l for l in path.read_text(errors="replace").splitlines() if l.strip()]
        if lines:
            return lines[-1].removeprefix("nebula serve: ")
    return ""
