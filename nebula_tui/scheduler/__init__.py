"""The scheduler: pure code from a snapshot to decisions (no I/O, no clock, no SQL)."""

from .queue import PendingJob, Snapshot, Start, Wait, schedule

__all__ = ["PendingJob", "Snapshot", "Start", "Wait", "schedule"]
