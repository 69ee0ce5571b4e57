"""The head's own resources against a hostile or careless client: its socket, its file
descriptors, its memory and its log."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from labkit.harness import wait_for
from labkit.harness import HeadProcess


def rss_mb(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def connect(path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(30)
    s.connect(str(path))
    return s


def test_a_second_head_never_takes_a_live_heads_socket(head, tmp_path):
    other = HeadProcess(tmp_path / "other", head.lab, socket=head.socket)
    done = subprocess.run([sys.executable, "-m", "nebula_tui", "serve"], env=other.env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert f"another head service answers on {head.socket}" in done.stderr
    assert head.socket.exists() and head.call("ping")["pid"] == head.process.pid


def test_a_stale_socket_is_taken_and_left_alone_when_a_successor_holds_it(openssh_lab, tmp_path):
    path = tmp_path / "run" / "nebula.sock"
    path.parent.mkdir()
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))  # a socket file nothing listens on: its head died
    stale.close()
    first = HeadProcess(tmp_path / "first", openssh_lab, socket=path)
    first.start(wait_nodes=False)
    try:
        assert first.call("ping")["pid"] == first.process.pid
        # An admin moves the path to a new head while the old one still runs (a restart
        # by hand): the old one must not delete the new one's socket when it stops.
        os.rename(path, tmp_path / "run" / "old.sock")
        second = HeadProcess(tmp_path / "second", openssh_lab, socket=path)
        second.start(wait_nodes=False)
        first.stop()
        assert path.exists() and second.call("ping")["pid"] == second.process.pid
        second.stop()
        assert not path.exists()
    finally:
        first.stop()


def test_one_user_cannot_take_every_connection(head):
    held = []
    try:
        for _ in range(64):
            held.append(connect(head.socket))
            held[-1].sendall(b'{"op": "ping"}\n')
            assert json.loads(held[-1].makefile("rb").readline())["ok"]
        extra = connect(head.socket)
        reply = json.loads(extra.makefile("rb").readline())
        assert not reply["ok"] and "64 connections to the head service already" in reply["error"]
        assert extra.recv(1) == b""  # and closed
        extra.close()
    finally:
        for s in held:
            s.close()
    wait_for(lambda: head.call("ping")["ok"], 10, what="a connection again once some closed")


async def test_an_idle_connection_is_closed_and_gives_its_place_back(served, monkeypatch):
    """1,100 idle connections once held the head's descriptors: one that asks nothing for
    the idle timeout is closed, and no longer counts against its user's cap."""
    from nebula_tui.head import server

    monkeypatch.setattr(server, "IDLE_TIMEOUT_S", 0.5)
    monkeypatch.setattr(server, "MAX_CONNECTIONS_PER_USER", 2)
    idle = [await asyncio.open_unix_connection(str(served)) for _ in range(2)]
    reader, _ = await asyncio.open_unix_connection(str(served))
    assert "has 2 connections to the head service already" in json.loads(await reader.readline())["error"]
    for reader, writer in idle:
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the head
        writer.close()
    reader, writer = await asyncio.open_unix_connection(str(served))
    writer.write(b'{"op": "ping"}\n')
    assert json.loads(await asyncio.wait_for(reader.readline(), 5))["ok"]
    writer.close()


@pytest.mark.slow
def test_stalled_subscribers_cost_the_head_a_bounded_amount(head):
    """Five subscriptions that never read while thousands of events flow (the review saw
    the head grow from 60 MB to 763 MB), and one that reads a line now and then: it falls
    more than the bound behind, is not dropped (it reads), and is brought back with a fresh
    snapshot in place of its backlog."""
    stalled = []
    for _ in range(5):
        s = connect(head.socket)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.sendall(b'{"op": "subscribe"}\n')
        stalled.append(s)
    slow = connect(head.socket)
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    slow.settimeout(60)
    slow.sendall(b'{"op": "subscribe"}\n')
    lines = slow.makefile("rb")
    assert json.loads(lines.readline())["type"] == "snapshot"
    before = rss_mb(head.process.pid)

    # The burst waits for a running job (a request no card could serve is refused at submit).
    blocker = head.call("submit", command=["sleep", "600"], gpu_mem_mb=4096, name="blocker")["job"]["id"]

    def burst(n: int):
        with head.client() as client:
            for k in range(300):  # each submit is two events: the job, then its reason
                client.call("submit", command=["true"], after=[blocker], name=f"burst{n}-{k}")

    senders = [threading.Thread(target=burst, args=(n,)) for n in range(4)]
    try:
        for sender in senders:
            sender.start()
        kinds = []
        while any(sender.is_alive() for sender in senders):
            assert rss_mb(head.process.pid) - before < 150
            kinds.append(json.loads(lines.readline()).get("type", "error"))
            time.sleep(2)
        while "snapshot" not in kinds:
            line = lines.readline()
            assert line, f"dropped before its fresh snapshot: {kinds[-5:]}"
            kinds.append(json.loads(line).get("type", "error"))
        assert "resync" not in kinds and "error" not in kinds
        grown = rss_mb(head.process.pid) - before
        assert grown < 150, f"the head grew {grown:.0f} MB"
        assert head.call("ping")["ok"]
    finally:
        for s in stalled + [slow]:
            s.close()
        with head.client() as client:
            for queued in client.call("queue")["jobs"]:
                if queued["name"].startswith("burst"):
                    client.call("cancel", job=queued["id"])
            client.call("cancel", job=blocker)


def test_a_users_long_commands_keep_every_list_of_jobs_short(head):
    """A command may be 256 KB, and one user's hundred waiting jobs made every TUI's snapshot
    25 MB (past the TUI's line limit: its stream failed for everyone) and every `queue` as
    long. Lists show the start of a command; `job` shows it whole."""
    blocker = head.call("submit", command=["sleep", "600"], gpu_mem_mb=4096)["job"]["id"]
    long = ["echo"] + ["x" * 60_000] * 4
    with head.client() as client:
        ids = [client.call("submit", command=long, after=[blocker])["job"]["id"] for _ in range(100)]
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(str(head.socket))
            s.sendall(b'{"op": "subscribe"}\n')
            snapshot = s.makefile("rb").readline()
        assert len(snapshot) < 1 << 20, f"a snapshot of {len(snapshot) >> 20} MB"
        listed = next(j for j in json.loads(snapshot)["jobs"] if j["id"] == ids[0])
        assert listed["command"][0] == "echo" and listed["command"][-1].endswith(
            f"… ({sum(map(len, long)) - 1024:,} more characters; `nebula job {ids[0]}` shows all of it)")
        for op in ("queue", "job_history"):  # each job short, however many the module's tests left
            with head.client() as client:
                listed_jobs = client.call(op)["jobs"]
            assert max(map(len, map(json.dumps, listed_jobs)), default=0) < 8192, op
        assert head.call("job", job=ids[0])["job"]["command"] == long
    finally:
        with head.client() as client:
            for job in ids + [blocker]:
                client.call("cancel", job=job)


def test_a_repeated_log_line_is_written_a_few_times_then_counted():
    """asyncio's accept retry once wrote 13.6 MB of log in 18 s."""
    import io
    import logging

    from nebula_tui.head.serve import RepeatFilter

    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.addFilter(RepeatFilter())
    log = logging.getLogger("test.repeat")
    log.addHandler(handler)
    log.propagate = False
    try:
        for n in range(10_000):
            log.error("socket.accept() out of system resource (%d)", n)
        log.error("another kind of line")
        assert out.getvalue().count("out of system resource") == RepeatFilter.BURST
        assert "another kind of line" in out.getvalue()
    finally:
        log.removeHandler(handler)


async def test_one_user_may_have_so_many_jobs_waiting_or_running(engine, monkeypatch):
    """Every live job is in every list of jobs and every TUI's snapshot: one user submitting
    without end would make them all too long to read."""
    from nebula_tui.head import engine as room
    from nebula_tui.model import JobSpec, RequestError

    monkeypatch.setattr(room, "MAX_LIVE_JOBS_PER_USER", 5)
    waiting = JobSpec(command=("true",))
    first = [engine.submit("alice", waiting) for _ in range(3)]
    with pytest.raises(RequestError, match="alice has 3 jobs waiting or running, and one user may have 5"):
        engine.submit("alice", JobSpec(command=("true",), array="0-2"))
    engine.submit("alice", JobSpec(command=("true",), array="0-1"))
    with pytest.raises(RequestError, match="let some end"):
        engine.submit("alice", waiting)
    assert engine.submit("bob", waiting).user == "bob"  # another user's own count
    await engine.cancel("alice", first[0].id)
    wait = 0
    while engine.state.jobs.per_user["alice"] > 4 and wait < 50:
        await asyncio.sleep(0.1)
        wait += 1
    assert engine.submit("alice", waiting).user == "alice"
