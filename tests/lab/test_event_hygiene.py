"""Events that say each thing once: a node that stays away is one event and a summary, not
one line per reconnect attempt; a reason is one line however much a tool printed, and the
whole of it is in `nebula node show`. Real sshd nodes are stopped and a tool is broken on
the simulated lab (both undone at the end: the lab is the session's)."""

from __future__ import annotations

import json
import time

import pytest

from labkit.harness import wait_for
from nebula_tui.sim import faults
from nebula_tui.views import REASON_MAX, one_line


def node_events(head, node: str, since: float) -> list[str]:
    events = json.loads(head.run("events", "--json", "--node", node, "--kind", "node",
                                 "--limit", "500", check=True).stdout)
    return [e["message"] for e in events if e["t"] >= since]


@pytest.mark.slow
def test_a_node_away_is_one_event_and_its_retries_are_summed_up(head, openssh_lab):
    since = time.time()
    openssh_lab.stop_node("node03")
    try:
        wait_for(lambda: head.call("node_show", node="node03")["node"]["failed_attempts"] >= 4, 90,
                 interval=0.5, what="node03 retried several times")
        away = head.call("node_show", node="node03")["node"]
        assert away["state"] == "unknown" and "Connection refused" in away["reason"]
        (gone,) = node_events(head, "node03", since)  # one event, however many attempts
        assert gone.startswith("node03 is unknown")
        shown = head.run("node", "show", "node03", check=True).stdout
        assert "failed connection attempts since it was last up" in shown
    finally:
        openssh_lab.start_node("node03")
    wait_for(lambda: head.call("node_show", node="node03")["node"]["state"] == "up", 60,
             what="node03 back")
    events = node_events(head, "node03", since)
    # The first two; a loaded machine may make the node miss probes again afterwards.
    assert events[0] == gone, events
    assert events[1].startswith("node03 is up (after ") and "failed attempts in " in events[1]


def test_a_broken_tool_is_one_line_on_its_node_and_in_node_show(head, openssh_lab):
    """node03 is read through nvidia-smi (its NVML does not load); a tool that prints noise
    (control characters included) is one readable line on the node's card, in status and
    in `nebula node show` (the node flattens its tools' words before they travel)."""
    node_dir = openssh_lab.node_dir("node03")
    faults.set_tool_fault(node_dir, "nvidia-smi", "garbage")
    try:
        shown = wait_for(lambda: (n := head.call("node_show", node="node03")["node"])["reason"]
                         .startswith("nvidia-smi") and n, 30, interval=0.5,
                         what="node03's probe to fail with the tool's output")
        assert shown["reason"].isprintable() and len(shown["reason"]) <= REASON_MAX
        status = json.loads(head.run("status", "--json", check=True).stdout)
        (card,) = [n for n in status["node_details"] if n["name"] == "node03"]
        assert card["reason"] == shown["reason"]
        text = head.run("node", "show", "node03", check=True).stdout
        assert f"  why: {shown['detail']}" in text.splitlines()
    finally:
        faults.set_tool_fault(node_dir, "nvidia-smi", None)
    wait_for(lambda: head.call("node_show", node="node03")["node"]["detail"] == "", 30,
             interval=0.5, what="a good probe to clear the reason")


def test_a_long_problem_is_one_line_and_the_whole_of_it_is_kept(openssh_lab, tmp_path):
    """Whatever a node says (a nodelet of another version may send a tool's whole output:
    500 characters of CSV once garbled a card), the head shows one line of it and keeps
    the whole for `nebula node show`; a good probe clears both."""
    from nebula_tui.config.cluster import load_config
    from nebula_tui.head.engine import Engine
    from nebula_tui.store import Store

    store = Store(tmp_path / "state.db")
    engine = Engine(load_config(openssh_lab.config_path), store)
    raw = "nvidia-smi exited with 3:\n" + "\n".join(f"{i}, GPU-{i:04d}, [Unknown Error]"
                                                     for i in range(40))
    engine.on_node_message("node01", {"type": "probe", "devices": [], "problems": [raw]})
    shown = engine.fleet.show("node01")
    assert shown["detail"] == raw
    assert shown["reason"] == one_line(raw) and len(shown["reason"]) <= REASON_MAX
    engine.on_node_message("node01", {"type": "probe", "devices": [], "problems": []})
    assert engine.fleet.show("node01")["detail"] == ""
    store.close()


def test_one_line():
    assert one_line("a\nb\t c\x1b[31m") == "a b c [31m"
    long = one_line("word " * 100, limit=40)
    assert len(long) <= 40 and long.endswith("…") and " wor…" not in long


def test_a_drain_reason_must_be_one_line(head):
    refused = head.run("node", "drain", "node01", "--reason", "two\nlines")
    # a request that can never be valid as written: a usage error, like the client's own
    assert refused.returncode == 2 and "one line" in refused.stderr


async def test_an_hour_of_retries_is_two_events_not_360(openssh_lab, tmp_path):
    """The link retries a node that is away every 10 s and says so each time: over an
    hour that was ~360 events; now it is the change and one summary (the head's own
    clock, stepped by the test: an hour passes in a moment)."""
    from nebula_tui.config.cluster import load_config
    from nebula_tui.head.engine import Engine
    from nebula_tui.model import NodeState
    from nebula_tui.store import Store

    now = [1_000_000.0]
    store = Store(tmp_path / "state.db")
    engine = Engine(load_config(openssh_lab.config_path), store, clock=lambda: now[0])
    engine.state.monotonic = lambda: now[0]  # how long a node is away: the monotonic clock
    engine.on_node_state("node01", NodeState.UP, "")
    for _ in range(361):
        engine.on_node_state("node01", NodeState.UNKNOWN,
                             "cannot connect to node01 (127.0.0.1:22): Connection refused")
        now[0] += 10
    engine.on_node_state("node01", NodeState.UP, "")
    messages = [e["message"] for e in store.events(1000, node="node01")]
    assert messages[0] == "node01 is up"
    assert messages[1] == "node01 is unknown: cannot connect to node01 (127.0.0.1:22): Connection refused"
    assert messages[2].startswith("node01 still unknown after 360 attempts in 1h00m")
    assert messages[3] == "node01 is up (after 361 failed attempts in 1h00m)"
    assert len(messages) == 4
    engine.state.cancel_tasks()  # the reconcile each "up" asked for: there is no node link here
    store.close()
