"""What a job runs in, end to end on the simulated lab: venvs and conda, the default workdir,
warm-up, and bad input refused at submit. (Containers: ``test_container_jobs.py``.)"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from nebula_tui.head.server import spec_from_request
from nebula_tui.model import RequestError


def submit(head, *args, **kw) -> dict:
    done = head.run("submit", *args, check=True, **kw)
    return head.wait_job(int(done.stdout.split()[2]), 60)


def log(head, job_id: int) -> str:
    return head.run("logs", str(job_id), check=True).stdout


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
    job = submit(head, "--venv", str(venv), "--", "python", "-c",
                 "import os, sys; print(sys.prefix); print(os.environ['VIRTUAL_ENV'])")
    assert job["state"] == "succeeded", log(head, job["id"])
    assert log(head, job["id"]).split() == [str(venv), str(venv)]


def test_a_missing_venv_fails_at_once_naming_the_node(head, tmp_path):
    job = submit(head, "--venv", str(tmp_path / "nope"), "--", "python", "-c", "print(1)")
    assert job["state"] == "failed" and job["exit_code"] == 127
    assert job["reason"] == (f"{job['node']} has no venv at {tmp_path / 'nope'} (no bin/activate "
                             f"there for root); make it with python3 -m venv {tmp_path / 'nope'}")
    assert not any(job["id"] in g["jobs"] for g in head.call("gpus")["gpus"])  # card freed


CONDA = shutil.which("micromamba") or shutil.which("conda") or shutil.which("mamba")


@pytest.mark.skipif(CONDA is not None, reason="this machine has a conda tool")
def test_conda_without_a_conda_tool_fails_at_once_saying_what_was_looked_for(head):
    job = submit(head, "--conda", "torch", "--", "python", "-c", "print(1)")
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
    job = submit(head, "--conda", str(prefix), "--command", "echo $CONDA_PREFIX")
    assert log(head, job["id"]).strip() == str(prefix)
    job = submit(head, "--conda", "no-such-env-xyz", "--", "true")
    assert job["state"] == "failed" and "has no conda env no-such-env-xyz" in job["reason"]


# ------------------------------------------------------------------ workdir
def test_without_workdir_it_runs_where_it_was_submitted_when_the_node_has_it(head, tmp_path):
    here = tmp_path / "project"
    here.mkdir()
    job = submit(head, "--", "pwd", cwd=here)
    assert log(head, job["id"]).strip() == str(here)
    assert (job["submit_dir"], job["workdir_used"]) == (str(here), str(here))  # `nebula job`


def test_else_in_the_home(head, tmp_path):
    # Submitted from a directory the node does not have (another machine's, or removed).
    job = head.call("submit", command=["pwd"], submit_dir=str(tmp_path / "elsewhere"))["job"]
    job = head.wait_job(job["id"], 60)
    assert log(head, job["id"]).strip() == job["workdir_used"] == head.lab.home


def test_warmup_says_what_it_did_and_warns_without_persistence_mode(head):
    job = submit(head, "--warmup", "--", "true")
    text = log(head, job["id"])
    assert f"nebula: warm-up skipped: {job['node']} has no CUDA driver library (libcuda.so.1)" in text
    assert "runs without persistence mode" in text and "sudo nvidia-smi -pm 1" in text


def test_nodes_yaml_pins_a_runtime_and_warmup_per_node():
    from nebula_tui.config import parse_config
    from nebula_tui.model import ConfigError

    config = parse_config("nodes:\n  - name: a\n    host: h\n    runtime: apptainer\n    warmup: true\n")
    assert (config.nodes[0].runtime, config.nodes[0].warmup) == ("apptainer", True)
    with pytest.raises(ConfigError, match=r"<string>:4: node 'a': runtime 'lxc' is not a "
                                          r"container runtime; use one of podman, docker"):
        parse_config("nodes:\n  - name: a\n    host: h\n    runtime: lxc\n")
