"""``nebula pool authorize NAME``: the line a user adds on a cluster's login node so that the
head submits there as them — checked against the real sshd of the ``slurm_lab`` login node:
the line lets the head's key in from the head's address only, and deleting it locks it out."""

from __future__ import annotations

import asyncio
import json
import subprocess
from dataclasses import replace
from pathlib import Path

import asyncssh
import pytest
import yaml

from nebula_tui.config.pools import SUBMITTER, PoolConfig
from nebula_tui.pools.authorize import authorize_view, authorized_keys_line, head_address
from labkit.harness import HeadProcess, wait_for
from nebula_tui.sim.slurmlab import unlock_for_ssh

USER = "nebauth"

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJ3CfTfgMxbnlZ5VgKmdRJOkP3DO1Yw3CfOCPLz2ryxV nebula-head@box"


def pool(**kw) -> PoolConfig:
    base = PoolConfig(name="hpc", kind="slurm", host="login.example.edu", port=22,
                      user=SUBMITTER, identity=None, known_hosts="/etc/ssh/ssh_known_hosts")
    return replace(base, **kw)


def test_the_line_names_the_heads_address_and_restricts_the_key():
    view = authorize_view(pool(), KEY, "10.1.2.3")
    assert view["line"] == f'from="10.1.2.3",restrict {KEY}'
    assert view["comment"] == "nebula-head@box" and view["per_submitter"]
    assert authorized_keys_line(KEY, None) == f"restrict {KEY}"


def test_a_pool_with_one_account_has_nothing_to_authorise():
    view = authorize_view(pool(user="gpulab"), KEY, "10.1.2.3")
    assert view["line"] is None and view["account"] == "gpulab" and not view["per_submitter"]


def test_the_heads_address_is_the_one_it_reaches_the_login_node_from():
    assert head_address("127.0.0.1", 22) == "127.0.0.1"
    assert head_address("no-such-host.invalid", 22) is None
    assert head_address("login.example.edu", 22, resolve=False) is None  # no DNS asked


# ---------------------------------------------------------------- against the real login node
@pytest.fixture(scope="module")
def login_user(slurm_lab):
    subprocess.run(["useradd", "-m", USER], capture_output=True)
    unlock_for_ssh(USER)
    try:
        yield USER
    finally:
        slurm_lab.revoke(USER)
        subprocess.run(["userdel", "-r", USER], capture_output=True)


@pytest.fixture(scope="module")
def submitter_head(slurm_lab, tmp_path_factory):
    home = tmp_path_factory.mktemp("authhead")
    entry = slurm_lab.pool_entry("hpc", user="submitter", known_hosts=str(slurm_lab.known_hosts_path),
                                 poll_interval="1s")
    (home / "nodes.yaml").write_text(yaml.safe_dump({"cluster": {"name": "authtest"},
                                                     "pools": [entry]}))
    head = HeadProcess(home, None, config=home / "nodes.yaml")
    head.start(wait_nodes=False)
    try:
        yield head
    finally:
        head.stop()


def can_log_in(slurm_lab, key: Path, user: str) -> bool:
    async def go() -> bool:
        try:
            async with asyncssh.connect("127.0.0.1", slurm_lab.login_port,
                                        known_hosts=str(slurm_lab.known_hosts_path),
                                        client_keys=[str(key)], agent_path=None, username=user,
                                        config=None) as conn:
                done = await conn.run("sinfo --version", timeout=30)
                return done.exit_status == 0 and done.stdout.startswith("slurm")
        except asyncssh.PermissionDenied:
            return False
    return asyncio.run(go())


@pytest.mark.slow
def test_the_printed_line_lets_the_head_in_as_the_user_until_it_is_deleted(
        slurm_lab, login_user, submitter_head):
    done = submitter_head.run("pool", "authorize", "hpc")
    assert done.returncode == 0, done.stderr
    view = json.loads(submitter_head.run("pool", "authorize", "hpc", "--json", check=True).stdout)
    line = view["line"]
    assert line.startswith('from="127.0.0.1",restrict ssh-ed25519 ')
    assert line in done.stdout and "To revoke it, delete that line" in done.stdout
    key = submitter_head.home / "pool_key"
    assert not can_log_in(slurm_lab, key, login_user)  # not authorised yet
    slurm_lab.authorize(login_user, line)
    assert can_log_in(slurm_lab, key, login_user)
    slurm_lab.revoke(login_user)
    assert not can_log_in(slurm_lab, key, login_user)
    # The same key from an address the line does not name is refused.
    slurm_lab.authorize(login_user, line.replace('from="127.0.0.1"', 'from="192.0.2.7"'))
    try:
        assert not can_log_in(slurm_lab, key, login_user)
    finally:
        slurm_lab.revoke(login_user)


def test_an_unknown_pool_is_a_usage_error(submitter_head):
    done = submitter_head.run("pool", "authorize", "nosuch")
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "no pool named 'nosuch'; pools: hpc" in done.stderr


def test_the_pool_key_is_made_once(submitter_head):
    wait_for(lambda: (submitter_head.home / "pool_key.pub").exists(), 10, what="the pool key")
    first = (submitter_head.home / "pool_key.pub").read_text()
    view = json.loads(submitter_head.run("pool", "authorize", "hpc", "--json", check=True).stdout)
    assert first.split()[1] in view["line"]
