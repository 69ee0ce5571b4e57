"""`nebula doctor` and what a node that cannot be reached says of why, against the real head
on the simulated lab's OpenSSH nodes: the healthy lab passes every check; a node whose
login PATH has no tmux fails that check (and only that node); a missing key or known_hosts
file is named, with what makes it."""

from __future__ import annotations

import os
import re

import pytest
import yaml
from labkit.harness import wait_for
from support.labfixtures import serving

from labkit.harness import HeadProcess
from nebula_tui.views import DOCTOR_MARKS


def test_the_healthy_lab_passes_every_check(head):
    done = head.run("doctor")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    warned = sum(l.strip().startswith(DOCTOR_MARKS["warn"]) for l in lines)
    assert lines[-1] == (f"Every check passed with {warned} warning{'s' if warned != 1 else ''}"
                         if warned else "Every check passed")
    for node in ("node01", "node02", "node03"):
        assert node in lines
    for check in ("ssh", "host key", "python3", "tmux", "nvidia", "clock", "disk"):
        assert sum(l.strip().startswith(f"✓ {check} ") for l in lines) == 3, (check, done.stdout)
    # the key file and known_hosts it used are named
    assert head.lab.root.name in done.stdout and "known_hosts" in done.stdout
    one = head.run("doctor", "node02")
    assert one.returncode == 0 and "node01" not in one.stdout
    unknown = head.run("doctor", "node99")
    assert unknown.returncode != 0 and "node99" in unknown.stderr


def _path_without(tool: str, path: str, where) -> str:
    """A directory of links to everything ``path`` finds except ``tool``."""
    where.mkdir()
    for directory in path.split(":"):
        if not os.path.isdir(directory):
            continue
        for name in os.listdir(directory):
            target = os.path.join(directory, name)
            if name != tool and not (where / name).exists() and os.access(target, os.X_OK):
                (where / name).symlink_to(target)
    return str(where)


@pytest.fixture
def broken_lab(openssh_lab, tmp_path):
    """The lab with node03's login PATH missing tmux."""
    config = yaml.safe_load(openssh_lab.config_path.read_text())
    path = openssh_lab.node_env("node03")["PATH"]
    for node in config["nodes"]:
        if node["name"] == "node03":
            node["env"] = {"PATH": _path_without("tmux", path, tmp_path / "bin")}
    file = openssh_lab.root / "nodes-notmux.yaml"
    file.write_text(yaml.safe_dump(config))
    yield from serving(openssh_lab, tmp_path / "home", file)


def test_a_node_without_tmux_in_its_path_fails_that_check(broken_lab):
    done = broken_lab.run("doctor")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "node03\n" in done.stdout, done.stdout
    node03 = done.stdout.split("node03\n")[1]
    assert "  ✗ tmux" in node03 and "apt install tmux" in node03
    assert "✗" not in done.stdout.split("node03\n")[0]  # node01 and node02 are fine
    assert re.fullmatch(r"1 check failed(, \d+ warnings?)?", done.stdout.splitlines()[-1])


def test_a_missing_key_or_known_hosts_file_is_named_with_what_makes_it(openssh_lab, tmp_path):
    config = yaml.safe_load(openssh_lab.config_path.read_text())
    key, known = tmp_path / "keys" / "id_lab", tmp_path / "ssh" / "known_hosts"
    config["nodes"][0]["identity"] = str(key)
    config["nodes"][1]["known_hosts"] = str(known)
    file = tmp_path / "nodes.yaml"
    file.write_text(yaml.safe_dump(config))
    head = HeadProcess(tmp_path / "home", openssh_lab, config=file)
    head.start(wait_nodes=False)
    try:
        shown = wait_for(lambda: (s := head.run("node", "show", "node01").stdout)
                         and "does not exist" in s and s, 30, what="node01's reason")
        assert f"its SSH key {key} (identity in nodes.yaml) does not exist" in shown
        assert f"ssh-keygen -t ed25519 -f {key}" in shown
        shown = wait_for(lambda: (s := head.run("node", "show", "node02").stdout)
                         and "does not exist" in s and s, 30, what="node02's reason")
        assert f"the known_hosts file {known} (known_hosts in nodes.yaml) does not exist" in shown
        assert "nebula node add" in shown
        done = head.run("doctor")
        assert done.returncode == 1
        assert "✗ ssh" in done.stdout and str(key) in done.stdout and str(known) in done.stdout
    finally:
        head.stop()


async def test_the_nodes_screen_shows_a_nodes_checks(head):
    """D on the Nodes screen: the head's checks of the node under the cursor, as the CLI's."""
    from support.tui import until

    from nebula_tui.screens.app import make_app
    from nebula_tui.screens.nodes import DoctorScreen, NodesScreen
    from nebula_tui.screens.widgets.rowtable import RowTable

    app = make_app(head.socket)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.cluster.connected and len(app.cluster.nodes) == 3,
                    what="the snapshot")
        await pilot.press("5")
        await until(pilot, lambda: isinstance(app.screen, NodesScreen), what="nodes")
        table = app.screen.query_one("#nodes-table", RowTable)
        await until(pilot, lambda: "node02" in table.row_keys, what="node02's row")
        table.move_to_key("node02")
        await pilot.press("D")
        await until(pilot, lambda: isinstance(app.screen, DoctorScreen), what="the checks")
        shown = await until(pilot, lambda: "✓ tmux" in (t := str(app.screen.query_one(
            "#doctor-lines").content)) and t, what="node02's checks")
    cli = free_disk(head.run("doctor", "node02").stdout)
    # The same lines as `nebula doctor node02`, but the clock's; the free space is the same
    # line with whatever another process on this machine wrote meanwhile.
    for line in free_disk(shown).splitlines():
        if not line.startswith("✓ clock"):
            assert f"  {line}" in cli, line


def free_disk(text: str) -> str:
    """``text`` with the disk check's figure (``78.1 GB free``) as ``N GB free``."""
    return re.sub(r"[\d,.]+ GB free where", "N GB free where", text)


@pytest.fixture
def shared_lab(openssh_lab, tmp_path):
    """The lab as a shared cluster: jobs run as their owners (run_as: submitter)."""
    config = yaml.safe_load(openssh_lab.config_path.read_text())
    config["cluster"]["run_as"] = "submitter"
    file = openssh_lab.root / "nodes-shared.yaml"
    file.write_text(yaml.safe_dump(config))
    yield from serving(openssh_lab, tmp_path / "home", file)


def test_a_shared_cluster_checks_the_user_switch_and_hidepid(shared_lab):
    """Where several users' jobs share the nodes, the login must be able to run a job as its
    owner, and /proc must hide each user's command lines from the others."""
    done = shared_lab.run("doctor", "node01")
    hidden = any(o.startswith("hidepid=") and o != "hidepid=0" for line in
                 open("/proc/mounts") if line.split()[1] == "/proc" for o in line.split()[3].split(","))
    assert "✓ run_as" in done.stdout, done.stdout  # root asks, and the lab's login is root
    if hidden:
        assert "✓ hidepid" in done.stdout and done.returncode == 0, done.stdout
    else:  # this machine's /proc, as the lab's nodes share it: a real failure, with its fix
        assert "✗ hidepid" in done.stdout and "hidepid=invisible" in done.stdout
        assert done.returncode == 1


def test_a_container_runtime_is_checked_only_where_a_job_asks_for_an_image(head):
    """The healthy lab checks no runtime; once a job asks for an image, each node's runtime
    (the first its login can use, as that job would get) must run."""
    import shutil

    assert "containers" not in head.run("doctor", "node01").stdout
    if not any(shutil.which(t) for t in ("podman", "docker", "apptainer")):
        pytest.skip("no container runtime on this machine")
    blocker = head.run("submit", "--gpu-mem", "4G", "--", "sleep", "300", check=True)
    blocker_id = blocker.stdout.split()[2]
    waiting = head.run("submit", "--after", blocker_id, "--image", "localhost/nebula-python:3.11",
                       "--gpu-mem", "4G", "--", "true", check=True).stdout.split()[2]
    try:
        done = head.run("doctor", "node01")
        assert done.returncode == 0, done.stdout
        assert "✓ containers" in done.stdout and " runs" in done.stdout
    finally:
        head.run("cancel", waiting, blocker_id)
