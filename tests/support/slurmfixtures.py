"""A session-wide real Slurm cluster with its login node (a fixture of ``support.plugin``), and
what the pool tests ask of a head that sends jobs to it.

``slurm_lab`` yields a started :class:`nebula_tui.sim.slurm.SlurmLab`: 4 slurmd × 4 fake
GPUs, partition ``gpu``, accounting (``sacct``) when slurmdbd and MariaDB are installed,
and a login node (real sshd on 127.0.0.1, ``slurm_lab.login_port``, host key in
``slurm_lab.known_hosts_path``; ``slurm_lab.identity_path`` logs in as the test's user).
Where Slurm cannot be installed or started (not root, no apt, a daemon that will not
start) every test that asks for it is skipped with the reason. A test that stops the login
node starts it again; jobs a test leaves are its own to cancel.

Its folder is a fresh directory under the system's temporary folder, readable by every
user (pytest's own is root's alone), because other Unix users' sessions read its
slurm.conf and munge socket.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from labkit.harness import HeadProcess, wait_for
from nebula_tui.sim.slurm import SlurmUnavailable
from nebula_tui.sim.slurmlab import SlurmLab
from nebula_tui.store import Store
from support.head import submit

_SLURM: list = []  # one cluster per session, even when two conftests import this module


@pytest.fixture(scope="session")
def slurm_lab():
    """A started real Slurm with its login node, or a skip saying why there is none."""
    if _SLURM and isinstance(_SLURM[0], str):
        pytest.skip(_SLURM[0])
    if _SLURM:
        yield _SLURM[0]
        return
    # Each pytest-xdist worker starts its own, often while the others start theirs and boot
    # labs: a daemon that misses its start timeout under that load is tried again on fresh
    # ports before every Slurm test of the worker is skipped for it.
    failures = []
    for _attempt in range(3):
        root = Path(tempfile.mkdtemp(prefix="nebula-slurm-"))
        root.chmod(0o755)
        lab = SlurmLab(root)
        try:
            lab.prepare()
            lab.start()
            break
        except SlurmUnavailable as err:
            shutil.rmtree(root, ignore_errors=True)
            failures.append(str(err))
            print(f"slurm_lab: could not start: {err}", file=sys.stderr)
    else:
        _SLURM.append(f"real Slurm unavailable here: {'; then: '.join(dict.fromkeys(failures))}")
        pytest.skip(_SLURM[0])
    _SLURM.append(lab)
    try:
        yield lab
    finally:
        _SLURM.clear()
        lab.stop()
        shutil.rmtree(root, ignore_errors=True)


def start_head(home: Path, config: Path) -> HeadProcess:
    """A head with no lab nodes, only the pool(s) of ``config``, once it has polled one."""
    head = HeadProcess(home, None, config=config)
    head.start(wait_nodes=False)
    try:
        wait_for(lambda: head.call("status")["pools"][0]["reachable"], 30, what="the pool's first poll")
    except BaseException:
        head.stop()  # a head that is not handed over is not left running
        raise
    return head


def succeeded_and_charged(head: HeadProcess, job: int, said: str, ran_s: float, timeout: float = 90) -> None:
    """The pool job ends succeeded, its log says ``said``, and it is charged for at least
    ``ran_s`` seconds of a GPU (its history row)."""
    ended = wait_state(head, job, {"succeeded", "failed"}, timeout=timeout)
    assert ended["state"] == "succeeded", ended["reason"]
    assert said in head.run("logs", str(job), check=True).stdout
    charged = next(j for j in json.loads(head.run("history", "--json", check=True).stdout)
                   if j["id"] == job)["gpu_hours"]
    assert charged >= ran_s / 3600, charged


def squeue(slurm_lab) -> list[dict]:
    """Slurm's own queue (``squeue --json``'s jobs)."""
    out = slurm_lab.cluster.run(["squeue", "--json"])
    return json.loads(out)["jobs"]


def requeued_once(head: HeadProcess, slurm_lab, folder: Path, then: str) -> tuple[int, str]:
    """A pool job that runs 8 s, requeues itself (``scontrol requeue``: its owner may) and
    waits there (a requeued job's BeginTime); run again, it does ``then``. Its id here and
    its Slurm id, once Slurm shows it requeued."""
    job = submit(head, "--pool", "hpc", "--command",
                 f'f={folder}/requeued; if [ ! -e "$f" ]; then touch "$f"; sleep 8; '
                 f'scontrol requeue "$SLURM_JOB_ID"; sleep 60; fi; {then}')
    wait_for(lambda: remote_id(head, job), 30, what="its Slurm id")
    rid = remote_id(head, job)
    wait_for(lambda: any(str(j["job_id"]) == rid and j.get("state_reason") == "BeginTime"
                         for j in squeue(slurm_lab)), 60, what="it requeued itself")
    return job, rid


def remote_id(head: HeadProcess, job: int) -> str:
    """The Slurm job id the head's store keeps for its pool job ``job``."""
    store = Store(head.home / "state.db", readonly=True)
    try:
        return store.pool_job(job)["remote_id"]
    finally:
        store.close()


def wait_state(head: HeadProcess, job: int, states: set[str], timeout: float = 60) -> dict:
    """The job once its state is one of ``states``; on a timeout, its reason and events."""
    try:
        wait_for(lambda: head.job(job)["state"] in states, timeout, interval=0.3,
                 what=f"job {job} to be {'/'.join(sorted(states))}")
    except AssertionError as err:
        shown = head.job(job)
        raise AssertionError(f"{err}: it is {shown['state']} ({shown['reason']}); "
                             f"events: {head.call('events', job=job)['events']}") from None
    return head.job(job)


#: the poll interval of the trust tests' pools
POLL = "1s"


def pool_line(head: HeadProcess) -> str:
    """The head's status line of its one pool."""
    return head.call("status")["pools"][0]["line"]


def config(slurm_lab, path: Path, **extra) -> Path:
    """nodes.yaml at ``path`` with the lab's Slurm as pool hpc (``extra``: its keys), polled
    every POLL."""
    entry = slurm_lab.pool_entry("hpc", known_hosts=str(slurm_lab.known_hosts_path),
                                 workdir=str(path.parent / "hpc-work"), poll_interval=POLL)
    entry.setdefault("identity", str(slurm_lab.identity_path))
    entry.update(extra)
    path.write_text(yaml.safe_dump({"cluster": {"name": "trusttest"}, "pools": [entry]}))
    return path


@contextlib.contextmanager
def min_job_age(slurm_lab, seconds: int):
    """The lab's slurmctld forgets an ended job after ``seconds`` (MinJobAge), for one test."""
    conf = Path(slurm_lab.slurm_conf)
    before = conf.read_text()
    conf.write_text(re.sub(r"(?m)^MinJobAge=\d+$", f"MinJobAge={seconds}", before))
    subprocess.run(["scontrol", "reconfigure"], env=slurm_lab.env, capture_output=True, timeout=30)
    try:
        yield
    finally:
        conf.write_text(before)
        subprocess.run(["scontrol", "reconfigure"], env=slurm_lab.env, capture_output=True,
                       timeout=30)
