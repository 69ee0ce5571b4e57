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


# --- durations as Slurm reads them -----------------------------------------------------

@pytest.mark.parametrize("text, seconds", [
    ("90", 5400), ("1", 60), ("0.5", 30),              # a bare number is minutes, as sbatch -t
    ("1:30", 90), ("90:00", 5400),                      # MM:SS
    ("1:30:00", 5400), ("0:00:30", 30), ("100:00:00", 360000),  # HH:MM:SS
    ("2-12", 216000), ("1-0:30", 88200), ("1-2:03:04", 93784),  # D-HH, D-HH:MM, D-HH:MM:SS
    ("90s", 90), ("30m", 1800), ("2h", 7200), ("7d", 604800), ("10 min", 600),
])
def test_a_typed_duration_means_what_it_means_to_sbatch(text, seconds):
    from nebula_tui.units import parse_duration_s

    assert parse_duration_s(text) == seconds


@pytest.mark.parametrize("text", ["", "0", "0:00", "1:2:3:4", "1-2-3", "-5", "1:", ":30",
                                  "1-", "ninety", "1h30", "1:30x"])
def test_a_duration_that_is_none_of_slurms_forms_is_refused_in_one_line(text):
    from nebula_tui.units import parse_duration_s

    with pytest.raises(ValueError) as info:
        parse_duration_s(text)
    assert "\n" not in str(info.value)


def test_time_90_is_ninety_minutes_on_submit_run_and_bookings():
    parser = build_parser()
    assert parser.parse_args(["submit", "--time", "90"]).time_limit == 5400
    assert parser.parse_args(["run", "--time", "1:30:00"]).time_limit == 5400
    assert parser.parse_args(["reserve", "--duration", "2-12"]).duration == 216000


def test_nodes_yaml_timings_keep_seconds_but_a_bare_job_limit_is_refused_as_ambiguous():
    from nebula_tui.config.settings import limits_settings

    assert limits_settings({"max_time": "1:30:00"}).max_time_s == 5400
    assert limits_settings({"max_time": 0}).max_time_s is None
    assert limits_settings({"memory_grace": 30}).memory_grace_s == 30
    with pytest.raises(ValueError, match="ambiguous"):
        limits_settings({"max_time": 90})


def test_a_limit_is_shown_to_the_second():
    from nebula_tui.units import duration_exact

    assert [duration_exact(s) for s in (5400, 90, 216000, 86400, 5)] == [
        "1 h 30 min", "1 min 30 s", "2 days 12 h", "1 day", "5 s"]
