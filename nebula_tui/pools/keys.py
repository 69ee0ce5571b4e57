"""The head's pool key: what a ``user: submitter`` pool logs in with as each user."""

from __future__ import annotations

import os
from pathlib import Path

import asyncssh

POOL_KEY_NAME = "pool_key"


def head_pool_key(home: Path) -> Path:
    """``home``/pool_key (ed25519, 0600, its ``.pub`` beside it), made the first time it is
    asked for. Written to a temporary name and renamed, so two heads starting at once never
    read half a key."""
    path = Path(home) / POOL_KEY_NAME
    if path.exists() and path.with_suffix(".pub").exists():
        return path
    key = asyncssh.generate_private_key("ssh-ed25519", comment=f"nebula-head@{os.uname().nodename}")
    tmp = path.with_name(f".{POOL_KEY_NAME}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(key.export_private_key())
    pub = path.with_suffix(".pub")
    pub_tmp = pub.with_name(f".{pub.name}.{os.getpid()}")
    pub_tmp.write_bytes(key.export_public_key())
    os.replace(pub_tmp, pub)
    os.replace(tmp, path)
    return path
