"""The real Slurm the pool tests and ``nebula demo --slurm`` run against (sim/slurm.py):
its nodes and fake GPUs, jobs submitted over the login node's real sshd running as the
user who logged in, accounting, the login node down and back."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time

import asyncssh
import pytest

from nebula_tui.sim import slurm


def login(lab, command: str, timeout: float = 60) -> asyncssh.SSHCompletedProcess:
    """``command`` on the login node as this test's user, the way the head connects (host
    key checked against the lab's known_hosts)."""
    async def go():
        async with asyncssh.connect("127.0.0.1", lab.login_port, known_hosts=str(lab.known_hosts_path),
                                    client_keys=[str(lab.identity_path)], agent_path=None,
                                    username=lab.pool_entry()["user"], config=None) as conn:
            return await conn.run(command, timeout=timeout)


    return asyncio.run(go())


def until(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def test_the_cluster_has_its_nodes_and_fake_gpus(slurm_lab):
    info = json.loads(slurm_lab.cluster.run(["sinfo", "--json"]))
    nodes = {n["name"]: n for n in info["nodes"]}
    assert sorted(nodes) == ["n1", "n2", "n3", "n4"]
    assert all(n["gres"] == "gpu:4" for n in nodes.values())
    assert all(n["partitions"] == [slurm.PARTITION] for n in nodes.values())
    assert slurm_lab.version.startswith(tuple("0123456789"))


def test_a_job_sent_through_the_login_node_runs_as_its_user_with_gpus(slurm_lab, tmp_path):
    out = tmp_path / "job.out"
    tmp_path.chmod(0o777)
    done = login(slurm_lab, f"sbatch --parsable --gres=gpu:2 -o {out} "
                            "--wrap 'id -un; echo gpus=$CUDA_VISIBLE_DEVICES'")
    assert done.exit_status == 0, done.stderr
    job = done.stdout.strip().split(";")[0]
    assert job.isdigit()
    text = until(lambda: out.exists() and "gpus=" in out.read_text() and out.read_text(), 60,
                 "the job's output")
    user, gpus = text.split()
    assert user == slurm_lab.pool_entry()["user"]
    assert gpus == "gpus=0,1"


def test_ended_jobs_are_in_the_accounting(slurm_lab):
    if not slurm_lab.accounting:
        pytest.skip("slurmdbd or MariaDB not installed: sacct has no ended jobs here")
    job = slurm_lab.cluster.sbatch("--parsable", "-o", "/dev/null", "--gres=gpu:1", "--wrap", "exit 3")
    fields = "--format=JobID,State,ExitCode,Elapsed,AllocTRES"

    def row():
        out = slurm_lab.cluster.run(["sacct", "-j", job, "-X", "--parsable2", "--noheader", fields])
        return out.strip() if "FAILED" in out else ""

    job_id, state, exit_code, _elapsed, tres = until(row, 60, "sacct to know the job").split("|")
    assert (job_id, state, exit_code) == (job, "FAILED", "3:0")
    assert "gres/gpu=1" in tres


def test_the_login_node_goes_down_and_comes_back_and_jobs_keep_running(slurm_lab):
    job = slurm_lab.cluster.sbatch("--parsable", "-o", "/dev/null", "--gres=gpu:1", "--wrap", "sleep 30")
    until(lambda: "R" == slurm_lab.cluster.run(["squeue", "-h", "-j", job, "-o", "%t"]).strip(), 60,
          "the job to run")
    slurm_lab.stop_login()
    try:
        with pytest.raises(OSError):
            login(slurm_lab, "true", timeout=5)
        assert slurm_lab.cluster.run(["squeue", "-h", "-j", job, "-o", "%t"]).strip() == "R"
    finally:
        slurm_lab.start_login()
    assert login(slurm_lab, f"squeue -h -j {job} -o %t").stdout.strip() == "R"
    subprocess.run(["scancel", job], env=slurm_lab.env, check=True, timeout=30)


def test_a_key_nobody_authorised_is_refused(slurm_lab, tmp_path):
    key = asyncssh.generate_private_key("ssh-ed25519")
    (tmp_path / "key").write_bytes(key.export_private_key())

    async def go():
        async with asyncssh.connect("127.0.0.1", slurm_lab.login_port,
                                    known_hosts=str(slurm_lab.known_hosts_path),
                                    client_keys=[str(tmp_path / "key")], agent_path=None,
                                    username=slurm_lab.pool_entry()["user"], config=None):
            pass


    with pytest.raises(asyncssh.PermissionDenied):
        asyncio.run(go())
