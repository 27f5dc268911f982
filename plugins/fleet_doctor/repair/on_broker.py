"""Every change a repair or a restore makes to a broker's files, run on the broker itself (sent over SSH to
``python3 -`` by ``repair.broker.BrokerHost``; Python 3.6+, the standard library only, as the probe).

Nothing here follows a symbolic link. The Kafka user owns the log dirs and can plant a link anywhere below them
(``<partition dir>/fleet-doctor-quarantine -> /etc``, a partition dir swapped for a link to ``/`` between the plan
and the change); a change running as root that followed one would make ``/etc`` Kafka's, or write a restored file
through it. So every path is walked from its log dir one component at a time with ``O_NOFOLLOW | O_DIRECTORY``
(the log dir itself must be a real directory; what lies above it is the operator's), every file is looked at with
``lstat`` and must be a regular file, and every operation is relative to the directory descriptor it was checked
through (``unlinkat``, ``mkdirat``, ``linkat`` without ``AT_SYMLINK_FOLLOW``, ``fchown`` on an open descriptor,
``renameat`` within one directory). A path that fails a check is refused before anything changes: exit ``REFUSED``,
the reason on stderr naming the path.

The changes run while holding every log dir's ``.lock`` the way Kafka does (an ``fcntl`` lock: Java's
``FileLock``), so no broker can start on those dirs while a file changes; a missing ``.lock`` is not created, and a
broker holding one makes the whole run exit ``LOCK_HELD`` before any change.

Input (argv[1]): JSON ``{"log_dirs": [...], "ops": [...]}``, each op one of

- ``{"op": "remove", "path": p}``: remove the regular file ``p`` (nothing when it is gone already).
- ``{"op": "quarantine", "path": p, "into": [d1, d2]}``: move ``p`` into ``<its dir>/d1/d2/`` (each made with plain
  ``mkdir``, owned as the partition dir), never over an earlier copy (``name``, ``name.1``, ...); nothing when ``p``
  is gone already.
- ``{"op": "install", "from": s, "path": p}``: put the regular file ``s`` (in the repair's private temp dir) at ``p``:
  written to a new file beside ``p``, owned as the partition dir, with ``s``'s mode and times, then renamed over
  ``p``.
- ``{"op": "own", "path": p}``: ``p`` owned as its partition dir.

Output: one JSON line per op done on stdout.
"""

import errno
import fcntl
import json
import os
import stat
import sys

LOCK_HELD = 75  # a broker holds a log dir's .lock: nothing was changed
REFUSED = 65  # a path is not a real file or directory at its expected place: nothing was changed by that op
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW


class Refused(Exception):
    """A path the change may not touch (the message names it)."""


def lock_log_dirs(log_dirs):
    """Every log dir's ``.lock`` held (exit ``LOCK_HELD`` when a broker holds one); the descriptors to keep open."""
    held = []
    for d in log_dirs:
        p = os.path.join(d, ".lock")
        try:
            fd = os.open(p, os.O_RDWR | os.O_NOFOLLOW)
        except FileNotFoundError:
            continue
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise Refused("%s is a symlink: not Kafka's lock file" % p)
            raise
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            sys.stderr.write("%s is locked: a broker runs on this log dir\n" % p)
            sys.exit(LOCK_HELD)
        held.append(fd)
    return held


def open_dir(log_dirs, path):
    """A descriptor of the directory ``path``, walked from the log dir it is in, no component a symlink."""
    path = path.rstrip("/")
    dirs = [d.rstrip("/") for d in log_dirs]
    root = next((d for d in dirs if path == d or path.startswith(d + "/")), None)
    if root is None:
        raise Refused("%s is not inside a log dir of this broker" % path)
    try:
        fd = os.open(root, DIR_FLAGS)
    except OSError as e:
        raise Refused("log dir %s is not a real directory (%s)" % (root, os.strerror(e.errno)))
    here = root
    for part in path[len(root) :].split("/")[1:]:
        here = here + "/" + part
        if part in ("", ".", ".."):
            os.close(fd)
            raise Refused("%s: %r is not a plain path component" % (path, part))
        try:
            nfd = os.open(part, DIR_FLAGS, dir_fd=fd)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.ELOOP, errno.ENOTDIR):
                raise Refused("%s is a symlink or not a directory: refusing to follow it" % here)
            raise
        os.close(fd)
        fd = nfd
    return fd


def regular(dir_fd, name, path):
    """The ``lstat`` of ``name`` in ``dir_fd`` when it is a regular file, None when absent; Refused otherwise."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(st.st_mode):
        raise Refused("%s is a symlink or not a regular file: refusing to touch it" % path)
    return st


def sub_dir(parent_fd, name, owner, path):
    """``name`` in ``parent_fd`` as a real directory, made with plain mkdir when absent, owned as ``owner``."""
    try:
        os.mkdir(name, 0o755, dir_fd=parent_fd)
    except FileExistsError:
        pass
    try:
        fd = os.open(name, DIR_FLAGS, dir_fd=parent_fd)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise Refused("%s is a symlink or not a directory: refusing to follow it" % path)
        raise
    os.fchown(fd, owner.st_uid, owner.st_gid)
    return fd


def split(path):
    parent, _, name = path.rstrip("/").rpartition("/")
    if not name or name in (".", ".."):
        raise Refused("%s is not a file path" % path)
    return parent, name


def remove(log_dirs, op):
    parent, name = split(op["path"])
    pfd = open_dir(log_dirs, parent)
    try:
        if regular(pfd, name, op["path"]) is None:
            return "gone already"
        os.unlink(name, dir_fd=pfd)
        return "removed"
    finally:
        os.close(pfd)


def quarantine(log_dirs, op):
    parent, name = split(op["path"])
    pfd = open_dir(log_dirs, parent)
    fds = [pfd]
    try:
        if regular(pfd, name, op["path"]) is None:
            return "gone already"
        owner = os.fstat(pfd)
        at, where = pfd, parent
        for d in op["into"]:
            where = where + "/" + d
            at = sub_dir(at, d, owner, where)
            fds.append(at)
        dest, n = name, 0
        while regular(at, dest, where + "/" + dest) is not None:
            n += 1
            dest = "%s.%d" % (name, n)
        os.link(name, dest, src_dir_fd=pfd, dst_dir_fd=at, follow_symlinks=False)
        os.unlink(name, dir_fd=pfd)
        return where + "/" + dest
    finally:
        for fd in fds:
            os.close(fd)


def install(log_dirs, op):
    parent, name = split(op["path"])
    src = os.open(op["from"], os.O_RDONLY | os.O_NOFOLLOW)
    pfd = open_dir(log_dirs, parent)
    temp = ".fleet-doctor-restore.%s.%d" % (name, os.getpid())
    try:
        st = os.fstat(src)
        if not stat.S_ISREG(st.st_mode):
            raise Refused("%s is not a regular file" % op["from"])
        regular(pfd, name, op["path"])  # a symlink or a directory in its place is refused
        owner = os.fstat(pfd)
        out = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=pfd)
        try:
            while True:
                chunk = os.read(src, 1 << 20)
                if not chunk:
                    break
                os.write(out, chunk)
            os.fchown(out, owner.st_uid, owner.st_gid)
            os.fchmod(out, stat.S_IMODE(st.st_mode))
            os.utime(out, ns=(st.st_atime_ns, st.st_mtime_ns))
            os.fsync(out)
        finally:
            os.close(out)
        os.rename(temp, name, src_dir_fd=pfd, dst_dir_fd=pfd)
        os.fsync(pfd)
        return "installed"
    except BaseException:
        try:
            os.unlink(temp, dir_fd=pfd)
        except OSError:
            pass
        raise
    finally:
        os.close(src)
        os.close(pfd)


def own(log_dirs, op):
    parent, name = split(op["path"])
    pfd = open_dir(log_dirs, parent)
    try:
        if regular(pfd, name, op["path"]) is None:
            raise Refused("%s does not exist" % op["path"])
        owner = os.fstat(pfd)
        os.chown(name, owner.st_uid, owner.st_gid, dir_fd=pfd, follow_symlinks=False)
        return "owned %d:%d" % (owner.st_uid, owner.st_gid)
    finally:
        os.close(pfd)


OPS = {"remove": remove, "quarantine": quarantine, "install": install, "own": own}


def main(argv):
    spec = json.loads(argv[1])
    log_dirs = spec["log_dirs"]
    try:
        held = lock_log_dirs(log_dirs)
        for op in spec["ops"]:
            done = OPS[op["op"]](log_dirs, op)
            sys.stdout.write(json.dumps({"op": op["op"], "path": op["path"], "done": done}) + "\n")
            sys.stdout.flush()
    except Refused as e:
        sys.stderr.write("refused: %s\n" % e)
        return REFUSED
    except OSError as e:
        sys.stderr.write("%s: %s\n" % (e.filename or "?", e.strerror or e))
        return 1
    del held
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
