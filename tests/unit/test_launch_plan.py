"""Parse once, build the launch once: an ``--array`` is parsed where it comes in (the CLI's
flag, the head's request) and carried parsed in the job's spec, stored as written; the
vendors' knowledge is one table (``remote/vendors.py``); the run script and ``nebula job``'s
environment come from one launch plan (a real launch on the sshd lab shows it)."""

from __future__ import annotations

import json

import pytest
from support.head import submit

from nebula_tui.cli import build_parser
from nebula_tui.cli.jobs import submit_request
from nebula_tui.head.requests import spec_from_request
from nebula_tui.model import VENDORS, InvalidRequest, JobSpec, RequestError, spec_fields
from nebula_tui.remote import containers, launcher, vendors
from nebula_tui.remote.containers import Device
from nebula_tui.store import spec_of
from nebula_tui.units import TaskArray


def test_an_array_is_parsed_once_where_it_comes_in_and_kept_as_written():
    args = build_parser().parse_args(["submit", "--array", "0-3,2%2"])
    args.trailing = ["true"]  # what `nebula` cuts off after `--`
    assert args.array == TaskArray("0-3,2%2", (0, 1, 2, 3), 2)
    request = submit_request(args)
    assert request["array"] == "0-3,2%2"  # the socket carries the text
    spec = spec_from_request(request)
    assert spec.array == args.array
    assert spec_fields(spec)["array"] == "0-3,2%2"  # stored and shown as written
    again = spec_of(json.loads(json.dumps(spec_fields(spec))))
    # the tasks of an array read back from the store share one parse of its text
    assert again == spec and again.array is spec.array
    assert JobSpec(command=("true",), array="0-3,2%2").array is spec.array


def test_a_bad_array_is_refused_where_it_comes_in_with_its_sentence():
    with pytest.raises(SystemExit):
        build_parser().parse_args(["submit", "--array", "5-1"])
    with pytest.raises(RequestError, match="5-1 runs backwards"):
        spec_from_request({"command": ["true"], "array": "5-1"})
    with pytest.raises(ValueError, match="after % comes how many"):
        JobSpec(command=("true",), array="0-3%0")


def test_a_reservation_that_names_no_booking_is_refused_as_never_valid():
    """(It raised NameError — RequestError was never imported — which ruff's F821 found.)"""
    with pytest.raises(InvalidRequest, match="--reservation must name a booking"):
        spec_from_request({"command": ["true"], "reservation": "no such; name"})


# ------------------------------------------------------------------ the vendors' table
def test_every_vendor_the_nodes_report_has_one_row_on_the_head():
    from nebula_tui.node.registry import REGISTRY
    assert {vendor for _, vendor, _, _ in REGISTRY} == set(VENDORS) == set(vendors.BY_NAME)


def test_the_visibility_variables_come_from_the_table():
    four = tuple(Device(f"GPU-{v}", n, v) for n, v in enumerate(VENDORS))
    assert launcher.visible_devices((), four) == {
        "CUDA_VISIBLE_DEVICES": "0", "ROCR_VISIBLE_DEVICES": "1", "HIP_VISIBLE_DEVICES": "1",
        "ZE_AFFINITY_MASK": "2", "ONEAPI_DEVICE_SELECTOR": "level_zero:0",
        "ASCEND_RT_VISIBLE_DEVICES": "3"}
    # no NVIDIA card: CUDA sees none, unless HIP (which reads it too) would then see none
    assert launcher.visible_devices((), four[2:3])["CUDA_VISIBLE_DEVICES"] == ""
    assert "CUDA_VISIBLE_DEVICES" not in launcher.visible_devices((), four[1:2])
    # inside a container each vendor's cards are renumbered among themselves: one Intel card
    # is 0, whatever came before it
    inside = containers.container_env(launcher.visible_devices((), four), four)
    assert inside == {"CUDA_VISIBLE_DEVICES": "GPU-nvidia", "ROCR_VISIBLE_DEVICES": "0",
                      "HIP_VISIBLE_DEVICES": "0", "ZE_AFFINITY_MASK": "0",
                      "ONEAPI_DEVICE_SELECTOR": "level_zero:0", "ASCEND_RT_VISIBLE_DEVICES": "0"}
    assert [vendors.smoke_command(v)[0] for v in VENDORS] == ["nvidia-smi", "rocm-smi", "xpu-smi", "npu-smi"]


def test_sycl_is_told_the_numbers_level_zero_gives_the_cards_it_was_left():
    """ZE_AFFINITY_MASK leaves Level Zero only the job's cards, which SYCL then numbers
    0…k-1: ``level_zero:1,3`` beside a mask of 1,3 named cards SYCL no longer sees."""
    intel = (Device("GPU-i1", 1, "intel"), Device("GPU-i3", 3, "intel"))
    env = launcher.visible_devices((), intel)
    assert (env["ZE_AFFINITY_MASK"], env["ONEAPI_DEVICE_SELECTOR"]) == ("1,3", "level_zero:0,1")
    inside = containers.container_env(env, intel)
    assert (inside["ZE_AFFINITY_MASK"], inside["ONEAPI_DEVICE_SELECTOR"]) == ("0,1", "level_zero:0,1")


# ------------------------------------------------------------------ one plan, on a real launch
def test_what_nebula_job_shows_is_the_environment_the_job_got(head):
    """On the sshd lab: each task of an array on a slice, with a workdir, writes the
    environment its command got; every variable ``nebula job`` shows of it is that one,
    value for value — the run script and the page come from one launch plan."""
    first = submit(head, "--array", "0-1", "--gpu-mem", "4G", "--workdir", "/tmp", "--",
                   "sh", "-c", 'env > "$NEBULA_SIM_DIR/env-$NEBULA_JOB_ID.tmp" && '
                   'mv "$NEBULA_SIM_DIR/env-$NEBULA_JOB_ID.tmp" "$NEBULA_SIM_DIR/env-$NEBULA_JOB_ID"')
    for task in (first, first + 1):
        assert head.wait_job(task, 60)["state"] == "succeeded"
        shown = json.loads(head.run("job", str(task), "--json", check=True).stdout)["environment"]
        (node, variables), = shown.items()
        got = dict(line.split("=", 1) for line in
                   (head.lab.node_dir(node) / f"env-{task}").read_text().splitlines() if "=" in line)
        assert {k: got.get(k) for k in variables} == variables
        # what the plan adds for an array's task, a slice and a workdir is among them
        assert {"NEBULA_ARRAY_TASK_ID", "XLA_PYTHON_CLIENT_MEM_FRACTION", "NEBULA_WORKDIR",
                "CUDA_VISIBLE_DEVICES", "NEBULA_GPU_MEM_MB"} <= set(variables)
        assert variables["NEBULA_ARRAY_TASK_ID"] == str(task - first)


def test_export_and_the_node_choice_travel_with_the_spec_and_the_jobs_own_variables_win():
    request = {"command": ["true"], "nodelist": "gpu[01-02]", "exclude": "gpu02",
               "export": [["MY_SETTING", "a b; $x"], ["CUDA_DEVICE_ORDER", "FASTEST_FIRST"]]}
    spec = spec_from_request(request)
    assert (spec.nodelist, spec.exclude) == (("gpu01", "gpu02"), ("gpu02",))
    assert spec_of(json.loads(json.dumps(spec_fields(spec)))) == spec  # as stored
    from nebula_tui.model import Job, Launching, Placement
    placed = (Placement("GPU-a", "gpu01", 0, 8192, False),)
    env = launcher.launch_plan(Job(7, "alice", spec, 1.0, Launching(placed)), placed).environment
    assert env["MY_SETTING"] == "a b; $x" and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    for bad in ([["NEBULA_JOB_ID", "1"]], [["1X", "v"]], [["X", "v" * 5000]], [["X", "a\0b"]]):
        with pytest.raises(RequestError, match="--export"):
            spec_from_request({"command": ["true"], "export": bad})
    with pytest.raises(RequestError, match="-x/--exclude"):
        spec_from_request({"command": ["true"], "exclude": "gpu[2-1]"})
