"""The queue keeps its promises, end to end on the simulated lab (real sshd, tmux, SQLite):
time limits, the memory guard, idle cards, refusal at submit, arrays and their throttle,
--after kinds and requeue (issue 14).

The lab's jobs hold what their environment says: ``NEBULA_SIM_GPU_MEM=45G`` makes a job
hold 45 GB whatever it reserved, ``NEBULA_SIM_GPU_UTIL=0`` keeps its card idle.
"""

from __future__ import annotations

import contextlib
import json
import time

import pytest

from labkit.harness import wait_for
from support.labfixtures import lab_config, serving
from nebula_tui.model import JobState
from nebula_tui.sim import faults
from nebula_tui.store import Store
from support.head import running, submit

GRACE_S = 3


@pytest.fixture(scope="module")
def head(openssh_lab, tmp_path_factory):
    """A head whose limits act within seconds: SIGKILL 3 s after SIGUSR1, the guard's
    grace 3 s, idle after 4 s and cancelled 4 s after the warning, at most 1 h of --time."""
    path = lab_config(openssh_lab, "limits", health={"isolation_grace": f"{GRACE_S}s"},
                      limits={"memory_overuse": "kill", "memory_grace": "3s", "idle_after": "4s",
                              "idle_action": "cancel", "idle_grace": "4s", "max_time": "1h"})
    yield from serving(openssh_lab, tmp_path_factory.mktemp("limits-home"), path)


def events(head, text: str) -> list[dict]:
    return [e for e in head.call("events", limit=200)["events"] if text in e["message"]]


def test_a_job_past_its_time_limit_is_stopped_and_ends_timeout(head):
    started = time.monotonic()
    job = submit(head, "--time", "5s", "--gpu-mem", "4G", "--", "sleep", "25")
    done = head.wait_job(job, timeout=40)
    assert done["state"] == "timeout", done
    assert done["reason"] == "stopped at its time limit (--time 5 s)"
    assert time.monotonic() - started < 20  # not the 25 s it would have slept
    log = head.run("logs", str(job), check=True).stdout
    assert f"nebula: job {job} reached its time limit (--time 5 s): SIGUSR1 now" in log
    assert events(head, f"job {job} reached its time limit")


def test_an_over_using_job_is_reported_and_killed_while_its_neighbour_runs_on(head):
    # Three A100s taken whole leave one 80 GB card, which two 30 GB slices share.
    blocker = submit(head, "--gpu-count", "3", "--gpu-mem", "70G", "--", "sleep", "120")
    neighbour = greedy = None
    try:
        running(head, blocker)
        neighbour = submit(head, "--gpu-mem", "30G", "--", "sleep", "120")
        greedy = submit(head, "--gpu-mem", "30G", "--", "env", "NEBULA_SIM_GPU_MEM=45G", "sleep", "120")
        a, b = running(head, neighbour), running(head, greedy)
        card = a["gpus"][0]["uuid"]
        assert b["gpus"][0]["uuid"] == card
        where = f"{a['gpus'][0]['node']}:{a['gpus'][0]['index']}"
        said = wait_for(lambda: events(head, f"job {greedy} holds 45 GB on {where}, over its 30 GB "
                                              "reservation"), 20, what="the guard's event")
        assert "it will be killed in 3 s unless it gives the memory back" in said[0]["message"]
        # Free for the scheduler is what is really free and not promised: 80 - 2 × 30 - 15.
        free = [s["memory_mb"] for g in head.call("gpus")["gpus"] if g["uuid"] == card
                for s in g["slices"] if s["state"] == "free"]
        assert free in ([81920 - 2 * 30720 - 15360], [])  # [] once it is gone
        done = head.wait_job(greedy, timeout=40)
        assert done["state"] == "failed"
        assert done["reason"].startswith(f"killed by the memory guard: held 45 GB on {where}, over its "
                                         "30 GB reservation for")
        log = head.run("logs", str(greedy), check=True).stdout
        assert f"nebula: job {greedy} holds 45 GB on {where}" in log
        assert head.job(neighbour)["state"] == "running"  # the job it protected
    finally:
        for job in (blocker, neighbour, greedy):
            if job is not None:
                head.run("cancel", str(job))
        for job in (blocker, neighbour, greedy):
            if job is not None:
                head.wait_job(job, timeout=40)


@pytest.mark.slow
def test_an_idle_job_is_marked_warned_and_cancelled(head):
    job = submit(head, "--gpu-mem", "4G", "--", "env", "NEBULA_SIM_GPU_UTIL=0", "sleep", "120")
    running(head, job)
    marked = wait_for(lambda: (j := head.job(job))["idle_since"] and j, 20, what="the idle mark")
    assert marked["state"] == "running"
    queue = wait_for(lambda: (q := head.run("queue", check=True).stdout) and "idle" in q and q, 20,
                     what="the queue to show the mark")
    assert "on 1 GPU · env NEBULA_SIM_GPU_UTIL=0 sleep 120" in queue
    warned = wait_for(lambda: events(head, f"job {job} is idle"), 20, what="the warning")
    assert "it will be cancelled in 4 s unless it uses them" in warned[0]["message"]
    done = head.wait_job(job, timeout=40)
    assert done["state"] == "cancelled" and done["reason"].startswith("cancelled: idle ")
    assert done["reason"].endswith("on 1 GPU")


@pytest.mark.parametrize(("flags", "said"), [
    (("--gpu-mem", "8T"), "needs a GPU with ≥8192 GB free; the largest card here has 80 GB"),
    (("--gpu-count", "64"), "needs 64 whole GPUs on one node; the largest node has 4 such GPUs"),
    (("--arch", "sm_120"), "no GPU with sm_120 in the cluster (here: sm_80, sm_86, sm_89)"),
    (("--time", "2h"), "--time 2h is longer than this cluster allows (max_time 1h)"),
])
def test_a_request_that_could_never_run_is_refused_at_submit(head, flags, said):
    refused = head.run("submit", *flags, "--", "true")
    assert refused.returncode == 2, refused
    assert refused.stderr.count("\n") == 1 and said in refused.stderr
    assert not [j for j in head.call("queue")["jobs"] if j["command"] == ["true"]]


def test_an_array_of_20_never_runs_more_than_4_at_once(head):
    array = submit(head, "--array", "0-19%4", "--gpu-mem", "4G", "--",
                   "sh", "-c", 'echo "task $NEBULA_ARRAY_TASK_ID of $NEBULA_ARRAY_JOB_ID"; sleep 1')
    queue = head.run("queue", check=True).stdout
    lines = [line for line in queue.splitlines() if line.strip().startswith(f"{array}_")]
    assert len(lines) <= 1  # one line until expanded (or none once every task ended)
    tasks = _tasks_done(head, array, 20)
    assert all(t["state"] == "succeeded" for t in tasks), [t["state"] for t in tasks]
    spans = sorted((t["started_at"], t["ended_at"]) for t in tasks)
    most = max(sum(1 for s, e in spans if s <= start < e) for start, _ in spans)
    assert most <= 4, spans
    log = head.run("logs", str(tasks[7]["id"]), check=True).stdout
    assert f"task {tasks[7]['array_index']} of {array}" in log


def _tasks_done(head, array: int, count: int) -> list[dict]:
    """Every task of the array once it ended (their ids follow the first task's)."""
    def done():
        tasks = [head.job(array + n) for n in range(count)]
        assert all(t["array_id"] == array for t in tasks)
        return all(t["state"] in ("succeeded", "failed", "cancelled") for t in tasks) and tasks
    return wait_for(done, 120, interval=0.5, what="every task to end")


def test_an_array_is_one_line_and_cancelled_as_a_whole(head):
    array = submit(head, "--array", "0-5%2", "--gpu-mem", "4G", "--", "sleep", "60")
    wait_for(lambda: sum(head.job(array + n)["state"] == "running" for n in range(6)) == 2, 30,
             what="two tasks to run")
    queue = head.run("queue", check=True).stdout
    line = [row for row in queue.splitlines() if row.strip().startswith(f"{array}_*")]
    assert len(line) == 1 and "2 running, 4 waiting" in line[0]
    expanded = head.run("queue", "--expand", check=True).stdout
    assert sum(1 for row in expanded.splitlines() if row.strip().startswith(f"{array}_")) == 6
    head.run("cancel", str(array), check=True)
    for n in range(6):
        assert head.wait_job(array + n, timeout=40)["state"] == "cancelled"


def test_after_kinds_and_requeue(head):
    broken = submit(head, "--gpu-mem", "4G", "--", "false")
    cleanup = submit(head, "--gpu-mem", "4G", "--after", f"notok:{broken}", "--", "true")
    on_success = submit(head, "--gpu-mem", "4G", "--after", str(broken), "--", "true")
    assert head.wait_job(cleanup, timeout=40)["state"] == "succeeded"
    failed = head.wait_job(on_success, timeout=40)
    assert failed["state"] == "failed" and failed["reason"].count("this job will not run") == 1

    job = submit(head, "--gpu-mem", "4G", "--", "sleep", "60")
    running(head, job)
    head.run("requeue", str(job), check=True)
    again = wait_for(lambda: (j := head.job(job))["attempt"] == 1 and j["state"] == "running" and j,
                     40, what="the job to run again")
    assert again["started_at"]
    head.run("cancel", str(job), check=True)
    assert head.wait_job(job, timeout=40)["state"] == "cancelled"
    shown = json.loads(head.run("job", str(cleanup), "--json", check=True).stdout)
    assert shown["after"] == [broken] and shown["after_type"] == "notok"


RESTART_GRACE_S = 15


@pytest.mark.slow
def test_a_stop_under_way_survives_a_head_restart(openssh_lab, tmp_path):
    """A job that ignores SIGUSR1 at its time limit is killed when the grace ends, counted
    from its one SIGUSR1, though the head was SIGKILLed and started again within the grace
    (neither forgotten nor signalled again with a fresh grace)."""
    path = lab_config(openssh_lab, "limits-restart", health={"isolation_grace": f"{RESTART_GRACE_S}s"})
    for head in serving(openssh_lab, tmp_path / "home", path):
        job = submit(head, "--time", "3s", "--gpu-mem", "4G", "--command",
                     "trap 'echo checkpoint asked' USR1; while :; do sleep 1; done")
        said = wait_for(lambda: events(head, f"job {job} reached its time limit"), 30,
                        what="the time limit's SIGUSR1")
        signalled = said[0]["t"]
        assert head.job(job)["phase"] == "stopping"
        # The SIGUSR1 reached the job before the crash (a crash before it is the next test's).
        wait_for(lambda: "checkpoint asked" in log_of(head, job), 10, what="the job's trap")
        head.kill()
        head.start()
        back = time.time() - signalled  # a loaded machine may take longer than the grace
        assert head.job(job)["phase"] == "stopping"  # known again, from the store
        done = head.wait_job(job, timeout=RESTART_GRACE_S + 30)
        assert done["state"] == "timeout", done
        assert done["reason"] == "stopped at its time limit (--time 3 s)"
        # Killed when the first grace ended: a second SIGUSR1 after the restart would have
        # ended it a grace after the restart instead.
        assert RESTART_GRACE_S - 1 <= done["ended_at"] - signalled <= max(RESTART_GRACE_S, back) + 4, done
        assert len(events(head, f"job {job} reached its time limit")) == 1
        log = log_of(head, job)
        assert log.count("reached its time limit") == 1 and log.count("checkpoint asked") == 1
        assert not events(head, f"job {job} got its SIGUSR1 only after the head restarted")


@pytest.mark.slow
def test_a_head_killed_between_storing_a_stop_and_its_sigusr1_sends_it_after_its_restart(
        openssh_lab, tmp_path):
    """The store has a stop before its SIGUSR1 goes. A head killed in between left a job
    that never got one: the restarted head sends it, once, and the job has a whole grace
    from it to checkpoint, not the rest of a grace it never knew of."""
    path = lab_config(openssh_lab, "limits-crash", health={"isolation_grace": f"{RESTART_GRACE_S}s"})
    for head in serving(openssh_lab, tmp_path / "home", path):
        job = submit(head, "--gpu-mem", "4G", "--command",
                     "trap 'echo checkpoint asked' USR1; while :; do sleep 1; done")
        running(head, job)
        head.kill()
        # What the head had written when it died: the stop, due a grace from then.
        why = "stopped at its time limit (--time 1 min)"
        with contextlib.closing(Store(head.home / "state.db")) as store:
            store.record_stop(job, JobState.TIMEOUT, why, False, time.time() + RESTART_GRACE_S)
        head.start()
        wait_for(lambda: "checkpoint asked" in log_of(head, job), 30, what="the late SIGUSR1")
        asked = time.time()
        said = (f"job {job} got its SIGUSR1 only after the head restarted ({why}): "
                f"SIGKILL in {RESTART_GRACE_S} s if still running")
        assert [e["message"] for e in events(head, f"job {job} got its SIGUSR1")] == [said]
        done = head.wait_job(job, timeout=RESTART_GRACE_S + 30)
        assert (done["state"], done["reason"]) == ("timeout", why), done
        # The trap answers within its loop's second; the poll adds a fraction of one.
        assert RESTART_GRACE_S - 3 <= done["ended_at"] - asked <= RESTART_GRACE_S + 4, done
        log = log_of(head, job)
        assert log.count("checkpoint asked") == 1 and f"nebula: {said}\n" in log


def log_of(head, job: int) -> str:
    return head.run("logs", str(job), check=True).stdout


def test_a_job_that_ignores_sigusr1_is_killed_after_the_grace_and_ends_timeout(head):
    job = submit(head, "--time", "2s", "--gpu-mem", "4G", "--command",
                 "trap 'echo checkpoint asked' USR1; while :; do sleep 1; done")
    done = head.wait_job(job, timeout=40)
    assert done["state"] == "timeout" and done["reason"] == "stopped at its time limit (--time 2 s)"
    assert done["ended_at"] - done["started_at"] < 2 + GRACE_S + 5


@pytest.mark.parametrize("arch", ["sm_86", "sm_89"])  # read with nvidia-smi; with NVML
def test_a_job_on_cards_that_report_no_utilisation_is_idle_unknown_not_idle(head, openssh_lab, arch):
    """Cards whose vendor reports no utilisation (N/A), read by the nodelet's real parsers,
    cannot tell an idle job from a busy one: the job is shown "idle unknown", not idle. That
    it is never cancelled, past idle_after and idle_grace, is the head's rule on its own
    clock (tests/unit/test_limits_clock.py), not waited out here."""
    cards = [(g["node"], g["index"]) for g in head.call("gpus")["gpus"]
             if g["compute_capability"] == arch]
    assert cards
    for node, index in cards:
        faults.set_fault(openssh_lab.node_dir(node), index, util=None)
    try:
        job = submit(head, "--arch", arch, "--gpu-mem", "4G", "--", "env",
                     "NEBULA_SIM_GPU_UTIL=0", "sleep", "120")
        running(head, job)
        wait_for(lambda: head.job(job)["idle_unknown"], 20, what="idleness unknown")
        queue = head.run("queue", check=True).stdout
        assert "idle unknown (no utilisation reading) · env NEBULA_SIM_GPU_UTIL=0 sleep 120" in queue
        now = head.job(job)
        assert (now["state"], now["idle_since"], now["idle_unknown"]) == ("running", None, True)
        assert not events(head, f"job {job} is idle")
    finally:
        for node, index in cards:
            faults.clear_gpu_faults(openssh_lab.node_dir(node), index)
    # Read again, the card is idle: the job is marked, and no longer unknown.
    marked = wait_for(lambda: (j := head.job(job))["idle_since"] and j, 20, what="the idle mark")
    assert marked["idle_unknown"] is False
    head.run("cancel", str(job))  # the idle rule may have cancelled it first (8 s after the mark)
    head.wait_job(job, timeout=40)
