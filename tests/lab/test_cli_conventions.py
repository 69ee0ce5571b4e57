"""The CLI's habits, through the real program against a real head: ``--json`` everywhere,
quiet in pipes that close early, one-line errors that point at the right ``--help`` and
guess the typo, filters, tables that never cut a word, and shell completion loaded in real
bash and zsh."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from labkit.harness import wait_for
from nebula_tui.cli import build_parser
from support.head import submit

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def jobs(head):
    """One long-running job with a long name on a gang of two cards, one ended job with 100
    lines of output, one waiting job (the gang holds two of node02's four A100s, so four
    cards of 70 GB cannot be had, whatever state the lab's other cards are in)."""
    running = submit(head, "--name", "a-rather-long-name-nobody-should-cut", "--gpu-count", "2",
                     "--arch", "sm_80", "--", "sleep", "600")
    ended = submit(head, "--gpu-mem", "4G", "--", "seq", "1", "100")
    head.wait_job(ended)
    waiting = submit(head, "--gpu-count", "4", "--gpu-mem", "70G", "--", "true")
    wait_for(lambda: head.job(running)["state"] == "running", 30, what="the gang to run")
    yield {"running": running, "ended": ended, "waiting": waiting}
    for job in (running, waiting):
        head.run("cancel", str(job))


def _printing_commands(jobs) -> list[list[str]]:
    return [["status"], ["queue"], ["queue", "--all"], ["gpus"], ["users"], ["events"],
            ["history"], ["report"], ["report", "--csv", "users"], ["node", "show", "node01"],
            ["job", str(jobs["ended"])],
            ["logs", str(jobs["ended"])], ["gpu", "history", "node01:0", "--since", "1d"],
            ["completion", "bash"], ["--help"], ["queue", "--help"], ["--version"]]


# ------------------------------------------------------------------------------- pipes
@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_a_pipe_closed_before_the_first_line_ends_every_command_quietly(head, jobs, as_json):
    """Like ``nebula queue | head -0``: the reading end is gone before anything is written,
    so the very first write fails. No traceback, no BrokenPipeError, the SIGPIPE exit code."""
    for argv in _printing_commands(jobs):
        if as_json and (argv[0] in ("logs", "completion") or argv[-1].startswith("--")):
            continue  # these print no JSON
        argv = argv + ["--json"] if as_json else argv
        read_end, write_end = os.pipe()
        os.close(read_end)
        try:
            done = subprocess.run([sys.executable, "-m", "nebula_tui", *argv], env=head.env,
                                  stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=60)
        finally:
            os.close(write_end)
        assert "Traceback" not in done.stderr and "Error" not in done.stderr, (argv, done.stderr)
        assert done.stderr == "", (argv, done.stderr)
        assert done.returncode == 141, (argv, done.returncode)


def test_head_reads_three_lines_of_a_job_and_nothing_complains(head, jobs):
    """The pipelines of the bug report, in a real shell: `job N --json | head -3` shows the
    job's first lines; a reader gone at once (`| head -0`) makes the write fail, quietly."""
    nebula = f"{sys.executable} -m nebula_tui"
    script = (f"{nebula} job {jobs['ended']} --json | head -3; "
              f"{nebula} queue --json | head -0; echo queue=${{PIPESTATUS[0]}}; "
              f"{nebula} completion zsh | head -0; echo completion=${{PIPESTATUS[0]}}")
    done = subprocess.run(["bash", "-c", script], env=head.env, capture_output=True, text=True,
                          timeout=120)
    assert done.stderr == ""
    lines = done.stdout.splitlines()
    assert lines[:3] == ["{", f'  "id": {jobs["ended"]},', '  "user": "root",']
    assert lines[3] in ("queue=141", "queue=0") and lines[4] in ("completion=141", "completion=0")


# ------------------------------------------------------------------------------ errors
def test_a_mistyped_command_gets_a_suggestion(head):
    done = head.run("statsu")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == "nebula: unknown command 'statsu' (did you mean 'status'?) (see `nebula --help`)\n"
    nested = head.run("node", "drian", "node01")
    assert nested.returncode == 2
    assert "unknown command 'drian' (did you mean 'drain'?)" in nested.stderr
    assert "`nebula node --help`" in nested.stderr
    # Names the service knows: a node, a GPU.
    node = head.run("node", "show", "node1")
    assert node.returncode == 1
    assert node.stderr == "nebula: no node node1 (did you mean 'node01'?); known: node01, node02, node03\n"
    gpu = head.run("gpu", "history", "nod02:1")
    assert gpu.returncode == 1 and "no GPU nod02:1 (did you mean 'node02:1'?)" in gpu.stderr


def test_a_flag_error_names_the_commands_own_help(head):
    done = head.run("queue", "--jsn")
    assert done.returncode == 2
    assert done.stderr == ("nebula queue: unrecognized arguments: --jsn (did you mean '--json'?) "
                           "(see `nebula queue --help`)\n")
    state = head.run("queue", "--state", "runing")
    assert "did you mean 'running'?" in state.stderr and "`nebula queue --help`" in state.stderr
    forgot = head.run("submit", "python", "train.py")
    assert "the command to run goes after `--`" in forgot.stderr
    assert forgot.stderr.count("\n") == 1
    for bad in ("0", "²"):  # no job has these ids: a usage error here, not the service's refusal
        job = head.run("events", "--job", bad)
        assert job.returncode == 2 and "is not a job id" in job.stderr
        assert "`nebula events --help`" in job.stderr
    for argv in (["events", "--limit", "²"], ["sim", "inject", "xid", "²", "--node", "node01", "--gpu", "0"]):
        number = head.run(*argv)  # a digit to str.isdigit, not to int()
        assert number.returncode == 2 and number.stderr.count("\n") == 1 and "'²'" in number.stderr


def test_a_refusal_says_the_jobs_state_in_words(head, jobs):
    ended = jobs["ended"]
    hold = head.run("hold", str(ended))
    assert hold.stderr == f"nebula: job {ended} has succeeded; only waiting jobs can be held\n"
    cancel = head.run("cancel", str(ended))
    assert cancel.stderr == f"nebula: job {ended} has already ended: it has succeeded\n"
    requeue = head.run("requeue", str(jobs["waiting"]))
    assert requeue.stderr.startswith(f"nebula: job {jobs['waiting']} is waiting; only a launching")


def test_version(head):
    done = head.run("--version")
    assert done.returncode == 0 and done.stdout.startswith("nebula ") and done.stdout.split()[1][0].isdigit()


# -------------------------------------------------------------------------------- json
def test_every_command_that_prints_data_takes_json(head, jobs):
    """Walk the parser: each command is either known not to print data or has --json, and
    the JSON of each is what docs/reference.md documents at its top level."""
    no_data = {"attach", "run", "srun", "logs", "parse", "serve", "demo", "tui", "completion", "sim",
               "node", "gpu", "pool"}
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for name, command in sub.choices.items():
        flags = {s for a in command._actions for s in a.option_strings}
        assert name in no_data or "--json" in flags, name
    for nested in ("node", "gpu", "pool"):
        commands = next(a for a in sub.choices[nested]._actions if a.dest.endswith("_command"))
        for name, command in commands.choices.items():
            assert "--json" in {s for a in command._actions for s in a.option_strings}, (nested, name)

    def as_json(*argv):
        cut = argv.index("--") if "--" in argv else len(argv)  # flags before the job's command
        return json.loads(head.run(*argv[:cut], "--json", *argv[cut:], check=True).stdout)

    assert isinstance(as_json("status")["node_details"], list)
    assert {j["id"] for j in as_json("queue")} >= {jobs["running"], jobs["waiting"]}
    assert len(as_json("gpus")) == 9
    assert any(u["name"] == "root" for u in as_json("users"))
    submits = as_json("events", "--kind", "submit", "--limit", "1000")
    assert submits and {e["kind"] for e in submits} == {"submit"}
    assert as_json("job", str(jobs["ended"]))["state"] == "succeeded"
    assert as_json("wait", str(jobs["ended"]))["exit_code"] == 0
    submitted = as_json("submit", "--gpu-mem", "4G", "--", "true")
    assert submitted["state"] == "pending" and submitted["command"] == ["true"]
    held = as_json("hold", str(jobs["waiting"]))
    assert held["held"] is True and as_json("release", str(jobs["waiting"]))["held"] is False
    ended = json.loads(head.run("submit", "--gpu-mem", "4G", "--wait", "--json", "--", "sh", "-c",
                                "exit 3").stdout)
    assert ended["state"] == "failed" and ended["exit_code"] == 3


# --------------------------------------------------------------------- filters, tables
def test_events_of_a_user_are_theirs_and_their_jobs_and_a_kind_is_checked(head, jobs):
    def events(*argv: str) -> list[dict]:
        return json.loads(head.run("events", "--json", "--limit", "1000", *argv, check=True).stdout)

    ended = str(jobs["ended"])
    # A job's placement and start name no user: they are still the owner's.
    assert {e["kind"] for e in events("--job", ended)} >= {"submit", "place", "start", "end"}
    assert [e["message"] for e in events("--user", "root", "--job", ended)] == \
        [e["message"] for e in events("--job", ended)]
    assert events("--user", "nobody-here") == []
    placed = events("--kind", "place", "--user", "root")
    assert placed and all(e["kind"] == "place" and e["user"] is None for e in placed)
    typo = head.run("events", "--kind", "started")
    assert typo.returncode == 2 and typo.stderr.count("\n") == 1
    assert "did you mean 'start'?" in typo.stderr and "`nebula events --help`" in typo.stderr
    unknown = head.run("events", "--kind", "oops")
    assert unknown.returncode == 2 and "choose from submit, hold, cancel" in unknown.stderr


def test_queue_filters_by_user_and_state(head, jobs):
    running = head.run("queue", "--state", "running", "--json", check=True).stdout
    assert {j["state"] for j in json.loads(running)} == {"running"}
    waiting = json.loads(head.run("queue", "--state", "pending,running", "--user", "root", "--json",
                                  check=True).stdout)
    assert {j["id"] for j in waiting} >= {jobs["running"], jobs["waiting"]}
    assert json.loads(head.run("queue", "--user", "nobody-here", "--json", check=True).stdout) == []


def test_queue_text_never_cuts_a_word(head, jobs):
    text = head.run("queue", check=True).stdout
    job = head.job(jobs["running"])
    row = next(line for line in text.splitlines() if line.split()[0] == str(jobs["running"]))
    cards = " ".join(f"{g['node']}:{g['index']}" for g in job["gpus"])
    node = job["gpus"][0]["node"]
    indices = ",".join(str(g["index"]) for g in job["gpus"])
    assert "a-rather-long-name-nobody-should-cut" in row.split(), row
    assert f"{node}:{indices}" in row.split(), (row, cards)
    header = text.splitlines()[0].split()
    assert header[:5] == ["ID", "USER", "NAME", "STATE", "GPUS"]


def test_gpus_is_a_table_with_temperature_and_utilisation(head, jobs):
    lines = head.run("gpus", check=True).stdout.splitlines()
    assert lines[0].split() == ["GPU", "MODEL", "MEMORY", "UTIL", "TEMP", "POWER", "STATUS", "JOBS"]
    assert len(lines) == 10
    gpus = {f"{g['node']}:{g['index']}": g for g in json.loads(head.run("gpus", "--json").stdout)}
    busy = [line for line in lines[1:] if str(jobs["running"]) in line.split()[-1].split(",")]
    assert len(busy) == 2
    for line in busy:
        gpu = gpus[line.split()[0]]
        assert f"{gpu['temperature_c']:.0f}C" in line.split() and line.split()[-2] == "busy"
        assert any(cell.endswith("%") for cell in line.split())


def test_logs_tail(head, jobs):
    assert head.run("logs", str(jobs["ended"]), "--tail", "3", check=True).stdout == "98\n99\n100\n"
    assert head.run("logs", str(jobs["ended"]), "-n", "200", check=True).stdout.count("\n") == 100


# --------------------------------------------------------------------------- completion
def test_dynamic_words_come_from_the_service_and_are_silent_without_one(head, jobs, tmp_path):
    done = head.run("__complete", "jobs", check=True)
    assert str(jobs["running"]) in done.stdout.split() and done.stderr == ""
    assert head.run("__complete", "nodes", check=True).stdout.split() == ["node01", "node02", "node03"]
    stale = tmp_path / "stale.sock"  # a socket file nobody listens on, and none at all
    import socket as socket_module
    with socket_module.socket(socket_module.AF_UNIX) as s:
        s.bind(str(stale))
    for socket_path in (stale, tmp_path / "missing.sock"):
        env = {**head.env, "NEBULA_SOCKET": str(socket_path)}
        quiet = subprocess.run([sys.executable, "-m", "nebula_tui", "__complete", "jobs"], env=env,
                               capture_output=True, text=True, timeout=30)
        assert (quiet.returncode, quiet.stdout, quiet.stderr) == (0, "", "")
        assert not (tmp_path / "nebula.sock").exists()  # and no service was started


class Terminal:
    """An interactive shell in a tmux of our own: type, press Tab, read the screen."""

    def __init__(self, tmp_path: Path, argv: list[str], env: dict, prompt: str):
        self.tmux = ["tmux", "-S", str(tmp_path / "tmux.sock"), "-f", "/dev/null"]
        self.prompt = prompt
        subprocess.run(self.tmux + ["new-session", "-d", "-x", "150", "-y", "40",
                                    " ".join(argv) + "; sleep 30"], env=env, check=True)
        wait_for(lambda: self.screen().lstrip().startswith(prompt), 60, interval=0.2,
                 what=f"{argv[0]}'s prompt")

    def screen(self) -> str:
        return subprocess.run(self.tmux + ["capture-pane", "-p"], capture_output=True,
                              text=True).stdout

    def lines(self) -> list[str]:
        """The screen's lines, without the blanks tmux trims at their ends anyway."""
        return [line.rstrip() for line in self.screen().splitlines()]

    def tab(self, typed: str, presses: int = 1) -> None:
        subprocess.run(self.tmux + ["send-keys", "C-u", typed] + ["Tab"] * presses, check=True)

    def close(self) -> None:
        subprocess.run(self.tmux + ["kill-server"], capture_output=True)


def _completion_env(head, tmp_path: Path, shell: str) -> tuple[dict, Path]:
    """PATH with a `nebula` of this checkout; the script made by the real CLI."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    launcher = bin_dir / "nebula"
    launcher.write_text(f"#!/bin/sh\nexec {sys.executable} -m nebula_tui \"$@\"\n")
    launcher.chmod(0o755)
    script = tmp_path / f"nebula.{shell}"
    script.write_text(head.run("completion", shell, check=True).stdout)
    env = {**head.env, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(REPO),
           "TERM": "xterm", "HOME": str(tmp_path)}
    return env, script


@pytest.mark.skipif(not shutil.which("tmux"), reason="needs tmux")
def test_bash_completes_commands_flags_job_ids_and_nodes(head, jobs, tmp_path):
    env, script = _completion_env(head, tmp_path, "bash")
    rc = tmp_path / "bashrc"
    rc.write_text(f"PS1='$ '\nsource {script}\n")
    term = Terminal(tmp_path, ["bash", "--noprofile", "--rcfile", str(rc), "-i"], env, "$")
    try:
        term.tab("nebula sta")
        wait_for(lambda: "$ nebula status" in term.lines(), 30, interval=0.2, what="status completed")
        term.tab("nebula queue --js")
        wait_for(lambda: "$ nebula queue --json" in term.lines(), 30, interval=0.2, what="--json")
        term.tab("nebula node drain node0", presses=2)
        wait_for(lambda: {"node01", "node02", "node03"} <= set(term.screen().split()), 30,
                 interval=0.2, what="node names listed")
        term.tab("nebula cancel ", presses=2)
        wait_for(lambda: str(jobs["running"]) in term.screen().split(), 30, interval=0.2,
                 what="job ids offered")
    finally:
        term.close()


@pytest.mark.skipif(not shutil.which("zsh") or not shutil.which("tmux"),
                    reason="needs zsh and tmux (scripts/test-deps.sh installs them as root)")
def test_zsh_completes_commands_and_job_ids(head, jobs, tmp_path):
    env, script = _completion_env(head, tmp_path, "zsh")
    functions = tmp_path / "zfunc"  # installed as zsh wants it: a file _nebula on $fpath
    functions.mkdir()
    script.rename(functions / "_nebula")
    (tmp_path / ".zshrc").write_text(
        f"fpath=({functions} $fpath)\nautoload -U compinit && compinit -u\nPROMPT='%% '\n")
    env["ZDOTDIR"] = str(tmp_path)
    term = Terminal(tmp_path, ["zsh", "-i"], env, "%")
    newer = None
    try:
        term.tab("nebula sta")
        wait_for(lambda: "% nebula status" in term.lines(), 30, interval=0.2, what="status completed")
        # Asked at each Tab, not when the script was loaded: a job newer than the shell.
        newer = submit(head, "--gpu-mem", "4G", "--", "sleep", "600")
        term.tab("nebula cancel ")
        wait_for(lambda: {str(jobs["running"]), str(newer)} <= set(term.screen().split()), 30,
                 interval=0.2, what="job ids offered")
    finally:
        term.close()
        if newer:
            head.run("cancel", str(newer))
