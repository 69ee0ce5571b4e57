"""Where a head keeps its state: ``Home``, which the service (``head/serve.py``) and its
clients (``client/service.py``) both derive every path from.

The home directory (``--home`` / ``NEBULA_HOME``, default ``~/.nebula``) holds the store
(``state.db``), the socket (``nebula.sock``), the service's log and its lock. One service
per home: a second one sees the lock and leaves.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

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

    @property
    def demo_lock(self) -> Path:
        """Held by the demo that runs this home's simulated lab (``nebula demo``); it stays
        once that demo ended, saying the home is a demo's."""
        return self.root / "demo.lock"

    @property
    def demo_lab(self) -> Path:
        """The demo's simulated lab: its nodes.yaml, and ``ready`` while it runs."""
        return self.root / "lab"

    def ensure(self) -> None:
        """Make the home, or tighten an existing one others could read or write (it holds
        the store and the service's log), saying so in one line."""
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        mode = self.root.stat().st_mode & 0o777
        if mode & 0o066 and self.root.stat().st_uid == os.getuid():
            os.chmod(self.root, 0o700)  # a shared head makes it traversable again (0711)
            print(f"nebula: {self.root} was open to other users ({mode:04o}); it is now 0700",
                  file=sys.stderr)
