#!/bin/sh
# Makes `podman run` work on this machine (as root), for the container jobs of the tests and
# of a node: installs podman (Debian's 4.3), runc and busybox-static, imports a tiny image
# made offline from busybox, and where a plain run fails, writes
# /etc/containers/containers.conf.d/50-nebula.conf with what does run. Safe to run again.
# Images: localhost/nebula-busybox (the tests') and localhost/nebula-python:3.11 (the
# README's example), see nebula_tui/sim/images.py.
#
# What stops podman 4.3 here, and what this writes instead:
# - The process may not raise its own limits (no CAP_SYS_RESOURCE), and podman asks for
#   RLIMIT_NOFILE/RLIMIT_NPROC of 1048576 each: "setrlimit `RLIMIT_NOFILE`: Operation not
#   permitted". A `--ulimit` on the command line replaces podman's defaults only for that
#   limit, so both are set here, in `default_ulimits`, within what this shell may have:
#   the hard nofile limit, and an nproc no higher than the kernel's pid_max (podman itself
#   runs with nproc lowered to that, and the container may not exceed it).
# - crun 1.8 refuses a hybrid cgroup layout ("cgroups in hybrid mode not supported, drop
#   all controllers from cgroupv2") when a controller (hugetlb, here) sits on the v2
#   hierarchy while the rest are v1; runc runs there, so it becomes the runtime.
# Only when the plain run fails is anything written; the run is then tried again and its
# own words are printed if it still fails (the tests then skip with them).
set -u
cd "$(dirname "$0")/.."
image=localhost/nebula-busybox:latest
conf=/etc/containers/containers.conf.d/50-nebula.conf
[ "$(id -u)" = 0 ] || { echo "podman-setup: needs root; container tests will skip" >&2; exit 0; }
need=""
command -v podman >/dev/null 2>&1 || need="$need podman"
command -v runc >/dev/null 2>&1 || need="$need runc"
[ -x /bin/busybox ] || need="$need busybox-static"
if [ -n "$need" ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $need >/dev/null 2>&1 || {
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $need >/dev/null
    } || { echo "podman-setup: could not install$need; container tests will skip" >&2; exit 0; }
fi
# The tests' image and the README's python image, made offline from this machine's files.
python3 nebula_tui/sim/images.py busybox python >/dev/null || exit 0
try() { (cd / && podman run --rm "$image" true 2>&1); }
if out=$(try); then
    exit 0
fi
# The hard limits, as the kernel lists them ("Max open files  SOFT  HARD  files").
nofile=$(awk '/^Max open files/ {print $5}' /proc/self/limits)
nproc=$(awk '/^Max processes/ {print $4}' /proc/self/limits)
pid_max=$(cat /proc/sys/kernel/pid_max 2>/dev/null || echo 32768)
[ "$nproc" = unlimited ] || [ "$nproc" -gt "$pid_max" ] && nproc=$pid_max
[ "$nofile" = unlimited ] && nofile=1048576
mkdir -p "$(dirname "$conf")"
{
    echo "# Written by NebulaGrid's scripts/podman-setup.sh: what lets podman run on this host."
    echo "[containers]"
    echo "default_ulimits = [\"nofile=$nofile:$nofile\", \"nproc=$nproc:$nproc\"]"
} > "$conf"
if out=$(try); then
    echo "podman-setup: podman runs with $conf"
    exit 0
fi
# Next: runc instead of crun (the hybrid cgroup layout above).
printf '[engine]\nruntime = "runc"\n' >> "$conf"
if out=$(try); then
    echo "podman-setup: podman runs with $conf (runc)"
else
    echo "podman-setup: podman still cannot run a container here: $out" >&2
fi
exit 0
