"""The job commands: submit (and ``run``, its interactive twin), wait, queue, job, cancel,
requeue, hold, release and attach."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from .. import environments
from ..api import ApiError, Client
from ..printable import printable
from ..model import ended_text
from ..units import duration_exact
from ..wire import (HistoryJob, HistoryReply, JobDetailReply, JobHistoryRequest, JobReply, JobRequest, JobWire,
                    QueueReply, QueueRow, SubmitReply, SubmitRequest, WhyReply, WhyRequest)
from ..homedir import Home
from .text import job_text
from .args import FINISHED_STATES, USAGE_ERROR
from .common import service_client, show

#: `nebula why` tries the forecast for several changes of the request: give it time
WHY_TIMEOUT_S = 60.0


def world_request(args: argparse.Namespace) -> SubmitRequest:
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


def submit_request(args: argparse.Namespace) -> SubmitRequest | None:
    """The submit request of `nebula submit`/`run`'s flags; None after a usage error."""
    prog = f"nebula {args.command}"
    script = getattr(args, "script", None) or []
    if sum(map(bool, (args.shell_command is not None, args.trailing, script))) > 1:
        print(f"{prog}: give one of a script, --command \"…\" or `-- cmd args…`", file=sys.stderr)
        return None
    if args.shell_command is None and not args.trailing and not script:
        print(f"{prog}: nothing to run; add `-- cmd args…`, --command \"…\" or a script",
              file=sys.stderr)
        return None
    for note in getattr(args, "unhonoured", None) or ():
        print(f"{prog}: {note}", file=sys.stderr)
    kinds = {kind for kind, _ in args.after}
    if len(kinds) > 1:
        print(f"{prog}: --after: give one kind of dependency for all its jobs", file=sys.stderr)
        return None
    if script and not args.name:  # as sbatch: a script's job is named after it
        args.name = os.path.basename(script[0])
    if args.gpus_per_node:  # --gres counts per node, as in Slurm
        args.gpu_count = args.gpus_per_node * args.nodes
    command = (script_command(script) if script else
               [args.shell_command] if args.shell_command is not None else args.trailing)
    request: SubmitRequest = {
        "command": command,
        "shell": args.shell_command is not None, "name": args.name,
        "gpu_count": args.gpu_count, "gpu_mem_mb": args.gpu_mem,
        "output": args.output, "error": args.error,
        "workdir": os.path.abspath(args.workdir) if args.workdir else None,
        "arch": args.arch, "cuda": args.cuda, "vendor": args.vendor, "nodes": args.nodes,
        "priority": args.priority, "time_limit_s": args.time_limit,
        "service": args.service, "no_requeue": args.no_requeue, "preemptible": args.preemptible,
        "reservation": args.reservation, "nodelist": args.nodelist, "exclude": args.exclude,
        "export": [pair for pairs in args.export for pair in pairs],
        "notify": getattr(args, "notify", False), **world_request(args),
        "after": [job for _, ids in args.after for job in ids],
        "after_type": kinds.pop() if kinds else "ok",
        "array": str(args.array) if getattr(args, "array", None) else None,
        "pool": getattr(args, "pool", None),
    }
    return request


def script_command(script: list[str]) -> list[str]:
    """``nebula submit train.sh ARGS``: the script run by its ``#!`` interpreter (checked
    there by ``slurm.with_directives``), by its absolute path (the node reads it there: a
    shared home), as sbatch runs it whether or not it is executable."""
    path = os.path.abspath(script[0])
    with open(path, "rb") as f:
        interpreter = f.readline(4096).decode(errors="replace")[2:].split() or ["/bin/sh"]
    return [*interpreter, path, *script[1:]]


def cmd_submit(args: argparse.Namespace, home: Home, config: str | None) -> int:
    request = submit_request(args)
    if request is None:
        return USAGE_ERROR
    with service_client(home, config) as client:
        reply = client.call("submit", SubmitReply, **request)
        job = reply["job"]
        if getattr(args, "parsable", False):  # sbatch --parsable: the id alone, for scripts
            print(job["id"])
            return _wait(client, job["id"]) if args.wait else 0
        limit = limit_said(job)
        said = (f"Submitted array job {job['id']} ({reply.get('tasks', 1)} tasks, {limit})"
                if args.array else f"Submitted job {job['id']} ({limit})")
        if args.command == "sbatch":  # sbatch's own words, which scripts grep
            said = f"Submitted batch job {job['id']}"
        if not args.wait:
            return show(args, job, said)
        if not args.json:  # the id at once; with --json, one document: the ended job
            print(said, flush=True)
        return _wait(client, job["id"], args.json)


def limit_said(job: JobWire) -> str:
    """The time limit the head understood, as the submit reply says it: a Slurm user sees
    that a bare 90 was minutes."""
    limit = job["time_limit_s"]
    return f"time limit {duration_exact(limit)}" if limit else "no time limit"


def cmd_run(args: argparse.Namespace, home: Home, config: str | None) -> int:
    """``nebula run`` is srun: the job's output streams here as it runs, its exit code is
    this command's, Ctrl-C cancels it; the job's log keeps it all. With ``--pty`` this
    terminal is the job's (srun --pty, R33)."""
    if args.pty and not sys.stdin.isatty():
        print(f"nebula {args.command}: --pty needs a terminal; without one leave it out",
              file=sys.stderr)
        return USAGE_ERROR
    request = submit_request(args)
    if request is None:
        return USAGE_ERROR
    request["interactive"] = args.pty
    job_id = None
    try:
        with service_client(home, config) as client:
            job = client.call("submit", SubmitReply, **request)["job"]
            job_id = job["id"]
            print(f"Submitted job {job_id} ({limit_said(job)})",
                  file=sys.stderr, flush=True)
            said = None
            while job["state"] in ("pending", "launching"):
                if job["reason"] and job["reason"] != said:
                    said = job["reason"]
                    print(f"Job {job_id}: {printable(said)}", file=sys.stderr, flush=True)
                time.sleep(0.2)
                job = client.call("job", JobDetailReply, **JobRequest(job=job_id))["job"]
            path = client.path
        if not args.pty:
            from argparse import Namespace

            from .logs import cmd_logs

            cmd_logs(Namespace(job=job_id, follow=True, rank=None, tail=None, attempt=None),
                     home, config)
            with service_client(home, config) as client:
                return _wait(client, job_id, quiet_success=True)
        from ..client.attach import attach

        ended = job["state"] != "running" or attach(path, job_id)
        with service_client(home, config) as client:
            job = client.call("job", JobDetailReply, **JobRequest(job=job_id))["job"]
            if job["state"] == "running" and not ended:  # a detach: the job runs on
                print(f"Detached; job {job_id} runs on: `nebula attach {job_id}`", file=sys.stderr)
                return 0
            return _wait(client, job_id)
    except KeyboardInterrupt:  # Ctrl-C: as srun, the job is cancelled
        if job_id is not None:
            with service_client(home, config) as client:
                client.call("cancel", JobReply, **JobRequest(job=job_id))
            print(f"\nnebula {args.command}: cancelled job {job_id}", file=sys.stderr)
        return 130


def _wait(client: Client, job_id: int, as_json: bool = False, quiet_success: bool = False) -> int:
    """Wait for the job's end; say how it ended (``quiet_success``: only when it failed,
    as srun) and return its exit code."""
    job = client.wait(job_id)
    detail = f" with exit code {job['exit_code']}" if job["exit_code"] is not None else ""
    if as_json:
        print(json.dumps(job, indent=2))
    elif not (quiet_success and job["state"] == "succeeded"):
        print(f"Job {job_id} {ended_text(job['state'], printable(job['reason'] or ''), detail)}", file=sys.stderr)
    if job["exit_code"] is not None:
        return job["exit_code"]
    return 0 if job["state"] == "succeeded" else 1


def cmd_wait(args: argparse.Namespace, home: Home, config: str | None) -> int:
    with service_client(home, config) as client:
        return _wait(client, args.job, args.json)


def cmd_queue(args: argparse.Namespace, home: Home, config: str | None) -> int:
    from .text import queue_text

    with service_client(home, config) as client:
        jobs: list[QueueRow | HistoryJob] = list(client.call("queue", QueueReply)["jobs"])
        if args.all:
            ended = [s for s in (args.state or FINISHED_STATES) if s in FINISHED_STATES]
            history = JobHistoryRequest(user=args.user, state=ended, limit=args.limit)
            jobs = [*(client.call("job_history", HistoryReply, **history)["jobs"] if ended else []), *jobs]
    jobs = [j for j in jobs if (args.user is None or j["user"] == args.user)
            and (args.state is None or j["state"] in args.state)
            and (args.jobs is None or j["id"] in args.jobs or j.get("array_id") in args.jobs)]
    if args.format or args.command == "squeue":  # Slurm's shape, for scripts that parse it
        from .slurm import SQUEUE_FORMAT, squeue_text

        return show(args, jobs, lambda shown: squeue_text(
            shown, args.format or SQUEUE_FORMAT, not args.noheader, time.time()))
    return show(args, jobs, lambda shown: queue_text(shown, time.time(), args.expand))


def cmd_job(args: argparse.Namespace, home: Home, config: str | None) -> int:
    with service_client(home, config) as client:
        job = client.call("job", JobDetailReply, **JobRequest(job=args.job))["job"]
    return show(args, job, job_text)


def cmd_why(args: argparse.Namespace, home: Home, config: str | None) -> int:
    """``nebula why JOB`` / ``nebula why --user NAME``: the head's answer, in words."""
    from ..forecasts import why_text, why_user_text

    if (args.job is None) == (args.user is None):
        print("nebula why: name a job (nebula why 42) or a user (nebula why --user alice)",
              file=sys.stderr)
        return 2
    fields = WhyRequest(job=args.job) if args.user is None else WhyRequest(user=args.user)
    with service_client(home, config) as client:
        answer = client.call("why", WhyReply, timeout=WHY_TIMEOUT_S, **fields)["why"]
    return show(args, answer, why_user_text if args.user is not None else why_text)


def cmd_cancel(args: argparse.Namespace, home: Home, config: str | None) -> int:
    """Cancel each job named, like ``scancel 4 5 3``: every id is tried, each answered on
    its own line; exit 1 when any could not be cancelled."""
    done: list[JobWire] = []
    failed = 0
    with service_client(home, config) as client:
        for job_id in dict.fromkeys(args.jobs):  # an id given twice is cancelled once
            try:
                job = client.call("cancel", JobReply, **JobRequest(job=job_id))["job"]
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


def _on_job(args: argparse.Namespace, home: Home, config: str | None, op: str, done: str) -> int:
    """A request about one job whose answer is the job: ``done`` (or it, with --json)."""
    with service_client(home, config) as client:
        job = client.call(op, JobReply, **JobRequest(job=args.job))["job"]
    return show(args, job, done)


def cmd_requeue(args: argparse.Namespace, home: Home, config: str | None) -> int:
    return _on_job(args, home, config, "requeue",
                   f"Requeueing job {args.job}: SIGUSR1 now, then back in the queue")


def cmd_hold(args: argparse.Namespace, home: Home, config: str | None) -> int:
    return _on_job(args, home, config, "hold",
                   f"Held job {args.job}; `nebula release {args.job}` lets it run")


def cmd_release(args: argparse.Namespace, home: Home, config: str | None) -> int:
    return _on_job(args, home, config, "release", f"Released job {args.job}")


def cmd_attach(args: argparse.Namespace, home: Home, config: str | None) -> int:
    from ..client.attach import attach

    with service_client(home, config) as client:  # finds (or starts) the service
        path = client.path
    attach(path, args.job, args.rank)
    return 0
