"""The suite's collection rules: which tests are ``lab`` tests and which run together under
pytest-xdist. The fixtures come from the plugin ``support.plugin`` (the package
``tests/support/``, importable as ``support`` through pyproject's pytest ``pythonpath``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["support.plugin"]

HERE = Path(__file__).resolve().parent

#: A test reaches the simulated lab (real sshd, tmux, a head process, Slurm) when it asks for
#: one of these; it is then marked ``lab``, in whichever folder it is. Tests that start a lab
#: or a demo of their own say so with ``pytest.mark.lab`` themselves.
LAB_FIXTURES = frozenset({"openssh_lab", "asyncssh_lab", "slurm_lab"})

#: Every test under tests/lab/ is a lab test, whatever it asks for: its module's other
#: tests reach the lab (a module goes to the folder of its majority).
LAB_FOLDER = HERE / "lab"

#: Modules whose tests share something of the whole machine, so that under pytest-xdist
#: they run in one worker, one after another: the Unix users and groups made with
#: support.users' ``lab_users`` (modules borrow each other's, by the same names, and each
#: removes them when it ends); and, though ``slurm_lab`` is a cluster per worker (its own
#: ports, folder, munge socket and MariaDB), the main Slurm modules, so that one cluster
#: serves them all: split one group a module (a677916), three clusters at once on two
#: cores made the whole run slower (1,319 s on a quiet machine, 2026-12-08 00:11, against
#: 1,065 s the night before with one group and 26 tests fewer).
MACHINE_WIDE = {
    **dict.fromkeys(("test_pools_e2e", "test_pool_authorize", "test_tui_pools", "test_slurm_lab",
                     "test_demo_slurm", "test_pool_trust", "test_slurm_oracle", "test_box"), "slurm"),
    **dict.fromkeys(("test_multiuser", "test_accounting", "test_remote_host", "test_attach",
                     "test_shared_box_paths", "test_node_command_lines", "test_install"),
                    "unix-users"),
}


#: A test's rough length on two cores, by its markers, to order the groups by (the full run
#: of 2026-12-07: ``slow`` ones took 10-80 s, most other lab tests 1-5 s, plain ones well
#: under one). By test counts alone a group of 46 lab tests and 4 slow ones (the Unix users')
#: ranked below one of 8 slow tests, though it takes about three times as long.
ESTIMATE = {"slow": 25.0, "lab": 3.0, "plain": 0.3}


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config, items):
    """Marks each test that reaches the lab, or lives in tests/lab/, ``lab``, and gives each
    an xdist group: its module (a module's head and lab are set up once, in one worker) or
    the machine-wide thing it shares. The longest groups by :data:`ESTIMATE` come first, so
    that no long group starts last and the workers end together (longest first; with
    ``--no-loadscope-reorder``: `make test`)."""
    for item in items:
        if LAB_FIXTURES & set(item.fixturenames) or LAB_FOLDER in item.path.resolve().parents:
            item.add_marker(pytest.mark.lab)
    groups: dict[str, list] = {}
    for item in items:
        module = item.module.__name__.rpartition(".")[2] if item.module else item.nodeid
        group = MACHINE_WIDE.get(module, module)
        item.add_marker(pytest.mark.xdist_group(group))
        groups.setdefault(group, []).append(item)

    def seconds(item) -> float:
        kind = "slow" if item.get_closest_marker("slow") else "lab" if item.get_closest_marker("lab") else "plain"
        return ESTIMATE[kind]

    items[:] = [item for group in sorted(groups.values(), key=lambda g: -sum(map(seconds, g)))
                for item in group]
