"""``nebula pool authorize NAME``: the line a user adds on a cluster's login node so that the
head submits there as them: the head's key, from the head's address only, restricted."""

from __future__ import annotations

from dataclasses import replace

from nebula_tui.config import SUBMITTER, PoolConfig
from nebula_tui.pools.authorize import authorize_view, authorized_keys_line, head_address

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
