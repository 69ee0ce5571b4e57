"""nodes.yaml loading: the example, defaults, paths, find_config, and one-line errors."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from nebula_tui.config import cluster
from nebula_tui.config.cluster import (ClusterConfig, current_user, empty_config, find_config, load_config,
                                       parse_config)
from nebula_tui.config.nodes import NodeConfig
from nebula_tui.config.settings import HealthSettings, LimitsSettings, SchedulerSettings
from nebula_tui.model import ConfigError

REPO = Path(__file__).resolve().parents[2]
HOME = os.path.expanduser("~")


def test_example_loads() -> None:
    cfg = load_config(REPO / "nodes.yaml")
    assert cfg.path == REPO / "nodes.yaml"
    assert len(cfg.nodes) == 4
    assert len({n.name for n in cfg.nodes}) == 4
    assert any(n.drained for n in cfg.nodes)
    assert {n.name: n.power_budget_w for n in cfg.nodes if n.power_budget_w} == {"node01": 1400}
    assert any("PATH" in n.env_dict for n in cfg.nodes)
    assert cfg.run_as in ("login", "submitter")
    for node in cfg.nodes:
        assert os.path.isabs(node.known_hosts)
        assert node.identity is None or os.path.isabs(node.identity)


def test_defaults() -> None:
    cfg = parse_config("nodes:\n  - name: n1\n    host: 10.0.0.1\n")
    assert cfg.path is None
    assert (cfg.name, cfg.probe_interval, cfg.missed_probes) == ("lab", 5.0, 3)
    assert (cfg.connect_timeout, cfg.command_timeout) == (10.0, 30.0)
    assert (cfg.admins, cfg.run_as) == ((), "login")
    node = cfg.node("n1")
    assert node == NodeConfig(
        name="n1",
        host="10.0.0.1",
        port=22,
        user=current_user(),
        identity=None,
        known_hosts=os.path.join(HOME, ".ssh", "known_hosts"),
        env=(),
        drained=False,
    )
    with pytest.raises(KeyError):
        cfg.node("nope")


@pytest.mark.parametrize("text", ["", "nodes: []\n", "nodes:\n", "cluster:\nnodes:\n"])
def test_no_nodes_is_allowed(text: str) -> None:
    cfg = parse_config(text)
    assert cfg.nodes == ()
    assert cfg.name == empty_config().name


def test_empty_config() -> None:
    cfg = empty_config()
    assert isinstance(cfg, ClusterConfig)
    assert cfg.path is None and cfg.nodes == () and cfg.probe_interval == 5.0


def test_a_file_that_leaves_every_key_out_gets_each_fields_default() -> None:
    """The dataclasses' fields are where the defaults are written: what a file leaves out
    (or empty) is theirs, and an explicit value equal to one is the same config."""
    assert parse_config("") == parse_config("cluster:\n") == ClusterConfig()
    cfg = parse_config("cluster:\n  run_as:\n  probe_interval:\n"
                       "nodes:\n  - {name: n1, host: h, port: , drained: , warmup: }\n")
    assert cfg == ClusterConfig(nodes=(NodeConfig(name="n1", host="h", user=current_user(), identity=None,
                                                  known_hosts=cfg.known_hosts),))
    spelled = parse_config("cluster:\n  run_as: login\n  commands_visible_to: owner\n  node_lease: 600\n"
                           "nodes:\n  - {name: n1, host: h, port: 22, drained: false}\n")
    assert spelled == cfg


def test_objects_are_frozen_and_hashable() -> None:
    cfg = parse_config("nodes:\n  - {name: n1, host: h, env: {A: b}}\n")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.nodes[0].port = 23  # type: ignore[misc]
    hash(cfg)
    assert cfg.nodes[0].env_dict == {"A": "b"}


def test_cluster_values_and_overrides(tmp_path: Path) -> None:
    text = """\
cluster:
  name: vis
  user: nebula
  identity: keys/head
  known_hosts: ~/kh
  probe_interval: 2.5
  missed_probes: 5
  connect_timeout: 3
  command_timeout: 60
  admins: [alice, bob]
  run_as: submitter
nodes:
  - name: a
    host: h1
  - name: b.2
    host: h2
    port: 2222
    user: other
    identity: /abs/key
    known_hosts: ./kh2
    env:
      PATH: /usr/local/nvidia/bin:/usr/bin
      CUDA_VISIBLE_DEVICES: 0
    drained: true
"""
    path = tmp_path / "conf" / "nodes.yaml"
    path.parent.mkdir()
    path.write_text(text)
    cfg = load_config(path)
    assert (cfg.name, cfg.probe_interval, cfg.missed_probes) == ("vis", 2.5, 5)
    assert (cfg.connect_timeout, cfg.command_timeout) == (3.0, 60.0)
    assert (cfg.admins, cfg.run_as) == (("alice", "bob"), "submitter")
    a, b = cfg.nodes
    assert a.user == "nebula"
    assert a.identity == str(tmp_path / "conf" / "keys" / "head")
    assert a.known_hosts == os.path.join(HOME, "kh")
    assert (b.port, b.user, b.identity, b.drained) == (2222, "other", "/abs/key", True)
    assert b.known_hosts == str(tmp_path / "conf" / "kh2")
    # a number written as an env value keeps its spelling
    assert b.env == (("PATH", "/usr/local/nvidia/bin:/usr/bin"), ("CUDA_VISIBLE_DEVICES", "0"))


def test_relative_paths_follow_the_file_not_the_cwd(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "nodes.yaml").write_text("cluster:\n  identity: id_key\n")
    monkeypatch.chdir(tmp_path)
    cfg = load_config("etc/nodes.yaml")
    assert cfg.identity == str(tmp_path / "etc" / "id_key")
    assert cfg.path == tmp_path / "etc" / "nodes.yaml"


# (name, text, line, fragments that must all appear in the message)
ERRORS = [
    (
        "bad port",
        "nodes:\n  - name: n1\n    host: h\n    port: abc\n",
        4,
        ["node 'n1'", "port", "integer", "1 to 65535", "string 'abc'"],
    ),
    (
        "port out of range",
        "nodes:\n  - {name: n1, host: h, port: 70000}\n",
        2,
        ["1 to 65535", "70000"],
    ),
    (
        "missing host",
        "nodes:\n  - name: n1\n    port: 22\n",
        2,
        ["node 'n1'", "missing required key 'host'"],
    ),
    ("missing name", "nodes:\n  - host: h\n", 2, ["node #1", "missing required key 'name'"]),
    (
        "duplicate node name",
        "nodes:\n  - name: n1\n    host: a\n  - name: n1\n    host: b\n",
        4,
        ["duplicate node name 'n1'", "line 2", "unique"],
    ),
    (
        "duplicate key",
        "nodes:\n  - name: n1\n    host: a\n    port: 22\n    port: 23\n",
        5,
        ["duplicate key 'port'", "line 4"],
    ),
    (
        "duplicate top-level key",
        "nodes: []\ncluster: {}\nnodes: []\n",
        3,
        ["duplicate key 'nodes'", "line 1"],
    ),
    (
        "unknown key with suggestion",
        "nodes:\n  - name: n1\n    host: a\n    prot: 22\n",
        4,
        ["unknown key 'prot'", "did you mean 'port'", "known keys: name, host, port"],
    ),
    (
        "unknown cluster key",
        "cluster:\n  probe_intervall: 3\n",
        2,
        ["cluster", "did you mean 'probe_interval'"],
    ),
    (
        "unknown top-level key",
        "node:\n  - name: a\n",
        1,
        ["unknown key 'node'", "did you mean 'nodes'"],
    ),
    (
        "bad env name",
        "nodes:\n  - name: n1\n    host: a\n    env:\n      MY-VAR: x\n",
        5,
        ["env name 'MY-VAR'", "environment variable name"],
    ),
    (
        "env not a mapping",
        "nodes:\n  - name: n1\n    host: a\n    env: [A=b]\n",
        4,
        ["env must be a mapping", "found list"],
    ),
    (
        "env value boolean",
        "nodes:\n  - name: n1\n    host: a\n    env:\n      DEBUG: true\n",
        5,
        ["env DEBUG", "must be a string", "boolean 'true'", "quotes"],
    ),
    ("wrong top-level type", "- name: n1\n  host: a\n", 1, ["must be a mapping", "found list"]),
    ("top-level scalar", "just text\n", 1, ["must be a mapping", "string 'just text'"]),
    ("nodes not a list", "nodes:\n  name: n1\n", 2, ["nodes must be a list", "found mapping"]),
    (
        "negative probe_interval",
        "cluster:\n  probe_interval: -1\n",
        2,
        ["cluster.probe_interval", "> 0", "-1"],
    ),
    ("zero timeout", "cluster:\n  connect_timeout: 0\n", 2, ["connect_timeout", "> 0"]),
    (
        # issue 41: acked ends go no sooner than the oldest backup reaches back
        "job_dir_retention shorter than the backups reach back",
        "cluster:\n  job_dir_retention: 10m\n",
        2,
        ["cluster.job_dir_retention must be at least 6h", "found 600s"],
    ),
    (
        "timeout not a duration",
        "cluster:\n  command_timeout: 30x\n",
        2,
        ["command_timeout must be a duration", "10m", "string '30x'"],
    ),
    (
        "missed_probes float",
        "cluster:\n  missed_probes: 2.5\n",
        2,
        ["integer >= 1", "number '2.5'"],
    ),
    ("missed_probes zero", "cluster:\n  missed_probes: 0\n", 2, ["integer >= 1", "found 0"]),
    ("bad run_as", "cluster:\n  run_as: root\n", 2, ["run_as", "login, submitter", "'root'"]),
    (
        "admins not a list",
        "cluster:\n  admins: alice\n",
        2,
        ["admins must be a list", "string 'alice'"],
    ),
    (
        "drained not bool",
        "nodes:\n  - {name: a, host: h, drained: maybe}\n",
        2,
        ["true or false", "'maybe'"],
    ),
    (
        "limits action unknown",
        "limits:\n  memory_overuse: nuke\n",
        2,
        ["limits.memory_overuse", "warn, kill, requeue", "'nuke'"],
    ),
    (
        "log cap not a size",
        "limits:\n  idle_action: warn\n  log_max: lots\n",
        3,
        ["limits.log_max must be a size such as 10G, or off", "'lots' is not a size"],
    ),
    (
        "limits default longer than max",
        "limits: {default_time: 3d, max_time: 1d}\n",
        1,
        ["default_time is longer than limits.max_time"],
    ),
    (
        "power budget not a number",
        "nodes:\n  - {name: a, host: h, power_budget_w: lots}\n",
        2,
        ["power_budget_w"],
    ),
    ("bad node name", "nodes:\n  - name: Node_1\n    host: h\n", 2, ["'Node_1'", "lowercase"]),
    ("node name too long", f"nodes:\n  - name: {'a' * 64}\n    host: h\n", 2, ["at most 63"]),
    ("host as option", "nodes:\n  - name: a\n    host: -oProxyCommand=x\n", 3, ["not a hostname"]),
    ("host with port", "nodes:\n  - name: a\n    host: 'h 22'\n", 3, ["not a hostname", "port:"]),
    ("user injection", "cluster:\n  user: 'a;rm'\n", 2, ["Unix user name", "'a;rm'"]),
    ("cluster is a list", "cluster: [a]\n", 1, ["cluster must be a mapping", "found list"]),
]


@pytest.mark.parametrize(
    ("text", "line", "fragments"),
    [pytest.param(t, ln, f, id=name) for name, t, ln, f in ERRORS],
)
def test_errors_name_the_line_and_the_fix(text: str, line: int, fragments: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(text, "lab/nodes.yaml")
    message = str(info.value)
    assert message.startswith(f"lab/nodes.yaml:{line}: "), message
    assert info.value.line == line and info.value.path == "lab/nodes.yaml"
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, (fragment, message)


@pytest.mark.parametrize(
    ("text", "line", "column", "fragment"),
    [
        ("cluster:\n  name: [lab\nnodes: []\n", 3, 6, "expected ',' or ']'"),
        ("nodes:\n  - name: a: b\n    host: h\n", 2, 12, "put quotes around"),
        ("nodes:\n  - name: a\n   host: h\n", 3, 4, "check the indentation"),
        ("cluster:\n\tname: x\n", 2, 1, "indent with spaces, not tabs"),
        ("nodes: []\n---\nnodes: []\n", 2, 1, "expected a single document"),
    ],
)
def test_yaml_syntax_error(text: str, line: int, column: int, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(text, "n.yaml")
    message = str(info.value)
    assert message.startswith(f"n.yaml:{line}:{column}: YAML syntax error: "), message
    assert fragment in message and "\n" not in message


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^.*missing\.yaml: cannot read: No such file$"):
        load_config(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="cannot read: Is a directory"):
        load_config(tmp_path)
    bad = tmp_path / "bin.yaml"
    bad.write_bytes(b"nodes: []\n\xff\xfe\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config(bad)


# ----------------------------------------------------------------------------- find_config


@pytest.fixture
def places(tmp_path: Path, monkeypatch) -> dict[str, Path]:
    """Four candidate locations, none existing yet; $NEBULA_CONFIG unset."""
    monkeypatch.delenv("NEBULA_CONFIG", raising=False)
    home = tmp_path / "home"
    home.mkdir()
    system = tmp_path / "etc" / "nebula" / "nodes.yaml"
    system.parent.mkdir(parents=True)
    monkeypatch.setattr(cluster, "SYSTEM_CONFIG", system)
    return {
        "explicit": tmp_path / "explicit.yaml",
        "env": tmp_path / "env.yaml",
        "home": home / "nodes.yaml",
        "system": system,
    }


@pytest.mark.parametrize(
    ("present", "expected"),
    [
        (["explicit", "env", "home", "system"], "explicit"),
        (["env", "home", "system"], "env"),
        (["home", "system"], "home"),
        (["system"], "system"),
        ([], None),
    ],
)
def test_find_config_order(places, monkeypatch, present: list[str], expected: str | None) -> None:
    for key in present:
        places[key].write_text("nodes: []\n")
    if "env" in present:
        monkeypatch.setenv("NEBULA_CONFIG", str(places["env"]))
    explicit = str(places["explicit"]) if "explicit" in present else None
    found = find_config(explicit, places["home"].parent)
    assert found == (places[expected] if expected else None)


def test_find_config_ignores_cwd(places, monkeypatch, tmp_path: Path) -> None:
    (tmp_path / "nodes.yaml").write_text("nodes: []\n")
    monkeypatch.chdir(tmp_path)
    assert find_config(None, places["home"].parent) is None


def test_find_config_missing_explicit_or_env_is_an_error(places, monkeypatch) -> None:
    places["home"].write_text("nodes: []\n")
    with pytest.raises(ConfigError, match="--config"):
        find_config(str(places["explicit"]), places["home"].parent)
    monkeypatch.setenv("NEBULA_CONFIG", str(places["env"]))
    with pytest.raises(ConfigError, match="NEBULA_CONFIG"):
        find_config(None, places["home"].parent)


def test_every_duration_is_written_the_same_way_as_on_the_command_line() -> None:
    cfg = parse_config("cluster:\n  node_lease: 10m\n  probe_interval: 2.5\n"
                       "  command_timeout: 90s\nhealth:\n  isolation_grace: 10m\n")
    assert cfg.node_lease == cfg.health.isolation_grace_s == 600.0
    assert (cfg.probe_interval, cfg.command_timeout) == (2.5, 90.0)


def test_the_scheduler_and_health_sections_are_typed_with_their_defaults() -> None:
    cfg = parse_config("cluster:\n  name: t\n")
    assert isinstance(cfg.scheduler, SchedulerSettings) and isinstance(cfg.health, HealthSettings)
    assert cfg.scheduler == SchedulerSettings() and cfg.health.isolation_grace_s == 15.0


def test_a_bad_value_deep_in_a_section_names_its_own_line() -> None:
    text = "scheduler:\n  quota_gpu_hours: 10\n  weights:\n    load: 1\n    hot: lots\n"
    with pytest.raises(ConfigError) as info:
        parse_config(text, "nodes.yaml")
    assert str(info.value).startswith("nodes.yaml:5: scheduler.weights.hot must be a number")


def test_limits_section() -> None:
    cfg = parse_config("limits:\n  default_time: 2h\n  max_time: 7d\n  memory_overuse: requeue\n"
                       "  idle_after: 0\n  idle_action: cancel\n  idle_services: true\n", "nodes.yaml")
    limits = cfg.limits
    assert (limits.default_time_s, limits.max_time_s, limits.memory_overuse) == (7200.0, 7 * 86400.0, "requeue")
    assert limits.idle_after_s is None and limits.idle_action == "cancel" and limits.idle_services
    assert parse_config("", "nodes.yaml").limits.memory_overuse == "kill"
    assert parse_config("", "nodes.yaml").limits.log_max_mb == 10 * 1024  # a job's log: 10 GB
    assert parse_config("limits: {log_max: 512M}\n", "nodes.yaml").limits.log_max_mb == 512
    assert parse_config("limits: {log_max: off}\n", "nodes.yaml").limits.log_max_mb is None
    assert isinstance(parse_config("cluster:\n  name: t\n").limits, LimitsSettings)


def test_a_bad_limits_value_names_its_line() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config("cluster:\n  name: t\nlimits:\n  max_time: 7d\n  idle_action: shout\n", "nodes.yaml")
    assert str(info.value).startswith("nodes.yaml:5: limits.idle_action must be one of warn, cancel")


def test_default_vendor() -> None:
    assert parse_config("", "nodes.yaml").scheduler.default_vendor is None
    assert parse_config("scheduler:\n  default_vendor: nvidia\n", "nodes.yaml").scheduler.default_vendor == "nvidia"
    with pytest.raises(ConfigError) as info:
        parse_config("cluster:\n  name: t\nscheduler:\n  default_vendor: nvdia\n", "nodes.yaml")
    assert str(info.value).startswith(
        "nodes.yaml:4: scheduler.default_vendor must be one of nvidia, amd, intel, ascend")
