"""A real Slurm cluster in a folder: what the pool tests, ``nebula demo --slurm`` (through
``slurmlab.py``, which adds its login node) and ``bench/vs_slurm.py`` run.

Debian's ``slurm-wlm`` (22.05) and ``munge``, installed with apt when missing (as root:
slurmd runs as root, so that each job runs as the Unix user who submitted it), set up the
way ../shared/anchors/slurm/ does:

* munged with a key of its own, slurmctld, and one ``slurmd -N nX`` per fake node, all on
  127.0.0.1, on ports chosen free at start (several clusters can run side by side);
* each node has ``gpus`` fake GPUs: character devices with NVIDIA's major number (195),
  which Slurm's gres/gpu counts and nothing ever opens; one partition, ``gpu``;
* accounting, when asked and ``slurmdbd`` and ``mariadb-server`` are there (installed with
  the rest): a MariaDB of its own (a data directory in the folder, 127.0.0.1 on a free port)
  behind slurmdbd, so ``sacct`` answers for ended jobs; without it ``sacct`` has nothing and
  a finished job is seen only by ``squeue`` within ``MinJobAge``.

Every daemon is a child of this process in a session of its own and is stopped by its pid;
nothing is matched by name. The folder holds everything (config, state, logs, munge key and
socket, devices, the database)::

    cluster = SlurmCluster(root, Shape(nodes=4, gpus=4), accounting=True)
    cluster.prepare(); cluster.start()      # every node idle when it returns
    cluster.sbatch("--parsable", "--gres=gpu:1", "--wrap", "true")
    cluster.stop()
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from nebula_tui.sim.lab import port_open

PACKAGES = ("slurm-wlm", "munge")
#: Accounting (``sacct``): slurmdbd over a MariaDB of the cluster's own.
ACCOUNTING_PACKAGES = ("slurmdbd", "mariadb-server")
#: The tools every package must have brought.
TOOLS = ("slurmctld", "slurmd", "sbatch", "squeue", "sinfo", "scancel", "munged")
ACCOUNTING_TOOLS = ("slurmdbd", "mariadbd", "mariadb-install-db")
CLUSTER_NAME = "nebulalab"
PARTITION = "gpu"
#: SchedulerParameters that schedule on every 1 s tick with no throttling between passes,
#: a deep queue per pass and a fast backfill (the anchor's "tuned" profile).
TUNED = "batch_sched_delay=0,sched_min_interval=0,default_queue_depth=1000,bf_interval=1,bf_continue"
START_TIMEOUT_S = 60.0


class SlurmUnavailable(RuntimeError):
    """Slurm cannot be installed or started here; str() says why and what to do."""


# ------------------------------------------------------------------ install
def missing_packages(packages: tuple[str, ...]) -> list[str]:
    """Which of ``packages`` dpkg does not have installed (all of them without dpkg)."""
    if not shutil.which("dpkg-query"):
        return list(packages)
    missing = []
    for package in packages:
        done = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package],
                              capture_output=True, text=True)
        if "install ok installed" not in done.stdout:
            missing.append(package)
    return missing


def _apt_install(packages: list[str]) -> None:
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for argv in (["apt-get", "update", "-qq"],
                 ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages]):
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:]
            raise SlurmUnavailable(f"{' '.join(argv)} failed: {tail[0] if tail else done.returncode}")


def ensure_installed(accounting: bool = True) -> bool:
    """Install Slurm and munge with apt when missing (root only), and slurmdbd with MariaDB
    when ``accounting``; whether accounting can run (its tools are there)."""
    if os.geteuid() != 0:
        raise SlurmUnavailable("Slurm's daemons need root (slurmd starts each job as its "
                               "user): run as root, which also installs slurm-wlm and munge")
    wanted = PACKAGES + (ACCOUNTING_PACKAGES if accounting else ())
    missing = missing_packages(wanted)
    if missing and not shutil.which("apt-get"):
        raise SlurmUnavailable(f"{' and '.join(missing)} missing and no apt-get here: install "
                               "Slurm 22.05 (slurmctld, slurmd, slurmdbd), munge and MariaDB")
    if missing:
        _apt_install(missing)
    for tool in TOOLS:
        if not _which(tool):
            raise SlurmUnavailable(f"{tool} not found after installing {' '.join(PACKAGES)}")
    return accounting and all(_which(tool) for tool in ACCOUNTING_TOOLS)


def _which(tool: str) -> str | None:
    return shutil.which(tool) or shutil.which(tool, path="/usr/sbin:/usr/bin:/sbin:/bin")


def _traversable(path: Path) -> bool:
    """Whether everyone may pass through ``path`` and each directory above it."""
    return all(os.stat(p).st_mode & 0o001 for p in (path, *path.parents))


def free_port_run(count: int, start: int = 20000, stop: int = 40000) -> int:
    """The first of ``count`` consecutive ports that are all free on 127.0.0.1 now (Slurm's
    node ports are written as one range)."""
    base = random.randrange(start, stop - count, count + 1)
    for _ in range(200):
        held = []
        try:
            for port in range(base, base + count):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                held.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            base = start + (base - start + count + 1) % (stop - start - count)
        finally:
            for s in held:
                s.close()
    raise SlurmUnavailable(f"no {count} consecutive free ports between {start} and {stop}")


def wait_until(predicate, timeout: float, what: str, interval: float = 0.1) -> None:
    """Return once ``predicate()`` is true; SlurmUnavailable naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SlurmUnavailable(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


# ------------------------------------------------------------------ config
@dataclass(frozen=True)
class Shape:
    nodes: int = 4
    gpus: int = 4
    cpus: int = 8  # advertised: more than the machine's, so jobs are bound by GPUs
    shards: int = 0  # >0: each node also offers this many GPU shards (gres/shard)
    #: more partitions beside ``gpu`` (every node): (name, Slurm host list)
    partitions: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Ports:
    ctld: int
    first_node: int  # node i listens on first_node + i - 1
    dbd: int = 0  # 0: no accounting
    db: int = 0


def slurm_conf(root: Path, host: str, ports: Ports, shape: Shape, sched: str = "",
               min_job_age: int = 300, munge_socket: Path | None = None) -> tuple[str, str]:
    """(slurm.conf, gres.conf) of the cluster under ``root``. Accounting goes to slurmdbd
    when ``ports.dbd`` is set; ``sched`` is SchedulerParameters (the bench's profiles)."""
    munge_socket = munge_socket or root / "munge" / "run" / "munge.socket.2"
    if ports.dbd:
        accounting = ("AccountingStorageType=accounting_storage/slurmdbd\n"
                      "AccountingStorageHost=127.0.0.1\n"
                      f"AccountingStoragePort={ports.dbd}\n"
                      # the munge socket to reach slurmdbd with (not the system's)
                      f"AccountingStoragePass={munge_socket}\n"
                      "AccountingStorageTRES=gres/gpu\n")
    else:
        accounting = "AccountingStorageType=accounting_storage/none\n"
    conf = f"""ClusterName={CLUSTER_NAME}
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ports.ctld}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={munge_socket}
CredType=cred/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/state/slurmctld.pid
SlurmdPidFile={root}/spool/%n/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
MailProg=/bin/true
MpiDefault=none
ProctrackType=proctrack/pgid
TaskPlugin=task/none
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
{accounting}JobCompType=jobcomp/filetxt
JobCompLoc={root}/log/jobcomp.txt
MinJobAge={min_job_age}
ReturnToService=2
SlurmdParameters=config_overrides
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes={"gpu,shard" if shape.shards else "gpu"}
"""
    if sched:
        conf += f"SchedulerParameters={sched}\n"
    last = ports.first_node + shape.nodes - 1
    conf += (f"NodeName=n[1-{shape.nodes}] NodeHostname={host} NodeAddr=127.0.0.1 "
             f"Port=[{ports.first_node}-{last}] CPUs={shape.cpus} RealMemory=4000 "
             f"Gres=gpu:{shape.gpus}{f',shard:{shape.shards}' if shape.shards else ''} State=UNKNOWN\n"
             f"PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n")
    conf += "".join(f"PartitionName={name} Nodes={nodes} MaxTime=INFINITE State=UP\n"
                    for name, nodes in shape.partitions)
    gres = "AutoDetect=off\n" + "".join(
        f"NodeName=n{i} Name=gpu File={root}/dev/n{i}/nvidia[0-{shape.gpus - 1}]\n"
        + (f"NodeName=n{i} Name=shard Count={shape.shards} File={root}/dev/n{i}/nvidia[0-{shape.gpus - 1}]\n"
           if shape.shards else "")
        for i in range(1, shape.nodes + 1))
    return conf, gres


def slurmdbd_conf(root: Path, ports: Ports, munge_socket: Path) -> str:
    return f"""AuthType=auth/munge
AuthInfo=socket={munge_socket}
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort={ports.dbd}
SlurmUser=root
LogFile={root}/log/slurmdbd.log
PidFile={root}/state/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={ports.db}
StorageUser=root
StorageLoc=slurm_acct_db
"""


# ------------------------------------------------------------------ cluster
class SlurmCluster:
    """A throw-away Slurm under ``root``: munged, (MariaDB and slurmdbd,) slurmctld and one
    slurmd per fake node, each a child of this process in its own session, stopped by its
    pid. ``accounting``: run slurmdbd so ``sacct`` answers (needs its packages)."""

    def __init__(self, root: Path, shape: Shape = Shape(), accounting: bool = False) -> None:
        self.root = Path(root).resolve()
        self.shape = shape
        self.accounting = accounting
        self.daemons: dict[str, subprocess.Popen] = {}
        self.host = socket.gethostname().split(".")[0]
        self.conf_path = self.root / "etc" / "slurm.conf"
        self.env = dict(os.environ, SLURM_CONF=str(self.conf_path))
        self.munge_socket = self.root / "munge" / "run" / "munge.socket.2"
        self._socket_dir: Path | None = None  # one of our own, when root is not traversable
        self.ports: Ports | None = None

    # --- layout
    def prepare(self) -> None:
        r = self.root
        for sub in ("etc", "state", "log", "jobs", "dev", "munge/key", "munge/run", "munge/log"):
            (r / sub).mkdir(parents=True, exist_ok=True)
        # Users' clients read slurm.conf and reach munged's socket: every directory on the
        # way is traversable. munged insists on a key directory nobody else may read.
        for path, mode in ((r, 0o755), (r / "etc", 0o755), (r / "munge", 0o755),
                           (r / "munge" / "run", 0o755), (r / "munge" / "key", 0o700),
                           (r / "munge" / "log", 0o700)):
            path.chmod(mode)
        if not _traversable(r):
            # munged wants every directory above its socket open to all (users' clients
            # reach it); a folder inside a private home is not: the socket lives apart.
            self._socket_dir = Path(tempfile.mkdtemp(prefix="nebula-munge-"))
            self._socket_dir.chmod(0o755)
            self.munge_socket = self._socket_dir / "munge.socket.2"
        key = r / "munge" / "key" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        # Slurm 22.05 drops a GPU without File= and complains about a File= that is not a
        # character device: make devices with NVIDIA's major number (nothing opens them).
        for i in range(1, self.shape.nodes + 1):
            (r / "spool" / f"n{i}").mkdir(parents=True, exist_ok=True)
            d = r / "dev" / f"n{i}"
            d.mkdir(exist_ok=True)
            for g in range(self.shape.gpus):
                path = d / f"nvidia{g}"
                if path.exists():
                    continue
                try:
                    os.mknod(path, 0o600 | 0o020000, os.makedev(195, (i - 1) * self.shape.gpus + g))
                except OSError:
                    path.touch()  # slurmd logs an error for it but still counts it

    # --- daemons
    def _spawn(self, name: str, argv: list[str], settle: float = 0.3) -> None:
        with open(self.root / "log" / f"{name}.stdout", "ab") as out:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                    env=self.env, start_new_session=True)
        self.daemons[name] = proc
        time.sleep(settle)
        if proc.poll() is not None:
            raise SlurmUnavailable(f"{name} exited at start ({proc.returncode}): "
                                   f"{self._log_tail(name)}")

    def _log_tail(self, name: str) -> str:
        text = ""
        for log in (self.root / "log" / f"{name}.stdout", self.root / "log" / f"{name}.log"):
            with contextlib.suppress(OSError):
                text += log.read_text(errors="replace")
        return " | ".join(text.strip().splitlines()[-4:])

    def halt(self, name: str) -> None:
        """Stop one daemon: SIGTERM, then SIGKILL after 10 s."""
        proc = self.daemons.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)

    def start(self, sched: str = "", min_job_age: int = 300) -> None:
        """munged, the accounting (when asked), then :meth:`start_slurm`."""
        self.start_munge()
        self._write_conf(sched, min_job_age)
        if self.accounting:
            self.start_accounting()
        self.start_slurm(sched, min_job_age, fresh_ports=False)

    def _write_conf(self, sched: str, min_job_age: int) -> None:
        """Choose free ports (the accounting's once) and write slurm.conf and gres.conf."""
        dbd, db = (self.ports.dbd, self.ports.db) if self.ports else (0, 0)
        if self.accounting and not dbd:
            dbd, db = free_port_run(1), free_port_run(1)
        self.ports = Ports(free_port_run(1), free_port_run(self.shape.nodes), dbd=dbd, db=db)
        conf, gres = slurm_conf(self.root, self.host, self.ports, self.shape, sched, min_job_age,
                                self.munge_socket)
        self.conf_path.write_text(conf)
        (self.root / "etc" / "gres.conf").write_text(gres)
        for path in (self.conf_path, self.root / "etc" / "gres.conf"):
            path.chmod(0o644)

    def start_munge(self) -> None:
        m = self.root / "munge"
        self._spawn("munged", ["munged", "-F", f"--socket={self.munge_socket}",
                               f"--key-file={m / 'key' / 'munge.key'}",
                               f"--pid-file={m / 'run' / 'munged.pid'}",
                               f"--seed-file={m / 'key' / 'munged.seed'}",
                               f"--log-file={m / 'log' / 'munged.log'}"], settle=0)
        self._until(self.munge_socket.exists, 10, "munged's socket")

    def start_accounting(self) -> None:
        """A MariaDB of the cluster's own (its data directory here, 127.0.0.1 on a free
        port), slurmdbd on it, and the cluster registered there (after :meth:`_write_conf`)."""
        assert self.ports is not None and self.ports.dbd, "ports are chosen first"
        db, dbd = self.ports.db, self.ports.dbd
        data = self.root / "db" / "data"
        # Its temporary tables in a folder of its own: two clusters' bootstraps at once in
        # the shared /tmp collide on a table's name and one aborts ("Could not remove
        # temporary table"), as pytest-xdist's workers starting theirs side by side did.
        tmp = self.root / "db" / "tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        if not (data / "mysql").is_dir():
            data.mkdir(parents=True, exist_ok=True)
            done = subprocess.run(
                [_which("mariadb-install-db") or "mariadb-install-db", "--no-defaults",
                 f"--datadir={data}", f"--tmpdir={tmp}", "--user=root", "--skip-test-db",
                 "--auth-root-authentication-method=normal"],
                capture_output=True, text=True, timeout=300)
            if done.returncode != 0:
                raise SlurmUnavailable("mariadb-install-db failed: "
                                       + " | ".join(done.stderr.strip().splitlines()[-3:]))
        self._spawn("mariadb", [_which("mariadbd") or "mariadbd", "--no-defaults",
                                f"--datadir={data}", f"--tmpdir={tmp}", "--user=root",
                                "--bind-address=127.0.0.1",
                                f"--port={db}", f"--socket={self.root / 'db' / 'mysqld.sock'}",
                                f"--pid-file={self.root / 'db' / 'mysqld.pid'}",
                                "--skip-name-resolve", "--innodb-buffer-pool-size=16M",
                                "--performance-schema=off", "--skip-log-bin"], settle=0)
        self._until(lambda: port_open(db), 60, "MariaDB to listen")
        conf = self.root / "etc" / "slurmdbd.conf"
        conf.write_text(slurmdbd_conf(self.root, self.ports, self.munge_socket))
        conf.chmod(0o600)  # slurmdbd refuses a config others can read (it may hold a password)
        self._spawn("slurmdbd", [_which("slurmdbd") or "slurmdbd", "-D"], settle=0)
        self._until(lambda: port_open(dbd), 60, "slurmdbd to listen")
        # slurmdbd keeps the jobs only of clusters it knows (no user needs adding: nothing
        # enforces associations here).
        done = subprocess.run(["sacctmgr", "-i", "add", "cluster", CLUSTER_NAME], env=self.env,
                              capture_output=True, text=True, timeout=60)
        if done.returncode != 0 and "already exists" not in done.stdout + done.stderr:
            raise SlurmUnavailable(f"sacctmgr add cluster failed: {done.stderr.strip()}")

    def start_slurm(self, sched: str = "", min_job_age: int = 300,
                    fresh_ports: bool = True) -> None:
        """Start slurmctld (clean state) and every slurmd; returns when every node is idle.
        Called again (after :meth:`stop_slurm`) with other SchedulerParameters, it starts
        over on fresh ports with job ids from 1."""
        if fresh_ports or self.ports is None:
            self._write_conf(sched, min_job_age)
        for sub in ("state", "jobs"):  # job ids restart at 1; no earlier run's files
            shutil.rmtree(self.root / sub, ignore_errors=True)
            (self.root / sub).mkdir()
        (self.root / "jobs").chmod(0o1777)
        (self.root / "log" / "jobcomp.txt").unlink(missing_ok=True)
        self._spawn("slurmctld", ["slurmctld", "-D", "-c", "-i", "-f", str(self.conf_path)])
        self._until(lambda: "UP" in self.run(["scontrol", "ping"]), 30, "slurmctld to answer")
        for i in range(1, self.shape.nodes + 1):
            self.start_node(f"n{i}")
        self._until(lambda: len(self.run(["sinfo", "-h", "-N", "-t", "idle", "-o", "%N"]).split())
                    >= self.shape.nodes, 60, "every slurmd to register idle")

    def start_node(self, node: str) -> None:
        """Start node ``node``'s slurmd (``n1``…); again after :meth:`stop_node`."""
        self._spawn(f"slurmd-{node}", ["slurmd", "-D", "-N", node, "-f", str(self.conf_path)],
                    settle=0)

    def stop_node(self, node: str) -> None:
        """Stop node ``node``'s slurmd: the controller marks it down once it stops answering
        (at once with ``scontrol update nodename=NODE state=down``)."""
        self.halt(f"slurmd-{node}")

    def version(self) -> str:
        """Slurm's version, as ``sinfo --version`` says it (``22.05.8``)."""
        words = self.run(["sinfo", "--version"]).split()
        return words[-1] if words else "?"

    def stop_slurm(self) -> None:
        for name in [n for n in self.daemons if n.startswith("slurmd-")] + ["slurmctld"]:
            self.halt(name)

    def stop(self) -> None:
        self.stop_slurm()
        for name in ("slurmdbd", "mariadb", "munged"):
            self.halt(name)
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)

    # --- helpers
    def run(self, argv: list[str], timeout: float = 30) -> str:
        """A Slurm client's stdout, run here with this cluster's config ("" if it fails)."""
        try:
            done = subprocess.run(argv, env=self.env, capture_output=True, text=True,
                                  timeout=timeout)
        except (OSError, subprocess.TimeoutExpired):
            return ""
        return done.stdout

    def _until(self, predicate, timeout: float, what: str) -> None:
        wait_until(predicate, timeout, f"{what} (logs in {self.root / 'log'})")

    def sbatch(self, *args: str, cwd: Path | None = None) -> str:
        done = subprocess.run(["sbatch", *args], env=self.env, cwd=cwd or self.root / "jobs",
                              capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            raise SlurmUnavailable(f"sbatch failed: {done.stderr.strip()}")
        return done.stdout.strip()

    def completed(self) -> int:
        """How many jobs have ended (lines of the jobcomp log)."""
        try:
            with open(self.root / "log" / "jobcomp.txt", "rb") as f:
                return sum(1 for _ in f)
        except FileNotFoundError:
            return 0

    def wait_idle(self, timeout: float = 120) -> None:
        self._until(lambda: not self.run(["squeue", "-h", "-o", "%i"]).strip(), timeout,
                    "Slurm's queue to drain")
