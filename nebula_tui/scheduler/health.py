"""GPU health decisions: Xid policies (R16), throttling and the health score (R19), and the
judging of a self-test (R17). Pure: values in, decisions out; no I/O, and no clock — the
caller passes ``now``.

What the engine does with an :class:`Action`:

* ``record``    log the event; nothing else.
* ``selftest``  run the GPU's self-test while it keeps serving; isolate it if the test fails.
* ``reset``     one GPU reset attempt (its jobs are stopped first: a reset needs an idle
                card); isolate the GPU if the reset or the self-test after it fails.
* ``isolate``   the isolation pipeline: maintenance, SIGUSR1 to its jobs, SIGKILL after the
                grace, requeue, reset and self-test; back in service when the test passes,
                unless ``admin_resume`` — then only ``nebula gpu resume`` brings it back.
* ``fail_job``  fail the job that owns ``pid`` (only that one); the GPU keeps serving.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..model import NOT_AVAILABLE, GpuReading
from ..units import duration_exact, parse_duration_s

ACTIONS = ("isolate", "isolate_on_repeat", "reset", "selftest", "fail_job", "record")
#: Xid 79 (fell off the bus) stands in for a bus-fall message that carried no Xid code.
BUS_FALL_CODE = 79
#: The default repeat window of ``isolate_on_repeat``: R16's "short window", 10 minutes.
DEFAULT_WINDOW_S = 600.0


@dataclass(frozen=True)
class Policy:
    """What to do about one Xid code.

    ``action``: one of :data:`ACTIONS`. ``isolate_on_repeat`` isolates on the second
    occurrence within ``window_s`` seconds and runs a self-test on a first one alone.
    ``admin_resume``: an isolated GPU stays out until an admin resumes it, even when its
    self-test passes.
    """

    action: str
    window_s: float = DEFAULT_WINDOW_S
    admin_resume: bool = False


@dataclass(frozen=True)
class Action:
    """The decision for one event: ``kind`` (see the module docstring), whether only an
    admin may bring the GPU back, a sentence for events and the TUI, and the pid whose job
    fails (``fail_job`` only)."""

    kind: str
    admin_resume: bool
    reason: str
    pid: int | None = None
    code: int | None = None


#: R16 defaults; the rest of NVIDIA's catalog is ``record``. Any code can be overridden in
#: nodes.yaml (``xid_policies``), see :func:`policies_from_config`.
DEFAULT_POLICIES: dict[int, Policy] = {
    13: Policy("selftest"),  # graphics exception: usually the program; check the memory
    31: Policy("fail_job"),  # page fault: the program's bug, the card is fine
    43: Policy("reset"),  # stopped processing: one reset, isolate if it fails
    48: Policy("isolate"),  # double-bit ECC: reset activates row remapping, then self-test
    63: Policy("record"),  # row remap / page retirement recorded: the card handled it
    64: Policy("isolate"),  # remap/retirement failed: memory cannot protect itself
    74: Policy("isolate"),  # NVLink error
    79: Policy("isolate_on_repeat", DEFAULT_WINDOW_S, admin_resume=True),  # fell off the bus
    92: Policy("record"),  # high single-bit ECC rate: a warning
    94: Policy("fail_job"),  # contained ECC error: only that program is affected
    95: Policy("isolate"),  # uncontained ECC error: everything on the card is affected
    119: Policy("reset"),  # GSP RPC timeout: one reset, isolate if it fails
}

_MEANINGS = {
    13: "graphics engine exception", 31: "GPU memory page fault", 43: "GPU stopped processing",
    48: "double-bit ECC error", 63: "ECC row remapping or page retirement event",
    64: "ECC row remapping or page retirement failure", 74: "NVLink error",
    79: "GPU fell off the bus", 92: "high single-bit ECC error rate", 94: "contained ECC error",
    95: "uncontained ECC error", 119: "GSP RPC timeout",
}


def _meaning(code: int) -> str:
    # The scheduler stays free of the remote package; the backends' catalog has the rest.
    return _MEANINGS.get(code, "see NVIDIA's Xid catalog")


# --- configuration -----------------------------------------------------------------------------



def policies_from_config(mapping: Mapping[Any, Any] | None) -> dict[int, Policy]:
    """The effective policies: :data:`DEFAULT_POLICIES` with the overrides of ``mapping``.

    ``mapping`` is the ``xid_policies`` section as YAML gives it, e.g.
    ``{79: {"action": "isolate_on_repeat", "window": "10m", "admin_resume": True}}``; keys
    may be ints or digit strings. An override of a code with a default may leave fields
    out (they keep the default); a new code needs ``action``. Raises ValueError with one
    line naming the code and the field: ``xid_policies: 79: window: '10x' is not a …``.
    """
    policies = dict(DEFAULT_POLICIES)
    if mapping is None:
        return policies
    if not isinstance(mapping, Mapping):
        raise ValueError("xid_policies: must be a mapping of Xid code to policy")
    for key, entry in mapping.items():
        where = f"xid_policies: {key}"
        if isinstance(key, bool) or not (isinstance(key, int) or str(key).strip().isdigit()):
            raise ValueError(f"{where}: the key must be an Xid code (a number like 79)")
        code = int(str(key).strip())
        if not isinstance(entry, Mapping):
            raise ValueError(f"{where}: must be a mapping with action, window, admin_resume")
        unknown = sorted(set(map(str, entry)) - {"action", "window", "admin_resume"})
        if unknown:
            raise ValueError(f"{where}: {unknown[0]}: unknown field; "
                             "use action, window or admin_resume")
        base = policies.get(code)
        if "action" in entry:
            action = entry["action"]
            if action not in ACTIONS:
                raise ValueError(f"{where}: action: '{action}' is not one of {', '.join(ACTIONS)}")
            base = replace(base, action=action) if base else Policy(action)
        elif base is None:
            raise ValueError(f"{where}: action: missing (one of {', '.join(ACTIONS)})")
        if "window" in entry:
            try:
                base = replace(base, window_s=parse_duration_s(entry["window"], bare="s"))
            except ValueError as exc:
                raise ValueError(f"{where}: window: {exc}") from None
        if "admin_resume" in entry:
            if not isinstance(entry["admin_resume"], bool):
                raise ValueError(f"{where}: admin_resume: must be true or false, "
                                 f"not {entry['admin_resume']!r}")
            base = replace(base, admin_resume=entry["admin_resume"])
        policies[code] = base
    return policies


# --- decisions ---------------------------------------------------------------------------------


def _same_code(a: int | None, b: int | None) -> bool:
    return (BUS_FALL_CODE if a is None else a) == (BUS_FALL_CODE if b is None else b)


def decide(event: Mapping[str, Any], history: Sequence[tuple[float, int | None]], now: float,
           policies: Mapping[int, Policy] | None = None, gpu: str = "GPU") -> Action:
    """What to do about one Xid event of one GPU.

    ``event`` is one of :func:`~nebula_tui.remote.backends.xid.parse_xid`'s dicts (``code``
    None = fell off the bus without an Xid, handled as 79); ``history`` the earlier
    (time, code) events of the same GPU, the current one excluded; ``now`` the event's
    time; ``gpu`` how the sentence names the card (``node01:0``). Codes without a policy
    are recorded. ``fail_job`` without a pid (the driver wrote ``pid='<unknown>'``) can
    only be recorded.
    """
    policies = DEFAULT_POLICIES if policies is None else policies
    code = event.get("code")
    policy_code = BUS_FALL_CODE if code is None else int(code)
    policy = policies.get(policy_code, Policy("record"))
    label = f"Xid {code} ({_meaning(policy_code)})" if code is not None \
        else "GPU fell off the bus (no Xid code)"
    pid = event.get("pid")
    action = policy.action
    if action == "isolate_on_repeat":
        earlier = [t for t, c in history if _same_code(c, code) and 0 <= now - t <= policy.window_s]
        if earlier:
            window = duration_exact(policy.window_s)
            what = (f"Xid {code} twice within {window} ({_meaning(policy_code)})"
                    if code is not None else f"GPU fell off the bus twice within {window}")
            reason = f"{what}: isolated; " + _isolate_tail(policy_code, policy, gpu)
            return Action("isolate", policy.admin_resume, reason, None, code)
        return Action("selftest", False, f"{label} once: treated as transient; running a "
                      f"self-test, {gpu} keeps serving if it passes", None, code)
    if action == "isolate":
        return Action("isolate", policy.admin_resume,
                      f"{label}: isolated; " + _isolate_tail(policy_code, policy, gpu), None, code)
    if action == "reset":
        return Action("reset", policy.admin_resume, f"{label}: resetting {gpu} once; it is "
                      "isolated if the reset or the self-test after it fails", None, code)
    if action == "selftest":
        return Action("selftest", False, f"{label}: logged; running a memory and temperature "
                      f"self-test, {gpu} keeps serving if it passes", None, code)
    if action == "fail_job":
        if isinstance(pid, int):
            process = event.get("process")
            who = f"pid {pid}" + (f" ({process})" if process else "")
            return Action("fail_job", False, f"{label} caused by {who}: failing that job; "
                          f"{gpu} keeps serving", pid, code)
        return Action("record", False, f"{label}: recorded; the driver named no process, so "
                      "no job is failed", None, code)
    return Action("record", False, f"{label}: recorded", None, code)


def _isolate_tail(code: int, policy: Policy, gpu: str) -> str:
    if policy.admin_resume:
        check = ("check the slot and the power cable" if code == BUS_FALL_CODE
                 else "check the card")
        return f"{check}, then `nebula gpu resume {gpu}`"
    return "its jobs are checkpointed and requeued; it returns when its self-test passes"


# --- throttling and the health score (R19) -------------------------------------------------------

#: R19: a card hotter than the policy's ``hot_c`` (nodes.yaml ``scheduler.hot_c``) …
#: … that is mostly idle (utilisation below this %) …
LOW_UTIL_PCT = 30.0
#: … and clocks its SMs below their base clock is throttling for heat, not working hard.


#: The driver's own clock-event reasons (NVML) that mean "slowed down for heat".
THERMAL_REASONS = frozenset({"hw_thermal_slowdown", "sw_thermal_slowdown"})


def thermal_slowdown(reading: GpuReading) -> bool:
    """Whether the driver itself says the card is slowed down for heat (NVML's reasons)."""
    return bool(THERMAL_REASONS.intersection(reading.throttle_reasons or ()))


def is_throttling(reading: GpuReading, base_sm_clock_mhz: float | None, hot_c: float,
                  low_util_pct: float = LOW_UTIL_PCT) -> bool:
    """R19: the driver reports a thermal slowdown, or (where it does not say) the card is
    hot, has little work and clocks below its base. A missing reading is never throttling.

    One episode is one event: count it when this turns true for a GPU, not every probe.
    """
    if thermal_slowdown(reading):
        return True
    temp, util, clock = reading.temperature_c, reading.utilization_pct, reading.sm_clock_mhz
    if temp is None or util is None or clock is None or base_sm_clock_mhz is None:
        return False
    return temp > hot_c and util < low_util_pct and clock < base_sm_clock_mhz


#: A fresh throttling event takes this fraction off the score (one event: 1.0 -> 0.85) …
PENALTY = 0.15
#: … and its effect halves every hour: a node recovers within a few hours of quiet.
HALF_LIFE_S = 3600.0
#: The score never falls below this: a struggling node still ranks, last.
FLOOR = 0.1


def health_score(events: Sequence[float], now: float, half_life_s: float = HALF_LIFE_S,
                 penalty: float = PENALTY, floor: float = FLOOR) -> float:
    """A node's health in [floor, 1] from the times of its throttling events.

    Each event multiplies the score by ``1 - penalty * 2**(-age / half_life_s)``: three
    fresh events give 0.61, one an hour old 0.925. Events "in the future" (clock skew)
    count as fresh.
    """
    score = 1.0
    for moment in events:
        age = max(0.0, now - moment)
        score *= 1.0 - penalty * 0.5 ** (age / half_life_s)
    return min(1.0, max(floor, score))


def forget_before(now: float, half_life_s: float = HALF_LIFE_S, penalty: float = PENALTY,
                  negligible: float = 1e-3) -> float:
    """The time before which events change the score by less than ``negligible`` each:
    the caller may drop them."""
    return now - half_life_s * math.log2(penalty / negligible)


# --- self-test (R17) ----------------------------------------------------------------------------

#: An idle card (its jobs evicted) hotter than this has a cooling problem.
SELFTEST_MAX_TEMP_C = 80.0
#: A card tested while it keeps serving (its jobs running) may run this hot: a laptop 4060
#: under two jobs reads 83 °C, and cards slow themselves down from about 87 °C on; hotter
#: than this is a cooling problem even under load.
SELFTEST_MAX_SERVING_TEMP_C = 90.0


def judge_selftest(result: Mapping[str, Any], serving: bool = False) -> tuple[bool, str]:
    """Pass or fail, and a sentence, for the node's self-test output (``serving``: the card
    keeps its jobs during the test, so its temperature is judged as a busy card's)::

        {"smi_ok": bool, "smi_error": str,            # nvidia-smi -i GPU answered
         "temperature_c": float | None,               # read by that query
         "memory_test": {"ok": bool, "detail": str} | None,    # None: none available
         "dcgm": {"ran": bool, "ok": bool, "detail": str}}     # dcgmi diag -r 1

    A missing part counts as not run; a tool that could not read the GPU fails the test.
    """
    if not result.get("smi_ok"):
        lines = (result.get("smi_error") or "").strip().splitlines()
        error = lines[0] if lines else "no answer"
        return False, f"self-test failed: nvidia-smi could not read the GPU ({error})"
    notes = []
    temp = result.get("temperature_c")
    if temp is None:
        notes.append(f"temperature {NOT_AVAILABLE}")
    elif temp > (limit := SELFTEST_MAX_SERVING_TEMP_C if serving else SELFTEST_MAX_TEMP_C):
        return False, (f"self-test failed: {temp:.0f} °C {'while serving' if serving else 'while idle'}"
                       f" is above {limit:.0f} °C; check the fans and the airflow")
    else:
        notes.append(f"{temp:.0f} °C")
    memory = result.get("memory_test")
    if memory is None:
        notes.append("no memory test available")
    elif not memory.get("ok"):
        return False, f"self-test failed: memory test: {memory.get('detail') or 'failed'}"
    else:
        notes.append("memory test ok")
    dcgm = result.get("dcgm") or {}
    if not dcgm.get("ran"):
        notes.append("dcgmi diag not available")
    elif not dcgm.get("ok"):
        return False, f"self-test failed: dcgmi diag -r 1: {dcgm.get('detail') or 'failed'}"
    else:
        notes.append("dcgmi diag -r 1 passed")
    return True, "self-test passed: nvidia-smi answered, " + ", ".join(notes)
