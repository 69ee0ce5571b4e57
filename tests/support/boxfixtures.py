"""A head box for the tests: a Debian root booted with systemd as its PID 1 (systemd-nspawn),
sharing the host's network so that its service reaches the simulated lab's sshd nodes on
127.0.0.1, and the admin guide's commands as the guide writes them.

The root is made once by ``scripts/box-root.sh`` (debootstrap) and kept in
``/var/cache/nebula-box/root`` (``$NEBULA_BOX_CACHE``), outside the repository; each boot
lays a throw-away layer over it (``--volatile=overlay``), so a run leaves it as it was. The
box installs from a folder of wheels kept beside it (``wheelhouse``): Debian's mirror is
all the network a test machine may have.

``guide_blocks()`` reads the fenced blocks of docs/admin-guide.md tagged ``box:NAME``
(```` ```sh box:install ````): the test runs those texts, so the guide and the test
cannot drift apart.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "admin-guide.md"
CACHE = Path(os.environ.get("NEBULA_BOX_CACHE", "/var/cache/nebula-box"))
BOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

_BLOCK = re.compile(r"^( *)```(\w+) box:(\S+)\n(.*?)^\1```", re.MULTILINE | re.DOTALL)


def guide_blocks(path: Path = GUIDE) -> dict[str, str]:
    """``{name: text}`` of the guide's fenced blocks tagged ``box:name``, unindented."""
    found: dict[str, str] = {}
    for indent, _lang, name, body in _BLOCK.findall(path.read_text()):
        assert name not in found, f"{path} has two blocks tagged box:{name}"
        found[name] = textwrap.dedent(body) if indent else body
    return found


def why_no_box() -> str | None:
    """Why a box cannot boot here (None: it can)."""
    if os.geteuid() != 0:
        return "needs root: boots a container with systemd-nspawn"
    for tool in ("systemd-nspawn", "debootstrap", "nsenter"):
        if not shutil.which(tool):
            return f"{tool} is not installed (`make test-deps` installs it)"
    return None


def box_root() -> Path:
    """The cached root filesystem, made now when missing (debootstrap: a few minutes)."""
    done = subprocess.run(["sh", str(REPO / "scripts" / "box-root.sh")], capture_output=True,
                          text=True, timeout=1200, env={**os.environ, "NEBULA_BOX_CACHE": str(CACHE)})
    if done.returncode != 0:
        raise RuntimeError(f"box root: {done.stderr.strip()}")
    return Path(done.stdout.strip().splitlines()[-1])


def build_wheel(source: Path, out: Path) -> Path:
    """``python -m build --wheel`` of the tree at ``source`` into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(out), str(source)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (found,) = out.glob("nebula_tui-*.whl")
    return found


def tracked_copy(dest: Path) -> Path:
    """The checkout's tracked files as they are now (the build writes beside its sources)."""
    names = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True,
                           check=True).stdout.decode().split("\0")
    for name in filter(None, names):
        if (REPO / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, dest / name)
    return dest


def checkout_wheel(tmp_path_factory) -> Path:
    """This checkout's wheel (:func:`build_wheel` of :func:`tracked_copy`), built once per
    run: the first test to ask builds it, under a lock in the run's base temporary folder
    (the one pytest-xdist's workers share), and the others wait for it and reuse it. It is
    keyed by the tracked files' names and contents, so an edit between two asks builds
    again. A build takes 10-35 s on two cores; the box, the demo's sudo user and the install
    tests each built their own."""
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True,
                             check=True).stdout.decode().split("\0")
    digest = hashlib.sha256()
    for name in filter(None, tracked):
        if (REPO / name).is_file():
            digest.update(name.encode() + b"\0" + (REPO / name).read_bytes() + b"\0")
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    out = shared / "checkout-wheel" / digest.hexdigest()[:16]
    out.parent.mkdir(exist_ok=True)
    with open(out.parent / f"{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if found := list(out.glob("nebula_tui-*.whl")):
            return found[0]
        return build_wheel(tracked_copy(tmp_path_factory.mktemp("src")), out)


def previous_release() -> str | None:
    """The commit of the release before this checkout's version: the parent of the commit
    that last changed ``version =`` in pyproject.toml (None in a clone without history)."""
    done = subprocess.run(["git", "log", "-1", "--format=%H", "-G", r"^version = ", "--",
                           "pyproject.toml"], cwd=REPO, capture_output=True, text=True)
    bump = done.stdout.strip()
    if done.returncode != 0 or not bump:
        return None
    parent = subprocess.run(["git", "rev-parse", "--verify", "-q", f"{bump}^"], cwd=REPO,
                            capture_output=True, text=True)
    return parent.stdout.strip() or None


def release_wheel(commit: str) -> Path:
    """The wheel of ``commit``, built once from a checkout of it (``git worktree`` in a
    temporary folder) and kept in the cache."""
    out = CACHE / "wheels" / commit
    if found := list(out.glob("nebula_tui-*.whl")):
        return found[0]
    src = Path(tempfile.mkdtemp(prefix="nebula-release-"))
    try:
        subprocess.run(["git", "worktree", "add", "--detach", str(src / "tree"), commit],
                       cwd=REPO, check=True, capture_output=True)
        return build_wheel(src / "tree", out)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(src / "tree")], cwd=REPO,
                       capture_output=True)
        shutil.rmtree(src, ignore_errors=True)


def wheelhouse(*wheels: Path) -> Path:
    """A folder with every package the wheels need (from this machine's pip sources)."""
    house = CACHE / "wheelhouse"
    house.mkdir(parents=True, exist_ok=True)
    # One at a time: two releases of one package never resolve together. setuptools: what
    # `pip install -e .` in a checkout builds with (pyproject.toml's build-system).
    for wanted in (*map(str, wheels), "setuptools>=68"):
        done = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--dest", str(house),
                               wanted], capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
    return house


class BoxCannotBoot(RuntimeError):
    """systemd-nspawn could not boot the root here (a container without the rights to)."""


class Box:
    """One booted box: ``sh(text)`` runs a shell text in it (as root, or ``user``)."""

    def __init__(self, root: Path, share: Path, house: Path, log: Path) -> None:
        self.root, self.share, self.house, self.log = root, share, house, log
        self.proc: subprocess.Popen | None = None
        self.leader = 0

    def boot(self, timeout: float = 90) -> None:
        name = f"nebbox{os.getpid()}"
        self.proc = subprocess.Popen(
            ["systemd-nspawn", "--boot", "--register=no", "--keep-unit", "--quiet",
             f"--machine={name}", "-D", str(self.root), "--volatile=overlay",
             f"--bind={self.share}:/root/work", f"--bind-ro={self.house}",
             "--console=read-only"],
            stdin=subprocess.DEVNULL, stdout=self.log.open("ab"), stderr=subprocess.STDOUT,
            start_new_session=True)
        deadline = time.monotonic() + timeout
        while not self.leader:
            if self.proc.poll() is not None:
                raise BoxCannotBoot(f"systemd-nspawn exited ({self.proc.returncode}): "
                                   f"{self.log.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"no systemd in the box after {timeout:.0f} s")
            self.leader = self._find_init()
            time.sleep(0.2)
        # The box's pip installs from the wheelhouse alone (no index: no network).
        self.sh(f"printf '[global]\\nno-index = true\\nfind-links = {self.house}\\n' > /etc/pip.conf")
        while True:  # until its bus is up, systemctl cannot even say "starting"
            state = self.sh("systemctl is-system-running --wait", check=False, timeout=timeout)
            if state.stdout.strip() or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        if state.stdout.strip() not in ("running", "degraded"):
            raise RuntimeError(f"the box's systemd is {state.stdout.strip()!r}: "
                               + self.sh("systemctl --failed --no-pager", check=False).stdout)

    def _find_init(self) -> int:
        """The host pid of the box's PID 1: a descendant of nspawn that is 1 in its own
        pid namespace."""
        parents: dict[int, int] = {}
        inits = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                status = (entry / "status").read_text()
            except OSError:
                continue
            fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
            parents[int(entry.name)] = int(fields.get("PPid", "0"))
            if fields.get("NSpid", "").split()[-1:] == ["1"] and entry.name != "1":
                inits.append(int(entry.name))
        for pid in inits:
            up = pid
            while up > 1:
                up = parents.get(up, 0)
                if up == self.proc.pid:
                    return pid
        return 0

    def sh(self, text: str, user: str | None = None, check: bool = True, timeout: float = 300,
           stdin: str | None = None, cwd: str = "/root/work") -> subprocess.CompletedProcess:
        """Run ``text`` with /bin/sh -e in the box (its mount, pid, network… namespaces)."""
        home = "/root" if user is None else f"/home/{user}"
        env = ["env", "-i", f"PATH={BOX_PATH}", f"HOME={home}", "LANG=C.UTF-8", "TERM=dumb"]
        inner = ["sh", "-ec", f"cd {cwd} 2>/dev/null || cd; {text}"]
        if user is not None:
            env += [f"USER={user}", f"LOGNAME={user}"]
            inner = ["runuser", "-u", user, "--", *inner]
        argv = ["nsenter", "-t", str(self.leader), "-m", "-u", "-i", "-n", "-p", "-C", "--",
                *env, *inner]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, input=stdin)
        if check and done.returncode != 0:
            raise AssertionError(f"in the box{' as ' + user if user else ''}, `{text.strip()}` "
                                 f"exited {done.returncode}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
        return done

    def stop(self, timeout: float = 30) -> None:
        """Power the box off (nspawn passes SIGTERM to the box's systemd as a halt)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        os.kill(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
