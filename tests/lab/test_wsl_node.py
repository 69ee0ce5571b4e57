"""A Windows laptop joined as a WSL2 node, on a simulated lab of its own (real sshd, real
tmux): its RTX 4060 Laptop GPU is served by the Windows driver (572.16; the Linux
nvidia-smi 570.86.16), per-process GPU memory reads [N/A], the kernel is Microsoft's.
Its jobs run with their variables; the memory guard says it cannot judge them there; the
node's page says what is different; a container job that does not take every GPU is
refused with the reason."""

from __future__ import annotations

from dataclasses import replace

import pytest

from labkit.harness import wait_for
from support.labfixtures import serving
from nebula_tui.model import Job, JobSpec, Placement
from nebula_tui.remote import launcher
from nebula_tui.remote.protocol import Hello
from nebula_tui.sim.lab import Lab
from support.head import submitted_id

pytestmark = pytest.mark.lab  # a lab of their own


@pytest.fixture(scope="module")
def wsl(tmp_path_factory):
    lab = Lab(tmp_path_factory.mktemp("wsllab"), layout="wsl", ssh="openssh", probe_interval=1.0)
    lab.prepare()
    lab.start()
    try:
        yield from serving(lab, tmp_path_factory.mktemp("wsl-home"), lab.config_path)
    finally:
        lab.stop()


def test_a_wsl2_nodes_jobs_run_with_their_variables_and_the_guard_says_it_cannot_judge(wsl, tmp_path):
    out = tmp_path / "env.txt"
    done = wsl.run("submit", "--gpu-mem", "4G", "--command",
                   f'env | grep -E "^(CUDA_VISIBLE_DEVICES|NEBULA_GPU_MEM_MB|NEBULA_JOB_ID)=" '
                   f'| sort > {out}; sleep 30', check=True)
    job_id = submitted_id(done.stdout)
    job = wait_for(lambda: (j := wsl.job(job_id))["state"] == "running" and j, 30,
                   what="the job to run on the WSL2 node")
    assert job["gpus"][0]["node"] == "laptop01"
    env = dict(line.split("=", 1) for line in wait_for(lambda: out.exists() and out.read_text(), 10,
                                                       what="the job's variables").splitlines())
    assert env == {"CUDA_VISIBLE_DEVICES": "0", "NEBULA_GPU_MEM_MB": "4096",
                   "NEBULA_JOB_ID": str(job_id)}, env
    said = wait_for(lambda: next((e for e in wsl.call("events", limit=200)["events"]
                                  if "memory guard cannot judge" in e["message"]), None), 20,
                    what="the guard's word")
    assert said["job_id"] == job_id and "laptop01:0" in said["message"]
    log = wait_for(lambda: "cannot judge" in (t := wsl.run("logs", str(job_id)).stdout) and t, 10,
                   what="the guard's line in the job's log")
    assert "per-process GPU memory" in log

    page = wsl.run("node", "show", "laptop01", check=True).stdout
    assert "WSL2 (kernel 5.15.167.4-microsoft-standard-WSL2)" in page
    assert "memory guard cannot judge" in page and "every GPU of the node or none" in page
    card = next(g for g in wsl.call("gpus")["gpus"] if g["node"] == "laptop01")
    assert card["driver_version"] == "572.16" and card["model"] == "NVIDIA GeForce RTX 4060 Laptop GPU"
    wsl.call("cancel", job=job_id)
    wsl.wait_job(job_id)


def test_a_container_job_on_a_wsl2_node_takes_every_gpu_or_is_refused():
    hello = Hello(platform={"kind": "wsl2"}, runtimes={"podman": "/usr/bin/podman"},
                  devices=({"uuid": "GPU-a", "vendor": "nvidia"}, {"uuid": "GPU-b", "vendor": "nvidia"}))
    facts = launcher.node_facts("laptop01", hello)
    assert facts.wsl2_gpus == ("GPU-a", "GPU-b")
    job = Job(id=7, user="alice", spec=JobSpec(command=("nvidia-smi",), image="docker.io/nvidia/cuda:12.8"),
              submitted_at=0.0)
    one = (Placement("GPU-a", "laptop01", 0, 8188, True),)
    script = launcher.run_script(job, one, (), None, facts)
    assert "a WSL2 node, where a container gets every GPU or none" in script
    assert "all 2 of its GPUs (--gpus 2)" in script
    both = one + (Placement("GPU-b", "laptop01", 1, 8188, True),)
    assert "every GPU or none" not in launcher.run_script(job, both, (), None, facts)
    plain = launcher.node_facts("node01", replace(hello, platform={"kind": "linux"}))
    assert plain.wsl2_gpus == () and "every GPU or none" not in launcher.run_script(job, one, (), None, plain)
