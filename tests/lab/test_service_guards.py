"""The client and service side of the head's home: a private home and log, and no private
head started beside a box's shared one (not even while systemd restarts it)."""

from __future__ import annotations

import threading
import time

import pytest

from nebula_tui import homedir
from nebula_tui.cli.demo import stop_service
from nebula_tui.client import service
from nebula_tui.client.service import ServiceUnavailable, connect, start_background
from nebula_tui.homedir import Home
from labkit.harness import HeadProcess


def test_a_loose_home_is_tightened_and_the_log_is_private(openssh_lab, tmp_path, capsys):
    home = Home(tmp_path / "home")
    home.root.mkdir(mode=0o755)
    home.root.chmod(0o755)
    (home.root / "serve.log").write_text("an older log\n")
    (home.root / "serve.log").chmod(0o644)
    try:
        start_background(home, openssh_lab.config_path)
        assert home.root.stat().st_mode & 0o777 == 0o700
        assert home.log.stat().st_mode & 0o777 == 0o600
        said = capsys.readouterr().err
        assert said.count("\n") == 1 and "was open to other users (0755); it is now 0700" in said
        home.ensure()  # tight already: nothing to say
        assert capsys.readouterr().err == ""
    finally:
        stop_service(home)


@pytest.fixture
def shared_box(tmp_path, monkeypatch):
    """This box has a shared head's socket directory (as /run/nebula under systemd)."""
    (tmp_path / "run").mkdir()
    monkeypatch.setattr(homedir, "SYSTEM_SOCKET", tmp_path / "run" / "nebula.sock")
    monkeypatch.delenv("NEBULA_SOCKET", raising=False)
    return tmp_path / "run" / "nebula.sock"


def test_no_private_head_while_the_shared_one_is_away(openssh_lab, shared_box, tmp_path, monkeypatch):
    monkeypatch.setattr(service, "SHARED_WAIT_S", 1.0)
    user_home = Home(tmp_path / "alice")
    with pytest.raises(ServiceUnavailable) as refused:
        connect(user_home, str(openssh_lab.config_path))
    assert "does not answer on" in str(refused.value) and "\n" not in str(refused.value)
    assert not (user_home.root / "nebula.sock").exists() and not user_home.log.exists()


def test_a_client_waits_for_the_shared_head_to_come_back(openssh_lab, shared_box, tmp_path):
    shared = HeadProcess(tmp_path / "shared", openssh_lab, socket=shared_box)
    later = threading.Thread(target=lambda: (time.sleep(1.0), shared.start(wait_nodes=False)))
    later.start()
    try:
        with connect(Home(tmp_path / "alice"), str(openssh_lab.config_path)) as client:
            assert client.call("ping")["pid"] == shared.process.pid
        assert not (tmp_path / "alice" / "serve.log").exists()
    finally:
        later.join()
        shared.stop()


def test_a_demo_never_stops_the_boxs_shared_head(openssh_lab, shared_box, tmp_path):
    """An admin's ``nebula demo`` in a home of his own with no socket yet: the home falls
    back to the box's shared socket for clients, but the demo talks to its own head only —
    before, it sent the shared head ``shutdown`` at its start and its end (issue 41)."""
    import os
    import signal
    import subprocess
    import sys
    import threading

    from nebula_tui.api import Client

    shared = HeadProcess(tmp_path / "shared", openssh_lab, socket=shared_box)
    shared.start(wait_nodes=False)
    demo_home = tmp_path / "admin" / "demo"
    script = ("import sys; from pathlib import Path; from nebula_tui import homedir; "
              f"homedir.SYSTEM_SOCKET = Path({str(shared_box)!r}); "
              "from nebula_tui.cli.main import main; "
              f"sys.exit(main(['demo', '--headless', '--layout', 'core', '--home', {str(demo_home)!r}]))")
    env = {k: v for k, v in os.environ.items() if k not in ("NEBULA_SOCKET", "NEBULA_HOME", "NEBULA_CONFIG")}
    demo = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env, start_new_session=True)
    said: list[str] = []
    ready = threading.Event()

    def read_what_it_says() -> None:
        for line in demo.stdout:
            said.append(line)
            if "Press Ctrl-C to stop the lab." in line:
                ready.set()

    threading.Thread(target=read_what_it_says, daemon=True).start()
    try:
        with Client(shared_box, timeout=5) as client:
            shared_pid = client.call("ping")["pid"]
        # Up, and waiting for its Ctrl-C (one while it still starts ends it as any command's: 130)
        assert ready.wait(180), "".join(said)
        with Client(demo_home / "nebula.sock", timeout=5) as client:
            assert client.call("ping")["pid"] != shared_pid  # its own head
        with Client(shared_box, timeout=5) as client:
            assert client.call("ping")["pid"] == shared_pid  # the shared head was left alone
        os.killpg(demo.pid, signal.SIGINT)
        assert demo.wait(timeout=60) == 0
        with Client(shared_box, timeout=5) as client:  # and after the demo's clean-up too
            assert client.call("ping")["pid"] == shared_pid
        assert shared.process.poll() is None
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
            demo.wait()
        stop_service(Home(demo_home, demo_home / "nebula.sock"))
        shared.stop()


def test_a_service_that_does_not_stop_when_asked_is_terminated(openssh_lab, tmp_path):
    """A demo's clean-up never leaves its service behind: one that cannot answer (here
    stopped with SIGSTOP) is terminated, then killed, after the grace."""
    import os
    import signal

    from nebula_tui.api import Client

    home = Home(tmp_path / "home")
    process = start_background(home, openssh_lab.config_path)
    with Client(home.socket, timeout=5) as client:
        assert client.peer() == (process.pid, os.getuid())
    os.kill(process.pid, signal.SIGSTOP)
    try:
        stop_service(home, grace_s=0.5)
        assert process.wait(timeout=5) == -signal.SIGKILL  # SIGTERM waits behind SIGSTOP
    finally:
        if process.poll() is None:
            process.kill()


def test_a_demo_restart_that_lost_the_race_does_not_outlive_the_demo(openssh_lab, tmp_path):
    """The demo's supervisor restarted its killed service, but a client's answered first
    while the supervisor's own was still starting (here held there with SIGSTOP). Stopping
    the demo ends that one too: before, once the demo stopped the service that answered,
    the supervisor's took the home over and ran on after the demo (CI's teardown found
    the socket still there)."""
    import os
    import signal
    import subprocess
    import sys

    from nebula_tui.cli.demo import ServiceSupervisor

    home = Home(tmp_path / "home")
    answering = start_background(home, openssh_lab.config_path)  # the client's, which won
    supervisor = ServiceSupervisor(home, openssh_lab.config_path, None)
    supervisor.start()  # one answers: it watches that one
    starting = subprocess.Popen([sys.executable, "-m", "nebula_tui", "serve", "--home", str(home.root),
                                 "--config", str(openssh_lab.config_path)], stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    os.kill(starting.pid, signal.SIGSTOP)  # still importing: not yet at the home's lock
    supervisor._process = starting  # the restart it made when the old service was killed
    try:
        supervisor.stop()
        stop_service(home)  # the demo's clean-up, in its order
        assert answering.wait(timeout=10) == 0
        if starting.poll() is None:
            os.kill(starting.pid, signal.SIGCONT)
        time.sleep(3)  # time to take the lock and serve, had it lived
        assert starting.poll() is not None, "the supervisor's own start outlived the demo"
        assert not home.socket.exists()
    finally:
        for process in (answering, starting):
            if process.poll() is None:
                os.kill(process.pid, signal.SIGCONT)
                process.kill()
