"""A GPU process is told to be a container job's by its cgroup: the parser of
/proc/PID/cgroup against the lines real runtimes and cgroup managers write (v1 and v2)."""

from __future__ import annotations

import pytest

from nebula_tui.node.cgroups import cgroup_container_id, pane_scope, systemd_path

ID = "776330b523656255e944e0955f8362cd68886ef61cbeb298d2b892d4f361cece"
OTHER = "0e702541d0afa1d25709b57e0085b8110e702541d0afa1d25709b57e0085b811"
V1_LIBPOD = "\n".join(f"{n}:{c}:/libpod_parent/libpod-{ID}" for n, c in [
    (9, "name=systemd"), (8, "pids"), (4, "memory"), (1, "cpu")]) + f"\n0::/libpod_parent/libpod-{ID}\n"


@pytest.mark.parametrize(("text", "found"), [
    (V1_LIBPOD, ID),                                                        # podman, cgroupfs, v1 (this machine)
    (f"0::/machine.slice/libpod-{ID}.scope/container\n", ID),               # podman, systemd, v2
    (f"0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID}.scope/container\n", ID),  # rootless
    (f"0::/system.slice/docker-{ID}.scope\n", ID),                          # docker, systemd, v2
    (f"12:memory:/docker/{ID}\n11:pids:/docker/{ID}\n", ID),                # docker, cgroupfs, v1
    (f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1a2b.slice/cri-containerd-{ID}.scope\n", ID),
    (f"0::/machine.slice/crio-{ID}.scope\n", ID),
    (f"0::/docker/{OTHER}/docker/{ID}\n", ID),                              # the innermost container
    (f"0::/machine.slice/libpod-conmon-{ID}.scope\n", None),                # podman's monitor is not in it
    ("0::/user.slice/user-1000.slice/session-3.scope\n", None),             # a login session
    ("0::/user.slice/user-0.slice/user@0.service/app.slice/tmux-spawn-5c1d.scope\n", None),
    ("9:name=systemd:/\n4:memory:/process_api/0e702541d0afa1d25709b57e0085b811\n0::/\n", None),
    (f"0::/machine.slice/libpod-{ID[:-1]}.scope\n", None),                  # 63 digits is no id
    (f"0::/machine.slice/libpod-{ID.upper()}.scope\n", None),               # ids are lower case
    (f"0::/machine.slice/notes-{ID}.txt\n", None),
    (f"garbage\n:::\n0:/no-leading-slash-{ID}\n", None),
    ("", None), (None, None),
])
def test_the_container_a_cgroup_names(text, found):
    assert cgroup_container_id(text) == found


def test_a_huge_cgroup_file_is_read_only_so_far():
    text = "0::/\n" * 10_000 + f"0::/machine.slice/libpod-{ID}.scope\n"
    assert cgroup_container_id(text) is None


SPAWN = "/user.slice/user-1000.slice/user@1000.service/tmux-spawn-3f7e2a51-9c1d-4b8e-a0f2-6d5c4b3a2910.scope"


@pytest.mark.parametrize(("text", "scope"), [
    (f"0::{SPAWN}\n", SPAWN),                                               # v2
    (f"0::{SPAWN}/\n", SPAWN),
    (f"12:memory:/user.slice\n1:name=systemd:{SPAWN}\n0::/\n", SPAWN),      # v1: systemd's hierarchy
    (f"1:name=systemd:/user.slice\n0::{SPAWN}\n", SPAWN),                   # hybrid: the unified one first
    ("0::/user.slice/user-1000.slice/session-3.scope\n", None),             # a login session: shared
    ("0::/user.slice/user-1000.slice/user@1000.service/app.slice/tmux.service\n", None),
    (f"0::{SPAWN}/child\n", None),                                          # below it, not the scope
    ("0::/user.slice/tmux-spawn-.scope\n", None),
    (f"4:memory:{SPAWN}\n", None),                                          # only systemd's tree says
    ("", None), (None, None), ("no colons at all", None),
])
def test_the_tmux_pane_scope_a_cgroup_names(text, scope):
    assert pane_scope(text) == scope


def test_the_systemd_path_of_v1_v2_and_hybrid_files():
    assert systemd_path(V1_LIBPOD) == f"/libpod_parent/libpod-{ID}"
    assert systemd_path("9:name=systemd:/a\n4:memory:/b\n") == "/a"
    assert systemd_path("4:memory:/b\n") is None
