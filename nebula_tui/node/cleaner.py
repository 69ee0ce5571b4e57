"""Old attempts' directories removed from the node (node side; shipped with the nodelet,
stdlib only, Python 3.6+): those acknowledged long ago, of every head, and exits no head
ever collected after a longer wait; never through a data mount still bound under them.
"""

import contextlib
import os
import shutil

from .job_dirs import job_lock, make_private_dir
from .mount_pins import release_pins
from .node_base import CONFIG, HEADS_DIR, list_dir


#: acknowledged attempts' directories are removed this long after their ack
RETENTION_S = float(CONFIG.get("retention_s", 7 * 86400))
CLEAN_EVERY_S = 3600.0
#: an exit no head acknowledged is kept this many retentions (its head may yet come back)
UNCOLLECTED_RETENTIONS = 4


def clean_old_attempts(now):
    """Remove the directories of attempts acknowledged more than RETENTION_S ago, of every
    head (an ack means that head has recorded the exit), and their jobs' empty directories.
    An exit no head acknowledged is kept UNCOLLECTED_RETENTIONS times as long (its head may
    come back for it), then goes too: a head that is gone for good leaves nothing for ever."""
    for head in list_dir(HEADS_DIR):
        jobs = os.path.join(HEADS_DIR, head, "jobs")
        with contextlib.suppress(OSError):
            make_private_dir(os.path.join(HEADS_DIR, head, "locks"))
        for job in list_dir(jobs):
            # Under the job's lock: a launch makes the job's directory, then its attempt's,
            # and an empty job directory removed between the two failed that launch.
            lock = job_lock(os.path.join(HEADS_DIR, head, "locks", job), wait=False)
            if lock is None:
                continue  # a launch of it is under way (or its head's locks are not ours)
            try:
                _clean_job(os.path.join(HEADS_DIR, head), job, now)
            finally:
                os.close(lock)


def _clean_job(head_dir, job, now):
    root = os.path.join(head_dir, "jobs", job)
    for attempt in list_dir(root):
        d = os.path.join(root, attempt)
        try:
            old = now - os.stat(os.path.join(d, "acked")).st_mtime > RETENTION_S
        except OSError:
            try:  # ended (the wrapper's exit code is written last), never collected
                ended = os.stat(os.path.join(d, "exit_code")).st_mtime
            except OSError:
                continue  # still running, or never started: never removed here
            old = now - ended > UNCOLLECTED_RETENTIONS * RETENTION_S
        # A data mount still bound under it (mount_pins.py) is detached first; where one
        # cannot be, the directory stays: removing it would delete the user's files through it.
        if old and release_pins(os.path.join(d, "mnt")):
            shutil.rmtree(d, ignore_errors=True)
    if not list_dir(root):
        with contextlib.suppress(OSError):
            os.rmdir(root)
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(head_dir, "locks", job))
