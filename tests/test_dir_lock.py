"""The repair lock of a cluster without ZooKeeper (``repair.dir_lock``), on a real directory with real worker
processes: one holder at a time under a race, a crashed worker's lock kept and resumable once its renewals stop, a
live worker's never, a paused worker (a long GC pause: SIGSTOP) fenced off by the one that resumed, the lock kept
for a human and handed over to a restore and back, and the refusals (an object store mounted through FUSE, a
filesystem without POSIX locks, a damaged lock file). Short leases keep it fast."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleet_doctor.repair import dir_lock
from fleet_doctor.repair.dir_lock import DirLock, DirLockError, check_dir, mount_of
from fleet_doctor.repair.errors import FenceLost
from fleet_doctor.settings import Settings, SettingsError
from fleet_doctor.zookeeper.lock import LockHeld

REPO = Path(__file__).resolve().parents[1]
KEY = "MkU3OEVBNTcwNTJENDM2Qk"  # a Kafka cluster id
LEASE = 1.5  # generous for a loaded 2-CPU machine: a renewal every 0.5 s
PLAN = {"plan_hash": "a" * 64, "step": "brokers", "run_id": "manual__1"}
OTHER = {"plan_hash": "b" * 64, "step": "brokers", "run_id": "manual__2"}

WORKER = """
import json, sys, time
from pathlib import Path
from fleet_doctor.repair.dir_lock import DirLock
from fleet_doctor.zookeeper.lock import LockHeld
root, key, lease, out = Path(sys.argv[1]), sys.argv[2], float(sys.argv[3]), Path(sys.argv[5])
owner = json.loads(sys.argv[4])
lock = DirLock(root, key, lease)
try:
    token = lock.acquire(owner, live_wait_s=float(sys.argv[6]))
except LockHeld as e:
    out.write_text(json.dumps({"held": str(e)}))
    sys.exit(3)
out.write_text(json.dumps({"token": token}))
fence = lock.fence()
while True:  # a repair's steps: each one fenced first
    try:
        fence()
    except Exception as e:
        out.write_text(json.dumps({"token": token, "fenced": str(e)}))
        sys.exit(4)
    time.sleep(0.05)
"""


class Worker:
    """A worker process holding the lock (or refused it), fencing each of its steps until stopped."""

    def __init__(self, root: Path, owner: dict[str, Any], tmp: Path, name: str, live_wait_s: float = 60.0) -> None:
        self.out = tmp / f"{name}.json"
        env = {**os.environ, "PYTHONPATH": str(REPO / "plugins")}
        args = [str(root), KEY, str(LEASE), json.dumps(owner), str(self.out), str(live_wait_s)]
        self.proc = subprocess.Popen([sys.executable, "-c", WORKER, *args], env=env)

    def said(self, timeout: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.out.exists() and self.out.read_text():
                return dict(json.loads(self.out.read_text()))
            if self.proc.poll() not in (None, 0, 3, 4):
                raise AssertionError(f"worker exited {self.proc.returncode}")
            time.sleep(0.02)
        raise AssertionError("the worker said nothing")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[list[Worker]]:
    started: list[Worker] = []
    yield started
    for w in started:
        os.kill(w.proc.pid, signal.SIGCONT) if w.proc.poll() is None else None
        w.stop()


def test_one_holder_a_token_that_only_grows_and_another_plan_refused(tmp_path: Path) -> None:
    lock = DirLock(tmp_path, KEY, LEASE)
    first = lock.acquire(PLAN)
    assert lock.holder() == PLAN and lock.worker_alive()
    lock.fence()()
    with pytest.raises(LockHeld, match="locked by another repair"):
        DirLock(tmp_path, KEY, LEASE).acquire(OTHER)
    lock.release(PLAN)
    assert lock.holder() is None and not (tmp_path / f"{KEY}.active").exists()
    with pytest.raises(FenceLost):
        lock.fence()()
    other = DirLock(tmp_path, KEY, LEASE)
    assert other.acquire(OTHER) > first  # every take gets a higher token, across releases too
    other.release(OTHER)


def test_of_workers_racing_for_the_lock_exactly_one_takes_it(tmp_path: Path, workers: list[Worker]) -> None:
    for n in range(4):
        root = tmp_path / f"round-{n}"
        owners = [{**OTHER, "plan_hash": f"{i}" * 64} for i in range(3)]
        workers[:] = [Worker(root, o, tmp_path, f"r{n}-{i}", live_wait_s=0) for i, o in enumerate(owners)]
        said = [w.said() for w in workers]
        assert sum("token" in s for s in said) == 1 and sum("held" in s for s in said) == 2, said
        winner = next(o for o, s in zip(owners, said, strict=True) if "token" in s)
        assert DirLock(root, KEY).holder() == winner
        for w in workers:
            w.stop()


def test_a_crashed_workers_lock_stays_and_its_attempt_resumes_once_its_renewals_stop(
    tmp_path: Path, workers: list[Worker]
) -> None:
    w = Worker(tmp_path, PLAN, tmp_path, "crashed")
    workers.append(w)
    token = w.said()["token"]
    w.proc.send_signal(signal.SIGKILL)  # the worker dies mid-repair
    w.proc.wait()
    lock = DirLock(tmp_path, KEY, LEASE)
    assert lock.holder() == PLAN  # kept: a second repair stays blocked
    with pytest.raises(LockHeld):
        DirLock(tmp_path, KEY, LEASE).acquire(OTHER)
    t = time.monotonic()
    resumed = lock.acquire(PLAN, live_wait_s=30)  # the same attempt, resumed (Airflow's retry)
    assert resumed > token and LEASE * 0.9 <= time.monotonic() - t < 10
    lock.fence()()
    lock.release(PLAN)


def test_a_live_workers_attempt_is_not_run_twice(tmp_path: Path, workers: list[Worker]) -> None:
    w = Worker(tmp_path, PLAN, tmp_path, "live")
    workers.append(w)
    w.said()
    with pytest.raises(LockHeld, match="another worker is executing a repair"):
        DirLock(tmp_path, KEY, LEASE).acquire(PLAN, live_wait_s=LEASE * 3)
    assert w.proc.poll() is None  # still holding, still fencing


def test_a_paused_worker_is_fenced_off_by_the_one_that_resumed(tmp_path: Path, workers: list[Worker]) -> None:
    """A worker stopped for longer than the lease (a long GC pause, a frozen VM) while its attempt was resumed
    elsewhere: when it runs again, its next fence halts it; it never acts beside the new holder."""
    paused = Worker(tmp_path, PLAN, tmp_path, "paused")
    workers.append(paused)
    old = paused.said()["token"]
    os.kill(paused.proc.pid, signal.SIGSTOP)
    lock = DirLock(tmp_path, KEY, LEASE)
    new = lock.acquire(PLAN, live_wait_s=30)
    assert new > old
    os.kill(paused.proc.pid, signal.SIGCONT)
    assert paused.proc.wait(timeout=30) == 4
    fenced = paused.said()["fenced"]
    assert "no longer this worker's" in fenced or "another took the lock over" in fenced or "not renewed" in fenced
    lock.fence()()  # the new holder goes on
    assert json.loads((tmp_path / f"{KEY}.active").read_text())["token"] == new  # the paused one wrote nothing
    lock.release(PLAN)


def test_a_lock_kept_for_a_human_is_handed_to_a_restore_and_back(tmp_path: Path) -> None:
    halted = DirLock(tmp_path, KEY, LEASE)
    halted.acquire(PLAN)
    halted.release_active()  # the attempt halted after a change: the lock stays, its worker is done
    assert halted.holder() == PLAN and not halted.worker_alive()
    restore = DirLock(tmp_path, KEY, LEASE)
    owner = {"plan_hash": PLAN["plan_hash"], "step": "restore", "run_id": "restore-1"}
    restore.hand_over(PLAN, owner)
    assert restore.holder() == {**owner, "taken_over_from": PLAN}
    with pytest.raises(FenceLost):
        halted.fence()()
    restore.fence()()
    restore.hand_back(owner)  # the restore could not finish: the halted repair still needs a human
    assert DirLock(tmp_path, KEY).holder() == PLAN
    again = DirLock(tmp_path, KEY, LEASE)
    again.acquire(PLAN)  # its resume, at once: no worker of it is alive
    again.release(PLAN)
    assert again.holder() is None


def test_an_object_store_mounted_through_fuse_is_refused() -> None:
    mountinfo = (
        "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
        "40 22 0:35 / /mnt/repairs rw,nosuid,nodev shared:20 - fuse.s3fs s3fs rw,user_id=0\n"
        "41 22 0:36 / /mnt/nfs rw,relatime shared:21 - nfs4 srv:/export rw,vers=4.2\n"
        "42 22 0:37 / /mnt/with\\040space rw shared:22 - fuse.goofys bucket rw\n"
    )
    assert mount_of(Path("/mnt/repairs/locks"), mountinfo) == ("/mnt/repairs", "fuse.s3fs")
    with pytest.raises(DirLockError, match=r"/mnt/repairs/locks is on fuse.s3fs .*create-if-absent"):
        check_dir(Path("/mnt/repairs/locks"), mountinfo)
    with pytest.raises(DirLockError, match=r"fuse\.goofys"):
        check_dir(Path("/mnt/with space/locks"), mountinfo)
    check_dir(Path("/mnt/nfs/repairs/locks"), mountinfo)  # NFSv4: atomic exclusive create, POSIX locks
    check_dir(Path("/mnt/repairsX/locks"), mountinfo)  # another mount point, not a prefix of it
    check_dir(Path("/var/lib/x"), mountinfo)


def test_a_filesystem_without_posix_locks_or_a_damaged_lock_file_is_refused_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def enolck(fd: int, op: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    with monkeypatch.context() as m:
        m.setattr(dir_lock.fcntl, "lockf", enolck)
        with pytest.raises(DirLockError, match=rf"{tmp_path}/{KEY}.guard: the filesystem refuses POSIX locks"):
            DirLock(tmp_path, KEY).acquire(PLAN)
    (tmp_path / f"{KEY}.json").write_text("{torn")
    with pytest.raises(DirLockError, match=rf"{KEY}.json: unreadable .*look at it before any repair"):
        DirLock(tmp_path, KEY).acquire(PLAN)
    for bad in ("", "a/b", ".x"):
        with pytest.raises(ValueError):
            DirLock(tmp_path, bad)


def test_the_lock_dir_is_the_fleets_one_in_the_repairs_dir(tmp_path: Path) -> None:
    inv = tmp_path / "inventory.json"
    assert Settings(inv, repair_dir=tmp_path / "r", data_root="s3a://b/p").lock_dir == tmp_path / "r" / "locks"
    assert Settings(inv, data_root=tmp_path / "d", cluster="c").lock_dir == tmp_path / "d" / "locks"
    with pytest.raises(SettingsError, match="FLEET_DOCTOR_REPAIR_DIR"):
        _ = Settings(inv, data_root="s3a://b/p").lock_dir
