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


def test_a_refused_limit_is_echoed_as_a_flag_takes_it_back():
    from nebula_tui.units import duration_flag, parse_duration_s

    shown = [duration_flag(s) for s in (259200, 7200, 5400, 90, 61)]
    assert shown == ["3d", "2h", "90m", "90s", "61s"]
    assert [parse_duration_s(t) for t in shown] == [259200, 7200, 5400, 90, 61]


def test_an_age_is_shown_in_its_largest_unit():
    from nebula_tui.units import duration_coarse

    assert [duration_coarse(s) for s in (-3, 12, 300, 10799, 2 * 86400)] == ["0s", "12s", "5m", "2h", "2d"]


# --- Slurm's flags on submit and run ---------------------------------------------------

def _request(*argv: str) -> dict:
    from nebula_tui.cli.jobs import submit_request

    args = build_parser().parse_args(list(argv))
    args.trailing = ["true"]
    return submit_request(args)


def test_slurms_short_and_long_names_ask_what_ours_do():
    slurm = _request("submit", "-G", "2", "-t", "90", "-J", "x", "-N", "2", "-D", "/tmp",
                     "--mem-per-gpu", "8G", "-p", "hpc", "--qos=scavenger", "--mail-type=END,FAIL",
                     "-a", "0-3", "-o", "%x-%j.out", "-e", "err-%A_%a.txt")
    ours = _request("submit", "--gpu-count", "2", "--time", "90m", "--name", "x", "--nodes", "2",
                    "--workdir", "/tmp", "--gpu-mem", "8G", "--pool", "hpc", "--preemptible",
                    "--notify", "--array", "0-3", "--output", "%x-%j.out", "--error", "err-%A_%a.txt")
    assert slurm == ours
    assert (slurm["gpu_count"], slurm["time_limit_s"], slurm["pool"], slurm["preemptible"]) == (
        2, 5400, "hpc", True)


@pytest.mark.parametrize("argv, fields", [
    (["-G", "a100:2"], {"gpu_count": 2, "arch": "sm_80", "vendor": None}),
    (["--gpus=nvidia:1"], {"gpu_count": 1, "vendor": "nvidia"}),
    (["--gres=gpu:2", "-N", "2"], {"gpu_count": 4, "nodes": 2}),   # per node, as in Slurm
    (["--gres=gpu:h100:1"], {"gpu_count": 1, "arch": "sm_90"}),
    (["--gres=gpu"], {"gpu_count": 1}),
    (["-G", "3", "--gres=gpu:1"], {"gpu_count": 1}),               # the last one wins
    (["-d", "afterok:12:13"], {"after": [12, 13], "after_type": "ok"}),
    (["-d", "afterany:12"], {"after": [12], "after_type": "any"}),
    (["-d", "afternotok:12"], {"after": [12], "after_type": "notok"}),
    (["-d", "after:12"], {"after": [12], "after_type": "started"}),
    (["-d", "12"], {"after": [12], "after_type": "any"}),            # sbatch: afterany
    (["--after", "12,13"], {"after": [12, 13], "after_type": "ok"}),  # ours stay
    (["--after", "notok:12"], {"after": [12], "after_type": "notok"}),
    (["--after", "any:12,13"], {"after": [12, 13], "after_type": "any"}),
    (["--qos=normal"], {"preemptible": False}),
    (["--mail-type=NONE"], {"notify": False}),
    (["--wrap", "echo hi"], None),
])
def test_slurm_values_map_onto_nebulagrids_fields(argv, fields):
    from nebula_tui.cli.jobs import submit_request

    args = build_parser().parse_args(["submit", *argv])
    args.trailing = [] if "--wrap" in argv else ["true"]
    request = submit_request(args)
    if fields is None:
        assert request["command"] == ["echo hi"] and request["shell"]
        return
    assert {k: request[k] for k in fields} == fields


@pytest.mark.parametrize("argv, says", [
    (["-G", "b99:1"], "is not a vendor"),
    (["-G", "0"], "GPU count of 1 or more"),
    (["--gres=shard:2"], "only GPUs"),
    (["-d", "singleton"], "not a dependency NebulaGrid keeps"),
    (["-d", "afterok:1,afterany:2"], "one kind of dependency"),
    (["-d", "afterok"], "give the job ids"),
    (["-t", "0"], "longer than 0"),
    (["-t", "1:2:3:4"], "is not a duration"),
])
def test_a_slurm_value_we_cannot_read_is_a_one_line_usage_error(argv, says, capsys):
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["submit", *argv])
    err = capsys.readouterr().err
    assert info.value.code == 2 and says in err and err.count("\n") == 1, err


def test_a_slurm_option_we_cannot_honour_is_said_in_one_line_and_the_job_still_goes(capsys):
    request = _request("submit", "--cpus-per-task=8", "--mem", "32G", "--exclusive", "-w", "node01",
                       "--export=ALL", "--qos=high", "-A", "lab")
    assert request is not None
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 5, lines  # -w and --export are honoured now
    assert lines[0].startswith("nebula submit: --cpus-per-task=8 is Slurm's and not honoured here (")
    assert any(line.startswith("nebula submit: --exclusive is Slurm's") for line in lines)
    assert any("--qos=high" in line for line in lines)
    assert request["nodelist"] == "node01" and request["export"] == []


def test_nodelist_exclude_and_export_are_asked_for_as_slurm_spells_them(monkeypatch):
    monkeypatch.setenv("FROM_HERE", "it's here")
    request = _request("submit", "-w", "gpu[01-02]", "--exclude=gpu03", "--export=ALL,A=1,B=x y",
                       "--export", "FROM_HERE")
    assert request["nodelist"] == "gpu[01-02]" and request["exclude"] == "gpu03"
    assert request["export"] == [["A", "1"], ["B", "x y"], ["FROM_HERE", "it's here"]]
    assert _request("submit", "--export=NONE")["export"] == []


def test_export_of_a_variable_not_set_here_is_a_usage_error(monkeypatch, capsys):
    monkeypatch.delenv("SURELY_UNSET_VAR", raising=False)
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["submit", "--export", "SURELY_UNSET_VAR"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "SURELY_UNSET_VAR" in err and err.count("\n") == 1, err


def test_the_submit_form_and_the_cli_agree_on_p():
    """The form said "Preemptible (-p)" while -p was refused; -p is Slurm's partition now."""
    import inspect

    from nebula_tui.screens import submit

    assert "(-p)" not in inspect.getsource(submit)
    assert build_parser().parse_args(["submit", "-p", "local"]).pool == "local"


# --- #SBATCH lines ------------------------------------------------------------------------

def test_sbatch_lines_are_read_from_the_top_up_to_the_first_command():
    from nebula_tui.cli.slurm import script_directives

    text = ("#!/bin/bash\n#SBATCH --job-name='my job'  # a comment\n\n# plain comment\n"
            "#SBATCH -t 1:00:00\n#NEBULA --image docker.io/x\n#SBATCHX --no\n"
            "echo start\n#SBATCH --after-the-command-is-not-read\n")
    assert script_directives(text) == ["--job-name=my job", "-t", "1:00:00", "--image", "docker.io/x"]


def test_a_scripts_directives_yield_to_the_command_line(tmp_path, capsys):
    from nebula_tui.cli.args import leaf_parser
    from nebula_tui.cli.jobs import submit_request
    from nebula_tui.cli.slurm import with_directives

    script = tmp_path / "train.sh"
    script.write_text("#!/usr/bin/env python3\n#SBATCH -J fromscript -t 30\n#SBATCH -o %x-%j.out\n"
                      "#SBATCH -G 2\nprint(1)\n")
    parser = build_parser()
    argv = ["submit", "-G", "1", "-t", "90", str(script), "a", "-t"]
    args = parser.parse_args(argv)
    args = with_directives(parser, leaf_parser(parser, args), argv, args)
    args.trailing = []
    request = submit_request(args)
    assert (request["name"], request["time_limit_s"], request["gpu_count"], request["output"]) == (
        "fromscript", 5400, 1, "%x-%j.out")
    assert request["command"] == ["/usr/bin/env", "python3", str(script), "a", "-t"]
    unnamed = tmp_path / "eval.sh"
    unnamed.write_text("#!/bin/sh\necho no directives\n")
    args = parser.parse_args(["submit", str(unnamed)])
    args = with_directives(parser, leaf_parser(parser, args), ["submit", str(unnamed)], args)
    args.trailing = []
    request = submit_request(args)
    assert request["name"] == "eval.sh" and request["command"] == ["/bin/sh", str(unnamed)]


@pytest.mark.parametrize("text, says", [
    (None, "no such script; the command to run goes after `--` (nebula submit -- python train.py)"),
    ("echo no interpreter\n", "its first line must be #!"),
    ("#!/bin/sh\n#SBATCH --no-such-flag\n", "lines hold what is no flag here: --no-such-flag"),
    ("#!/bin/sh\n#SBATCH --job-name='open\n", "No closing quotation"),
])
def test_a_script_sbatch_would_refuse_is_a_one_line_usage_error(tmp_path, monkeypatch, capsys, text, says):
    from nebula_tui.cli.main import main

    monkeypatch.chdir(tmp_path)
    if text is not None:
        (tmp_path / "python").write_text(text)
    with pytest.raises(SystemExit) as info:
        main(["--home", str(tmp_path / "home"), "submit", "python", "train.py"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and says in err and err.count("\n") == 1, err


def test_squeue_formats_cut_and_pad_as_squeue_does():
    from nebula_tui.cli.slurm import squeue_text

    job = {"id": 12, "name": "a-long-name", "user": "alice", "state": "running", "array_id": None,
           "started_at": 100.0, "time_limit_s": 5400, "gpus": [{"node": "node01"}], "nodes": 1,
           "reason": "", "pool": None, "gpu_count": 1, "submitted_at": 90.0}
    assert squeue_text([job], "%i %T", False, 3825.0) == "12 RUNNING"
    assert squeue_text([job], "%.5i|%.8j|%t|%M|%l|%D|%R", True, 3825.0).splitlines() == [
        "JOBID|    NAME|ST|TIME|TIME_LIMIT|NODES|NODELIST(REASON)",
        "   12|a-long-n|R|1:02:05|1:30:00|1|node01"]
    waiting = {**job, "state": "pending", "started_at": None, "gpus": [], "reason": "Resources",
               "time_limit_s": None, "array_id": 12, "array_index": 3}
    assert squeue_text([waiting], "%i %t %M %l %R", False, 0) == "12_3 PD 0:00 UNLIMITED (Resources)"
