"""Parse once, build the launch once: an ``--array`` is parsed where it comes in (the CLI's
flag, the head's request) and carried parsed in the job's spec, stored as written."""

from __future__ import annotations

import json

import pytest

from nebula_tui.cli import build_parser
from nebula_tui.cli.jobs import submit_request
from nebula_tui.head.requests import spec_from_request
from nebula_tui.model import JobSpec, RequestError, spec_fields
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
