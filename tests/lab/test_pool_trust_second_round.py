"""The pool's second attack round (issue 41): the same real parts as ``test_pool_trust.py``
(the real Slurm of ``slurm_lab`` as pool hpc, its login node's real sshd, real Unix users),
the attacks that round one's fixes left open. docs/security.md lists every attack tried."""

from __future__ import annotations

import re
import shutil
import tempfile
import time
from pathlib import Path

from labkit.harness import wait_for
from test_pool_trust import POLL, pool_line
from test_pools_e2e import wait_state


def _members_pool(openssh_lab, slurm_lab, tmp_path_factory, group: str, members: tuple[str, str],
                  lie: str, **extra):
    """A shared head for ``group`` whose pool hpc runs each member's jobs in their own
    account; the first member's key line runs ``lie`` (a shell script's body, in a public
    folder, given that folder as $1), the second's is plain. Yields (head, folder)."""
    from test_multiuser import lab_users, shared_head

    from nebula_tui.sim.slurmlab import unlock_for_ssh

    first, second = members
    public = Path(tempfile.mkdtemp(prefix="nebula-lies-"))  # pytest's own is root's alone
    public.chmod(0o755)
    script = public / "lie.sh"
    script.write_text(f"#!/bin/sh\nhere={public}\n{lie}\nexec sh -c \"$SSH_ORIGINAL_COMMAND\"\n")
    script.chmod(0o755)
    entry = slurm_lab.pool_entry("hpc", user="submitter", known_hosts=str(slurm_lab.known_hosts_path),
                                 poll_interval=POLL, **extra)
    try:
        for _ in lab_users(group, members, ()):
            for user in members:
                unlock_for_ssh(user)
            for head in shared_head(openssh_lab, tmp_path_factory, group, {"pools": [entry]}):
                key = (head.home / "pool_key.pub").read_text().strip()
                slurm_lab.authorize(first, f'from="127.0.0.1",restrict,command="{script}" {key}')
                slurm_lab.authorize(second, f'from="127.0.0.1",restrict {key}')
                try:
                    yield head, public
                finally:
                    slurm_lab.revoke(first)
                    slurm_lab.revoke(second)
    finally:
        shutil.rmtree(public, ignore_errors=True)


def _submitted(head, user: str, *args: str) -> int:
    from test_multiuser import as_user

    done = as_user(head, user, "submit", "--pool", "hpc", *args)
    assert done.returncode == 0, done.stderr
    return int(re.search(r"job (\d+)", done.stdout).group(1))


def test_one_members_key_line_answering_garbage_stops_nobody_elses_pool_jobs(
        openssh_lab, slurm_lab, tmp_path_factory):
    """Alice's forced command answers sinfo with a cluster of 0-GPU nodes, then squeue with
    200,000-deep JSON. Before: the capacity read in her account (the first sorted) refused
    Bob's `--gpu-count 1` at submit, and her answer made the whole pool degraded, Bob's
    running job frozen and nothing sent for anyone. Now each is her account's alone."""
    alice, bob = "nebgarba", "nebgarbb"  # alice's account sorts first: the old poller
    lie = """case "$SSH_ORIGINAL_COMMAND" in
  sinfo\\ --json*) [ -e "$here/sinfo" ] && { echo '{"nodes":[{"name":"x","gres":"gpu:0","state":"idle"}]}'; exit 0; } ;;
  squeue*) [ -e "$here/squeue" ] && { printf '{"jobs":'; head -c 200000 /dev/zero | tr '\\0' '['; exit 0; } ;;
esac"""
    for head, public in _members_pool(openssh_lab, slurm_lab, tmp_path_factory, "nebgarbage",
                                      (alice, bob), lie):
        hers = _submitted(head, alice, "--", "sleep", "120")
        his = _submitted(head, bob, "--", "sleep", "15")
        wait_state(head, hers, {"running"})
        wait_state(head, his, {"running"})
        (public / "sinfo").touch()
        time.sleep(4)  # four polls with her sinfo in them
        later = _submitted(head, bob, "--gpu-count", "1", "--", "echo", "sent")
        (public / "squeue").touch()
        for job in (his, later):
            ended = wait_state(head, job, {"succeeded", "failed"}, timeout=90)
            assert ended["state"] == "succeeded", ended["reason"]
        line = pool_line(head)
        assert f"as {alice}: " in line and "nests deeper" in line and "degraded" not in line, line
        assert head.job(hers)["state"] == "running"  # hers: left as it is, not ended
        (public / "squeue").unlink()
        wait_for(lambda: f"as {alice}" not in pool_line(head), 30, what="her account answering again")
        head.run("cancel", str(hers), check=True)
