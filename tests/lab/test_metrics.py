"""Prometheus metrics: a head serving them on 127.0.0.1 is scraped over HTTP while jobs run
and end, and what it says is read with prometheus_client's own text parser and set against
what `nebula gpus`, `nebula queue` and `nebula users` say. The Grafana dashboard in
deploy/ asks only for metrics the head has."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from support.head import free_port, submit
from labkit.harness import wait_for
from labkit.harness import HeadProcess

REPO = Path(__file__).resolve().parents[2]
GPU_LABELS = {"node", "index", "uuid", "model", "vendor"}


def scrape(port: int) -> dict:
    """name -> family, as prometheus_client parses the page."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=20) as reply:
        assert reply.status == 200
        text = reply.read().decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def samples(families: dict, name: str, sample: str | None = None) -> list:
    return [s for s in families[name].samples if s.name == (sample or name)]


@pytest.fixture(scope="module")
def metered(openssh_lab, tmp_path_factory):
    port = free_port()
    head = HeadProcess(tmp_path_factory.mktemp("metrics"), openssh_lab,
                       serve_args=("--metrics", f"127.0.0.1:{port}"))
    head.start()
    head.port = port
    try:
        yield head
    finally:
        head.stop()


def test_gpu_series_carry_their_labels_and_match_what_the_head_shows(metered):
    job = submit(metered, "--gpu-count", "2", "--", "env", "NEBULA_SIM_GPU_UTIL=70", "sleep", "60")
    try:
        wait_for(lambda: metered.job(job)["state"] == "running", 30, what="the job running")
        held = {g["uuid"] for g in metered.job(job)["gpus"]}

        def busy_cards():
            fams = scrape(metered.port)
            util = {s.labels["uuid"]: s.value for s in samples(fams, "nebula_gpu_utilization_percent")}
            return all(util.get(u) == 70 for u in held) and fams

        families = wait_for(busy_cards, 30, interval=0.5, what="the job's cards at 70% in a scrape")
        gpus = {g["uuid"]: g for g in json.loads(metered.run("gpus", "--json", check=True).stdout)}
        for name, family in families.items():
            if not name.startswith("nebula_gpu_"):
                continue
            assert family.type == "gauge", name
            assert family.samples, name
            for s in family.samples:
                assert set(s.labels) == GPU_LABELS, (name, s.labels)
                gpu = gpus[s.labels["uuid"]]
                assert (s.labels["node"], s.labels["index"], s.labels["model"], s.labels["vendor"]) == (
                    gpu["node"], str(gpu["index"]), gpu["model"], gpu["vendor"])
        # Each reading's help names the DCGM exporter field it matches.
        for name, field in (("nebula_gpu_utilization_percent", "DCGM_FI_DEV_GPU_UTIL"),
                            ("nebula_gpu_memory_used_bytes", "DCGM_FI_DEV_FB_USED"),
                            ("nebula_gpu_temperature_celsius", "DCGM_FI_DEV_GPU_TEMP"),
                            ("nebula_gpu_power_watts", "DCGM_FI_DEV_POWER_USAGE"),
                            ("nebula_gpu_sm_clock_hertz", "DCGM_FI_DEV_SM_CLOCK")):
            assert field in families[name].documentation, name
        total = {s.labels["uuid"]: s.value for s in samples(families, "nebula_gpu_memory_total_bytes")}
        assert total == {u: g["total_memory_mb"] * 1024 * 1024 for u, g in gpus.items()}
        jobs = {s.labels["uuid"]: s.value for s in samples(families, "nebula_gpu_jobs")}
        assert {u for u, n in jobs.items() if n} == held
        running = {s.labels["state"]: s.value for s in samples(families, "nebula_jobs")}
        assert running["running"] >= 1 and set(running) >= {"pending", "launching", "running"}
        assert samples(families, "nebula_queue_wait_seconds", "nebula_queue_wait_seconds_count")[0].value >= 1
        assert samples(families, "nebula_scheduler_pass_seconds",
                       "nebula_scheduler_pass_seconds_count")[0].value >= 1
        up = {s.labels["node"]: s.value for s in samples(families, "nebula_node_up")}
        assert up == {"node01": 1, "node02": 1, "node03": 1}
        assert {s.value for s in samples(families, "nebula_node_health_score")} == {1.0}
    finally:
        metered.run("cancel", str(job))
    metered.wait_job(job)


def test_ended_jobs_and_users_gpu_hours(metered):
    done = metered.run("submit", "--gpu-mem", "4G", "--wait", "--", "sh", "-c", "sleep 2; exit 5")
    assert done.returncode == 5
    families = scrape(metered.port)
    ended = {s.labels["state"]: s.value for s in samples(families, "nebula_jobs_ended",
                                                          "nebula_jobs_ended_total")}
    assert ended["failed"] >= 1
    users = {u["name"]: u for u in json.loads(metered.run("users", "--json", check=True).stdout)}
    charged = {s.labels["user"]: s.value for s in samples(families, "nebula_user_gpu_hours",
                                                           "nebula_user_gpu_hours_total")}
    assert charged["root"] == pytest.approx(users["root"]["gpu_hours"]) and charged["root"] > 0


def test_the_grafana_dashboard_asks_for_metrics_the_head_has(metered):
    dashboard = json.loads((REPO / "deploy" / "grafana-dashboard.json").read_text())
    families = scrape(metered.port)
    have = {s.name for f in families.values() for s in f.samples}
    asked = set()
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            asked |= {m for m in re.findall(r"\b(nebula_[a-z_]+)", target["expr"])}
    assert asked and asked <= have, asked - have
    assert any(p["title"] == "GPU utilisation" for p in dashboard["panels"])


def test_a_bad_or_taken_metrics_address_is_refused_in_one_line(metered, tmp_path):
    bad = metered.run("serve", "--metrics", "nowhere")
    assert bad.returncode == 2 and "write it like 127.0.0.1:9400" in bad.stderr
    home = tmp_path / "home"
    taken = subprocess.run([sys.executable, "-m", "nebula_tui", "serve", "--home", str(home),
                            "--config", str(metered.lab.config_path), "--metrics",
                            f"127.0.0.1:{metered.port}"], capture_output=True, text=True, timeout=60)
    assert taken.returncode == 2 and taken.stderr.count("\n") == 1
    assert f"cannot serve metrics on 127.0.0.1:{metered.port}" in taken.stderr


@pytest.mark.lab  # a demo of its own
def test_the_demo_serves_metrics_too(tmp_path):
    """Every card of the demo's lab, whatever its vendor, is a series."""
    from nebula_tui.sim import presets

    specs = presets.node_specs("demo")
    devices = sum(len(s.get("gpus") or ()) + len(s.get("devices") or ()) for s in specs)
    port = free_port()
    home = tmp_path / "demo"
    demo = subprocess.Popen([sys.executable, "-m", "nebula_tui", "demo", "--headless", "--metrics",
                             f"127.0.0.1:{port}"], env={**_env(), "NEBULA_HOME": str(home)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        def every_card():
            try:
                cards = samples(scrape(port), "nebula_gpu_maintenance")
            except OSError:
                return None
            return cards if len(cards) == devices else None

        cards = wait_for(every_card, 120, interval=1, what=f"the demo's metrics with its {devices} cards")
        assert {c.labels["vendor"] for c in cards} == {"nvidia", "intel", "ascend", "amd"}
    finally:
        demo.terminate()
        demo.wait(60)


def _env() -> dict:
    return {k: v for k, v in os.environ.items() if not k.startswith("NEBULA_")}


@pytest.mark.slow
def test_idle_connections_to_the_metrics_port_cost_the_head_nothing_lasting(metered):
    """800 connections that send nothing once held 800 of the head's descriptors and threads
    for ever: the port serves a few at once and drops one that stays silent."""
    from nebula_tui.head.metrics import MAX_SCRAPERS, SCRAPE_TIMEOUT_S

    def descriptors() -> int:
        return len(os.listdir(f"/proc/{metered.process.pid}/fd"))

    before = descriptors()
    # Twice what the port serves at once: the second half waits in the kernel's backlog,
    # not in the head, and is dropped in its turn.
    held = [socket.create_connection(("127.0.0.1", metered.port)) for _ in range(2 * MAX_SCRAPERS)]
    try:
        time.sleep(1)
        assert descriptors() <= before + MAX_SCRAPERS + 4
        time.sleep(2 * SCRAPE_TIMEOUT_S + 2)
        assert descriptors() <= before + 4
        assert "nebula_jobs" in scrape(metered.port)  # served again
    finally:
        for connection in held:
            connection.close()


@pytest.mark.slow
def test_clients_that_trickle_their_request_heads_cannot_block_a_scrape(metered):
    """Sixteen connections that each send one header line a second never fall silent, so
    they once held every slot of the port and each scrape was closed unanswered. Now a whole
    request head must arrive in REQUEST_HEAD_S, and a new connection when every slot is taken
    closes the slowest head: scrapes are served while the trickle goes on, and every
    trickling connection is cut though it never stops sending."""
    import threading

    from nebula_tui.head.metrics import MAX_SCRAPERS, REQUEST_HEAD_S

    stop = threading.Event()
    cut_after: list[float] = []

    def trickle() -> None:
        conn = socket.create_connection(("127.0.0.1", metered.port), timeout=30)
        began = time.monotonic()
        try:
            conn.sendall(b"GET /metrics HTTP/1.1\r\n")
            line = 0
            while not stop.is_set() and time.monotonic() - began < 6 * REQUEST_HEAD_S:
                conn.sendall(f"X-Trickle-{line}: {line}\r\n".encode())
                line += 1
                time.sleep(0.5)
        except OSError:  # the head closed it: a send fails at last
            cut_after.append(time.monotonic() - began)
        finally:
            conn.close()

    # the trickle starts again as each connection is cut, as a hostile client would
    workers = [threading.Thread(target=lambda: [trickle() for _ in range(3)]) for _ in range(MAX_SCRAPERS)]
    for worker in workers:
        worker.start()
    try:
        time.sleep(1)  # every slot held by a trickle by now
        for _ in range(3):
            assert "nebula_jobs" in scrape(metered.port)
            time.sleep(REQUEST_HEAD_S / 2)
    finally:
        time.sleep(REQUEST_HEAD_S + 1)
        stop.set()
        for worker in workers:
            worker.join(60)
    # each one cut while it still sent, none left to run its course (6 × REQUEST_HEAD_S)
    assert len(cut_after) >= MAX_SCRAPERS, cut_after
    assert max(cut_after) < 6 * REQUEST_HEAD_S, cut_after
