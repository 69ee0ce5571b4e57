"""Container images made offline from this machine's own Debian packages, for the simulated
lab's container jobs: ``python3 nebula_tui/sim/images.py [busybox|python …]``.

* ``localhost/nebula-busybox``: busybox-static and its applets (2 MB); the tests' image.
* ``localhost/nebula-python:3.11``: Debian's python3.11 (interpreter, standard library and
  the shared libraries they load) plus busybox for a shell (about 40 MB), and a stand-in
  trainer as ``/workspace/train.py`` (``toy_train.py``); the user guide's container example runs it.

Each is a root filesystem copied from the host and ``podman import``-ed; nothing is pulled.
Stdlib only (``scripts/podman-setup.sh`` runs it with the system python3 before the
project's venv exists). An image already there is left alone.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile

BUSYBOX = "/bin/busybox"
IMAGES = {"busybox": "localhost/nebula-busybox:latest", "python": "localhost/nebula-python:3.11"}
PYTHON_PACKAGES = ("python3.11-minimal", "libpython3.11-minimal", "libpython3.11-stdlib")
TOY_TRAINER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "toy_train.py")


def _busybox(root: str) -> None:
    os.makedirs(os.path.join(root, "bin"), exist_ok=True)
    os.makedirs(os.path.join(root, "tmp"), mode=0o1777, exist_ok=True)
    os.makedirs(os.path.join(root, "etc"), exist_ok=True)
    shutil.copy2(BUSYBOX, os.path.join(root, "bin", "busybox"))
    applets = subprocess.run([BUSYBOX, "--list"], capture_output=True, text=True, check=True)
    for applet in applets.stdout.split():
        link = os.path.join(root, "bin", applet)
        if not os.path.lexists(link):
            os.symlink("busybox", link)
    with open(os.path.join(root, "etc", "passwd"), "w") as f:
        f.write("root:x:0:0:root:/root:/bin/sh\n")
    with open(os.path.join(root, "etc", "group"), "w") as f:
        f.write("root:x:0:\n")


def _python(root: str) -> None:
    """Debian's python3.11 files, and every shared library the interpreter and its
    extension modules load (found with ldd), copied to the same paths."""
    files = set()
    for package in PYTHON_PACKAGES:
        listed = subprocess.run(["dpkg", "-L", package], capture_output=True, text=True,
                                check=True).stdout.split()
        files.update(f for f in listed if os.path.isfile(f) and not os.path.islink(f))
    for binary in ["/usr/bin/python3.11", *glob.glob("/usr/lib/python3.11/lib-dynload/*.so")]:
        linked = subprocess.run(["ldd", binary], capture_output=True, text=True).stdout
        files.update(re.findall(r"(/\S+) \(0x", linked))
    for path in sorted(files):
        dest = root + path
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copy2(path, dest)  # a library under the name it is asked for, links followed
    for name in ("python3", "python"):
        os.symlink("python3.11", os.path.join(root, "usr", "bin", name))
    os.symlink("/usr/bin/python3.11", os.path.join(root, "bin", "python3"))
    os.makedirs(os.path.join(root, "workspace"))
    shutil.copy2(TOY_TRAINER, os.path.join(root, "workspace", "train.py"))


def build(kind: str) -> str:
    """Import the image unless podman has it; its name."""
    name = IMAGES[kind]
    if subprocess.run(["podman", "image", "exists", name], cwd="/").returncode == 0:
        return name
    with tempfile.TemporaryDirectory() as work:
        root = os.path.join(work, "root")
        _busybox(root)
        if kind == "python":
            _python(root)
        archive = os.path.join(work, "root.tar")
        with tarfile.open(archive, "w") as tar:
            tar.add(root, arcname=".")
        subprocess.run(["podman", "import", "-q", archive, name], check=True, cwd="/",
                       stdout=subprocess.DEVNULL)
    return name


def main(argv: list[str]) -> int:
    for kind in argv or ["busybox"]:
        if kind not in IMAGES:
            print(f"images.py: no image {kind!r}; known: {', '.join(IMAGES)}", file=sys.stderr)
            return 2
        try:
            print(build(kind))
        except (OSError, subprocess.CalledProcessError) as err:
            print(f"images.py: cannot build {IMAGES[kind]}: {err}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
