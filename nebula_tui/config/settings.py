"""The optional ``scheduler:``, ``health:``, ``limits:`` and ``accounting:`` sections of
nodes.yaml, validated and typed (``notify:`` is ``notify.py``'s), and the value readers
those builders share.

Each builder takes the section as plain data (what YAML gave) and returns its settings,
or raises :class:`SettingError`: a sentence naming the key, and the key's path in the
section (``cluster.py`` turns that into the file and line of the key).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from ..model import VENDORS
from ..scheduler import fairshare
from ..scheduler.health import DEFAULT_POLICIES, Policy, policies_from_config
from ..scheduler.snapshot import SchedulerConfig
from ..units import parse_duration_s, parse_size_mb

_WEIGHTS = {"hot": "w_hot", "load": "w_load", "pack": "w_pack", "health": "w_health",
            "power": "w_power", "topology": "w_topology", "fit": "w_fit"}
DEFAULT_ISOLATION_GRACE_S = 15.0


class SettingError(ValueError):
    """A bad value in a section; ``keys`` is where it is under the section, e.g.
    ``("weights", "hot")`` for ``scheduler.weights.hot``."""

    def __init__(self, message: str, *keys: str) -> None:
        super().__init__(message)
        self.keys = keys


#: ``scheduler.quota_mode``: past their quota a user's jobs run on idle cards only as
#: preemptible work ("scavenge"), or wait until the quota is raised ("refuse")
QUOTA_MODES = ("scavenge", "refuse")

@dataclass(frozen=True)
class SchedulerSettings:
    """``scheduler:`` — scoring weights (R10), quota (R7) and fair-share decay (R6)."""

    config: SchedulerConfig = field(default_factory=SchedulerConfig)
    quota_gpu_hours: float = fairshare.DEFAULT_QUOTA_GPU_HOURS
    half_life_s: float | None = fairshare.DEFAULT_HALF_LIFE_S
    #: the vendor of a job that names none (a mixed lab whose code is mostly CUDA says
    #: "nvidia"); None: any card
    default_vendor: str | None = None

    @property
    def charge_reference_mb(self) -> int:
        """The card a slice's gigabytes are charged against (the scheduler's, so that the
        forecast charges as the store does)."""
        return self.config.charge_reference_mb


@dataclass(frozen=True)
class HealthSettings:
    """``health:`` — XID policies (R16), isolation grace (R17), the self-test command."""

    policies: dict[int, Policy] = field(default_factory=lambda: dict(DEFAULT_POLICIES))
    isolation_grace_s: float = DEFAULT_ISOLATION_GRACE_S
    selftest_command: str | None = None


#: ``limits.log_max`` unless nodes.yaml says otherwise: 10 GB
DEFAULT_LOG_MAX_MB = 10 * 1024


@dataclass(frozen=True)
class LimitsSettings:
    """``limits:`` — what running jobs are held to: time limits (R29), the memory guard
    (R28), idle cards (R30). Durations in seconds; None = off."""

    #: a job submitted without --time gets this one; None: unbounded
    default_time_s: float | None = None
    #: a longer --time is refused at submit; None: any
    max_time_s: float | None = None
    #: what happens to a job holding more than its reservation on a shared card, once it
    #: has for ``memory_grace_s``: "warn" (the event only), "kill", or "requeue"
    memory_overuse: str = "kill"
    memory_grace_s: float = 30.0
    #: a job whose GPUs all read ~0% for this long is marked idle and warned
    idle_after_s: float | None = 2 * 3600.0
    #: then, ``idle_grace_s`` after the warning: "warn" (nothing more) or "cancel"
    idle_action: str = "warn"
    idle_grace_s: float = 1800.0
    #: --service jobs are idle by nature (waiting for requests): exempt unless True
    idle_services: bool = False
    #: a job's log on its node stops growing at this size (MiB), with a line saying so, and
    #: the job runs on (its output still reaches its terminal); None: no cap
    log_max_mb: int | None = DEFAULT_LOG_MAX_MB
    #: GPU-hours of bookings (``nebula reserve``) a user who is not an admin may make a
    #: month; 0: only admins book
    booking_gpu_hours: float = 0.0


def _number(section: str, keys: tuple[str, ...], value: Any, minimum: float = 0) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < minimum:
        raise SettingError(f"{'.'.join((section, *keys))} must be a number ≥ {minimum:g}, "
                           f"found {value!r}", *keys)
    return float(value)


def as_mapping(what: str, value: Any, *keys: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SettingError(f"{what} must be a mapping of 'key: value' lines", *keys)
    return value


def check_known(what: str, data: dict, known: tuple[str, ...], *keys: str) -> None:
    for key in data:
        if key not in known:
            raise SettingError(f"{what}: unknown key {key!r}; known keys: {', '.join(known)}",
                               *keys, str(key))


def _duration(section: str, key: str, value: Any, bare: str | None = "s") -> float:
    """A timing of nodes.yaml: a bare number is seconds, or (``bare=None``, the job time
    limits a Slurm admin would read as minutes) refused as ambiguous."""
    try:
        return parse_duration_s(value, bare)
    except ValueError as err:
        raise SettingError(f"{section}.{key}: {err}", key) from None


def scheduler_settings(value: Any) -> SchedulerSettings:
    data = as_mapping("scheduler", value)
    check_known("scheduler", data, ("weights", "hot_c", "min_health_score", "service_spare",
                               "quota_gpu_hours", "half_life", "default_vendor", "preemptible_charge",
                               "preemptible_in_quota", "quota_mode", "charge_reference",
                               "gang_age", "service_share"))
    weights = as_mapping("scheduler.weights", data.get("weights"), "weights")
    check_known("scheduler.weights", weights, tuple(_WEIGHTS), "weights")
    config = replace(SchedulerConfig(), **{_WEIGHTS[k]: _number("scheduler", ("weights", k), v)
                                           for k, v in weights.items()})
    if "hot_c" in data:
        config = replace(config, hot_c=_number("scheduler", ("hot_c",), data["hot_c"]))
    if "min_health_score" in data:
        config = replace(config, min_health_score=_number("scheduler", ("min_health_score",),
                                                          data["min_health_score"]))
    if "service_spare" in data:
        try:
            config = replace(config, service_spare_mb=parse_size_mb(str(data["service_spare"])))
        except ValueError as err:
            raise SettingError(f"scheduler.service_spare: {err}", "service_spare") from None
    if "preemptible_charge" in data:
        charge = _number("scheduler", ("preemptible_charge",), data["preemptible_charge"])
        if charge > 1:
            raise SettingError(f"scheduler.preemptible_charge must be a fraction from 0 to 1, found {charge:g}",
                               "preemptible_charge")
        config = replace(config, preemptible_charge=charge)
    if "preemptible_in_quota" in data:
        if not isinstance(data["preemptible_in_quota"], bool):
            raise SettingError("scheduler.preemptible_in_quota must be true or false, found "
                               f"{data['preemptible_in_quota']!r}", "preemptible_in_quota")
        config = replace(config, preemptible_in_quota=data["preemptible_in_quota"])
    if "quota_mode" in data:
        if data["quota_mode"] not in QUOTA_MODES:
            raise SettingError(f"scheduler.quota_mode must be one of {', '.join(QUOTA_MODES)}, found "
                               f"{data['quota_mode']!r}", "quota_mode")
        config = replace(config, quota_mode=data["quota_mode"])
    if "service_share" in data:
        share = _number("scheduler", ("service_share",), data["service_share"])
        if not 0 < share <= 1:
            raise SettingError("scheduler.service_share must be a fraction above 0, at most 1 (1: no bound), "
                               f"found {share:g}", "service_share")
        config = replace(config, service_share=share)
    if "gang_age" in data:
        age = data["gang_age"]
        config = replace(config, gang_age_s=None if age in (0, "0", None, "never")
                         else _duration("scheduler", "gang_age", age))
    settings = SchedulerSettings(config=config)
    if "quota_gpu_hours" in data:
        settings = replace(settings, quota_gpu_hours=_number("scheduler", ("quota_gpu_hours",),
                                                             data["quota_gpu_hours"]))
    if data.get("default_vendor") is not None:
        settings = replace(settings, default_vendor=_choice("scheduler", "default_vendor",
                                                            data["default_vendor"], VENDORS))
    if "charge_reference" in data:
        try:
            settings = replace(settings, config=replace(settings.config,
                                                        charge_reference_mb=parse_size_mb(str(data["charge_reference"]))))
        except ValueError as err:
            raise SettingError(f"scheduler.charge_reference: {err}", "charge_reference") from None
    if "half_life" in data:
        half_life = data["half_life"]
        seconds = None if half_life in (0, "0", None, "never") else _duration("scheduler", "half_life", half_life)
        settings = replace(settings, half_life_s=seconds)
    return settings


def health_settings(value: Any) -> HealthSettings:
    data = as_mapping("health", value)
    check_known("health", data, ("xid_policies", "isolation_grace", "selftest_command"))
    settings = HealthSettings()
    if "xid_policies" in data:
        policies = as_mapping("health.xid_policies", data["xid_policies"], "xid_policies")
        try:
            settings = replace(settings, policies=policies_from_config(policies))
        except ValueError as err:
            raise SettingError(str(err), "xid_policies") from None
    if "isolation_grace" in data:
        settings = replace(settings, isolation_grace_s=_duration("health", "isolation_grace",
                                                                 data["isolation_grace"]))
    if data.get("selftest_command") is not None:
        if not isinstance(data["selftest_command"], str):
            raise SettingError("health.selftest_command must be a command line (text)",
                               "selftest_command")
        settings = replace(settings, selftest_command=data["selftest_command"])
    return settings


_OVERUSE_ACTIONS = ("warn", "kill", "requeue")
_IDLE_ACTIONS = ("warn", "cancel")


def limits_settings(value: Any) -> LimitsSettings:
    data = as_mapping("limits", value)
    check_known("limits", data, ("default_time", "max_time", "memory_overuse", "memory_grace",
                            "idle_after", "idle_action", "idle_grace", "idle_services", "log_max",
                            "booking_gpu_hours"))
    settings = LimitsSettings()
    for key, attr in (("default_time", "default_time_s"), ("max_time", "max_time_s"),
                      ("idle_after", "idle_after_s")):
        if key in data:
            off = data[key] in (None, 0, "0", "never", "off")
            # default_time/max_time are what --time is held to: a bare number means minutes
            # there but seconds elsewhere in this file, so it must carry its unit.
            bare = None if key != "idle_after" else "s"
            settings = replace(settings, **{attr: None if off else _duration("limits", key, data[key], bare)})
    for key, attr in (("memory_grace", "memory_grace_s"), ("idle_grace", "idle_grace_s")):
        if key in data:
            settings = replace(settings, **{attr: _duration("limits", key, data[key])})
    for key, choices in (("memory_overuse", _OVERUSE_ACTIONS), ("idle_action", _IDLE_ACTIONS)):
        if key in data:
            settings = replace(settings, **{key: _choice("limits", key, data[key], choices)})
    if "idle_services" in data:
        if not isinstance(data["idle_services"], bool):
            raise SettingError(f"limits.idle_services must be true or false, "
                               f"found {data['idle_services']!r}", "idle_services")
        settings = replace(settings, idle_services=data["idle_services"])
    if "log_max" in data:
        settings = replace(settings, log_max_mb=_log_max(data["log_max"]))
    if "booking_gpu_hours" in data:
        settings = replace(settings, booking_gpu_hours=_number("limits", ("booking_gpu_hours",),
                                                               data["booking_gpu_hours"]))
    if settings.default_time_s and settings.max_time_s and settings.default_time_s > settings.max_time_s:
        raise SettingError("limits.default_time is longer than limits.max_time; shorten it",
                           "default_time")
    return settings


def _log_max(value: Any) -> int | None:
    if value is None or value is False or value in ("off", "none"):  # YAML reads off as false
        return None
    try:
        if value is True or not isinstance(value, (str, int, float)):
            raise ValueError(f"found {value!r}")
        return parse_size_mb(str(value))
    except ValueError as err:
        raise SettingError(f"limits.log_max must be a size such as 10G, or off ({err})",
                           "log_max") from None


#: Who sees whose ended jobs (``accounting.history``).
HISTORY_VISIBILITY = ("open", "own")


@dataclass(frozen=True)
class AccountingSettings:
    """``accounting:`` — who sees whose history, and how often GPU readings are kept.

    ``history``: ``open`` (the default, as in most labs): everyone sees every ended job;
    ``own``: users see their own, admins everyone's. ``telemetry_every_s``: one sample of
    each GPU's readings this often (R18); history and reports are made of them.
    """

    history: str = "open"
    telemetry_every_s: float = 30.0


def accounting_settings(value: Any) -> AccountingSettings:
    data = as_mapping("accounting", value)
    check_known("accounting", data, ("history", "telemetry_every"))
    settings = AccountingSettings()
    if "history" in data:
        if data["history"] not in HISTORY_VISIBILITY:
            raise SettingError(f"accounting.history must be one of "
                               f"{', '.join(HISTORY_VISIBILITY)}, found {data['history']!r}",
                               "history")
        settings = replace(settings, history=data["history"])
    if "telemetry_every" in data:
        settings = replace(settings, telemetry_every_s=_duration("accounting", "telemetry_every",
                                                                 data["telemetry_every"]))
    return settings


def _choice(section: str, key: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise SettingError(f"{section}.{key} must be one of {', '.join(choices)}, "
                           f"found {value!r}", key)
    return value
