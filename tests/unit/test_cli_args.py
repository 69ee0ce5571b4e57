"""The CLI's flags take what users write, exactly."""

from __future__ import annotations

import pytest

from nebula_tui.cli import build_parser


@pytest.mark.parametrize("name", ["--", "-", "---", "-- x", "a--b"])
def test_a_flag_given_with_an_equals_sign_keeps_its_value_even_a_double_dash(name):
    """`--name=--`: argparse on Python 3.11 left such a flag an empty list (the job got no
    name); found by the injection test's random names."""
    args = build_parser().parse_args(["submit", f"--name={name}", "--gpu-mem", "4G"])
    assert args.name == name


def test_a_double_dash_value_is_still_checked_by_its_flags_type():
    with pytest.raises(SystemExit):
        build_parser().parse_args(["queue", "--state=--"])
