"""Real Unix users for the shared-box tests (run as root): a group with its members and
outsiders, made for a module and removed after it; a head as root in shared-box mode for
that group; the CLI run as one of its users.

Two groups are in use, each a pair of fixtures of :mod:`support.plugin`: ``users`` and
``shared`` (Alice and Bob in ``GROUP``, Eve outside), ``box_users`` and ``box_shared``
(Mallory and Victor in ``BOX_GROUP``).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import yaml

from labkit.harness import HeadProcess
from support.head import submitted_id

REPO = Path(__file__).resolve().parents[2]
GROUP = "nebtestlab"
BOX_GROUP = "nebtestpaths"
MALLORY, VICTOR = "nebmallory", "nebvictor"
RUNUSER = shutil.which("runuser") or "/usr/sbin/runuser"
ALICE, BOB, STRANGER = "nebalice", "nebbob", "nebeve"


def quiet(*argv: str) -> None:
    """Run ``argv`` for its effect alone (groupadd of a group that is there already is fine)."""
    subprocess.run(argv, check=False, capture_output=True)


def lab_users(group: str, members: tuple[str, ...], outsiders: tuple[str, ...]):
    """Create a group with ``members`` and users outside it; remove them all afterwards."""
    quiet("groupadd", group)
    for name in members:
        quiet("useradd", "-m", "-G", group, name)
        # A user left by an earlier run (userdel refuses while its processes linger) is
        # still put in this run's group, which is new.
        quiet("usermod", "-a", "-G", group, name)
    for name in outsiders:
        quiet("useradd", "-m", name)
    try:
        yield
    finally:
        for name in (*members, *outsiders):
            quiet("userdel", "-r", name)
        quiet("groupdel", group)


def shared_head(lab, tmp_path_factory, group: str, sections: dict | None = None):
    """A head as root in shared-box mode for ``group``; clients run as other users from a
    copy of the package they can read (the checkout may sit in a directory only root can
    enter). ``sections``: top-level sections of nodes.yaml to add (``{"accounting": …}``)."""
    public = Path(tempfile.mkdtemp(prefix="nebula-shared-"))
    public.chmod(0o755)
    shutil.copytree(REPO / "nebula_tui", public / "nebula_tui",
                    ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(["chmod", "-R", "a+rX", str(public / "nebula_tui")], check=True)
    config = yaml.safe_load(lab.config_path.read_text())
    config["cluster"]["run_as"] = "submitter"
    sections = dict(sections or {})
    config["cluster"].update(sections.pop("cluster", {}))  # keys of the lab's own cluster section
    config.update(sections)
    home = tmp_path_factory.mktemp("sharedhome")
    (home / "nodes.yaml").write_text(yaml.safe_dump(config))
    head = HeadProcess(home, lab, config=home / "nodes.yaml",
                       socket=public / "run" / "nebula.sock", serve_args=("--shared-group", group))
    head.start()
    head.public = public
    try:
        yield head
    finally:
        head.stop()
        shutil.rmtree(public, ignore_errors=True)


def as_user(head, user: str, *args: str) -> subprocess.CompletedProcess:
    """``nebula ARGS`` run by ``user`` (runuser) against a shared head, from its public copy."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(head.public), "LANG": "C.UTF-8",
           "NEBULA_SOCKET": str(head.socket), "NEBULA_HOME": f"/tmp/{user}-nebula"}
    return subprocess.run([RUNUSER, "-u", user, "--", "/usr/bin/python3", "-m", "nebula_tui", *args],
                          env=env, capture_output=True, text=True, timeout=60, cwd="/")


def submit_as(head, user: str, *args: str) -> int:
    """``nebula submit ARGS`` as ``user`` (exit 0 required); the new job's id."""
    done = as_user(head, user, "submit", *args)
    assert done.returncode == 0, done.stderr
    return submitted_id(done.stdout)
