"""A shared head's socket appears with its group's rights: a member's client that connects
the moment a restarted head makes it is served, not refused (the real ``ApiServer``)."""

from __future__ import annotations

import grp
import os
import socket
import stat

import pytest

from nebula_tui.head.server import ApiServer, SocketTaken


async def test_a_shared_heads_socket_is_never_there_without_its_groups_rights(engine, tmp_path, monkeypatch):
    group = grp.getgrgid(os.getgid()).gr_name
    path = tmp_path / "nebula.sock"
    seen: list[int | None] = []  # the path's rights each time the head set some
    set_rights = os.chmod

    def chmod(target, mode, **kw):
        seen.append(stat.S_IMODE(path.stat().st_mode) if path.exists() else None)
        set_rights(target, mode, **kw)

    monkeypatch.setattr(os, "chmod", chmod)
    server = ApiServer(engine, path, group=group)
    await server.start()
    try:
        assert seen == [None], f"the socket was there with rights {seen} before its group's"
        assert stat.S_IMODE(path.stat().st_mode) == 0o660 and path.stat().st_gid == os.getgid()
        assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".sock") and p != path]
        probe = socket.socket(socket.AF_UNIX)
        probe.connect(str(path))
        probe.close()
        with pytest.raises(SocketTaken):
            await ApiServer(engine, path, group=group).start()
    finally:
        await server.close()
    assert not path.exists()
