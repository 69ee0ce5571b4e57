"""A damaged or lost database: the head refuses to start over it, keeps backups, and a
restored backup (or an explicitly empty database) takes in what the nodes still run.

The head is the real ``nebula serve`` on the real lab (sshd, tmux); the database is damaged
as a disk or an admin would damage it: garbage written over it, or cut to 0 bytes while
jobs ran and the head was killed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from labkit.harness import wait_for
from nebula_tui.backups import Backups
from nebula_tui.model import JobSpec
from labkit.harness import HeadProcess
from nebula_tui.store import Store, head_id_file
from support.head import running, session_alive, submit


def serve_refusal(head: HeadProcess) -> subprocess.CompletedProcess:
    """``nebula serve`` on the head's home, expected to stop at once."""
    return subprocess.run([sys.executable, "-m", "nebula_tui", "serve"], env=head.serve_env,
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


def assert_one_line_refusal(done: subprocess.CompletedProcess, *words: str) -> None:
    assert done.returncode == 3, (done.returncode, done.stderr)  # serve.REFUSED
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    for word in words:
        assert word in lines[0], lines[0]


def serve_without_nodes(tmp_path: Path, home: Path) -> subprocess.CompletedProcess:
    config = tmp_path / "nodes.yaml"
    config.write_text("nodes: []\n")
    env = {**os.environ, "NEBULA_HOME": str(home), "NEBULA_CONFIG": str(config),
           "NEBULA_SOCKET": str(home / "nebula.sock")}
    return subprocess.run([sys.executable, "-m", "nebula_tui", "serve"], env=env,
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


def test_garbage_in_the_database_is_one_line_and_no_traceback(tmp_path):
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    Store(home / "state.db").close()  # the home had a database ...
    (home / "state.db").write_bytes(b"this is not SQLite\n" * 500)  # ... and a disk broke it
    done = serve_without_nodes(tmp_path, home)
    assert_one_line_refusal(done, "state.db", "cannot be read as a database",
                            "there is no backup to restore", "nebula backup --start-empty")
    assert (home / "state.db").read_bytes() == b"this is not SQLite\n" * 500, "it was written over"


def test_a_client_whose_head_refuses_prints_the_heads_line_at_once(tmp_path):
    """`nebula status` over a damaged database waited 20 s and said "nebula serve did not
    start within 20s; see …/serve.log": the head's own line (why, the way out) is what helps."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    Store(home / "state.db").close()
    (home / "state.db").write_bytes(b"this is not SQLite\n" * 500)
    config = tmp_path / "nodes.yaml"
    config.write_text("nodes: []\n")
    env = {**os.environ, "NEBULA_HOME": str(home), "NEBULA_CONFIG": str(config),
           "NEBULA_SOCKET": str(home / "nebula.sock")}
    done = subprocess.run([sys.executable, "-m", "nebula_tui", "status"], env=env, capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    assert "did not start within" not in done.stderr, done.stderr
    assert "cannot be read as a database" in done.stderr and "nebula backup --start-empty" in done.stderr


def test_a_damaged_page_of_the_jobs_is_one_line_at_start(tmp_path):
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    store = Store(home / "state.db")
    for _ in range(3000):  # pages of jobs, past the schema's
        store.add_job("alice", JobSpec(command=("true",), gpu_mem_mb=1024), 1.0, durable=False)
    store.close()
    size = (home / "state.db").stat().st_size
    with open(home / "state.db", "r+b") as broken:
        broken.seek(size // 2)
        broken.write(b"\xff" * 40960)
    done = serve_without_nodes(tmp_path, home)
    assert_one_line_refusal(done, "state.db", "malformed", "nebula backup --start-empty")


def test_garbage_without_the_id_file_is_refused_all_the_same(tmp_path):
    # A database the head never wrote (no id beside it) is not written over either.
    db = tmp_path / "state.db"
    db.write_bytes(os.urandom(8192))
    try:
        Store(db).close()
    except Exception as err:
        assert "cannot be read as a database" in str(err)
    else:
        raise AssertionError("a file of garbage was opened as a database")
    assert not head_id_file(db).exists()


def nebula_backup(env: dict, *args: str) -> subprocess.CompletedProcess:
    """``nebula backup ARGS`` with a login's usual umask (022)."""
    return subprocess.run(["sh", "-c", 'umask 022; exec "$0" -m nebula_tui backup "$@"',
                           sys.executable, *args], env=env, capture_output=True, text=True,
                          timeout=60)


def test_backups_rotate_and_a_damaged_database_rotates_out_no_good_one(tmp_path):
    db = tmp_path / "state.db"
    Store(db).close()
    env = {**os.environ, "NEBULA_HOME": str(tmp_path)}
    made = []
    for _ in range(7):
        done = nebula_backup(env)
        assert done.returncode == 0, done.stderr
        made.append(done.stdout.split()[2])
    kept = [b.path for b in Backups(db).list()]
    assert [str(p) for p in kept] == made[::-1][:5], "the newest five, newest first"
    assert {p.stat().st_mode & 0o777 for p in kept} == {0o600}, "others could read a backup"
    assert (tmp_path / "backups").stat().st_mode & 0o777 == 0o700
    listed = nebula_backup(env, "--list").stdout
    assert all(p.name in listed for p in kept) and "0 running" in listed
    with open(db, "r+b") as broken:  # a page of it overwritten: no sound backup of that
        broken.seek(4096)
        broken.write(os.urandom(4096))
    done = nebula_backup(env)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert "no backup made" in done.stderr
    assert [b.path for b in Backups(db).list()] == kept


def taken_in_again(head: HeadProcess, head_id: str, nodes: dict[int, str], ran: Path) -> None:
    """The restarted head has its old id and the jobs running where they ran, each
    started once (``ran``: the ids the jobs wrote at their start); no id comes back."""
    assert head.head_id == head_id
    for job, node in nodes.items():
        found = wait_for(lambda: (f := head.job(job))["state"] == "running" and f, 30,
                         what=f"job {job} taken in again")
        assert found["node"] == node and session_alive(head, node, job)
    assert sorted(int(x) for x in ran.read_text().split()) == sorted(nodes)
    assert submit(head, "--gpu-mem", "4G", "--", "true") > max(nodes)


def cancel_all(head: HeadProcess, jobs: list[int], ran: Path) -> None:
    for job in jobs:
        assert head.run("cancel", str(job)).returncode == 0
        assert head.wait_job(job)["state"] == "cancelled"
    assert sorted(int(x) for x in ran.read_text().split()) == sorted(jobs), "one ran twice"


def _lose_the_database(head: HeadProcess) -> None:
    """SIGKILL the head, then cut its database to 0 bytes (its WAL goes too)."""
    head.kill()
    db = head.home / "state.db"
    os.truncate(db, 0)
    for suffix in ("-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)


def test_a_truncated_database_is_refused_and_a_backup_takes_in_what_runs(openssh_lab, tmp_path):
    head = HeadProcess(tmp_path / "home", openssh_lab)
    ran, gate = tmp_path / "ran.txt", tmp_path / "gate"
    head.start()
    try:
        head_id = head.head_id
        # Three jobs wait (after a gate job) when the backup is taken, and start after it:
        # the backup knows them as waiting, and no id was handed out since.
        gated = submit(head, "--gpu-mem", "4G", "--", "sh", "-c",
                       f"while [ ! -e {gate} ]; do sleep 0.2; done")
        running(head, gated)
        jobs = [submit(head, "--gpu-mem", "4G", "--after", str(gated), "--", "sh", "-c",
                       f'echo "$NEBULA_JOB_ID" >> {ran}; sleep 300') for _ in range(3)]
        done = head.run("backup", check=True)
        backup = Path(done.stdout.split()[2])
        held = Backups.summary(next(b for b in Backups(head.home / "state.db").list()
                                    if b.path == backup))
        assert (held["waiting"], held["running"]) == (3, 1), held
        gate.touch()
        nodes = {j: running(head, j)["node"] for j in jobs}
        wait_for(lambda: len(ran.read_text().split()) == 3, 20, what="three jobs started")

        _lose_the_database(head)
        refused = serve_refusal(head)
        assert_one_line_refusal(refused, "state.db is empty (0 bytes)",
                                "nebula backup --restore latest")
        assert (head.home / "state.db").stat().st_size == 0, "the head started over it"
        assert head_id_file(head.home / "state.db").read_text().strip() == head_id

        restored = head.run("backup", "--restore", "latest", check=True).stdout
        assert backup.name in restored
        head.start()
        taken_in_again(head, head_id, nodes, ran)
        assert head.wait_job(gated)["state"] == "succeeded"
        events = " ".join(e["message"] for e in head.call("events", limit=500)["events"])
        assert f"restored from backup {backup.name}" in events
        cancel_all(head, list(nodes), ran)
    finally:
        head.stop()
    # The clean stop made a backup of its own.
    assert Backups(head.home / "state.db").list()[0].path != backup


def test_an_empty_database_started_on_purpose_takes_in_the_running_jobs(openssh_lab, tmp_path):
    head = HeadProcess(tmp_path / "home", openssh_lab)
    ran = tmp_path / "ran.txt"
    head.start()
    try:
        head_id = head.head_id
        jobs = [submit(head, "--gpu-mem", "4G", "--", "sh", "-c",
                       f'echo "$NEBULA_JOB_ID" >> {ran}; sleep 300') for _ in range(3)]
        nodes = {j: running(head, j)["node"] for j in jobs}
        wait_for(lambda: ran.exists() and len(ran.read_text().split()) == 3, 20,
                 what="three jobs started")
        _lose_the_database(head)
        assert_one_line_refusal(serve_refusal(head), "state.db is empty")
        done = head.run("backup", "--start-empty", check=True)
        assert "started an empty database" in done.stdout
        head.start()
        taken_in_again(head, head_id, nodes, ran)
        cancel_all(head, jobs, ran)
    finally:
        head.stop()


def test_restore_refuses_while_the_head_runs(openssh_lab, tmp_path):
    head = HeadProcess(tmp_path / "home", openssh_lab)
    head.start(wait_nodes=False)
    try:
        wait_for(lambda: Backups(head.home / "state.db").list(), 20, what="the first backup")
        for args in (("--restore", "latest"), ("--start-empty",)):
            done = head.run("backup", *args)
            assert done.returncode == 1 and "the head is running" in done.stderr, done.stderr
            assert f"`kill {head.process.pid}`" in done.stderr and "systemctl stop nebula" in done.stderr, done.stderr
        assert head.call("status")
    finally:
        head.stop()


def test_a_restore_sets_the_damaged_database_aside_and_takes_only_this_heads_backup(tmp_path):
    home, other = tmp_path / "home", tmp_path / "other"
    home.mkdir(mode=0o700)
    other.mkdir(mode=0o700)
    Store(home / "state.db").close()
    Store(other / "state.db").close()
    env = {**os.environ, "NEBULA_HOME": str(home)}
    assert nebula_backup(env).returncode == 0
    theirs = Backups(other / "state.db").make()
    (home / "state.db").write_bytes(b"garbage" * 1000)
    refused = nebula_backup(env, "--restore", str(theirs.path))
    assert refused.returncode == 1 and "another head's database" in refused.stderr, refused.stderr
    assert (home / "state.db").read_bytes() == b"garbage" * 1000, "refused, yet it was replaced"
    done = nebula_backup(env, "--restore", "latest")
    assert done.returncode == 0, done.stderr
    aside = [p for p in home.iterdir() if p.name.startswith("state.db.set-aside-")
             and not p.name.endswith(("-wal", "-shm"))]
    assert [p.read_bytes() for p in aside] == [b"garbage" * 1000], "the damaged one was not kept"
    assert (home / "state.db").stat().st_mode & 0o777 == 0o600
    store = Store(home / "state.db")
    try:
        assert store.restore_pending, "the head would schedule before the nodes told what ran"
    finally:
        store.close()


def test_an_empty_start_needs_the_heads_id(tmp_path):
    Store(tmp_path / "state.db").close()
    head_id_file(tmp_path / "state.db").unlink()
    (tmp_path / "state.db").unlink()
    done = nebula_backup({**os.environ, "NEBULA_HOME": str(tmp_path)}, "--start-empty")
    assert done.returncode == 1 and "head-id is missing" in done.stderr, done.stderr
    assert not (tmp_path / "state.db").exists()


def test_backups_made_or_restored_by_root_stay_the_service_accounts(tmp_path):
    """Root runs `nebula backup` and `--restore` on the home of a head that runs as another
    account (here nobody): every file it makes stays that account's, `--list` as that
    account is a table, and a database left root's anyway is one line with the way out at
    the head's start (an exit code the unit does not restart on), never a traceback (issue 41)."""
    import pwd
    import shutil
    import tempfile

    if os.geteuid() != 0:
        import pytest

        pytest.skip("needs root, as an admin's sudo")
    nobody = pwd.getpwnam("nobody")
    place = Path(tempfile.mkdtemp(prefix="nebula-owner-"))
    place.chmod(0o755)
    try:
        home = place / "home"
        home.mkdir(mode=0o700)
        Store(home / "state.db").close()
        for path in [home, *home.rglob("*")]:
            os.chown(path, nobody.pw_uid, nobody.pw_gid)
        config = place / "nodes.yaml"
        config.write_text("nodes: []\n")
        config.chmod(0o644)

        def nebula(*args):  # as root, as an admin's sudo
            return subprocess.run([sys.executable, "-m", "nebula_tui", *args, "--home", str(home)],
                                  capture_output=True, text=True, timeout=60, cwd=Path(__file__).parents[2],
                                  env={**os.environ, "NEBULA_CONFIG": str(config)}, stdin=subprocess.DEVNULL)

        made = nebula("backup")
        assert made.returncode == 0, made.stderr
        restored = nebula("backup", "--restore", "latest")
        assert restored.returncode == 0, restored.stderr
        theirs = [p for p in [home, *home.rglob("*")] if p.stat().st_uid != nobody.pw_uid]
        assert not theirs, f"left root's: {theirs}"
        code, out, err = as_account(nobody, ["backup", "--list", "--home", str(home)], place)
        assert code == 0 and "Traceback" not in err, err
        assert "damaged" not in out and out.count("state-") == 1, out
        # A database left root's all the same (copied in by hand): one line, the way out.
        os.chown(home / "state.db", 0, 0)
        code, out, err = as_account(nobody, ["serve", "--home", str(home), "--config", str(config),
                                             "--socket", str(place / "s.sock")], place)
        assert code == 78, (code, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in err, err
        assert "state.db is root's" in lines[0] and f"chown -R nobody {home}" in lines[0], lines[0]
    finally:
        shutil.rmtree(place, ignore_errors=True)


def as_account(account, argv: list[str], place: Path) -> tuple[int, str, str]:
    """``nebula ARGV`` in a child of this process that became ``account`` (the service
    account), whose Python it could not reach under /root: the modules are loaded first.
    Returns (exit code, stdout, stderr)."""
    import nebula_tui.backups  # noqa: F401
    import nebula_tui.cli.local  # noqa: F401
    import nebula_tui.head.serve  # noqa: F401
    from nebula_tui.cli.main import main

    out, err = place / "out.txt", place / "err.txt"
    pid = os.fork()
    if pid == 0:  # the child: never back into pytest
        code = 70
        try:
            with open(out, "w") as o, open(err, "w") as e:  # root's, opened before the switch
                os.setgroups([])
                os.setgid(account.pw_gid)
                os.setuid(account.pw_uid)
                os.dup2(o.fileno(), 1)
                os.dup2(e.fileno(), 2)
                sys.stdout, sys.stderr = os.fdopen(1, "w", closefd=False), os.fdopen(2, "w", closefd=False)
                code = main(argv)
                sys.stdout.flush()
                sys.stderr.flush()
        except SystemExit as exit:
            code = exit.code if isinstance(exit.code, int) else 1
        except BaseException:
            import traceback

            traceback.print_exc()
            sys.stderr.flush()
            code = 71
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), out.read_text(), err.read_text()
