"""What a pool job becomes on a Slurm cluster: ``sbatch``'s flags and the batch script it
reads on stdin, each node's part behind the lab's own checks (``remote/preflight.py``).
The job's command and the part travel in the script's environment, never on an argv.
"""

from __future__ import annotations

import math
import shlex

from ..config.pools import PoolConfig
from ..remote import preflight
from ..remote.launcher import EVAL_COMMAND, command_text
from .base import PoolSubmission


def _time_limit(seconds: float) -> str:
    """--time for Slurm, in whole minutes up (it counts minutes): D-HH:MM:00."""
    minutes = max(1, math.ceil(seconds / 60))
    days, minutes = divmod(minutes, 1440)
    return f"{days}-{minutes // 60:02d}:{minutes % 60:02d}:00"


def master_port(job_id: int) -> int:
    return 29500 + job_id % 20000  # as a lab gang's (launcher.gang_environment)


# The part of a job that runs on each of its nodes (one srun task per node for a gang):
# R12's variables, the same checks as on a lab node (remote/preflight.py), then the command.
_PART = r"""export CUDA_DEVICE_ORDER=PCI_BUS_ID
NEBULA_GPU_LIST=
if [ -n "${CUDA_VISIBLE_DEVICES:-}" ] && command -v nvidia-smi >/dev/null 2>&1; then
  NEBULA_GPU_LIST=$(nvidia-smi --query-gpu=uuid --format=csv,noheader -i "$CUDA_VISIBLE_DEVICES" 2>/dev/null \
    | paste -sd, -)
fi
export NEBULA_GPU_LIST=${NEBULA_GPU_LIST:-${CUDA_VISIBLE_DEVICES:-}}
if [ "${NNODES:-1}" -gt 1 ]; then export NODE_RANK=${SLURM_NODEID:-0}; fi
export NEBULA_NODE_NAME=${SLURMD_NODENAME:-$(hostname)}
checks=$(sh -c "$NEBULA_CHECKS" nebula-check "$@") || {
  printf 'nebula: %s\n' "$checks" >&2; exit 127; }
NEBULA_CONDA_TOOL=$(printf '%s\n' "$checks" | sed -n 's/^conda=//p')
workdir=$(printf '%s\n' "$checks" | sed -n 's/^workdir=//p')
[ -z "$workdir" ] || cd -- "$workdir" || exit 127
eval "$NEBULA_ACTIVATE"
unset NEBULA_PART
"""
# The part runs from the environment too: `bash -c "$part"` would put it on argv.
_RUN_PART = 'eval "$NEBULA_PART"'



def sbatch_argv(config: PoolConfig, submission: PoolSubmission, workdir: str,
                log_path: str) -> list[str]:
    """The sbatch flags for ``submission`` (the script comes on stdin)."""
    job, spec = submission.job, submission.job.spec
    argv = ["sbatch", "--parsable", f"--job-name={spec.name or f'nebula-{job.id}'}",
            f"--comment={submission.token}", f"--output={log_path}",
            "--open-mode=append", f"--chdir={workdir}", f"--nodes={spec.nodes}",
            "--ntasks-per-node=1",
            "--no-requeue" if spec.no_requeue else "--requeue"]
    if submission.shards_per_node:
        argv.append(f"--gres=shard:{submission.shards_per_node}")
    else:
        argv.append(f"--gres=gpu:{submission.gpus_per_node}")
    partition = config.partition
    if spec.preemptible:  # the head refused it where the pool names no scavenger
        partition = config.scavenger_partition or partition
        if config.scavenger_qos:
            argv.append(f"--qos={config.scavenger_qos}")
    if partition:
        argv.append(f"--partition={partition}")
    if config.account:
        argv.append(f"--account={config.account}")
    if spec.time_limit_s:
        argv.append(f"--time={_time_limit(spec.time_limit_s)}")
    return argv  # an --image goes on the srun step (pyxis) or in the part (apptainer)

def batch_script(config: PoolConfig, submission: PoolSubmission) -> str:
    """The batch script: the job's variables, then its part on every node (srun per
    node for a gang, from Slurm's own node list), each behind the lab's checks."""
    job, spec = submission.job, submission.job.spec
    env = {"NEBULA_JOB_ID": str(job.id), "NEBULA_POOL": config.name,
           "NEBULA_CHECKS": preflight.CHECKS, "NEBULA_ACTIVATE": preflight.ACTIVATE}
    # the command and the part in the environment (srun passes it on), never in an argv
    env.update(command_text(job))
    env.update(preflight.check_env("$node", spec.workdir, spec.submit_dir, spec.conda,
                                   spec.venv))
    env.pop("NEBULA_NODE_NAME", None)  # each node's own, set in the part
    env["NEBULA_PART"] = _PART + "exec " + shlex.join(
        [*(_in_container(config, submission) or ()), "sh", "-c", EVAL_COMMAND]) + "\n"
    sources = [m.split(":", 1)[0] for m in spec.data_mounts]
    lines = ["#!/bin/bash", f"# NebulaGrid job {job.id}, attempt {job.attempt + 1}"]
    lines += [f"export {name}={shlex.quote(value)}" for name, value in env.items()]
    lines.append(f"part={shlex.quote(_RUN_PART)}")
    srun = ["srun", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
    if spec.image and config.runtime == "pyxis":
        srun.append(f"--container-image={spec.image}")
        mounts = ",".join(spec.data_mounts)
        if mounts:
            srun.append(f"--container-mounts={mounts}")
    lines += [
        'if [ "${SLURM_JOB_NUM_NODES:-1}" -gt 1 ]; then',
        '  first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        # the first node's address as Slurm reaches it (a node's name may not resolve)
        "  MASTER_ADDR=$(scontrol show node -o \"$first\" 2>/dev/null | sed -n 's/.*NodeAddr=\\([^ ]*\\).*/\\1/p')",
        '  MASTER_ADDR=${MASTER_ADDR:-$first}',
        f"  export MASTER_ADDR MASTER_PORT={master_port(job.id)}",
        "  export NNODES=$SLURM_JOB_NUM_NODES WORLD_SIZE=$SLURM_JOB_NUM_NODES",
        f'  exec {shlex.join(srun)} --ntasks="$NNODES" bash -c "$part" nebula-part '
        + " ".join(shlex.quote(s) for s in sources),
        "fi",
    ]
    if spec.image and config.runtime == "pyxis":
        lines.append(f'exec {shlex.join(srun)} --ntasks=1 bash -c "$part" nebula-part '
                     + " ".join(shlex.quote(s) for s in sources))
    else:
        lines.append('exec bash -c "$part" nebula-part '
                     + " ".join(shlex.quote(s) for s in sources))
    return "\n".join(lines) + "\n"

def _in_container(config: PoolConfig, submission: PoolSubmission) -> tuple[str, ...] | None:
    """The apptainer words before the job's command, or None (no image, or pyxis's)."""
    spec = submission.job.spec
    if not spec.image or config.runtime != "apptainer":
        return None
    binds = []
    for mount in spec.data_mounts:
        binds += ["--bind", mount]
    return ("apptainer", "exec", "--nv", *binds, spec.image)
