"""A Slurm user at home: their flags, durations and ``#SBATCH`` scripts mean here what they
meant to sbatch, and ``nebula run`` acts as srun — the real CLI against a real head on the
simulated lab's sshd nodes."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

from labkit.harness import wait_for
from support.head import log, submit, submitted_id


def _job(head, job: int) -> dict:
    return json.loads(head.run("job", "--json", str(job), check=True).stdout)


def test_time_90_is_ninety_minutes_and_is_said_so(head):
    """`--time 90` was 90 seconds; sbatch reads 90 minutes. The reply and `nebula job` say
    what was understood."""
    done = head.run("submit", "--time", "90", "--gpu-mem", "4G", "--", "sleep", "1", check=True)
    assert "(time limit 1 h 30 min)" in done.stdout, done.stdout
    job = submitted_id(done.stdout)
    assert _job(head, job)["time_limit_s"] == 5400
    assert "  limit:     1 h 30 min" in head.run("job", str(job), check=True).stdout
    job = submit(head, "--time", "1-2:03:04", "--gpu-mem", "4G", "--", "true")
    assert _job(head, job)["time_limit_s"] == 93784


def test_an_sbatch_script_runs_unchanged_with_its_directives_and_the_flags_winning(head, tmp_path):
    """`nebula submit -G 1 -t 90 train.sh` with `#SBATCH --job-name`/`--output=%x-%j.out`
    inside: the script's lines are read, the command line wins, and the output lands in
    the file sbatch would have written."""
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/sh\n#SBATCH --job-name=train\n#SBATCH --output=%x-%j.out\n"
                      "#SBATCH -t 30 --mem-per-gpu=4G\n#SBATCH --cpus-per-task=4\n\n"
                      'echo "args: $*"\necho "to stderr" >&2\n')
    done = head.run("submit", "-G", "1", "-t", "90", "train.sh", "a", "b c", cwd=tmp_path, check=True)
    assert "(time limit 1 h 30 min)" in done.stdout, done.stdout
    assert done.stderr == ("nebula submit: --cpus-per-task=4 is Slurm's and not honoured here (a job "
                           "gets its node's CPUs, shared); ignored\n"), done.stderr
    job = submitted_id(done.stdout)
    info = _job(head, job)
    assert (info["name"], info["time_limit_s"], info["gpu_count"], info["gpu_mem_mb"]) == (
        "train", 5400, 1, 4096)
    assert info["output"] == str(tmp_path / f"train-{job}.out") == info["error"]
    ended = json.loads(head.run("wait", "--json", str(job), timeout=120).stdout)
    assert ended["state"] == "succeeded", ended
    assert (tmp_path / f"train-{job}.out").read_text() == "args: a b c\nto stderr\n"


def test_a_pattern_sbatch_fills_and_we_do_not_is_refused(head):
    done = head.run("submit", "-o", "out-%N.txt", "--", "true")
    assert done.returncode == 2 and "%N is not a pattern NebulaGrid fills" in done.stderr, done.stderr


def test_run_streams_the_output_and_exits_with_the_commands_code(head):
    """`nebula run` printed only "Submitted … succeeded"; srun users expect the output and
    the exit code as theirs."""
    done = head.run("run", "--gpu-mem", "4G", "--", "python3", "-c", "print(1); exit(3)", timeout=120)
    assert done.returncode == 3, (done.stdout, done.stderr)
    assert done.stdout.splitlines()[-1:] == ["1"], done.stdout
    assert "Waiting: waiting" not in done.stderr and "exit code 3" in done.stderr, done.stderr
    job = int(done.stderr.split()[2])
    assert "1\n" in log(head, job)  # the log has it too
    ok = head.run("srun", "--gpu-mem", "4G", "--", "sh", "-c", "echo one; sleep 1; echo two", timeout=120)
    assert ok.returncode == 0 and ok.stdout.splitlines()[-2:] == ["one", "two"], ok
    assert "succeeded" not in ok.stderr  # as srun: quiet when all went well


def test_ctrl_c_on_run_cancels_the_job(head):
    proc = subprocess.Popen([sys.executable, "-m", "nebula_tui", "run", "--gpu-mem", "4G", "--",
                             "sh", "-c", "echo started; sleep 300"], env=head.env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "started\n"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    job = int(err.split()[2])
    assert f"cancelled job {job}" in err
    ended = json.loads(head.run("wait", "--json", str(job), timeout=60).stdout)
    assert ended["state"] == "cancelled"


def test_sbatch_parsable_squeue_and_scancel_speak_slurm(head):
    job = head.run("sbatch", "--parsable", "--mem-per-gpu=4G", "--wrap", "sleep 60", check=True).stdout
    assert job.strip().isdigit() and job.endswith("\n") and job.count("\n") == 1, job
    job = job.strip()
    said = head.run("sbatch", "--mem-per-gpu=4G", "-d", f"afterok:{job}", "--wrap", "true", check=True).stdout
    assert said.startswith("Submitted batch job "), said
    second = said.split()[-1]
    lines = wait_for(lambda: (out := head.run("squeue", "-h", "-o", "%i %T", check=True).stdout.splitlines())
                     and f"{job} RUNNING" in out and out, 60, what="the first job running")
    assert f"{second} PENDING" in lines, lines
    table = head.run("squeue", "-j", job, check=True).stdout.splitlines()
    assert table[0].split() == ["JOBID", "PARTITION", "NAME", "USER", "ST", "TIME", "NODES",
                                "NODELIST(REASON)"] and table[1].split()[0] == job, table
    assert _job(head, int(second))["after_type"] == "ok"
    head.run("scancel", job, second, check=True)


def test_job_and_queue_print_commands_quoted(head):
    job = submit(head, "--gpu-mem", "4G", "--", "sh", "-c", "for i in 1 2; do sleep 30; done")
    shown = "sh -c 'for i in 1 2; do sleep 30; done'"
    assert f"  command:   {shown}" in head.run("job", str(job), check=True).stdout
    wait_for(lambda: shown in head.run("queue", check=True).stdout, 30, what="the quoted command")
    head.run("cancel", str(job), check=True)


def test_nodelist_exclude_and_export_are_honoured(head):
    """-w/-x and --export were said to be ignored; now the job runs where they say, with the
    variable set (quoted: the value reaches the node's shell), and `nebula job` shows them."""
    value = "two words; $HOME 'q'"
    job = submit(head, "-w", "node0[2-3]", "-x", "node02", "--export", f"ALL,MY_SETTING={value}",
                 "--gpu-mem", "4G", "--", "sh", "-c", 'echo "$MY_SETTING"')
    done = head.wait_job(job, 60)
    assert done["state"] == "succeeded", done["reason"]
    info = _job(head, job)
    assert {g["node"] for g in info["gpus"]} == {"node03"}, info["gpus"]
    assert (info["nodelist"], info["exclude"]) == (["node02", "node03"], ["node02"])
    assert log(head, job).splitlines()[-1:] == [value]
    text = head.run("job", str(job), check=True).stdout
    assert "  nodelist:  node02,node03" in text and "  exclude:   node02" in text, text
    assert f"MY_SETTING={value}" in text  # the environment its node gave it
    for _ in range(2):  # elsewhere too: never on an excluded node
        other = submit(head, "-x", "node01,node03", "--gpu-mem", "4G", "--", "true")
        assert head.wait_job(other, 60)["state"] == "succeeded"
        assert {g["node"] for g in _job(head, other)["gpus"]} == {"node02"}


def test_a_nodelist_naming_no_node_of_the_lab_is_refused(head):
    done = head.run("submit", "-w", "node01,node99", "--", "true")
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "node99 is no node of this lab" in done.stderr, done.stderr
    done = head.run("submit", "--export", "NEBULA_JOB_ID=3", "--", "true")
    assert done.returncode == 2 and "NEBULA_JOB_ID" in done.stderr, done.stderr
