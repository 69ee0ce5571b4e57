"""The scheduler: pure code from a snapshot to decisions (no I/O, no clock, no SQL).

``schedule(Snapshot(...)) -> list[Decision]`` is the one entry point; ``fairshare`` and
``topology`` hold the pure helpers the head and the CLI call (weights, quotas, best sets).
"""

from . import admission, estimates, fairshare, topology
from .estimates import Estimate, run_estimate
from .preemption import NothingFits, schedule
from .queue import order
from .snapshot import (Booking, Decision, Fail, PendingJob, Preempt, RunningJob, SchedulerConfig, Snapshot,
                       Start, UserShare, Wait)

__all__ = ["Booking", "Decision", "Estimate", "estimates", "run_estimate", "Fail", "NothingFits", "PendingJob",
           "Preempt", "RunningJob", "SchedulerConfig", "Snapshot", "Start", "UserShare", "Wait",
           "admission", "fairshare", "order", "schedule", "topology"]
