"""The launcher's run script, run for real with ``sh`` (and ``tee``) in a temporary job dir.

What the nodelet does on a node is: write ``run.sh`` into the job directory and run
``sh run.sh <jobdir>`` in a tmux session. Here the same script runs without tmux; the
files it leaves (output.log, exit_code, started) are what the head later reads.
"""

from __future__ import annotations

import getpass
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nebula_tui.model import Job, JobSpec, Launching, Placement
from nebula_tui.remote.launcher import run_script

pytestmark = pytest.mark.skipif(shutil.which("sh") is None or shutil.which("tee") is None,
                                reason="needs sh and tee")

ECHO_ARGV = [sys.executable, "-S", "-c", "import json,sys; print(json.dumps(sys.argv[1:]))"]
ENV_KEYS = ("NEBULA_JOB_ID", "NEBULA_JOB_NAME", "NEBULA_USER", "NEBULA_GPU_LIST",
            "CUDA_DEVICE_ORDER", "CUDA_VISIBLE_DEVICES", "NEBULA_GPU_MEM_MB", "PYTHONUNBUFFERED")
PRINT_ENV = [sys.executable, "-S", "-c",
             f"import json,os; print(json.dumps({{k: os.environ.get(k) for k in {ENV_KEYS!r}}}))"]

PLACEMENTS = (  # allocation order on purpose not index order
    Placement("GPU-bbbb", "node01", 3, 8192, False),
    Placement("GPU-aaaa", "node01", 1, 10240, False),
)

# Python runs with -S (no site) to keep each example fast.
# Text a user may type; NUL cannot be in argv, a path or the environment, and a lone
# surrogate (category Cs) is no character a user can type or UTF-8 can carry.
TEXT = st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)),
               max_size=30)
NASTY = st.sampled_from([";", "$(touch pwned)", "`touch pwned`", "'", '"', "\n", "*", "-n",
                         "--", "\\", "$HOME", "~", "a b", "é中🚀", "'\"'\"'", "\\c", "%s"])
HYPO = settings(max_examples=30, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


def make_job(command, *, job_id=7, user="alice", name="train", workdir=None, shell=False):
    spec = JobSpec(command=tuple(command), name=name, gpu_count=len(PLACEMENTS), gpu_mem_mb=8192,
                   workdir=None if workdir is None else str(workdir), shell=shell)
    return Job(id=job_id, user=user, spec=spec, submitted_at=1.0, status=Launching(PLACEMENTS))


def launch(root: Path, job: Job, placements=PLACEMENTS, umask: str | None = None,
           log_max_mb: int | None = None) -> tuple[Path, subprocess.CompletedProcess]:
    """Write run.sh into root/job and run it as the nodelet would (which gives its umask
    as the second word); the job dir is returned."""
    jobdir = root / "job"
    jobdir.mkdir()
    (jobdir / "run.sh").write_text(run_script(job, placements, log_max_mb=log_max_mb))
    home = root / "home"
    home.mkdir(exist_ok=True)
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "LANG": "C.UTF-8"}
    done = subprocess.run(["sh", "run.sh", str(jobdir), *([umask] if umask else [])],
                          cwd=jobdir, env=env, capture_output=True, timeout=30)
    return jobdir, done


def exit_code(jobdir: Path) -> int:
    assert not (jobdir / "exit_code.tmp").exists()
    return int((jobdir / "exit_code").read_text())


def log(jobdir: Path) -> str:
    return (jobdir / "output.log").read_text(encoding="utf-8")


# ------------------------------------------------------------------ examples
def test_environment_log_and_markers(tmp_path):
    jobdir, done = launch(tmp_path, make_job(PRINT_ENV))
    assert done.returncode == 0, done.stderr
    assert (jobdir / "started").exists()
    assert exit_code(jobdir) == 0
    env = json.loads(log(jobdir))
    assert env == {
        "NEBULA_JOB_ID": "7", "NEBULA_JOB_NAME": "train", "NEBULA_USER": "alice",
        "NEBULA_GPU_LIST": "GPU-bbbb,GPU-aaaa",  # allocation order, not sorted
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES": "3,1",  # the placements' gpu_index values, in that order
        "NEBULA_GPU_MEM_MB": "8192",
        "PYTHONUNBUFFERED": "1",
    }
    # Output goes to the pane (tmux) too, not only to the log.
    assert json.loads(done.stdout) == env


def test_no_workdir_runs_in_home(tmp_path):
    jobdir, _ = launch(tmp_path, make_job([sys.executable, "-S", "-c", "import os; print(os.getcwd())"]))
    assert log(jobdir).strip() == str(tmp_path / "home")
    assert exit_code(jobdir) == 0


def test_stderr_is_logged_too(tmp_path):
    job = make_job([sys.executable, "-S", "-c", "import sys; print('out'); print('err', file=sys.stderr)"])
    jobdir, _ = launch(tmp_path, job)
    assert log(jobdir).split() == ["out", "err"]


@pytest.mark.parametrize("code", [0, 1, 3, 42])
def test_exit_code_is_recorded(tmp_path, code):
    jobdir, _ = launch(tmp_path, make_job([sys.executable, "-S", "-c", f"raise SystemExit({code})"]))
    assert exit_code(jobdir) == code


def test_missing_command_is_127(tmp_path):
    jobdir, _ = launch(tmp_path, make_job(["nebula-no-such-program-xyz"]))
    assert exit_code(jobdir) == 127


def test_missing_workdir_fails_at_once_saying_so(tmp_path):
    missing = tmp_path / "gone"
    jobdir, _ = launch(tmp_path, make_job(ECHO_ARGV, workdir=missing))
    assert exit_code(jobdir) == 127
    why = f"--workdir {missing} does not exist on node01 (or {getpass.getuser()} cannot enter it)"
    assert (jobdir / "reason").read_text() == why + "\n"  # the job's reason, for the head
    assert log(jobdir) == f"nebula: {why}\n"  # and the only line of its log: nothing ran
    assert not (jobdir / "started").exists()


def test_shell_command_line(tmp_path):
    job = make_job(["echo one; echo two | tr a-z A-Z; exit 5"], shell=True)
    jobdir, _ = launch(tmp_path, job)
    assert log(jobdir).split() == ["one", "TWO"]
    assert exit_code(jobdir) == 5


def test_a_shell_command_runs_in_a_fresh_shell_and_its_text_on_no_command_line(tmp_path):
    """The text comes as $NEBULA_COMMAND (a node's users read every argv), and is run as
    `sh -c TEXT` ran it: none of the wrapper's functions or variables, nor the variable."""
    job = make_job(['API_KEY=s3cret sh -c \'tr "\\0" " " < /proc/$PPID/cmdline; echo; '
                    'echo "$API_KEY"\'; command -v fail || echo no-wrapper-function; '
                    'echo "job=${job:-} jobdir=${jobdir:-} command=${NEBULA_COMMAND:-}"'], shell=True)
    jobdir, _ = launch(tmp_path, job)
    shell_argv, *out = log(jobdir).splitlines()
    assert shell_argv.startswith("sh -c ") and "s3cret" not in shell_argv, shell_argv
    assert out == ["s3cret", "no-wrapper-function", "job= jobdir= command="]
    assert exit_code(jobdir) == 0


def test_the_command_gets_the_umask_the_nodelet_gives(tmp_path):
    (tmp_path / "given").mkdir()
    jobdir, _ = launch(tmp_path / "given", make_job(["sh", "-c", "umask"]), umask="0027")
    assert log(jobdir) == "0027\n"
    # the marks stay the login account's alone whatever the job's umask
    assert (jobdir / "exit_code").stat().st_mode & 0o077 == 0
    # an older nodelet gives none: the wrapper asks its own shell
    (tmp_path / "asked").mkdir()
    jobdir, _ = launch(tmp_path / "asked", make_job(["sh", "-c", "umask"]))
    assert log(jobdir) == "%04o\n" % current_umask()


def current_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def test_the_log_stops_at_its_cap_and_the_job_runs_on(tmp_path):
    """limits.log_max: the log holds exactly the cap, tee says why in log_cut (for the
    nodelet's closing line), and the job writes on to its end (its terminal gets all of it)
    instead of dying of a closed pipe."""
    writes = "head -c 3000000 /dev/zero | tr '\\0' x; echo; echo written-after-the-cap"
    jobdir, done = launch(tmp_path, make_job([writes], shell=True), log_max_mb=1)
    assert exit_code(jobdir) == 0, done.stderr
    assert (jobdir / "output.log").stat().st_size == 1 << 20
    assert "too large" in (jobdir / "log_cut").read_text().lower()
    assert done.stdout.count(b"x") == 3000000 and b"written-after-the-cap" in done.stdout


def test_a_log_under_its_cap_is_whole(tmp_path):
    jobdir, _ = launch(tmp_path, make_job(["seq", "1", "1000"]), log_max_mb=1)
    assert log(jobdir) == "".join(f"{i}\n" for i in range(1, 1001))
    assert (jobdir / "log_cut").read_text().strip() == ""  # only the room kept for a reason


def test_log_is_truncated_on_rerun(tmp_path):
    # A relaunch of the same job dir (after a head restart) starts a fresh log.
    jobdir, _ = launch(tmp_path, make_job([sys.executable, "-S", "-c", "print('second run')"]))
    (jobdir / "output.log").write_text("stale output\n")
    subprocess.run(["sh", "run.sh", str(jobdir)], cwd=jobdir, capture_output=True, timeout=30,
                   env={"PATH": os.environ["PATH"], "HOME": str(tmp_path)})
    assert log(jobdir) == "second run\n"


def test_user_name_cannot_inject_code(tmp_path):
    job = make_job(ECHO_ARGV + ["ok"], user="eve\ntouch pwned #")
    jobdir, _ = launch(tmp_path, job)
    assert not list(tmp_path.rglob("pwned"))
    assert json.loads(log(jobdir)) == ["ok"]


def test_missing_workdir_message_is_literal(tmp_path):
    missing = tmp_path / "run\\c-v2"
    jobdir, _ = launch(tmp_path, make_job(ECHO_ARGV, workdir=missing))
    assert exit_code(jobdir) == 127
    assert f"--workdir {missing} does not exist" in (jobdir / "reason").read_text()


# ------------------------------------------------------------------ properties
@HYPO
@given(args=st.lists(st.one_of(TEXT, NASTY), max_size=6))
def test_arguments_arrive_literally(args):
    with tempfile.TemporaryDirectory() as root:
        jobdir, _ = launch(Path(root), make_job(ECHO_ARGV + args))
        assert json.loads(log(jobdir)) == args
        assert exit_code(jobdir) == 0
        assert not list(Path(root).rglob("pwned"))


dir_names = st.one_of(TEXT, NASTY).filter(
    lambda s: s not in ("", ".", "..") and "/" not in s and len(s.encode()) < 200)


@HYPO
@given(name=dir_names)
def test_workdir_is_entered_literally(name):
    with tempfile.TemporaryDirectory() as root:
        workdir = Path(root) / name
        workdir.mkdir()
        job = make_job([sys.executable, "-S", "-c", "import json,os; print(json.dumps(os.getcwd()))"],
                       workdir=workdir)
        jobdir, _ = launch(Path(root), job)
        assert exit_code(jobdir) == 0
        assert json.loads(log(jobdir)) == str(workdir)


@HYPO
@given(name=st.one_of(TEXT, NASTY))
def test_any_job_name_is_passed_through(name):
    with tempfile.TemporaryDirectory() as root:
        job = make_job(PRINT_ENV, name=name)
        jobdir, _ = launch(Path(root), job)
        assert exit_code(jobdir) == 0
        assert json.loads(log(jobdir))["NEBULA_JOB_NAME"] == name
        assert not list(Path(root).rglob("pwned"))


def test_an_argv_command_is_execed_by_the_wrapper_with_no_shell_started_for_it(tmp_path):
    """A command given as argv is one `exec` of quoted words: the wrapper's subshell execs it
    itself (a process start less for every job), with the environment a fresh shell would
    have given it (the job's variables, not $NEBULA_COMMAND nor the wrapper's own)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    starts = tmp_path / "sh-starts"
    real_sh = shutil.which("sh")
    (bin_dir / "sh").write_text(f"#!{real_sh}\nprintf '%s\\n' \"$*\" >> {starts}\n"
                                f"exec {real_sh} \"$@\"\n")
    (bin_dir / "sh").chmod(0o755)
    keys = (*ENV_KEYS, "NEBULA_COMMAND", "jobdir", "job", "facts")
    show = [sys.executable, "-S", "-c",
            f"import json,os; print(json.dumps({{k: os.environ.get(k) for k in {keys!r}}}))"]
    path = os.environ["PATH"]
    os.environ["PATH"] = f"{bin_dir}:{path}"
    try:
        jobdir, done = launch(tmp_path, make_job(show))
    finally:
        os.environ["PATH"] = path
    assert done.returncode == 0, done.stderr
    env = json.loads(log(jobdir))
    assert env["NEBULA_JOB_ID"] == "7" and env["CUDA_VISIBLE_DEVICES"] == "3,1"
    assert [env[k] for k in ("NEBULA_COMMAND", "jobdir", "job", "facts")] == [None] * 4
    assert exit_code(jobdir) == 0
    # the wrapper itself (started as `sh run.sh`) is the one shell: no `sh -c` for the job
    assert [line for line in starts.read_text().splitlines() if line.startswith("-c")] == []
