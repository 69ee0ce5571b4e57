"""A real Slurm cluster and its login node: what the pool tests and ``nebula demo --slurm``
reach the way a head reaches a university's cluster, over SSH.

The cluster is ``slurm.py``'s (4 slurmd × 4 fake GPUs, partition ``gpu``, accounting when
slurmdbd and MariaDB are installed). The login node is a real OpenSSH sshd on 127.0.0.1
(the simulated lab's, ``lab.py``) whose sessions have ``SLURM_CONF`` set, so ``sbatch``,
``squeue``, ``sacct``, ``sinfo`` and ``scancel`` work there as on a cluster's login node.
Its host key is in the folder's ``known_hosts``; a key logs in as a Unix user once it is in
``login/keys/<user>`` or in the user's own ``~/.ssh/authorized_keys``::

    with SlurmLab(root) as slurm:       # prepare + start; stop at the end
        slurm.login_port, slurm.known_hosts_path, slurm.identity_path, slurm.version
        slurm.authorize("alice", pubkey_line)
        slurm.stop_login(); slurm.start_login()     # the login node down and back

``python -m nebula_tui.sim.slurmlab --dir DIR [--layout …]`` runs the simulated lab of
``lab.py`` with one beside it as its pool ``hpc`` until SIGTERM (``nebula demo --slurm``).
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import asyncssh

from nebula_tui.sim.lab import (LabError, halt_sshd, lab_arguments, new_host_key, port_open,
                                run_lab, sshd_config, start_sshd)
from nebula_tui.sim.slurm import (PARTITION, Shape, SlurmCluster, SlurmUnavailable,
                                  ensure_installed, free_port_run)


class SlurmLab:
    """A :class:`SlurmCluster` and its login node (a real sshd on 127.0.0.1) under ``root``.

    ``login/keys/<user>`` and the user's own ``~/.ssh/authorized_keys`` say which keys may
    log in as that Unix user. The account must not be locked (sshd without PAM refuses a
    ``!`` password field): :func:`unlock_for_ssh` makes a test's user one that may log in.
    """

    def __init__(self, root: Path, shape: Shape = Shape(), accounting: bool | None = None) -> None:
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self._accounting_wanted = accounting
        self.cluster = SlurmCluster(self.root, shape)
        self.login_port = 0
        self.identity_pub = ""  # the public half of identity_path, an authorized_keys line
        self._version = "?"
        self._login: subprocess.Popen | None = None

    # --- paths
    @property
    def known_hosts_path(self) -> Path:
        return self.root / "known_hosts"

    @property
    def identity_path(self) -> Path:
        """A private key that logs in to the login node as this process's user."""
        return self.login_dir / "id_ed25519"

    @property
    def login_dir(self) -> Path:
        return self.root / "login"

    @property
    def slurm_conf(self) -> Path:
        return self.cluster.conf_path

    @property
    def env(self) -> dict[str, str]:
        """This process's environment with the cluster's ``SLURM_CONF``."""
        return self.cluster.env

    @property
    def accounting(self) -> bool:
        """Whether slurmdbd runs, i.e. ``sacct`` knows the ended jobs."""
        return self.cluster.accounting

    @property
    def version(self) -> str:
        return self._version

    @property
    def ready_path(self) -> Path:
        return self.root / "ready.json"

    # --- lifecycle
    def prepare(self) -> None:
        """Install what is missing and write the cluster's folder and the login node's keys."""
        can_account = ensure_installed(self._accounting_wanted is not False)
        if self._accounting_wanted and not can_account:
            raise SlurmUnavailable("accounting asked for, but slurmdbd or MariaDB is missing")
        self.cluster.accounting = can_account
        self.cluster.prepare()
        self.login_dir.mkdir(exist_ok=True)
        (self.login_dir / "keys").mkdir(exist_ok=True)
        self.login_port = free_port_run(1)
        # A key of this process's user, as a node's lab key: it logs in as that user.
        key = asyncssh.generate_private_key("ssh-ed25519", comment="nebula-slurm-lab")
        self.identity_path.write_bytes(key.export_private_key())
        self.identity_path.chmod(0o600)
        self.identity_pub = key.export_public_key().decode().strip()
        (self.login_dir / "keys" / pwd.getpwuid(os.getuid()).pw_name).unlink(missing_ok=True)
        self.authorize(pwd.getpwuid(os.getuid()).pw_name, self.identity_pub)
        self.known_hosts_path.write_text(
            new_host_key(self.login_dir / "host_key", self.login_port))
        self.known_hosts_path.chmod(0o644)
        (self.login_dir / "sshd_config").write_text(sshd_config(
            "the Slurm login node", self.login_port, self.login_dir / "host_key",
            self.login_dir / "sshd.pid",
            f"{self.login_dir / 'keys' / '%u'} .ssh/authorized_keys",
            {"SLURM_CONF": str(self.slurm_conf)}))

    def start(self) -> None:
        try:
            self.cluster.start()
            self._version = self.cluster.version()
            self.start_login()
        except BaseException:
            self.stop()
            raise

    def start_login(self, timeout: float = 10.0) -> None:
        """The login node answers (again, on the same port with the same host key)."""
        if self._login is not None and self._login.poll() is None:
            return
        self._login = start_sshd(self.login_dir / "sshd_config", self.login_dir / "sshd.log")
        deadline = time.monotonic() + timeout
        while not port_open(self.login_port):
            if self._login.poll() is not None or time.monotonic() > deadline:
                log = (self.login_dir / "sshd.log").read_text(errors="replace")
                raise SlurmUnavailable(f"the login node's sshd did not listen: {log[-500:]}")
            time.sleep(0.02)

    def stop_login(self) -> None:
        """The login node goes silent: its sshd and every session on it end; the cluster
        and its jobs keep running."""
        halt_sshd(self._login)
        self._login = None

    def stop(self) -> None:
        self.stop_login()
        self.cluster.stop()

    def __enter__(self) -> SlurmLab:
        self.prepare()
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- users
    def authorize(self, user: str, line: str) -> None:
        """Let the public key ``line`` (an ``authorized_keys`` line, options allowed) log in
        to the login node as ``user``."""
        path = self.login_dir / "keys" / user
        with open(path, "a") as f:
            f.write(line.rstrip("\n") + "\n")
        path.chmod(0o644)

    def revoke(self, user: str) -> None:
        (self.login_dir / "keys" / user).unlink(missing_ok=True)

    def pool_entry(self, name: str = "hpc", user: str | None = None, **extra) -> dict:
        """This cluster as a ``pools:`` entry of nodes.yaml."""
        entry = {"name": name, "kind": "slurm", "host": "127.0.0.1", "port": self.login_port,
                 "user": user or pwd.getpwuid(os.getuid()).pw_name, "partition": PARTITION}
        entry.update(extra)
        return entry

    def write_ready(self) -> None:
        data = {"pid": os.getpid(), "login_port": self.login_port, "version": self.version,
                "accounting": self.accounting, "slurm_conf": str(self.slurm_conf),
                "known_hosts": str(self.known_hosts_path)}
        tmp = self.ready_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data) + "\n")
        tmp.replace(self.ready_path)


def unlock_for_ssh(user: str) -> None:
    """Give ``user`` a password field of ``*`` (no password, not locked) when it is locked
    (``!``, as useradd leaves it): sshd without PAM refuses a locked account's keys too."""
    try:
        lines = Path("/etc/shadow").read_text().splitlines()
    except OSError:
        return  # not root: nothing to change, and nothing a test could create either
    for line in lines:
        name, _, rest = line.partition(":")
        if name == user and rest.startswith("!"):
            subprocess.run(["usermod", "-p", "*", user], check=True, capture_output=True)


#: The pool ``nebula demo --slurm`` adds: sent to only with ``--pool hpc``, or after a job
#: has waited two minutes in the lab; polled every 2 s (a real login node's admins would
#: want the default 10 s).
DEMO_POOL = {"name": "hpc", "max_jobs": 50, "burst_after": "2m", "workdir": "~/nebula",
             "poll_interval": "2s"}


def run_lab_with_slurm(root: Path, layout: str = "demo", ssh: str = "asyncssh",
                       probe_interval: float = 5.0, owner: str | None = None) -> None:
    """The simulated lab of ``lab.run_lab`` with a real Slurm beside it (in ``<root>/slurm``)
    as its pool ``hpc``, the lab's user as the pool's account (``owner``'s, when root runs
    the demo for them: its jobs run there as that user, whose head reads the pool's key);
    both stop on SIGTERM. For an ``owner`` the cluster's folder is a root-owned one in the
    system's temporary folder, linked from ``<root>/slurm`` and removed at the end: munged
    refuses a folder under one another user owns (their home)."""
    def interrupted(signum: int, _frame) -> None:
        raise SystemExit(128 + signum)

    previous = {s: signal.signal(s, interrupted) for s in (signal.SIGTERM, signal.SIGINT)}
    where = Path(root) / "slurm"
    if owner:
        if where.is_symlink() or where.is_file():
            where.unlink()
        elif where.exists():
            shutil.rmtree(where)  # an earlier demo's, as root's own: made anew each start
        where.parent.mkdir(parents=True, exist_ok=True)
        where.symlink_to(tempfile.mkdtemp(prefix="nebula-demo-slurm-"))
    slurm = SlurmLab(where)
    try:
        slurm.prepare()
        if owner:
            pw = pwd.getpwnam(owner)
            slurm.authorize(owner, slurm.identity_pub)
            os.chown(slurm.identity_path, pw.pw_uid, pw.pw_gid)
            for folder in (slurm.root, slurm.login_dir):  # the way to its key and known_hosts
                folder.chmod(0o755)
        slurm.start()
        slurm.write_ready()
        pool = slurm.pool_entry(user=owner, identity=str(slurm.identity_path),
                                known_hosts=str(slurm.known_hosts_path), **DEMO_POOL)
        run_lab(root, layout, ssh, probe_interval, pools=[pool])
    finally:
        for s in previous:  # the clean-up itself is not cut short
            signal.signal(s, signal.SIG_IGN)
        slurm.stop()
        slurm.ready_path.unlink(missing_ok=True)
        if owner:
            shutil.rmtree(slurm.root, ignore_errors=True)
            where.unlink(missing_ok=True)
        for s, handler in previous.items():
            signal.signal(s, handler)


def main(argv: list[str] | None = None) -> int:
    parser = lab_arguments("python -m nebula_tui.sim.slurmlab",
                           "Run a simulated GPU lab with a real Slurm pool in the foreground.")
    parser.add_argument("--owner", help="the user the pool's jobs run as (root's demo for them)")
    args = parser.parse_args(argv)
    try:
        run_lab_with_slurm(args.dir, args.layout, args.ssh, args.probe_interval, args.owner)
    except (SlurmUnavailable, LabError) as exc:
        print(f"nebula lab: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
