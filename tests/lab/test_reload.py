"""SIGHUP (`systemctl reload nebula`): the head reads nodes.yaml again and its log says what
changed; a file with a mistake is refused with file:line, and the running one stays."""

from __future__ import annotations

import re
import signal

import pytest
import yaml
from labkit.harness import wait_for
from support.labfixtures import serving


@pytest.fixture(scope="module")
def head(openssh_lab, tmp_path_factory):
    config = tmp_path_factory.mktemp("reload") / "nodes.yaml"
    config.write_text(openssh_lab.config_path.read_text())
    yield from serving(openssh_lab, tmp_path_factory.mktemp("home"), config)


def _hangup_and_read(head, pattern: str) -> re.Match:
    out = head.home / "serve.out"
    seen = len(out.read_text())
    head.process.send_signal(signal.SIGHUP)
    return wait_for(lambda: re.search(pattern, out.read_text()[seen:]), 20,
                    what=f"{pattern!r} in the service's log")


def test_a_hangup_applies_a_changed_file_and_says_what_changed(head):
    config = head.env["NEBULA_CONFIG"]
    doc = yaml.safe_load(open(config).read())
    doc["nodes"] = [dict(n, drained=True) if n["name"] == "node02" else n
                    for n in doc["nodes"] if n["name"] != "node03"]
    doc["limits"] = {"log_max": "5G"}
    open(config, "w").write(yaml.safe_dump(doc))
    said = _hangup_and_read(head, r"reloaded \S+: (.*)")
    assert said.group(1) == "node03 removed; node02 drained; limits changed", said.group(0)
    nodes = {n["name"]: n for n in head.call("status")["nodes"]}
    assert "node03" not in nodes and nodes["node02"]["drained"]
    assert head.process.poll() is None


def test_a_hangup_refuses_a_broken_file_and_keeps_the_running_one(head):
    config = head.env["NEBULA_CONFIG"]
    with open(config, "a") as f:
        f.write("cluster: [twice\n")
    said = _hangup_and_read(head, r"refused ([^:\s]+):(\d+)(:\d+)?: .*; the running one stays")
    assert said.group(1) == config
    assert head.process.poll() is None
    assert {n["name"] for n in head.call("status")["nodes"]} == {"node01", "node02"}


def test_a_hangup_adds_a_node_and_applies_a_changed_quota(head, openssh_lab):
    config = head.env["NEBULA_CONFIG"]
    doc = yaml.safe_load(open(config).read().replace("cluster: [twice\n", ""))  # the fix
    lab_nodes = yaml.safe_load(openssh_lab.config_path.read_text())["nodes"]
    names = {n["name"] for n in doc["nodes"]}
    new = next(n for n in lab_nodes if n["name"] not in names)  # one the first test removed
    doc["nodes"].append(new)
    doc.setdefault("scheduler", {})["quota_gpu_hours"] = 123
    open(config, "w").write(yaml.safe_dump(doc))
    said = _hangup_and_read(head, r"reloaded \S+: (.*)")
    assert said.group(1) == f"{new['name']} added; scheduler changed", said.group(0)
    wait_for(lambda: {n["name"]: n for n in head.call("status")["nodes"]}.get(new["name"], {})
             .get("state") == "up", 30, what=f"{new['name']} up")
    assert head.call("why", user="nobody-yet")["why"]["share"]["quota_gpu_hours"] == 123
