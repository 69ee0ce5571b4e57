#!/bin/sh
# Installs what the TESTS need on this Debian/Ubuntu machine (as root), a line per step with
# its time: OpenSSH's sshd and client (the lab's nodes), zsh (completion tests), a sendmail
# (mail tests), a C compiler (the simulated NVML), libfaketime (clock steps), a real Slurm
# with its accounting (pool tests), podman (container jobs), and debootstrap with
# systemd-container and the head box's root in /var/cache/nebula-box (tests/lab/test_box.py),
# sudo (a user running the line `nebula demo --slurm` prints).
# `make test` runs it; `make demo` needs none of it. Not root: it says what is missing and
# the tests that need it skip. Safe to run again: it skips what is already there.
set -u
cd "$(dirname "$0")/.."
t0=$(date +%s)
say() { echo "test-deps: $* ($(( $(date +%s) - t0 )) s)"; }
missing() {  # the packages of "$@" that dpkg does not have installed
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' ||
            printf ' %s' "$pkg"
    done
}
need=$(missing tmux openssh-server openssh-client zsh libfaketime debootstrap systemd-container sudo)
[ -e /usr/sbin/sendmail ] || need="$need msmtp-mta"
command -v cc >/dev/null 2>&1 || need="$need gcc libc6-dev"
slurm=$(missing slurm-wlm munge slurmdbd mariadb-server)
if [ "$(id -u)" != 0 ]; then
    [ -z "$need$slurm" ] || say "not root: the tests that need$need$slurm skip" \
        "(sudo apt-get install -y$need$slurm)"
    exit 0
fi
updated=""
apt() {
    [ -n "$updated" ] || { say "apt-get update"; apt-get update -qq; updated=1; }
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}
if [ -n "$need" ]; then
    say "installing$need"
    apt $need || { echo "test-deps: could not install$need" >&2; exit 1; }
    # The system's sshd is the lab's program only: the tests start their own on free ports.
    if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
        systemctl disable --now ssh.service >/dev/null 2>&1 || true
    fi
fi
if [ -n "$slurm" ]; then
    say "installing Slurm:$slurm (nothing of it is started here)"
    apt $slurm || say "could not install$slurm; the Slurm pool tests will skip"
fi
say "podman for the container jobs"
sh scripts/podman-setup.sh
if [ -f "${NEBULA_BOX_CACHE:-/var/cache/nebula-box}/root/.nebula-box-ready" ]; then
    say "the head box's root is in ${NEBULA_BOX_CACHE:-/var/cache/nebula-box}/root"
else
    say "the head box's root: debootstrap (once; a few minutes)"
    sh scripts/box-root.sh >/dev/null || say "no head box root; the box tests will skip"
fi
say "done"
