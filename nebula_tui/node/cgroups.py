"""What a process's cgroup says of whose it is, from the text of /proc/PID/cgroup: the
container it runs in, and the tmux pane's scope it was started in. Node side, shipped
with the nodelet; stdlib only (Python 3.6+). Parsed defensively: any text, a line or a
path of any shape, gives an answer or None, never an error.

A line is ``HIERARCHY:CONTROLLERS:PATH``: v2 has one, ``0::/…``; v1 one per hierarchy
(``4:memory:/…``, ``1:name=systemd:/…``).
"""

import re

#: at most this many lines of a /proc/PID/cgroup are read (v1 has one per hierarchy)
CGROUP_LINES_MAX = 64
#: one path segment naming a container: ``libpod-ID``, ``libpod-ID.scope``,
#: ``docker-ID.scope``, ``crio-ID.scope``, ``cri-containerd-ID.scope`` (systemd's manager),
#: or the bare ``ID`` under ``/docker/`` or ``/kubepods/…/`` (cgroupfs)
_ID_SEGMENT = re.compile(r"^(?:[a-z][a-z-]*-)?([0-9a-f]{64})(?:\.scope)?$")
#: the scope tmux (3.3 and later, built with systemd) puts each new pane's process in
_PANE_SCOPE = re.compile(r"^tmux-spawn-[0-9a-f-]{8,64}\.scope$")


def _paths(text):
    """Each line's path, in the file's order (lines that are not cgroup lines left out)."""
    for line in (text or "").splitlines()[:CGROUP_LINES_MAX]:
        fields = line.split(":", 2)
        if len(fields) == 3 and fields[2].startswith("/"):
            yield fields[0], fields[1], fields[2].strip()


def cgroup_container_id(text):
    """The id of the container a process runs in (v2 ``0::/machine.slice/libpod-ID.scope/
    container``, v1 ``4:memory:/docker/ID``), or None: not in a container, or text that is
    not a cgroup file. A runtime's monitor, in ``libpod-conmon-ID.scope``, is not in the
    container. The innermost container named wins: a container inside a container is its own."""
    for _, _, path in _paths(text):
        found = None
        for segment in path.split("/"):
            match = _ID_SEGMENT.match(segment)
            if match and "conmon" not in segment:
                found = match.group(1)
        if found:
            return found
    return None


def systemd_path(text):
    """The process's place in systemd's tree: the v2 path, else v1's ``name=systemd`` one
    (also where a hybrid system leaves v2's at its root); None when the text has neither."""
    unified = systemd = None
    for hierarchy, controllers, path in _paths(text):
        if (hierarchy, controllers) == ("0", ""):
            unified = path
        elif controllers == "name=systemd":
            systemd = path
    if unified in (None, "/") and systemd is not None:
        return systemd
    return unified


def pane_scope(text):
    """The tmux pane scope (``…/tmux-spawn-UUID.scope``) a process is in, or None. A pane's
    scope holds only what was started in that pane, whatever became of its parents, so a
    process there that left the pane's process tree (a daemon, a double fork) is still
    that pane's; a shared place (a login session, a user's service) is never taken for one."""
    path = systemd_path(text)
    if path and _PANE_SCOPE.match(path.rstrip("/").rsplit("/", 1)[-1]):
        return path.rstrip("/")
    return None
