"""Prometheus metrics of the head: ``nebula serve --metrics HOST:PORT`` (off by default).

Per GPU (labels ``node``, ``index``, ``uuid``, ``model``, ``vendor``) the readings of its
last probe, each metric's help naming the DCGM exporter field it matches, so dashboards
made for the DCGM exporter adapt by a rename (the units here are Prometheus's: bytes,
hertz); then jobs by state, queue waits, scheduling pass times, GPU-hours per user, and
each node's reachability and health score.

prometheus_client's WSGI app answers from threads of a small HTTP server of ours
(``BoundedHttpServer``): at most ``MAX_SCRAPERS`` connections at once, each dropped after
``SCRAPE_TIMEOUT_S`` of silence — the server prometheus_client starts itself keeps every
idle connection, a thread and a descriptor each, for ever (800 idle ones on the lab were 800
of the head's descriptors). Silence is not the only way to hold a slot: a client that sends
a header line every second never falls silent, and sixteen of them blocked every scrape. So
a request's whole head (its request line and headers) must arrive within ``REQUEST_HEAD_S``
of the connection, and when every slot is taken a new connection makes room by closing the
one whose head has been coming longest: a scraper sends its head at once and is served. The head's
state belongs to its event loop, so a scrape hands
the gathering to the loop (``_gather``) and waits for it — nothing here reads the state
from another thread. Waits and pass times are histograms
observed as they happen (``job_started``, ``pass_done``, which the engine wires).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from prometheus_client import CollectorRegistry, Histogram, ProcessCollector, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ..model import Job, JobState, NodeState
from ..views import month_start
from .state import HeadState

log = logging.getLogger(__name__)

BYTES_PER_MIB = 1024 * 1024
#: connections the metrics port serves at once (more are closed at once), and how long one
#: may send nothing before it is closed: a scraper asks at once and reads
MAX_SCRAPERS = 16
SCRAPE_TIMEOUT_S = 5.0
#: how long a connection may take to send its whole request head, however it trickles in
REQUEST_HEAD_S = 5.0
#: how long a new connection waits for the slot of the slow one it closed
EVICTED_SLOT_WAIT_S = 2.0
GPU_LABELS = ("node", "index", "uuid", "model", "vendor")
#: (name, help, the reading's field, scale to the metric's unit): one gauge per GPU each.
GPU_READINGS = (
    ("nebula_gpu_utilization_percent", "GPU utilization in percent (DCGM_FI_DEV_GPU_UTIL)",
     "utilization_pct", 1),
    ("nebula_gpu_memory_used_bytes",
     "Memory in use in bytes (DCGM_FI_DEV_FB_USED, which counts MiB)", "memory_used_mb", BYTES_PER_MIB),
    ("nebula_gpu_memory_total_bytes",
     "Memory of the card in bytes (DCGM_FI_DEV_FB_TOTAL, which counts MiB)", "memory_total_mb",
     BYTES_PER_MIB),
    ("nebula_gpu_temperature_celsius", "GPU temperature in degrees C (DCGM_FI_DEV_GPU_TEMP)",
     "temperature_c", 1),
    ("nebula_gpu_power_watts", "Power draw in W (DCGM_FI_DEV_POWER_USAGE)", "power_w", 1),
    ("nebula_gpu_power_limit_watts", "Power management limit in W (DCGM_FI_DEV_POWER_MGMT_LIMIT)",
     "power_limit_w", 1),
    ("nebula_gpu_fan_speed_percent", "Fan speed in percent (DCGM_FI_DEV_FAN_SPEED)", "fan_pct", 1),
    ("nebula_gpu_sm_clock_hertz", "SM clock in Hz (DCGM_FI_DEV_SM_CLOCK, which counts MHz)",
     "sm_clock_mhz", 1e6),
    ("nebula_gpu_memory_clock_hertz", "Memory clock in Hz (DCGM_FI_DEV_MEM_CLOCK, which counts MHz)",
     "mem_clock_mhz", 1e6),
)
#: Queue waits: from a second to a day.
WAIT_BUCKETS = (1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 12 * 3600, 86400)
#: Scheduling passes: from a millisecond to ten seconds.
PASS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10)
#: How long a scrape waits for the head's loop.
GATHER_TIMEOUT_S = 10.0


class Metrics:
    def __init__(self, state: HeadState):
        self.state = state
        self.registry = CollectorRegistry()
        self.wait = Histogram("nebula_queue_wait_seconds",
                              "Time from submit to start of the jobs that started (no DCGM field)",
                              buckets=WAIT_BUCKETS, registry=self.registry)
        self.passes = Histogram("nebula_scheduler_pass_seconds",
                                "Duration of one scheduling pass (no DCGM field)",
                                buckets=PASS_BUCKETS, registry=self.registry)
        self.forecast_error = Histogram(
            "nebula_forecast_error_seconds",
            "How far each job's start was from the head's first start forecast for it, "
            "either way (no DCGM field)", buckets=WAIT_BUCKETS, registry=self.registry)
        ProcessCollector(registry=self.registry)  # the head's own CPU, memory, open files
        self.registry.register(_Gathered(self))
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: BoundedHttpServer | None = None

    # ------------------------------------------------------------ what happens
    def job_started(self, job: Job, forecast_at: float | None = None) -> None:
        """A job started; ``forecast_at``: the start the head first forecast for it."""
        if job.started_at is not None:
            self.wait.observe(max(0.0, job.started_at - job.submitted_at))
            if forecast_at is not None:
                self.forecast_error.observe(abs(job.started_at - forecast_at))

    def pass_done(self, seconds: float) -> None:
        self.passes.observe(seconds)

    # ------------------------------------------------------------------ serving
    def serve_http(self, host: str, port: int) -> None:
        """Serve /metrics on host:port (a thread of prometheus_client's). Raises OSError
        when the address cannot be bound."""
        self._loop = asyncio.get_running_loop()
        self._server = BoundedHttpServer.serving(host, port, make_wsgi_app(self.registry))
        log.info("metrics on http://%s:%d/metrics", host, port)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def gather_from_thread(self) -> list:
        """The families of one scrape, gathered on the head's loop (called by the HTTP
        thread); nothing when the loop does not answer in time."""
        if self._loop is None:
            return self.gather()
        future = asyncio.run_coroutine_threadsafe(self._gather(), self._loop)
        try:
            return future.result(GATHER_TIMEOUT_S)
        except Exception:  # noqa: BLE001 — a scrape must never take the head down
            log.exception("metrics: gathering failed")
            future.cancel()
            return []

    async def _gather(self) -> list:
        return self.gather()

    # ----------------------------------------------------------------- families
    def gather(self) -> list:
        """Every family of this head's state now (on the loop: it reads live state)."""
        return [*self._gpu_families(), *self._job_families(), *self._user_families(),
                *self._node_families()]

    def _gpu_families(self) -> list:
        state = self.state
        families = {name: GaugeMetricFamily(name, text, labels=GPU_LABELS)
                    for name, text, _, _ in GPU_READINGS}
        extra = {
            "maintenance": GaugeMetricFamily(
                "nebula_gpu_maintenance", "1 while the GPU is in maintenance (isolated after "
                "errors; no DCGM field)", labels=GPU_LABELS),
            "reserved": GaugeMetricFamily(
                "nebula_gpu_reserved_bytes", "Memory promised to the jobs holding the GPU "
                "(slices, or the whole card; no DCGM field)", labels=GPU_LABELS),
            "jobs": GaugeMetricFamily("nebula_gpu_jobs", "Jobs holding the GPU (no DCGM field)",
                                      labels=GPU_LABELS),
        }
        for uuid, live in sorted(state.gpus.items(), key=lambda kv: (kv[1].node, kv[1].reading.index)):
            r = live.reading
            labels = [live.node, str(r.index), uuid, r.name, r.vendor]
            for name, _, field, scale in GPU_READINGS:
                value = getattr(r, field)
                if value is not None:
                    families[name].add_metric(labels, value * scale)
            held = state.jobs.held(uuid)
            extra["maintenance"].add_metric(labels, 1 if live.maintenance else 0)
            extra["reserved"].add_metric(labels, sum(p.memory_mb for _, p in held) * BYTES_PER_MIB)
            extra["jobs"].add_metric(labels, len({job_id for job_id, _ in held}))
        return [*families.values(), *extra.values()]

    def _job_families(self) -> list:
        state = self.state
        live = GaugeMetricFamily("nebula_jobs", "Jobs not yet ended, by state (no DCGM field)",
                                 labels=("state",))
        counts = {s: 0 for s in JobState if not s.finished}
        oldest = None
        now = state.clock()
        for job in state.jobs.values():
            counts[job.state] = counts.get(job.state, 0) + 1
            if job.state == JobState.PENDING and (oldest is None or job.submitted_at < oldest):
                oldest = job.submitted_at
        for s, n in counts.items():
            live.add_metric([s.value], n)
        ended = CounterMetricFamily("nebula_jobs_ended", "Jobs that ended, by end state "
                                    "(no DCGM field)", labels=("state",))
        for name, n in state.store.ended_counts().items():
            ended.add_metric([name], n)
        waiting = GaugeMetricFamily("nebula_queue_oldest_wait_seconds",
                                    "How long the longest-waiting job has waited (no DCGM field)")
        waiting.add_metric([], now - oldest if oldest is not None else 0.0)
        return [live, ended, waiting]

    def _user_families(self) -> list:
        state = self.state
        total = CounterMetricFamily("nebula_user_gpu_hours", "GPU-hours charged to each user, "
                                    "a slice its GB over the reference card's (no DCGM field)", labels=("user",))
        month = GaugeMetricFamily("nebula_user_month_gpu_hours", "GPU-hours charged to each user "
                                  "this calendar month (no DCGM field)", labels=("user",))
        this_month = state.store.usage_since(month_start(state.clock()))
        for row in state.store.users():
            total.add_metric([row["name"]], row["gpu_hours"] or 0.0)
            month.add_metric([row["name"]], this_month.get(row["name"], 0.0))
        return [total, month]

    def _node_families(self) -> list:
        state = self.state
        up = GaugeMetricFamily("nebula_node_up", "1 while the head reaches the node "
                               "(no DCGM field)", labels=("node",))
        node_state = GaugeMetricFamily("nebula_node_state", "1 for the node's state: connecting, "
                                       "up, unknown, down (no DCGM field)", labels=("node", "state"))
        drained = GaugeMetricFamily("nebula_node_drained", "1 while the node takes no new jobs "
                                    "(no DCGM field)", labels=("node",))
        health = GaugeMetricFamily("nebula_node_health_score", "The node's health score, 1 "
                                   "healthy, lower after throttling (no DCGM field)", labels=("node",))
        for name, view in sorted(state.nodes.items()):
            up.add_metric([name], 1 if view.state == NodeState.UP else 0)
            for s in (NodeState.CONNECTING, NodeState.UP, NodeState.UNKNOWN, NodeState.DOWN):
                node_state.add_metric([name, s.value], 1 if view.state == s else 0)
            drained.add_metric([name], 1 if view.drained else 0)
            health.add_metric([name], state.health_score(name))
        return [up, node_state, drained, health]


class _Gathered:
    """The registry's collector of the head's live state (gathered on the loop)."""

    def __init__(self, metrics: Metrics):
        self.metrics = metrics

    def collect(self):
        return self.metrics.gather_from_thread()

    def describe(self):
        return []  # nothing known before the first scrape; registering must not gather


class _QuietHandler(WSGIRequestHandler):
    timeout = SCRAPE_TIMEOUT_S  # the socket's: a client that sends nothing is closed

    def setup(self):
        super().setup()
        self.server.head_awaited(self.connection)

    def parse_request(self):
        whole = super().parse_request()  # the request line read, this reads the headers
        self.server.head_read(self.connection)
        return whole

    def finish(self):
        self.server.head_read(self.connection)  # a request that ended before its headers
        super().finish()

    def log_message(self, format, *args):  # noqa: A002 — the base class's name
        pass  # one line per scrape (or per idle client dropped) is not the head's log's


class BoundedHttpServer(ThreadingMixIn, WSGIServer):
    """A thread per connection, at most MAX_SCRAPERS of them; a request head that takes
    longer than REQUEST_HEAD_S to arrive is cut, and the slowest head in coming gives way to
    a new connection when every slot is taken."""

    daemon_threads = True

    def __init__(self, address, family: int):
        self.address_family = family
        super().__init__(address, _QuietHandler)
        self._slots = threading.BoundedSemaphore(MAX_SCRAPERS)
        # connections whose head is still coming, oldest first -> the timer that cuts them
        self._heads: dict[socket.socket, threading.Timer] = {}
        self._heads_lock = threading.Lock()

    @classmethod
    def serving(cls, host: str, port: int, app) -> "BoundedHttpServer":
        """The server on host:port, answering with ``app`` from a thread of its own."""
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        server = cls((host, port), family)
        server.set_app(app)
        threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
        return server

    # ------------------------------------------------------- the request heads
    def head_awaited(self, connection: socket.socket) -> None:
        timer = threading.Timer(REQUEST_HEAD_S, self._cut, (connection,))
        timer.daemon = True
        with self._heads_lock:
            self._heads[connection] = timer
        timer.start()

    def head_read(self, connection: socket.socket) -> None:
        with self._heads_lock:
            timer = self._heads.pop(connection, None)
        if timer is not None:
            timer.cancel()

    def _cut(self, connection: socket.socket) -> bool:
        """Close a connection whose head is still coming (its thread's read ends at once);
        whether there was one. Under the lock, so a connection whose head was read meanwhile
        (and may be closed, its descriptor reused) is never touched."""
        with self._heads_lock:
            if self._heads.pop(connection, None) is None:
                return False
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # gone already
        return True

    def _cut_slowest(self) -> bool:
        with self._heads_lock:
            slowest = next(iter(self._heads), None)
        return slowest is not None and self._cut(slowest)

    # -------------------------------------------------------------- the slots
    def process_request(self, request, client_address):
        if not self._slots.acquire(blocking=False) and not (
                self._cut_slowest() and self._slots.acquire(timeout=EVICTED_SLOT_WAIT_S)):
            self.shutdown_request(request)  # as many scrapes as it serves already: closed at once
            return
        try:
            super().process_request(request, client_address)
        except Exception:
            self._slots.release()
            raise

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request, client_address):
        # A client cut or gone mid-request is no error of the head's; anything else is logged.
        log.debug("metrics: a request from %s failed", client_address, exc_info=True)
