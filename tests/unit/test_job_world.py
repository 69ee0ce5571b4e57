"""What a job runs in, end to end on the simulated lab: venvs and conda, the default workdir,
warm-up, and bad input refused at submit. (Containers: ``test_container_jobs.py``.)"""

from __future__ import annotations

import asyncio
import ctypes.util
import json
import os
import shlex
import shutil
import subprocess
import sys

import pytest

from nebula_tui.head.requests import spec_from_request
from nebula_tui.model import RequestError
from nebula_tui.remote.launcher import WARMUP_SOURCE
from nebula_tui.sim import cuda, fake_smi, faults
from labkit.harness import wait_for
from support.head import log, submit


def finished(head, *args, **kw) -> dict:
    """``nebula submit ARGS``, then the job once it has ended (60 s at most)."""
    return head.wait_job(submit(head, *args, **kw), 60)


# ------------------------------------------------------------------ bad input at submit
@pytest.mark.parametrize("flags, words", [
    (["--image", "Pytorch/Pytorch"], "is not an image reference (image names are lower case)"),
    (["--image", "a b"], "is not an image reference"),
    (["--image", "x", "--runtime", "lxc"], "unknown choice 'lxc'; choose from podman"),
    (["--image", "x", "--data-mount", "data:/data"], "must be an absolute path, not 'data'"),
    (["--image", "x", "--data-mount", "/data/../etc:/data"], "must not contain '..'"),
    (["--image", "x", "--data-mount", "/data"], "is not SRC:DST or SRC:DST:ro"),
    (["--image", "x", "--data-mount", "/a:/b:rx"], "is not SRC:DST or SRC:DST:ro"),
    (["--data-mount", "/a:/b"], "--data-mount mounts into a container: add --image"),
    (["--conda", "my env"], "is not a conda env name"),
    (["--conda", "torch", "--venv", "/v"], "--conda and --venv both activate"),
    (["--image", "x", "--conda", "torch"], "a job with --image runs in the image's own"),
])
def test_bad_world_flags_are_one_line_at_submit_with_exit_2(tmp_path, flags, words):
    env = dict(os.environ, NEBULA_HOME=str(tmp_path), NEBULA_SOCKET=str(tmp_path / "none.sock"))
    done = subprocess.run([sys.executable, "-m", "nebula_tui", "submit", *flags, "--", "true"],
                          capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and words in done.stderr, done.stderr
    assert not (tmp_path / "nebula.db").exists()  # nothing was started or stored


@pytest.mark.parametrize("fields, words", [
    ({"image": "UPPER"}, "--image"), ({"runtime": "lxc", "image": "x"}, "--runtime"),
    ({"image": "x", "data_mounts": ["/a:b"]}, "--data-mount"),
    ({"image": "x", "data_mounts": "/a:/b"}, "once per mount"),
    ({"venv": "relative"}, "--venv must be an absolute path"),
    ({"submit_dir": "/a/\n/b"}, "the submit directory"),
])
def test_the_service_refuses_the_same_with_the_same_sentence(fields, words):
    with pytest.raises(RequestError, match=words.replace("-", r"\-")):
        spec_from_request({"command": ["true"], **fields})


# ------------------------------------------------------------------ venv and conda
def test_a_venv_is_activated_before_the_command(head, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    job = finished(head, "--venv", str(venv), "--", "python", "-c",
                 "import os, sys; print(sys.prefix); print(os.environ['VIRTUAL_ENV'])")
    assert job["state"] == "succeeded", log(head, job["id"])
    assert log(head, job["id"]).split() == [str(venv), str(venv)]


def test_a_missing_venv_fails_at_once_naming_the_node(head, tmp_path):
    job = finished(head, "--venv", str(tmp_path / "nope"), "--", "python", "-c", "print(1)")
    assert job["state"] == "failed" and job["exit_code"] == 127
    assert job["reason"] == (f"{job['node']} has no venv at {tmp_path / 'nope'} (no bin/activate "
                             f"there for root); make it with python3 -m venv {tmp_path / 'nope'}")
    assert not any(job["id"] in g["jobs"] for g in head.call("gpus")["gpus"])  # card freed


CONDA = shutil.which("micromamba") or shutil.which("conda") or shutil.which("mamba")


@pytest.mark.skipif(CONDA is not None, reason="this machine has a conda tool")
def test_conda_without_a_conda_tool_fails_at_once_saying_what_was_looked_for(head):
    job = finished(head, "--conda", "torch", "--", "python", "-c", "print(1)")
    assert job["state"] == "failed"
    assert job["reason"].startswith(f"{job['node']} has no conda, mamba or micromamba for root "
                                    "(looked on PATH and in ~/miniforge3")
    assert job["reason"].endswith("install one there, or use --venv or --image")


@pytest.mark.skipif(CONDA is None, reason="no conda, mamba or micromamba on this machine: no "
                    "registry this project reaches serves one (PyPI's conda stops at 4.3.16 "
                    "of 2017; Debian 12 has none)")
def test_a_conda_env_is_activated_and_a_missing_one_named(head, tmp_path):
    prefix = tmp_path / "envs" / "nebula-test"
    subprocess.run([CONDA, "create", "-y", "-q", "-p", str(prefix)], check=True, timeout=600)
    job = finished(head, "--conda", str(prefix), "--command", "echo $CONDA_PREFIX")
    assert log(head, job["id"]).strip() == str(prefix)
    job = finished(head, "--conda", "no-such-env-xyz", "--", "true")
    assert job["state"] == "failed" and "has no conda env no-such-env-xyz" in job["reason"]


# ------------------------------------------------------------------ workdir
def test_without_workdir_it_runs_where_it_was_submitted_when_the_node_has_it(head, tmp_path):
    here = tmp_path / "project"
    here.mkdir()
    job = finished(head, "--", "pwd", cwd=here)
    assert log(head, job["id"]).strip() == str(here)
    assert (job["submit_dir"], job["workdir_used"]) == (str(here), str(here))  # `nebula job`


def test_else_in_the_home(head, tmp_path):
    # Submitted from a directory the node does not have (another machine's, or removed).
    job = head.call("submit", command=["pwd"], submit_dir=str(tmp_path / "elsewhere"))["job"]
    job = head.wait_job(job["id"], 60)
    assert log(head, job["id"]).strip() == job["workdir_used"] == head.lab.home


# ------------------------------------------------------------------ warm-up
# The lab's nodes load the simulated CUDA driver (sim/cuda_shim.c), built with cc.
needs_cc = pytest.mark.skipif(cuda.build() is None, reason="no C compiler (cc) to build the "
                              "simulated CUDA driver (libcuda.so.1) of the lab's nodes")


def pstates(head) -> dict[tuple[str, int], str | None]:
    """Each card's P-state as the head last read it."""
    return {(g["node"], g["index"]): (g.get("reading") or {}).get("pstate")
            for g in head.call("gpus")["gpus"]}


def warmed(head, *args) -> tuple[dict, str, list[tuple[str, int]]]:
    """A --warmup job run on idle cards that the head then reads in P0: the job, its log
    and its cards."""
    before = wait_for(lambda: (lambda s: s if "P0" not in s.values() else None)(pstates(head)),
                      fake_smi.WAKE_HOLD_S + 30, 0.5, "every card out of P0 (an earlier wake)")
    job = finished(head, "--warmup", *args, "--", "echo", "ran")
    cards = [(g["node"], g["index"]) for g in job["gpus"]]
    assert job["state"] == "succeeded", log(head, job["id"])
    assert [before[c] for c in cards] == ["P8"] * len(cards)  # idle before
    wait_for(lambda: all(pstates(head)[c] == "P0" for c in cards), 15, 0.5,
             f"the head to read {cards} in P0")
    return job, log(head, job["id"]), cards


@needs_cc
def test_warmup_wakes_an_idle_card_to_p0_and_warns_without_persistence_mode(head):
    job, text, cards = warmed(head)
    assert len(cards) == 1 and "nebula: warm-up: 1 GPU woken in " in text, text
    assert text.rstrip().endswith("ran")
    assert "runs without persistence mode" in text and "sudo nvidia-smi -pm 1" in text


@pytest.mark.slow
@needs_cc
def test_warmup_wakes_each_card_of_a_two_gpu_job(head):
    job, text, cards = warmed(head, "--gpu-count", "2")
    assert len(cards) == 2 and "nebula: warm-up: 2 GPUs woken in " in text, text


@needs_cc
def test_a_card_failing_in_cuda_skips_the_warmup_and_the_job_still_runs(head, openssh_lab):
    # An uncorrectable ECC error not yet cleared by a reset: the head still places jobs on
    # the card (a lost card it would not), CUDA refuses it a context (error 214).
    nvidia = [(n, g["index"]) for n in openssh_lab.nodes
              for g in json.loads((openssh_lab.node_dir(n) / "node.json").read_text())["gpus"]]
    try:
        for node, index in nvidia:
            faults.set_fault(openssh_lab.node_dir(node), index, ecc_uncorrected=1)
        job = finished(head, "--warmup", "--", "echo", "ran")
    finally:
        for node, index in nvidia:
            faults.clear_gpu_faults(openssh_lab.node_dir(node), index)
    text = log(head, job["id"])
    assert job["state"] == "succeeded", text
    assert (f"nebula: warm-up skipped on {job['node']}: cuDevicePrimaryCtxRetain failed with "
            "CUDA error 214") in text
    assert text.rstrip().endswith("ran")


@needs_cc
def test_a_card_fallen_off_the_bus_fails_cuinit_over_ssh(openssh_lab):
    # The head places no job on a lost card, so the warm-up runs as the wrapper runs it,
    # in a session on the node through its sshd.
    node = openssh_lab.nodes[0]
    faults.set_fault(openssh_lab.node_dir(node), 0, lost=True)

    async def on_node(visible: str) -> str:
        async with openssh_lab.connect(node) as conn:
            done = await conn.run(f"CUDA_VISIBLE_DEVICES={visible} python3 -c "
                                  f"{shlex.quote(WARMUP_SOURCE)} {node}", check=True, timeout=60)
            return done.stdout

    try:
        assert asyncio.run(on_node("0")) == (f"nebula: warm-up skipped on {node}: cuInit "
                                             "failed with CUDA error 999\n")
    finally:
        faults.clear_gpu_faults(openssh_lab.node_dir(node), 0)
    # As real CUDA reads the variable: an entry naming no card ends the list; none: error 100.
    assert asyncio.run(on_node("1,7,0")).startswith("nebula: warm-up: 1 GPU woken in ")
    assert asyncio.run(on_node("7")).endswith("cuInit failed with CUDA error 100\n")
    uuid = json.loads((openssh_lab.node_dir(node) / "node.json").read_text())["gpus"][1]["uuid"]
    assert asyncio.run(on_node(uuid[:12])).startswith("nebula: warm-up: 1 GPU woken in ")


def test_without_a_cuda_driver_the_warmup_says_so(tmp_path):
    if ctypes.util.find_library("cuda"):
        pytest.skip("this machine has a CUDA driver library")
    env = dict(os.environ, LD_LIBRARY_PATH=str(tmp_path), CUDA_VISIBLE_DEVICES="0")
    done = subprocess.run([sys.executable, "-c", WARMUP_SOURCE, "node9"], capture_output=True,
                          text=True, env=env, timeout=60, check=True)
    assert done.stdout == "nebula: warm-up skipped: node9 has no CUDA driver library (libcuda.so.1)\n"


def test_nodes_yaml_pins_a_runtime_and_warmup_per_node():
    from nebula_tui.config.cluster import parse_config
    from nebula_tui.model import ConfigError

    config = parse_config("nodes:\n  - name: a\n    host: h\n    runtime: apptainer\n    warmup: true\n")
    assert (config.nodes[0].runtime, config.nodes[0].warmup) == ("apptainer", True)
    with pytest.raises(ConfigError, match=r"<string>:4: node 'a': runtime 'lxc' is not a "
                                          r"container runtime; use one of podman, docker"):
        parse_config("nodes:\n  - name: a\n    host: h\n    runtime: lxc\n")
