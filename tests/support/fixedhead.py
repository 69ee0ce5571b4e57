"""A head that always says the same: fixed data behind a real Unix socket, for pixel-stable
snapshots of the TUI.

The behaviour tests drive the TUI against the real head on the simulated lab; its readings,
times and job ids move from run to run, so its screens cannot be compared pixel by pixel.
This module answers the TUI's requests (the same JSON lines protocol, through the real
``AsyncClient``) from one fixed lab: three nodes (one of them unreachable), nine GPUs (one
in maintenance, one holding memory nobody started through NebulaGrid), running, waiting,
held and ended jobs, users and their month's report, an events log, a log and a
GPU's history. ``NOW`` is the clock
the screens are drawn at (``render.set_clock``).
"""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

from nebula_tui.scheduler.slices import COMMON_SIZES_GB, count_fit
from nebula_tui.views import JobPhase

#: The moment every screen is drawn at (2026-09-21 12:00:00 UTC).
NOW = 1_790_000_000.0
USER = "alice"

_MODELS = {
    "4090": ("NVIDIA GeForce RTX 4090", 24564, "8.9", 450.0),
    "4060": ("NVIDIA GeForce RTX 4060 Laptop GPU", 8188, "8.9", 80.0),
    "a100": ("NVIDIA A100-SXM4-80GB", 81920, "8.0", 400.0),
    "3090": ("NVIDIA GeForce RTX 3090", 24576, "8.6", 350.0),
}


def _gpu(node: str, index: int, kind: str, *, used: int, util: float, temp: float, power: float,
         status: str = "busy", slices=(), unmanaged: int = 0, blocked: str | None = None,
         processes=(), nvlink=()) -> dict:
    model, total, cc, limit = _MODELS[kind]
    held = [s for s in slices if s["state"] == "allocated"]
    free = 0 if any(s.get("exclusive") for s in held) or blocked or len(held) >= 4 else \
        total - sum(s["memory_mb"] for s in held) - unmanaged
    slices = list(slices) + ([{"id": len(held) + 1, "memory_mb": free, "state": "free", "job": None,
                               "exclusive": False}] if free >= 4096 else [])
    # what the head publishes: the scheduler's own count, on these numbers
    fits = {f"{gb}G": 0 if blocked or status == "unreachable" else
            count_fit(total, unmanaged, sum(s["memory_mb"] for s in held), len(held),
                      any(s.get("exclusive") for s in held), gb * 1024) for gb in COMMON_SIZES_GB}
    return {
        "uuid": f"GPU-{node[-2:]}{index}00000-0000-4000-8000-00000000000{index}", "node": node,
        "index": index, "model": model, "vendor": "nvidia", "total_memory_mb": total,
        "compute_capability": f"sm_{cc.replace('.', '')}", "pci_bus_id": f"00000000:{index + 1:02X}:00.0",
        "nvlink": list(nvlink), "status": status, "blocked": blocked, "driver_version": "550.54.15",
        "cuda_version": "12.4", "slices": slices, "jobs": sorted({s["job"] for s in held}),
        "memory_used_mb": used, "utilization_pct": util, "temperature_c": temp, "power_w": power,
        "power_limit_w": limit, "unmanaged_used_mb": unmanaged, "health_score": 1.0,
        "processes": list(processes), "fits": fits,
    }


def _slice(n: int, mb: int, job: int, exclusive: bool = False) -> dict:
    return {"id": n, "memory_mb": mb, "state": "allocated", "job": job, "exclusive": exclusive}


def _job(job_id: int, user: str, name: str, state: str, *, gpus=(), count=1, mem=None,
         submitted: float, started: float | None = None, ended: float | None = None,
         exit_code: int | None = None, reason: str = "", held_by: str | None = None,
         command: str = "python train.py") -> dict:
    return {"id": job_id, "user": user, "name": name, "state": state, "reason": reason,
            "node": gpus[0]["node"] if gpus else None, "command": [command], "shell": True,
            "gpu_count": count, "gpu_mem_mb": mem, "workdir": None, "submitted_at": submitted,
            "started_at": started, "ended_at": ended, "exit_code": exit_code,
            "held": bool(held_by), "held_by": held_by, "attempt": 1, "gpus": list(gpus),
            "phase": (JobPhase.HELD if held_by and state == "pending" else JobPhase(state)).value}


def _placed(node: str, index: int, mb: int, exclusive: bool = False) -> dict:
    uuid = f"GPU-{node[-2:]}{index}00000-0000-4000-8000-00000000000{index}"
    return {"uuid": uuid, "node": node, "index": index, "memory_mb": mb, "exclusive": exclusive}


def lab() -> dict:
    """Everything the fixed head knows: snapshot, ended jobs, users, events, log, history."""
    gpus = [
        _gpu("node01", 0, "4090", used=12800, util=87, temp=71, power=341,
             slices=[_slice(1, 8192, 12), _slice(2, 4096, 14)],
             processes=[{"pid": 41230, "name": "python", "used_memory_mb": 8100, "job_id": 12},
                        {"pid": 41388, "name": "python", "used_memory_mb": 4000, "job_id": 14}]),
        _gpu("node01", 1, "4090", used=1, util=0, temp=33, power=18, status="idle"),
        _gpu("node01", 2, "4060", used=1210, util=4, temp=48, power=9, unmanaged=1210,
             processes=[{"pid": 2210, "name": "jupyter-lab", "used_memory_mb": 1210, "job_id": None}]),
        _gpu("node02", 0, "a100", used=71200, util=96, temp=78, power=372,
             slices=[_slice(1, 81920, 15, True)], nvlink=[{"gpu": 1, "link": "NV12"}],
             processes=[{"pid": 9120, "name": "torchrun", "used_memory_mb": 71000, "job_id": 15}]),
        _gpu("node02", 1, "a100", used=70900, util=94, temp=76, power=365,
             slices=[_slice(1, 81920, 15, True)], nvlink=[{"gpu": 0, "link": "NV12"}],
             processes=[{"pid": 9121, "name": "torchrun", "used_memory_mb": 70800, "job_id": 15}]),
        _gpu("node02", 2, "a100", used=1, util=0, temp=31, power=62, status="idle",
             nvlink=[{"gpu": 3, "link": "NV12"}]),
        _gpu("node02", 3, "a100", used=1, util=0, temp=36, power=64, status="maintenance",
             blocked="Xid 79 (fell off the bus) twice within 10 min: check the slot and the power "
                     "cable, then run `nebula gpu resume node02:3`",
             nvlink=[{"gpu": 2, "link": "NV12"}]),
        _gpu("node03", 0, "3090", used=None, util=None, temp=None, power=None, status="unreachable"),
        _gpu("node03", 1, "3090", used=None, util=None, temp=None, power=None, status="unreachable"),
    ]
    for g in gpus:
        if g["memory_used_mb"] is None:
            g["slices"] = []
    h = 3600.0
    jobs = [
        _job(12, "alice", "bert-finetune", "running", gpus=[_placed("node01", 0, 8192)], mem=8192,
             submitted=NOW - 1.5 * h, started=NOW - 1.4 * h,
             command="python finetune.py --model bert-large --epochs 3"),
        _job(14, "bob", "eval-sweep", "running", gpus=[_placed("node01", 0, 4096)], mem=4096,
             submitted=NOW - 760, started=NOW - 740, command="python eval.py --sweep lr"),
        _job(15, "carol", "llama-2gpu", "running",
             gpus=[_placed("node02", 0, 81920, True), _placed("node02", 1, 81920, True)], count=2,
             submitted=NOW - 3.2 * h, started=NOW - 3.1 * h, command="torchrun --nproc 2 train.py"),
        _job(16, "dave", "big-70g", "pending", count=5, mem=71680, submitted=NOW - 1900,
             reason="needs 5 GPUs with ≥70 GB free on one node; the largest node has 4 such GPUs"),
        _job(18, "bob", "resnet", "pending", mem=30720, submitted=NOW - 300,
             reason="needs 1 GPU with ≥30 GB free; best now: node02:2 has 80 GB, held for job 16"),
        _job(17, "alice", "tokenize", "pending", mem=4096, submitted=NOW - 600, held_by="alice"),
    ]
    ended = [
        _job(11, "carol", "warmup", "cancelled", gpus=[_placed("node02", 2, 8192)], mem=8192,
             submitted=NOW - 5 * h, started=NOW - 5 * h + 20, ended=NOW - 4.2 * h, reason="cancelled"),
        _job(10, "bob", "data-prep", "failed", gpus=[_placed("node01", 1, 4096)], mem=4096,
             submitted=NOW - 7 * h, started=NOW - 7 * h + 5, ended=NOW - 6.9 * h, exit_code=1),
        _job(9, "alice", "bert-base", "succeeded", gpus=[_placed("node01", 1, 8192)], mem=8192,
             submitted=NOW - 26 * h, started=NOW - 26 * h + 8, ended=NOW - 24 * h, exit_code=0),
        _job(8, "dave", "sweep-7", "timeout", gpus=[_placed("node03", 0, 24576, True)],
             submitted=NOW - 30 * h, started=NOW - 30 * h + 4, ended=NOW - 28 * h, exit_code=137,
             reason="ran past its 2h limit"),
    ]
    for job in ended:
        job.update(wait_s=job["started_at"] - job["submitted_at"],
                   run_s=job["ended_at"] - job["started_at"], gpu_hours=0.5)
    nodes = [
        {"name": "node01", "host": "10.0.0.11", "port": 22, "state": "up", "reason": "",
         "drained": False, "last_seen": NOW - 2, "hostname": "node01"},
        {"name": "node02", "host": "10.0.0.12", "port": 22, "state": "up", "reason": "",
         "drained": False, "last_seen": NOW - 1, "hostname": "node02", "power_budget_w": 1100},
        {"name": "node03", "host": "10.0.0.13", "port": 22, "state": "unknown",
         "reason": "missed 3 probes", "drained": False, "last_seen": NOW - 95, "hostname": "node03"},
    ]
    events = [
        {"t": NOW - 3.2 * h, "kind": "submitted", "message": "job 15 submitted by carol", "job_id": 15},
        {"t": NOW - 3.1 * h, "kind": "started", "message": "job 15 started on node02:0, node02:1", "job_id": 15},
        {"t": NOW - 1.5 * h, "kind": "submitted", "message": "job 12 submitted by alice", "job_id": 12},
        {"t": NOW - 1.4 * h, "kind": "started", "message": "job 12 started on node01:0", "job_id": 12},
        {"t": NOW - 2400, "kind": "health", "message": "node02:3 isolated: Xid 79 twice within 10 min",
         "job_id": None},
        {"t": NOW - 1900, "kind": "submitted", "message": "job 16 submitted by dave", "job_id": 16},
        {"t": NOW - 760, "kind": "submitted", "message": "job 14 submitted by bob", "job_id": 14},
        {"t": NOW - 740, "kind": "started", "message": "job 14 started on node01:0", "job_id": 14},
        {"t": NOW - 600, "kind": "held", "message": "job 17 held by alice", "job_id": 17},
        {"t": NOW - 300, "kind": "submitted", "message": "job 18 submitted by bob", "job_id": 18},
        {"t": NOW - 95, "kind": "node", "message": "node03 is unknown: missed 3 probes", "job_id": None},
    ]
    for e in events:
        e.update(node=None, gpu=None, user=None)
    users = [
        {"name": "alice", "weight": 1.42, "jobs_finished": 3, "gpu_hours": 11.0,
         "month_gpu_hours": 310.5, "quota_gpu_hours": 2000, "running_jobs": 1},
        {"name": "bob", "weight": 1.18, "jobs_finished": 1, "gpu_hours": 4.0,
         "month_gpu_hours": 88.0, "quota_gpu_hours": 2000, "running_jobs": 1},
        {"name": "carol", "weight": 2.61, "jobs_finished": 9, "gpu_hours": 35.5,
         "month_gpu_hours": 1712.0, "quota_gpu_hours": 2000, "running_jobs": 1},
        {"name": "dave", "weight": 1.05, "jobs_finished": 0, "gpu_hours": 2.5,
         "month_gpu_hours": 2030.0, "quota_gpu_hours": 2000, "running_jobs": 0},
    ]
    # This month's ended jobs per user, as the report counts them (dave's one sat idle).
    month = {"alice": (14, 62.4, 41.3, 312.0), "bob": (6, 38.0, 22.75, 95.0),
             "carol": (23, 91.2, 12.4, 1460.0), "dave": (1, 17.5, 905.2, 5400.0)}
    for u in users:
        count, efficiency, idle, wait = month[u["name"]]
        u.update(month_jobs=count, month_efficiency_pct=efficiency, month_idle_gpu_hours=idle,
                 month_mean_wait_s=wait)
    since = NOW - (20 * 24 + 14) * h - 800  # 2026-09-01 00:00 UTC
    available = 9 * (NOW - since) / h
    allocated = sum(u["month_gpu_hours"] for u in users)
    report = {"since": since, "until": NOW, "days": [],
              "users": [{"month": "2026-09", "user": u["name"], "jobs": u["month_jobs"],
                         "gpu_hours": u["month_gpu_hours"], "in_quota_gpu_hours": u["month_gpu_hours"],
                         "over_quota_gpu_hours": 0.0, "efficiency_pct": u["month_efficiency_pct"],
                         "idle_gpu_hours": u["month_idle_gpu_hours"], "mean_wait_s": u["month_mean_wait_s"]}
                        for u in users],
              "nodes": [{"period": "2026-09", "node": "cluster", "gpus": 9,
                         "available_gpu_hours": available, "allocated_gpu_hours": allocated,
                         "allocated_pct": round(100 * allocated / available, 1), "util_pct": 71.3}]}
    samples = [{"t": NOW - 3 * h + 30 * n, "temperature_c": 60 + (n % 40) / 4,
                "utilization_pct": 80 + (n * 7) % 17, "memory_used_mb": 12800, "power_w": 300 + (n * 13) % 60,
                "fan_pct": 45, "sm_clock_mhz": 2520, "mem_clock_mhz": 10501} for n in range(360)]
    log = "".join(f"epoch 1 step {n * 50:>5}  loss {2.1 - n * 0.013:.3f}  lr 2.0e-05\n" for n in range(60))
    # The head's order of the waiting jobs (lowest fair-share weight first; held ones aside).
    queue = [16, 18]
    return {"snapshot": {"nodes": nodes, "gpus": gpus, "jobs": jobs, "events": events[-8:],
                         "users": users, "queue": queue},
            "ended": ended, "users": users, "events": events, "samples": samples, "log": log,
            "report": report}


class FixedHead:
    """A thread serving ``lab()`` on a Unix socket until ``stop``."""

    def __init__(self, socket: Path) -> None:
        self.socket = Path(socket)
        self.data = lab()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fixed-head", daemon=True)

    def start(self) -> FixedHead:
        self._thread.start()
        self._ready.wait(10)
        return self

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_unix_server(self._serve, str(self.socket)))
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            server.close()
            for task in asyncio.all_tasks(self._loop):  # the clients' connections
                task.cancel()
            self._loop.run_until_complete(asyncio.sleep(0))
            self._loop.close()

    def answer(self, req: dict) -> dict:
        """The reply to one request (``subscribe`` aside)."""
        d, op = self.data, req.get("op")
        jobs = {j["id"]: j for j in d["snapshot"]["jobs"] + d["ended"]}
        if op == "ping":
            return {"pid": 1, "user": USER}
        if op == "users":
            return {"users": d["users"]}
        if op == "report":
            return {"report": d["report"]}
        if op == "events":
            return {"events": d["events"][-req.get("limit", 100):]}
        if op == "job_history":
            return {"jobs": d["ended"]}
        if op == "job":
            if req.get("job") not in jobs:
                return {"ok": False, "error": f"no job {req.get('job')}"}
            return {"job": jobs[req["job"]]}
        if op == "logs":
            job = jobs.get(req.get("job")) or {"state": "running"}
            data = d["log"] if not req.get("offset") else ""
            return {"data": data, "offset": len(d["log"]), "state": job["state"]}
        if op == "history":
            return {"gpu": req.get("gpu"), "samples": d["samples"]}
        return {"ok": False, "error": f"unknown request {op!r}"}

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                req = json.loads(line)
                if req.get("op") == "subscribe":
                    snapshot = {"ok": True, "type": "snapshot", **self.data["snapshot"]}
                    writer.write(json.dumps(snapshot).encode() + b"\n")
                    await writer.drain()
                    await reader.read()  # nothing ever changes: wait for the client to go
                    return
                reply = self.answer(req)
                writer.write(json.dumps({"ok": True, **reply} if "ok" not in reply else reply).encode()
                             + b"\n")
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            writer.close()
