"""GPU health: Xid policies (R16), throttling and the health score (R19), self-test judging."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nebula_tui.model import GpuReading, Temperatures
from nebula_tui.scheduler.health import (
    DEFAULT_POLICIES,
    FLOOR,
    Policy,
    decide,
    forget_before,
    health_score,
    is_throttling,
    judge_selftest,
    parse_duration_s,
    policies_from_config,
)

MIN = 60.0
T0 = 1_800_000_000.0

#: The health policy's default hot threshold.
HOT_C = Temperatures().hot_c


def ev(code, pid=None, process=None):
    return {"code": code, "pci": "0000:01:00", "pid": pid, "process": process}


# (name, event, earlier events as (seconds before now, code), kind, admin_resume, pid)
CASES = [
    ("79 once", ev(79), [], "selftest", False, None),
    ("79 twice within 10 min", ev(79), [(5 * MIN, 79)], "isolate", True, None),
    ("79 twice, exactly 10 min apart", ev(79), [(10 * MIN, 79)], "isolate", True, None),
    ("79 twice 20 min apart", ev(79), [(20 * MIN, 79)], "selftest", False, None),
    ("79 after another code", ev(79), [(1 * MIN, 13)], "selftest", False, None),
    ("bus fall without code, once", ev(None), [], "selftest", False, None),
    ("bus fall after a 79", ev(None), [(2 * MIN, 79)], "isolate", True, None),
    ("79 after a code-less bus fall", ev(79), [(2 * MIN, None)], "isolate", True, None),
    ("43", ev(43, 77), [], "reset", False, None),
    ("13", ev(13), [], "selftest", False, None),
    ("31 with its pid", ev(31, 4242, "python3"), [], "fail_job", False, 4242),
    ("31 without a pid", ev(31), [], "record", False, None),
    ("94 with its pid", ev(94, 99), [], "fail_job", False, 99),
    ("48", ev(48), [], "isolate", False, None),
    ("64", ev(64), [], "isolate", False, None),
    ("74", ev(74), [], "isolate", False, None),
    ("95", ev(95), [], "isolate", False, None),
    ("119", ev(119), [], "reset", False, None),
    ("63", ev(63), [], "record", False, None),
    ("92", ev(92), [], "record", False, None),
    ("unknown code", ev(999), [], "record", False, None),
]


@pytest.mark.parametrize("name, event, earlier, kind, admin, pid", CASES, ids=[c[0] for c in CASES])
def test_default_policies(name, event, earlier, kind, admin, pid):
    history = [(T0 - ago, code) for ago, code in earlier]
    action = decide(event, history, T0, DEFAULT_POLICIES)
    assert (action.kind, action.admin_resume, action.pid) == (kind, admin, pid)
    assert action.reason and action.reason[0].isupper() and "\n" not in action.reason


def test_reasons_read_as_sentences():
    twice = decide(ev(79), [(T0 - 120, 79)], T0, gpu="node01:1")
    assert twice.reason == ("Xid 79 twice within 10 min (GPU fell off the bus): isolated; check the "
                            "slot and the power cable, then `nebula gpu resume node01:1`")
    assert "transient" in decide(ev(79), [], T0).reason
    assert decide(ev(None), [(T0 - 60, 79)], T0).reason.startswith(
        "GPU fell off the bus twice within 10 min: isolated; check the slot")
    assert decide(ev(None), [], T0).reason.startswith("GPU fell off the bus (no Xid code) once")
    assert decide(ev(31, 4242, "python3"), [], T0).reason.startswith(
        "Xid 31 (GPU memory page fault) caused by pid 4242 (python3): failing that job")
    assert "returns when its self-test passes" in decide(ev(48), [], T0).reason
    assert decide(ev(63), [], T0).reason.endswith(": recorded")


def test_history_in_the_future_or_of_other_codes_does_not_count():
    assert decide(ev(79), [(T0 + 60, 79)], T0).kind == "selftest"
    assert decide(ev(79), [(T0 - 60, 48), (T0 - 30, 13)], T0).kind == "selftest"


def test_config_overrides():
    policies = policies_from_config({
        79: {"window": "30m"},
        "43": {"action": "isolate", "admin_resume": True},
        61: {"action": "reset"},
        31: {"action": "record"},
    })
    assert policies[79] == Policy("isolate_on_repeat", 1800.0, admin_resume=True)
    assert decide(ev(79), [(T0 - 20 * MIN, 79)], T0, policies).kind == "isolate"
    assert decide(ev(43), [], T0, policies).admin_resume is True
    assert decide(ev(61), [], T0, policies).kind == "reset"
    assert decide(ev(31, 5), [], T0, policies).kind == "record"
    assert policies[48] == DEFAULT_POLICIES[48]  # untouched codes keep their defaults
    assert policies_from_config(None) == DEFAULT_POLICIES
    assert policies_from_config({}) == DEFAULT_POLICIES


@pytest.mark.parametrize("mapping, message", [
    ({79: {"window": "10x"}}, "xid_policies: 79: window: '10x' is not a duration"),
    ({79: {"window": 0}}, "xid_policies: 79: window: '0' must be longer than 0 s"),
    ({79: {"action": "explode"}}, "xid_policies: 79: action: 'explode' is not one of isolate,"),
    ({79: {"admin_resume": "yes"}}, "xid_policies: 79: admin_resume: must be true or false"),
    ({79: {"grace": 5}}, "xid_policies: 79: grace: unknown field"),
    ({61: {"window": "5m"}}, "xid_policies: 61: action: missing"),
    ({"seventy-nine": {"action": "record"}}, "xid_policies: seventy-nine: the key must be an Xid code"),
    ({79: "isolate"}, "xid_policies: 79: must be a mapping"),
    ([79], "xid_policies: must be a mapping"),
])
def test_config_errors_name_code_and_field(mapping, message):
    with pytest.raises(ValueError) as info:
        policies_from_config(mapping)
    assert str(info.value).startswith(message)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("text, seconds", [
    (600, 600.0), (1.5, 1.5), ("600", 600.0), ("600s", 600.0), ("10m", 600.0),
    ("10 min", 600.0), ("1h", 3600.0), ("0.5h", 1800.0),
])
def test_durations(text, seconds):
    assert parse_duration_s(text, bare="s") == seconds


# --- throttling and score ---------------------------------------------------------------------

def reading(temp=80.0, util=10.0, clock=900.0):
    return GpuReading(index=0, uuid="GPU-x", name="card", temperature_c=temp,
                      utilization_pct=util, sm_clock_mhz=clock)


@pytest.mark.parametrize("r, base, throttling", [
    (reading(), 1500.0, True),
    (reading(temp=75.0), 1500.0, False),  # "> 75 °C": 75 is not hot
    (reading(util=30.0), 1500.0, False),  # busy cards run hot for a reason
    (reading(clock=1500.0), 1500.0, False),  # at base clock: not slowed down
    (reading(temp=None), 1500.0, False),  # a missing reading is no evidence
    (reading(util=None), 1500.0, False),
    (reading(clock=None), 1500.0, False),
    (reading(), None, False),
])
def test_is_throttling(r, base, throttling):
    assert is_throttling(r, base, HOT_C) is throttling


def test_thresholds_are_parameters():
    assert is_throttling(reading(temp=70.0), 1500.0, hot_c=65.0)
    assert not is_throttling(reading(util=10.0), 1500.0, HOT_C, low_util_pct=5.0)


def test_score_drops_with_each_event_and_recovers():
    assert health_score([], T0) == 1.0
    one = health_score([T0], T0)
    three = health_score([T0, T0, T0], T0)
    assert one == pytest.approx(0.85) and three == pytest.approx(0.85 ** 3)
    assert health_score([T0], T0 + 3600) == pytest.approx(0.925)  # one half-life later
    assert health_score([T0], T0 + 86400) > 0.999  # a day of quiet: healthy again
    assert health_score([T0] * 100, T0) == FLOOR
    assert health_score([T0 + 50], T0) == pytest.approx(0.85)  # clock skew: counts as fresh


@given(st.lists(st.floats(min_value=0, max_value=10 * 86400), max_size=30),
       st.floats(min_value=0, max_value=10 * 86400), st.floats(min_value=1, max_value=86400))
def test_score_bounds_and_monotone_recovery(ages, now, later):
    events = [T0 - age for age in ages]
    score = health_score(events, T0)
    assert FLOOR <= score <= 1.0
    assert health_score(events, T0 + later) >= score - 1e-12  # never worse with time alone
    assert health_score(events + [T0], T0) <= score + 1e-12  # never better with an event


def test_forget_before_drops_only_negligible_events():
    cutoff = forget_before(T0)
    assert T0 - 12 * 3600 < cutoff < T0 - 6 * 3600
    assert abs(health_score([cutoff - 1], T0) - 1.0) < 1e-3


# --- self-test ----------------------------------------------------------------------------------

GOOD = {"smi_ok": True, "smi_error": "", "temperature_c": 34.0,
        "memory_test": {"ok": True, "detail": "0 uncorrected ECC errors"},
        "dcgm": {"ran": False, "ok": False, "detail": "dcgmi: command not found"}}


@pytest.mark.parametrize("change, passed, words", [
    ({}, True, "self-test passed: nvidia-smi answered, 34 °C, memory test ok, dcgmi diag not available"),
    ({"smi_ok": False, "smi_error": "Unable to determine the device handle for GPU0000:01:00.0: "
      "Unknown Error\n"}, False, "nvidia-smi could not read the GPU (Unable to determine"),
    ({"temperature_c": 88.0}, False, "88 °C while idle is above 80 °C"),
    ({"temperature_c": None}, True, "temperature N/A"),
    ({"memory_test": {"ok": False, "detail": "1 uncorrected ECC error"}}, False,
     "memory test: 1 uncorrected ECC error"),
    ({"memory_test": None}, True, "no memory test available"),
    ({"dcgm": {"ran": True, "ok": True, "detail": ""}}, True, "dcgmi diag -r 1 passed"),
    ({"dcgm": {"ran": True, "ok": False, "detail": "PCIe: Fail"}}, False, "dcgmi diag -r 1: PCIe: Fail"),
])
def test_judge_selftest(change, passed, words):
    ok, sentence = judge_selftest({**GOOD, **change})
    assert ok is passed and words in sentence and "\n" not in sentence


def test_a_card_tested_while_it_serves_is_judged_as_a_busy_card():
    """A 4060 laptop card under two jobs reads 83 °C: isolating it for that after an Xid 13
    took a working card from its jobs."""
    assert judge_selftest({**GOOD, "temperature_c": 83.0}, serving=True)[0]
    assert not judge_selftest({**GOOD, "temperature_c": 83.0})[0]
    ok, sentence = judge_selftest({**GOOD, "temperature_c": 94.0}, serving=True)
    assert not ok and "94 °C while serving is above 90 °C" in sentence


def test_judge_selftest_of_an_empty_answer_fails():
    ok, sentence = judge_selftest({})
    assert not ok and sentence == "self-test failed: nvidia-smi could not read the GPU (no answer)"


def test_health_module_is_pure():
    code = ("import json, sys; import nebula_tui.scheduler.health; "
            "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} & "
            "{'textual', 'asyncssh', 'sqlite3', 'yaml', 'rich', 'subprocess', 'socket'})))")
    done = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[2],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []
