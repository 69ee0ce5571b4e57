"""The job directories of this head on the node and their locks (node side; shipped with the
nodelet, stdlib only, Python 3.6+): a job's directory, each attempt's, the launch token
that names one launch, and the lock held while a launch of a job is decided (and while the
cleaner removes it). The layout is described in ``node_base.py``.
"""

import fcntl
import os

from .node_base import JOBS_DIR, SAFE_NAME


MAX_JOB_ID = (1 << 63) - 1


def parse_token(token):
    """(head, attempt, nonce) of a launch token ``<head>.<attempt>.<nonce>``, or None."""
    parts = token.split(".") if isinstance(token, str) else []
    if len(parts) != 3 or not SAFE_NAME.match(parts[0]) or not parts[1].isdigit() \
            or not SAFE_NAME.match(parts[2]) or len(parts[1]) > 9:
        return None
    return parts[0], int(parts[1]), parts[2]


def job_id(value):
    """A job number from a request, as the directory name; ValueError when it is not one."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError("job must be a number")
    number = int(value)
    if not 1 <= number <= MAX_JOB_ID or str(number) != str(value).strip():
        raise ValueError("job must be a number from 1 to 2^63-1")
    return str(number)


def job_root(job):
    return os.path.join(JOBS_DIR, job)


def attempt_dir(job, attempt):
    return os.path.join(JOBS_DIR, job, str(attempt))


def attempts(job):
    """The attempts of ``job`` that have a directory here, oldest first."""
    try:
        names = os.listdir(job_root(job))
    except OSError:
        return []
    return sorted(int(n) for n in names if n.isdigit())


def latest_dir(job):
    """The directory of the job's latest attempt here (its session is that attempt's), or None."""
    found = attempts(job)
    return attempt_dir(job, found[-1]) if found else None


def job_lock(path, wait=True):
    """The open file of a job's lock at ``path``, locked (released when closed, or when this
    process dies); None when ``wait`` is false and it is held. The cleaner unlinks the lock
    of a job it removes, holding it: whoever waited on the unlinked file takes a new one."""
    while True:
        try:
            fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
        except OSError:
            if wait:
                raise
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except OSError:
            os.close(fd)
            if wait:
                raise  # no locking here (NFS without lockd): the launch says so
            return None
        try:
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                return fd
        except OSError:
            pass  # unlinked while this waited
        os.close(fd)


def make_private_dir(path):
    """A directory only this node's login account can enter (the jobs of the lab's users run
    as themselves and must not read each other's logs or write each other's exit codes)."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    os.chmod(path, 0o700)
