"""The job commands: submit (and ``run``, its interactive twin), wait, queue, job, cancel,
requeue, hold, release and attach."""

from __future__ import annotations

import json
import os
import sys
import time

from .. import environments
from ..api import ApiError
from ..printable import printable
from ..model import ended_text
from ..views import job_text, time_limit_text
from .args import FINISHED_STATES, USAGE_ERROR
from .common import service_client, show

#: `nebula why` tries the forecast for several changes of the request: give it time
WHY_TIMEOUT_S = 60.0


def world_request(args) -> dict:
    """The submit fields of ``add_world_flags``, plus where this was submitted from; a
    combination that cannot work is a usage error here."""
    try:
        environments.combination(args.image, args.conda, args.venv, tuple(args.data_mounts),
                                 args.runtime)
    except ValueError as err:
        print(f"nebula {args.command}: {err}", file=sys.stderr)
        raise SystemExit(USAGE_ERROR) from None
    try:
        submit_dir = os.getcwd()
    except OSError:  # the directory was removed under the shell
        submit_dir = None
    return {"image": args.image, "runtime": args.runtime, "data_mounts": args.data_mounts,
            "conda": args.conda, "venv": args.venv, "submit_dir": submit_dir,
            "warmup": args.warmup}


def submit_request(args) -> dict | None:
    """The submit request of `nebula submit`/`run`'s flags; None after a usage error."""
    prog = f"nebula {args.command}"
    if args.shell_command is not None and args.trailing:
        print(f"{prog}: give either --command \"…\" or `-- cmd args…`, not both", file=sys.stderr)
        return None
    if args.shell_command is None and not args.trailing:
        print(f"{prog}: nothing to run; add `-- cmd args…` or --command \"…\"", file=sys.stderr)
        return None
    kinds = {kind for kind, _ in args.after}
    if len(kinds) > 1:
        print(f"{prog}: --after: give one kind of dependency for all its jobs", file=sys.stderr)
        return None
    return {
        "command": [args.shell_command] if args.shell_command is not None else args.trailing,
        "shell": args.shell_command is not None, "name": args.name,
        "gpu_count": args.gpu_count, "gpu_mem_mb": args.gpu_mem,
        "workdir": os.path.abspath(args.workdir) if args.workdir else None,
        "arch": args.arch, "cuda": args.cuda, "vendor": args.vendor, "nodes": args.nodes,
        "priority": args.priority, "time_limit_s": args.time_limit,
        "service": args.service, "no_requeue": args.no_requeue, "preemptible": args.preemptible,
        "reservation": args.reservation,
        "notify": getattr(args, "notify", False), **world_request(args),
        "after": [job for _, ids in args.after for job in ids],
        "after_type": kinds.pop() if kinds else "ok", "array": str(args.array) if getattr(args, "array", None) else None,
        "pool": getattr(args, "pool", None),
    }


def cmd_submit(args, home, config) -> int:
    request = submit_request(args)
    if request is None:
        return USAGE_ERROR
    with service_client(home, config) as client:
        reply = client.call("submit", **request)
        job = reply["job"]
        limit = f"time limit {time_limit_text(job)}"  # a Slurm user sees 90 was minutes
        said = (f"Submitted array job {job['id']} ({reply.get('tasks', 1)} tasks, {limit})"
                if args.array else f"Submitted job {job['id']} ({limit})")
        if not args.wait:
            return show(args, job, said)
        if not args.json:  # the id at once; with --json, one document: the ended job
            print(said, flush=True)
        return _wait(client, job["id"], args.json)


def cmd_run(args, home, config) -> int:
    """Submit an interactive job, wait for its GPUs, attach this terminal to it (R33)."""
    from ..client.attach import attach

    if not sys.stdin.isatty():
        print("nebula run: needs a terminal; without one use `nebula submit`", file=sys.stderr)
        return USAGE_ERROR
    request = submit_request(args)
    if request is None:
        return USAGE_ERROR
    with service_client(home, config) as client:
        job = client.call("submit", interactive=True, **request)["job"]
        print(f"Submitted job {job['id']}", file=sys.stderr, flush=True)
        said = None
        while job["state"] in ("pending", "launching"):
            if job["reason"] and job["reason"] != said:
                said = job["reason"]
                print(f"Waiting: {printable(said)}", file=sys.stderr, flush=True)
            time.sleep(0.2)
            job = client.call("job", job=job["id"])["job"]
        path = client.path
    ended = job["state"] != "running" or attach(path, job["id"])
    with service_client(home, config) as client:
        job = client.call("job", job=job["id"])["job"]
        if job["state"] == "running" and not ended:  # a detach: the job runs on
            print(f"Detached; job {job['id']} runs on: `nebula attach {job['id']}`", file=sys.stderr)
            return 0
        return _wait(client, job["id"])


def _wait(client, job_id: int, as_json: bool = False) -> int:
    job = client.wait(job_id)
    detail = f" with exit code {job['exit_code']}" if job["exit_code"] is not None else ""
    if as_json:
        print(json.dumps(job, indent=2))
    else:
        print(f"Job {job_id} {ended_text(job['state'], printable(job['reason'] or ''), detail)}", file=sys.stderr)
    if job["exit_code"] is not None:
        return job["exit_code"]
    return 0 if job["state"] == "succeeded" else 1


def cmd_wait(args, home, config) -> int:
    with service_client(home, config) as client:
        return _wait(client, args.job, args.json)


def cmd_queue(args, home, config) -> int:
    from ..views import queue_text

    with service_client(home, config) as client:
        jobs = client.call("queue")["jobs"]
        if args.all:
            ended = [s for s in (args.state or FINISHED_STATES) if s in FINISHED_STATES]
            jobs = (client.call("job_history", user=args.user, state=ended, limit=args.limit)["jobs"]
                    if ended else []) + jobs
    jobs = [j for j in jobs if (args.user is None or j["user"] == args.user)
            and (args.state is None or j["state"] in args.state)]
    return show(args, jobs, lambda shown: queue_text(shown, time.time(), args.expand))


def cmd_job(args, home, config) -> int:
    with service_client(home, config) as client:
        job = client.call("job", job=args.job)["job"]
    return show(args, job, job_text)


def cmd_why(args, home, config) -> int:
    """``nebula why JOB`` / ``nebula why --user NAME``: the head's answer, in words."""
    from ..forecasts import why_text, why_user_text

    if (args.job is None) == (args.user is None):
        print("nebula why: name a job (nebula why 42) or a user (nebula why --user alice)",
              file=sys.stderr)
        return 2
    fields = {"job": args.job} if args.user is None else {"user": args.user}
    with service_client(home, config) as client:
        answer = client.call("why", timeout=WHY_TIMEOUT_S, **fields)["why"]
    return show(args, answer, why_user_text if args.user is not None else why_text)


def cmd_cancel(args, home, config) -> int:
    """Cancel each job named, like ``scancel 4 5 3``: every id is tried, each answered on
    its own line; exit 1 when any could not be cancelled."""
    done: list[dict] = []
    failed = 0
    with service_client(home, config) as client:
        for job_id in dict.fromkeys(args.jobs):  # an id given twice is cancelled once
            try:
                job = client.call("cancel", job=job_id)["job"]
            except ApiError as err:
                if len(args.jobs) == 1:
                    raise
                print(f"nebula: job {job_id}: {printable(err)}", file=sys.stderr)
                failed += 1
                continue
            done.append(job)
            if not getattr(args, "json", False):
                # one word for every job: its nodes may still be stopping it (a pool's is gone)
                print(f"Cancelled job {job['id']}" + ("" if job["state"] == "cancelled"
                                                      else " (its nodes stop it now)"))
    if getattr(args, "json", False):
        print(json.dumps(done[0] if len(args.jobs) == 1 else done, indent=2))
    return 1 if failed else 0


def _on_job(args, home, config, op: str, done: str) -> int:
    """A request about one job whose answer is the job: ``done`` (or it, with --json)."""
    with service_client(home, config) as client:
        job = client.call(op, job=args.job)["job"]
    return show(args, job, done)


def cmd_requeue(args, home, config) -> int:
    return _on_job(args, home, config, "requeue",
                   f"Requeueing job {args.job}: SIGUSR1 now, then back in the queue")


def cmd_hold(args, home, config) -> int:
    return _on_job(args, home, config, "hold",
                   f"Held job {args.job}; `nebula release {args.job}` lets it run")


def cmd_release(args, home, config) -> int:
    return _on_job(args, home, config, "release", f"Released job {args.job}")


def cmd_attach(args, home, config) -> int:
    from ..client.attach import attach

    with service_client(home, config) as client:  # finds (or starts) the service
        path = client.path
    attach(path, args.job, args.rank)
    return 0
