"""The words a person reads say each thing once and say what to do: a doctor's warnings
counted, an end not saying its state twice, one verb for every cancel, the submit form's
"Would wait for …", and the keys that leave a job's session from inside one's own tmux.

The head is the real ``Engine`` on a real socket in the test's loop (``inprocess``); the CLI
is the real program in a subprocess.
"""

from __future__ import annotations

import asyncio
import getpass
import sys


from nebula_tui.client.attach import detach_keys
from nebula_tui.model import JobSpec, Placement
from nebula_tui.remote.protocol import Exit
from nebula_tui.screens.submit import plan_text
from nebula_tui.cli.text import doctor_text

ME = getpass.getuser()


def test_a_doctor_with_warnings_does_not_say_every_check_passed_and_stop():
    checks = [{"check": "ssh", "status": "ok", "text": "fine"},
              {"check": "clock", "status": "warn", "text": "3 s off", "fix": "run chrony"},
              {"check": "disk", "status": "warn", "text": "9 % free", "fix": "clean up"}]
    assert doctor_text({"nodes": {"node01": checks}}).splitlines()[-1] == "Every check passed with 2 warnings"
    failed = [*checks, {"check": "tmux", "status": "fail", "text": "missing", "fix": "apt install tmux"}]
    assert doctor_text({"nodes": {"node01": failed}}).splitlines()[-1] == "1 check failed, 2 warnings"
    assert doctor_text({"nodes": {"node01": checks[:1]}}).splitlines()[-1] == "Every check passed"


def test_the_submit_preview_reads_would_wait_for_its_booking():
    said = plan_text({"decision": "wait", "reason": "waits for its booking: node03:0 booked for paper "
                                                   "from Fri 09:00"}).plain
    assert said == "Would wait for its booking: node03:0 booked for paper from Fri 09:00"
    assert plan_text({"decision": "wait", "reason": "no GPU has 80 GB free"}).plain == \
        "Would wait: no GPU has 80 GB free"


def test_attaching_inside_ones_own_tmux_says_the_keys():
    assert "Ctrl-b Ctrl-b d" in detach_keys({"TMUX": "/tmp/tmux-1000/default,1234,0"})
    assert "Ctrl-b d" in detach_keys({}) and "Ctrl-b Ctrl-b" not in detach_keys({})


async def nebula(socket, *args: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "nebula_tui", "--socket", str(socket), *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(process.communicate(), 60)
    return process.returncode, out.decode(), err.decode()


async def test_a_cancel_says_cancelled_once_and_its_end_names_who(engine, served):
    job = engine.submit(ME, JobSpec(command=("sleep", "600")))
    engine.transitions.begin_launch(engine.jobs[job.id], (Placement("GPU-node01-0", "node01", 0, 81920, True),))
    engine.transitions.mark_running(engine.jobs[job.id])
    code, out, err = await nebula(served, "cancel", str(job.id))
    assert code == 0 and out.startswith(f"Cancelled job {job.id}"), (out, err)  # not "Cancelling"
    engine.transitions.on_exit("node01", Exit(job.id, engine.state.token(engine.jobs[job.id]), 143))
    ends = [e["message"] for e in engine.state.store.events(20) if e["kind"] == "end"]
    assert ends == [f"job {job.id} cancelled by {ME} with exit code 143"], ends
