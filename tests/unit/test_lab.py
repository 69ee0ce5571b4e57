"""The simulated lab, exercised over real SSH the way the head service uses it.

The `openssh_lab` and `asyncssh_lab` fixtures come from support/labfixtures.py through the plugin support.plugin.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import asyncssh
import pytest
import yaml

from nebula_tui.sim.lab import Lab, lab_processes

REPO = Path(__file__).resolve().parents[2]
HAVE_FAKE_SMI = (REPO / "nebula_tui" / "sim" / "fake_smi.py").exists()
KINDS = ["openssh", "asyncssh"]


@pytest.fixture(params=KINDS)
def lab(request) -> Lab:
    return request.getfixturevalue(f"{request.param}_lab")


async def test_files_written(lab: Lab) -> None:
    cfg = yaml.safe_load(lab.config_path.read_text())
    assert lab.config_path.read_text().startswith("# Simulated lab")
    assert cfg["cluster"]["known_hosts"] == str(lab.known_hosts_path)
    assert cfg["cluster"]["identity"] == str(lab.identity_path)
    assert cfg["cluster"]["probe_interval"] == 1
    assert [n["name"] for n in cfg["nodes"]] == lab.nodes == ["node01", "node02", "node03"]
    assert {n["port"] for n in cfg["nodes"]} == {lab.port(n) for n in lab.nodes}
    lines = lab.known_hosts_path.read_text().splitlines()
    assert [ln.split()[0] for ln in lines] == [f"[127.0.0.1]:{lab.port(n)}" for n in lab.nodes]
    assert len({ln.split()[2] for ln in lines}) == 3  # one host key per node
    spec = json.loads((lab.node_dir("node02") / "node.json").read_text())
    assert spec["name"] == "node02" and len(spec["gpus"]) == 4 and "boot_time" in spec
    assert (lab.node_dir("node01") / "kmsg.log").is_file()  # other tests of the session write to it
    for tool in ("nvidia-smi", "dmesg"):
        assert os.access(lab.node_dir("node01") / "bin" / tool, os.X_OK)


async def test_node_environment(lab: Lab) -> None:
    for name in lab.nodes:
        async with lab.connect(name) as conn:
            r = await conn.run(
                "echo $NEBULA_SIM_NODE; echo $NEBULA_SIM_DIR; echo $NEBULA_NODE_DIR;"
                " echo $TMUX_TMPDIR; command -v nvidia-smi; command -v dmesg; pwd",
                check=True,
            )
            nd = lab.node_dir(name)
            assert r.stdout.splitlines() == [
                name, str(nd), str(nd / "node"), str(nd / "tmux"),
                str(nd / "bin" / "nvidia-smi"), str(nd / "bin" / "dmesg"),
                os.path.expanduser("~"),
            ]


@pytest.mark.skipif(not HAVE_FAKE_SMI, reason="fake_smi.py not written yet")
async def test_nvidia_smi_lists_preset_gpus(lab: Lab) -> None:
    for name in lab.nodes:
        spec = json.loads((lab.node_dir(name) / "node.json").read_text())
        async with lab.connect(name) as conn:
            r = await conn.run("nvidia-smi -L", check=True)
        lines = r.stdout.splitlines()
        assert len(lines) == len(spec["gpus"])
        for line, gpu in zip(lines, spec["gpus"]):
            assert gpu["name"] in line and gpu["uuid"] in line


async def test_stdin_streams_both_ways(lab: Lab) -> None:
    async with lab.connect("node01") as conn:
        async with conn.create_process("cat") as proc:
            for i in range(5):
                proc.stdin.write(f"line {i}\n")
                assert await asyncio.wait_for(proc.stdout.readline(), 5) == f"line {i}\n"
            proc.stdin.write_eof()
            result = await asyncio.wait_for(proc.wait(), 5)
    assert result.exit_status == 0


async def test_probe_like_process_streams(lab: Lab) -> None:
    """A python3 -u -c process whose script arrives on stdin prints while it runs."""
    script = (
        "import json, sys, time\n"
        "for i in range(4):\n"
        "    print(json.dumps({'tick': i}), flush=True)\n"
        "    time.sleep(0.3)\n"
        "print(json.dumps({'echo': sys.stdin.readline().strip()}), flush=True)\n"
    )
    loader = "import sys; exec(sys.stdin.read(int(sys.stdin.readline())))"
    async with lab.connect("node02") as conn:
        async with conn.create_process(f"python3 -u -c '{loader}'") as proc:
            proc.stdin.write(f"{len(script)}\n{script}")
            first = json.loads(await asyncio.wait_for(proc.stdout.readline(), 10))
            first_at = time.monotonic()
            ticks = [first] + [
                json.loads(await asyncio.wait_for(proc.stdout.readline(), 5)) for _ in range(3)
            ]
            assert ticks == [{"tick": i} for i in range(4)]
            # Lines arrive as printed, not in one lump when the process ends.
            assert time.monotonic() - first_at > 0.6
            proc.stdin.write("hello\n")
            assert json.loads(await proc.stdout.readline()) == {"echo": "hello"}
            result = await asyncio.wait_for(proc.wait(), 5)
    assert result.exit_status == 0


async def test_exit_status_and_stderr(lab: Lab) -> None:
    async with lab.connect("node03") as conn:
        r = await conn.run("echo oops >&2; exit 3")
    assert r.exit_status == 3
    assert r.stderr == "oops\n"


async def test_concurrent_execs_on_one_connection(lab: Lab) -> None:
    # Stay under OpenSSH's default MaxSessions (10 channels per connection).
    async with lab.connect("node01") as conn:
        results = await asyncio.gather(*(conn.run(f"echo {i}") for i in range(8)))
    assert [r.stdout.strip() for r in results] == [str(i) for i in range(8)]


async def test_tmux_server_per_node(lab: Lab) -> None:
    try:
        async with lab.connect("node01") as n1, lab.connect("node02") as n2:
            await n1.run("tmux -L nebula new-session -d -s x 'sleep 30'", check=True)
            r1 = await n1.run("tmux -L nebula ls -F '#{session_name}'")
            r2 = await n2.run("tmux -L nebula ls -F '#{session_name}'")
            # (earlier tests' heads leave their nodelets' control sessions on the lab's nodes)
            assert [s for s in r1.stdout.split() if not s.startswith("nebula-control-")] == ["x"]
            assert "x" not in r2.stdout.split()
            lab.kill_node_tmux("node01")
            r1 = await n1.run("tmux -L nebula ls")
            assert r1.exit_status != 0
    finally:
        lab.kill_node_tmux("node01")


async def test_changed_host_key_is_refused(lab: Lab, tmp_path: Path) -> None:
    other = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().split()
    kh = tmp_path / "known_hosts"
    kh.write_text(f"[127.0.0.1]:{lab.port('node01')} {other[0]} {other[1]}\n")
    with pytest.raises(asyncssh.HostKeyNotVerifiable):
        async with lab.connect("node01", known_hosts=str(kh)):
            pass


async def test_other_client_key_is_refused(lab: Lab) -> None:
    stranger = asyncssh.generate_private_key("ssh-ed25519")
    with pytest.raises(asyncssh.PermissionDenied):
        async with lab.connect("node01", client_keys=[stranger]):
            pass


async def test_stop_node_and_start_node(lab: Lab) -> None:
    port = lab.port("node02")
    try:
        async with lab.connect("node02") as conn:
            async with conn.create_process("cat") as proc:
                lab.stop_node("node02")
                # The live session dies with the node.
                await asyncio.wait_for(proc.wait_closed(), 5)
        with pytest.raises(OSError):
            async with lab.connect("node02", connect_timeout=3):
                pass
        # The other nodes are unaffected.
        async with lab.connect("node01") as conn:
            assert (await conn.run("echo ok")).stdout == "ok\n"
    finally:
        lab.start_node("node02")
    assert lab.port("node02") == port
    async with lab.connect("node02") as conn:
        assert (await conn.run("echo $NEBULA_SIM_NODE")).stdout == "node02\n"


@pytest.mark.lab  # a lab of its own
@pytest.mark.parametrize("kind", KINDS)
def test_fresh_lab_starts_fast_and_leaves_nothing(kind: str, tmp_path: Path) -> None:
    root = tmp_path / "lab"
    lab = Lab(root, layout="demo", ssh=kind)
    lab.prepare()
    t0 = time.monotonic()
    lab.start()
    assert time.monotonic() - t0 < 2.0

    async def leave_things_running() -> None:
        async with lab.connect("node01") as c1, lab.connect("node03") as c3:
            await c1.run("tmux -L nebula new-session -d -s job 'sleep 300'", check=True)
            await c3.run("nohup sleep 300 >/dev/null 2>&1 &", check=True)
            # A session still open when the lab stops.
            await c3.create_process("sleep 300")
            await asyncio.sleep(0.2)
            assert lab_processes(root)
            await asyncio.get_running_loop().run_in_executor(None, lab.stop)

    asyncio.run(leave_things_running())
    deadline = time.monotonic() + 3
    while lab_processes(root) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert lab_processes(root) == []
    for name in lab.nodes:
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", lab.port(name)), timeout=1).close()


def test_runner_writes_ready_and_stops_on_sigterm(tmp_path: Path) -> None:
    root = tmp_path / "lab"
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen(
        [sys.executable, "-m", "nebula_tui.sim.lab", "--dir", str(root), "--layout", "4x4",
         "--ssh", "asyncssh", "--probe-interval", "2"],
        env=env, cwd=REPO,
    )
    try:
        deadline = time.monotonic() + 20
        while not (root / "ready").exists():
            assert proc.poll() is None, "runner exited early"
            assert time.monotonic() < deadline, "no ready file"
            time.sleep(0.05)
        ready = json.loads((root / "ready").read_text())
        assert ready["pid"] == proc.pid and ready["ssh"] == "asyncssh"
        assert sorted(ready["ports"]) == ["node01", "node02", "node03", "node04"]
        cfg = yaml.safe_load((root / "nodes.yaml").read_text())
        assert cfg["cluster"]["probe_interval"] == 2

        async def probe() -> str:
            async with asyncssh.connect(
                "127.0.0.1", ready["ports"]["node04"], known_hosts=str(root / "known_hosts"),
                client_keys=[str(root / "id_ed25519")], username=cfg["cluster"]["user"],
            ) as conn:
                return (await conn.run("echo $NEBULA_SIM_NODE", check=True)).stdout

        assert asyncio.run(probe()) == "node04\n"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
        assert not (root / "ready").exists()
        assert lab_processes(root) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def test_exit_by_signal_is_reported(lab: Lab) -> None:
    async with lab.connect("node01") as conn:
        r = await conn.run("kill -TERM $$")
    assert r.exit_signal is not None and r.exit_signal[0] == "TERM"


def _running(lab: Lab, needle: bytes) -> list[int]:
    found = []
    for pid in lab_processes(lab.root):
        try:
            if needle in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            pass
    return found


async def test_asyncssh_kills_command_when_channel_closes(asyncssh_lab: Lab) -> None:
    async with asyncssh_lab.connect("node03") as conn:
        proc = await conn.create_process("echo started; exec sleep 301")
        assert await asyncio.wait_for(proc.stdout.readline(), 10) == "started\n"
        deadline = time.monotonic() + 5
        while not _running(asyncssh_lab, b"sleep\x00301") and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert _running(asyncssh_lab, b"sleep\x00301")
        proc.close()
    deadline = time.monotonic() + 5
    while _running(asyncssh_lab, b"sleep\x00301") and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert _running(asyncssh_lab, b"sleep\x00301") == []


@pytest.mark.parametrize("lab_kind", ["openssh_lab", "asyncssh_lab"])
def test_ssh_t_gets_a_terminal_as_on_a_real_node(lab_kind, request) -> None:
    """`nebula attach` runs `ssh -t … tmux attach`: both labs give such a session a
    pseudo-terminal of the client's type (the demo's asyncssh nodes included)."""
    lab: Lab = request.getfixturevalue(lab_kind)
    argv = ["ssh", "-tt", "-p", str(lab.port("node01")), "-i", str(lab.identity_path),
            "-o", f"UserKnownHostsFile={lab.known_hosts_path}", "-o", "StrictHostKeyChecking=yes",
            "-o", "BatchMode=yes", f"{lab.user}@127.0.0.1", "tty; echo TERM=$TERM; [ -t 0 ] && echo ON-A-TTY"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30,
                          env={**os.environ, "TERM": "xterm-256color"})
    assert done.returncode == 0, done.stderr
    assert "/dev/pts/" in done.stdout and "ON-A-TTY" in done.stdout
    assert "TERM=xterm-256color" in done.stdout
