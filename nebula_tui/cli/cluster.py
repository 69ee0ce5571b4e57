"""The cluster's commands: its overview (status, gpus, events), one node (show, drain,
resume; add with its host-key trust step and smoke test, remove) and one GPU (history,
resume)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping
from typing import Any

from ..api import ApiError
from ..model import fmt
from ..printable import printable, printable_log
from ..wire import (DoctorReply, DoctorRequest, DrainRequest, EventsReply, EventsRequest, GpuHistoryReply,
                    GpuHistoryRequest, GpuReply, GpuResumeRequest, GpusReply, NodeAddRequest, NodeKeyReply,
                    NodeKeyRequest, NodeReply, NodeRequest, NodeShowReply, ReloadReply, SmokeReply, StatusReply)
from ..homedir import Home
from .common import service_client, show


def cmd_status(args: argparse.Namespace, home: Home, config: str | None) -> int:
    from .text import status_text

    with service_client(home, config) as client:
        reply = client.call("status", StatusReply)
    summary: Mapping[str, Any] = reply["summary"]
    if reply.get("pools"):
        summary = {**summary, "pools": reply["pools"]}
    return show(args, summary, status_text)


def cmd_gpus(args: argparse.Namespace, home: Home, config: str | None) -> int:
    from .text import gpus_text

    with service_client(home, config) as client:
        gpus = client.call("gpus", GpusReply)["gpus"]
    return show(args, gpus, gpus_text)


def cmd_doctor(args: argparse.Namespace, home: Home, config: str | None) -> int:
    """Each node's checks as the head computed them, one line each; exit 1 when one failed."""
    from .text import doctor_text

    with service_client(home, config) as client:
        # each node's checks wait on it a few seconds at most; a node that hangs is named
        reply = client.call("doctor", DoctorReply, timeout=60, **DoctorRequest(nodes=args.nodes))
    show(args, reply, doctor_text)
    return 0 if reply["passed"] else 1


def cmd_node(args: argparse.Namespace, home: Home, config: str | None) -> int:
    if args.node_command in ("add", "remove"):
        return _edit_nodes(args, home, config)
    if args.node_command == "show":
        from .text import node_text

        with service_client(home, config) as client:
            return show(args, client.call("node_show", NodeShowReply, **NodeRequest(node=args.node))["node"], node_text)
    with service_client(home, config) as client:
        if args.node_command == "drain":
            node = client.call("drain", NodeReply, **DrainRequest(node=args.node, reason=args.reason))["node"]
            return show(args, node, f"Drained {args.node}: running jobs go on, no new ones start there")
        node = client.call("resume", NodeReply, **NodeRequest(node=args.node))["node"]
    return show(args, node, f"Resumed {args.node}")


def _edit_nodes(args: argparse.Namespace, home: Home, config: str | None) -> int:
    """node add/remove: the service edits its cluster file; adding asks to trust the key."""
    with service_client(home, config) as client:
        if args.node_command == "remove":
            client.call("node_remove", ReloadReply, **NodeRequest(node=args.node))
            return show(args, {"node": args.node, "removed": True}, f"Removed {args.node}")
        fingerprint = client.call("node_key", NodeKeyReply,
                                  **NodeKeyRequest(host=args.host, port=args.port))["fingerprint"]
        trust = args.trust
        if trust is None:
            if not sys.stdin.isatty():
                print(f"nebula node: {args.host}:{args.port} presents {fingerprint}; cannot ask "
                      "whether to trust it (no terminal): pass --trust with the fingerprint you "
                      "checked on the node", file=sys.stderr)
                return 1
            answer = input(f"{args.host}:{args.port} presents host key {fingerprint}.\n"
                           "Compare it with the node's own (ssh-keygen -lf "
                           "/etc/ssh/ssh_host_ed25519_key.pub on the node). Trust it? [y/N] ")
            if answer.strip().lower() not in ("y", "yes"):
                print("nebula node: host key not trusted; nothing was changed", file=sys.stderr)
                return 1
            trust = fingerprint
        client.call("node_add", ReloadReply, timeout=60, **NodeAddRequest(
            node=args.node, host=args.host, port=args.port, user=args.user, identity=args.identity, trust=trust))
        added = {"node": args.node, "host": args.host, "port": args.port, "fingerprint": fingerprint}
        if not args.json:
            print(f"Added {args.node} ({args.host}:{args.port}, host key {fingerprint})", flush=True)
        if args.no_smoke:
            return show(args, added, "") if args.json else 0
        if not args.json:
            print(f"Smoke test: a 4 GB job of the vendor's tool on {args.node} …", flush=True)
        smoke: Mapping[str, Any]
        try:
            smoke = client.call("node_smoke", SmokeReply, timeout=180, **NodeRequest(node=args.node))
        except ApiError as err:
            smoke = {"error": str(err)}
    return _smoke_result(args, {**added, "smoke": smoke})


def _smoke_result(args: argparse.Namespace, added: dict[str, Any]) -> int:
    """The smoke test's verdict, and the job's output: exit 0 only when it succeeded."""
    smoke, node = added["smoke"], added["node"]
    ok = smoke.get("ended") and smoke["job"]["state"] == "succeeded"
    if args.json:
        print(json.dumps(added, indent=2))
        return 0 if ok else 1
    if "error" in smoke:
        print(f"nebula node: {node} was added, but its smoke test could not run: {printable(smoke['error'])}",
              file=sys.stderr)
        return 1
    job = smoke["job"]
    where = printable(f"job {job['id']} ({' '.join(job['command'])}) on {smoke['gpu']} ({smoke['model']})")
    if not smoke["ended"]:
        print(f"nebula node: the smoke test, {where}, has not ended yet; `nebula logs {job['id']} -f` "
              "follows it", file=sys.stderr)
        return 1
    print(f"Smoke test: {where} {job['state']}"
          + (f" with exit code {job['exit_code']}" if job["exit_code"] not in (None, 0) else ""))
    # the vendor tool's output, as the node printed it: lines and colours only
    sys.stdout.write("".join(f"  | {printable_log(line)}\n" for line in smoke["output"].splitlines()))
    if not ok:
        print(f"nebula node: {node} failed its smoke test; it stays in the cluster: drain it "
              f"(nebula node drain {node}) until it is fixed", file=sys.stderr)
    return 0 if ok else 1


def cmd_gpu(args: argparse.Namespace, home: Home, config: str | None) -> int:
    if args.gpu_command == "resume":
        with service_client(home, config) as client:
            gpu = client.call("gpu_resume", GpuReply, **GpuResumeRequest(gpu=args.gpu, force=args.force))["gpu"]
        how = "forced, without a self-test" if args.force else "its self-test passed"
        return show(args, gpu, f"Resumed {gpu['node']}:{gpu['index']} ({gpu['uuid']}) — {how}: "
                                "it takes new jobs again")
    with service_client(home, config) as client:
        reply = client.call("history", GpuHistoryReply, **GpuHistoryRequest(gpu=args.gpu, since=args.since))
    return show(args, reply, _gpu_history_text)


def _gpu_history_text(reply: GpuHistoryReply) -> str:
    from .text import table

    rows = [(time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(s["t"])),
             fmt(s["temperature_c"], "C"), fmt(s["utilization_pct"], "%"), fmt(s["memory_used_mb"]),
             fmt(s["power_w"], "W"), fmt(s["fan_pct"], "%"), fmt(s["sm_clock_mhz"]),
             fmt(s["mem_clock_mhz"])) for s in reply["samples"]]
    text = f"GPU {reply['gpu']}\n" + table(
        ("TIME", "TEMP", "UTIL", "MEM MiB", "POWER", "FAN", "SM MHz", "MEM MHz"), rows,
        right=range(1, 8))
    return text if rows else text + "\n(no samples yet: one is taken every 30 s)"


def cmd_events(args: argparse.Namespace, home: Home, config: str | None) -> int:
    from ..views import one_line

    with service_client(home, config) as client:
        events = client.call("events", EventsReply, **EventsRequest(
            limit=args.limit, kind=args.kind, node=args.node, job=args.job, user=args.user, since=args.since))["events"]
    return show(args, events, lambda events: "\n".join(
        f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(e['t']))}  {e['kind']:<7} "
        f"{one_line(e['message'], limit=1000)}"
        for e in events))
