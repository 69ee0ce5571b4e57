"""A shared box's paths are what their user may reach (issue 30): real Unix users, a shared
head (``run_as: submitter``) and real root podman on the simulated lab.

The mount check runs as the job's user, but a root container runtime opens the source only
later, as root: a user who turns a symlink of their own home towards another user's 0700
home in between would see (and with ``:rw`` write) that user's files. The race is made
certain, not likely: the node's PATH puts the lab's ``bin`` first, and there a ``podman``
that stops at a gate before ``podman run`` (after every check of the job) until the test has
swapped the symlink, then runs the real one.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from labkit.harness import wait_for
from nebula_tui.remote import containers
from support.containers import IMAGE, PROBLEM
from support.users import MALLORY, RUNUSER, VICTOR, as_user, submit_as

pytestmark = pytest.mark.skipif(PROBLEM is not None or shutil.which("runuser") is None,
                                reason=PROBLEM or "needs runuser")

SECRET = "victor-private-notes-7731"
HARMLESS = "mallory-own-notes"


def _as(user: str, *argv: str) -> None:
    subprocess.run([RUNUSER, "-u", user, "--", *argv], check=True, cwd="/", timeout=30)


@pytest.fixture
def homes(box_users):
    """Victor's 0700 home holds a readable directory and note (0755/0644: the home's mode
    is what keeps them private, as on most boxes); Mallory's holds notes of her own and a
    symlink to each, made by her."""
    victor, mallory = Path(f"/home/{VICTOR}"), Path(f"/home/{MALLORY}")
    for user, home in ((VICTOR, victor), (MALLORY, mallory)):
        _as(user, "sh", "-c", f"rm -rf {home}/* && mkdir -m 755 {home}/notes && "
                              f"chmod 700 {home}")
    _as(VICTOR, "sh", "-c", f"echo {SECRET} > {victor}/notes/note.txt && "
                            f"chmod 644 {victor}/notes/note.txt")
    _as(MALLORY, "sh", "-c", f"echo {HARMLESS} > {mallory}/notes/note.txt && "
                             f"ln -s {mallory}/notes {mallory}/dirlink && "
                             f"ln -s {mallory}/notes/note.txt {mallory}/filelink")
    assert subprocess.run([RUNUSER, "-u", MALLORY, "--", "cat", f"{victor}/notes/note.txt"],
                          capture_output=True, cwd="/").returncode != 0  # private indeed
    return mallory, victor


@pytest.fixture
def gate(openssh_lab, tmp_path):
    """A ``podman`` first on every node's PATH that, while ``armed`` exists, stops ``podman
    run`` until ``open`` does (a minute at most), having said ``reached``; then the real one."""
    real = shutil.which("podman", path="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    shims = [openssh_lab.node_dir(name) / "bin" / "podman" for name in openssh_lab.nodes]
    for shim in shims:
        shim.write_text(
            "#!/bin/sh\n"
            f'gate={tmp_path}\n'
            'if [ "$1" = run ] && [ -e "$gate/armed" ]; then\n'
            '  : > "$gate/reached"; i=0\n'
            '  while [ ! -e "$gate/open" ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done\n'
            'fi\n'
            f'exec {real} "$@"\n')
        shim.chmod(0o755)
    (tmp_path / "armed").touch()
    try:
        yield tmp_path
    finally:
        for shim in shims:
            shim.unlink(missing_ok=True)


def test_a_symlink_swapped_after_the_checks_mounts_what_was_checked(box_shared, homes, gate):
    mallory, victor = homes
    job = submit_as(box_shared, MALLORY, "--image", IMAGE, "--gpu-mem", "4G",
                    "--data-mount", f"{mallory}/dirlink:/data/dir:rw",
                    "--data-mount", f"{mallory}/filelink:/data/file:ro",
                    "--command", "cat /data/dir/note.txt /data/file; "
                                 "echo written > /data/dir/left-by-job || echo cannot-write")
    wait_for(lambda: (gate / "reached").exists() or box_shared.job(job)["state"] not in
             ("pending", "launching", "running") or None, 60,
             what="the job's podman run at the gate")
    # Both checks passed on Mallory's own notes: now point the links at Victor's.
    _as(MALLORY, "ln", "-sfn", f"{victor}/notes", f"{mallory}/dirlink")
    _as(MALLORY, "ln", "-sfn", f"{victor}/notes/note.txt", f"{mallory}/filelink")
    (gate / "open").touch()
    ended = box_shared.wait_job(job, 90)
    log = as_user(box_shared, MALLORY, "logs", str(job)).stdout
    assert SECRET not in log, log
    assert not (victor / "notes" / "left-by-job").exists()
    # What was checked is what was mounted: her own notes, writable through :rw.
    assert (ended["state"], ended["exit_code"]) == ("succeeded", 0), (ended, log)
    assert log.count(HARMLESS) == 2, log
    assert (mallory / "notes" / "left-by-job").read_text() == "written\n"


def test_a_symlink_into_another_home_is_refused_as_its_user(box_shared, homes):
    mallory, victor = homes
    _as(MALLORY, "ln", "-sfn", f"{victor}/notes", f"{mallory}/dirlink")
    job = submit_as(box_shared, MALLORY, "--image", IMAGE, "--gpu-mem", "4G",
                    "--data-mount", f"{mallory}/dirlink:/data/dir:ro", "--", "ls", "/data/dir")
    ended = box_shared.wait_job(job, 60)
    assert ended["state"] == "failed"
    assert f"--data-mount's source {mallory}/dirlink does not exist on" in ended["reason"]
    assert f"or {MALLORY} cannot reach it" in ended["reason"]
    assert "note.txt" not in as_user(box_shared, MALLORY, "logs", str(job)).stdout


def test_no_mount_is_left_on_the_node_after_the_job(box_shared, homes, openssh_lab):
    mallory, _ = homes
    job = submit_as(box_shared, MALLORY, "--image", IMAGE, "--gpu-mem", "4G",
                    "--data-mount", f"{mallory}/dirlink:/data/dir:ro", "--", "ls", "/data/dir")
    assert box_shared.wait_job(job, 60)["state"] == "succeeded"
    mounts = Path("/proc/self/mountinfo").read_text()
    assert str(openssh_lab.root) not in mounts and f"{mallory}" not in mounts, mounts
    # nor after a cancel: while it runs its source is bound under its job directory
    job = submit_as(box_shared, MALLORY, "--image", IMAGE, "--gpu-mem", "4G",
                    "--data-mount", f"{mallory}/dirlink:/data/dir:ro", "--", "sleep", "120")
    wait_for(lambda: f"/jobs/{job}/0/mnt/0 " in Path("/proc/self/mountinfo").read_text() or None,
             60, what="the job's source bound at its staging path")
    as_user(box_shared, MALLORY, "cancel", str(job))
    assert box_shared.wait_job(job, 60)["state"] == "cancelled"
    mounts = Path("/proc/self/mountinfo").read_text()
    assert str(openssh_lab.root) not in mounts and f"{mallory}" not in mounts, mounts


def test_the_pin_opens_as_the_user_whatever_checked_before(homes, tmp_path):
    """The wrapper's pin itself refuses a source the user cannot reach (a swap between the
    checks and the pin), mounting nothing; one it can reach is bound and then released."""
    mallory, victor = homes
    _as(MALLORY, "ln", "-sfn", f"{victor}/notes", f"{mallory}/dirlink")
    staging = tmp_path / "mnt"

    def pins(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", containers.PINS_SOURCE, *args],
                              capture_output=True, text=True, timeout=30, cwd="/")
    refused = pins("pin", str(staging), MALLORY, "node01", f"{mallory}/notes", f"{mallory}/dirlink")
    assert refused.returncode == 1
    assert refused.stdout == (f"--data-mount's source {mallory}/dirlink does not exist on node01 "
                              f"(or {MALLORY} cannot reach it)\n")
    assert not staging.exists()
    done = pins("pin", str(staging), MALLORY, "node01", f"{mallory}/notes", f"{mallory}/notes/note.txt")
    try:
        assert done.returncode == 0, done.stdout
        assert (staging / "1").read_text() == f"{HARMLESS}\n"
        assert f" {staging}/0 " in Path("/proc/self/mountinfo").read_text()
    finally:  # never leave a user's directory bound in pytest's temporary tree
        assert pins("release", str(staging)).returncode == 0 and not staging.exists()
    assert str(staging) not in Path("/proc/self/mountinfo").read_text()
    assert (mallory / "notes" / "note.txt").exists()  # released, never deleted through


def test_the_cleaner_detaches_a_left_mount_and_never_deletes_through_it(nodelet, tmp_path):
    """A wrapper killed before its release leaves its source bound under the attempt's
    directory; when the nodelet removes that directory it detaches the mount first, so the
    user's files stay (a plain rmtree would have deleted them through the mount)."""
    data = tmp_path / "users-data"
    data.mkdir()
    (data / "results.csv").write_text("epoch,loss\n")
    ask = nodelet("eeee", retention_s=1)
    jobs = tmp_path / "node" / "heads" / "eeee" / "jobs"
    try:
        assert ask("launch", job=3, token="eeee.0.p1", script='echo 0 > "$1/exit_code"\n')["ok"]
        wait_for(lambda: (jobs / "3" / "0" / "exit_code").exists(), 10, what="the job to end")
        assert ask("ack", jobs=[[3, "eeee.0.p1"]])["ok"]
        # Bound after its end was seen (the watcher releases what it sees end): as a
        # wrapper killed before its release, with no nodelet there to see it, leaves it.
        subprocess.run([sys.executable, "-c", containers.PINS_SOURCE, "pin", str(jobs / "3" / "0" / "mnt"),
                        "root", "node01", str(data)], check=True, capture_output=True, timeout=30)
        assert (jobs / "3" / "0" / "mnt" / "0" / "results.csv").exists()  # bound, not released
        time.sleep(1.5)
        nodelet("eeee", retention_s=1)  # a nodelet cleans when it starts
        wait_for(lambda: not (jobs / "3").exists(), 10, what="the attempt's directory to go")
    finally:
        subprocess.run([sys.executable, "-c", containers.PINS_SOURCE, "release",
                        str(jobs / "3" / "0" / "mnt")], capture_output=True, timeout=30)
    assert (data / "results.csv").read_text() == "epoch,loss\n"
    assert str(jobs) not in Path("/proc/self/mountinfo").read_text()


@pytest.mark.parametrize("how", ["failed-after-the-pin", "killed-after-the-pin"])
def test_a_launch_that_fails_after_its_pin_leaves_no_mount(nodelet, tmp_path, how):
    """A wrapper that pinned its data mounts and then ended without its release (a check
    after the pin failed, or it was killed): the nodelet detaches the staging mount as soon
    as it sees the attempt end, before any ack or retention — not left mounted for days
    (issue 41)."""
    data = tmp_path / "users-data"
    data.mkdir()
    (data / "results.csv").write_text("epoch,loss\n")
    ask = nodelet("ffff", interval=2)  # the watcher looks for gone sessions each interval
    jobs = tmp_path / "node" / "heads" / "ffff" / "jobs"
    pin = f"python3 -c {shlex.quote(containers.PINS_SOURCE)} pin \"$1/mnt\" root node01 {shlex.quote(str(data))}"
    gate = tmp_path / "gate"
    wait = f"while [ ! -e {shlex.quote(str(gate))} ]; do sleep 0.1; done"
    script = (f"{pin}; {wait}; echo 127 > \"$1/exit_code\"\n" if how == "failed-after-the-pin" else
              f"{pin}; {wait}; kill -KILL $$\n")
    try:
        assert ask("launch", job=5, token="ffff.0.p1", script=script)["ok"]
        wait_for(lambda: (jobs / "5" / "0" / "mnt" / "0" / "results.csv").exists(), 30,
                 what="the source bound at its staging path")
        gate.touch()
        wait_for(lambda: not (jobs / "5" / "0" / "mnt").exists(), 30,
                 what="the staging mount released once the attempt ended")
        assert str(jobs) not in Path("/proc/self/mountinfo").read_text()
    finally:
        subprocess.run([sys.executable, "-c", containers.PINS_SOURCE, "release",
                        str(jobs / "5" / "0" / "mnt")], capture_output=True, timeout=30)
    assert (data / "results.csv").read_text() == "epoch,loss\n"
