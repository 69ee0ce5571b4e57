"""Two lab members of a shared head whose pool hpc (the real Slurm of ``slurm_lab``) runs
each member's jobs in their own cluster account, the first member's key line a forced
command that answers what a test says: the set-up of the pool's attack rounds
(``tests/lab/test_pool_trust_*round.py``)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from support.slurmfixtures import POLL, squeue


def members_pool(openssh_lab, slurm_lab, tmp_path_factory, group: str, members: tuple[str, str],
                 lie: str, cluster: dict | None = None, **extra):
    """A shared head for ``group`` whose pool hpc runs each member's jobs in their own
    account; the first member's key line runs ``lie`` (a shell script's body, in a public
    folder, given that folder as $here), the second's is plain. ``cluster``: keys of its
    cluster section (``command_timeout``); ``extra``: of the pool's entry. Yields (head,
    folder)."""
    from support.users import lab_users, shared_head

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
            for head in shared_head(openssh_lab, tmp_path_factory, group,
                                    {"pools": [entry], "cluster": cluster or {}}):
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


def sent_with_token_of(head, slurm_lab, job: int) -> list[dict]:
    """The Slurm jobs carrying a token of ``head``'s for ``job`` (by its head's own id: a
    Unix user made by a later test may get an earlier one's uid, and squeue names its
    jobs after the uid)."""
    from nebula_tui.store import Store

    store = Store(head.home / "state.db", readonly=True)
    try:
        prefix = f"{store.head_token}.{job}."
    finally:
        store.close()
    return [j for j in squeue(slurm_lab) if str(j.get("comment", "")).startswith(prefix)]
