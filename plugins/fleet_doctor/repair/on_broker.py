"""Every change a repair or a restore makes to a broker's files, run on the broker itself (sent over SSH by
``repair.broker.BrokerHost``: this source first on stdin, then the backup to put back, if any; Python 3.6+, the
standard library only, as the probe). It runs as the Kafka user when the inventory names one (``sudo -n -u``): every
file it changes is then the broker's own, with no root needed on the broker (docs/inventory.md).

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

Input: JSON ``{"log_dirs": [...], "ops": [...]}`` on stdin right after this source, its length in bytes the last
argument (``python3 -I -c <loader> <source length> <input length>``: no argument grows with the plan, and nothing
of it reaches sudo's log); each op one of

- ``{"op": "remove", "path": p}``: remove the regular file ``p`` (nothing when it is gone already).
- ``{"op": "quarantine", "path": p, "into": [d1, d2]}``: move ``p`` into ``<its dir>/d1/d2/`` (each made with plain
  ``mkdir``, owned as the partition dir), never over an earlier copy (``name``, ``name.1``, ...); nothing when ``p``
  is gone already.
- ``{"op": "quarantine_replica", "path": p, "into": [d1, d2, d3]}``: move the ``-stray`` replica dir ``p`` (a
  directory right in a log dir, named ``<topic>-<partition>.<uid>-stray``) whole into ``<its log dir's parent>/d1/d2/
  d3/`` (made with plain ``mkdir``, owned as the log dir), never over an earlier copy; a rename on the log dir's own
  filesystem or nothing (REFUSED on another: a replica of gigabytes is never copied); nothing when ``p`` is gone.
- ``{"op": "quarantined", "path": d, "hash16": h, "names": [q, s]}``: what a plan (``h``: its hash's first 16 hex
  digits) quarantined in the log dir ``d``: every regular file in ``<partition dir>/q/h/`` and every directory in
  ``<d's parent>/s/<d's name>/h/``, each ``{"path", "kind": "file"|"dir", "bytes", "quarantined_at"}`` (the
  entry's ctime: when it was moved there). Nothing is changed.
- ``{"op": "purge", "path": p, "hash16": h, "bytes": n, "names": [q, s]}``: delete one entry a listing gave, only
  when it is still in a quarantine dir of plan ``h`` of this broker's log dirs and still ``n`` bytes (a directory:
  walked without following anything, every entry a regular file or directory); nothing when it is gone already.
  These two never touch Kafka's own files: they run without the log dirs' lock (``"unlocked": true``), beside a
  running broker.
- ``{"op": "install", "member": m, "path": p}``: put the regular file ``m`` of the backup at ``p``: written to a new
  file beside ``p``, owned as the partition dir, with ``m``'s mode and mtime, then renamed over ``p``. The backup
  (a ``.tar.gz``) comes on stdin after this source when the input has ``"tarball": {"sha256": h, "tmp_dir": d}``:
  it is spooled into an unnamed file in ``d`` (readable by nobody else, gone with the process) and its sha256
  checked before anything changes; only the named members are read, never extracted by their own names.
- ``{"op": "own", "path": p}``: ``p`` owned as its partition dir.
- ``{"op": "can_change", "path": d}``: the directory ``d`` (no symlink on the way) takes a new file owned as ``d`` is
  (made, given ``d``'s owner, removed): what every change above needs. With ``"check": true`` in the input, the log
  dirs' ``.lock`` is opened read-write but not taken (the broker runs): the pre-check before a stop, where no other
  op may run. ``"spool": {"tmp_dir": d, "bytes": n}`` there also checks that a restore's backup of ``n`` bytes can be
  spooled in ``d`` (an unnamed file made there; that much room free).

Output: one JSON line per op done on stdout.
"""

import errno
import fcntl
import hashlib
import json
import os
import stat
import sys
import tarfile
import tempfile

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
        if name.endswith(".cleaned"):
            swaps = sorted(n for n in os.listdir(pfd) if n.endswith(".swap"))
            if swaps:  # Kafka deletes the swaps at or above the lowest .cleaned base offset (KAFKA-6264)
                raise Refused(
                    "%s: its partition dir now holds %s: Kafka's start deletes the swaps at or above the lowest "
                    ".cleaned base offset (an incomplete split, KAFKA-6264); moved aside, it would make Kafka complete "
                    "them instead. Nothing moved" % (op["path"], ", ".join(swaps[:3]))
                )
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


STRAY_NAME_SUFFIX = "-stray"
UNLOCKED_OPS = ("quarantined", "purge")  # what may run without the log dirs' lock: quarantines only


def _subdir(fd, name, path):
    """The existing real directory ``name`` in ``fd`` (None when absent); Refused when it is not one."""
    try:
        return os.open(name, DIR_FLAGS, dir_fd=fd)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise Refused("%s is a symlink or not a directory: refusing to follow it" % path)
        raise


def _tree_bytes(fd, path):
    """The bytes of every regular file below the directory ``fd``; Refused on anything else (a link, a device)."""
    total = 0
    for name in os.listdir(fd):
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        if stat.S_ISREG(st.st_mode):
            total += st.st_size
        elif stat.S_ISDIR(st.st_mode):
            sub = os.open(name, DIR_FLAGS, dir_fd=fd)
            try:
                total += _tree_bytes(sub, path + "/" + name)
            finally:
                os.close(sub)
        else:
            raise Refused("%s/%s is not a regular file or directory: refusing to touch it" % (path, name))
    return total


def _remove_tree(fd, name, path):
    """Remove the directory ``name`` in ``fd`` and everything below it, following nothing."""
    sub = os.open(name, DIR_FLAGS, dir_fd=fd)
    try:
        for child in os.listdir(sub):
            st = os.stat(child, dir_fd=sub, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                _remove_tree(sub, child, path + "/" + child)
            else:
                os.unlink(child, dir_fd=sub)
    finally:
        os.close(sub)
    os.rmdir(name, dir_fd=fd)


def _quarantine_entry(fd, name, path, kind):
    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
    if kind == "file":
        if not stat.S_ISREG(st.st_mode):
            raise Refused("%s is not a regular file: refusing to list it as a quarantined file" % path)
        size = st.st_size
    else:
        if not stat.S_ISDIR(st.st_mode):
            raise Refused("%s is not a directory: refusing to list it as a quarantined replica" % path)
        sub = os.open(name, DIR_FLAGS, dir_fd=fd)
        try:
            size = _tree_bytes(sub, path)
        finally:
            os.close(sub)
    return {"path": path, "kind": kind, "bytes": size, "quarantined_at": st.st_ctime}


def quarantined(log_dirs, op):
    log_dir, h = op["path"].rstrip("/"), op["hash16"]
    q, s = op["names"]
    if log_dir not in [d.rstrip("/") for d in log_dirs]:
        raise Refused("%s is not a log dir of this broker" % log_dir)
    out = []
    lfd = open_dir(log_dirs, log_dir)
    try:
        for pdir in sorted(os.listdir(lfd)):
            st = os.stat(pdir, dir_fd=lfd, follow_symlinks=False)
            if not stat.S_ISDIR(st.st_mode):
                continue
            pfd = os.open(pdir, DIR_FLAGS, dir_fd=lfd)
            fds = [pfd]
            try:
                where = "%s/%s/%s/%s" % (log_dir, pdir, q, h)
                for name in (q, h):
                    fd = _subdir(fds[-1], name, where)
                    if fd is None:
                        break
                    fds.append(fd)
                else:
                    for name in sorted(os.listdir(fds[-1])):
                        out.append(_quarantine_entry(fds[-1], name, where + "/" + name, "file"))
            finally:
                for fd in fds:
                    os.close(fd)
    finally:
        os.close(lfd)
    above, _, base = log_dir.rpartition("/")
    above = above or "/"
    try:
        afd = os.open(above, DIR_FLAGS)
    except OSError:
        return out
    fds = [afd]
    try:
        where = "%s/%s/%s/%s" % (above.rstrip("/"), s, base, h)
        for name in (s, base, h):
            fd = _subdir(fds[-1], name, where)
            if fd is None:
                return out
            fds.append(fd)
        for name in sorted(os.listdir(fds[-1])):
            out.append(_quarantine_entry(fds[-1], name, where + "/" + name, "dir"))
    finally:
        for fd in fds:
            os.close(fd)
    return out


def purge(log_dirs, op):
    path, h, q, s = op["path"].rstrip("/"), op["hash16"], op["names"][0], op["names"][1]
    parts = path.split("/")
    dirs = [d.rstrip("/") for d in log_dirs]
    if len(parts) >= 5 and parts[-3] == q and parts[-2] == h and "/".join(parts[:-3]).rpartition("/")[0] in dirs:
        start_fd, walk, kind = open_dir(log_dirs, "/".join(parts[:-3])), parts[-3:-1], "file"
    elif len(parts) >= 6 and parts[-4] == s and parts[-2] == h and "/".join(parts[:-4] + [parts[-3]]) in dirs:
        try:
            start_fd = os.open("/".join(parts[:-4]) or "/", DIR_FLAGS)
        except OSError as e:
            raise Refused("%s is not a real directory (%s)" % ("/".join(parts[:-4]), os.strerror(e.errno)))
        walk, kind = parts[-4:-1], "dir"
    else:
        raise Refused(
            "%s is not in a quarantine of plan %s in this broker's log dirs: refusing to delete it" % (path, h)
        )
    fds = [start_fd]
    try:
        for name in walk:
            fd = _subdir(fds[-1], name, path)
            if fd is None:
                return "gone already"
            fds.append(fd)
        name = parts[-1]
        try:
            entry = _quarantine_entry(fds[-1], name, path, kind)
        except FileNotFoundError:
            return "gone already"
        if entry["bytes"] != op["bytes"]:
            raise Refused(
                "%s is %d bytes, the plan says %d: it changed since; nothing deleted"
                % (path, entry["bytes"], op["bytes"])
            )
        if kind == "file":
            os.unlink(name, dir_fd=fds[-1])
        else:
            _remove_tree(fds[-1], name, path)
        os.fsync(fds[-1])
        return "deleted %d bytes" % entry["bytes"]
    finally:
        for fd in fds:
            os.close(fd)


def quarantine_replica(log_dirs, op):
    parent, name = split(op["path"])
    if parent.rstrip("/") not in [d.rstrip("/") for d in log_dirs] or not name.endswith(STRAY_NAME_SUFFIX):
        raise Refused("%s is not a -stray replica dir right in a log dir of this broker" % op["path"])
    pfd = open_dir(log_dirs, parent)
    fds = [pfd]
    try:
        try:
            st = os.stat(name, dir_fd=pfd, follow_symlinks=False)
        except FileNotFoundError:
            return "gone already"
        if not stat.S_ISDIR(st.st_mode):
            raise Refused("%s is a symlink or not a directory: refusing to touch it" % op["path"])
        owner = os.fstat(pfd)
        above = os.path.dirname(parent.rstrip("/")) or "/"
        try:
            at = os.open(above, DIR_FLAGS)
        except OSError as e:
            raise Refused("%s (the log dir's parent) is not a real directory (%s)" % (above, os.strerror(e.errno)))
        fds.append(at)
        where = above
        for d in op["into"]:
            where = where.rstrip("/") + "/" + d
            try:
                at = sub_dir(at, d, owner, where)
            except PermissionError:
                raise Refused(
                    "%s: uid %d cannot make the stray replicas' quarantine there: make %s/%s a directory owned by "
                    "the broker's user, on the log dir's filesystem" % (where, os.geteuid(), above, op["into"][0])
                )
            fds.append(at)
        if os.fstat(at).st_dev != owner.st_dev:
            raise Refused(
                "%s is on another filesystem than the log dir %s: a replica is moved, never copied; make %s/%s a "
                "directory on the log dir's filesystem" % (where, parent, above, op["into"][0])
            )
        dest, n = name, 0
        while True:
            try:
                os.stat(dest, dir_fd=at, follow_symlinks=False)
            except FileNotFoundError:
                break
            n += 1
            dest = "%s.%d" % (name, n)
        os.rename(name, dest, src_dir_fd=pfd, dst_dir_fd=at)
        os.fsync(pfd)
        os.fsync(at)
        return where + "/" + dest
    finally:
        for fd in fds:
            os.close(fd)


class SentBackup:
    """The backup sent after this source on stdin, spooled into an unnamed private file and checked."""

    tar = None

    @classmethod
    def receive(cls, spec):
        """Spool stdin into ``tmp_dir``; its sha256 must be ``sha256`` (Refused otherwise, before any change)."""
        try:
            spool = tempfile.TemporaryFile(dir=spec["tmp_dir"], prefix="fleet-doctor-restore.")
        except OSError as e:
            raise Refused("%s: uid %d cannot spool the backup there (%s)" % (spec["tmp_dir"], os.geteuid(), e.strerror))
        digest = hashlib.sha256()
        while True:
            chunk = sys.stdin.buffer.read(1 << 20)
            if not chunk:
                break
            digest.update(chunk)
            spool.write(chunk)
        if digest.hexdigest() != spec["sha256"]:
            raise Refused(
                "checksum mismatch after upload: the backup arrived as %s, not %s"
                % (digest.hexdigest(), spec["sha256"])
            )
        spool.seek(0)
        cls.tar = tarfile.open(fileobj=spool, mode="r:gz")

    @classmethod
    def member(cls, op):
        """The backup's regular file ``op["member"]`` (Refused when there is no backup, no such member, or it is
        not a regular file)."""
        if cls.tar is None:
            raise Refused("no backup was sent to install %s from" % op["path"])
        try:
            found = cls.tar.getmember(op["member"])
        except KeyError:
            raise Refused("%s is not in the backup" % op["member"])
        if not found.isreg():
            raise Refused("%s in the backup is not a regular file" % op["member"])
        return found

    @classmethod
    def check_members(cls, ops):
        """Every ``install`` op's member is in the backup and a regular file: checked whole, before any change."""
        for op in ops:
            if op["op"] == "install":
                cls.member(op)


def install(log_dirs, op):
    parent, name = split(op["path"])
    member = SentBackup.member(op)
    pfd = open_dir(log_dirs, parent)
    temp = ".fleet-doctor-restore.%s.%d" % (name, os.getpid())
    try:
        regular(pfd, name, op["path"])  # a symlink or a directory in its place is refused
        owner = os.fstat(pfd)
        src = SentBackup.tar.extractfile(member)
        out = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=pfd)
        try:
            while True:
                chunk = src.read(1 << 20)
                if not chunk:
                    break
                os.write(out, chunk)
            os.fchown(out, owner.st_uid, owner.st_gid)
            os.fchmod(out, member.mode & 0o777)
            os.utime(out, ns=(int(member.mtime) * 10**9, int(member.mtime) * 10**9))
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


def can_change(log_dirs, op):
    dfd = open_dir(log_dirs, op["path"])
    name = None
    try:
        owner = os.fstat(dfd)
        try:  # an unnamed file (Linux): the dir is not even touched
            fd = os.open(".", getattr(os, "O_TMPFILE", 0) | os.O_WRONLY, 0o600, dir_fd=dfd)
        except OSError as e:
            if e.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
                raise
            name = ".fleet-doctor-check.%d" % os.getpid()
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=dfd)
        try:
            os.fchown(fd, owner.st_uid, owner.st_gid)
        finally:
            os.close(fd)
            if name:
                os.unlink(name, dir_fd=dfd)
        return "a file can be made there, owned as it is"
    except PermissionError:
        raise Refused(
            "%s: uid %d cannot make a file there owned as it is (uid %d): run the change as the broker's user"
            % (op["path"], os.geteuid(), owner.st_uid)
        )
    finally:
        os.close(dfd)


def can_spool(spool):
    """A restore's backup of ``spool["bytes"]`` can be spooled in ``spool["tmp_dir"]`` by this user."""
    try:
        tempfile.TemporaryFile(dir=spool["tmp_dir"], prefix="fleet-doctor-check.").close()
        st = os.statvfs(spool["tmp_dir"])
    except OSError as e:
        raise Refused("%s: uid %d cannot spool a backup there (%s)" % (spool["tmp_dir"], os.geteuid(), e.strerror or e))
    free = st.f_bavail * st.f_frsize
    if free < spool["bytes"]:
        raise Refused("%s: %d bytes free, the backup needs %d" % (spool["tmp_dir"], free, spool["bytes"]))


def can_lock(log_dirs):
    """Every log dir's ``.lock`` opens read-write (as the change takes it), without taking it."""
    for d in log_dirs:
        p = os.path.join(d, ".lock")
        try:
            os.close(os.open(p, os.O_RDWR | os.O_NOFOLLOW))
        except FileNotFoundError:
            continue
        except PermissionError:
            raise Refused("%s: uid %d cannot open it read-write to lock it" % (p, os.geteuid()))
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise Refused("%s is a symlink: not Kafka's lock file" % p)
            raise
    return []


OPS = {
    "remove": remove,
    "quarantine": quarantine,
    "quarantine_replica": quarantine_replica,
    "quarantined": quarantined,
    "purge": purge,
    "install": install,
    "own": own,
    "can_change": can_change,
}


def read_input(argv):
    """The input JSON: on stdin after the source, its length the last argument (the loader's way), else (a run by
    hand) the last argument itself."""
    if len(argv) >= 3 and argv[-1].isdigit():
        return json.loads(sys.stdin.buffer.read(int(argv[-1])).decode("utf-8"))
    return json.loads(argv[-1])


def main(argv):
    spec = read_input(argv)
    log_dirs = spec["log_dirs"]
    try:
        if spec.get("check"):
            if any(op["op"] != "can_change" for op in spec["ops"]) or spec.get("tarball"):
                raise Refused("a check runs can_change only: nothing else runs without the log dirs' lock")
            if spec.get("spool"):
                can_spool(spec["spool"])
        if spec.get("unlocked") and any(op["op"] not in UNLOCKED_OPS for op in spec["ops"]):
            raise Refused("only %s run without the log dirs' lock" % ", ".join(UNLOCKED_OPS))
        if any(op["op"] in UNLOCKED_OPS for op in spec["ops"]) and not spec.get("unlocked"):
            raise Refused("%s run without the log dirs' lock, apart from other changes" % ", ".join(UNLOCKED_OPS))
        if spec.get("tarball"):
            SentBackup.receive(spec["tarball"])
            SentBackup.check_members(spec["ops"])
        if spec.get("unlocked"):
            held = []
        else:
            held = can_lock(log_dirs) if spec.get("check") else lock_log_dirs(log_dirs)
        for op in spec["ops"]:
            done = OPS[op["op"]](log_dirs, op)
            sys.stdout.write(json.dumps({"op": op["op"], "path": op["path"], "done": done}) + "\n")
            sys.stdout.flush()
    except Refused as e:
        sys.stderr.write("refused: %s\n" % e)
        return REFUSED
    except (OSError, tarfile.TarError, EOFError) as e:
        sys.stderr.write("%s: %s\n" % (getattr(e, "filename", None) or "?", getattr(e, "strerror", None) or e))
        return 1
    del held
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
