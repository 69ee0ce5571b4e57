"""TUI bench: 1,000 GPUs and 10,000 jobs; keypress-to-render latency and idle CPU.

    python bench/tui.py [--gpus 1000] [--jobs 10000] [--idle-s 10] [--presses 5]

The TUI is fed by the real head service in a process of its own (so the TUI's CPU is
measured alone): ``nebula serve``'s code, its SQLite store pre-filled through the Store's
API with 125 nodes x 8 GPUs and 10,000 jobs (1,000 running, 9,000 waiting), the real
engine, scheduler and API server. Only the SSH link to each node is replaced, by
``BenchNode``, which hands the engine the nodelet's probe messages (nvidia-smi's CSV) once
a second per node: the "idle refresh at 1 Hz". Figures:

* keypress-to-render: from the key event being delivered to the app (as the terminal
  driver delivers it) until the last paint it caused has been rendered and encoded for the
  terminal; median and worst of several presses (target <= 100 ms). Pilot's own
  ``press`` + ``pause`` time is printed apart, for comparison with earlier figures;
* idle CPU: process CPU time / wall time while each screen sits and telemetry streams
  (target <= 10% of a core);
* baseline: the same head, a fresh TUI process whose tables recompute and repaint every
  row, and whose overview recomputes and repaints every node card, on each change and
  each tick; and the ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

GPUS_PER_NODE = 8


# ============================================================================ the real head
#: Users who own the jobs; the TUI's own user is one of them (for the "mine" filter).
N_USERS = 20
MODEL = "NVIDIA A100-SXM4-80GB"
TOTAL_MB = 81920


def write_cluster(root: Path, n_gpus: int) -> Path:
    """A nodes.yaml of ``n_gpus / 8`` nodes (never dialled: see ``BenchNode``)."""
    n_nodes = (n_gpus + GPUS_PER_NODE - 1) // GPUS_PER_NODE
    (root / "known_hosts").write_text("")
    lines = ["cluster:", "  name: bench", f"  known_hosts: {root / 'known_hosts'}",
             "  probe_interval: 1", "nodes:"]
    lines += [f"  - {{name: node{n:03d}, host: 127.0.0.1, port: {20000 + n}}}" for n in range(n_nodes)]
    path = root / "nodes.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def gpu_layout(n_gpus: int) -> list[tuple[str, int, str]]:
    """(node, index, uuid) of every GPU, in node order."""
    return [(f"node{g // GPUS_PER_NODE:03d}", g % GPUS_PER_NODE, f"GPU-bench-{g:05d}")
            for g in range(n_gpus)]


def prefill(home: Path, n_gpus: int, n_jobs: int) -> None:
    """The store as a busy lab leaves it, written through the Store's own API: every GPU
    registered, the first ``n_gpus`` jobs running on a whole card each, the rest waiting
    for a whole card (so the scheduler's passes start nothing new)."""
    from nebula_tui.model import JobSpec, Placement
    from nebula_tui.store import Store

    me = getpass.getuser()
    users = [me] + [f"user{u:02d}" for u in range(1, N_USERS)]
    store = Store(home / "state.db")
    t0 = time.time() - 3600
    gpus = gpu_layout(n_gpus)
    by_node: dict[str, list[dict]] = {}
    for node, index, uuid in gpus:
        by_node.setdefault(node, []).append(
            {"uuid": uuid, "idx": index, "model": MODEL, "vendor": "nvidia", "total_mb": TOTAL_MB,
             "compute_cap": "8.0", "pci_bus_id": f"00000000:{index + 7:02X}:00.0",
             "driver_version": "550.54.15", "cuda_version": "12.4"})
    for node, descriptors in by_node.items():
        store.register_gpus(node, descriptors, t0)
    for j in range(n_jobs):
        spec = JobSpec(command=("python", "train.py", f"--seed={j}"), name=f"train-{j + 1}")
        job = store.add_job(users[j % len(users)], spec, t0 + j * 0.1)
        if j < len(gpus):
            node, index, uuid = gpus[j]
            store.start_launching(job.id, (Placement(uuid, node, index, TOTAL_MB, True),), t0 + 1200)
            store.mark_running(job.id, t0 + 1200 + j * 0.1)
    store.close()


class BenchNode:
    """Stands in for ``remote.ssh.NodeLink`` inside the real head: the same constructor,
    callbacks and requests, but instead of an SSH connection to a nodelet it says hello and
    then emits the nodelet's ``probe`` message (nvidia-smi's CSV) ``hz`` times a second.
    Everything behind the callbacks (engine, store, scheduler, API, events) is the real head.
    125 real nodes (sshd + nodelet + emulated nvidia-smi each, every second) would not fit on
    the 2-core machine the bench runs on next to the TUI it measures."""

    hz = 1.0
    layout: list[tuple[str, int, str]] = []  # every GPU (node, index, uuid)
    job_of: dict[str, int] = {}  # GPU uuid -> job running on it (from the store)
    tokens: dict[int, str] = {}  # running job -> its launch token (from the store)

    def __init__(self, node, cluster, on_message, on_state, head=None):
        self.node, self.on_message, self.on_state = node, on_message, on_state
        self.gpus = [(i, u) for n, i, u in self.layout if n == node.name]
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"bench-node-{self.node.name}")

    async def close(self) -> None:
        if self._task:
            self._task.cancel()

    async def request(self, op: str, timeout: float | None = None, **fields) -> dict:
        """The nodelet's replies that change nothing: the pre-filled running jobs still
        running (reconcile), an empty log, launches and cancels accepted."""
        if op == "list":
            from labkit.swarm import list_reply

            mine = {self.job_of[u] for _, u in self.gpus if u in self.job_of}
            return {"ok": True, **list_reply({j: (self.tokens.get(j), None) for j in mine})}
        return {"ok": True, "data": "", "offset": fields.get("offset", 0)}

    def probe(self, tick: int) -> dict:
        """This node's readings at second ``tick``: busy cards move, idle ones do not."""
        devices, processes, pid_jobs = [], [], {}
        for index, uuid in self.gpus:
            job = self.job_of.get(uuid)
            seed = int(uuid[-5:])
            util = (tick * 7 + seed * 13) % 100 if job else 0
            used = 20000 + (seed * 977) % 50000 if job else 0
            temp = 35 + (tick + seed) % 35 if job else 33
            devices.append({"index": index, "uuid": uuid, "name": MODEL, "vendor": "nvidia",
                            "pci_bus_id": f"00000000:{index + 7:02X}:00.0",
                            "memory_total_mb": TOTAL_MB, "memory_used_mb": used,
                            "utilization_pct": float(util), "temperature_c": float(temp),
                            "power_w": 60.0 + util * 3, "power_limit_w": 400.0, "fan_pct": None,
                            "sm_clock_mhz": 1410.0, "mem_clock_mhz": 1593.0, "pstate": "P0",
                            "driver_version": "550.54.15", "compute_cap": "8.0",
                            "visible_env": "CUDA_VISIBLE_DEVICES", "visible_id": str(index)})
            if job:
                pid = 10000 + seed
                processes.append({"gpu_uuid": uuid, "pid": pid, "name": "python",
                                  "used_memory_mb": used})
                pid_jobs[str(pid)] = str(job)
        return {"type": "probe", "t": time.time(), "error": "", "devices": devices,
                "processes": processes, "problems": [], "clamped": [], "pid_jobs": pid_jobs,
                "pid_users": {}}

    async def _run(self) -> None:
        from nebula_tui.model import NodeState

        self.on_message(self.node.name, {"type": "hello", "hostname": self.node.name,
                                         "smi_table": "| NVIDIA-SMI 550.54.15   Driver Version: "
                                                      "550.54.15   CUDA Version: 12.4 |"})
        self.on_message(self.node.name, self.probe(0))
        self.on_state(self.node.name, NodeState.UP, "")
        tick = 0
        while True:
            await asyncio.sleep(1 / self.hz)
            tick += 1
            self.on_message(self.node.name, self.probe(tick))


def head_main(home: str, config: str, n_gpus: int, hz: float) -> None:
    """The head process: ``nebula serve``'s own code with ``BenchNode`` for the SSH links."""
    from nebula_tui.head import nodes
    from nebula_tui.head.serve import serve
    from nebula_tui.homedir import Home
    from nebula_tui.store import Store

    store = Store(Path(home) / "state.db")
    BenchNode.job_of = {p.gpu_uuid: job_id for job_id, p in store.active_placements()}
    BenchNode.tokens = dict(store.db.execute(
        "SELECT id, launch_token FROM jobs WHERE launch_token IS NOT NULL").fetchall())
    store.close()
    BenchNode.layout, BenchNode.hz = gpu_layout(n_gpus), hz
    nodes.NodeLink = BenchNode
    sys.exit(serve(Home(Path(home).resolve()), Path(config)))


def start_head(root: Path, n_gpus: int, n_jobs: int, hz: float) -> tuple[subprocess.Popen, Path]:
    """Pre-fill the store, start the head process, and wait until every node is up and the
    first scheduling pass has given every waiting job its reason."""
    from nebula_tui.api import ApiError, Client

    started = time.monotonic()
    prefill(root, n_gpus, n_jobs)
    config = write_cluster(root, n_gpus)
    socket = root / "nebula.sock"
    with open(root / "head.log", "wb") as log:
        head = subprocess.Popen([sys.executable, __file__, "--head", str(root), str(config),
                                 "--gpus", str(n_gpus), "--hz", str(hz)],
                                stdout=log, stderr=log, stdin=subprocess.DEVNULL)

    def ready() -> bool:
        try:
            with Client(socket, timeout=30) as client:
                nodes = client.call("status")["nodes"]
                jobs = client.call("queue")["jobs"]
        except (ApiError, OSError):
            return False
        return (all(n["state"] == "up" for n in nodes) and len(jobs) == n_jobs
                and all(j["reason"] != "waiting for the scheduler" for j in jobs))

    deadline = time.monotonic() + 180
    while not ready():
        if head.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the head did not come up: see {root / 'head.log'}")
        time.sleep(0.5)
    print(f"head ready in {time.monotonic() - started:.1f} s (store pre-filled, {n_gpus // GPUS_PER_NODE} "
          f"nodes up, first scheduling pass done)")
    return head, socket


# ============================================================================ measurements
class Paints:
    """Hooks ``App._display``, where a frame the compositor rendered goes to the terminal,
    and records when each paint ended, and the app's mode then. Under ``run_test`` the
    driver is headless and Textual skips the terminal write, so the hook also encodes the
    frame as the escape sequences a terminal would get (``render_segments``): a paint costs
    what it costs in a terminal."""

    def __init__(self, app) -> None:
        self.app, self.times, self.modes = app, [], []
        self._display = app._display
        app._display = self.display

    def display(self, screen, update) -> None:
        painting = update is not None and not self.app._batch_count
        self._display(screen, update)
        if painting:
            if self.app.is_headless and hasattr(update, "render_segments"):
                update.render_segments(self.app.console)
            self.times.append(time.perf_counter())
            self.modes.append(self.app.current_mode)

    async def quiet(self, gap_s: float, timeout_s: float) -> None:
        """Wait for the next paint (the screen's once-a-second refresh), then until
        ``gap_s`` passed without one; give up waiting after ``timeout_s``."""
        deadline = time.perf_counter() + timeout_s
        count = len(self.times)
        while time.perf_counter() < deadline and len(self.times) == count:
            await asyncio.sleep(0.005)
        while time.perf_counter() < deadline:
            if time.perf_counter() - self.times[-1] >= gap_s:
                return
            await asyncio.sleep(0.005)


#: After a key, the app is done once it has been idle (under half a core busy) and has not
#: painted for this long (seconds).
SETTLED_S = 0.1


async def settled(paints: Paints, since: float, first_within: float, shown=None,
                  timeout_s: float = 10.0) -> int:
    """Wait for the first paint after ``since`` (up to ``first_within`` seconds), for a
    switch the first one made in the mode ``shown`` (the new screen: a paint of the old one
    before the switch took effect is not the key's), then until the app is idle and its
    last paint is ``SETTLED_S`` old. Returns the index of that first paint. Idle is judged
    by CPU time as well as by the time since the last paint: while the app computes, this
    coroutine does not run either. (The paint is found by the mode it was made in, not by
    polling the mode: a switch and its paint can both happen before this coroutine runs.)"""
    count = len(paints.times)
    if shown is not None:
        while time.perf_counter() - since < timeout_s:
            hit = next((i for i in range(count, len(paints.times)) if paints.modes[i] == shown),
                       None)
            if hit is not None:
                count = hit
                break
            await asyncio.sleep(0.002)
        else:
            count = len(paints.times)
    while len(paints.times) == count and time.perf_counter() - since < first_within:
        await asyncio.sleep(0.002)
    if len(paints.times) == count:
        return count
    while time.perf_counter() - since < timeout_s:
        c0, w0 = time.process_time(), time.perf_counter()
        await asyncio.sleep(0.02)
        busy = (time.process_time() - c0) / (time.perf_counter() - w0) > 0.5
        if not busy and time.perf_counter() - paints.times[-1] >= SETTLED_S:
            break
    return count


async def key_to_paint(app, paints: Paints, key: str, shown=None) -> tuple[float, float] | None:
    """Deliver ``key`` to the app as its terminal driver does and time it until the last
    paint it caused: (first paint, last paint) in ms after delivery, None when nothing was
    painted. Pressed just after a paint (the 1 Hz refresh), so that no refresh of the next
    second falls inside the measured interval (unless the key's own work runs that long).
    ``shown``: for a screen switch, the mode switched to."""
    from textual import events

    await paints.quiet(0.03, 1.5)
    char = key if len(key) == 1 else None
    start = time.perf_counter()
    app._driver.send_message(events.Key(key, char))
    first = await settled(paints, start, 10.0, shown)
    if len(paints.times) == first:
        return None
    return (paints.times[first] - start) * 1000, (paints.times[-1] - start) * 1000


async def measure(socket: Path, idle_s: float, presses: int) -> dict:
    from nebula_tui.screens.app import make_app
    from nebula_tui.screens.widgets.rowtable import RowTable

    app = make_app(socket)
    out: dict = {"latency_ms": {}, "first_paint_ms": {}, "idle_cpu_pct": {}, "pilot_ms": {},
                 "telemetry_hz": {}}
    updates = [0]  # node readings the TUI received
    apply_gpus = app.cluster.apply_gpus

    def counted(*event) -> bool:
        updates[0] += 1
        return apply_gpus(*event)

    app.cluster.apply_gpus = counted
    async with app.run_test(size=(160, 48)) as pilot:
        paints = Paints(app)
        t0 = time.monotonic()
        while len(app.cluster.jobs) < 1 or not app.cluster.connected:
            await pilot.pause(0.05)
        await paints.quiet(0.3, 10)
        out["snapshot_s"] = time.monotonic() - t0

        modes = {"1": "overview", "2": "gpus", "3": "queue"}

        async def timed(key: str, label: str | None = None, times: int = 1) -> None:
            for _ in range(times):
                switch = modes.get(key) if app.current_mode != modes.get(key) else None
                got = await key_to_paint(app, paints, key, shown=switch)
                if label:
                    out["latency_ms"].setdefault(label, []).append(got and got[1])
                    out["first_paint_ms"].setdefault(label, []).append(got and got[0])

        async def show(screen: str) -> None:
            if app.current_mode != screen:
                await timed(next(k for k, m in modes.items() if m == screen))

        async def idle(label: str) -> None:
            await paints.quiet(0.3, 3)
            c0, w0, n0 = time.process_time(), time.monotonic(), updates[0]
            await asyncio.sleep(idle_s)
            wall = time.monotonic() - w0
            out["idle_cpu_pct"][label] = 100 * (time.process_time() - c0) / wall
            out["telemetry_hz"][label] = (updates[0] - n0) / wall

        # Screen switches: the first visit builds the screen, later ones show it again.
        for key, label in (("2", "open GPUs (first visit)"), ("3", "open Queue (first visit)")):
            await timed(key, label)
        for _ in range(presses):
            for key, label in (("1", "switch to Overview"), ("2", "switch to GPUs"),
                               ("3", "switch to Queue")):
                await timed(key, label)
        for key, label, screen in (("down", "Queue: cursor down", "queue"),
                                   ("pagedown", "Queue: page down", "queue"),
                                   ("end", "Queue: to the last of 10,000 jobs", "queue"),
                                   ("home", "Queue: back to the first job", "queue"),
                                   ("m", "Queue: toggle 'mine' (10,000 <-> 500 jobs)", "queue"),
                                   ("s", "GPUs: next sort order (1,000 GPUs)", "gpus"),
                                   ("down", "GPUs: cursor down", "gpus"),
                                   ("down", "Overview: cursor down in its queue", "overview")):
            await show(screen)
            await timed(key, label, presses)
        # The queue holds every job (not only "mine"): the last one is reachable by scrolling.
        await show("queue")
        if app.screen.mine:
            await timed("m")
        await timed("end")
        table = app.screen.query_one("#queue-table", RowTable)
        out["last_row"] = f"row {table.cursor_row + 1:,} of {table.row_count:,}: job {table.cursor_key}"
        # What the previous version of this bench timed: Pilot.press then pilot.pause. An
        # unbound key paints nothing, so it has no keypress-to-paint figure above: its
        # Pilot figure is Pilot's own waiting.
        for key, label in (("z", "unbound key"), ("down", "Queue: cursor down")):
            for _ in range(presses):
                await paints.quiet(0.05, 2.0)
                start = time.perf_counter()
                await pilot.press(key)
                await pilot.pause()
                out["pilot_ms"].setdefault(label, []).append((time.perf_counter() - start) * 1000)
        for screen in ("overview", "gpus", "queue"):
            await show(screen)
            await idle(app.screen.SCREEN_TITLE)
    return out


def _fmt(times: list) -> str:
    got = [t for t in times if t is not None]
    if not got:
        return "no repaint (nothing changed on screen)"
    worst = max(got)
    return (f"median {statistics.median(got):6.1f} ms   worst {worst:6.1f} ms   "
            f"{'OK' if worst <= 100 else 'OVER 100 ms'}")


def summarize(name: str, result: dict) -> None:
    print(f"\n== {name} ==  (snapshot of the head handled and painted in {result['snapshot_s']:.2f} s)")
    print("  keypress -> last paint of its result (first paint in brackets):")
    for label, times in result["latency_ms"].items():
        first = [t for t in result["first_paint_ms"][label] if t is not None]
        extra = f"   [first {statistics.median(first):5.1f} ms]" if first else ""
        print(f"    {label:<44} {_fmt(times)}{extra}")
    print(f"  queue scrolled to the end: {result['last_row']}")
    print("  Pilot.press + pilot.pause (what the previous bench timed; Pilot's own waits):")
    for label, times in result["pilot_ms"].items():
        print(f"    {label:<44} median {statistics.median(times):6.1f} ms")
    for label, pct in result["idle_cpu_pct"].items():
        rate = result["telemetry_hz"][label]
        print(f"  idle on {label:<9} CPU {pct:5.1f}% of a core   {'OK' if pct <= 10 else 'OVER 10%'}"
              f"   (telemetry received: {rate:.0f} node readings/s)")
        if rate < 0.9 * result["nodes"] * result["hz"]:
            print(f"    ^ below the {result['nodes'] * result['hz']:.0f}/s sent: the head fell behind "
                  "(machine busy?), so this figure understates the cost at 1 Hz")


async def stream_floor(socket: Path, seconds: float) -> tuple[float, float]:
    """CPU of the TUI's own client (``api.AsyncClient.events``) reading and decoding the
    head's event stream for ``seconds``, with no Textual app: the part of the idle figure
    that no screen can save. Returns (% of a core, events a second)."""
    from nebula_tui.api import AsyncClient

    events = 0
    stream = AsyncClient(socket).events()
    async for event in stream:
        if event.get("type") == "snapshot":
            c0, w0 = time.process_time(), time.perf_counter()
            continue
        events += 1
        if time.perf_counter() - w0 >= seconds:
            break
    await stream.aclose()
    wall = time.perf_counter() - w0
    return 100 * (time.process_time() - c0) / wall, events / wall


# ============================================================================ baseline
def rebuild_rows(self, keys=None) -> None:
    """The baseline's ``RowTable.refresh_rows``: every row's cells computed again and the
    whole table repainted, as a table rebuilt on every change would (whichever rows
    ``keys`` says changed)."""
    self._cells.clear()
    self._lines.clear()
    for key in self.row_keys:
        self._grow(self._row_cells(key))
    self._resize_virtual()
    self.refresh()


def redraw_cards(self, names) -> None:
    """The baseline's ``NodeCards.refresh_cards``: every card computed and painted again."""
    self._stale.update(self._texts)
    for name in self.names:
        self.card_text(name)
    self._lines.clear()
    self.refresh()


def run_tui(socket: Path, args, rebuild: bool) -> dict:
    from nebula_tui.screens.widgets import nodecards, rowtable

    if rebuild:
        rowtable.RowTable.refresh_rows = rebuild_rows
        nodecards.NodeCards.refresh_cards = redraw_cards
    result = asyncio.run(measure(socket, args.idle_s, args.presses))
    result["nodes"], result["hz"] = args.gpus // GPUS_PER_NODE, args.hz
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=1000)
    parser.add_argument("--jobs", type=int, default=10000)
    parser.add_argument("--idle-s", type=float, default=10.0)
    parser.add_argument("--presses", type=int, default=5)
    parser.add_argument("--hz", type=float, default=1.0, help=argparse.SUPPRESS)
    parser.add_argument("--head", nargs=2, metavar=("HOME", "CONFIG"), help=argparse.SUPPRESS)
    parser.add_argument("--baseline", metavar="SOCKET", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.head:  # child: the head process
        head_main(args.head[0], args.head[1], args.gpus, args.hz)
        return
    if args.baseline:  # child: the baseline TUI, JSON only
        print(json.dumps(run_tui(Path(args.baseline), args, rebuild=True)))
        return
    print(f"TUI bench: {args.gpus} GPUs, {args.jobs} jobs, readings of every node at {args.hz:g} Hz; "
          f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    root = Path(tempfile.mkdtemp(prefix="nebula-tui-bench-"))
    head, socket = start_head(root, args.gpus, args.jobs, args.hz)
    try:
        inplace = run_tui(socket, args, rebuild=False)
        summarize("the TUI (visible rows only, updated in place)", inplace)
        pct, rate = asyncio.run(stream_floor(socket, args.idle_s))
        print(f"  floor: the TUI's client alone reading and decoding the head's stream (no "
              f"Textual): CPU {pct:.1f}% of a core at {rate:.0f} node readings/s")
        # The baseline in a fresh interpreter: it patches the table's refresh.
        done = subprocess.run([sys.executable, __file__, "--baseline", str(socket),
                               "--gpus", str(args.gpus), "--hz", str(args.hz),
                               "--idle-s", str(args.idle_s), "--presses", str(args.presses)],
                              capture_output=True, text=True, timeout=900)
    finally:
        head.terminate()
        head.wait(30)
        shutil.rmtree(root, ignore_errors=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        print(f"\nbaseline (rebuild whole tables) did not finish: {last}")
        return
    baseline = json.loads(done.stdout.strip().splitlines()[-1])
    summarize("baseline: every row recomputed and repainted on every change", baseline)
    print("\n== ratio (baseline / in place) ==")
    for label, pct in inplace["idle_cpu_pct"].items():
        base = baseline["idle_cpu_pct"][label]
        print(f"  idle CPU on {label:<12} {base:5.1f}% / {pct:5.1f}% = {base / max(pct, 0.01):5.1f}x")
    for label in ("switch to Overview", "Queue: cursor down", "Queue: toggle 'mine' (10,000 <-> 500 jobs)",
                  "GPUs: next sort order (1,000 GPUs)"):
        a = statistics.median(t for t in inplace["latency_ms"][label] if t is not None)
        b = statistics.median(t for t in baseline["latency_ms"][label] if t is not None)
        print(f"  {label:<44} {b:7.1f} ms / {a:7.1f} ms = {b / max(a, 0.01):5.1f}x")


if __name__ == "__main__":
    main()
