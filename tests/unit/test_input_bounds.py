"""Every input has a size and a depth: what is over them gets one line saying so, never a
traceback, a dropped connection or minutes of work."""

from __future__ import annotations

import json
import socket

import pytest

from nebula_tui.api import ApiError
from nebula_tui.config.cluster import load_config, parse_config
from nebula_tui.model import ConfigError
from labkit.harness import HeadProcess
from support.head import submit


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


# ------------------------------------------------------------------ requests to a head
def ask(head, raw: bytes) -> dict:
    """Send one raw request line on a fresh connection; the reply, as JSON."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(30)
        s.connect(str(head.socket))
        try:
            s.sendall(raw + b"\n")
        except BrokenPipeError:
            pass  # the head refused it before reading it whole, and said why
        return json.loads(s.makefile("rb").readline())


def test_hostile_requests_get_one_line_each_on_a_connection_that_stays(head):
    hostile = [
        (b'{"op": "job", "job": "\\ud800"}', "lone surrogate"),
        (b'{"op": "submit", "command": ["echo", "\\udfff"]}', "lone surrogate"),
        (b'{"op": "job", "job": 9223372036854775808}', "is not a job id"),
        (b'{"op": "cancel", "job": 18446744073709551616}', "is not a job id"),
        (b'{"op": "job", "job": true}', "is not a job id"),
        (b'[' * 100_000 + b']' * 100_000, "nested deeper than 32 levels"),
        (b'{"op": "submit", "command": ["true"], "x": ' + b'[' * 5000 + b']' * 5000 + b'}', "nested deeper"),
        (b'{"op": "submit", "command": ["true"], "gpu_mem_mb": 1000000000000000000000000000000}', "--gpu-mem"),
        (b'{"op": "submit", "command": ["true"], "gpu_mem_mb": true}', "--gpu-mem"),
        (b'{"op": "submit", "command": ["true"], "time_limit_s": NaN}', "--time"),
        (b'{"op": "submit", "command": ["true"], "time_limit_s": Infinity}', "--time"),
        (b'{"op": "submit", "command": ["true"], "after": [true]}', "--after"),
        (b'{"op": "submit", "command": ["true"], "workdir": "/tmp/a\\u0000b"}', "--workdir"),
        (b'{"op": "submit", "command": ["true", "' + b"x" * 200_000 + b'"]}', "at most 64 KB each"),
        # The requests other work added since: each field bounded the same way.
        (b'{"op": "attach", "job": 9223372036854775808}', "is not a job id"),
        (b'{"op": "attach", "job": true}', "is not a job id"),
        (b'{"op": "attach", "job": 1, "cols": 1e400}', "a terminal size"),
        (b'{"op": "attach", "job": 1, "rank": -1}', "a terminal size"),
        (b'{"op": "report", "since": NaN, "until": 5}', "since must be a time"),
        (b'{"op": "report", "since": 0, "until": Infinity}', "until must be a time"),
        (b'{"op": "job_history", "since": NaN}', "since must be a time"),
        (b'{"op": "job_history", "limit": 100000}', "limit must be a number from 1 to 10000"),
        (b'{"op": "events", "since": -Infinity}', "since must be a time"),
        (b'{"op": "history", "gpu": "x", "since": NaN}', "since must be a number of seconds"),
        (b'{"op": "logs", "job": 1, "offset": 9223372036854775808}', "offset must be"),
        (b'{"op": "logs", "job": 1, "offsets": [true]}', "offsets must be"),
        (b'{"op": "quota", "user": "x", "hours": NaN}', "the quota is"),
        (b'{"op": "quota", "user": "x", "hours": Infinity}', "the quota is"),
        (b'{"op": 7}', "unknown request"),
        (b'"just a string"', "not a JSON object"),
    ]
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(30)
        s.connect(str(head.socket))
        lines = s.makefile("rb")
        for raw, expected in hostile:
            s.sendall(raw + b"\n")
            reply = json.loads(lines.readline())
            assert reply["ok"] is False and expected in reply["error"], (raw[:60], reply)
            assert "\n" not in reply["error"]
        s.sendall(b'{"op": "ping"}\n')  # the same connection still answers
        assert json.loads(lines.readline())["ok"]
    log = (head.home / "serve.out").read_text()
    assert "Traceback" not in log


def test_a_request_line_over_the_limit_is_refused_in_one_line(head):
    reply = ask(head, b'{"op": "ping", "pad": "' + b"x" * (2 << 20) + b'"}')
    assert reply == {"ok": False, "error": "request longer than 1 MB; put long input in a file"}
    assert ask(head, b'{"op": "ping"}')["ok"]
    with head.client() as client:  # the CLI's client says the same, in one line
        with pytest.raises(ApiError, match="request longer than 1 MB"):
            client.call("ping", pad="x" * (2 << 20))


def test_hold_and_release_toggles_are_rate_limited(head):
    # It waits for a running job (a request no card could serve is refused at submit).
    blocker = submit(head, "--gpu-mem", "4G", "--", "sleep", "600")
    job = submit(head, "--after", str(blocker), "--", "true")
    refused = 0
    with head.client() as client:
        for n in range(400):
            try:
                client.call("hold" if n % 2 == 0 else "release", job=job)
            except ApiError as err:
                assert "at most 10 a second" in str(err)
                refused += 1
    assert refused > 200
    head.run("cancel", str(job))
    head.run("cancel", str(blocker))


def test_a_hostile_cluster_file_on_reload_is_one_line_and_the_head_goes_on(openssh_lab, tmp_path):
    config = tmp_path / "nodes.yaml"
    config.write_text(openssh_lab.config_path.read_text())
    head = HeadProcess(tmp_path / "home", openssh_lab, config=config)
    head.start()
    try:
        config.write_text(config.read_text() + "extra: " + "[" * 100_000 + "]" * 100_000 + "\n")
        with head.client() as client:
            with pytest.raises(ApiError) as refused:
                client.call("reload")
            assert "nested deeper than 20 levels" in str(refused.value)
            assert client.call("ping")["ok"]  # the same connection
        assert len(head.call("status")["nodes"]) == len(openssh_lab.nodes)
    finally:
        head.stop()


def test_the_events_log_keeps_90_days_and_a_million_rows_at_most(tmp_path, monkeypatch):
    from nebula_tui.store import Store

    store = Store(tmp_path / "state.db")
    now = 1_000_000_000.0
    for n in range(30):
        store.add_event(now - 91 * 86400, "hold", f"old {n}")
    for n in range(20):
        store.add_event(now, "hold", f"new {n}")
    assert store.trim_events(now) == 30
    monkeypatch.setattr(Store, "EVENTS_KEEP_ROWS", 5)
    assert store.trim_events(now) == 15
    assert [e["message"] for e in store.events(100)] == [f"new {n}" for n in range(15, 20)]
    store.close()
