"""Where the real tool outputs are: ``tests/data/samples`` in this repository, copied
unchanged from the real machines' outputs (each folder's ``SOURCES.md`` says where from),
so a clone of the repository alone runs the tests. ``$NEBULA_SAMPLES`` points elsewhere.
``GOOD_POOL_CONFIG``: a cluster file with one Slurm pool that loads without a complaint."""

from __future__ import annotations

import os
from pathlib import Path

SAMPLES = Path(os.environ.get("NEBULA_SAMPLES") or Path(__file__).resolve().parents[1] / "data" / "samples")

#: A cluster file with one node and one Slurm pool, every pool setting said, that loads cleanly.
GOOD_POOL_CONFIG = """cluster:
  user: nebula
  identity: /keys/id_ed25519
nodes:
  - name: node01
    host: 10.0.0.11
pools:
  - name: hpc
    kind: slurm
    host: login.hpc.example.edu
    user: submitter
    partition: gpu
    account: gpulab
    burst_after: 10m
  - name: proj
    kind: slurm
    host: 10.1.0.5
    port: 2222
    runtime: pyxis
    shards_per_gpu: 4
"""
