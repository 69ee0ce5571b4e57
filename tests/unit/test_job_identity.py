"""No two heads or databases can mistake a job, and no job id is ever handed out twice.

The attacks of the reliability review, repeated on the real lab: a second head (another
home) on the same nodes giving its job the number of the first head's running job; a store
restored from a backup, and one whose WAL was deleted after a crash, handing out numbers
that jobs on the nodes already had; a launch that meets another launch's directory.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from labkit.harness import wait_for
from labkit.harness import HeadProcess
from support.head import running, session_alive, submit


@pytest.mark.slow
def test_a_second_head_on_the_same_nodes_never_touches_the_first_heads_job(openssh_lab, tmp_path):
    first = HeadProcess(tmp_path / "first", openssh_lab)
    second = HeadProcess(tmp_path / "second", openssh_lab)
    first.start()
    second.start()
    try:
        assert first.head_id != second.head_id
        mine = submit(first, "--gpu-mem", "8G", "--", "sh", "-c", "echo from-first; sleep 120")
        node = running(first, mine)["node"]
        # The second head's jobs get the same numbers; pin one onto the same node.
        theirs = [submit(second, "--gpu-mem", "8G", "--", "sh", "-c", "echo from-second")
                  for _ in range(2)]
        assert mine in theirs
        for job in theirs:
            assert second.wait_job(job)["state"] == "succeeded"
            log = second.run("logs", str(job)).stdout
            assert "from-second" in log and "from-first" not in log
        # Its restart (a reconcile of every node) leaves the first head's session alone.
        second.stop()
        second.start()
        time.sleep(2)
        assert first.job(mine)["state"] == "running" and session_alive(first, node, mine)
        assert "from-first" in first.run("logs", str(mine)).stdout
        # The first head's job, seen from the second head, is memory someone else holds.
        gpu = next(g for g in first.call("gpus")["gpus"]
                   if any(s.get("job") == mine for s in g["slices"]))
        other = next(g for g in second.call("gpus")["gpus"] if g["uuid"] == gpu["uuid"])
        wait_for(lambda: next(g for g in second.call("gpus")["gpus"]
                              if g["uuid"] == gpu["uuid"])["unmanaged_used_mb"] >= 8000, 15,
                 what="the other head's job counted as memory in use")
        assert not any(s.get("job") for s in other["slices"])
        assert first.run("cancel", str(mine)).returncode == 0
        assert first.wait_job(mine)["state"] == "cancelled"
    finally:
        first.stop()
        second.stop()


def _backup(db: Path, to: Path) -> None:
    source, target = sqlite3.connect(db), sqlite3.connect(to)
    with target:
        source.backup(target)
    source.close()
    target.close()


@pytest.mark.slow
def test_a_restored_backup_never_hands_out_an_id_again(openssh_lab, tmp_path):
    head = HeadProcess(tmp_path / "home", openssh_lab)
    head.start()
    db = head.home / "state.db"
    try:
        early = submit(head, "--gpu-mem", "4G", "--", "true")
        head.wait_job(early)
        _backup(db, tmp_path / "backup.db")
        late = [submit(head, "--gpu-mem", "4G", "--", "sh", "-c", f"echo late-{n}; sleep 60")
                for n in range(3)]
        late_nodes = {job: running(head, job)["node"] for job in late}
        head.stop()
        shutil.copy(tmp_path / "backup.db", db)  # the admin's restore
        for suffix in ("-wal", "-shm"):
            Path(f"{db}{suffix}").unlink(missing_ok=True)
        head.start()
        new = submit(head, "--gpu-mem", "4G", "--", "sh", "-c", "echo brand-new")
        assert new > max(late), "an id handed out before the restore came back"
        assert head.wait_job(new)["state"] == "succeeded"
        log = head.run("logs", str(new)).stdout
        assert "brand-new" in log and "late-" not in log
        events = " ".join(e["message"] for e in head.call("events", limit=500)["events"])
        assert f"ids up to {max(late)} were handed out" in events
        # The jobs that reached a node after the backup are taken in again, running where
        # they run, and end as they end: none of them runs twice.
        for job, node in late_nodes.items():
            adopted = head.job(job)
            assert (adopted["state"], adopted["node"]) == ("running", node), adopted
            assert session_alive(head, node, job)
            assert head.run("cancel", str(job)).returncode == 0
            assert head.wait_job(job)["state"] == "cancelled"
        assert "after the backup this database was restored from" in " ".join(
            e["message"] for e in head.call("events", limit=500)["events"])
    finally:
        head.stop()


@pytest.mark.slow
def test_a_lost_wal_never_hands_out_an_id_again(openssh_lab, tmp_path):
    head = HeadProcess(tmp_path / "home", openssh_lab)
    head.start()
    db = head.home / "state.db"
    try:
        first = submit(head, "--gpu-mem", "4G", "--", "true")
        sqlite3.connect(db).execute("PRAGMA wal_checkpoint(TRUNCATE)").close()
        # Jobs that never reach a node (their dependency did not fail: they end at the
        # next pass); a request no card could serve would be refused at submit.
        never = ("--after", f"notok:{first}", "--", "true")
        ids = [submit(head, *never) for _ in range(5)]
        head.kill()
        Path(f"{db}-wal").unlink()  # what was written since the checkpoint is gone
        Path(f"{db}-shm").unlink(missing_ok=True)
        head.start()
        assert submit(head, *never) == max(ids) + 1
    finally:
        head.stop()


def test_the_id_file_is_private_and_survives_a_full_store(tmp_path):
    from nebula_tui.store import Store

    store = Store(tmp_path / "state.db")
    floor = tmp_path / "job-ids"
    assert floor.stat().st_mode & 0o777 == 0o600
    store.close()
    floor.write_text("41\n")  # ids up to 41 were handed out by a database now lost
    store = Store(tmp_path / "state.db")
    assert list(store.lost_ids) == list(range(1, 42))
    from nebula_tui.model import JobSpec

    assert store.add_job("alice", JobSpec(command=("true",)), 1.0).id == 42
    store.raise_id_floor(50)  # a node knows job 50 of this store
    assert store.add_job("alice", JobSpec(command=("true",)), 2.0).id == 51
    store.close()
    # Written before the machine last booted: the last write may not have reached the disk,
    # so the reservation forced to it counts.
    floor.write_text("60 120 a-boot-before-this-one\n")
    store = Store(tmp_path / "state.db")
    assert store.add_job("alice", JobSpec(command=("true",)), 3.0).id == 121
    store.close()


# ------------------------------------------------------------------ the nodelet alone
def wrapped(command: str) -> str:
    """The run script the head would send for a job running ``command``."""
    from nebula_tui.model import Job, JobSpec, Launching, Placement
    from nebula_tui.remote.launcher import run_script

    card = (Placement("GPU-x", "n", 0, 4096, False),)
    job = Job(id=4, user="root", spec=JobSpec(command=(command,), shell=True),
              submitted_at=0.0, status=Launching(card))
    return run_script(job, card)


def test_a_launch_never_takes_another_launchs_directory_or_session(nodelet, tmp_path):
    ran = tmp_path / "ran"
    ask = nodelet("aaaa")
    script = f"echo first >> {ran}; sleep 30\n"
    assert ask("launch", job=4, token="aaaa.0.n1", script=script)["ok"]
    wait_for(lambda: ran.exists(), 10, what="the first launch to run")
    # The same number and attempt from another launch (a store that handed 4 out again):
    # refused, and the running job is left alone.
    refused = ask("launch", job=4, token="aaaa.0.n2", script=f"echo second >> {ran}\n")
    assert not refused["ok"] and "another launch" in refused["error"]
    # A launch of an earlier attempt than the node has: refused too (a head behind the node).
    assert ask("launch", job=4, token="aaaa.1.n3", script=wrapped(f"echo third >> {ran}; sleep 30"))["ok"]
    behind = ask("launch", job=4, token="aaaa.0.n1", script=script)
    assert not behind["ok"] and "older than the node" in behind["error"]
    # A cancel for an attempt that is no longer the session's does nothing to it.
    assert ask("cancel", job=4, token="aaaa.0.n1", grace=0)["ok"]
    listing = ask("list")
    assert listing["session_tokens"]["4"] == "aaaa.1.n3"
    assert set(listing["attempts"]["4"]) == {"0", "1"}
    # Another head's nodelet sees none of it, and its job 4 runs beside.
    other = nodelet("bbbb")
    assert other("list")["jobs"] == {}
    assert other("launch", job=4, token="bbbb.0.x", script=f"echo other >> {ran}\n")["ok"]
    wait_for(lambda: "other" in ran.read_text(), 10, what="the other head's job 4")
    assert ask("list")["session_tokens"]["4"] == "aaaa.1.n3"
    assert sorted(ran.read_text().split()) == ["first", "other", "third"]
    # Nothing of a job's directory is readable by anyone but the node's login account.
    root = tmp_path / "node" / "heads" / "aaaa" / "jobs" / "4" / "1"
    wait_for(lambda: (root / "started").exists(), 10, what="the wrapper's start mark")
    for path in (tmp_path / "node", root, root / "output.log", root / "started", root / "token",
                 root / "run.sh"):
        assert path.stat().st_mode & 0o077 == 0, path
    ask("cancel", job=4, grace=0)


def test_a_launch_cut_short_before_its_token_leaves_nothing_that_blocks_the_next(nodelet, tmp_path):
    """A nodelet killed with its head between making an attempt's directory and writing its
    token started nothing: the next head's launch of that attempt runs (the chaos test once
    saw it refused as "another launch (token None)")."""
    ran = tmp_path / "ran"
    ask = nodelet("dddd")
    cut_short = tmp_path / "node" / "heads" / "dddd" / "jobs" / "5" / "0"
    cut_short.mkdir(mode=0o700, parents=True)
    assert ask("launch", job=5, token="dddd.0.n2", script=wrapped(f"echo ran >> {ran}"))["ok"]
    wait_for(lambda: (cut_short / "exit_code").exists(), 10, what="the job to run and end")
    assert ran.read_text() == "ran\n"
    # A directory with the wrapper's marks but no token is not taken: something ran there.
    (tmp_path / "node" / "heads" / "dddd" / "jobs" / "6" / "0").mkdir(mode=0o700, parents=True)
    (tmp_path / "node" / "heads" / "dddd" / "jobs" / "6" / "0" / "started").write_text("1")
    refused = ask("launch", job=6, token="dddd.0.n3", script=wrapped(f"echo six >> {ran}"))
    assert not refused["ok"] and "another launch (token None" in refused["error"]


def test_acknowledged_directories_go_after_the_retention(nodelet, tmp_path):
    ask = nodelet("cccc", retention_s=1)
    jobs = tmp_path / "node" / "heads" / "cccc" / "jobs"
    for job in (8, 9):
        assert ask("launch", job=job, token=f"cccc.0.z{job}", script=wrapped("true"))["ok"]
        wait_for(lambda: (jobs / str(job) / "0" / "exit_code").exists(), 10, what="the job to end")
    assert ask("ack", jobs=[[9, "cccc.0.z9"], [8, "cccc.0.wrong"]])["ok"]
    assert (jobs / "9" / "0" / "acked").exists() and not (jobs / "8" / "0" / "acked").exists()
    time.sleep(1.5)
    uncollected = jobs / "8" / "0" / "exit_code"
    os.utime(uncollected)  # it ended just now, however slow this machine was meanwhile
    nodelet("cccc", retention_s=1)  # a nodelet cleans when it starts, then hourly
    wait_for(lambda: not (jobs / "9").exists(), 10, what="the acknowledged job's directory to go")
    assert uncollected.exists(), "an exit nobody recorded is kept"
    long_ago = time.time() - 4.5  # four retentions and more: its head is not coming back
    os.utime(uncollected, (long_ago, long_ago))
    nodelet("cccc", retention_s=1)
    wait_for(lambda: not (jobs / "8").exists(), 10, what="the uncollected exit's directory to go")


def _held_lock(path: Path) -> int:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def _waiting_on(path: Path) -> bool:
    """Whether some process waits for the flock of the file at ``path`` (/proc/locks lists
    a waiter as "N: -> FLOCK ... <major>:<minor>:<inode> ...")."""
    inode = f":{path.stat().st_ino} "
    return any("->" in line and inode in line for line in Path("/proc/locks").read_text().splitlines())


def test_the_cleaner_leaves_a_job_whose_launch_holds_its_lock(nodelet, tmp_path):
    head = tmp_path / "node" / "heads" / "eeee"
    for job in ("12", "13"):  # job directories whose attempts are not made yet
        (head / "jobs" / job).mkdir(mode=0o700, parents=True)
    launching = _held_lock(head / "locks" / "12")
    try:
        nodelet("eeee")  # a nodelet cleans when it starts
        wait_for(lambda: not (head / "jobs" / "13").exists(), 10, what="the free job's directory to go")
        assert (head / "jobs" / "12").is_dir(), "a launch's directory was removed under it"
    finally:
        os.close(launching)
    nodelet("eeee")
    wait_for(lambda: not (head / "jobs" / "12").exists(), 10, what="its directory to go once free")
    assert not (head / "locks" / "12").exists()


def test_a_launch_waiting_on_a_lock_the_cleaner_removed_takes_the_new_one(nodelet, tmp_path):
    lock = tmp_path / "node" / "heads" / "ffff" / "locks" / "14"
    old = _held_lock(lock)
    ask = nodelet("ffff")
    replies = []
    launch = threading.Thread(target=lambda: replies.append(ask(
        "launch", job=14, token="ffff.0.q14", script=wrapped("true"))))
    launch.start()
    wait_for(lambda: _waiting_on(lock), 10, what="the launch to wait on the old file")
    lock.unlink()
    new = _held_lock(lock)  # another launch of the job holds the file now at that path
    os.close(old)
    launch.join(0.5)
    try:
        assert launch.is_alive(), "the launch went ahead while the job's lock was held"
    finally:
        os.close(new)
    launch.join(10)
    assert replies and replies[0]["ok"], replies


def test_a_running_job_its_node_has_no_record_of_ends_at_the_next_reconcile(openssh_lab, tmp_path):
    head = HeadProcess(tmp_path / "home", openssh_lab)
    head.start()
    try:
        job = submit(head, "--gpu-mem", "4G", "--", "sleep", "120")
        node = running(head, job)["node"]
        head.kill()
        head.tmux(node, "kill-session", "-t", f"={head.session(job)}")
        shutil.rmtree(openssh_lab.node_dir(node) / "node" / "heads" / head.head_id / "jobs" / str(job))
        head.start()
        ended = head.wait_job(job)
        assert ended["state"] == "failed" and f"{node} has no record of its launch" in ended["reason"]
        assert not any(g for g in head.call("gpus")["gpus"]
                       if any(s.get("job") == job for s in g["slices"]))
    finally:
        head.stop()
