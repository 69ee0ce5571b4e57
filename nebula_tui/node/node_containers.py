"""The node side of container jobs: shipped with nodelet.py, stdlib only (Python 3.6+).

Which container runtimes this login can use (a fact of the hello), and a job's container,
found by the name its wrapper wrote to ``$jobdir/container`` (the name on the first line,
then the runtime's argv one word a line), signalled, stopped or removed through that same
runtime and user: its processes are children of the runtime's monitor, not of the job's
tmux session, so signalling the session alone would miss them. For the same reason a
container's GPU processes are told to be the job's by their cgroup, which names the
container's id (cgroups.py), and that id is asked of the runtime by the name
(``container_id``).
"""

import os
import re
import subprocess

CONTAINER_RUNTIMES = ("podman", "docker", "apptainer", "singularity")


def _call(argv, timeout):
    try:
        done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              universal_newlines=True, timeout=timeout)
        return done.returncode, done.stdout, done.stderr
    except (OSError, subprocess.TimeoutExpired) as err:
        return 127, "", str(err)


def container_runtimes():
    """{runtime: its version line} for each runtime this login can run. docker counts only
    when its daemon answers: a client alone runs nothing."""
    found = {}
    for name in CONTAINER_RUNTIMES:
        argv = [name, "version", "--format", "{{.Server.Version}}"] if name == "docker" \
            else [name, "--version"]
        code, out, _ = _call(argv, 10)
        if code == 0 and out.strip():
            found[name] = ("docker " if name == "docker" else "") + out.strip().splitlines()[0][:80]
    return found


def conda_tools(lookup):
    """The conda tools the launcher's lookup (a shell text) finds for this login."""
    if not lookup:
        return []
    code, out, _ = _call(["sh", "-c", lookup], 10)
    seen = []
    for line in out.splitlines():
        if line and line not in seen:
            seen.append(line)
    return seen


def job_container(jobdir):
    """(name, runtime argv) of the job's container, or None for a job that has none."""
    try:
        with open(os.path.join(jobdir, "container")) as f:
            words = f.read().splitlines()
    except OSError:
        return None
    return (words[0], words[1:]) if len(words) >= 2 else None


def container_signal(jobdir, name):
    """Send signal ``name`` (USR1, TERM) to the container's main process. True if sent."""
    found = job_container(jobdir)
    if found is None:
        return False
    container, argv = found
    return _call(argv + ["kill", "--signal", name, container], 30)[0] == 0


def container_stop(jobdir, grace):
    """SIGTERM, then SIGKILL after ``grace`` seconds; True if the container was there."""
    found = job_container(jobdir)
    if found is None:
        return False
    container, argv = found
    return _call(argv + ["stop", "-t", str(int(grace)), container], grace + 30)[0] == 0


def container_remove(jobdir):
    """Kill and remove the container at once (a stale attempt, a KILL)."""
    found = job_container(jobdir)
    if found is not None:
        container, argv = found
        force = ["rm", "-f", "-t", "0"] if os.path.basename(argv[-1]) == "podman" else ["rm", "-f"]
        _call(argv + force + [container], 60)


#: a container's full id (podman, docker, CRI-O and containerd all use 64 hex digits)
_CONTAINER_ID = re.compile(r"^[0-9a-f]{64}$")


def container_id(jobdir):
    """The full id of the job's container, asked of its runtime by the name the wrapper
    wrote; None for a job without one, or while it is not running (pulling, gone)."""
    found = job_container(jobdir)
    if found is None:
        return None
    container, argv = found
    code, out, _ = _call(argv + ["inspect", "--format", "{{.Id}}", container], 30)
    ident = out.strip().lower()
    return ident if code == 0 and _CONTAINER_ID.match(ident) else None
