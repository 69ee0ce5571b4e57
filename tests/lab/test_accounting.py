"""Accounting through the real CLI: jobs whose durations, utilisation and memory we know
(they say so to the simulated nvidia-smi) run on the lab, and `nebula history`, `nebula
job` and `nebula report` must show those figures. Telemetry is kept every second here
(`accounting.telemetry_every: 1s`), as often as the lab's nodes are probed."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import re
import time

import pytest
import yaml

from support.tui import until
from nebula_tui.screens import users as users_screen
from nebula_tui.screens.app import make_app
from nebula_tui.screens.users import USER_COLUMNS, UsersScreen
from labkit.harness import HeadProcess
from nebula_tui.views import month_start
from support.users import ALICE, BOB, GROUP, as_user, shared_head, submit_as
from support.head import submit_json

#: What the test's jobs tell the simulated nvidia-smi they do (per card).
BUSY_UTIL, BUSY_MEM_MB = 40, 3072
RUN_S = 8
#: A job's start and end reach the head within a probe interval or two of the command's
#: (its start may be noted a moment before the command runs).
SLACK_S = 3.0
EARLY_S = 0.5


@pytest.fixture(scope="module")
def head(openssh_lab, tmp_path_factory):
    home = tmp_path_factory.mktemp("accounting")
    config = yaml.safe_load(openssh_lab.config_path.read_text())
    config["accounting"] = {"telemetry_every": "1s"}
    (home / "nodes.yaml").write_text(yaml.safe_dump(config))
    h = HeadProcess(home, openssh_lab, config=home / "nodes.yaml")
    before = time.time()
    h.start()
    h.started_between = (before, time.time())  # its cards are first seen in between
    try:
        yield h
    finally:
        h.stop()


def _busy(seconds: int, util: int = BUSY_UTIL, mem_mb: int = BUSY_MEM_MB) -> list[str]:
    return ["--", "env", f"NEBULA_SIM_GPU_UTIL={util}", f"NEBULA_SIM_GPU_MEM={mem_mb}M",
            "sleep", str(seconds)]


@pytest.fixture(scope="module")
def ended(head):
    """Jobs with known figures, all ended: a busy whole card for RUN_S, the same idle, a
    6 GB slice of a 24 GB RTX 3090, a failure, a job that waited for a card, one cancelled
    while waiting."""
    gpus = {f"{g['node']}:{g['index']}": g for g in json.loads(head.run("gpus", "--json").stdout)}
    started = time.time()
    # A slice of an RTX 4090 or 4060 that the next job waits for: cancelled at once.
    blocker = submit_json(head, "--gpu-mem", "4G", "--arch", "sm_89", "--", "sleep", "600")
    never = submit_json(head, "--name", "never", "--after", str(blocker), "--", "true")
    head.run("cancel", str(never), check=True)
    head.run("cancel", str(blocker), check=True)
    jobs = {
        "cancelled": never,
        "busy": submit_json(head, "--name", "busy", "--arch", "sm_80", *_busy(RUN_S)),
        # Every A100 (sm_80, node02), the busy job's too: this one waits for that card.
        "waited": submit_json(head, "--name", "waited", "--gpu-count", "4", "--arch", "sm_80",
                              "--", "true"),
        "idle": submit_json(head, "--name", "idle", "--arch", "sm_89", *_busy(RUN_S, util=0)),
        "slice": submit_json(head, "--name", "slice", "--gpu-mem", "6G", "--arch", "sm_86",
                             *_busy(RUN_S, mem_mb=2048)),
        "failed": submit_json(head, "--name", "failed", "--command", "sleep 1; exit 3"),
    }
    for job in jobs.values():
        head.wait_job(job, timeout=90)
    jobs["blocker"] = blocker
    yield {"jobs": jobs, "gpus": gpus, "started": started, "ended": time.time()}


def _history(head, *args: str) -> dict[int, dict]:
    return {j["id"]: j for j in json.loads(head.run("history", "--json", *args, check=True).stdout)}


@pytest.mark.slow
def test_history_shows_what_each_job_held_waited_ran_cost_and_did(head, ended):
    jobs, gpus = ended["jobs"], ended["gpus"]
    rows = _history(head)
    assert set(jobs.values()) <= set(rows)

    busy = rows[jobs["busy"]]
    assert busy["state"] == "succeeded" and busy["exit_code"] == 0 and busy["name"] == "busy"
    (card,) = busy["gpus"]
    assert gpus[f"{card['node']}:{card['index']}"]["compute_capability"] == "sm_80"
    assert RUN_S - EARLY_S <= busy["run_s"] <= RUN_S + SLACK_S
    assert (RUN_S - EARLY_S) / 3600 <= busy["gpu_hours"] <= (RUN_S + SLACK_S) / 3600  # a whole card
    # Its card showed BUSY_UTIL % and BUSY_MEM_MB while it ran (a sample or two at its
    # edges may catch the card before the process or after it).
    # edges may catch the card before the process or after it; on a loaded machine the
    # nodes answer late and more of the samples are edges).
    assert BUSY_UTIL * 0.3 <= busy["mean_util_pct"] <= BUSY_UTIL
    assert busy["mem_used_mb_peak"] == BUSY_MEM_MB
    assert BUSY_MEM_MB * 0.3 <= busy["mem_used_mb_mean"] <= BUSY_MEM_MB
    assert busy["idle_gpu_hours"] <= busy["gpu_hours"] * 0.7

    idle = rows[jobs["idle"]]
    assert idle["mean_util_pct"] == 0 and idle["idle_gpu_hours"] == pytest.approx(idle["gpu_hours"])

    part = rows[jobs["slice"]]
    (card,) = part["gpus"]
    total = gpus[f"{card['node']}:{card['index']}"]["total_memory_mb"]
    assert card["memory_mb"] == 6144 and not card["exclusive"]
    share = 6144 / total  # a slice is charged its share of the card's memory
    assert (RUN_S - EARLY_S) * share / 3600 <= part["gpu_hours"] <= (RUN_S + SLACK_S) * share / 3600

    failed = rows[jobs["failed"]]
    assert (failed["state"], failed["exit_code"]) == ("failed", 3)
    assert 1 - EARLY_S <= failed["run_s"] <= 1 + SLACK_S

    waited = rows[jobs["waited"]]
    assert len(waited["gpus"]) == 4 and waited["state"] == "succeeded"
    assert waited["started_at"] >= busy["ended_at"]  # it waited until the busy job's card was free
    assert waited["wait_s"] == pytest.approx(busy["ended_at"] - waited["submitted_at"], abs=SLACK_S)
    assert waited["wait_s"] > 1

    never = rows[jobs["cancelled"]]
    assert (never["state"], never["gpus"], never["run_s"], never["gpu_hours"]) == ("cancelled", [], 0, 0)


def test_a_finished_job_shows_its_cards_and_what_it_cost(head, ended):
    job = json.loads(head.run("job", str(ended["jobs"]["busy"]), "--json", check=True).stdout)
    assert job["state"] == "succeeded" and len(job["gpus"]) == 1
    assert job["gpu_hours"] > 0 and job["mean_util_pct"] > 0


def test_history_filters(head, ended):
    jobs = ended["jobs"]
    failed = _history(head, "--state", "failed")
    assert jobs["failed"] in failed and all(j["state"] == "failed" for j in failed.values())
    node02 = _history(head, "--node", "node02")
    assert {jobs["busy"], jobs["waited"]} <= set(node02)
    assert all(any(g["node"] == "node02" for g in j["gpus"]) for j in node02.values())
    assert _history(head, "--user", "nobody-here") == {}
    assert set(jobs.values()) <= set(_history(head, "--since", "10m", "--user", "root"))
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ended["started"] - 1))
    assert _history(head, "--until", stamp).keys().isdisjoint(jobs.values())
    newest = json.loads(head.run("history", "--json", "--limit", "2", check=True).stdout)
    assert len(newest) == 2 and newest[0]["ended_at"] <= newest[1]["ended_at"]
    text = head.run("history", check=True).stdout.splitlines()
    assert text[0].split()[:5] == ["ID", "USER", "NAME", "STATE", "EXIT"]
    assert any(line.split()[0] == str(jobs["failed"]) and " 3 " in line for line in text)
    bad = head.run("history", "--state", "running")
    assert bad.returncode == 2 and "not an end state" in bad.stderr
    every = json.loads(head.run("queue", "--all", "--json", check=True).stdout)
    assert set(jobs.values()) <= {j["id"] for j in every}


def test_users_see_each_others_history_only_where_the_lab_allows(openssh_lab, users, tmp_path_factory):
    own = {"accounting": {"history": "own"}}
    with contextlib.contextmanager(shared_head)(openssh_lab, tmp_path_factory, GROUP, own) as head:
        mine = submit_as(head, ALICE, "--gpu-mem", "4G", "--", "true")
        theirs = submit_as(head, BOB, "--gpu-mem", "4G", "--", "true")
        head.wait_job(mine)
        head.wait_job(theirs)
        listed = json.loads(as_user(head, ALICE, "history", "--json").stdout)
        assert [j["id"] for j in listed] == [mine]
        refused = as_user(head, ALICE, "history", "--user", BOB)
        assert refused.returncode == 1 and "theirs and the admins'" in refused.stderr
        assert as_user(head, ALICE, "job", str(theirs)).returncode == 1
        # root is an admin: every job.
        assert {mine, theirs} <= {j["id"] for j in json.loads(head.run("history", "--json").stdout)}


def _report(head, *args: str) -> dict:
    return json.loads(head.run("report", "--json", *args, check=True).stdout)


def test_report_per_user_per_node_and_for_the_cluster(head, ended):
    jobs, gpus = ended["jobs"], ended["gpus"]
    report = _report(head)
    month = time.strftime("%Y-%m")
    (me,) = [u for u in report["users"] if u["user"] == "root" and u["month"] == month]
    assert me["jobs"] == len(jobs)
    slice_share = 6144 / 24576  # of an RTX 3090
    # busy, idle and the failed job held a whole card each, the slice its share
    known_s = RUN_S + RUN_S + 1 + RUN_S * slice_share
    assert (known_s - 4 * EARLY_S) / 3600 <= me["gpu_hours"] <= (known_s + 7 * SLACK_S) / 3600
    # Busy at BUSY_UTIL for RUN_S, idle for RUN_S, the slice's card busy too.
    assert 3 < me["efficiency_pct"] < BUSY_UTIL
    assert me["idle_gpu_hours"] >= (RUN_S - SLACK_S) / 3600  # the idle job, at least
    assert 0 < me["mean_wait_s"] < RUN_S  # one job waited ~RUN_S, the others hardly

    nodes = {r["node"]: r for r in report["nodes"] if r["period"] == month}
    cards = {n: sum(1 for g in gpus.values() if g["node"] == n) for n in ("node01", "node02", "node03")}
    first, last = head.started_between
    for node, count in cards.items():
        row = nodes[node]
        assert row["gpus"] == count
        # each card counts from when the head first saw it
        assert count * (report["until"] - last) / 3600 <= row["available_gpu_hours"] <= \
            count * (report["until"] - first) / 3600
    node02 = nodes["node02"]  # the busy job's A100 for RUN_S, then the 4-card job
    assert (RUN_S - EARLY_S) / 3600 <= node02["allocated_gpu_hours"] <= (RUN_S + 5 * SLACK_S) / 3600
    assert node02["allocated_pct"] == pytest.approx(
        100 * node02["allocated_gpu_hours"] / node02["available_gpu_hours"], abs=0.1)
    assert 0 < node02["util_pct"] < BUSY_UTIL  # one card of four busy for a while
    cluster = nodes["cluster"]
    assert cluster["gpus"] == 9
    assert cluster["allocated_gpu_hours"] == pytest.approx(
        sum(nodes[n]["allocated_gpu_hours"] for n in cards), abs=1e-5)
    today = time.strftime("%Y-%m-%d")
    assert any(d["period"] == today and d["node"] == "cluster" for d in report["days"])

    # The same figures as CSV, and in the Users screen's data.
    rows = list(csv.DictReader(io.StringIO(head.run("report", "--csv", "nodes", check=True).stdout)))
    assert [r["node"] for r in rows if r["period"] == month] == ["node01", "node02", "node03", "cluster"]
    assert float(next(r for r in rows if r["node"] == "node02")["allocated_gpu_hours"]) == \
        pytest.approx(node02["allocated_gpu_hours"], abs=1e-5)
    users = {u["name"]: u for u in json.loads(head.run("users", "--json", check=True).stdout)}
    assert users["root"]["month_jobs"] == me["jobs"]
    assert users["root"]["month_efficiency_pct"] == me["efficiency_pct"]
    header, *rows = head.run("users", check=True).stdout.splitlines()
    assert "EFFICIENCY" in header and "MEAN WAIT" in header
    root = next(r for r in rows if r.split()[0] == "root")
    assert f"{me['efficiency_pct']:.0f}%" in root.split()
    text = head.run("report", check=True).stdout
    assert "EFFICIENCY" in text and "ALLOCATED GPU-H" in text and "cluster" in text


def test_a_report_of_an_earlier_period_is_empty_and_bad_periods_are_refused(head, ended):
    early = _report(head, "--since", "2020-01-01", "--until", "2020-02-01")
    assert early["users"] == [] and all(r["allocated_gpu_hours"] == 0 for r in early["nodes"])
    assert [r["period"] for r in early["nodes"] if r["node"] == "cluster"] == ["2020-01"]
    backwards = head.run("report", "--since", "2026-02-01", "--until", "2026-01-01")
    assert backwards.returncode == 2 and "period is empty" in backwards.stderr
    too_long = head.run("report", "--since", "2000-01-01")
    assert too_long.returncode == 2 and "at most 400 days" in too_long.stderr


def _this_month(head) -> tuple[dict, dict]:
    """root's row and the cluster's row of the head's report of this month, now."""
    now = time.time()
    report = head.call("report", since=month_start(now), until=now)["report"]
    month = time.strftime("%Y-%m")
    (me,) = [u for u in report["users"] if u["user"] == "root" and u["month"] == month]
    (cluster,) = [r for r in report["nodes"] if r["node"] == "cluster" and r["period"] == month]
    return me, cluster


def _screen_month(app) -> tuple[dict[str, str], dict[str, float]]:
    """root's cells on the Users screen by column, and the figures of its cluster line."""
    table = app.screen.query_one("#users-table")
    cells = dict(zip((c.key for c in USER_COLUMNS), map(str, table.get_row("root"))))
    line = str(app.screen.query_one("#users-month").content)
    match = re.search(r"([\d.]+) of ([\d.]+) GPU-hours allocated \((\d+)%\) · cards (\d+)% busy", line)
    assert match, line
    allocated, available, pct, busy = map(float, match.groups())
    return cells, {"allocated": allocated, "available": available, "pct": pct, "busy": busy}


def _same_as_the_report(cells: dict[str, str], line: dict[str, float], me: dict, cluster: dict) -> None:
    assert cells["jobs"] == str(me["jobs"])
    assert cells["efficiency"] == f"{me['efficiency_pct']:.0f}%"
    assert float(cells["idle"]) == pytest.approx(me["idle_gpu_hours"], abs=0.0005)
    assert float(cells["hours"].split()[1]) == pytest.approx(me["gpu_hours"], abs=0.0006)
    wait = re.fullmatch(r"(\d+)s", cells["wait"])  # the jobs here waited seconds
    # the cell says whole seconds (1.6 s is "1s"), the report tenths
    assert wait and -0.05 <= me["mean_wait_s"] - int(wait.group(1)) < 1.05
    # The head's report came moments after the screen's: every card had that much more
    # time, and a few more samples of its utilisation.
    assert line["allocated"] == pytest.approx(cluster["allocated_gpu_hours"], abs=0.0006)
    assert -0.0006 <= cluster["available_gpu_hours"] - line["available"] <= 9 * 30 / 3600 + 0.001
    assert line["pct"] == pytest.approx(100 * cluster["allocated_gpu_hours"] / line["available"], abs=1)
    assert line["busy"] == pytest.approx(cluster["util_pct"], abs=5)


async def test_the_users_screen_shows_the_reports_month_and_follows_it(head, ended, monkeypatch):
    """The Users screen shows this month's figures as the head's report has them: root's
    jobs, efficiency, idle GPU-hours, mean wait and GPU-hours, and the cluster's allocated
    of available GPU-hours and utilisation; a job that ends while it is shown moves them."""
    monkeypatch.setattr(users_screen, "REPORT_EVERY_S", 0.5)
    app = make_app(head.socket)
    async with app.run_test(size=(160, 48)) as pilot:
        await until(pilot, lambda: app.cluster.connected, what="the snapshot")
        await pilot.press("4")
        await until(pilot, lambda: isinstance(app.screen, UsersScreen) and app.screen.month
                    and app.screen.query_one("#users-table").row_keys, what="the month's figures")
        cells, line = _screen_month(app)
        _same_as_the_report(cells, line, *_this_month(head))
        assert int(cells["jobs"]) >= len(ended["jobs"])

        job = submit_json(head, "--name", "more", "--arch", "sm_80", *_busy(3))
        head.wait_job(job, timeout=60)
        await until(pilot, lambda: _screen_month(app)[0]["jobs"] == str(int(cells["jobs"]) + 1)
                    and _screen_month(app)[1]["available"] > line["available"],
                    timeout=60, what=f"the ended job in the figures (were {cells}, {line})")
        await pilot.pause(1.5)  # the last of the job's user events, and its report
        _same_as_the_report(*_screen_month(app), *_this_month(head))


def test_month_start_counts_back_across_a_new_year():
    now = time.mktime((2026, 2, 17, 15, 30, 0, 0, 0, -1))
    starts = [time.localtime(month_start(now, back=b))[:6] for b in (0, 1, 2, 14)]
    assert starts == [(2026, 2, 1, 0, 0, 0), (2026, 1, 1, 0, 0, 0), (2025, 12, 1, 0, 0, 0),
                      (2024, 12, 1, 0, 0, 0)]
