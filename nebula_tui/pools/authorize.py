"""What a lab user adds on a cluster's login node so that the head may log in there as them
(``user: submitter`` pools): the ``authorized_keys`` line of the head's key, restricted to the
head's address, and what identifies it for revoking.

The head computes this view (it alone can read its key); ``nebula pool authorize`` prints it.
"""

from __future__ import annotations

import contextlib
import socket

from ..config.pools import PoolConfig
from ..wire import PoolAuthorize

#: OpenSSH's ``restrict``: no terminal, no port, agent or X11 forwarding, no ~/.ssh/rc —
#: commands only, all the head runs there (sbatch, squeue, sinfo, sacct, scancel, tail).
RESTRICTIONS = "restrict"


def head_address(host: str, port: int, resolve: bool = True) -> str | None:
    """The address this machine sends from to reach ``host`` (what the login node sees,
    unless a NAT stands between): the local end of a UDP socket aimed there, nothing sent.
    None when ``host`` does not resolve or no route leads there. Resolving a name may
    block: off the event loop, or ``resolve=False`` (an address only, never a name)."""
    flags = 0 if resolve else socket.AI_NUMERICHOST
    with contextlib.suppress(OSError, UnicodeError):
        family, _, _, _, where = socket.getaddrinfo(host, port, proto=socket.IPPROTO_UDP,
                                                    flags=flags)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect(where)
            address: str = probe.getsockname()[0]
            return address
    return None


def authorized_keys_line(public_key: str, address: str | None) -> str:
    """``from="ADDRESS",restrict KEY`` (only ``restrict`` when the address is unknown)."""
    options = f'from="{address}",{RESTRICTIONS}' if address else RESTRICTIONS
    return f"{options} {public_key.strip()}"


def authorize_view(config: PoolConfig, public_key: str | None, address: str | None) -> PoolAuthorize:
    """What ``nebula pool authorize NAME`` shows for pool ``config``: for a submitter pool
    the line each user adds (``line``), the key's comment that marks it for revoking; for a
    pool with one account, who logs in (nothing for a user to add)."""
    view: PoolAuthorize = {"pool": config.name, "host": config.host, "port": config.port,
            "per_submitter": config.per_submitter,
            "account": None if config.per_submitter else config.user,
            "address": address, "line": None, "comment": None}
    if config.per_submitter and public_key:
        words = public_key.split()
        view["line"] = authorized_keys_line(" ".join(words[:3]), address)
        view["comment"] = words[2] if len(words) > 2 else None
    return view
