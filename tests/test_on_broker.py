"""What a repair runs on a broker to change its files (``repair.on_broker``), run here as it runs there (``python3 -``
with its source on stdin, as root), on a log dir laid out as Kafka's (issue 28 item 1).

The Kafka user owns the log dirs and can plant symlinks below them: a quarantine dir that points at ``/etc``, a
partition dir swapped for a link between the plan and the change, a link in place of a file to restore. Each is
refused with a message naming the path, and nothing outside the log dir changes: the owner, the mode and the mtime of
every target are checked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fleet_doctor.repair.broker import ON_BROKER, quarantine_dir, quarantine_subdirs
from fleet_doctor.repair.on_broker import LOCK_HELD, REFUSED
from fleet_doctor.repair.plan import QUARANTINE_DIR

KAFKA_UID = 4242
PLAN = "d" * 64

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the repair changes files as root: chown needs it")


def run(log_dir: Path, *ops: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    spec = json.dumps({"log_dirs": [str(log_dir)], "ops": list(ops)})
    return subprocess.run(
        [sys.executable, "-", spec], input=ON_BROKER.decode(), capture_output=True, text=True, timeout=60, check=False
    )


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    """A log dir owned by the Kafka user: partition t-0 with an index, partition.metadata and its .lock."""
    d = tmp_path / "kafka-logs"
    pdir = d / "t-0"
    pdir.mkdir(parents=True)
    (d / ".lock").write_bytes(b"")
    (pdir / "00000000000000000000.index").write_bytes(b"\0" * 16)
    (pdir / "partition.metadata").write_bytes(b"version: 0\ntopic_id: AAAAAAAAAAAAAAAAAAAAAA")
    for p in (d, pdir, *pdir.iterdir(), d / ".lock"):
        os.chown(p, KAFKA_UID, KAFKA_UID)
    return d


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A root-owned dir outside the log dir, standing for /etc: a file in it, known owner, mode and times."""
    d = tmp_path / "etc"
    d.mkdir(mode=0o755)
    (d / "passwd").write_bytes(b"root:x:0:0::/root:/bin/sh\n")
    (d / "00000000000000000000.index").write_bytes(b"not kafka's")
    for p in (d, *d.iterdir()):
        os.utime(p, (1_000_000_000, 1_000_000_000))
    return d


def fingerprint(root: Path) -> dict[str, tuple[int, int, int, int, bytes | None]]:
    """Owner, group, mode, mtime (ns) and content of ``root`` and everything in it."""
    out = {}
    for p in [root, *sorted(root.rglob("*"))]:
        st = p.lstat()
        out[str(p)] = (st.st_uid, st.st_gid, st.st_mode, st.st_mtime_ns, p.read_bytes() if p.is_file() else None)
    return out


def test_a_planted_quarantine_symlink_is_refused_and_its_target_untouched(log_dir: Path, outside: Path) -> None:
    index = log_dir / "t-0" / "00000000000000000000.index"
    (log_dir / "t-0" / QUARANTINE_DIR).symlink_to(outside)
    before = fingerprint(outside)
    ran = run(log_dir, {"op": "quarantine", "path": str(index), "into": quarantine_subdirs(PLAN)})
    assert ran.returncode == REFUSED, ran
    assert f"{log_dir}/t-0/{QUARANTINE_DIR} is a symlink" in ran.stderr
    assert fingerprint(outside) == before  # still root's, same mode and mtime, nothing made in it
    assert index.is_file() and index.stat().st_uid == KAFKA_UID  # the file stays where it was


def test_a_partition_dir_swapped_for_a_symlink_is_refused_for_every_change(log_dir: Path, outside: Path) -> None:
    pdir = log_dir / "t-0"
    pdir.rename(log_dir / "t-0.moved")
    pdir.symlink_to(outside)
    before = fingerprint(outside)
    for op in (
        {"op": "remove", "path": f"{pdir}/00000000000000000000.index"},
        {"op": "quarantine", "path": f"{pdir}/00000000000000000000.index", "into": quarantine_subdirs(PLAN)},
        {"op": "own", "path": f"{pdir}/passwd"},
    ):
        ran = run(log_dir, op)
        assert ran.returncode == REFUSED and f"{pdir} is a symlink or not a directory" in ran.stderr, ran
    source = log_dir.parent / "restore-tmp" / "passwd"
    source.parent.mkdir(mode=0o700)
    source.write_bytes(b"kafka::0:0::/:/bin/sh\n")
    ran = run(log_dir, {"op": "install", "from": str(source), "path": f"{pdir}/passwd"})
    assert ran.returncode == REFUSED and f"{pdir} is a symlink" in ran.stderr, ran
    assert fingerprint(outside) == before


def test_a_symlink_in_place_of_a_file_is_neither_removed_through_nor_written_through(
    log_dir: Path, outside: Path
) -> None:
    pdir = log_dir / "t-0"
    (pdir / "partition.metadata").unlink()
    (pdir / "partition.metadata").symlink_to(outside / "passwd")
    before = fingerprint(outside)
    source = log_dir.parent / "restore-tmp" / "partition.metadata"
    source.parent.mkdir(mode=0o700)
    source.write_bytes(b"version: 0\ntopic_id: BBBBBBBBBBBBBBBBBBBBBB")
    for op in (
        {"op": "remove", "path": f"{pdir}/partition.metadata"},
        {"op": "quarantine", "path": f"{pdir}/partition.metadata", "into": quarantine_subdirs(PLAN)},
        {"op": "install", "from": str(source), "path": f"{pdir}/partition.metadata"},
        {"op": "own", "path": f"{pdir}/partition.metadata"},
    ):
        ran = run(log_dir, op)
        assert ran.returncode == REFUSED and f"{pdir}/partition.metadata is a symlink" in ran.stderr, ran
    assert fingerprint(outside) == before and (pdir / "partition.metadata").is_symlink()


def test_the_log_dir_itself_and_paths_outside_it_are_refused(log_dir: Path, outside: Path, tmp_path: Path) -> None:
    before = fingerprint(outside)
    ran = run(log_dir, {"op": "remove", "path": str(outside / "passwd")})
    assert ran.returncode == REFUSED and "not inside a log dir" in ran.stderr
    ran = run(log_dir, {"op": "remove", "path": f"{log_dir}/t-0/../../etc/passwd"})
    assert ran.returncode == REFUSED and "'..' is not a plain path component" in ran.stderr
    linked = tmp_path / "linked-logs"
    linked.symlink_to(outside)
    spec = json.dumps({"log_dirs": [str(linked)], "ops": [{"op": "remove", "path": f"{linked}/passwd"}]})
    ran = subprocess.run(
        [sys.executable, "-", spec], input=ON_BROKER.decode(), capture_output=True, text=True, timeout=60, check=False
    )
    assert ran.returncode == REFUSED and f"log dir {linked} is not a real directory" in ran.stderr
    assert fingerprint(outside) == before


def test_remove_quarantine_install_own_as_kafka_lays_them_out(log_dir: Path) -> None:
    pdir = log_dir / "t-0"
    index = pdir / "00000000000000000000.index"
    original = index.read_bytes()
    into = quarantine_subdirs(PLAN)
    ran = run(log_dir, {"op": "quarantine", "path": str(index), "into": into})
    assert ran.returncode == 0, ran
    root, qdir = quarantine_dir(str(index), PLAN)
    assert json.loads(ran.stdout) == {"op": "quarantine", "path": str(index), "done": f"{qdir}/{index.name}"}
    for d in (root, qdir):  # made with plain mkdir, owned as the partition dir
        assert Path(d).stat().st_uid == KAFKA_UID and not Path(d).is_symlink()
    index.write_bytes(b"rebuilt")  # quarantined again after a restore: never over the earlier copy
    assert run(log_dir, {"op": "quarantine", "path": str(index), "into": into}).returncode == 0
    assert Path(f"{qdir}/{index.name}").read_bytes() == original and Path(f"{qdir}/{index.name}.1").read_bytes()
    again = run(log_dir, {"op": "quarantine", "path": str(index), "into": into})  # idempotent: gone already
    assert again.returncode == 0 and json.loads(again.stdout)["done"] == "gone already"

    meta = pdir / "partition.metadata"
    assert run(log_dir, {"op": "remove", "path": str(meta)}).returncode == 0 and not meta.exists()
    source = log_dir.parent / "restore-tmp" / "partition.metadata"
    source.parent.mkdir(mode=0o700)
    source.write_bytes(b"version: 0\ntopic_id: AAAAAAAAAAAAAAAAAAAAAA")
    os.chmod(source, 0o644)
    os.utime(source, ns=(1_500_000_000_000_000_000, 1_500_000_000_000_000_000))
    assert run(log_dir, {"op": "install", "from": str(source), "path": str(meta)}).returncode == 0
    st = meta.lstat()
    assert meta.read_bytes() == source.read_bytes() and (st.st_uid, st.st_mode & 0o777) == (KAFKA_UID, 0o644)
    assert st.st_mtime_ns == 1_500_000_000_000_000_000 and not list(pdir.glob(".fleet-doctor-restore.*"))
    os.chown(meta, 0, 0)
    assert run(log_dir, {"op": "own", "path": str(meta)}).returncode == 0 and meta.stat().st_uid == KAFKA_UID


def test_a_broker_holding_the_lock_stops_every_change_before_the_first(log_dir: Path) -> None:
    import fcntl

    meta = log_dir / "t-0" / "partition.metadata"
    with open(log_dir / ".lock", "r+b") as held:  # Kafka's FileLock, taken by another process
        fcntl.lockf(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        ran = run(log_dir, {"op": "remove", "path": str(meta)})
    assert ran.returncode == LOCK_HELD and "is locked: a broker runs on this log dir" in ran.stderr
    assert meta.is_file()
