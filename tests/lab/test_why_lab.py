"""`nebula why` and the queue's forecast through the whole system, on real sshd nodes."""

from __future__ import annotations

import json

from labkit.harness import wait_for
from support.head import submit


def test_why_names_the_dependency_and_the_queue_forecasts_the_start(head, tmp_path):
    go = tmp_path / "go"
    first = submit(head, "--gpu-mem", "4G", "--time", "30", "--", "sh", "-c",
                   f"while [ ! -e {go} ]; do sleep 0.1; done")
    second = submit(head, "--gpu-mem", "4G", "--after", str(first), "--time", "10", "--", "true")
    try:
        wait_for(lambda: head.job(second)["reason"], 10, what="a reason")
        answer = json.loads(head.run("why", str(second), "--json", check=True).stdout)
        assert answer["rule"] == "dependency" and answer["state"] == "pending"
        assert answer["starts"]["start_at"] is not None
        text = head.run("why", str(second), check=True).stdout
        assert f"Job {second} " in text and "Held by: a dependency (--after)" in text
        assert "fair share: weight" in text
        # the queue carries the head's forecast once one was made (the first pass makes one)
        starts = wait_for(lambda: next(j for j in json.loads(head.run("queue", "--json", check=True).stdout)
                                       if j["id"] == second)["starts"], 15, what="a forecast")
        assert starts["early"] <= starts["start_at"] <= starts["late"]
        assert "STARTS" in head.run("queue", check=True).stdout.splitlines()[0]
        user = head.run("why", "--user", answer["user"], check=True).stdout
        assert f"{answer['user']}'s fair share" in user
        bad = head.run("why")
        assert bad.returncode == 2 and "name a job" in bad.stderr and "Traceback" not in bad.stderr
    finally:
        go.touch()
    assert head.wait_job(first)["state"] == "succeeded"
