"""What the lab tests do to a head again and again, written once.

A job is submitted through the real CLI (``nebula submit``) and its id read from what the
CLI prints; ``running`` waits until the head says the job runs; ``session_alive`` asks the
job's node's own tmux server whether its session is there; ``gpu`` reads one card as the
head shows it.
"""

from __future__ import annotations

import json
import re

from labkit.harness import HeadProcess, wait_for

#: What ``nebula submit`` prints first: ``Submitted job 7`` or ``Submitted array job 7 (4 tasks)``.
SUBMITTED = re.compile(r"Submitted (?:array )?job (\d+)")


def submit(head: HeadProcess, *args: str, **kw) -> int:
    """``nebula submit ARGS`` (exit 0 required); the new job's id."""
    done = head.run("submit", *args, check=True, **kw)
    match = SUBMITTED.match(done.stdout)
    assert match, done.stdout
    return int(match.group(1))


def submit_json(head: HeadProcess, *args: str) -> int:
    """``nebula submit --json ARGS`` (exit 0 required); the new job's id from the document."""
    return json.loads(head.run("submit", "--json", *args, check=True).stdout)["id"]


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
