"""``nebula simulate``: a lab month through the head's own code in virtual time, its
workloads, its baselines and its figures — and the replay against the live head on the
simulated lab, job for job."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nebula_tui.config.cluster import parse_config
from nebula_tui.head import forecast
from nebula_tui.head.replay import Replay
from nebula_tui.month import baselines, inventory, metrics, setup, workload
from nebula_tui.month.records import Outcome, Request

REPO = Path(__file__).resolve().parents[2]
LAB_LAYOUT = "core"  # the session's simulated lab (labfixtures)


def nebula(*args: str, timeout: float = 300, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nebula_tui", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, **kw)


# ------------------------------------------------------------------ workloads
def test_a_trace_csv_reads_and_a_bad_line_is_named(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("submit_s,user,gpus,gpu_mem_gb,duration_s,time_limit_s,nodes,service\n"
                     "10,alice,1,8,600,1200,1,0\n20,bob,2,,3600,,1,0\n")
    first, second = workload.read(trace)
    assert (first.submit_s, first.user, first.gpu_mem_mb, first.time_limit_s) == (0, "alice", 8192, 1200)
    assert (second.submit_s, second.gpus, second.gpu_mem_mb, second.time_limit_s) == (10, 2, None, None)
    trace.write_text("submit_s,user,gpus,duration_s\n0,alice,two,60\n")
    with pytest.raises(workload.WorkloadError, match=r"t.csv:2: gpus is 'two', not a number"):
        workload.read(trace)
    trace.write_text("when,who\n1,2\n")
    with pytest.raises(workload.WorkloadError, match=r"t.csv:1: the header lacks submit_s"):
        workload.read(trace)


def test_a_slurm_export_reads_jobs_that_ran_with_gpus(tmp_path):
    export = tmp_path / "sacct.txt"
    export.write_text(
        "JobID|User|Submit|Start|End|AllocTRES|Timelimit|NNodes|State\n"
        "101|alice|2026-11-02T09:00:00|2026-11-02T09:05:00|2026-11-02T10:05:00|cpu=4,gres/gpu=2,node=1|02:00:00|1|COMPLETED\n"
        "101.batch|alice|2026-11-02T09:00:00|2026-11-02T09:05:00|2026-11-02T10:05:00|cpu=4|||COMPLETED\n"
        "102|bob|2026-11-02T09:10:00|Unknown|Unknown|cpu=1,gres/gpu=1|1-00:00:00|1|PENDING\n"
        "103|bob|2026-11-02T09:20:00|2026-11-02T09:20:00|2026-11-02T09:30:00|cpu=1,gres/gpu:a100=1|10:00|1|TIMEOUT\n")
    jobs = workload.read(export)
    assert [(j.user, j.gpus, j.duration_s, j.time_limit_s) for j in jobs] == [
        ("alice", 2, 3600.0, 7200.0), ("bob", 1, 600.0, 600.0)]
    assert jobs[1].submit_s == 20 * 60


def test_the_built_in_month_is_deterministic_and_every_parameter_names_its_source():
    a = workload.lab_month(14, 4, days=7, seed=5)
    assert a == workload.lab_month(14, 4, days=7, seed=5)
    assert a != workload.lab_month(14, 4, days=7, seed=6)
    assert all(1 <= r.gpus <= 4 for r in a) and len({r.user for r in a}) > 3
    for name, measured in workload.PARAMETERS.items():
        assert any(study in measured.source for study in ("Philly", "Helios", "PAI")), name


def test_the_second_month_is_the_file_its_script_writes_with_a_concentrated_user_and_a_long_service():
    """bench/months/concentrated.csv, the month docs/lab-month.md measures beside the
    built-in one: what bench/month_concentrated.py writes, one user holding about 40% of
    its GPU-hours, and a 2-card service from day 1 to the month's end."""
    spec = importlib.util.spec_from_file_location("month_concentrated", REPO / "bench" / "month_concentrated.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    jobs = workload.read(script.TRACE)
    drawn = script.month()
    assert [(r.user, r.gpus, r.gpu_mem_mb, r.service) for r in jobs] == \
        [(r.user, r.gpus, r.gpu_mem_mb, r.service) for r in drawn]
    heavy = sum(script.gpu_hours(r) for r in jobs if r.user == script.HEAVY) / sum(map(script.gpu_hours, jobs))
    assert 0.38 <= heavy <= 0.46
    longest = max((r for r in jobs if r.service), key=lambda r: r.duration_s)
    assert longest.gpus == 2 and longest.duration_s >= 28 * 86400 and longest.time_limit_s is None


def test_the_built_in_durations_match_the_philly_run_times_they_were_checked_against():
    """workload.PARAMETERS' checked figures: the Philly run times have a median of 1,186 s
    and a p90 of 12,860 s (alibaba/clusterdata's philly_runtime.csv); the month's jobs,
    drawn from its log-normal, keep within 15% of both."""
    runs = sorted(r.duration_s for r in workload.lab_month(80, 4, users=20, seed=11) if not r.service)
    median, p90 = runs[len(runs) // 2], runs[int(0.9 * len(runs))]
    assert 0.85 * 1186 <= median <= 1.15 * 1186
    assert 0.85 * 12860 <= p90 <= 1.15 * 12860


# ------------------------------------------------------------------ baselines and figures
CARDS = [baselines.Card("n1", "g1", 24576), baselines.Card("n1", "g2", 24576), baselines.Card("n2", "g3", 24576)]


def test_the_spreadsheet_is_first_come_first_served_on_each_users_machine():
    jobs = [Request(1, 0, "alice", 2, None, 100), Request(2, 1, "alice", 1, None, 10),
            Request(3, 2, "carol", 1, None, 10), Request(4, 3, "alice", 3, None, 10)]
    out = baselines.spreadsheet(jobs, CARDS, 1000, homes={"alice": "n1", "carol": "n2"})
    assert out[2].started_s == 100  # behind alice's first job, though n2 sits idle
    assert out[3].started_s == 2
    assert out[4].refused and out[4].started_s is None  # n1 can never hold 3 cards


def test_slurm_like_backfills_a_short_job_but_not_a_long_one():
    jobs = [Request(1, 0, "alice", 2, None, 100, 100), Request(2, 1, "bob", 3, None, 10, 10, nodes=2),
            Request(3, 2, "carol", 1, None, 10, 50), Request(4, 3, "dave", 1, None, 500, 500)]
    out = baselines.slurm_like(jobs, CARDS, 1000, half_life_s=None)
    assert out[2].started_s == 100  # the reservation: at the end of job 1's limit
    assert out[3].started_s == 2  # ends (by its limit) before the reservation: backfilled
    assert out[4].started_s == 110  # would delay job 2: waits


def test_slurm_like_packs_a_one_card_job_onto_the_fullest_machine_best_fit():
    """select/cons_tres packs: the 1-card job takes n2's only card, so n1 stays whole for
    the 2-card job behind it (worst fit put it on n1 and made the pair wait)."""
    jobs = [Request(1, 0, "alice", 1, None, 100, 100), Request(2, 1, "bob", 2, None, 10, 10)]
    out = baselines.slurm_like(jobs, CARDS, 1000, half_life_s=None)
    assert [p[0] for p in out[1].placements] == ["n2"]
    assert out[2].started_s == 1


def test_slurm_like_reserves_for_every_blocked_job_it_tests_not_only_the_first():
    """sched/backfill reserves for up to bf_max_job_test jobs: job 4 (second blocked) holds
    n1 from t=100, so job 5, which would run past that, is not backfilled onto n1's free
    card; with one reservation (EASY, bf_max_job_test=1) it is, and job 4 waits for it."""
    cards = [baselines.Card("n1", "g1", 24576), baselines.Card("n1", "g2", 24576),
             baselines.Card("n2", "g3", 49152)]
    jobs = [Request(1, 0, "x", 1, 40960, 200, 200),  # the big card, until 200
            Request(2, 0, "y", 1, None, 100, 100),  # n1's first card, until 100
            Request(3, 1, "c", 1, 40960, 50, 50),  # blocked: only n2's card holds it
            Request(4, 1, "d", 2, None, 50, 50),  # blocked: needs n1 whole
            Request(5, 2, "e", 1, None, 1000, 1000)]  # n1's free card, past t=100
    out = baselines.slurm_like(jobs, cards, 5000, half_life_s=None)
    assert (out[3].started_s, out[4].started_s) == (200, 100)
    assert out[5].started_s == 150
    easy = baselines.slurm_like(jobs, cards, 5000, half_life_s=None, bf_max_job_test=1)
    assert easy[5].started_s == 2 and easy[4].started_s == 1002


def test_utilisation_counts_the_memory_asked_not_the_card_held():
    jobs = [Request(1, 0, "alice", 1, 8192, 1000)]
    out = baselines.slurm_like(jobs, CARDS[:1], 1000, half_life_s=None)  # whole card
    f = metrics.figures("x", jobs, out, CARDS[:1], 1000, {1})
    assert f.utilisation == pytest.approx(8192 / 24576)
    assert f.held == pytest.approx(1.0)


def test_utilisation_also_says_how_much_of_it_was_work_that_ends_not_services():
    """Slurm-like's higher utilisation on four of five months was its services' hours (a
    4-card service on the lab's 80 GB cards counts 320 GB an hour): the table says, beside
    work served, the part served to jobs that end, so a policy that runs services instead of
    batch work shows it."""
    jobs = [Request(1, 0, "alice", 1, None, 1000, service=True), Request(2, 0, "bob", 1, None, 500)]
    cards = CARDS[:2]
    out = {1: Outcome(1, started_s=0, placements=(("n1", "g1", 24576, True),)),
           2: Outcome(2, started_s=0, ended_s=500, placements=(("n1", "g2", 24576, True),))}
    f = metrics.figures("x", jobs, out, cards, 1000, {1, 2})
    assert f.utilisation == pytest.approx(0.75) and f.utilisation_batch == pytest.approx(0.25)
    assert "  of it, jobs that end (not services)" in metrics.table([f])


def test_each_size_class_has_its_p95_and_never_run_and_the_last_line_names_the_worst():
    jobs = [Request(1, 0, "alice", 1, 8192, 100), Request(2, 0, "bob", 2, None, 100),
            Request(3, 0, "carol", 2, None, 100)]
    cards = CARDS[:2]
    slurm = baselines.slurm_like(jobs, cards, 1000, half_life_s=None)  # 2 starts at 0, 3 at 100
    ours = {1: Outcome(1, started_s=0, ended_s=100, placements=(("n1", "g1", 24576, True),)),
            2: Outcome(2, started_s=100, ended_s=200,
                       placements=(("n1", "g1", 24576, True), ("n1", "g2", 24576, True))),
            3: Outcome(3)}  # never ran
    a = metrics.figures("NebulaGrid", jobs, ours, cards, 1000, {1, 2, 3})
    b = metrics.figures("slurm-like", jobs, slurm, cards, 1000, {1, 2, 3})
    assert a.waits_by_size["2 cards"][2:] == (2, 1) and b.waits_by_size["2 cards"][3] == 0
    table = metrics.table([a, b])
    assert "  2 cards: wait p50 / p95, never run" in table and "1 of 2" in table
    assert metrics.last_line(a, b, b).endswith(", worst class: 2 cards p95 17 min (slurm-like 3)")


# ------------------------------------------------------------------ the head's own replay
def test_the_replay_runs_the_heads_code_slices_share_and_limits_stop(tmp_path):
    inv = inventory.layout("core")
    cluster = setup.replay_config(inv, None, [])
    jobs = [Request(1, 0, "alice", 1, 4096, 3600), Request(2, 0, "bob", 1, 4096, 3600),
            Request(3, 0, "carol", 1, None, 7200, 600), Request(4, 0, "dave", 64, None, 10)]
    out = Replay(cluster, inv, jobs, setup.REPLAY_EPOCH, 86400).run()
    assert out[4].refused and "could never start here" in out[4].refused
    assert [p[2:] for p in out[1].placements + out[2].placements] == [(4096, False)] * 2  # slices
    assert out[3].state == "timeout" and out[3].ended_s - out[3].started_s == pytest.approx(600, abs=1)
    assert out[1].state == out[2].state == "succeeded"


def test_a_setting_changes_the_replay(tmp_path):
    """--set reaches the head's own settings: a cluster max_time refuses longer jobs."""
    inv = inventory.layout("core")
    jobs = [Request(1, 0, "alice", 1, None, 60, 7200)]
    plain = Replay(setup.replay_config(inv, None, []), inv, jobs, setup.REPLAY_EPOCH, 3600).run()
    capped = Replay(setup.replay_config(inv, None, ["limits.max_time=1h"]), inv, jobs,
                    setup.REPLAY_EPOCH, 3600).run()
    assert plain[1].state == "succeeded" and capped[1].refused
    with pytest.raises(setup.SetupError, match="SECTION.KEY=VALUE"):
        setup.replay_config(inv, None, ["half_life=3d"])


def test_a_job_refused_over_quota_counts_as_never_run():
    """A quota refuses for now, not for good: some card could have run the job, so the
    figures count it as runnable and never run (a job no card could ever hold is not)."""
    from nebula_tui.month import compare
    inv = inventory.layout("core")
    cluster = setup.replay_config(inv, None, ["scheduler.quota_gpu_hours=1", "scheduler.quota_mode=refuse"])
    jobs = [Request(1, 0, "alice", 1, None, 7200), Request(2, 3 * 3600, "alice", 1, None, 600),
            Request(3, 0, "bob", 64, None, 10)]

    def nebula(reqs, cards, horizon):
        return Replay(cluster, cards, reqs, setup.REPLAY_EPOCH, horizon).run()

    result = compare.compare(jobs, inv, 86400, None, nebula)
    ours = result.figures[0]
    assert (ours.runnable, ours.never_run) == (2, 1)  # job 2 (over quota) counts; job 3 does not


def test_the_wait_cdf_stops_short_of_one_by_the_jobs_that_never_ran(tmp_path):
    """On a month where half the runnable jobs never ran (alice's second job, over a
    refusing quota), the CDF reaches one half, not 1: a job that never started is not
    counted as started at the month's end. The JSON's points past it are null, and the
    plot's legend says the share that never ran."""
    from nebula_tui.month import compare, plots
    inv = inventory.layout("core")
    cluster = setup.replay_config(inv, None, ["scheduler.quota_gpu_hours=1", "scheduler.quota_mode=refuse"])
    jobs = [Request(1, 0, "alice", 1, None, 7200), Request(2, 3 * 3600, "alice", 1, None, 600)]
    result = compare.compare(jobs, inv, 86400, None,
                             lambda reqs, cards, horizon: Replay(cluster, cards, reqs, setup.REPLAY_EPOCH,
                                                                horizon).run())
    ours = result.figures[0]
    assert (ours.runnable, ours.never_run) == (2, 1)
    hours, shares, never = plots.wait_cdf(ours)
    assert shares[-1] == pytest.approx(0.5) and never == pytest.approx(0.5)
    cdf = plots.as_json(result)["policies"][0]["wait_cdf_min"]
    assert cdf[10] == pytest.approx(0.0, abs=1) and cdf[50] is None and cdf[100] is None
    pytest.importorskip("matplotlib")
    _, cdf_axes = plots.figure(result).axes
    (curve,) = [line for line in cdf_axes.get_lines() if line.get_label() == f"{ours.policy} (never ran: 50.0%)"]
    assert max(curve.get_ydata()) == pytest.approx(0.5)
    plots.png(result, tmp_path / "month.png")
    assert (tmp_path / "month.png").stat().st_size > 0


def test_the_replay_forecasts_each_start_at_submit_and_the_score_counts_it():
    """One card; job 1 holds it for 3,000 s of its 7,200 s limit; job 2 (submitted at 60 s)
    is forecast at 40% of job 1's limit, in an interval of the default factors of its
    padded wait (the head has seen no start to learn from yet)."""
    inv = {"node01": inventory.layout("core")["node01"][:1]}
    cluster = setup.replay_config(inv, None, [])
    jobs = [Request(1, 0, "alice", 1, None, 3000, 7200), Request(2, 60, "bob", 1, None, 600, 1800)]
    out = Replay(cluster, inv, jobs, setup.REPLAY_EPOCH, 86400, forecasts=True).run()
    assert Replay(cluster, inv, jobs, setup.REPLAY_EPOCH, 86400).run()[2].forecast is None
    assert out[1].forecast == (0, 0, 0)  # it starts on the pass of its submit
    wait, pad = 0.4 * 7200 - 60, forecast.PAD_S
    low, high = forecast.DEFAULT_FACTORS
    assert out[2].forecast == pytest.approx((0.4 * 7200, 60 + low * (wait + pad) - pad,
                                             60 + high * (wait + pad) - pad), abs=1)
    assert out[2].started_s == pytest.approx(3000, abs=1)
    score = metrics.forecast_score(jobs, out)
    assert score.jobs == 1 and score.p50 == pytest.approx(abs(2880 - 3000) / 2940, abs=1e-3)
    assert score.started == 2 and score.inside == 1.0
    assert "of the wait" in score.text()


def test_a_start_forecast_not_within_the_horizon_is_outside_when_it_starts_sooner():
    """Job 1 is a service held to the cluster's max_time, 20 days (the forecast expects 40%
    of it: past the horizon), that ends after an hour: job 2, forecast "not within 7
    days", starts then — outside its interval."""
    inv = {"node01": inventory.layout("core")["node01"][:1]}
    cluster = setup.replay_config(inv, None, ["limits.max_time=20d"])
    jobs = [Request(1, 0, "alice", 1, None, 3600, None, service=True),
            Request(2, 60, "bob", 1, None, 600, 1800)]
    out = Replay(cluster, inv, jobs, setup.REPLAY_EPOCH, 86400, forecasts=True).run()
    at, early, late = out[2].forecast
    assert at == early == pytest.approx(60 + forecast.HORIZON_S) and late is None
    assert out[2].started_s == pytest.approx(3600, abs=1)
    score = metrics.forecast_score(jobs, out)
    assert (score.started, score.inside) == (2, 0.5)
    assert score.jobs == 1 and score.p50 == pytest.approx((60 + forecast.HORIZON_S - 3600) / 3540, abs=1e-3)


def test_the_forecast_score_is_the_error_over_the_wait_of_jobs_that_waited_over_10_minutes():
    """Ten jobs that waited an hour, forecast 6, 12, … 60 min off; one that waited 5 min
    (not scored for the error, but counted for the interval); one never started and one
    without a forecast (neither counted); two forecast right, one of them preempted and
    started again later (what was foretold is its first start)."""
    requests = [Request(k, 0, "ann", 1, None, 60) for k in range(15)]
    outcomes = {}
    for k in range(9):  # forecast k+1 tenths of the hour late, inside [0, 2 h]
        outcomes[k] = Outcome(k, started_s=3600, forecast=(3600 + 360 * (k + 1), 0, 7200))
    outcomes[9] = Outcome(9, started_s=3600, forecast=(3600 * 2, 3601.5, None))  # 1.5 s before its interval
    outcomes[10] = Outcome(10, started_s=300, forecast=(3600, 0, 400))  # 5 min: only the interval
    outcomes[11] = Outcome(11, started_s=None, forecast=(60, 0, 120))  # never ran
    outcomes[12] = Outcome(12, started_s=600, forecast=None)  # made no forecast
    outcomes[13] = Outcome(13, started_s=7200, forecast=(7200, 7200, 7200))  # spot on
    outcomes[14] = Outcome(14, started_s=9000, first_started_s=3600, forecast=(3600, 3600, 3700))
    score = metrics.forecast_score(requests, outcomes)
    errors = sorted([(k + 1) / 10 for k in range(10)] + [0.0, 0.0])
    assert score.jobs == 12
    assert score.p50 == metrics.percentile(errors, 50) == 0.5
    assert score.p90 == metrics.percentile(errors, 90) == 0.9
    assert score.started == 13 and score.inside == pytest.approx(12 / 13)


def test_what_if_adds_and_removes_cards():
    inv = inventory.layout("demo")
    more = inventory.add(inv, "2x NVIDIA GeForce RTX 4090@node07")
    assert len(inventory.card_list(more)) == len(inventory.card_list(inv)) + 2
    assert "node03" not in inventory.remove(inv, "node03")
    with pytest.raises(inventory.InventoryError, match="COUNTxMODEL@NODE"):
        inventory.add(inv, "lots of 4090s")
    with pytest.raises(inventory.InventoryError, match="no such node"):
        inventory.remove(inv, "node99")


def test_nebula_simulate_prints_the_table_and_the_last_line(tmp_path):
    trace = tmp_path / "t.csv"
    workload.write_trace(workload.lab_month(9, 4, days=2, seed=3), trace)
    done = nebula("simulate", str(trace), "--layout", "core", "--days", "2", "--set", "scheduler.half_life=3d")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert any(line.startswith("utilisation (work served)") for line in lines)
    assert any(line.startswith("lab month: wait p95 ") and "fairness" in line for line in lines)
    assert any(line.startswith("start forecast at submit: error p50 ") for line in lines)
    bad = nebula("simulate", "--add", "many cards")
    assert bad.returncode == 2 and "COUNTxMODEL@NODE" in bad.stderr and "Traceback" not in bad.stderr


HUGE_OR_BAD = [
    ("t.csv", "submit_s,user,gpus,duration_s\n0,alice,1000000000000,3600\n", "t.csv:2: gpus is"),
    ("t.csv", "submit_s,user,gpus,duration_s\n0,alice,5000,3600\n", "t.csv:2: gpus is 5000"),
    ("t.csv", "submit_s,user,gpus,duration_s\n0,alice,1,nan\n", "t.csv:2: duration_s is 'nan'"),
    ("h.json", '[{"id": 1, "submitted_at": NaN, "user": "a", "started_at": 0, "ended_at": 5}]',
     "h.json: not JSON (NaN is not a number JSON allows)"),
    ("h.json", '[{"id": 1, "submitted_at": -5, "user": "a", "started_at": 0, "ended_at": 5}]',
     "h.json: job 1: submitted_at is -5"),
    ("h.json", '[{"id": 1, "submitted_at": 0, "user": "a", "started_at": 9, "ended_at": 5}]',
     "h.json: job 1: ended_at is before started_at"),
    ("h.json", '[{"id": 1, "submitted_at": 0, "user": "a", "started_at": 0, "ended_at": 5, '
               '"gpu_count": 1000000000000}]', "h.json: job 1: gpus is 1000000000000"),
    ("h.json", "[" * 100_000, "h.json: not JSON nested as"),
    ("h.json", '{"jobs": 7}', "h.json: no list of jobs"),
    ("gpus.json", '[{"node": "n", "index": 1000000000000, "uuid": "u", "model": "m", "total_memory_mb": 1}]',
     "gpus.json: a GPU row's index (1000000000000)"),
]


@pytest.mark.parametrize("name, text, says", HUGE_OR_BAD, ids=[h[2][:40] for h in HUGE_OR_BAD])
def test_huge_or_bad_inputs_are_refused_in_one_line_not_taken(tmp_path, name, text, says):
    """A workload or inventory asking for 10^12 cards, or with NaN, negative or broken
    values, is refused at once in one line (exit 2); before, 10^12 cards grew the replay
    by gigabytes and NaN or a bad history hung it or raised (issue 41)."""
    path = tmp_path / name
    path.write_text(text)
    args = ("--gpus", str(path)) if name == "gpus.json" else (str(path),)
    done = subprocess.run(["sh", "-c", 'ulimit -v 2000000; exec "$@"', "sh", sys.executable, "-m", "nebula_tui",
                           "simulate", *args, "--days", "1"], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 2, (done.returncode, done.stderr[-500:])
    assert done.stderr.count("\n") == 1 and says in done.stderr, done.stderr


@pytest.mark.parametrize("flag, value", [("--days", "nan"), ("--days", "1e9"), ("--load", "-1"),
                                         ("--load", "inf"), ("--users", "1000000000000")])
def test_huge_or_nonsense_flags_are_refused_in_one_line(flag, value):
    done = nebula("simulate", flag, value, timeout=60)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and flag in done.stderr, done.stderr


# ------------------------------------------------------------------ against the live head
@pytest.mark.slow
def test_the_replay_places_like_the_live_head_on_the_simulated_lab(head, tmp_path):
    """The same short trace on the real lab (sshd, tmux, the head service) and in the
    replay: each job on the same cards, the jobs starting in the same order."""
    trace = [  # (gpus, gpu_mem_mb, seconds): durations far apart, so the order is the schedule's
        (4, None, 2), (4, None, 2), (1, 8192, 1), (2, None, 6), (1, None, 1), (1, 8192, 1)]
    ids = [head.call("submit", command=["sleep", str(s)], gpu_count=g, gpu_mem_mb=m,
                     name=f"trace{n}")["job"]["id"] for n, (g, m, s) in enumerate(trace)]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        jobs = {j["id"]: j for j in head.call("queue")["jobs"]}
        if not any(i in jobs for i in ids):
            break
        time.sleep(0.5)
    history = {j["id"]: j for j in json.loads(head.run("history", "--json", check=True).stdout)}
    live = {n: {g["uuid"] for g in history[i]["gpus"]} for n, i in enumerate(ids)}
    live_order = sorted(range(len(ids)), key=lambda n: history[ids[n]]["started_at"])

    # The lab's cards, as `nebula gpus --json` lists them, and their links as the lab's
    # nodes report them (the simulated lab's layout).
    saved = tmp_path / "gpus.json"
    saved.write_text(json.dumps(head.call("gpus")["gpus"]))
    inv = inventory.from_gpus_json(saved)
    links = inventory.layout_links(LAB_LAYOUT)
    assert {d["uuid"] for cards in inv.values() for d in cards} == \
        {d["uuid"] for cards in inventory.layout(LAB_LAYOUT).values() for d in cards}
    requests = [Request(n, 0.0, "alice", g, m, s) for n, (g, m, s) in enumerate(trace)]
    out = Replay(parse_config(inventory.config_text(inv)), inv, requests, time.time(), 3600, links).run()
    replayed = {n: {p[1] for p in out[n].placements} for n in range(len(trace))}
    assert replayed == live
    # Jobs one pass starts start together in the replay; live, their launches confirm
    # milliseconds apart. Every pair the replay starts at different times starts live in
    # the same order.
    rank = {n: i for i, n in enumerate(live_order)}
    for a in range(len(trace)):
        for b in range(len(trace)):
            if out[a].started_s < out[b].started_s:
                assert rank[a] < rank[b], (a, b, out[a].started_s, out[b].started_s)


def test_a_requeued_jobs_live_attempt_ends_though_its_first_attempts_exit_comes_later():
    """A preempted attempt's own exit (its recorded end) still comes after the job was
    requeued and started again: it must not erase the live attempt's token, or that attempt
    never ends and holds its card for the rest of the month."""
    one = inventory.layout("core")
    inv = {"n1": next(iter(one.values()))[:1]}  # one card
    cluster = setup.replay_config(inv, None, [])
    jobs = [Request(1, 0, "alice", 1, None, 1000, preemptible=True),
            Request(2, 10, "bob", 1, None, 100)]
    out = Replay(cluster, inv, jobs, setup.REPLAY_EPOCH, 86400).run()
    assert out[2].started_s == pytest.approx(10, abs=1)  # alice's scavenger work yielded
    assert out[1].runs == 2 and out[1].started_s >= 110  # requeued, started again after bob
    assert out[1].state == "succeeded" and out[1].ended_s == pytest.approx(out[1].started_s + 1000, abs=1)


def test_a_four_card_job_behind_a_service_and_a_stream_of_slices_starts_within_hours():
    """node02 is the core lab's only 4-card machine. A stream of slices (with --time) and
    of 1-card jobs without --time from five users keeps its cards busy; the 4-card job
    used to get no reservation (a job without --time "never ends") and waited for the
    stream to end. With each running job's end estimated, its reservation drains node02."""
    inv = inventory.layout("core")
    cluster = setup.replay_config(inv, None, [])
    jobs, key = [Request(1, 0, "svc", 1, 16384, 30 * 86400, service=True)], 2
    for t in range(0, 30 * 3600, 240):  # a day and more: without a reservation it ends at ~33 h
        jobs.append(Request(key, t + 1, f"u{key % 5}", 1, 8192, 7200, 3 * 3600))
        key += 1
        if t % 480 == 0:
            jobs.append(Request(key, t + 2, f"u{key % 5}", 1, None, 3 * 3600))
            key += 1
    gang = Request(key, 3600, "gang", 4, None, 3600, 7200)
    out = Replay(cluster, inv, jobs + [gang], setup.REPLAY_EPOCH, 2 * 86400, forecasts=False).run()
    assert out[gang.key].started_s is not None, "the 4-card job never started"
    assert out[gang.key].started_s - gang.submit_s <= 6 * 3600


def test_an_over_quota_job_runs_on_the_idle_card_and_is_preempted_for_in_quota_work():
    """quota_mode scavenge (the default): alice, past a 1 GPU-hour quota, still runs on
    the idle card, as preemptible work; bob's in-quota job preempts her, and hers runs
    again after. With quota_mode refuse her job is refused and the card sits idle."""
    one = inventory.layout("core")
    inv = {"n1": next(iter(one.values()))[:1]}  # one card
    jobs = [Request(1, 0, "alice", 1, None, 2 * 3600), Request(2, 3 * 3600, "alice", 1, None, 2 * 3600),
            Request(3, 4 * 3600, "bob", 1, None, 3600)]
    cluster = setup.replay_config(inv, None, ["scheduler.quota_gpu_hours=1"])
    out = Replay(cluster, inv, jobs, setup.REPLAY_EPOCH, 86400).run()
    assert out[2].refused is None and out[2].runs == 2  # ran at once, preempted, ran again
    assert out[3].started_s == pytest.approx(4 * 3600, abs=60)  # bob did not wait for her
    assert out[2].started_s >= out[3].ended_s and out[2].state == "succeeded"
    strict = setup.replay_config(inv, None, ["scheduler.quota_gpu_hours=1", "scheduler.quota_mode=refuse"])
    out = Replay(strict, inv, jobs, setup.REPLAY_EPOCH, 86400).run()
    assert out[2].refused and out[2].started_s is None


def test_add_and_remove_change_the_cards_not_the_built_in_months_jobs(tmp_path):
    """Adding cards used to grow the built-in month with them (two more 4090s read as more
    jobs never run): the same jobs now run on the changed cards, and the output says so."""
    plain, more = tmp_path / "plain.csv", tmp_path / "more.csv"
    base = ("simulate", "--layout", "core", "--days", "1")
    assert nebula(*base, "--save-trace", str(plain)).returncode == 0
    done = nebula(*base, "--add", "2x NVIDIA GeForce RTX 4090@node07", "--save-trace", str(more))
    assert done.returncode == 0, done.stderr
    assert more.read_text() == plain.read_text()
    assert "the same jobs as on the lab's 9 cards, replayed on 11" in done.stdout


def test_the_replay_keeps_a_preempted_jobs_first_start_for_the_score():
    """One card: bob's preemptible job 1 starts at once; ann's job 2 (at 60 s) preempts it,
    and job 1 starts again when job 2 ends. The forecast at its submit foretold the first
    start, and the score reads that one, not the restart."""
    inv = {"node01": inventory.layout("core")["node01"][:1]}
    cluster = setup.replay_config(inv, None, [])
    jobs = [Request(1, 0, "bob", 1, None, 3600, 7200, preemptible=True),
            Request(2, 60, "ann", 1, None, 1800, 3600)]
    out = Replay(cluster, inv, jobs, setup.REPLAY_EPOCH, 86400, forecasts=True).run()
    assert out[1].runs >= 2 and out[1].first_started_s == 0 and out[1].started_s >= 60 + 1800
    assert out[1].forecast == (0, 0, 0)
    score = metrics.forecast_score(jobs, out)
    assert score.jobs == 0 and score.inside == 1.0  # job 1 started as foretold; job 2 waited ~1 min


def test_a_preempted_job_waited_once_and_every_run_held_its_card():
    """One card for a day: bob's preemptible job starts at once, ann's (at 60 s) preempts it,
    and a third job holds the card till the day's end, so bob's is waiting again when the
    replay stops. It ran: it is not "never run", its wait is the 0 s before its first
    start (it was the whole day, counted from its submit to the end), and the card was
    held by someone all day, its first run included (the figures read the last run only)."""
    inv = {"node01": inventory.layout("core")["node01"][:1]}
    cluster = setup.replay_config(inv, None, [])
    jobs = [Request(1, 0, "bob", 1, None, 7 * 3600, preemptible=True),
            Request(2, 60, "ann", 1, None, 7200, 7200),
            Request(3, 120, "cid", 1, None, 86400)]
    out = Replay(cluster, inv, jobs, setup.REPLAY_EPOCH, 86400).run()
    assert out[1].first_started_s == 0 and out[1].started_s is None  # ran, then requeued
    cards = baselines_cards(inv)
    figures = metrics.figures("NebulaGrid", jobs, out, cards, 86400, {1, 2, 3})
    assert figures.never_run == 0
    assert figures.waits_by_size["1 card"][2] == 3 and figures.wait_max_s < 3 * 3600
    assert figures.held == pytest.approx(1.0, abs=0.01)


def baselines_cards(inv: dict) -> list[baselines.Card]:
    return [baselines.Card(node, uuid, mb) for node, uuid, mb in inventory.card_list(inv)]


def test_the_built_in_month_replays_to_its_end():
    """The month `nebula simulate` replays by default reaches its last day: a scheduling
    loop (decisions undoing each other at one instant) once held its clock still at day 24."""
    inv = inventory.layout("demo")
    cluster = setup.replay_config(inv, None, [])
    jobs = workload.lab_month(len(inventory.card_list(inv)), inventory.largest_node(inv),
                              users=max(12, len(inv)), days=30, seed=2026)
    replay = Replay(cluster, inv, jobs, setup.REPLAY_EPOCH, 30 * 86400)
    out = replay.run()
    assert replay.clock.now == setup.REPLAY_EPOCH + 30 * 86400
    assert sum(1 for o in out.values() if o.started_s is not None) > 0.9 * len(jobs)


def test_the_replay_reads_fair_share_usage_once_and_keeps_what_each_read_would_give(monkeypatch):
    """The replay's head reads its users' finished runs from the store once, then keeps
    them by the ends it is told of. Wherever the live head would have read them again (a
    minute on), what it kept is what that read gives: the same runs per user, those before
    the half-life window left out (a 1-hour half-life moves the window within the replay),
    and the same hours this month. Reading them again at each virtual minute was about a
    fifth of a long replay."""
    from nebula_tui.head.shares import Shares
    from nebula_tui.store import Store
    reads, compared = [], []
    real_read, real_usage_at = Store.finished_usage, Shares._usage_at

    def counted_read(self, since):
        reads.append(since)
        return real_read(self, since)

    def checked(self, now, half_life):
        usage = real_usage_at(self, now, half_life)
        if usage.read_at == now:  # read, or kept where it would have been read
            store = self.state.store
            fresh = real_read(store, now - 10 * half_life)
            assert {u: sorted(r) for u, r in usage.finished.items()} == {u: sorted(r) for u, r in fresh.items()}
            month = {u: h for u, h in store.usage_since(usage.month_from).items() if h}
            assert {u: h for u, h in usage.month.items() if h} == pytest.approx(month)
            compared.append(sum(map(len, fresh.values())))
        return usage

    monkeypatch.setattr(Store, "finished_usage", counted_read)
    monkeypatch.setattr(Shares, "_usage_at", checked)
    inv = inventory.layout("core")
    cluster = setup.replay_config(inv, None, ["scheduler.half_life=1h"])
    jobs = workload.lab_month(len(inventory.card_list(inv)), inventory.largest_node(inv), days=2, seed=7)
    Replay(cluster, inv, jobs, setup.REPLAY_EPOCH, 2 * 86400).run()
    assert len(reads) == 1
    assert len(compared) > 100 and max(compared) > 20
    assert min(compared[len(compared) // 2:]) < max(compared)  # runs left the window


def test_three_days_of_a_busy_month_replay_to_the_same_starts_placements_and_charges():
    """What the replay decides, pinned: 3 days of the built-in generator's month at twice
    the demo lab's hours, with a 40 GPU-hour quota (so over-quota work runs as scavenger
    jobs and is preempted), gangs and slices. The figures were taken before the replay was
    made faster (2026-12-07): a change meant only to make it faster must leave them as they
    are. A change to what the scheduler decides changes them: then take them again, and
    say in docs/lab-month.md what moved."""
    import hashlib
    inv = inventory.layout("demo")
    jobs = workload.lab_month(len(inventory.card_list(inv)), inventory.largest_node(inv), days=3, load=2,
                              seed=2026)
    out = Replay(setup.replay_config(inv, None, ["scheduler.quota_gpu_hours=40"]), inv, jobs,
                 setup.REPLAY_EPOCH, 3 * 86400, inventory.layout_links("demo")).run()
    got = [out[r.key] for r in sorted(jobs, key=lambda r: r.key)]
    waits = sum(o.first_started_s - r.submit_s for o, r in zip(got, sorted(jobs, key=lambda r: r.key))
                if o.first_started_s is not None)
    figures = (len(jobs), sum(1 for o in got if o.first_started_s is not None), sum(o.runs for o in got),
               sum(1 for o in got if o.refused), sum(1 for o in got if o.state == "succeeded"), round(waits),
               round(sum(o.charged_gpu_hours for o in got), 3),
               sum(1 for o in got for p in o.placements if not p[3]))
    assert figures == (651, 439, 537, 0, 417, 1434522, 266.36, 237)
    every = repr([(o.key, o.first_started_s, o.started_s, o.ended_s, o.placements) for o in got])
    assert hashlib.sha256(every.encode()).hexdigest()[:16] == "3c02aa721635c3b6"


def test_skipping_the_passes_that_could_only_keep_jobs_waiting_changes_no_decision():
    """The replay skips a pass when only submits came since the last one and no waiting
    job's request fits any card (``Replay._only_waits``). A day of a month
    asking eight times what the demo lab's cards can run (its queue grows all along) replay
    with those passes skipped and with every pass run: each job's first and last start,
    end, cards, runs, state and charge are the same, and dozens of passes were
    skipped. (``NothingFits`` itself is checked over random clusters with preemptible
    jobs in tests/unit/test_preemption.py.)"""
    inv = inventory.layout("demo")
    jobs = workload.lab_month(len(inventory.card_list(inv)), inventory.largest_node(inv), days=1, load=8,
                              seed=2026)
    outcomes, replays = [], []
    for skip in (True, False):
        replay = Replay(setup.replay_config(inv, None, []), inv, jobs, setup.REPLAY_EPOCH, 86400,
                        inventory.layout_links("demo"))
        replay.skip_waits = skip
        out = replay.run()
        outcomes.append({k: (o.first_started_s, o.started_s, o.ended_s, o.placements, o.runs, o.state,
                             round(o.charged_gpu_hours, 9)) for k, o in out.items()})
        replays.append(replay)
    skipping, every = replays
    assert every.skipped == 0 and skipping.skipped > 50
    assert skipping.passes + skipping.skipped == every.passes
    assert sum(1 for o in outcomes[1].values() if o[1] is not None) > 150
    assert outcomes[0] == outcomes[1]


def test_a_replay_whose_passes_never_let_time_move_stops_in_one_line(monkeypatch):
    """Were each pass to undo the last one's decisions for ever (a preemption's requeued
    copies taking back the cards it freed, each an event of the same instant), the replay
    says so and ends, instead of holding the clock, and whoever waits on `nebula simulate`."""
    from nebula_tui.head.replay import ReplayStalled
    from nebula_tui.head.scheduling import Scheduling
    inv = inventory.layout("core")
    replay = Replay(setup.replay_config(inv, None, []), inv, [Request(1, 0, "alice", 1, None, 3600)],
                    setup.REPLAY_EPOCH, 86400)
    real_pass = Scheduling.schedule_pass

    def a_pass_whose_decisions_come_back_at_once(self, *args, **kwargs):
        result = real_pass(self, *args, **kwargs)
        replay._push(replay.clock.now, "exit", ("node01", 1, "an earlier attempt's", 0))
        return result

    monkeypatch.setattr(Scheduling, "schedule_pass", a_pass_whose_decisions_come_back_at_once)
    with pytest.raises(ReplayStalled, match=r"stopped at day 0\.0: 1001 scheduling passes without time moving"):
        replay.run()
