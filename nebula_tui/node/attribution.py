"""Whose is a process on the node (node side; shipped with the nodelet, stdlib only, Python
3.6+): a job's, by its tmux pane, its container's cgroup or its pane's systemd scope; else
the Unix user owning it. Also a job's own processes, for its signals.
"""

import os
import pwd
import threading

from .cgroups import cgroup_container_id, pane_scope
from .job_dirs import latest_dir
from .node_base import job_of_session, read_text, session_pids, tmux
from .node_containers import container_id


def pids_to_jobs(pids):
    """Which of these pids belong to one of this head's jobs: those descended from a job
    session's pane on this head's tmux server, those in the cgroup of a job's container
    (whose processes are children of the runtime's monitor, not of the pane) and those in
    a job pane's own systemd scope (which left its process tree: a daemon, a double fork).
    /proc tells parents and cgroups whatever user a job runs as; an environment
    (NEBULA_JOB_ID) anyone can set is never taken for a job."""
    panes = pane_jobs() if pids else {}
    found = {}
    containers = scopes = None
    for pid in pids:
        ancestor, steps = pid, 0
        while ancestor > 1 and steps < 100:
            if ancestor in panes:
                found[str(pid)] = panes[ancestor]
                break
            ancestor, steps = _ppid(ancestor), steps + 1
        if str(pid) in found:
            continue
        if containers is None:
            containers = container_jobs(set(panes.values()))
            scopes = pane_scopes(panes)
        cgroup = read_text("/proc/%d/cgroup" % pid) if containers or scopes else None
        job = containers.get(cgroup_container_id(cgroup)) or scopes.get(pane_scope(cgroup))
        if job:
            found[str(pid)] = job
    return found


def pane_scopes(panes):
    """{the systemd scope of a job's pane: its job}, for panes tmux started in a scope of
    their own (cgroups.pane_scope); a scope two jobs' panes share is nobody's."""
    found, shared = {}, set()
    for pid, job in panes.items():
        scope = pane_scope(read_text("/proc/%d/cgroup" % pid))
        if scope is None:
            continue
        if found.get(scope, job) != job:
            shared.add(scope)
        found[scope] = job
    return dict((s, j) for s, j in found.items() if s not in shared)


_CONTAINER_IDS = {}  # attempt directory -> its container's id (asked once per attempt)
_CONTAINER_IDS_LOCK = threading.Lock()  # the probe and the kernel-log reader both ask


def container_jobs(jobs):
    """{container id: job} of these jobs' containers here. An id two jobs claim is
    nobody's (a job's directory names the container it ran, not one it may choose)."""
    with _CONTAINER_IDS_LOCK:
        return _container_jobs(jobs)


def _container_jobs(jobs):
    found, claimed = {}, set()
    for job in jobs:
        d = latest_dir(job)
        if d is None:
            continue
        ident = _CONTAINER_IDS.get(d)
        if ident is None:
            ident = container_id(d)
            if ident is not None:
                _CONTAINER_IDS[d] = ident
        if ident in found:
            claimed.add(ident)
        elif ident is not None:
            found[ident] = job
    live = set(latest_dir(j) for j in jobs)
    for d in [d for d in _CONTAINER_IDS if d not in live]:
        del _CONTAINER_IDS[d]  # ended attempts
    return dict((i, j) for i, j in found.items() if i not in claimed)


def pane_jobs():
    """{pane pid: job} of every job session of this head."""
    code, out, _ = tmux(["list-panes", "-a", "-F", "#{session_name} #{pane_pid}"])
    found = {}
    for line in out.splitlines() if code == 0 else []:
        name, _, pid = line.partition(" ")
        job = job_of_session(name)
        if job and pid.strip().isdigit():
            found[int(pid)] = job
    return found


def _ppid(pid):
    stat = read_text("/proc/%d/stat" % pid)
    try:
        # The command name may hold spaces and parentheses: fields resume after the last ')'.
        return int(stat.rsplit(")", 1)[1].split()[1])
    except (AttributeError, IndexError, ValueError):
        return 0


def pids_to_users(pids):
    """The Unix user owning each of these pids (processes we did not start, for reasons
    and the memory guard: "pid 4242 of alice holds 20 GB")."""
    found = {}
    for pid in pids:
        try:
            uid = os.stat("/proc/%d" % pid).st_uid
            found[str(pid)] = pwd.getpwuid(uid).pw_name
        except (OSError, KeyError):
            continue
    return found


def _children():
    """ppid -> [pid] from /proc."""
    tree = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            tree.setdefault(_ppid(int(name)), []).append(int(name))
    return tree


def descendants(pids):
    tree, out, todo = _children(), [], list(pids)
    while todo:
        for child in tree.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _job_of(pid):
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            for item in f.read().split(b"\0"):
                if item.startswith(b"NEBULA_JOB_ID="):
                    return item.split(b"=", 1)[1].decode("ascii", "replace")
    except OSError:
        pass
    return None


def job_processes(job):
    """The processes of the job's own command: the session's descendants that carry its
    NEBULA_JOB_ID. Not the wrapper shell and its tee, which must outlive a SIGUSR1 to write
    the exit code and keep the log; when the environment cannot be read (the command runs
    as another user), every descendant but those two."""
    panes = session_pids(job)
    below = descendants(panes)
    own = [pid for pid in below if _job_of(pid) == str(job)]
    if own:
        return own
    wrapper = set(read_text("/proc/%d/cmdline" % pid) for pid in panes)
    return [pid for pid in below if read_text("/proc/%d/cmdline" % pid) not in wrapper
            and (read_text("/proc/%d/comm" % pid) or "").strip() != "tee"]
