"""Installing NebulaGrid for everyone on a head box, as docs/admin-guide.md says: the wheel
`python -m build` makes carries what the nodes and the TUI need, and a head installed in a
venv with its `nebula` linked into a bin directory on PATH serves a second Unix user."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path

import pytest
import yaml
from support.boxfixtures import checkout_wheel
from labkit.harness import wait_for

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "admin-guide.md"
RUNUSER = shutil.which("runuser") or "/usr/sbin/runuser"
USER, GROUP = "nebnewbie", "nebinstall"


def _sh(*argv: str) -> None:
    subprocess.run(argv, check=False, capture_output=True)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built as documented from a copy of the tracked files (the build writes
    its own folders beside the sources)."""
    return checkout_wheel(tmp_path_factory)


def test_the_wheel_carries_the_nodelet_the_shims_and_the_styles(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for path in ("nebula_tui/node/nodelet.py", "nebula_tui/node/hardware.py",
                 "nebula_tui/remote/shipping.py", "nebula_tui/sim/nvml_shim.c",
                 "nebula_tui/sim/cuda_shim.c", "nebula_tui/screens/nebula.tcss"):
        assert path in names, path
    assert any(n.endswith("entry_points.txt") for n in names)
    # What the tests and benches run the product with stays beside the package.
    assert not [n for n in names if n.startswith("labkit/") or "/harness.py" in n or "/swarm.py" in n]


def test_the_service_file_runs_the_command_the_guide_installs():
    service = (REPO / "deploy" / "nebula.service").read_text()
    assert "ExecStart=/usr/local/bin/nebula serve " in service
    assert "sudo ln -sf /opt/nebula/bin/nebula /usr/local/bin/nebula" in GUIDE.read_text()


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: creates a Unix user and group")
def test_a_shared_head_installed_as_documented_answers_a_second_user(wheel, openssh_lab):
    python = shutil.which("python3", path="/usr/bin:/bin")
    version = subprocess.run([python, "-c", "import sys; print(sys.version_info >= (3, 11))"],
                             capture_output=True, text=True).stdout.strip()
    if version != "True":
        pytest.skip("the system's python3 is older than 3.11")
    root = Path(tempfile.mkdtemp(prefix="nebula-install-"))
    root.chmod(0o755)
    opt, bin_dir, run, state = root / "opt" / "nebula", root / "bin", root / "run", root / "state"
    server = None
    _sh("groupadd", GROUP)
    _sh("useradd", "-m", "-G", GROUP, USER)
    _sh("usermod", "-a", "-G", GROUP, USER)
    try:
        # The guide's three lines, with /opt and /usr/local/bin under a folder of the test's.
        subprocess.run([python, "-m", "venv", str(opt)], check=True, timeout=120)
        done = subprocess.run([str(opt / "bin" / "pip"), "install", "-q", str(wheel)],
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        bin_dir.mkdir()
        (bin_dir / "nebula").symlink_to(opt / "bin" / "nebula")
        nebula = str(bin_dir / "nebula")
        assert subprocess.run([nebula, "--version"], capture_output=True, text=True,
                              check=True).stdout.startswith("nebula ")

        config = yaml.safe_load(openssh_lab.config_path.read_text())
        config["cluster"]["run_as"] = "submitter"
        (root / "nodes.yaml").write_text(yaml.safe_dump(config))
        run.mkdir()
        shutil.chown(run, group=GROUP)
        run.chmod(0o750)  # as systemd's RuntimeDirectory with the unit's Group=
        socket = run / "nebula.sock"
        server = subprocess.Popen(
            [nebula, "serve", "--config", str(root / "nodes.yaml"), "--socket", str(socket),
             "--shared-group", GROUP],
            env={"PATH": "/usr/bin:/bin", "NEBULA_HOME": str(state), "LANG": "C.UTF-8"},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        def status_as_user() -> subprocess.CompletedProcess:
            return subprocess.run([RUNUSER, "-u", USER, "--", nebula, "status"],
                                  env={"PATH": f"{bin_dir}:/usr/bin:/bin", "LANG": "C.UTF-8",
                                       "NEBULA_SOCKET": str(socket), "HOME": f"/home/{USER}"},
                                  capture_output=True, text=True, timeout=60, cwd="/")
        tries: list[subprocess.CompletedProcess] = []
        try:
            done = wait_for(lambda: (d := status_as_user(), tries.append(d))[0].returncode == 0
                            and "Nodes: 3" in d.stdout and d, 60, what=f"`nebula status` as {USER}")
        except AssertionError:
            raise AssertionError(f"{tries[-1].stdout}{tries[-1].stderr}") from None
        assert "Cluster Overview:" in done.stdout and "node01" in done.stdout
    finally:
        if server is not None:
            server.terminate()
            server.wait(30)
        _sh("userdel", "-r", USER)
        _sh("groupdel", GROUP)
        shutil.rmtree(root, ignore_errors=True)
