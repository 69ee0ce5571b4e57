"""Every input has a size and a depth: what is over them gets one line saying so, never a
traceback, a dropped connection or minutes of work."""

from __future__ import annotations

import pytest

from nebula_tui.config import ConfigError, load_config, parse_config


def test_deeply_nested_yaml_is_one_line_not_a_recursion_error():
    with pytest.raises(ConfigError) as refused:
        parse_config("cluster:\n  name: " + "[" * 100_000 + "]" * 100_000 + "\n")
    assert str(refused.value) == "<string>:2: nested deeper than 20 levels; a cluster file needs four"


def test_aliases_that_stand_for_billions_of_values_are_refused():
    lines = ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 10)}]" for i in range(9)]
    with pytest.raises(ConfigError, match="more than 200000 values"):
        parse_config("\n".join(lines) + "\n")


def test_a_50_mb_cluster_file_is_refused_before_it_is_read(tmp_path):
    big = tmp_path / "nodes.yaml"
    with open(big, "wb") as out:
        out.truncate(50 << 20)
    with pytest.raises(ConfigError) as refused:
        load_config(big)
    assert "the file is 50.0 MB; a cluster file holds at most 1 MB" in str(refused.value)


def test_a_cluster_of_thousands_of_nodes_still_loads(tmp_path):
    nodes = "".join(f"  - {{name: node{i:05d}, host: 10.0.{i // 250}.{i % 250}}}\n" for i in range(5000))
    path = tmp_path / "nodes.yaml"
    path.write_text(f"cluster: {{known_hosts: {tmp_path}/known_hosts}}\nnodes:\n{nodes}")
    assert len(load_config(path).nodes) == 5000
