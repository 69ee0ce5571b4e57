"""nodes.yaml's pools: section: the defaults it takes, and each mistake as file:line."""

from __future__ import annotations

import pytest

from nebula_tui.config.cluster import parse_config
from nebula_tui.model import ConfigError
from support.samples import GOOD_POOL_CONFIG as GOOD


def test_defaults_and_what_is_given():
    hpc, proj = parse_config(GOOD, "nodes.yaml").pools
    assert (hpc.per_submitter, hpc.identity, hpc.burst_after_s, hpc.account) == (True, None, 600.0, "gpulab")
    assert (hpc.max_jobs, hpc.workdir, hpc.runtime, hpc.poll_interval_s, hpc.port) == (50, "~/nebula", "none", 10.0, 22)
    # a project account logs in with the cluster's key, as a node does
    assert (proj.user, proj.identity, proj.port, proj.burst_after_s) == ("nebula", "/keys/id_ed25519", 2222, None)
    assert (proj.runtime, proj.shards_per_gpu) == ("pyxis", 4)


def test_one_user_holds_half_the_places_of_a_pool_several_members_send_to():
    """One member's waiting or held jobs there must not keep the others out: half of
    max_jobs (rounded up) by default where several members send (user: submitter), all of
    them for a project account alone, what the admin writes otherwise."""
    hpc, proj = parse_config(GOOD, "nodes.yaml").pools
    assert (hpc.user_cap, proj.user_cap) == (25, 50)
    text = GOOD.replace("    burst_after: 10m\n", "    burst_after: 10m\n    max_jobs: 5\n    max_jobs_per_user: 4\n")
    assert parse_config(text, "nodes.yaml").pools[0].user_cap == 4


@pytest.mark.parametrize("entry, line, says", [
    ("  - name: hpc\n    kind: k8s\n    host: a", 3, "kind 'k8s' is not a pool kind"),
    ("  - name: hpc\n    host: a", 2, "missing required key 'kind'"),
    ("  - name: hpc\n    kind: slurm", 2, "missing required key 'host'"),
    ("  - name: hpc\n    kind: slurm\n    host: a\n    partition: 'gpu; rm -rf ~'", 5, "not a name Slurm takes"),
    ("  - name: hpc\n    kind: slurm\n    host: a\n    workdir: '~/my dir'", 5, "workdir"),
    ("  - name: hpc\n    kind: slurm\n    host: a\n    user: submitter\n    workdir: /scratch/nebula", 6,
     "one folder for every member"),
    ("  - name: hpc\n    kind: slurm\n    host: -oProxyCommand=x", 4, "is not a hostname"),
    ("  - name: hpc\n    kind: slurm\n    host: a\n    runtime: docker", 5, "pyxis, apptainer, none"),
    ("  - name: hpc\n    kind: slurm\n    host: a\n    max_jobs: 0", 5, "max_jobs must be an integer"),
    ("  - name: hpc\n    kind: slurm\n    host: a\n    burst_after: soon", 5, "burst_after must be a duration"),
    ("  - name: node01\n    kind: slurm\n    host: a", 2, "taken by a node"),
    ("  - name: local\n    kind: slurm\n    host: a", 2, "--pool local"),
    ("  - name: hpc\n    kind: slurm\n    host: a\n  - name: hpc\n    kind: slurm\n    host: b", 5,
     "duplicate pool name 'hpc' (first defined on line 5)"),
])
def test_each_mistake_is_one_line_with_its_place(entry, line, says):
    text = "nodes:\n  - name: node01\n    host: h\npools:\n" + entry
    with pytest.raises(ConfigError) as err:
        parse_config(text, "nodes.yaml")
    assert err.value.line == line + 3 and says in str(err.value), str(err.value)
    assert str(err.value).startswith(f"nodes.yaml:{line + 3}:") and "\n" not in str(err.value)
