"""``nebula logs``: a job's output, once or followed; a multi-node job's every rank; a
requeued job's earlier runs (``--attempt``)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from ..api import Client
from ..homedir import Home
from ..printable import printable_log
from ..wire import LogPart, LogsReply, LogsRequest
from .common import service_client


def _shown(text: str) -> str:
    """To a terminal, a job's output cannot retitle it or fake the prompt; to a pipe or a
    file it goes exactly as the job wrote it."""
    return printable_log(text) if sys.stdout.isatty() else text


def _read_through(parts: Sequence[LogPart | LogsReply], ends: Sequence[int | None], got: bool) -> bool:
    """Without ``-f``, whether the log is read: nothing more came, or every rank's log is
    read to the size it had when first asked (a log growing meanwhile is not chased)."""
    return not got or all(end is not None and part["offset"] >= end
                          for part, end in zip(parts, ends))


def cmd_logs(args: argparse.Namespace, home: Home, config: str | None) -> int:
    """One node's output as it is (all of it: read in pieces, as ``-f`` does, to where it
    ended when asked); a multi-node job's every rank, a prefix on each line."""
    if args.rank is not None or args.tail is not None:
        with service_client(home, config) as client:
            offset = 0
            if args.tail is not None:  # the last lines of one node's log (rank 0 by default)
                offset = _print_tail(client, args, args.tail, args.rank or 0)
                if not args.follow:
                    return 0
            return _follow_one(client, args, offset)
    offsets: list[int] = []
    pending: dict[int, str] = {}
    ends = None
    with service_client(home, config) as client:
        while True:
            reply = client.call("logs", LogsReply, **LogsRequest(job=args.job, offset=0, offsets=offsets,
                                                          attempt=args.attempt))
            parts: list[LogPart] = reply.get("parts") or [  # (a head without parts)
                {"rank": 0, "node": "", "data": reply["data"], "offset": reply["offset"], "size": reply.get("size")}]
            offsets = [p["offset"] for p in parts]
            ends = ends or [p.get("size") for p in parts]
            for part in parts:
                if len(parts) == 1:
                    sys.stdout.write(_shown(part["data"]))
                    continue
                lines = (pending.pop(part["rank"], "") + part["data"]).split("\n")
                pending[part["rank"]] = lines.pop()  # an unfinished line waits for its end
                for line in lines:
                    sys.stdout.write(f"[{part['rank']} {part['node']}] {_shown(line)}\n")
            sys.stdout.flush()
            got = any(p["data"] for p in parts)
            if (reply["ended"] and not got) if args.follow else _read_through(parts, ends, got):
                for rank, rest in pending.items():
                    if rest:
                        sys.stdout.write(f"[{rank}] {_shown(rest)}\n")
                return 0
            if not got:
                time.sleep(0.3)


def _follow_one(client: Client, args: argparse.Namespace, offset: int = 0) -> int:
    ends = None
    while True:
        reply = client.call("logs", LogsReply, **LogsRequest(job=args.job, offset=offset, rank=args.rank,
                                                      attempt=args.attempt))
        sys.stdout.write(_shown(reply["data"]))
        sys.stdout.flush()
        offset = reply["offset"]
        ends = ends or [reply.get("size")]
        got = bool(reply["data"])
        if (reply["ended"] and not got) if args.follow else _read_through([reply], ends, got):
            return 0
        if not reply["data"]:
            time.sleep(0.3)


def _print_tail(client: Client, args: argparse.Namespace, lines: int, rank: int) -> int:
    """Print the last ``lines`` lines of one node's log of the job (``args.job``, its
    ``args.attempt``) as it is now (``rank``: which node of a multi-node job, 0 first);
    returns the offset where it ends. The log is read through (the node sends it in pieces); only the tail is
    kept, so a long log costs time, never memory."""
    from collections import deque

    kept: deque[str] = deque(maxlen=lines + 1)  # +1: the unfinished last line, if any
    offset, partial = 0, ""
    while True:
        reply = client.call("logs", LogsReply,
                            **LogsRequest(job=args.job, offset=offset, rank=rank, attempt=args.attempt))
        if not reply["data"]:
            break
        offset = reply["offset"]
        *complete, partial = (partial + reply["data"]).split("\n")
        kept.extend(line + "\n" for line in complete)
    if partial:
        kept.append(partial)
    tail = list(kept)[-lines:]
    sys.stdout.write(_shown("".join(tail)))
    return offset
