"""What the tests do to a head process again and again, written once.

A job is submitted through the real CLI (``submit``) and its id read from what the CLI
prints (``submitted_id``, also for a submit run another way: as another user, without
``check``); ``running`` and ``state_is`` wait until the head says the job is so;
``session_alive`` asks the job's node's own tmux server whether its session is there;
``gpu`` reads one card as the head shows it; ``log`` reads a job's output as ``nebula
logs`` prints it; ``cancelled_after`` cancels a test's jobs however it ends; ``has_op``
asks whether the head knows a request; ``free_port`` finds a port for a listener.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket

from labkit.harness import HeadProcess, wait_for

#: What ``nebula submit`` prints first: ``Submitted job 7`` or ``Submitted array job 7 (4 tasks)``.
SUBMITTED = re.compile(r"Submitted (?:array )?job (\d+)")

#: a job that says it saw SIGUSR1 (its checkpoint) and runs on until it is killed. Its own
#: argv, not --command text: the nodelet signals the processes whose environment names the
#: job, and a --command job's shell got that variable by export, after its exec (notes).
CHECKPOINTING = ("sh", "-c", "trap 'echo checkpoint-on-usr1' USR1; echo ready; while true; do sleep 0.2; done")


def submit(head: HeadProcess, *args: str, **kw) -> int:
    """``nebula submit ARGS`` (exit 0 required); the new job's id."""
    return submitted_id(head.run("submit", *args, check=True, **kw).stdout)


def submitted_id(printed: str) -> int:
    """The job id in what ``nebula submit`` printed (AssertionError when it names none)."""
    match = SUBMITTED.match(printed)
    assert match, printed
    return int(match.group(1))


def submit_json(head: HeadProcess, *args: str) -> int:
    """``nebula submit --json ARGS`` (exit 0 required); the new job's id from the document."""
    return json.loads(head.run("submit", "--json", *args, check=True).stdout)["id"]


def log(head: HeadProcess, job_id: int) -> str:
    """``nebula logs JOB`` (exit 0 required): the job's output as the CLI prints it."""
    return head.run("logs", str(job_id), check=True).stdout


def running(head: HeadProcess, job_id: int, timeout: float = 30) -> dict:
    """The job once the head says it runs (AssertionError after ``timeout`` seconds)."""
    return wait_for(lambda: (j := head.job(job_id))["state"] == "running" and j, timeout,
                    what=f"job {job_id} to run")


def gpu(head: HeadProcess, uuid: str) -> dict:
    """The card as the head shows it now (``nebula gpus``' document for it)."""
    return next(g for g in head.call("gpus")["gpus"] if g["uuid"] == uuid)


def session_alive(head: HeadProcess, node: str, job_id: int) -> bool:
    """Whether the job's tmux session is there on its node."""
    return head.tmux(node, "has-session", "-t", f"={head.session(job_id)}").returncode == 0


def sinfo_partitions(text: str) -> dict[str, tuple[int, int]]:
    """``sinfo -h -O 'Partition:|,Gres:|,GresUsed:|,Nodes:|'``: each partition's (GPUs, idle
    GPUs), its groups of alike nodes added up (a count is the last number of the gpu item),
    read apart from the pool's parsers to check them."""
    found: dict[str, tuple[int, int]] = {}
    for line in text.splitlines():
        name, gres, used, nodes = line.split("|")[:4]
        gpus = int(gres.split(",")[0].split(":")[-1]) * int(nodes)
        busy = int(used.split(",")[0].split("(")[0].split(":")[-1]) * int(nodes)
        had = found.get(name.rstrip("*"), (0, 0))
        found[name.rstrip("*")] = (had[0] + gpus, had[1] + gpus - busy)
    return found


def has_op(head: HeadProcess, op: str, **fields) -> bool:
    """Whether the service knows ``op`` (any answer but "unknown request" means yes)."""
    from nebula_tui.api import ApiError

    try:
        head.call(op, **fields)
    except ApiError as err:
        return not str(err).startswith("unknown request")
    return True


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now: nothing listens there until something binds it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def state_is(head, job_id: int, state: str, timeout: float = 30) -> dict:
    """The job once its state is ``state``; on a timeout, the state and reason it has."""
    try:
        return wait_for(lambda: (j := head.job(job_id))["state"] == state and j, timeout,
                        what=f"job {job_id} to be {state}")
    except AssertionError as err:  # say where it stands
        job = head.job(job_id)
        raise AssertionError(f"{err}; it is {job['state']}: {job['reason']}") from None


@contextlib.contextmanager
def cancelled_after(head):
    """A list to put the test's jobs in; each is cancelled, and its end awaited, at the end."""
    jobs: list[int] = []
    try:
        yield jobs
    finally:
        for job in jobs:
            head.run("cancel", str(job))
        for job in jobs:
            head.wait_job(job, timeout=40)
