#!/bin/sh
# Installs what NebulaGrid and its tests need on a fresh Debian/Ubuntu machine: the Python
# package with its test tools in the project's own virtual environment (.venv, so nobody's
# global Python changes), and (as root) OpenSSH's sshd and tmux, which the tests run for
# real. Safe to run again: it skips what is already there.
set -eu
cd "$(dirname "$0")/.."
need_apt=""
command -v tmux >/dev/null 2>&1 || need_apt="$need_apt tmux"
[ -x /usr/sbin/sshd ] || command -v sshd >/dev/null 2>&1 || need_apt="$need_apt openssh-server"
command -v ssh-keygen >/dev/null 2>&1 || need_apt="$need_apt openssh-client"
command -v zsh >/dev/null 2>&1 || need_apt="$need_apt zsh"  # the completion tests load it
[ -e /usr/sbin/sendmail ] || need_apt="$need_apt msmtp-mta"  # a sendmail for the mail tests
# A C compiler builds the simulated lab's NVML (optional: without it the lab uses nvidia-smi).
command -v cc >/dev/null 2>&1 || [ "$(id -u)" != 0 ] || need_apt="$need_apt gcc libc6-dev"
# Optional (installed as root, else the tests that need it skip): libfaketime, with which
# the reliability tests step the head's wall clock alone.
if [ "$(id -u)" = 0 ] && ! ls /usr/lib/*/faketime/libfaketime.so.1 >/dev/null 2>&1; then
    need_apt="$need_apt libfaketime"
fi
# Optional (as root, else the pool tests skip): a real Slurm (slurmd runs as root) with its
# accounting (slurmdbd over a MariaDB the tests start themselves), which the pool tests and
# `nebula demo --slurm` run. Nothing of it is started here.
if [ "$(id -u)" = 0 ]; then
    for pkg in slurm-wlm munge slurmdbd mariadb-server; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' ||
            need_slurm="${need_slurm:-} $pkg"
    done
fi
if [ -n "$need_apt" ]; then
    if [ "$(id -u)" = 0 ]; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $need_apt >/dev/null
    else
        echo "setup: please install:$need_apt (e.g. sudo apt-get install -y$need_apt)" >&2
        exit 1
    fi
fi
if [ -n "${need_slurm:-}" ]; then
    { [ -n "$need_apt" ] || apt-get update -qq; } &&
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            $need_slurm >/dev/null ||
        echo "setup: could not install$need_slurm; the Slurm pool tests will skip" >&2
fi
# Container jobs run for real in the tests where podman can (as root; skips otherwise).
[ "$(id -u)" = 0 ] && sh scripts/podman-setup.sh
VENV=${VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV" 2>/dev/null || {
        [ "$(id -u)" = 0 ] && apt-get install -y -qq python3-venv >/dev/null 2>&1 &&
            python3 -m venv "$VENV"
    } || {
        echo "setup: python3 cannot make a virtual environment; install python3-venv" \
             "(e.g. sudo apt-get install -y python3-venv)" >&2
        exit 1
    }
fi
# Reinstall only when the package's declared dependencies changed since the last setup.
stamp="$VENV/.nebula-setup"
if [ ! -f "$stamp" ] || ! cmp -s pyproject.toml "$stamp"; then
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e '.[test]'
    # The deprecated "pynvml" distribution (nvidia-ml-py's old wrapper) warns on import.
    "$VENV/bin/python" -m pip uninstall -q -y pynvml >/dev/null 2>&1 || true
    cp pyproject.toml "$stamp"
fi
