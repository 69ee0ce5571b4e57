#!/bin/sh
# The project's own virtual environment (.venv; nobody's global Python changes), a line per
# step with its time. `setup.sh demo` (make demo): the package and what it needs to run,
# nothing else: no system service, no sshd, nothing under /etc. `setup.sh` (make setup,
# make test): the package with its test tools; what the tests need of the system is
# scripts/test-deps.sh's. Safe to run again: it skips what is already there.
set -eu
cd "$(dirname "$0")/.."
what=${1:-test}
t0=$(date +%s)
say() { echo "setup: $* ($(( $(date +%s) - t0 )) s)"; }
# The demo's simulated nodes run each job in a tmux session.
if ! command -v tmux >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then
        say "installing tmux (the simulated nodes run jobs in it)"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq tmux >/dev/null
    else
        echo "setup: the demo needs tmux: sudo apt-get install -y tmux" >&2
        exit 1
    fi
fi
VENV=${VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
    say "making $VENV"
    python3 -m venv "$VENV" 2>/dev/null || {
        echo "setup: python3 cannot make a virtual environment; install python3-venv" \
             "(e.g. sudo apt-get install -y python3-venv)" >&2
        exit 1
    }
fi
# Reinstall only when the package's declared dependencies, or what is asked, changed.
extras=""
[ "$what" = demo ] || extras="[test]"
stamp="$VENV/.nebula-setup"
current() {  # whether the stamp names these dependencies, with the test tools when asked
    [ -f "$stamp" ] && tail -n +2 "$stamp" | cmp -s - pyproject.toml &&
        { [ -z "$extras" ] || [ "$(head -n 1 "$stamp")" = "$extras" ]; }
}
if ! current; then
    say "installing NebulaGrid${extras:+ with its test tools} into $VENV"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e ".$extras"
    # The deprecated "pynvml" distribution (nvidia-ml-py's old wrapper) warns on import.
    "$VENV/bin/python" -m pip uninstall -q -y pynvml >/dev/null 2>&1 || true
    { echo "$extras"; cat pyproject.toml; } > "$stamp"
fi
say "ready: $VENV"
