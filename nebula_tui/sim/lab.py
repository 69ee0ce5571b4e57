"""The simulated lab (R26): several GPU "nodes" on 127.0.0.1, one SSH server each.

Every node is reached exactly like a real one: its own port, its own host key (listed
in the lab's ``known_hosts``), public-key login with the lab's client key, and its own
emulated vendor tools, kernel log, work directory and tmux server.  What makes one
machine look like several nodes is the per-session environment::

    PATH=<lab>/n/N/bin:<normal PATH>   NEBULA_SIM_NODE=N   NEBULA_SIM_DIR=<lab>/n/N
    NEBULA_NODE_DIR=<lab>/n/N/node     TMUX_TMPDIR=<lab>/n/N/tmux

Two server kinds share one layout:

``openssh``
    one real ``sshd -D`` per node (what the tests use; needs openssh-server).
``asyncssh``
    one in-process asyncssh server per node, run on a private event loop in a
    background thread (``nebula demo``: no root, no system sshd).

The API is synchronous for both kinds (the asyncssh loop lives in its own thread), so
the same calls work from plain code, pytest fixtures and async tests alike::

    lab = Lab(root, layout="demo", ssh="openssh")
    lab.prepare()            # keys, known_hosts, nodes.yaml, node dirs, free ports
    lab.start()              # every node accepts connections when this returns
    lab.stop_node("node02")  # node goes silent (listener and live sessions die)
    lab.start_node("node02") # back, same port and key
    lab.stop()               # servers, sessions, tmux servers and jobs all gone

``Lab`` is also a context manager (prepare + start / stop).  ``run_lab`` is the
foreground runner behind ``python -m nebula_tui.sim.lab``.

Why one module: both server kinds serve one node layout through one API (``Lab``): the
layout, the keys and the lifecycle are written once for both.
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import json
import os
import pty
import pwd
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path
from typing import Any

import asyncssh
import yaml

from nebula_tui.model import DEFAULT_VENDOR
from nebula_tui.sim import containers as sim_containers
from nebula_tui.sim import cuda, nvml, presets
from nebula_tui.waits import within

SSH_KINDS = ("asyncssh", "openssh")
_SIM_PKG = Path(__file__).resolve().parent

# What sshd puts in PATH before the user's shell runs (OpenSSH's _PATH_STDPATH defaults).
_ROOT_STDPATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_USER_STDPATH = "/usr/local/bin:/usr/bin:/bin:/usr/games"


def _node_tools(spec: dict) -> list[tuple[str, str, tuple[str, ...]]]:
    """(tool, emulator script, its first arguments) for each tool this node has: a vendor's
    tools where it has that vendor's devices, less those its spec's ``omit_tools`` names."""
    vendors = {d.get("vendor") for d in spec.get("devices", [])}
    tools = [("dmesg", "fake_dmesg.py", ())]
    if spec.get("gpus"):
        tools.append(("nvidia-smi", "fake_smi.py", ()))
    for vendor, names in (("amd", ("amd-smi", "rocm-smi")), ("intel", ("xpu-smi",)),
                          ("ascend", ("npu-smi",))):
        if vendor in vendors:
            tools += [(name, "fake_vendors.py", (name,)) for name in names]
    omitted = set(spec.get("omit_tools", ()))
    return [tool for tool in tools if tool[0] not in omitted]


class LabError(RuntimeError):
    """The lab cannot be prepared or started (missing sshd, a node that would not listen)."""


def find_sshd() -> str:
    """Path of OpenSSH's ``sshd``; raises LabError with the install hint when absent."""
    found = shutil.which("sshd") or shutil.which("sshd", path="/usr/sbin:/usr/local/sbin")
    if not found:
        raise LabError(
            "OpenSSH server not found (sshd); install it with: apt-get install -y openssh-server"
        )
    return found


def _free_ports(count: int) -> list[int]:
    """Ports free on 127.0.0.1 now; all sockets are held until every port is chosen."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def port_open(port: int) -> bool:
    """Whether something accepts TCP connections on 127.0.0.1:``port`` now."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


def _write_private(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    path.chmod(0o600)


def _proc_children() -> dict[int, list[int]]:
    """ppid -> child pids, from /proc (Linux only; empty elsewhere)."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc") if os.path.isdir("/proc") else ():
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        # The command name is in parentheses and may itself contain spaces/parens.
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    return children


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (Linux /proc), children before grandchildren."""
    tree = _proc_children()
    out, todo = [], [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _kill(pids: list[int], sig: int = signal.SIGKILL) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def lab_processes(root: Path) -> list[int]:
    """Pids of live processes that belong to the lab at ``root``.

    A process belongs to the lab when its environment is a node's (anything started in a
    node session, tmux servers started there) or its command line names a node directory
    (``sshd -f <lab>/n/…``).  A head service merely reading ``<lab>/nodes.yaml`` does not
    count.  Linux only; elsewhere it returns [].
    """
    marker = str(Path(root).resolve()).encode()
    node_marker = marker + b"/n/"
    me = os.getpid()
    found = []
    for entry in os.scandir("/proc") if os.path.isdir("/proc") else ():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            cmdline = Path(entry.path, "cmdline").read_bytes()
            environ = Path(entry.path, "environ").read_bytes()
            state = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state == "Z":
            continue
        env_hit = any(
            v.startswith(b"NEBULA_SIM_DIR=" + node_marker)
            or v.startswith(b"TMUX_TMPDIR=" + node_marker)
            for v in environ.split(b"\0")
        )
        if env_hit or node_marker in cmdline:
            found.append(int(entry.name))
    return found


def new_host_key(path: Path, port: int) -> str:
    """Write a fresh ed25519 host key at ``path``; its ``known_hosts`` line for
    127.0.0.1:``port``."""
    key = asyncssh.generate_private_key("ssh-ed25519")
    _write_private(path, key.export_private_key())
    kind, blob = key.export_public_key().decode().split()[:2]
    return f"[127.0.0.1]:{port} {kind} {blob}\n"


def sshd_config(what: str, port: int, host_key: Path, pid_file: Path, authorized_keys: str,
                env: dict[str, str]) -> str:
    """An ``sshd_config`` for a server of the lab on 127.0.0.1:``port``: public keys only,
    from ``authorized_keys`` (sshd's ``AuthorizedKeysFile`` words), ``env`` set in every
    session."""
    setenv = " ".join(f'"{k}={v}"' for k, v in env.items())
    return (
        f"# sshd for {what}\n"
        f"Port {port}\n"
        "ListenAddress 127.0.0.1\n"
        f"HostKey {host_key}\n"
        f"PidFile {pid_file}\n"
        f"AuthorizedKeysFile {authorized_keys}\n"
        "StrictModes no\n"
        "UsePAM no\n"
        "PasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\n"
        "PubkeyAuthentication yes\n"
        "PermitRootLogin prohibit-password\n"
        "UseDNS no\n"
        "PrintMotd no\n"
        "PrintLastLog no\n"
        "MaxStartups 100:30:200\n"
        f"SetEnv {setenv}\n"
    )


def start_sshd(config: Path, log_path: Path) -> subprocess.Popen:
    """A real ``sshd -D`` on ``config`` in a session of its own, logging to ``log_path``."""
    if os.getuid() == 0:
        # sshd's privilege-separation directory; the package creates it at boot only.
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    with open(log_path, "ab") as log:
        return subprocess.Popen([find_sshd(), "-D", "-e", "-f", str(config)],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                start_new_session=True)


def halt_sshd(proc: subprocess.Popen | None) -> None:
    """Stop an sshd of :func:`start_sshd` and every session it still serves."""
    if proc is None:
        return
    # Per-connection sshd processes outlive the listener; take the whole tree.
    tree = descendants(proc.pid)
    _kill([proc.pid], signal.SIGTERM)
    _kill(tree)
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)
    _kill(descendants(proc.pid))


class _IndentedDumper(yaml.SafeDumper):
    """Indents list items under their key, as people write nodes.yaml by hand."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)


class _LoopThread:
    """A private asyncio loop in a daemon thread; ``call`` runs a coroutine there."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="nebula-lab", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def call(self, coro: Any, timeout: float = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        if not self._thread.is_alive():
            self.loop.close()


class _NodeServer(asyncssh.SSHServer):
    """asyncssh server side for one node: lab key only, for the lab's user only."""

    def __init__(self, node: _AsyncNode) -> None:
        self._node = node
        self._conn: asyncssh.SSHServerConnection | None = None

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        self._conn = conn
        self._node.conns.add(conn)

    def connection_lost(self, exc: Exception | None) -> None:
        self._node.conns.discard(self._conn)

    def begin_auth(self, username: str) -> bool:
        # Like sshd, only an existing account may log in; here that is the lab's user.
        if username == self._node.lab.user and self._conn is not None:
            self._conn.set_authorized_keys(self._node.lab.authorized_keys)
        return True


class _AsyncNode:
    """One node of the asyncssh kind: its listener, live connections and child processes."""

    def __init__(self, lab: Lab, name: str) -> None:
        self.lab = lab
        self.name = name
        self.server: asyncssh.SSHAcceptor | None = None
        self.conns: set[asyncssh.SSHServerConnection] = set()
        self.tasks: set[asyncio.Task] = set()

    async def start(self) -> None:
        key = asyncssh.read_private_key(self.lab.host_key_path(self.name))
        self.server = await asyncssh.listen(
            "127.0.0.1",
            self.lab.port(self.name),
            server_factory=lambda: _NodeServer(self),
            server_host_keys=[key],
            process_factory=self._handle,
            encoding=None,
            allow_scp=False,
            sftp_factory=None,
            agent_forwarding=False,
            x11_forwarding=False,
            keepalive_interval=0,
        )

    async def stop(self) -> None:
        server, self.server = self.server, None
        if server is not None:
            server.close()
        for conn in list(self.conns):
            conn.abort()
        self.conns.clear()
        if server is not None:
            # Since Python 3.12 this waits for open connections too, hence after abort().
            await within(5, server.wait_closed())
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=3)

    def _handle(self, process: asyncssh.SSHServerProcess) -> None:
        task = asyncio.get_running_loop().create_task(self._run(process))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _run(self, process: asyncssh.SSHServerProcess) -> None:
        """Run one session like sshd: ``$SHELL -c COMMAND`` with the node environment."""
        lab = self.lab
        shell = lab.login_shell
        peer = process.get_extra_info("peername") or ("127.0.0.1", 0)
        env = lab.session_env(self.name)
        env["SSH_CLIENT"] = f"{peer[0]} {peer[1]} {lab.port(self.name)}"
        env["SSH_CONNECTION"] = f"{peer[0]} {peer[1]} 127.0.0.1 {lab.port(self.name)}"
        if process.command is None:
            argv = ["-" + os.path.basename(shell)]  # login shell, like sshd without a command
        else:
            argv = [os.path.basename(shell), "-c", process.command]
        if process.get_terminal_type() is not None:  # `ssh -t`: the session gets a terminal
            await self._run_on_terminal(process, argv, shell, env)
            return
        try:
            child = await asyncio.create_subprocess_exec(
                *argv,
                executable=shell,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                cwd=lab.home,
                env=env,
                start_new_session=True,  # so a closed channel can kill the whole group
            )
        except OSError as exc:
            process.stderr.write(f"nebula lab: cannot start shell: {exc}\n".encode())
            process.exit(127)
            return

        async def pump_in() -> None:
            try:
                while data := await process.stdin.read(65536):
                    child.stdin.write(data)
                    await child.stdin.drain()
            except (OSError, asyncssh.Error, asyncio.CancelledError):
                pass
            finally:
                try:
                    child.stdin.close()
                except OSError:
                    pass

        async def pump_out(src: asyncio.StreamReader, dst: Any) -> None:
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()

        stdin_task = asyncio.create_task(pump_in())
        outputs = asyncio.gather(
            pump_out(child.stdout, process.stdout), pump_out(child.stderr, process.stderr)
        )
        # Cancelled with the session (or the lab stopping), the gather ends "with" a
        # CancelledError nobody reads: asyncio would print it as a traceback on every quit.
        outputs.add_done_callback(_retrieve)
        closed = asyncio.create_task(process.wait_closed())
        done, _ = await asyncio.wait({outputs, closed}, return_when=asyncio.FIRST_COMPLETED)
        if outputs in done and outputs.exception() is None:
            rc = await child.wait()
            stdin_task.cancel()
            closed.cancel()
            try:
                if rc < 0:
                    process.exit_with_signal(signal.Signals(-rc).name[3:])
                else:
                    process.exit(rc)
            except (ValueError, OSError, asyncssh.Error):
                process.close()  # unknown signal number, or the channel is already closing
            return
        # The channel (or connection) went away first: the session's processes go too.
        outputs.cancel()
        # Its CancelledError is expected; retrieved so asyncio does not log it as lost.
        outputs.add_done_callback(lambda f: f.cancelled() or f.exception())
        stdin_task.cancel()
        closed.cancel()
        self._kill_group(child.pid)
        try:
            await within(2, child.wait())
        except asyncio.TimeoutError:
            pass
        process.close()

    async def _run_on_terminal(self, process: asyncssh.SSHServerProcess, argv: list[str],
                               shell: str, env: dict[str, str]) -> None:
        """Like sshd with a PTY (``nebula attach``'s ``ssh -t``): the shell's stdin, stdout
        and stderr are one pseudo-terminal of the client's type and size, its controlling
        terminal; size changes follow the client's."""
        master, slave = pty.openpty()
        _set_window(slave, process.get_terminal_size())
        env = dict(env, TERM=process.get_terminal_type() or "xterm")
        try:
            child = await asyncio.create_subprocess_exec(
                *argv, executable=shell, stdin=slave, stdout=slave, stderr=slave,
                cwd=self.lab.home, env=env, start_new_session=True,
                preexec_fn=_take_terminal)
        except OSError as exc:
            os.close(master)
            process.stderr.write(f"nebula lab: cannot start shell: {exc}\n".encode())
            process.exit(127)
            return
        finally:
            os.close(slave)
        loop = asyncio.get_running_loop()
        output: asyncio.Queue[bytes] = asyncio.Queue()

        def readable() -> None:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every process holding the terminal has gone
                data = b""
            if not data:
                loop.remove_reader(master)
            output.put_nowait(data)

        loop.add_reader(master, readable)

        async def pump_in() -> None:
            while True:
                try:
                    data = await process.stdin.read(65536)
                except asyncssh.TerminalSizeChanged as change:
                    _set_window(master, (change.width, change.height))
                    continue
                except (OSError, asyncssh.Error):
                    return
                if not data:
                    return
                os.write(master, data)

        async def pump_out() -> None:
            while data := await output.get():
                process.stdout.write(data)
                await process.stdout.drain()

        stdin_task = asyncio.create_task(pump_in())
        out_task = asyncio.create_task(pump_out())
        closed = asyncio.create_task(process.wait_closed())
        try:
            done, _ = await asyncio.wait({out_task, closed}, return_when=asyncio.FIRST_COMPLETED)
            if out_task in done:
                rc = await child.wait()
                process.exit(rc if rc >= 0 else 128 - rc)
            else:  # the client went away first: the session's processes go too
                self._kill_group(child.pid)
        finally:
            for task in (stdin_task, out_task, closed):
                task.cancel()
            loop.remove_reader(master)
            os.close(master)

    @staticmethod
    def _kill_group(pid: int) -> None:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _retrieve(future: asyncio.Future) -> None:
    """Mark a finished future's outcome as read (see where it is used)."""
    if not future.cancelled():
        future.exception()


def _set_window(fd: int, size) -> None:
    """Give the terminal on ``fd`` the client's (columns, rows), when it sent one."""
    columns, rows = size[0], size[1]
    if columns and rows:
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))


def _take_terminal() -> None:
    """In the session's new process (a session leader): make stdin its controlling terminal."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class Lab:
    """A simulated cluster rooted at ``root`` (see the module docstring for the layout).

    ``specs`` overrides the preset node descriptions (``presets.node_specs(layout)``);
    each is a node.json dict with at least ``name``.
    """

    def __init__(
        self,
        root: Path,
        layout: str = "demo",
        ssh: str = "asyncssh",
        probe_interval: float = 5.0,
        specs: list[dict] | None = None,
        pools: list[dict] | None = None,
    ) -> None:
        if ssh not in SSH_KINDS:
            raise ValueError(f"ssh must be one of {SSH_KINDS}, not {ssh!r}")
        self.root = Path(root).resolve()
        self.layout = layout
        self.ssh = ssh
        self.probe_interval = probe_interval
        self._specs = specs
        self.pools = list(pools or [])  # nodes.yaml's pools: section (slurmlab.py's)
        self._ports: dict[str, int] = {}
        self._names: list[str] = []
        self._sshd: dict[str, subprocess.Popen] = {}
        self._async: dict[str, _AsyncNode] = {}
        self._loop: _LoopThread | None = None
        self.authorized_keys: asyncssh.SSHAuthorizedKeys | None = None
        pw = pwd.getpwuid(os.getuid())
        self.user = pw.pw_name
        self.home = pw.pw_dir if os.path.isdir(pw.pw_dir) else "/"
        self.login_shell = pw.pw_shell if os.access(pw.pw_shell or "", os.X_OK) else "/bin/sh"

    # ----- paths and names -------------------------------------------------------------
    @property
    def config_path(self) -> Path:
        return self.root / "nodes.yaml"

    @property
    def known_hosts_path(self) -> Path:
        return self.root / "known_hosts"

    @property
    def identity_path(self) -> Path:
        return self.root / "id_ed25519"

    @property
    def ready_path(self) -> Path:
        return self.root / "ready"

    @property
    def nodes(self) -> list[str]:
        return list(self._names)

    def node_dir(self, name: str) -> Path:
        return self.root / "n" / name

    def host_key_path(self, name: str) -> Path:
        return self.node_dir(name) / "host_key"

    def port(self, name: str) -> int:
        return self._ports[name]

    def connect(self, name: str, **kwargs: Any) -> Any:
        """``asyncssh.connect`` to node ``name`` the way the head does (host key verified).

        Use as ``async with lab.connect("node01") as conn:``; keyword arguments pass through.
        """
        options: dict[str, Any] = {
            "known_hosts": str(self.known_hosts_path),
            "client_keys": [str(self.identity_path)],
            "username": self.user,
            "agent_path": None,
            "config": None,
        }
        options.update(kwargs)
        return asyncssh.connect("127.0.0.1", self.port(name), **options)

    def session_env(self, name: str) -> dict[str, str]:
        """The environment a session on node ``name`` starts with (sshd's plus the node's)."""
        env = {
            "HOME": self.home,
            "USER": self.user,
            "LOGNAME": self.user,
            "SHELL": self.login_shell,
        }
        for var in ("LANG", "LC_ALL", "TZ"):
            if var in os.environ:
                env[var] = os.environ[var]
        env.update(self.node_env(name))
        return env

    def node_env(self, name: str) -> dict[str, str]:
        """The variables that make this machine look like node ``name``."""
        nd = self.node_dir(name)
        stdpath = _ROOT_STDPATH if os.getuid() == 0 else _USER_STDPATH
        # The lab's own Python goes last: probes need a python3 even on a bare machine.
        pydir = os.path.dirname(sys.executable)
        path = f"{nd / 'bin'}:{stdpath}"
        if pydir not in stdpath.split(":"):
            path += f":{pydir}"
        return {
            "PATH": path,
            # The simulated NVML and CUDA driver, when the node has them (sim/nvml.py,
            # sim/cuda.py): real pynvml and the warm-up's ctypes load them.
            "LD_LIBRARY_PATH": str(nd / "lib"),
            "NEBULA_SIM_NODE": name,
            "NEBULA_SIM_DIR": str(nd),
            "NEBULA_NODE_DIR": str(nd / "node"),
            "TMUX_TMPDIR": str(nd / "tmux"),
            "NEBULA_CONTAINER_PASSENV": sim_containers.PASSENV,
            # bash reads ~/.bashrc for ssh sessions only at shell level 1; starting at 2
            # keeps a developer's rc (pyenv init takes a lock and can stall for a minute
            # under concurrent logins) out of the simulated nodes.
            "SHLVL": "1",
        }

    # ----- prepare ---------------------------------------------------------------------
    def _node_specs(self) -> list[dict]:
        if self._specs is not None:
            return [dict(s) for s in self._specs]
        return presets.node_specs(self.layout)

    def prepare(self) -> None:
        """Write the whole lab directory and choose free ports (regenerated each time)."""
        specs = self._node_specs()
        self._names = [s["name"] for s in specs]
        self.root.mkdir(parents=True, exist_ok=True)
        self._ports = dict(zip(self._names, _free_ports(len(specs))))

        client = asyncssh.generate_private_key("ssh-ed25519", comment=f"nebula-lab@{self.user}")
        _write_private(self.identity_path, client.export_private_key())
        pub = client.export_public_key().decode()
        (self.root / "id_ed25519.pub").write_text(pub)
        (self.root / "authorized_keys").write_text(pub)
        self.authorized_keys = asyncssh.import_authorized_keys(pub)

        known = []
        boot = time.time()
        for spec in specs:
            name = spec["name"]
            nd = self.node_dir(name)
            for sub in ("bin", "node", "tmux"):
                (nd / sub).mkdir(parents=True, exist_ok=True)
            (nd / "tmux").chmod(0o700)
            known.append(new_host_key(self.host_key_path(name), self.port(name)))
            spec = dict(spec, boot_time=spec.get("boot_time", boot))
            (nd / "node.json").write_text(json.dumps(spec, indent=2) + "\n")
            (nd / "kmsg.log").write_text("")
            if spec.get("osrelease"):  # the kernel the nodelet reads its platform from
                (nd / "osrelease").write_text(spec["osrelease"] + "\n")
            for tool, script, args in _node_tools(spec):
                self._write_wrapper(nd / "bin" / tool, nd, _SIM_PKG / script, args)
            nvml.install(nd, spec)
            cuda.install(nd, spec)  # what the warm-up calls
            self._write_sshd_config(name)
        self.known_hosts_path.write_text("".join(known))
        self._write_config()
        if sim_containers.available():  # podman jobs get these cards as CDI devices
            sim_containers.register([g for s in specs for g in s["gpus"]
                                     if g.get("vendor", DEFAULT_VENDOR) == "nvidia"])

    def _write_wrapper(self, path: Path, node_dir: Path, script: Path, args: tuple = ()) -> None:
        path.write_text(
            "#!/bin/sh\n"
            f"NEBULA_SIM_DIR={shlex.quote(str(node_dir))}; export NEBULA_SIM_DIR\n"
            # -S: the emulators are stdlib-only; site-packages' .pth hooks would double
            # the start-up of every probe call.
            f'exec {shlex.quote(sys.executable)} -S {shlex.quote(str(script))}'
            f'{"".join(" " + shlex.quote(a) for a in args)} "$@"\n'
        )
        path.chmod(0o755)

    def _write_config(self) -> None:
        interval = self.probe_interval
        if float(interval).is_integer():
            interval = int(interval)
        doc = {
            "cluster": {
                "name": "simlab",
                "known_hosts": str(self.known_hosts_path),
                "identity": str(self.identity_path),
                "user": self.user,
                "probe_interval": interval,
            },
            "nodes": [{"name": n, "host": "127.0.0.1", "port": self.port(n)} for n in self._names],
        }
        if self.pools:
            doc["pools"] = self.pools
        self.config_path.write_text(
            "# Simulated lab written by `nebula sim lab`; regenerated on each start.\n"
            + yaml.dump(doc, Dumper=_IndentedDumper, sort_keys=False)
        )

    def _write_sshd_config(self, name: str) -> None:
        nd = self.node_dir(name)
        (nd / "sshd_config").write_text(sshd_config(
            f"simulated node {name}", self.port(name), self.host_key_path(name),
            nd / "sshd.pid", str(self.root / "authorized_keys"), self.node_env(name)))

    # ----- start / stop ----------------------------------------------------------------
    def start(self, timeout: float = 10.0) -> None:
        """Start every node; returns once each accepts TCP connections."""
        if not self._names:
            self.prepare()
        if self.ssh == "openssh":
            self._sshd_prepare_runtime()
        else:
            self._loop = _LoopThread()
        for name in self._names:
            self._launch(name)
        self._wait_listening(self._names, timeout)

    def stop(self) -> None:
        """Stop every node and kill each node's tmux servers and anything left from them."""
        for name in self._names:
            self._halt(name)
        if self._loop is not None:
            self._loop.close()
            self._loop = None
        for name in self._names:
            self.kill_node_tmux(name)
        self._sweep()
        self.ready_path.unlink(missing_ok=True)

    def stop_node(self, name: str) -> None:
        """The node goes silent: no new connections, live connections and sessions die.

        Its tmux server (the jobs) keeps running, as on a node that lost its network.
        """
        self._halt(name)

    def freeze_node(self, name: str) -> None:
        """The node hangs with its connections open (a wedged kernel, a stuck disk): sshd
        and everything below it (sessions, the nodelet) stop with SIGSTOP, so TCP stays
        up but nothing answers. Jobs' tmux servers keep running. Needs the OpenSSH lab."""
        self._signal_tree(name, signal.SIGSTOP)

    def thaw_node(self, name: str) -> None:
        """Resume a node stopped by :meth:`freeze_node` (SIGCONT to the same processes)."""
        self._signal_tree(name, signal.SIGCONT)

    def _signal_tree(self, name: str, sig: int) -> None:
        proc = self._sshd.get(name)
        if self.ssh != "openssh" or proc is None:
            raise RuntimeError(f"{name}: only a running node of the OpenSSH lab can be frozen")
        _kill([proc.pid, *descendants(proc.pid)], sig)

    def start_node(self, name: str, timeout: float = 10.0) -> None:
        """Bring a stopped node back on the same port with the same host key."""
        self._launch(name)
        self._wait_listening([name], timeout)

    def kill_node_tmux(self, name: str) -> None:
        """``tmux kill-server`` for every tmux server of node ``name`` (all its jobs end)."""
        tmux = shutil.which("tmux")
        base = self.node_dir(name) / "tmux"
        if not tmux or not base.is_dir():
            return
        env = dict(os.environ, TMUX_TMPDIR=str(base))
        env.pop("TMUX", None)
        for sockdir in base.glob("tmux-*"):
            for sock in sockdir.iterdir():
                subprocess.run(
                    [tmux, "-S", str(sock), "kill-server"],
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    timeout=10,
                )

    def __enter__(self) -> Lab:
        if not self._names:
            self.prepare()
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def write_ready(self) -> None:
        data = {"pid": os.getpid(), "ssh": self.ssh, "ports": dict(self._ports)}
        tmp = self.ready_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data) + "\n")
        tmp.replace(self.ready_path)

    # ----- per-kind internals ----------------------------------------------------------
    def _sshd_prepare_runtime(self) -> None:
        find_sshd()

    def _launch(self, name: str) -> None:
        if self.ssh == "openssh":
            if name in self._sshd and self._sshd[name].poll() is None:
                return
            nd = self.node_dir(name)
            self._sshd[name] = start_sshd(nd / "sshd_config", nd / "sshd.log")
        else:
            assert self._loop is not None, "lab not started"
            node = self._async.get(name)
            if node is None:
                node = self._async[name] = _AsyncNode(self, name)
            if node.server is None:
                self._loop.call(node.start())

    def _halt(self, name: str) -> None:
        if self.ssh == "openssh":
            halt_sshd(self._sshd.pop(name, None))
        else:
            node = self._async.get(name)
            if node is not None and self._loop is not None:
                self._loop.call(node.stop())

    def _wait_listening(self, names: list[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        pending = list(names)
        while pending:
            pending = [n for n in pending if not port_open(self.port(n))]
            for n in pending:
                proc = self._sshd.get(n)
                if proc is not None and proc.poll() is not None:
                    log = (self.node_dir(n) / "sshd.log").read_text(errors="replace")
                    raise LabError(f"sshd for {n} exited ({proc.returncode}): {log[-2000:]}")
            if pending and time.monotonic() > deadline:
                raise LabError(f"nodes not listening after {timeout}s: {', '.join(pending)}")
            if pending:
                time.sleep(0.02)

    def _sweep(self) -> None:
        """Kill whatever is left that still runs in a node's environment (e.g. nohup jobs)."""
        for _ in range(3):
            pids = lab_processes(self.root)
            if not pids:
                return
            _kill(pids)
            time.sleep(0.05)


def _follow_down_flags(lab: Lab, silent: set[str]) -> None:
    """``nebula sim node down N`` leaves ``n/N/down``: that node stops answering until the
    flag is gone (``sim node up``). Only this process can stop one asyncssh node."""
    for name in lab.nodes:
        flagged = (lab.node_dir(name) / "down").exists()
        if flagged and name not in silent:
            lab.stop_node(name)
            silent.add(name)
        elif not flagged and name in silent:
            lab.start_node(name)
            silent.discard(name)


def run_lab(root: Path, layout: str = "demo", ssh: str = "asyncssh",
            probe_interval: float = 5.0, pools: list[dict] | None = None) -> None:
    """Prepare and start a lab, write ``<root>/ready``, serve until SIGTERM/SIGINT, stop.
    ``pools``: the pools: section its nodes.yaml names (``slurmlab.py`` runs one beside it)."""
    lab = Lab(Path(root), layout=layout, ssh=ssh, probe_interval=probe_interval, pools=pools)
    lab.prepare()
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        lab.start()
        lab.write_ready()
        silent: set[str] = set()
        while not stop.wait(0.2):
            _follow_down_flags(lab, silent)
    finally:
        lab.stop()
        for s, handler in previous.items():
            signal.signal(s, handler)


def lab_arguments(prog: str, description: str) -> argparse.ArgumentParser:
    """The runner's command line (``slurmlab.py``'s runner takes the same)."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--dir", required=True, type=Path, help="lab directory")
    parser.add_argument("--layout", default="demo", choices=presets.LAYOUTS)
    parser.add_argument("--ssh", default="asyncssh", choices=SSH_KINDS)
    parser.add_argument("--probe-interval", type=float, default=5.0)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = lab_arguments("python -m nebula_tui.sim.lab", "Run a simulated GPU lab in the foreground.")
    args = parser.parse_args(argv)
    try:
        run_lab(args.dir, args.layout, args.ssh, args.probe_interval)
    except LabError as exc:
        print(f"nebula lab: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
