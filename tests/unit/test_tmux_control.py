"""The nodelet's tmux control client, against a real tmux server of the test's own."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from nebula_tui.node.tmux_control import TmuxControl, tmux_words

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")


@pytest.fixture
def control(tmp_path: Path, monkeypatch):
    # a short socket directory of the test's own (sun_path has 108 bytes)
    sockets = Path(f"/tmp/nebula-ctl-test-{os.getpid()}")
    sockets.mkdir(exist_ok=True)
    monkeypatch.setenv("TMUX_TMPDIR", str(sockets))
    monkeypatch.delenv("TMUX", raising=False)
    tmux = ["tmux", "-L", "ctl"]
    starts = []

    def prepare():
        starts.append(1)
        subprocess.run(tmux + ["start-server", ";", "set-option", "-s", "exit-empty", "off"],
                       check=False)

    client = TmuxControl(tmux, "hold", prepare)
    client.starts = starts
    yield client, tmux
    client._close()
    subprocess.run(tmux + ["kill-server"], stderr=subprocess.DEVNULL)
    shutil.rmtree(sockets, ignore_errors=True)


def sessions(client) -> list[str]:
    code, out, err = client.call(["list-sessions", "-F", "#{session_name}"])
    assert code == 0, err
    return out.split()


def sessions_become(client, expected: list[str]) -> list[str]:
    """The sessions once they are ``expected`` (or as they are after 5 s): tmux may answer a
    new control client's first commands before its own new-session has made the session
    the client holds."""
    for _ in range(250):
        if (now := sessions(client)) == expected:
            break
        subprocess.run(["sleep", "0.02"])
    return now


def test_commands_answer_in_order_with_their_output(control) -> None:
    client, _ = control
    assert client.call(["display-message", "-p", "one"]) == (0, "one\n", "")
    assert client.call(["new-session", "-d", "-s", "job", "sleep", "30"]) == (0, "", "")
    assert sessions_become(client, ["hold", "job"]) == ["hold", "job"]
    assert client.starts == [1]  # one client for all of them


def test_a_line_of_several_commands_is_answered_once(control) -> None:
    client, tmux = control
    code, out, err = client.call(["new-session", "-d", "-s", "job", "sleep", "30",
                                  ";", "set-option", "-t", "=job:", "@token", "a.1.b",
                                  ";", "display-message", "-p", "-t", "=job:", "#{@token}"])
    assert (code, out, err) == (0, "a.1.b\n", "")
    # the next request gets its own answer, not the rest of that line's
    assert client.call(["display-message", "-p", "next"]) == (0, "next\n", "")


def test_a_failing_command_gives_its_error_and_stops_its_line(control) -> None:
    client, _ = control
    client.call(["new-session", "-d", "-s", "job", "sleep", "30"])
    code, out, err = client.call(["new-session", "-d", "-s", "job", "true",
                                  ";", "display-message", "-p", "not reached"])
    assert code == 1 and "duplicate session: job" in err and "not reached" not in out
    assert client.call(["kill-session", "-t", "=nope"])[0] == 1
    assert client.call(["display-message", "-p", "still answering"])[1] == "still answering\n"


def test_odd_words_reach_tmux_as_they_are(control, tmp_path: Path) -> None:
    client, _ = control
    odd = tmp_path / "it's a $HOME ~ {dir}; #x"
    odd.mkdir()
    code, _, err = client.call(["new-session", "-d", "-s", "job", "sh", "-c",
                                'printf %s "$0" > "$0/seen"', str(odd)])
    assert code == 0, err
    for _ in range(200):
        if (odd / "seen").exists() and (odd / "seen").read_text():
            break
        subprocess.run(["sleep", "0.02"])
    assert (odd / "seen").read_text() == str(odd)


def test_a_word_that_cannot_go_on_one_line_is_left_to_a_process() -> None:
    assert tmux_words(["display-message", "-p", "two\nlines"]) is None
    assert tmux_words(["a b", ";", "it's"]) == "'a b' ; 'it'\"'\"'s'"


def test_a_killed_server_means_a_new_client(control) -> None:
    client, tmux = control
    assert client.call(["display-message", "-p", "up"])[0] == 0
    subprocess.run(tmux + ["kill-server"])
    # kill-server returns before the server has gone; a client started meanwhile would join
    # the server on its way out (seen once in a loaded run: a new client, no sessions)
    for _ in range(250):
        if subprocess.run(tmux + ["list-sessions"], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL).returncode != 0:
            break
        subprocess.run(["sleep", "0.02"])
    # A client that dies under a call answers None (the caller runs tmux as a process,
    # which then says there is no server, as before); one seen dead before the call is
    # started again at once, with a server. Either way the next answers come from a new one.
    first = client.call(["list-sessions", "-F", "#{session_name}"])
    client.failed_at = None  # (past the retry pause)
    assert first in (None, (0, "hold\n", ""), (0, "", ""))
    assert sessions_become(client, ["hold"]) == ["hold"]
    assert len(client.starts) == 2
