"""A container's data mounts pinned to what the job's user could open (node side; stdlib
only, Python 3.6+; shipped with the nodelet, and run by a job's wrapper).

Why: a root container runtime (podman as root, docker's daemon) opens a bind mount's source
itself, as root, moments after the job's checks looked at it as the job's user. A user who
turns a symlink of their own home towards another user's 0700 home in between would be
shown, and with ``:rw`` be able to write, that other user's files: root passes every
directory's permissions. Checking harder does not help (the path can change after any check),
so the path is resolved once, by the user's own rights, and the runtime never resolves it:

1. ``pin``: a child of the wrapper becomes the job's user (its groups, gid and uid: all the
   kernel checks) and opens each source with ``O_PATH`` — following the user's own symlinks,
   each step checked against the user — and hands the open files to the wrapper over a
   socket. A source the user cannot reach fails the job with the checks' sentence.
2. The wrapper (root) binds each of those very files onto ``$jobdir/mnt/N``, under
   directories only the node's login account can enter, so nobody can swap any part of that
   path; the runtime is given ``$jobdir/mnt/N`` instead of the user's path. The mounted inode
   is the one the user opened, whatever the user's path names afterwards.
3. ``release``: when the job ends (its wrapper; the nodelet on a cancel, a kill, or before it
   removes an old attempt's directory), each staging mount is detached and its empty mount
   point removed — never recursively: a staging point still mounted is left, never deleted
   through. A running container keeps its own copy of the mount, so releasing early is safe.

Inside the container the command runs by the user's uid (``--user``, no new privileges), so
the files' own permissions still apply there.

Run as ``python3 -c SOURCE pin STAGING USER NODE SRC…`` (exit 1 with one sentence on failure)
or ``… release STAGING``; the nodelet calls ``release_pins`` directly.
"""

import array
import ctypes
import os
import pwd
import socket
import stat
import sys

_MS_BIND = 0x1000
_MS_REC = 0x4000
_MS_PRIVATE = 1 << 18
_MNT_DETACH = 2


class PinRefused(Exception):
    """``str()`` is the one sentence the job fails with."""


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _open_as(user, sources):
    """The sources opened (``O_PATH``) by a child that has become ``user``: their fds, in
    order; PinRefused names the first one the user cannot reach."""
    entry = pwd.getpwnam(user)
    groups = os.getgrouplist(user, entry.pw_gid)
    ours, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 2
        try:
            ours.close()
            keep = theirs.fileno()
            os.closerange(3, keep)  # nothing of the wrapper's travels as the user
            os.closerange(keep + 1, 1 << 16)
            os.setgroups(groups)
            os.setresgid(entry.pw_gid, entry.pw_gid, entry.pw_gid)
            os.setresuid(entry.pw_uid, entry.pw_uid, entry.pw_uid)
            fds = []
            for index, source in enumerate(sources):
                try:
                    fds.append(os.open(source, os.O_PATH | os.O_CLOEXEC))
                except OSError:
                    theirs.sendall(("missing %d\n" % index).encode())
                    break
            else:
                theirs.sendmsg([b"ok\n"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                            array.array("i", fds))])
            code = 0
        finally:
            os._exit(code)
    theirs.close()
    try:
        message, ancillary, flags, _ = ours.recvmsg(64, socket.CMSG_SPACE(4 * len(sources)))
    finally:
        ours.close()
        os.waitpid(pid, 0)
    fds = []
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            received = array.array("i")
            received.frombytes(data[:len(data) - len(data) % received.itemsize])
            fds.extend(received)
    if message.startswith(b"ok") and len(fds) == len(sources) and not flags & socket.MSG_CTRUNC:
        return fds
    for fd in fds:
        os.close(fd)
    if message.startswith(b"missing "):
        return int(message.split()[1])
    raise PinRefused("could not open the --data-mount sources as %s" % user)


def pin_mounts(staging, user, node, sources):
    """Each source opened as ``user``, bound at ``staging/N`` (N its place in ``sources``)."""
    opened = _open_as(user, sources)
    if isinstance(opened, int):
        raise PinRefused("--data-mount's source %s does not exist on %s (or %s cannot reach it)"
                         % (sources[opened], node, user))
    libc = _libc()
    try:
        os.mkdir(staging, 0o700)
        for index, fd in enumerate(opened):
            point = os.path.join(staging, str(index))
            if stat.S_ISDIR(os.fstat(fd).st_mode):
                os.mkdir(point, 0o700)
            else:
                os.close(os.open(point, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            # The kernel follows /proc/self/fd/N to the open file itself, not to its name.
            for source, flags in ((b"/proc/self/fd/%d" % fd, _MS_BIND | _MS_REC),
                                  (None, _MS_PRIVATE | _MS_REC)):  # no copy elsewhere
                if libc.mount(source, point.encode(), None, flags, None) != 0:
                    raise PinRefused("%s could not mount --data-mount's source %s for the "
                                     "container: %s" % (node, sources[index],
                                                        os.strerror(ctypes.get_errno())))
    except BaseException:
        release_pins(staging)
        raise
    finally:
        for fd in opened:
            os.close(fd)


def release_pins(staging):
    """Detach every staging mount under ``staging`` and remove the emptied mount points;
    True when nothing is left there."""
    try:
        names = os.listdir(staging)
    except OSError:
        return True
    libc = _libc()
    for name in names:
        point = os.path.join(staging, name)
        libc.umount2(point.encode(), _MNT_DETACH)  # EINVAL: not (or no longer) mounted
        try:  # rmdir and unlink refuse a point still mounted: nothing is deleted through it
            if os.path.isdir(point) and not os.path.islink(point):
                os.rmdir(point)
            else:
                os.unlink(point)
        except OSError:
            pass
    try:
        os.rmdir(staging)
        return True
    except OSError:
        return False


def pins_main(argv):
    if len(argv) >= 3 and argv[1] == "release":
        sys.exit(0 if release_pins(argv[2]) else 1)
    if len(argv) < 5 or argv[1] != "pin":
        sys.exit("usage: pin STAGING USER NODE SOURCE... | release STAGING")
    try:
        pin_mounts(argv[2], argv[3], argv[4], argv[5:])
    except (PinRefused, KeyError, OSError) as why:
        if isinstance(why, KeyError):
            why = "%s has no user %s" % (argv[4], argv[3])
        print(str(why))
        sys.exit(1)
