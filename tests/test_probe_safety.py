"""Safety properties of the probe on a broker: read-only, and it never takes the broker's lock."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

from harness.corpus import by_kind, copy_writable, run_probe

SAMPLE = "zk-3.1-single-aryan/kafka-logs"

HOLD_LOCK = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR)
fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)   # what Kafka's FileChannel.tryLock does
print("locked", flush=True)
time.sleep(60)
"""


def tree_state(root: Path) -> dict[str, tuple[int, int, str]]:
    state = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames + dirnames:
            p = Path(dirpath) / name
            st = p.lstat()
            digest = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else ""
            state[str(p.relative_to(root))] = (st.st_size, st.st_mtime_ns, digest)
    return state


def test_probe_changes_nothing(corpus: Path, tmp_path: Path) -> None:
    logdir = copy_writable(corpus / SAMPLE, tmp_path / "kafka-logs")
    before = tree_state(logdir)
    run_probe(logdir, deep=True, verify_crc=True)
    run_probe(logdir)
    assert tree_state(logdir) == before


def test_lock_held_by_a_running_broker_is_reported_not_taken(corpus: Path, tmp_path: Path) -> None:
    logdir = copy_writable(corpus / SAMPLE, tmp_path / "kafka-logs")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(logdir / ".lock")], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        (rec,) = by_kind(run_probe(logdir), "logdir")
        assert rec["lock_present"] is True
        assert rec["lock_held_by_pid"] == holder.pid
        assert holder.poll() is None  # the holder still runs and still holds its lock
    finally:
        holder.kill()
        holder.wait()
    (rec,) = by_kind(run_probe(logdir), "logdir")
    assert rec["lock_held_by_pid"] is None
