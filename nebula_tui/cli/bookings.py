"""`nebula reserve` (book GPUs for a window, or `--delete NAME`) and `nebula reservations`."""

from __future__ import annotations

import argparse
import sys

from ..wire import BookingMade, BookingReply, BookingView, BookingsReply, ReserveRequest
from ..homedir import Home
from .args import USAGE_ERROR
from .common import service_client, show


def cmd_reserve(args: argparse.Namespace, home: Home, config: str | None) -> int:
    if args.delete is not None:
        if any(v is not None for v in (args.gpus, args.gpu_count, args.start, args.duration, args.users)):
            print("nebula reserve: --delete NAME takes no other flag", file=sys.stderr)
            return USAGE_ERROR
        with service_client(home, config) as client:
            booking = client.call("reserve", BookingReply, **ReserveRequest(delete=args.delete))["booking"]
        return show(args, booking, f"Booking {booking['name']} ended")
    if (args.gpus is None) == (args.gpu_count is None):
        print("nebula reserve: give the GPUs: --gpus node02:0-3, or --gpu-count N [--gpu-mem 40G] "
              "(see `nebula reserve --help`)", file=sys.stderr)
        return USAGE_ERROR
    if args.start is None or args.duration is None:
        print("nebula reserve: give --start WHEN and --duration, e.g. --start '2026-12-11 09:00' "
              "--duration 10h", file=sys.stderr)
        return USAGE_ERROR
    fields = ReserveRequest(start=args.start, duration_s=args.duration, name=args.name)
    if args.users:
        fields["users"] = args.users
    if args.gpus is not None:
        fields["gpus"] = args.gpus
    else:
        fields["gpu_count"], fields["gpu_mem_mb"] = args.gpu_count, args.gpu_mem
    with service_client(home, config) as client:
        reply = client.call("reserve", BookingMade, **fields)
    b = reply["booking"]
    text = (f"Booked {b['gpus']} for {b['name']}: {b['when']}, for {', '.join(b['users'])}"
            + (f"\nNote: {reply['note']}" if reply.get("note") else ""))
    return show(args, reply, text)


def bookings_text(bookings: list[BookingView]) -> str:
    from ..views import booking_state
    from .text import table

    if not bookings:
        return "No bookings under way or ahead."
    rows = [(b["name"], b["gpus"], b["when"], ",".join(b["users"]), b["created_by"], booking_state(b))
            for b in bookings]
    return table(("NAME", "GPUS", "WHEN", "USERS", "BY", "STATE"), rows)


def cmd_reservations(args: argparse.Namespace, home: Home, config: str | None) -> int:
    with service_client(home, config) as client:
        bookings = client.call("reserve", BookingsReply, **ReserveRequest(list=True))["bookings"]
    return show(args, bookings, bookings_text)
