"""One repair per cluster without ZooKeeper (KRaft clusters): the repair lock as files in the shared repairs dir,
with the ZooKeeper lock's rules (``zookeeper.lock``; docs/repair.md, "What the lock means").

Where: ``<repairs root>/locks/`` (``Settings.lock_dir``), keyed by the Kafka cluster's id, beside the journals and
backups the repair already keeps there. Every repair task must see that one shared, durable directory (a shared
volume: NFSv4, CephFS, EFS...), whatever the data root is (a local dir, ``s3a://`` or ``hdfs://``): so the lock works
with every store the product supports, and never depends on an object store's conditional writes.

The files, for cluster id ``K``:

- ``K.json``: the holder (plan hash, step, Airflow run) and its fencing token; it exists exactly while the lock is
  held, and survives a crashed worker (a second repair stays blocked until this one is resumed, restored or released
  by hand), as the persistent znode does;
- ``K.active``: the liveness of the worker executing it, renewed every ``lease_s / 3`` by a thread of that worker
  (``beat`` counts up), as the ephemeral znode lives with its session. A worker that died stops renewing it; a
  resume of the same attempt waits until no renewal was seen for ``lease_s`` (measured on the waiter's own monotonic
  clock: no clock is compared between hosts), then takes over with a new token;
- ``K.token``: the last token given (never deleted): every take (a new holder, or a resume after a dead worker) gets
  a higher one. The fence before every step (``DirLock.fence``) reads ``K.json``: a worker whose token is no longer
  the lock's, or whose own renewals stopped, halts instead of acting beside the new holder;
- ``K.guard``: every read-modify-write of the others happens under an exclusive POSIX lock (``fcntl.lockf``) on it,
  released by the kernel (or the NFSv4 server's lease) when a worker dies.

Refused (``DirLockError``, naming the directory and why) where those guarantees do not hold: a FUSE mount of an
object store (s3fs, goofys, gcsfuse, mountpoint-s3, rclone, blobfuse: no atomic exclusive create, no POSIX locks) or
a filesystem whose POSIX locks fail (NFSv3 without lockd: ENOLCK).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from fleet_doctor.layout import dir_lock_files
from fleet_doctor.repair.errors import FenceLost
from fleet_doctor.store import write_atomic
from fleet_doctor.zookeeper.lock import LockHeld, same_owner

LEASE_S = 15.0  # a dead worker's lock is resumable this long after its last renewal was seen
GUARD_TIMEOUT_S = 30.0
# POSIX locks belong to a process, not a thread or a descriptor: the threads of one process (a worker's renewals
# beside its steps, or two DirLocks of one cluster) are kept apart by a lock of their own per guard file
_IN_PROCESS: dict[str, threading.Lock] = {}
_IN_PROCESS_LOCK = threading.Lock()
STALE_AFTER_S = 3600.0  # a liveness file this much older than the waiter's clock: dead without watching it
# FUSE mounts of object stores: no atomic exclusive create and no POSIX locks
OBJECT_STORE_MOUNTS = frozenset(
    {"s3fs", "goofys", "gcsfuse", "mountpoint-s3", "rclone", "blobfuse", "blobfuse2", "s3backer", "geesefs"}
)


class DirLockError(RuntimeError):
    """The directory cannot hold the repair lock safely (the message says which and why)."""


def mount_of(path: Path, mountinfo: str | None = None) -> tuple[str, str]:
    """(mount point, filesystem type) of the mount ``path`` is on, from ``/proc/self/mountinfo`` (or ``mountinfo``,
    its text): the longest mount point that is a prefix of the resolved path."""
    text = mountinfo if mountinfo is not None else Path("/proc/self/mountinfo").read_text()
    target = str(path.resolve())
    best = ("/", "")
    for line in text.splitlines():
        head, sep, tail = line.partition(" - ")
        fields = head.split()
        if not sep or len(fields) < 5:
            continue
        point = fields[4].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best[0]):
            best = (point, tail.split()[0] if tail.split() else "")
    return best


def check_dir(directory: Path, mountinfo: str | None = None) -> None:
    """Refuse (DirLockError) a lock dir whose filesystem cannot create a file only if it is absent atomically, or
    take a POSIX lock."""
    point, fstype = mount_of(directory, mountinfo)
    kind = fstype.removeprefix("fuse.")
    if fstype.startswith("fuse.") and kind in OBJECT_STORE_MOUNTS:
        raise DirLockError(
            f"the repair lock's directory {directory} is on {fstype} (mounted at {point}): an object store mounted "
            "through FUSE has neither an atomic create-if-absent nor POSIX locks, so two workers could both take the "
            "lock. Put FLEET_DOCTOR_REPAIR_DIR on a shared filesystem (NFSv4, CephFS, EFS; docs/repair.md)"
        )


class DirLock:
    """The repair lock of the cluster whose id is ``key``, in the lock dir ``root`` (``Settings.lock_dir``)."""

    def __init__(self, root: Path, key: str, lease_s: float = LEASE_S) -> None:
        if not key or "/" in key or key.startswith("."):
            raise ValueError(f"{key!r} is not a cluster id")
        self.root, self.key, self.lease_s = Path(root), key, lease_s
        files = dir_lock_files(self.root, key)
        self.path, self.active, self.counter, self.guard_path = (
            files["holder"],
            files["active"],
            files["token"],
            files["guard"],
        )
        self.token: int | None = None  # ours, while this object holds the lock
        self._beat: threading.Thread | None = None
        self._stop = threading.Event()
        self._renewed = 0.0  # monotonic time of our last successful renewal
        self._lost: str | None = None
        self._checked = False  # check_dir done (the mount does not change under a running worker)

    # ---- reading
    def _read(self, path: Path) -> dict[str, Any] | None:
        try:
            data = json.loads(path.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            raise DirLockError(f"{path}: unreadable ({e}): look at it before any repair of cluster {self.key}") from e
        if not isinstance(data, dict):
            raise DirLockError(f"{path}: not a lock record: look at it before any repair of cluster {self.key}")
        return data

    def holder(self) -> dict[str, Any] | None:
        """Who holds the lock (plan hash, step, run, ...), None when it is free."""
        held = self._read(self.path)
        return dict(held["holder"]) if held and isinstance(held.get("holder"), dict) else None

    def worker_alive(self) -> bool:
        """Whether a worker renewed the lock's liveness within the last ``lease_s`` (watched for that long when it
        is not plainly stale)."""
        return self._previous_worker_alive(self.lease_s)

    # ---- the guard
    @contextlib.contextmanager
    def _guarded(self) -> Iterator[None]:
        if not self._checked:
            self.root.mkdir(parents=True, exist_ok=True)
            check_dir(self.root)
            self._checked = True
        with _IN_PROCESS_LOCK:
            mutex = _IN_PROCESS.setdefault(str(self.guard_path), threading.Lock())
        with mutex:
            yield from self._locked_guard()

    def _locked_guard(self) -> Iterator[None]:
        fd = os.open(self.guard_path, os.O_RDWR | os.O_CREAT, 0o640)
        try:
            deadline = time.monotonic() + GUARD_TIMEOUT_S
            while True:
                try:
                    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as e:
                    if e.errno == errno.ENOLCK:
                        raise DirLockError(
                            f"{self.guard_path}: the filesystem refuses POSIX locks (ENOLCK: NFSv3 without lockd?): "
                            "the repair lock needs them; use NFSv4 or another shared filesystem (docs/repair.md)"
                        ) from e
                    if e.errno not in (errno.EAGAIN, errno.EACCES) or time.monotonic() > deadline:
                        raise DirLockError(f"{self.guard_path}: could not be locked: {e}") from e
                    time.sleep(0.05)
            yield
        finally:
            os.close(fd)  # closing the descriptor releases the lock

    def _write(self, path: Path, data: dict[str, Any]) -> None:
        write_atomic(path, (json.dumps(data, sort_keys=True) + "\n").encode())

    def _next_token(self) -> int:
        last = self._read(self.counter) or {}
        token = int(last.get("token") or 0) + 1
        self._write(self.counter, {"token": token})
        return token

    # ---- liveness
    def _previous_worker_alive(self, watch_s: float) -> bool:
        """Whether another worker renews the liveness file: absent, plainly stale, or unchanged while watched for
        ``watch_s`` seconds of this host's monotonic clock: not alive."""
        first = self._read(self.active)
        if first is None:
            return False
        with contextlib.suppress(OSError):
            if time.time() - self.active.stat().st_mtime > STALE_AFTER_S:
                return False
        deadline = time.monotonic() + watch_s
        while time.monotonic() < deadline:
            time.sleep(min(0.2, watch_s / 10))
            now = self._read(self.active)
            if now is None:
                return False
            if now != first:
                return True
        return False

    def _renew(self) -> None:
        beat = 0
        while not self._stop.wait(self.lease_s / 3):
            beat += 1
            try:
                with self._guarded():
                    mine = self._read(self.active)
                    if not mine or mine.get("token") != self.token:
                        self._lost = f"{self.active} names another worker now ({mine}): another took the lock over"
                        return
                    self._write(self.active, {**mine, "beat": beat})
                self._renewed = time.monotonic()
            except Exception as e:  # the lock dir unreachable: the fence notices once the lease has run out
                self._lost = f"the lock's liveness could not be renewed: {e}"

    def _start_renewing(self) -> None:
        self._stop.clear()
        self._lost = None
        self._renewed = time.monotonic()
        self._beat = threading.Thread(target=self._renew, name=f"dir-lock-{self.key}", daemon=True)
        self._beat.start()

    def _stop_renewing(self) -> None:
        self._stop.set()
        if self._beat is not None and self._beat is not threading.current_thread():
            self._beat.join(timeout=self.lease_s)
        self._beat = None

    # ---- taking and leaving
    def acquire(self, owner: dict[str, Any], wait_s: float = 0.0, live_wait_s: float = 60.0) -> int:
        """Take the lock as ``owner`` ({plan_hash, step, run_id, ...}); its fencing token. The same owner takes it
        again (a resume) once the previous worker's renewals have stopped (up to ``live_wait_s``), with a new token.
        A holder that is another step of the same plan is waited for up to ``wait_s``; any other: LockHeld."""
        deadline = time.monotonic() + wait_s
        while True:
            with self._guarded():
                held = self._read(self.path)
                holder = held.get("holder") if held else None
                if holder is None:
                    return self._take(owner, fresh=True)
                if same_owner(holder, owner):
                    break
                if holder.get("plan_hash") != owner.get("plan_hash") or time.monotonic() > deadline:
                    raise LockHeld(f"cluster {self.key} is locked by another repair: {holder}")
            time.sleep(min(2.0, max(0.1, deadline - time.monotonic())))
        live_deadline = time.monotonic() + live_wait_s
        while self._previous_worker_alive(self.lease_s):  # dead only once a whole lease passed without a renewal
            if time.monotonic() > live_deadline:
                active = self._read(self.active)
                raise LockHeld(f"another worker is executing a repair of {self.key} right now: {active}")
        with self._guarded():
            held = self._read(self.path)
            if not held or not same_owner(held.get("holder") or {}, owner):
                raise LockHeld(f"cluster {self.key}: the lock changed while a resume waited: {held}")
            return self._take(owner, fresh=False, current=held)

    def _take(self, owner: dict[str, Any], *, fresh: bool, current: dict[str, Any] | None = None) -> int:
        """Under the guard: the lock record with a new token (the holder kept on a resume), our liveness file."""
        token = self._next_token()
        holder = owner if fresh or current is None else current["holder"]
        self._write(self.path, {**(current or {}), "holder": holder, "token": token})
        self._write(self.active, {"token": token, "worker": f"{socket.gethostname()}:{os.getpid()}", "beat": 0})
        self.token = token
        self._start_renewing()
        return token

    def fence(self) -> Callable[[], None]:
        """Before every step: this worker still holds the lock with its token, and its renewals are going (FenceLost
        otherwise: another worker may hold it now, so halt rather than act beside it)."""

        def check() -> None:
            if self.token is None:
                raise FenceLost(f"this worker does not hold the repair lock of cluster {self.key}")
            if self._lost:
                raise FenceLost(f"cluster {self.key}: {self._lost}: halting")
            if time.monotonic() - self._renewed > self.lease_s:
                raise FenceLost(f"cluster {self.key}: the lock's liveness was not renewed for {self.lease_s:.0f} s")
            held = self._read(self.path)
            if not held or held.get("token") != self.token:
                raise FenceLost(f"cluster {self.key}: the lock's token is no longer this worker's ({held}): halting")

        return check

    def release_active(self) -> None:
        """Stop renewing and remove the liveness file if it is still ours: the lock stays (for a human)."""
        self._stop_renewing()
        if self.token is None:
            return
        with self._guarded():
            mine = self._read(self.active)
            if mine and mine.get("token") == self.token:
                self.active.unlink(missing_ok=True)

    def release(self, owner: dict[str, Any]) -> None:
        """Release the lock if ``owner`` with this worker's token holds it; and the liveness file."""
        self._stop_renewing()
        with self._guarded():
            held = self._read(self.path)
            if held and held.get("token") == self.token and same_owner(held.get("holder") or {}, owner):
                self.path.unlink()
            mine = self._read(self.active)
            if mine and mine.get("token") == self.token:
                self.active.unlink(missing_ok=True)
        self.token = None

    def hand_over(self, held: dict[str, Any], owner: dict[str, Any]) -> None:
        """A restore takes the lock over from ``held`` (a halted attempt whose worker is gone), keeping it to hand
        back (``hand_back``); a new token, as a take."""
        with self._guarded():
            current = self._read(self.path)
            if not current or current.get("holder") != held:
                raise LockHeld(f"cluster {self.key}: the lock changed while it was being taken over: {current}")
            self._take({**owner, "taken_over_from": held}, fresh=True, current=current)

    def hand_back(self, owner: dict[str, Any]) -> None:
        """Give the lock back to the holder ``hand_over`` took it from (the halted repair still needs a human)."""
        self._stop_renewing()
        with self._guarded():
            current = self._read(self.path)
            holder = (current or {}).get("holder") or {}
            if current and current.get("token") == self.token and holder.get("taken_over_from"):
                self._write(self.path, {"holder": holder["taken_over_from"], "token": self._next_token()})
            mine = self._read(self.active)
            if mine and mine.get("token") == self.token:
                self.active.unlink(missing_ok=True)
        self.token = None
