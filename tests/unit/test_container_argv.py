"""The exact argv each container runtime gets for each vendor's cards, from the real run script.

The launcher's ``run.sh`` runs for real with ``sh`` in a job directory, as the nodelet runs
it; ``podman``, ``docker``, ``apptainer`` and ``singularity`` on its PATH are recorders that
write down the argv they were given (the real podman runs in ``test_container_jobs.py``;
docker's daemon and apptainer cannot run on these machines). AMD, Intel and Ascend cards
are found through a stand-in device tree (``NEBULA_DEV_ROOT``): a render node under the
card's PCI address in ``sys/``, the device files in ``dev/``.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest

from nebula_tui.model import Job, JobSpec, Launching, Placement
from nebula_tui.remote.containers import Device
from nebula_tui.remote.launcher import NodeFacts, launch_plan, run_script

RECORDER = r"""
import json, os, sys
name, args = os.path.basename(sys.argv[1]), sys.argv[2:]
with open(os.path.join(os.environ["RECORD_DIR"], name + ".jsonl"), "a") as f:
    f.write(json.dumps(args) + "\n")
given = [v for k, v in zip(args, args[1:]) if k == "-e" and "=" not in v]  # by name
prefix = name.upper() + "ENV_"  # apptainer's and singularity's way
with open(os.path.join(os.environ["RECORD_DIR"], name + ".env"), "w") as f:
    json.dump({**{v: os.environ.get(v) for v in given},
               **{k: v for k, v in os.environ.items() if k.startswith(prefix)}}, f)
if args[:2] in (["image", "exists"], ["image", "inspect"]):
    sys.exit(0 if os.environ.get("RECORD_HAVE_IMAGE") else 1)
if args[:1] == ["pull"] and os.environ.get("RECORD_PULL_FAILS"):
    print("Trying to pull " + args[1] + "...")
    print("Error: initializing source docker://" + args[1] + ": manifest unknown")
    sys.exit(125)
print(name + " ran")
"""

PLACEMENTS = (Placement("GPU-bbbb", "node01", 3, 8192, False),
              Placement("GPU-aaaa", "node01", 1, 8192, False))
UID = f"{os.getuid()}:{os.getgid()}"
JOB_ENV = ["NEBULA_JOB_ID=7", "NEBULA_JOB_NAME=llama", "NEBULA_USER=alice",
           "NEBULA_GPU_LIST=GPU-bbbb,GPU-aaaa", "CUDA_DEVICE_ORDER=PCI_BUS_ID"]
#: the container's name: the job and a digest of its launch token (never the token itself)
NAME = "nebula-7-" + hashlib.sha256(b"ab12.0").hexdigest()[:24]
HEAD = ["run", "--rm", "--name", NAME, "--init", "--network", "host",
        "--shm-size", "8g", "--log-driver", "none", "--pull", "never",
        "--security-opt", "no-new-privileges"]


def make_job(image="pytorch/pytorch:2.1.0-cuda12.1-cudnn8", **spec):
    spec = JobSpec(command=("python", "train.py", "--lr", "3e-4; rm -rf /"), name="llama",
                   gpu_count=2, gpu_mem_mb=8192, image=image, **spec)
    return Job(id=7, user="alice", spec=spec, submitted_at=1.0, status=Launching(PLACEMENTS))


@pytest.fixture
def node(tmp_path):
    """A job directory, recorders on PATH and a stand-in device tree; run(job, …) launches."""
    bin_dir, record, root = tmp_path / "bin", tmp_path / "record", tmp_path / "devroot"
    for d in (bin_dir, record, root / "dev" / "dri"):
        d.mkdir(parents=True)
    (tmp_path / "recorder.py").write_text(RECORDER)
    for name in ("podman", "docker", "apptainer", "singularity"):
        tool = bin_dir / name
        tool.write_text(f'#!/bin/sh\nexec {sys.executable} -S {tmp_path / "recorder.py"} "$0" "$@"\n')
        tool.chmod(0o755)
    for pci, render in (("0000:03:00.0", "renderD128"), ("0000:83:00.0", "renderD129")):
        (root / "sys/bus/pci/devices" / pci / "drm" / render).mkdir(parents=True)
        (root / "dev/dri" / render).touch()
    for name in ("kfd", "davinci1", "davinci3", "davinci_manager", "devmm_svm", "hisi_hdc"):
        (root / "dev" / name).touch()
    (root / "usr/local/Ascend/driver").mkdir(parents=True)
    for d in ("data/llama", "scratch"):  # sources of data mounts: they must exist
        (tmp_path / d).mkdir(parents=True)

    def run(job, devices=None, facts=None, **env):
        jobdir = tmp_path / "job"
        jobdir.mkdir(exist_ok=True)
        (jobdir / "token").write_text("ab12.0")
        facts = facts or NodeFacts("node01", runtimes=("podman", "docker", "apptainer"), root=True)
        (jobdir / "run.sh").write_text(run_script(job, PLACEMENTS, node=facts, devices=devices))
        environ = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(tmp_path),
                   "RECORD_DIR": str(record), "NEBULA_DEV_ROOT": str(root), **env}
        subprocess.run(["sh", str(jobdir / "run.sh"), str(jobdir)], env=environ, timeout=30,
                       capture_output=True)
        calls = {p.stem: [json.loads(line) for line in p.read_text().splitlines()]
                 for p in record.glob("*.jsonl")}
        run.env = {p.stem: json.loads(p.read_text()) for p in record.glob("*.env")}
        for p in [*record.glob("*.jsonl"), *record.glob("*.env")]:
            p.unlink()
        return jobdir, calls

    run.root, run.tmp = root, tmp_path
    return run


def nvidia(*uuids):
    return tuple(Device(u, i, "nvidia") for u, i in zip(uuids, (3, 1)))


def test_podman_nvidia_cdi_devices_env_workdir_mounts_and_user(node):
    data, scratch = node.tmp / "data/llama", node.tmp / "scratch"
    job = make_job(workdir="/workspace", data_mounts=(f"{data}:/workspace/data:ro", f"{scratch}:/scratch"))
    jobdir, calls = node(job, nvidia("GPU-bbbb", "GPU-aaaa"), RECORD_HAVE_IMAGE="1",
                         NEBULA_CONTAINER_PASSENV="HTTP_PROXY")
    assert calls["podman"][0] == ["image", "exists", "pytorch/pytorch:2.1.0-cuda12.1-cudnn8"]
    # The variables by name (their values on no command line), from the runtime's environment.
    assert calls["podman"][1] == ["podman", *HEAD][1:] + [
        "--user", UID, *sum((["-e", kv.split("=")[0]] for kv in JOB_ENV), []),
        "-e", "CUDA_VISIBLE_DEVICES", "-e", "NEBULA_GPU_MEM_MB", "-e", "PYTHONUNBUFFERED",
        "-e", "HTTP_PROXY",  # named by the node's NEBULA_CONTAINER_PASSENV
        "-w", "/workspace", "-v", f"{data}:/workspace/data:ro", "-v", f"{scratch}:/scratch",
        "--device", "nvidia.com/gpu=GPU-bbbb", "--device", "nvidia.com/gpu=GPU-aaaa",
        "pytorch/pytorch:2.1.0-cuda12.1-cudnn8", "python", "train.py", "--lr", "3e-4; rm -rf /"]
    assert node.env["podman"] == {**dict(kv.split("=") for kv in JOB_ENV), "HTTP_PROXY": None,
                                  "CUDA_VISIBLE_DEVICES": "GPU-bbbb,GPU-aaaa",  # the UUIDs inside
                                  "NEBULA_GPU_MEM_MB": "8192", "PYTHONUNBUFFERED": "1"}
    assert (jobdir / "container").read_text().split() == [NAME, "podman"]
    assert int((jobdir / "exit_code").read_text()) == 0


def test_docker_nvidia_gets_one_gpus_flag_with_the_uuids(node):
    job = make_job(image="docker://nvcr.io/nvidia/pytorch:24.01-py3", runtime="docker")
    _, calls = node(job, nvidia("GPU-bbbb", "GPU-aaaa"), RECORD_HAVE_IMAGE="1")
    argv = calls["docker"][1]
    assert argv[:len(HEAD)] == HEAD
    assert argv[argv.index("--gpus"):argv.index("--gpus") + 2] == ["--gpus", '"device=GPU-bbbb,GPU-aaaa"']
    assert "--device" not in argv
    assert argv[-5:] == ["nvcr.io/nvidia/pytorch:24.01-py3", "python", "train.py", "--lr", "3e-4; rm -rf /"]


def test_amd_passes_kfd_and_the_cards_render_nodes_with_their_groups(node):
    devices = (Device("GPU-amd0", 3, "amd", "0000:83:00.0"), Device("GPU-amd1", 1, "amd", "0000:03:00.0"))
    _, calls = node(make_job(), devices, RECORD_HAVE_IMAGE="1")
    argv = calls["podman"][1]
    gid = str(os.getgid())
    root = node.root
    flags = argv[argv.index("--device"):argv.index("pytorch/pytorch:2.1.0-cuda12.1-cudnn8")]
    assert flags == ["--device", f"{root}/dev/kfd:/dev/kfd", "--group-add", gid,
                     "--device", f"{root}/dev/dri/renderD129:/dev/dri/renderD129", "--group-add", gid,
                     "--device", f"{root}/dev/dri/renderD128:/dev/dri/renderD128", "--group-add", gid]
    assert "nvidia.com/gpu" not in " ".join(argv)


def test_intel_passes_only_its_render_node(node):
    _, calls = node(make_job(), (Device("GPU-arc", 0, "intel", "00000000:03:00.0"),), RECORD_HAVE_IMAGE="1")
    argv = calls["podman"][1]
    assert argv.count("--device") == 1
    i = argv.index("--device")
    assert argv[i + 1] == f"{node.root}/dev/dri/renderD128:/dev/dri/renderD128"


def test_ascend_passes_its_davinci_the_managers_and_the_driver_that_exists(node):
    devices = (Device("NPU-3", 3, "ascend"), Device("NPU-1", 1, "ascend"))
    _, calls = node(make_job(), devices, RECORD_HAVE_IMAGE="1")
    argv = calls["podman"][1]
    root = node.root
    devs = [argv[i + 1] for i, a in enumerate(argv) if a == "--device"]
    assert devs == [f"{root}/dev/davinci3:/dev/davinci3", f"{root}/dev/davinci1:/dev/davinci1",
                    f"{root}/dev/davinci_manager:/dev/davinci_manager",
                    f"{root}/dev/devmm_svm:/dev/devmm_svm", f"{root}/dev/hisi_hdc:/dev/hisi_hdc"]
    mounts = [argv[i + 1] for i, a in enumerate(argv) if a == "-v"]
    assert mounts == [f"{root}/usr/local/Ascend/driver:/usr/local/Ascend/driver:ro"]  # only what exists
    assert "-e" in argv and "ASCEND_RT_VISIBLE_DEVICES=3,1" not in argv


def test_a_card_without_a_render_node_fails_the_job_saying_so(node):
    jobdir, calls = node(make_job(), (Device("GPU-amd9", 2, "amd", "0000:09:00.0"),), RECORD_HAVE_IMAGE="1")
    assert (jobdir / "reason").read_text().strip() == \
        "node01 has no render device for GPU 2 (no /sys/bus/pci/devices/0000:09:00.0/drm/renderD*)"
    assert [c[0] for c in calls["podman"]] == ["image"]  # no container was started


def test_apptainer_runs_as_the_user_with_nv_clean_env_binds_and_pwd(node):
    image, data = node.root / "train.sif", node.tmp / "data/llama"
    image.touch()
    job = make_job(image=str(image), workdir="/workspace", data_mounts=(f"{data}:/workspace/data:ro",))
    _, calls = node(job, nvidia("GPU-bbbb", "GPU-aaaa"))
    assert calls["apptainer"] == [[
        "exec", "--cleanenv", "--nv", "--pwd", "/workspace", "--bind", f"{data}:/workspace/data:ro",
        str(image), "python", "train.py", "--lr", "3e-4; rm -rf /"]]
    # the variables as APPTAINERENV_*, which --cleanenv keeps: their values on no command line
    assert node.env["apptainer"] == {f"APPTAINERENV_{k}": v for k, v in [
        *(kv.split("=") for kv in JOB_ENV),
        ("CUDA_VISIBLE_DEVICES", "3,1"),  # --nv shows every card: the node's numbering picks
        ("NEBULA_GPU_MEM_MB", "8192"), ("PYTHONUNBUFFERED", "1")]}
    assert "podman" not in calls  # a .sif needs apptainer, though podman comes first


def test_nebula_job_shows_the_card_variables_as_the_runtime_was_given_them(node):
    """``nebula job`` shows the plan's ``seen_environment``: in podman the cards' UUIDs,
    in apptainer (every card visible) the node's numbers, as each runtime got them."""
    image = node.root / "train.sif"
    image.touch()
    facts = NodeFacts("node01", runtimes=("podman", "docker", "apptainer"), root=True)
    cards = nvidia("GPU-bbbb", "GPU-aaaa")
    for job, runtime, prefix in ((make_job(), "podman", ""),
                                 (make_job(image=str(image)), "apptainer", "APPTAINERENV_")):
        node(job, cards, facts, RECORD_HAVE_IMAGE="1")
        seen = launch_plan(job, PLACEMENTS, node=facts, devices=cards).seen_environment
        assert node.env[runtime][prefix + "CUDA_VISIBLE_DEVICES"] == seen["CUDA_VISIBLE_DEVICES"]
    assert launch_plan(make_job(), PLACEMENTS, node=facts, devices=cards).seen_environment[
        "CUDA_VISIBLE_DEVICES"] == "GPU-bbbb,GPU-aaaa"


def test_through_sudo_the_variables_travel_as_words(node):
    """sudo clears the environment: there the values must be on the runtime's argv."""
    job = make_job(image="/images/train.sif", shell=False)
    facts = NodeFacts("node01", runtimes=("apptainer",), root=False)
    script = run_script(job, PLACEMENTS, ("sudo", "-n", "-u", "alice", "--"), node=facts)
    assert "--env NEBULA_JOB_ID=7" in script and "APPTAINERENV_" not in script


def test_singularity_with_rocm_for_amd_cards(node):
    facts = NodeFacts("node01", runtimes=("singularity",), root=True)
    job = make_job(image="oras://ghcr.io/lab/train:1")
    _, calls = node(job, (Device("GPU-amd0", 0, "amd", "0000:03:00.0"),), facts)
    assert calls["singularity"][0][:3] == ["exec", "--cleanenv", "--rocm"]
    assert calls["singularity"][0][-5] == "oras://ghcr.io/lab/train:1"


def test_a_missing_image_is_pulled_and_a_failed_pull_fails_with_the_runtimes_words(node):
    jobdir, calls = node(make_job(), nvidia("GPU-bbbb"), RECORD_PULL_FAILS="1")
    assert calls["podman"] == [["image", "exists", "pytorch/pytorch:2.1.0-cuda12.1-cudnn8"],
                               ["pull", "pytorch/pytorch:2.1.0-cuda12.1-cudnn8"]]
    assert (jobdir / "reason").read_text().strip() == (
        "pulling pytorch/pytorch:2.1.0-cuda12.1-cudnn8 on node01 failed: initializing source "
        "docker://pytorch/pytorch:2.1.0-cuda12.1-cudnn8: manifest unknown")
    assert int((jobdir / "exit_code").read_text()) == 127
    log = (jobdir / "output.log").read_text()
    assert "nebula: pulling image pytorch/pytorch:2.1.0-cuda12.1-cudnn8" in log  # the phase
    assert not (jobdir / "container").exists()


@pytest.mark.parametrize("facts, asked, why", [
    (NodeFacts("node01", runtimes=("podman",)), "docker", "node01 has no docker (--runtime); it has podman"),
    (NodeFacts("node01", runtimes=()), None,
     "node01 has no container runtime that can run pytorch/pytorch:2.1.0-cuda12.1-cudnn8 "
     "(podman or docker or apptainer or singularity); it has none"),
    (NodeFacts("node01", runtimes=("podman",), runtime="docker"), None,
     "node01 has no docker (nodes.yaml's runtime for node01); it has podman"),
])
def test_a_node_without_the_runtime_fails_the_job_at_once(node, facts, asked, why):
    jobdir, calls = node(make_job(runtime=asked), nvidia("GPU-bbbb"), facts)
    assert (jobdir / "reason").read_text().strip() == why
    assert calls == {}


def test_rootless_podman_maps_the_users_own_uid_and_runs_as_the_submitter(node, tmp_path):
    facts = NodeFacts("node01", runtimes=("podman",), root=False)
    job = make_job()
    script = run_script(job, PLACEMENTS, ("sudo", "-n", "-u", "alice", "--"), node=facts,
                        devices=nvidia("GPU-bbbb"))
    line = next(x for x in script.splitlines() if x.startswith("set -- sudo"))
    assert line.startswith("set -- sudo -n -u alice -- podman run --rm")
    assert "set -- \"$@\" --userns keep-id" in script and "--user \"" not in script
