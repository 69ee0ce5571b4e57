"""Who a pool's jobs run as on a shared head: each member as themselves (``user:
submitter``), one account only where the admin wrote ``shared_account: true``, never root —
the demo's own pool included."""

from __future__ import annotations

import yaml

from nebula_tui.cli.demo import shared_config
from nebula_tui.config.cluster import parse_config
from nebula_tui.head.serve import shared_mode_refusal
from support.samples import GOOD_POOL_CONFIG as GOOD

# the cluster and node of GOOD_POOL_CONFIG, shared, with one pool to vary
BASE = GOOD.split("pools:")[0].replace("cluster:\n", "cluster:\n  run_as: submitter\n") + """pools:
  - name: hpc
    kind: slurm
    host: login.hpc.example.edu
"""


def test_a_pool_with_one_account_needs_the_admins_explicit_yes():
    refused = shared_mode_refusal(parse_config(BASE + "    user: gpulab\n", "nodes.yaml"))
    assert refused and "pool hpc runs every member's job as one account (gpulab)" in refused
    assert "shared_account: true" in refused and "\n" not in refused
    assert shared_mode_refusal(parse_config(BASE + "    user: submitter\n", "nodes.yaml")) is None
    assert shared_mode_refusal(parse_config(BASE + "    user: gpulab\n    shared_account: true\n",
                                            "nodes.yaml")) is None


def test_a_pool_logging_in_as_root_is_refused_even_when_shared():
    config = parse_config(BASE + "    user: root\n    shared_account: true\n", "nodes.yaml")
    assert "pool hpc logs in as root" in shared_mode_refusal(config)


def test_the_demos_shared_config_runs_pool_jobs_as_their_owners(tmp_path):
    lab = tmp_path / "nodes.yaml"
    lab.write_text(yaml.safe_dump({
        "cluster": {"name": "demo", "user": "root", "identity": "/lab/id"},
        "nodes": [{"name": "node01", "host": "127.0.0.1"}],
        "pools": [{"name": "hpc", "kind": "slurm", "host": "127.0.0.1", "user": "root",
                   "identity": "/lab/slurm/id"}]}))
    shared = parse_config(shared_config(lab).read_text(), "nodes-shared.yaml")
    assert shared.pools[0].per_submitter and shared.pools[0].identity is None
    assert shared_mode_refusal(shared) is None


def test_a_pool_token_is_known_for_this_heads_own_and_no_made_up_or_other_heads_one():
    """Comments are public on a cluster: a restored head adopts a job only for a token whose
    mark only its store's key makes."""
    from nebula_tui.head.pool_books import issued_job, mint_token
    from nebula_tui.model import Job, JobSpec

    key, other = b"k" * 64, b"o" * 64
    job = Job(7, "alice", JobSpec(command=("true",)), 0.0)
    token = mint_token(key, "abc123", job)
    assert token.startswith("abc123.7.0.") and issued_job(key, "abc123", token) == 7
    assert mint_token(key, "abc123", job) != token  # salted: each send its own
    body, mark = token.rsplit(".", 1)
    for forged in (f"abc123.7.0.{'ab' * 12}",                # made up, with this head's prefix
                   token.replace(".7.", ".8."),              # another job's number on a real mark
                   f"{body}.{mark[:-1]}{'0' if mark[-1] != '0' else '1'}",
                   f"{body}.{mark[:8]}",                     # an older head's short nonce
                   token + "0", "abc123.7.0", ""):
        assert issued_job(key, "abc123", forged) is None, forged
    assert issued_job(other, "abc123", token) is None  # another store's key
    assert issued_job(key, "def456", token) is None
