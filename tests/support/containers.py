"""Container jobs' ground: the lab's image (``localhost/nebula-busybox``, made offline by
``scripts/podman-setup.sh`` from Debian's busybox-static) and why podman cannot run it here,
if it cannot (``PROBLEM``: podman's own words, or None), for the modules that skip then."""

from __future__ import annotations

import os
import shutil
import subprocess

IMAGE = "localhost/nebula-busybox"


def podman_problem() -> str | None:
    if os.getuid() != 0:
        return "container jobs are tested as root (rootful podman); run the tests as root"
    if shutil.which("podman") is None:
        return "podman is not installed; scripts/test-deps.sh installs it as root"
    try:
        done = subprocess.run(["podman", "run", "--rm", IMAGE, "true"], capture_output=True,
                              text=True, timeout=120, cwd="/")
    except subprocess.TimeoutExpired:
        return "podman run did not finish in 120 s"
    if done.returncode != 0:
        words = (done.stderr or done.stdout).strip().splitlines()
        return f"podman cannot run a container here: {words[-1] if words else done.returncode}" \
               " (scripts/test-deps.sh as root imports the image and configures podman)"
    return None


PROBLEM = podman_problem()
