"""The launcher: turns a placed job into the script its tmux session runs on the node.

Every string from a user (command, arguments, workdir, names) is quoted with
``shlex.quote`` before it reaches the node's shell, so it runs literally. The script is
written to ``$NEBULA_NODE_DIR/heads/<head>/jobs/<id>/<attempt>/run.sh`` by the node's
nodelet and run as ``tmux -L nebula new-session -d -s nebula-<id>-<head>``; the session and
its launch token are the idempotency key (R23).
"""

from __future__ import annotations

import re
import shlex
from importlib import resources
from dataclasses import dataclass

from .. import environments
from ..model import DEFAULT_VENDOR, GpuReading, Job, Placement, output_file
from . import containers, preflight, vendors
from .protocol import Hello

#: The node-side warm-up (R27), run by the wrapper with the node's python3.
WARMUP_SOURCE = (resources.files("nebula_tui.node") / "warmup.py").read_text()


#: the tmux server (``tmux -L``) of jobs on every node. One for every head: a socket of
#: each head's own would make its path longer, and a Unix socket's path has at most 107
#: bytes (tmux puts it in ``$TMUX_TMPDIR/tmux-UID/``); the sessions' names keep heads apart.
TMUX_SOCKET = "nebula"


def session_name(head: str, job_id: int) -> str:
    """The tmux session of one head's job on its node: ``nebula-<job>-<head>``, eight
    characters of the store's id telling heads apart (the nodelet names it the same way)."""
    return f"nebula-{job_id}-{head[:8]}"


def visible_devices(placements: tuple[Placement, ...],
                    devices: tuple[containers.Device, ...] | None = None) -> dict[str, str]:
    """R12: each vendor's device variables for the job's devices, in allocation order.

    ``devices`` (see :func:`job_devices`) say each card's vendor and its own number; without
    them every card is NVIDIA, known by its index. A MIG instance is named by its UUID. A
    job with no NVIDIA device gets an empty ``CUDA_VISIBLE_DEVICES``, so it never grabs the
    node's NVIDIA cards — unless it has AMD ones, which HIP would then hide too (the
    variables and these rules: ``vendors.VENDORS``).
    """
    devices = devices or tuple(containers.Device(p.gpu_uuid, p.gpu_index) for p in placements)
    ids: dict[str, list[str]] = {}
    for d in devices:
        ids.setdefault(d.vendor, []).append(d.uuid if d.uuid.startswith("MIG-") else str(d.index))
    read_too = {name for v in vendors.present(ids) for name in v.reads}
    env = {}
    for vendor in vendors.VENDORS:
        if vendor.name not in ids and not (vendor.hides_when_absent and
                                           not read_too & {v.name for v in vendor.visibility}):
            continue
        mine = ids.get(vendor.name, [])
        for variable in vendor.visibility:
            numbers = mine if variable.outside == "node" else [str(i) for i in range(len(mine))]
            env[variable.name] = variable.prefix + ",".join(numbers)
    return env


def job_environment(job: Job, placements: tuple[Placement, ...],
                    devices: tuple[containers.Device, ...] | None = None) -> dict[str, str]:
    """R12: what the job's process sees, in allocation order (``devices``: see
    :func:`visible_devices`)."""
    env = {
        "NEBULA_JOB_ID": str(job.id),
        "NEBULA_JOB_NAME": job.spec.name,
        "NEBULA_USER": job.user,
        "NEBULA_GPU_LIST": ",".join(p.gpu_uuid for p in placements),
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        **visible_devices(placements, devices),
        # What the job asked for per GPU (else its smallest reservation, on any of its
        # nodes: every rank reads the same); frameworks can cap their allocator with it. A
        # whole card given to a small request still says the request.
        "NEBULA_GPU_MEM_MB": str(job.spec.gpu_mem_mb
                                 or min(p.memory_mb for p in job.placements or placements)),
        # Logs are read while the job runs; Python would otherwise buffer them for minutes.
        "PYTHONUNBUFFERED": "1",
    }
    if job.spec.array_id is not None:  # a task of an array (--array)
        env["NEBULA_ARRAY_JOB_ID"] = str(job.spec.array_id)
        env["NEBULA_ARRAY_TASK_ID"] = str(job.spec.array_index)
    return env


def slice_environment(placements: tuple[Placement, ...], totals: dict[str, int | None]) -> dict[str, str]:
    """On a slice, tell the frameworks that take the whole card by default not to (the
    memory guard stops a job holding more than its reservation): JAX preallocates a share
    of the card (``XLA_PYTHON_CLIENT_MEM_FRACTION``, the slice's share of the smallest
    card), TensorFlow everything unless it may grow (``TF_FORCE_GPU_ALLOW_GROWTH``); the
    rest read ``NEBULA_GPU_MEM_MB``. Nothing on whole cards."""
    shares = [p.memory_mb / total for p in placements if not p.exclusive and (total := totals.get(p.gpu_uuid))]
    if not shares:
        return {}
    # a little under the share: the allocator's own bookkeeping must fit the slice too
    fraction = max(0.01, min(shares) - 0.01)
    return {"XLA_PYTHON_CLIENT_MEM_FRACTION": f"{fraction:.2f}", "TF_FORCE_GPU_ALLOW_GROWTH": "true"}


#: Runs the text of $NEBULA_COMMAND in this shell, as ``sh -c`` would, without the text (or
#: the variable) going to any other process.
EVAL_COMMAND = 'nebula_command=$NEBULA_COMMAND; unset NEBULA_COMMAND; eval "$nebula_command"'


# Runs as the job's user: enter the workdir (default: that user's home), activate the
# conda env or venv, then run the command, which comes as shell text in $NEBULA_COMMAND
# (:func:`command_text`). Nothing user-given is inside this text, and nothing the head adds
# is on any command line: a node's other users read every process's argv (`ps -eo args`)
# unless /proc hides it, while a process's environment is its user's and root's alone.
_ENTER_AND_RUN = ('cd -- "${NEBULA_WORKDIR:-$HOME}" || { '
                  'printf "%s\\n" "nebula: cannot enter workdir ${NEBULA_WORKDIR:-$HOME}" >&2; '
                  'exit 127; }\n'
                  # -o/-e (sbatch's): the output goes to those files, relative to the workdir
                  '[ -z "${NEBULA_OUTPUT-}" ] || exec >"$NEBULA_OUTPUT" 2>&1 || exit 127\n'
                  '[ -z "${NEBULA_ERROR-}" ] || [ "$NEBULA_ERROR" = "${NEBULA_OUTPUT-}" ] || '
                  'exec 2>"$NEBULA_ERROR" || exit 127\n'
                  'unset NEBULA_OUTPUT NEBULA_ERROR\n' + preflight.ACTIVATE
                  # exec'd, not run in the subshell: the command's shell must carry the job's
                  # variables in its own environment (/proc/PID/environ), which is how the
                  # nodelet finds the processes SIGUSR1 goes to (a trap there checkpoints);
                  # its argv is this fixed text alone; and a fresh shell, as `sh -c TEXT` was,
                  # sees none of the wrapper's functions or variables
                  + "exec sh -c " + shlex.quote(EVAL_COMMAND))
#: The same for an argv command (``exec`` and its quoted words, nothing the shell expands):
#: its ``exec`` from the subshell itself gives the program the same argv and environment
#: (the exported variables alone) that a fresh shell's would, without that shell's start.
_ENTER_AND_EXEC = _ENTER_AND_RUN[:-len("exec sh -c " + shlex.quote(EVAL_COMMAND))] + EVAL_COMMAND


def gang_environment(job: Job, node: str, master_host: str, nodes: list[str],
                     socket_ifname: str | None) -> dict[str, str]:
    """R12 for a job of several GPUs, on one node or across several: what torchrun and NCCL
    need on ``node``, the same names however the scheduler placed it (``torchrun
    --nnodes=$NNODES --node-rank=$NODE_RANK --nproc-per-node=$NPROC_PER_NODE
    --master-addr=$MASTER_ADDR --master-port=$MASTER_PORT``). ``WORLD_SIZE`` counts every
    GPU of the job; ``NPROC_PER_NODE`` this node's (a gang split 4+2 gets 4 and 2)."""
    env = {
        "MASTER_ADDR": master_host,
        # One port per job, so two jobs sharing the first node never collide.
        "MASTER_PORT": str(29500 + job.id % 20000),
        "NNODES": str(len(nodes)),
        "NODE_RANK": str(nodes.index(node)),
        "NPROC_PER_NODE": str(sum(1 for p in job.placements if p.node == node)),
        "WORLD_SIZE": str(len(job.placements)),
    }
    if len(nodes) > 1:
        env["NCCL_IB_DISABLE"] = "1"
    if socket_ifname:
        env["NCCL_SOCKET_IFNAME"] = socket_ifname
    return env


@dataclass(frozen=True)
class NodeFacts:
    """What the launcher knows of the node a part runs on (nodes.yaml and its hello)."""

    name: str
    runtimes: tuple[str, ...] = ()  # the container runtimes its login can use
    runtime: str | None = None  # the one nodes.yaml pins, if any
    root: bool = False  # the login user is root: rootful podman, runuser
    warmup: bool = False  # nodes.yaml's warmup: every job's cards are woken first (R27)
    #: indexes of NVIDIA cards whose driver runs without persistence mode
    no_persistence: tuple[int, ...] = ()
    #: a WSL2 node's NVIDIA cards (uuids): its containers get every GPU or none, so a
    #: container job there must hold them all; () elsewhere
    wsl2_gpus: tuple[str, ...] = ()


def node_facts(name: str, hello: Hello, runtime: str | None = None,
               warmup: bool = False) -> NodeFacts:
    """A node's facts from its nodes.yaml entry (``runtime``, ``warmup``) and its hello."""
    off = [d["index"] for d in hello.devices
           if d.get("vendor") == "nvidia" and d.get("persistence_mode") == "Disabled"]
    wsl2 = hello.platform.get("kind") == "wsl2"
    cards = [d.get("uuid") for d in hello.devices
             if d.get("vendor") == "nvidia" and not d.get("parent_uuid")] if wsl2 else []
    return NodeFacts(
        name=name, runtimes=tuple(r for r in environments.RUNTIMES if r in hello.runtimes),
        runtime=runtime, root=hello.uid == 0, warmup=warmup, no_persistence=tuple(off),
        wsl2_gpus=tuple(c for c in cards if c))


def job_devices(placements: tuple[Placement, ...],
                readings: dict[str, GpuReading]) -> tuple[containers.Device, ...]:
    """The allocated cards with what a container and the device variables need of each:
    vendor, the vendor's own number for it (on a node of two vendors the node's index is
    not the Intel card's Level Zero number), PCI address."""
    devices = []
    for p in placements:
        r = readings.get(p.gpu_uuid)
        own = int(r.visible_id) if r and r.visible_id and r.visible_id.isdigit() else p.gpu_index
        devices.append(containers.Device(p.gpu_uuid, own, r.vendor if r else DEFAULT_VENDOR,
                                         r.pci_bus_id if r else None))
    return tuple(devices)


_SHELL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _env_words(env: dict[str, str]) -> list[str]:
    return [f"{k}={v}" for k, v in env.items()]


@dataclass(frozen=True)
class LaunchPlan:
    """One part of a job on its node, worked out once (:func:`launch_plan`): the run script is
    written from it (:func:`script`) and ``nebula job`` shows its ``environment``, so what
    the head shows is what the command gets."""

    job: Job
    placements: tuple[Placement, ...]  # the job's cards on this node
    node: NodeFacts
    #: the cards as their vendor's variables and a container need them (:func:`job_devices`)
    devices: tuple[containers.Device, ...]
    #: every variable the head gives the command there, in order: R12's, a gang's and a
    #: slice's, and outside a container the workdir, conda env and venv asked for (the node
    #: adds only what it alone knows: the workdir it settled on, the conda tool it found)
    variables: tuple[tuple[str, str], ...]
    run_as: tuple[str, ...] = ()  # the prefix that runs it as its owner (``run_as: submitter``)
    log_max_mb: int | None = None  # the log's cap (``limits.log_max``; see ``_log_writer``)

    @property
    def environment(self) -> dict[str, str]:
        return dict(self.variables)

    def container_runtime(self) -> str:
        """The runtime that runs the job's image here (raises containers.NoRuntime)."""
        spec = self.job.spec
        return containers.choose_runtime(self.node.name, spec.image, self.node.runtimes,
                                         spec.runtime, self.node.runtime)

    @property
    def seen_environment(self) -> dict[str, str]:
        """The variables as the command sees them: in a podman or docker container, which
        holds only its cards, each vendor's renumbered; apptainer shares the node's devices
        and numbers, so there (and with no image) they are the node's."""
        if self.job.spec.image is None:
            return self.environment
        try:
            runtime = self.container_runtime()
        except containers.NoRuntime:
            return self.environment  # it fails with that sentence before anything runs
        if runtime in environments.FILE_RUNTIMES:
            return self.environment
        return containers.container_env(self.environment, self.devices)


def launch_plan(job: Job, placements: tuple[Placement, ...], run_as: tuple[str, ...] = (),
         extra_env: dict[str, str] | None = None, node: NodeFacts | None = None,
         devices: tuple[containers.Device, ...] | None = None,
         log_max_mb: int | None = None) -> LaunchPlan:
    """The plan of the part holding ``placements``: ``extra_env`` (a gang's, a slice's) joins
    R12's variables; without ``node`` it is the placements' node knowing nothing more, and
    without ``devices`` the cards are NVIDIA's by their placements."""
    node = node or NodeFacts(placements[0].node if placements else "its node")
    devices = devices or tuple(containers.Device(p.gpu_uuid, p.gpu_index) for p in placements)
    # --export's variables first: the job's own (NEBULA_*, the devices) win over them
    env = {**dict(job.spec.export_env), **job_environment(job, placements, devices), **(extra_env or {})}
    if job.spec.image is None:
        for key, value in (("NEBULA_WORKDIR", job.spec.workdir), ("NEBULA_CONDA", job.spec.conda),
                           ("NEBULA_VENV", job.spec.venv)):
            if value:
                env[key] = value
    return LaunchPlan(job, placements, node, devices, tuple(env.items()), run_as, log_max_mb)


def output_files(job: Job) -> dict[str, str]:
    """-o/-e as the environment its user's shell reads them from (patterns filled)."""
    return {name: output_file(pattern, job.id, job.spec, job.user)
            for name, pattern in (("NEBULA_OUTPUT", job.spec.output), ("NEBULA_ERROR", job.spec.error))
            if pattern}


def command_text(job: Job) -> dict[str, str]:
    """The job's command as the environment its user's shell reads it from: shell text in
    ``NEBULA_COMMAND`` (an argv joined and quoted, run by ``exec``), never in an argv. A
    ``nebula run`` command gets its terminal from ``script``, which runs the text (then in
    ``NEBULA_TTY_COMMAND``) with the user's shell."""
    text = job.spec.command[0] if job.spec.shell else "exec " + shlex.join(job.spec.command)
    if job.spec.interactive and job.spec.image is None:
        # (its output is the log's through the wrapper's tee; script returns its exit code)
        return {"NEBULA_TTY_COMMAND": text, "NEBULA_COMMAND":
                "exec script -q -e -f -c 'c=$NEBULA_TTY_COMMAND; unset NEBULA_TTY_COMMAND; "
                "eval \"$c\"' /dev/null"}
    return {"NEBULA_COMMAND": text}


def _as_user(run_as: tuple[str, ...], env: dict[str, str], facts: str, script: str,
             name: str, args: list[str] = ()) -> str:
    """The wrapper's line that runs ``script`` (fixed text) as the job's user with ``env``
    and ``facts`` (``"NAME=$var"`` words the wrapper expands). The values never reach a
    command line: they are exported in a subshell of the wrapper, which runs the script
    itself (the login user's own job: two processes fewer) or through ``runuser``, which
    keeps the environment. sudo clears it, so through sudo they travel as ``env``'s words,
    which other users of the node can read unless /proc is mounted with hidepid
    (docs/security.md)."""
    if all(map(_SHELL_NAME.fullmatch, env)) and run_as[:1] in ((), ("runuser",)):
        exports = f"export {facts} {_q(_env_words(env))}".rstrip()
        if not run_as:
            return f"( {exports}; set -- {_q(args)}\n{script}\n)"
        return f"( {exports}; exec {_q([*run_as, 'sh', '-c', script, name, *args])} )"
    return f"{_q([*run_as, 'env'])} {facts} {_q([*_env_words(env), 'sh', '-c', script, name, *args])}"


# The wrapper's own helpers (fixed text). `fail` ends the job before its command: the
# sentence becomes its reason (written before the exit code, which the nodelet waits for),
# its data mounts' staging mounts released first where they were pinned;
# `phase` tells what it is doing meanwhile (pulling an image).
_WRAPPER_HELPERS = r"""fail() {
  [ -z "${pins_py:-}" ] || python3 -c "$pins_py" release "$jobdir/mnt" >/dev/null 2>&1
  printf '%s\n' "$1" > "$jobdir/reason.tmp" && mv -f "$jobdir/reason.tmp" "$jobdir/reason"
  printf 'nebula: %s\n' "$1"
  ended 127
  exit 127
}
ended() {  # the exit code in one short write; on a full disk, into the room kept at the start
  printf '%s\n' "$1" > "$jobdir/exit_code" 2>/dev/null ||
    { printf '%s' "$1" 1<> "$jobdir/exit_code.room" && mv -f "$jobdir/exit_code.room" "$jobdir/exit_code"; }
}
phase() {
  if [ -n "$1" ]; then
    printf '%s\n' "$1" > "$jobdir/phase.tmp" && mv -f "$jobdir/phase.tmp" "$jobdir/phase"
    printf 'nebula: %s\n' "$1"
  else
    rm -f "$jobdir/phase"
  fi
}
fact() {  # $_fact: the first "$1=" line of the facts, found in the shell itself (no sed,
  # and no $(fact) subshell: each fork is a good part of a short job's start)
  _fact="
$facts"
  case $_fact in *"
$1="*) _fact=${_fact#*"
$1="}; _fact=${_fact%%"
"*} ;; *) _fact= ;; esac
}
"""


def run_script(job: Job, placements: tuple[Placement, ...], run_as: tuple[str, ...] = (),
               extra_env: dict[str, str] | None = None, node: NodeFacts | None = None,
               devices: tuple[containers.Device, ...] | None = None,
               log_max_mb: int | None = None) -> str:
    """The run script of the part holding ``placements`` (:func:`launch_plan` says the rest)."""
    return script(launch_plan(job, placements, run_as, extra_env, node, devices, log_max_mb))


def script(plan: LaunchPlan) -> str:
    """The wrapper the tmux session runs: log, start and exit markers around the command.

    The wrapper itself runs as the node's login user (it owns the job directory); the
    checks and the command run as ``run_as``. Output goes both to the pane (for ``nebula
    attach``) and to ``output.log``; the exit code lands in ``exit_code`` in one write.
    In order: the checks (a missing workdir, env, tool or mount source ends the job with a
    sentence in ``reason``), ``started``, the image pull (``phase``), the warm-up, the
    command, with the plan's variables.
    """
    job, node, run_as = plan.job, plan.node, plan.run_as
    spec = job.spec
    boxed = spec.image is not None
    checks = preflight.check_env(node.name, None if boxed else spec.workdir,
                                 None if boxed else spec.submit_dir, spec.conda, spec.venv,
                                 spec.interactive and not boxed)
    sources = [environments.split_mount(m)[0] for m in spec.data_mounts]
    if run_as or len(checks) > 1 or sources:
        # as the job's user: through the switch, or the login user's own in a subshell
        check = _as_user(run_as, checks, "", preflight.CHECKS if run_as else 'nebula_check "$@"',
                         "nebula-check", sources)
    else:  # nothing to check (no workdir, env, terminal or mount) and no user to switch to
        check = None
    body = [
        # The wrapper's marks are the login account's alone (umask 077): no job reads or
        # forges another's; the command gets the umask the node gave the wrapper.
        # The sentence is the last line (before it: what a tool or sudo printed).
        *([] if run_as or check is None else [f"nebula_check() {{\n{preflight.CHECKS}}}"]),
        "facts=" if check is None else
        f"if ! facts=$( {check} 2>&1); then fail \"$(printf '%s\\n' \"$facts\" | tail -n 1)\"; fi",
        'fact workdir; workdir_fact=$_fact; fact conda; conda_fact=$_fact',
        'printf "%s" "$workdir_fact" > "$jobdir/workdir"',
        ': > "$jobdir/started"  # its mtime is the start time',
        *_warmup_lines(plan),
    ]
    body.append('umask "$job_umask"')
    if boxed:
        body += _container_lines(plan)
    else:
        env = {**plan.environment, **command_text(job), **output_files(job)}
        # the facts the checks found join the environment
        body.append(_as_user(run_as, env, '"NEBULA_WORKDIR=$workdir_fact" '
                             '"NEBULA_CONDA_TOOL=$conda_fact"',
                             _ENTER_AND_RUN if spec.shell else _ENTER_AND_EXEC, "nebula-job"))
    # One short write: a reader sees an empty file or the whole number, and the nodelet
    # waits for a non-empty one.
    body.append('code=$?; umask 077; ended $code')
    lines = [
        "#!/bin/sh",
        # No user-given text on comment lines: a newline in it would end the comment.
        f"# NebulaGrid job {job.id}: generated by the head; do not edit.",
        'jobdir="$1"  # given by the nodelet: the directory this script lives in',
        f"job={int(job.id)}",
        # the umask the nodelet runs with, given as $2 (else asked here: a fork more)
        'job_umask=${2:-$(umask)}; umask 077',
        'log="$jobdir/output.log"  # made by the nodelet, readable by the job owner alone',
        ': > "$log"',
        # Room kept now for what must be written when the disk may be full: the exit code,
        # and what tee says when it cannot write the log (no process more: builtins).
        "printf '%15s\\n' '' > \"$jobdir/exit_code.room\"; printf '%511s\\n' '' > \"$jobdir/log_cut\"",
        # (rm only when there is something to remove: a process less for every job)
        'for mark in reason phase container; do [ ! -e "$jobdir/$mark" ] || rm -f "$jobdir/$mark"; done',
        _WRAPPER_HELPERS + containers.HELPERS + "{",
        *body,  # never re-indented: a quoted word may span lines
        '} 2>&1 | ' + _log_writer(plan.log_max_mb),
        # The exit code above is written before tee has copied the last output to the log:
        # the watcher reports the exit once this says the log is whole (or after a grace,
        # when a process the job left behind keeps its output open).
        '{ : > "$jobdir/logged"; } 2>/dev/null',
    ]
    return "\n".join(lines) + "\n"


def _log_writer(log_max_mb: int | None) -> str:
    """The tee that copies the job's output to its pane and its log, the log capped at
    ``log_max_mb`` for no process more: the kernel's file-size limit (``ulimit -f``, in
    512-byte blocks) makes tee's writes to the log fail past the cap (SIGXFSZ ignored, so
    tee lives and goes on writing to the pane: the job never meets a closed pipe). What tee
    says of a write that failed (the cap, a full disk) goes to ``log_cut``, from which the
    nodelet writes the line that ends the log (``Watcher.look_log_cut``)."""
    tee = 'tee -a "$log" 2<> "$jobdir/log_cut"'
    if log_max_mb is None:
        return tee
    return f"(trap '' XFSZ; ulimit -f {int(log_max_mb) * 2048} 2>/dev/null; exec {tee})"


def _warmup_lines(plan: LaunchPlan) -> list[str]:
    """R27: wake the job's NVIDIA cards on the host before its command (in a container
    too: the driver is the host's), and say when a card runs without persistence mode."""
    job, node, devices, placements = plan.job, plan.node, plan.devices, plan.placements
    if not (job.spec.warmup or node.warmup):
        return []
    lines = []
    for index in sorted(set(node.no_persistence) & {p.gpu_index for p in placements}):
        warning = (f"nebula: warning: GPU {index} of {node.name} runs without persistence mode, "
                   "so its driver starts afresh for each job; fix: `sudo nvidia-smi -pm 1` on "
                   f"{node.name} (or enable the nvidia-persistenced service)")
        lines.append(f"printf '%s\\n' {shlex.quote(warning)}")
    woken = [d for d in devices if (v := vendors.BY_NAME.get(d.vendor)) and v.warms_up]
    if not woken:
        return [*lines, "echo 'nebula: warm-up skipped: it is for NVIDIA cards'"]
    visible = ",".join(str(d.index) for d in woken)
    return [*lines, f"CUDA_VISIBLE_DEVICES={visible} python3 -c {shlex.quote(WARMUP_SOURCE)} "
                    f"{shlex.quote(node.name)} || true"]


def _q(words) -> str:
    return " ".join(shlex.quote(w) for w in words)


_WSL2_PARTIAL = ("{node} is a WSL2 node, where a container gets every GPU or none; a container "
                 "job there takes all {n} of its GPU{s} (--gpus {n}), or runs without --image")


def _container_lines(plan: LaunchPlan) -> list[str]:
    job, node, devices, run_as = plan.job, plan.node, plan.devices, plan.run_as
    spec = job.spec
    assert spec.image is not None
    if node.wsl2_gpus and set(node.wsl2_gpus) - {d.uuid for d in devices}:
        n = len(node.wsl2_gpus)
        return [f"fail {shlex.quote(_WSL2_PARTIAL.format(node=node.name, n=n, s='s' * (n != 1)))}"]
    try:
        runtime = plan.container_runtime()
    except containers.NoRuntime as why:
        return [f"fail {shlex.quote(str(why))}"]
    env = plan.environment
    command = ["sh", "-c", spec.command[0]] if spec.shell else list(spec.command)
    if runtime in environments.FILE_RUNTIMES:
        if spec.shell and run_as[:1] in ((), ("runuser",)):  # as podman's below
            env, command = {**env, "NEBULA_COMMAND": spec.command[0]}, ["sh", "-c", EVAL_COMMAND]
        lines = containers.apptainer_lines(runtime, spec.image, env, devices, node.name,
                                           spec.workdir, spec.data_mounts, run_as)
        pinned = False
    else:
        # A rootful runtime starts the container and runs the command by the job's user's
        # uid; rootless podman runs as that user itself and maps its own uid in.
        rootless = runtime == "podman" and not node.root
        # A root runtime would open the user's mount sources as root, later than the checks
        # (a symlink swapped meanwhile reaches any file): it gets them as the user opened them.
        pinned = bool(run_as and spec.data_mounts and not rootless)
        if pinned and not node.root:
            return [f"fail {shlex.quote(_UNPINNABLE.format(node=node.name, runtime=runtime))}"]
        prefix = run_as if rootless else ()
        # The runtime gets the job's variables by name from its own environment, and a shell
        # command as $NEBULA_COMMAND, unless sudo (which clears the environment) is between.
        by_name = prefix[:1] in ((), ("runuser",))
        if spec.shell and by_name:
            env, command = {**env, "NEBULA_COMMAND": spec.command[0]}, ["sh", "-c", EVAL_COMMAND]
        lines = containers.podman_lines(
            runtime, spec.image, env, devices, node.name, spec.workdir, spec.data_mounts,
            job.user if run_as else None, prefix, rootless,
            interactive=spec.interactive, pin=pinned, by_name=by_name)
    return [*lines, f"{containers.ADD} {_q(command)}", '"$@"',
            *([containers.RELEASE_PINS] if pinned else [])]


#: A root runtime reached through a login that is not root: its mounts cannot be pinned.
_UNPINNABLE = ("{node}'s {runtime} runs as root and would open a --data-mount's source as root, "
               "not as the job's user; data mounts there need the node's login to be root "
               "(nodes.yaml's user) or rootless podman")
