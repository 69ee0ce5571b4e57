"""Notifications for real: a head whose nodes.yaml names webhooks on loopback HTTP servers
(one that answers, one that never does, one where nothing listens) and mail through the
box's real sendmail (msmtp) to an SMTP server on loopback. Jobs end, fail and are
requeued, a GPU is isolated; what arrives is what the README promises, and the endpoint
that never answers delays neither the head nor the other endpoints."""

from __future__ import annotations

import json
import shutil
import socket
import threading
import time
from email import message_from_bytes
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from support.head import free_port
from labkit.harness import wait_for
from nebula_tui.sim import faults
from labkit.harness import HeadProcess
from support.head import submit_json

SENDMAIL = Path("/usr/sbin/sendmail")
pytestmark = pytest.mark.skipif(
    not SENDMAIL.exists() or not shutil.which("msmtp"),
    reason="needs a sendmail (scripts/test-deps.sh installs msmtp-mta as root)")


class Receiver:
    """A webhook endpoint on 127.0.0.1 that keeps what it is sent, by path."""

    def __init__(self):
        received = self.received = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                received.append((self.path, self.headers["Content-Type"], json.loads(body)))
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def texts(self, path: str) -> list[str]:
        return [body["text"] for p, _, body in self.received if p == path]

    def bodies(self, path: str) -> list[dict]:
        return [body for p, _, body in self.received if p == path]


class Mailbox:
    """An SMTP server on 127.0.0.1 (aiosmtpd) that keeps every message."""

    def __init__(self):
        from aiosmtpd.controller import Controller

        messages = self.messages = []

        class Handler:
            async def handle_DATA(self, server, session, envelope):
                messages.append((envelope.rcpt_tos, message_from_bytes(envelope.content)))
                return "250 OK"

        self.controller = Controller(Handler(), hostname="127.0.0.1", port=free_port())
        self.controller.start()

    def to(self, address: str) -> list:
        return [m for rcpts, m in self.messages if address in rcpts]


@pytest.fixture(scope="module")
def lab_with_notices(openssh_lab, tmp_path_factory):
    pytest.importorskip("aiosmtpd")
    fast, mailbox = Receiver(), Mailbox()
    silent = socket.socket()  # accepts connections (the kernel does), never answers
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)
    dead = f"http://127.0.0.1:{free_port()}/hook"  # nothing listens there
    home = tmp_path_factory.mktemp("notify")
    rc = home / "msmtprc"
    rc.write_text(f"account default\nhost 127.0.0.1\nport {mailbox.controller.port}\n"
                  "from nebula@lab.test\nauth off\ntls off\n")
    rc.chmod(0o600)
    config = yaml.safe_load(openssh_lab.config_path.read_text())
    config["health"] = {"isolation_grace": "1s"}
    config["notify"] = {
        "webhooks": [f"{fast.url}/jobs", f"http://127.0.0.1:{silent.getsockname()[1]}/hook", dead],
        "admins": {"webhooks": [f"{fast.url}/admins"], "mail": ["ops@lab.test"]},
        "mail_domain": "lab.test", "from": "nebula@lab.test",
        "sendmail": f"{SENDMAIL} -C {rc}",
    }
    path = openssh_lab.root / "nodes-notify.yaml"  # beside the lab: `nebula sim` finds it
    path.write_text(yaml.safe_dump(config))
    head = HeadProcess(home, openssh_lab, config=path)
    head.start()
    try:
        yield head, fast, mailbox
    finally:
        head.stop()
        silent.close()
        fast.server.shutdown()
        mailbox.controller.stop()
        for node in openssh_lab.nodes:
            for gpu in json.loads((openssh_lab.node_dir(node) / "node.json").read_text())["gpus"]:
                faults.clear_gpu_faults(openssh_lab.node_dir(node), gpu["index"])


def test_a_notify_jobs_end_reaches_its_owner_and_a_failure_the_admins(lab_with_notices):
    head, fast, mailbox = lab_with_notices
    failed = submit_json(head, "--notify", "--name", "train", "--gpu-mem", "4G", "--command", "exit 3")
    quiet_ok = submit_json(head, "--gpu-mem", "4G", "--", "true")  # no --notify, succeeds: nobody
    quiet_bad = submit_json(head, "--gpu-mem", "4G", "--command", "exit 4")  # no --notify: admins
    ok = submit_json(head, "--notify", "--gpu-mem", "4G", "--", "true")
    for job in (failed, quiet_ok, quiet_bad, ok):
        head.wait_job(job)

    wait_for(lambda: len(fast.texts("/jobs")) >= 2 and len(fast.texts("/admins")) >= 2, 30,
             what="the webhooks")
    jobs = {b["nebula"]["job"]: b for b in fast.bodies("/jobs")}
    assert set(jobs) == {failed, ok}  # only the --notify jobs, each once
    assert jobs[failed]["text"].startswith(f"job {failed} (train) of root failed with exit code 3 on ")
    assert jobs[failed]["nebula"]["event"] == "job_failed" and jobs[failed]["nebula"]["exit_code"] == 3
    assert jobs[ok]["nebula"]["event"] == "job_succeeded"
    assert all(kind == "application/json" for _, kind, _ in fast.received)
    admins = {b["nebula"]["job"]: b for b in fast.bodies("/admins")}
    assert set(admins) == {failed, quiet_bad}  # every job's failure, no success

    wait_for(lambda: len(mailbox.to("root@lab.test")) >= 2 and mailbox.to("ops@lab.test"), 30,
             what="the mail")
    subjects = sorted(m["Subject"] for m in mailbox.to("root@lab.test"))
    assert subjects == sorted([f"[nebula] job {failed} (train) failed with exit code 3",
                               f"[nebula] job {ok} succeeded"])
    mail = next(m for m in mailbox.to("root@lab.test") if "failed" in m["Subject"])
    assert mail["From"] == "nebula@lab.test" and f"nebula logs {failed}" in mail.get_payload()
    assert {m["Subject"] for m in mailbox.to("ops@lab.test")} >= {
        f"[nebula] job {failed} (train) failed with exit code 3", f"[nebula] job {quiet_bad} failed with exit code 4"}


def test_an_endpoint_that_never_answers_delays_neither_the_head_nor_the_others(lab_with_notices):
    head, fast, _ = lab_with_notices
    before = len(fast.texts("/jobs"))
    # Five notices for the silent endpoint: ~10 s each before it gives up on one.
    for _ in range(5):
        submit_json(head, "--notify", "--gpu-mem", "4G", "--", "true")
    started = time.monotonic()
    done = head.run("submit", "--gpu-mem", "4G", "--wait", "--", "true")
    assert done.returncode == 0
    # Had the head waited for the silent endpoint, this job would have taken 50 s and more.
    assert time.monotonic() - started < 40
    wait_for(lambda: len(fast.texts("/jobs")) >= before + 5, 40, what="the answering endpoint's notices")


def test_an_isolated_gpu_and_its_requeued_job_reach_the_admins(lab_with_notices, openssh_lab):
    head, fast, _ = lab_with_notices
    job = submit_json(head, "--notify", "--arch", "sm_86", "--command", "while :; do sleep 0.2; done")
    running = wait_for(lambda: (j := head.job(job))["state"] == "running" and j, 30, what="running")
    card = running["gpus"][0]
    label = f"{card['node']}:{card['index']}"
    try:
        assert head.run("sim", "inject", "xid", "48", "--node", card["node"], "--gpu",
                        str(card["index"])).returncode == 0
        wait_for(lambda: any(t.startswith(f"GPU {label} (RTX 3090) isolated: Xid 48")
                             for t in fast.texts("/admins")), 60, what="the isolation notice")
        wait_for(lambda: any(f"job {job} of root was requeued: GPU {label} was isolated" in t
                             for t in fast.texts("/jobs")), 60, what="the owner's requeue notice")
        # Each endpoint has its own queue: the admins' copy may come after the owner's.
        wait_for(lambda: any(b["nebula"]["event"] == "job_requeued" and b["nebula"]["job"] == job
                             for b in fast.bodies("/admins")), 30, what="the admins' requeue notice")
    finally:
        faults.clear_gpu_faults(openssh_lab.node_dir(card["node"]), card["index"])
        head.run("cancel", str(job))
        head.wait_job(job, timeout=60)


def test_a_job_name_cannot_add_headers_or_lose_its_mail(lab_with_notices):
    """A job's name is the owner's text in the mail's Subject: a carriage return in it must
    neither start a header of its own (a Bcc) nor cost the owner and the admins their mail."""
    head, fast, mailbox = lab_with_notices
    job = submit_json(head, "--notify", "--name", "x\rBcc: eve@lab.test", "--gpu-mem", "4G",
                  "--command", "exit 5")
    head.wait_job(job)
    wait_for(lambda: any(f"job {job} " in m["Subject"] for m in mailbox.to("root@lab.test")), 30,
             what="the owner's mail")
    (mail,) = [m for m in mailbox.to("root@lab.test") if f"job {job} " in m["Subject"]]
    assert mail["Subject"] == f"[nebula] job {job} (x\\rBcc: eve@lab.test) failed with exit code 5"
    assert mail["Bcc"] is None and not mailbox.to("eve@lab.test")


@pytest.mark.slow
def test_a_user_cannot_make_the_head_connect_anywhere(lab_with_notices):
    """Webhook URLs come from nodes.yaml alone: a submit over the raw socket naming URLs in
    every field a client might try (and in its name) gets the notices to the configured
    endpoints only; the user's own listener on loopback sees no connection at all."""
    head, fast, _ = lab_with_notices
    trap = socket.socket()
    trap.bind(("127.0.0.1", 0))
    trap.listen(8)
    trap.settimeout(0.5)
    url = f"http://127.0.0.1:{trap.getsockname()[1]}/steal"
    try:
        reply = head.call("submit", command=["true"], gpu_mem_mb=4096, name=url, notify=url,
                          webhook=url, webhooks=[url], url=url, notify_url=url,
                          mail=f"x@127.0.0.1:{trap.getsockname()[1]}", admins={"webhooks": [url]})
        job = reply["job"]["id"]
        head.wait_job(job)
        wait_for(lambda: any(b["nebula"]["job"] == job for b in fast.bodies("/jobs")), 30,
                 what="the configured webhook's notice")
        time.sleep(1)  # any connection the head would make to the trap is made by now
        with pytest.raises(socket.timeout):
            trap.accept()
    finally:
        trap.close()
