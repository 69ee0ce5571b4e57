"""`nebula node add` ends with the smoke test the documents bring a node up with: a 4 GB job
of the vendor's own tool on the new node, whose result and output it prints."""

from __future__ import annotations

import json

import pytest

from support.labfixtures import fingerprint


@pytest.mark.slow
def test_node_add_runs_the_smoke_job_on_the_new_node_and_prints_it(small_cluster, openssh_lab):
    head, port = small_cluster, openssh_lab.port("node03")
    done = head.run("node", "add", "node03", "127.0.0.1", "--port", str(port),
                    "--trust", fingerprint(openssh_lab, "node03"), timeout=240)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("Added node03")
    verdict = next(line for line in lines if line.startswith("Smoke test: job "))
    assert "(nvidia-smi) on node03:" in verdict and "(RTX 3090) succeeded" in verdict
    assert any(line.startswith("  | ") and "NVIDIA-SMI" in line for line in lines)  # its output
    job_id = int(verdict.split()[3])
    job = json.loads(head.run("job", str(job_id), "--json", check=True).stdout)
    assert job["name"] == "smoke-test node03" and job["state"] == "succeeded"
    assert [(g["node"], g["memory_mb"]) for g in job["gpus"]] == [("node03", 4096)]
    assert str(job_id) in head.run("history", "--node", "node03", check=True).stdout.split()

    # As JSON, and skipped on request.
    head.run("node", "remove", "node03", check=True)
    quiet = head.run("node", "add", "node03", "127.0.0.1", "--port", str(port), "--no-smoke",
                     "--trust", fingerprint(openssh_lab, "node03"), "--json", check=True)
    assert "smoke" not in json.loads(quiet.stdout)
    head.run("node", "remove", "node03", check=True)
    again = head.run("node", "add", "node03", "127.0.0.1", "--port", str(port), "--json",
                     "--trust", fingerprint(openssh_lab, "node03"), timeout=240)
    assert again.returncode == 0, again.stderr
    smoke = json.loads(again.stdout)["smoke"]
    assert smoke["ended"] and smoke["job"]["state"] == "succeeded" and "NVIDIA-SMI" in smoke["output"]
