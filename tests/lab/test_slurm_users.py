"""A Slurm user at home: their flags, durations and ``#SBATCH`` scripts mean here what they
meant to sbatch, and ``nebula run`` acts as srun — the real CLI against a real head on the
simulated lab's sshd nodes."""

from __future__ import annotations

import json

from support import submit


def _job(head, job: int) -> dict:
    return json.loads(head.run("job", "--json", str(job), check=True).stdout)


def test_time_90_is_ninety_minutes_and_is_said_so(head):
    """`--time 90` was 90 seconds; sbatch reads 90 minutes. The reply and `nebula job` say
    what was understood."""
    done = head.run("submit", "--time", "90", "--gpu-mem", "4G", "--", "sleep", "1", check=True)
    assert "(time limit 1 h 30 min)" in done.stdout, done.stdout
    job = int(done.stdout.split()[2])
    assert _job(head, job)["time_limit_s"] == 5400
    assert "  limit:     1 h 30 min" in head.run("job", str(job), check=True).stdout
    job = submit(head, "--time", "1-2:03:04", "--gpu-mem", "4G", "--", "true")
    assert _job(head, job)["time_limit_s"] == 93784
