"""How clients find the head service, or start it: ``connect``, ``start_background``.

The service itself (``nebula serve``) is ``head/serve.py``; the home both use (where the
store, the socket, the log and the lock are) is ``homedir.Home``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pwd
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, BinaryIO

from .. import homedir
from ..api import ApiError, Client, NoAnswer
from ..homedir import Home

log = logging.getLogger(__name__)

START_TIMEOUT_S = 20.0
#: how long a client that may not start the service (the lab's shared one, another user's)
#: waits for it to come back, after a line saying so
SHARED_WAIT_S = 30.0


class ServiceUnavailable(Exception):
    """The service is not running and could not be started; str() says why."""


def connect(home: Home, config_arg: str | None, autostart: bool = True) -> Client:
    """A client for the home's service, starting the service in the background if needed.

    A service this user may not start (the lab's shared one, or one whose socket or home
    belongs to another user, perhaps restarting this very moment) is waited for instead,
    up to SHARED_WAIT_S, with a line saying so. Raises ServiceUnavailable (one line) when
    there is no service and none can start, and ConfigError when the cluster file that
    would start it is broken.
    """
    try:
        return Client(home.socket)
    except NoAnswer:
        raise  # a head holds the socket but is stopped or stuck: another would not help
    except ApiError as err:
        if err.usage:
            raise  # the client's own settings (NEBULA_TIMEOUT) are wrong
        if "Permission denied" in str(err):
            # A shared service that this user may not use: starting another helps nobody.
            raise ServiceUnavailable(f"{err}; ask an admin to add you to the lab's group") from None
        if not autostart:
            raise ServiceUnavailable(f"no head service is running for {home.root}") from None
    owner = _owner_if_not_mine(home)
    if owner is not None:
        return _wait_for_service(home.socket, f"{owner}'s head service")
    from ..config.cluster import SYSTEM_CONFIG, find_config, load_config

    config_path = find_config(config_arg, home.root)
    if not home.socket_override and (homedir.SYSTEM_SOCKET.parent.is_dir() or config_path == SYSTEM_CONFIG):
        # This box has the lab's shared head (perhaps restarting under systemd this very
        # moment): a private head started here would drive the lab's nodes beside it.
        return _wait_for_service(homedir.SYSTEM_SOCKET, "the lab's head service")
    if demo_lab_gone(home, config_path):
        raise ServiceUnavailable("no head is running and the demo lab is gone; start it with "
                                 "`nebula demo`")
    if config_path is None:
        raise ServiceUnavailable(
            "no cluster configured and no service running: start the simulated lab with "
            "`nebula demo --headless`, or give --config nodes.yaml (or NEBULA_CONFIG)")
    load_config(config_path)  # a broken file is the user's to fix: say so here, in one line
    try:
        start_background(home, config_path)
    except OSError as err:  # a home this user cannot write: no traceback, the reason
        raise ServiceUnavailable(f"cannot start a head service in {home.root}: "
                                 f"{err.strerror or err}") from None
    return Client(home.socket)


def demo_lab_gone(home: Home, config_path: Path | None) -> bool:
    """Whether ``config_path`` is the nodes.yaml of the demo this home ran, and its lab no
    longer runs (stopped: no ``ready``; killed: the pid in it is gone): a head started on
    it would wait on dead nodes for ever."""
    lab = home.demo_lab
    if config_path is None or not home.demo_lock.exists() or \
            Path(config_path).resolve() != (lab / "nodes.yaml").resolve():
        return False
    try:  # the lab process writes it once its nodes answer (sim/lab.py's write_ready)
        pid = int(json.loads((lab / "ready").read_text())["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return True
    return not Path(f"/proc/{pid}").exists()


def _owner_if_not_mine(home: Home) -> str | None:
    """The user whose service this home's socket reaches, when that is not this user: its
    socket's folder, else the home, belongs to them. Such a service is theirs to start."""
    for place in (home.socket.parent, home.root):
        try:
            uid = place.stat().st_uid
        except OSError:
            continue
        if uid == os.getuid():
            return None
        try:
            return pwd.getpwuid(uid).pw_name
        except KeyError:
            return f"uid {uid}"
    return None


def _wait_for_service(path: Path, whose: str) -> Client:
    """A client of the service on ``path`` once it answers again, saying once that it waits."""
    print(f"nebula: {whose} is not answering on {path} (restarting?); waiting up to "
          f"{SHARED_WAIT_S:.0f} s for it", file=sys.stderr, flush=True)
    deadline = time.monotonic() + SHARED_WAIT_S
    while True:
        try:
            return Client(path)
        except NoAnswer:
            raise
        except ApiError as err:
            if "Permission denied" in str(err):
                raise ServiceUnavailable(f"{err}; ask an admin to add you to the lab's group") from None
            if time.monotonic() > deadline:
                raise ServiceUnavailable(
                    f"{whose} does not answer on {path} (waited {SHARED_WAIT_S:.0f} s); try again "
                    "in a moment, or ask an admin to look (systemctl status nebula); a head of "
                    "your own needs a socket of its own (--socket PATH)") from None
        time.sleep(0.2)


def start_background(home: Home, config_path: Path, shared_group: str | None = None,
                     metrics: str | None = None, user: str | None = None) -> subprocess.Popen[bytes]:
    """Start ``nebula serve`` detached (like tmux starts its server) and wait until it answers.
    ``shared_group`` and ``metrics`` (HOST:PORT) are its ``--shared-group`` and ``--metrics``;
    ``user``: the account it runs as (root starting a demo for the user who ran sudo)."""
    home.ensure()
    argv = [sys.executable, "-m", "nebula_tui", "serve", "--home", str(home.root),
            "--config", str(config_path)]
    if home.socket_override:
        argv += ["--socket", str(home.socket_override)]
    if shared_group:
        argv += ["--shared-group", shared_group]
    if metrics:
        argv += ["--metrics", metrics]
    as_user: dict[str, Any] = {}
    if user is not None:
        pw = pwd.getpwnam(user)
        as_user = {"user": pw.pw_uid, "group": pw.pw_gid,
                   "extra_groups": os.getgrouplist(user, pw.pw_gid),
                   "env": {**os.environ, "HOME": pw.pw_dir, "USER": user, "LOGNAME": user}}
    with open_private_log(home.log) as out:
        if user is not None:  # its log is its own, as when it starts itself
            os.fchown(out.fileno(), as_user["user"], as_user["group"])
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True, **as_user,
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


def open_private_log(path: Path) -> BinaryIO:
    """The service's log for appending, readable by its owner alone (it names jobs, users
    and nodes), an older one tightened too."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.fchmod(fd, 0o600)
    return os.fdopen(fd, "ab")


def _last_error_line(path: Path) -> str:
    with contextlib.suppress(OSError):
        lines = [l for l in path.read_text(errors="replace").splitlines() if l.strip()]
        if lines:
            return lines[-1].removeprefix("nebula serve: ")
    return ""
