"""What every command that talks to the service shares: the connection (found or started),
and printing its answer as text or, with ``--json``, as JSON."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from ..api import Client
from ..client.service import connect
from ..homedir import Home
from ..printable import printable_tree


def service_client(home: Home, config: str | None) -> Client:
    """A client of ``home``'s service (``service.connect``: found, or started)."""
    return connect(home, config)


def show(args: argparse.Namespace, data: Any, text: str | Callable[[Any], str]) -> int:
    """Print ``data`` as JSON with ``--json``, else ``text`` (a string, or a function of
    ``data`` giving one)."""
    if getattr(args, "json", False):
        print(json.dumps(data, indent=2))
    else:
        # Every string in it may be another user's or a node's: shown as what it is.
        print(text(printable_tree(data)) if callable(text) else text)
    return 0
