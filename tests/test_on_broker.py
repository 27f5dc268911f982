"""What a repair runs on a broker to change its files (``repair.on_broker``), run here as it runs there (its source at
the head of stdin, a backup to put back after it; as root, or as the Kafka user itself), on a log dir laid out as
Kafka's (issue 28 items 1 and 2).

The Kafka user owns the log dirs and can plant symlinks below them: a quarantine dir that points at ``/etc``, a
partition dir swapped for a link between the plan and the change, a link in place of a file to restore. Each is
refused with a message naming the path, and nothing outside the log dir changes: the owner, the mode and the mtime of
every target are checked."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import pytest

from fleet_doctor.repair.broker import on_broker_command, quarantine_dir, quarantine_subdirs
from fleet_doctor.repair.on_broker import LOCK_HELD, REFUSED
from fleet_doctor.repair.plan import QUARANTINE_DIR

KAFKA_UID = 4242
SYSTEM_PYTHON = "/usr/bin/python3"  # a broker's python3 (Debian's): what a user other than root can run
PLAN = "d" * 64

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the repair changes files as root: chown needs it")


def run(
    log_dir: Path, *ops: dict[str, Any], backup: bytes | None = None, sha256: str = "", user: list[str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``ops`` run by on_broker as the repair runs it (``user``: a prefix running it as another user), ``backup``
    sent after its source (its sha256 as given, or its own)."""
    spec: dict[str, Any] = {"log_dirs": [str(log_dir)], "ops": list(ops)}
    if backup is not None:
        spec["tarball"] = {
            "sha256": sha256 or hashlib.sha256(backup).hexdigest(),
            "tmp_dir": "/tmp" if user else str(log_dir.parent),
        }
    python = SYSTEM_PYTHON if user else sys.executable  # the Kafka user cannot reach root's own interpreter
    argv, head = on_broker_command(spec, str(python))
    ran = subprocess.run(
        [*(user or []), *argv],
        input=head + (backup or b""),
        capture_output=True,
        timeout=60,
        check=False,
    )
    return subprocess.CompletedProcess(ran.args, ran.returncode, ran.stdout.decode(), ran.stderr.decode())


def run_spec(spec: dict[str, Any]) -> subprocess.CompletedProcess[bytes]:
    argv, head = on_broker_command(spec, sys.executable)
    return subprocess.run(argv, input=head, capture_output=True, check=False)


def tarball(*members: tuple[str, bytes], mtime: int = 1_500_000_000, symlink: str = "") -> bytes:
    """A backup as the repair makes it (``tar -czf``: member names without the leading ``/``)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name.lstrip("/"))
            info.size, info.mode, info.mtime = len(data), 0o644, mtime
            tar.addfile(info, io.BytesIO(data))
        if symlink:
            info = tarfile.TarInfo(symlink.lstrip("/"))
            info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
            tar.addfile(info)
    return buf.getvalue()


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    return make_log_dir(tmp_path)


def make_log_dir(base: Path) -> Path:
    """A log dir owned by the Kafka user: partition t-0 with an index, partition.metadata and its .lock."""
    d = base / "kafka-logs"
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
    backup = tarball((f"{pdir}/passwd", b"kafka::0:0::/:/bin/sh\n"))
    ran = run(log_dir, {"op": "install", "member": f"{pdir}/passwd"[1:], "path": f"{pdir}/passwd"}, backup=backup)
    assert ran.returncode == REFUSED and f"{pdir} is a symlink" in ran.stderr, ran
    assert fingerprint(outside) == before


def test_a_symlink_in_place_of_a_file_is_neither_removed_through_nor_written_through(
    log_dir: Path, outside: Path
) -> None:
    pdir = log_dir / "t-0"
    (pdir / "partition.metadata").unlink()
    (pdir / "partition.metadata").symlink_to(outside / "passwd")
    before = fingerprint(outside)
    meta = f"{pdir}/partition.metadata"
    backup = tarball((meta, b"version: 0\ntopic_id: BBBBBBBBBBBBBBBBBBBBBB"))
    for op in (
        {"op": "remove", "path": meta},
        {"op": "quarantine", "path": meta, "into": quarantine_subdirs(PLAN)},
        {"op": "install", "member": meta[1:], "path": meta},
        {"op": "own", "path": meta},
    ):
        ran = run(log_dir, op, backup=backup)
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
    ran = run(linked, {"op": "remove", "path": f"{linked}/passwd"})
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
    content = b"version: 0\ntopic_id: AAAAAAAAAAAAAAAAAAAAAA"
    backup = tarball((str(meta), content))
    assert run(log_dir, {"op": "install", "member": str(meta)[1:], "path": str(meta)}, backup=backup).returncode == 0
    st = meta.lstat()
    assert meta.read_bytes() == content and (st.st_uid, st.st_mode & 0o777) == (KAFKA_UID, 0o644)
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


def test_a_backup_is_checked_whole_before_anything_changes(log_dir: Path, outside: Path) -> None:
    """A backup that arrives other than recorded, a member it lacks, a member that is a link: refused, nothing changed
    (the first op of each run would have removed a file)."""
    meta = log_dir / "t-0" / "partition.metadata"
    index = log_dir / "t-0" / "00000000000000000000.index"
    remove_first = {"op": "remove", "path": str(index)}
    backup = tarball((str(meta), b"version: 0\ntopic_id: AAAAAAAAAAAAAAAAAAAAAA"), symlink=str(meta) + ".link")
    ran = run(
        log_dir,
        remove_first,
        {"op": "install", "member": str(meta)[1:], "path": str(meta)},
        backup=backup,
        sha256="0" * 64,
    )
    assert ran.returncode == REFUSED and "checksum mismatch after upload" in ran.stderr and index.is_file(), ran
    ran = run(log_dir, {"op": "install", "member": "etc/passwd", "path": str(meta)}, backup=backup)
    assert ran.returncode == REFUSED and "etc/passwd is not in the backup" in ran.stderr, ran
    ran = run(log_dir, {"op": "install", "member": str(meta)[1:] + ".link", "path": str(meta)}, backup=backup)
    assert ran.returncode == REFUSED and "is not a regular file" in ran.stderr, ran
    whole = hashlib.sha256(backup).hexdigest()
    ran = run(log_dir, {"op": "install", "member": str(meta)[1:], "path": str(meta)}, backup=backup[:-40], sha256=whole)
    assert ran.returncode == REFUSED and "checksum mismatch" in ran.stderr, ran
    assert index.is_file() and not list(log_dir.parent.glob("fleet-doctor-restore.*"))  # the spool leaves nothing


@pytest.mark.skipif(
    shutil.which("setpriv") is None or not os.path.exists(SYSTEM_PYTHON), reason="bin/dev installs them"
)
def test_every_change_works_as_the_kafka_user_itself() -> None:
    """Issue 28 item 2: the change needs no root on the broker. Run as the Kafka user (uid 4242, no capabilities),
    a quarantine, a remove, an install from a backup and an own all succeed, each file Kafka's afterwards."""
    base = Path(tempfile.mkdtemp(prefix="fleet-doctor-on-broker-"))  # in /tmp: the Kafka user can reach it
    try:
        os.chmod(base, 0o755)
        as_kafka_user(make_log_dir(base))
    finally:
        shutil.rmtree(base)


def as_kafka_user(log_dir: Path) -> None:
    as_kafka = ["setpriv", f"--reuid={KAFKA_UID}", f"--regid={KAFKA_UID}", "--clear-groups", "--inh-caps=-all"]
    pdir = log_dir / "t-0"
    index, meta = pdir / "00000000000000000000.index", pdir / "partition.metadata"
    content = b"version: 0\ntopic_id: BBBBBBBBBBBBBBBBBBBBBB"
    ran = run(
        log_dir,
        {"op": "quarantine", "path": str(index), "into": quarantine_subdirs(PLAN)},
        {"op": "remove", "path": str(meta)},
        {"op": "install", "member": str(meta)[1:], "path": str(meta)},
        {"op": "own", "path": str(meta)},
        backup=tarball((str(meta), content)),
        user=as_kafka,
    )
    assert ran.returncode == 0, ran
    assert [json.loads(line)["op"] for line in ran.stdout.splitlines()] == ["quarantine", "remove", "install", "own"]
    _, qdir = quarantine_dir(str(index), PLAN)
    for p in (Path(qdir), Path(qdir) / index.name, meta):
        assert p.stat().st_uid == KAFKA_UID, p
    assert meta.read_bytes() == content and not index.exists()


def test_the_pre_check_runs_beside_a_running_broker_and_changes_nothing(log_dir: Path) -> None:
    """``can_change`` with ``check``: the log dir's ``.lock`` opened but not taken (the broker holds it), a file made
    and removed in each dir; nothing left behind."""
    import fcntl

    pdir = log_dir / "t-0"
    before = fingerprint(log_dir)
    spec = {"log_dirs": [str(log_dir)], "ops": [{"op": "can_change", "path": str(pdir)}], "check": True}
    with open(log_dir / ".lock", "r+b") as held:
        fcntl.lockf(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        ran = run_spec(spec)
    assert ran.returncode == 0, ran
    assert fingerprint(log_dir) == before  # owner, mode, mtime and contents as they were
    (pdir / QUARANTINE_DIR).symlink_to("/etc")
    spec["ops"] = [{"op": "can_change", "path": f"{pdir}/{QUARANTINE_DIR}"}]
    ran = run_spec(spec)
    assert ran.returncode == REFUSED and b"is a symlink" in ran.stderr


def test_the_input_is_checked_whole_before_the_first_change(log_dir: Path, tmp_path: Path) -> None:
    """Every install's member is looked up before any op runs (a remove first, then a member the backup lacks:
    nothing removed); a check runs can_change only; a spool that cannot be made, or has no room, is refused; an
    input far beyond one argument's 128 KiB goes through (it is on stdin)."""
    index = log_dir / "t-0" / "00000000000000000000.index"
    meta = log_dir / "t-0" / "partition.metadata"
    backup = tarball((str(meta), b"version: 0\ntopic_id: AAAAAAAAAAAAAAAAAAAAAA"))
    ran = run(
        log_dir,
        {"op": "remove", "path": str(index)},
        {"op": "install", "member": "no/such/member", "path": str(meta)},
        backup=backup,
    )
    assert ran.returncode == REFUSED and "no/such/member is not in the backup" in ran.stderr and index.is_file(), ran
    checked = {"log_dirs": [str(log_dir)], "ops": [{"op": "remove", "path": str(index)}], "check": True}
    ran_check = run_spec(checked)
    assert ran_check.returncode == REFUSED and b"a check runs can_change only" in ran_check.stderr and index.is_file()
    spool = {"log_dirs": [str(log_dir)], "ops": [], "check": True}
    missing = run_spec({**spool, "spool": {"tmp_dir": str(tmp_path / "absent"), "bytes": 1}})
    assert missing.returncode == REFUSED and b"cannot spool a backup there" in missing.stderr, missing
    no_room = run_spec({**spool, "spool": {"tmp_dir": str(tmp_path), "bytes": 1 << 60}})
    assert no_room.returncode == REFUSED and b"the backup needs 1152921504606846976" in no_room.stderr, no_room
    many = [{"op": "remove", "path": f"{log_dir}/t-0/{n:020d}.timeindex.deleted"} for n in range(3000)]
    big = run(log_dir, *many)  # about 270 KB of input: E2BIG as one argument
    assert big.returncode == 0 and big.stdout.count('"done": "gone already"') == 3000, big.stderr


# ---- a -stray replica dir (KRaft 3.7+), moved whole beside its log dir
STRAY = "t-0.0123456789abcdef0123456789abcdef-stray"


def stray_op(log_dir: Path, name: str = STRAY) -> dict[str, Any]:
    from fleet_doctor.repair.plan import STRAY_QUARANTINE_DIR

    return {"op": "quarantine_replica", "path": f"{log_dir}/{name}", "into": [STRAY_QUARANTINE_DIR, log_dir.name, "p1"]}


def make_stray(log_dir: Path, name: str = STRAY) -> Path:
    d = log_dir / name
    shutil.copytree(log_dir / "t-0", d)
    for p in (d, *d.iterdir()):
        os.chown(p, KAFKA_UID, KAFKA_UID)
    return d


def test_a_stray_replica_is_moved_whole_beside_its_log_dir_never_over_an_earlier_copy(log_dir: Path) -> None:
    from fleet_doctor.repair.plan import STRAY_QUARANTINE_DIR, stray_quarantine

    stray = make_stray(log_dir)
    before = {p.name: p.read_bytes() for p in stray.iterdir()}
    ran = run(log_dir, stray_op(log_dir))
    assert ran.returncode == 0, ran.stderr
    where = Path(stray_quarantine(str(log_dir), "p1" + "0" * 14)).parent / "p1"
    assert where == log_dir.parent / STRAY_QUARANTINE_DIR / log_dir.name / "p1"
    moved = where / STRAY
    assert not stray.exists() and {p.name: p.read_bytes() for p in moved.iterdir()} == before
    assert all(p.stat().st_uid == KAFKA_UID for p in (where, where.parent, where.parent.parent))  # the log dir's
    assert json.loads(ran.stdout)["done"] == str(moved)
    assert run(log_dir, stray_op(log_dir)).stdout.count("gone already") == 1  # an idempotent step run again
    make_stray(log_dir)  # the same name again (a restore, then the repair again): never over the first copy
    assert run(log_dir, stray_op(log_dir)).returncode == 0
    assert (where / f"{STRAY}.1").is_dir() and moved.is_dir()


def test_only_a_real_stray_dir_right_in_a_log_dir_is_moved(log_dir: Path, outside: Path) -> None:
    live = log_dir / "t-0"
    seen = fingerprint(live)
    for op, why in (
        (stray_op(log_dir, "t-0"), "is not a -stray replica dir right in a log dir"),
        ({**stray_op(log_dir), "path": f"{live}/{STRAY}"}, "is not a -stray replica dir right in a log dir"),
        ({**stray_op(log_dir), "path": f"{outside}/{STRAY}"}, "is not a -stray replica dir right in a log dir"),
    ):
        ran = run(log_dir, op)
        assert ran.returncode == REFUSED and why in ran.stderr, ran.stderr
    (log_dir / STRAY).symlink_to(outside)  # a link planted in its place: not followed, not moved
    ran = run(log_dir, stray_op(log_dir))
    assert ran.returncode == REFUSED and "is a symlink or not a directory" in ran.stderr
    (log_dir / STRAY).unlink()
    assert fingerprint(live) == seen
    from fleet_doctor.repair.plan import STRAY_QUARANTINE_DIR

    make_stray(log_dir)
    (log_dir.parent / STRAY_QUARANTINE_DIR).symlink_to(outside)  # a planted quarantine link: refused, target untouched
    before = fingerprint(outside)
    ran = run(log_dir, stray_op(log_dir))
    assert ran.returncode == REFUSED and "is a symlink or not a directory" in ran.stderr
    assert fingerprint(outside) == before and (log_dir / STRAY).is_dir()


def test_a_running_broker_keeps_its_stray_replica(log_dir: Path) -> None:
    import fcntl

    make_stray(log_dir)
    with open(log_dir / ".lock", "r+b") as held:
        fcntl.lockf(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a running broker's lock
        ran = run(log_dir, stray_op(log_dir))
    assert ran.returncode == LOCK_HELD and (log_dir / STRAY).is_dir()


# ---- a repair's quarantine, listed and deleted beside a running broker (repair.purge)
def quarantine_names() -> list[str]:
    from fleet_doctor.repair.plan import STRAY_QUARANTINE_DIR

    return [QUARANTINE_DIR, STRAY_QUARANTINE_DIR]


def test_a_quarantine_is_listed_and_deleted_beside_a_running_broker_and_nothing_else(
    log_dir: Path, outside: Path
) -> None:
    import fcntl

    from fleet_doctor.repair.plan import STRAY_QUARANTINE_DIR

    index = log_dir / "t-0" / "00000000000000000000.index"
    assert run(log_dir, {"op": "quarantine", "path": str(index), "into": [QUARANTINE_DIR, "p1"]}).returncode == 0
    make_stray(log_dir)
    assert run(log_dir, stray_op(log_dir)).returncode == 0
    names = quarantine_names()
    with open(log_dir / ".lock", "r+b") as held:
        fcntl.lockf(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the broker runs: the quarantine is not Kafka's
        listed = run_spec(
            {
                "log_dirs": [str(log_dir)],
                "unlocked": True,
                "ops": [{"op": "quarantined", "path": str(log_dir), "hash16": "p1", "names": names}],
            }
        )
        assert listed.returncode == 0, listed.stderr
        (line,) = listed.stdout.decode().splitlines()
        entries = {e["path"]: e for e in json.loads(line)["done"]}
        kept = log_dir / "t-0" / QUARANTINE_DIR / "p1" / index.name
        stray = log_dir.parent / STRAY_QUARANTINE_DIR / log_dir.name / "p1" / STRAY
        assert set(entries) == {str(kept), str(stray)}
        assert entries[str(kept)]["kind"] == "file" and entries[str(kept)]["bytes"] == 16
        assert entries[str(stray)]["kind"] == "dir" and entries[str(stray)]["bytes"] == sum(
            p.stat().st_size for p in stray.rglob("*") if p.is_file()
        )
        # the sizes are checked before anything is deleted: a changed entry is refused, the others stay
        changed = {"op": "purge", "path": str(kept), "hash16": "p1", "bytes": 15, "names": names}
        ran = run_spec({"log_dirs": [str(log_dir)], "unlocked": True, "ops": [changed]})
        assert ran.returncode == REFUSED and b"it changed since" in ran.stderr and kept.exists()
        # only a quarantine of that plan: Kafka's own files, another plan's quarantine, a path outside: refused
        for path, h in ((index.parent / "partition.metadata", "p1"), (kept, "p2"), (outside / "passwd", "p1")):
            op = {"op": "purge", "path": str(path), "hash16": h, "bytes": 1, "names": names}
            ran = run_spec({"log_dirs": [str(log_dir)], "unlocked": True, "ops": [op]})
            assert ran.returncode == REFUSED and b"is not in a quarantine of plan" in ran.stderr, ran.stderr
        ops = [
            {"op": "purge", "hash16": "p1", "names": names, **{k: e[k] for k in ("path", "bytes")}}
            for e in entries.values()
        ]
        ran = run_spec({"log_dirs": [str(log_dir)], "unlocked": True, "ops": ops})
        assert ran.returncode == 0, ran.stderr
        assert not kept.exists() and not stray.exists() and (log_dir / "t-0" / "partition.metadata").exists()
        again = run_spec({"log_dirs": [str(log_dir)], "unlocked": True, "ops": ops})  # idempotent
        assert again.returncode == 0 and again.stdout.decode().count("gone already") == 2
        # a change of Kafka's files never runs unlocked, and a purge never runs under the lock with them
        mixed = {"log_dirs": [str(log_dir)], "unlocked": True, "ops": [{"op": "remove", "path": str(index)}]}
        assert run_spec(mixed).returncode == REFUSED


def test_a_link_planted_in_a_stray_quarantine_is_not_followed(log_dir: Path, outside: Path) -> None:
    from fleet_doctor.repair.plan import STRAY_QUARANTINE_DIR

    make_stray(log_dir)
    assert run(log_dir, stray_op(log_dir)).returncode == 0
    stray = log_dir.parent / STRAY_QUARANTINE_DIR / log_dir.name / "p1" / STRAY
    (stray / "link").symlink_to(outside)
    before = fingerprint(outside)
    op = {"op": "purge", "path": str(stray), "hash16": "p1", "bytes": 0, "names": quarantine_names()}
    ran = run_spec({"log_dirs": [str(log_dir)], "unlocked": True, "ops": [op]})
    assert ran.returncode == REFUSED and b"is not a regular file or directory" in ran.stderr
    assert fingerprint(outside) == before and stray.is_dir()


def test_a_cleaned_file_is_not_moved_once_a_swap_sits_beside_it(log_dir: Path) -> None:
    """Checked again on the broker, at the change: a .swap that appeared since the audit (the cleaner split a segment
    and the broker died mid-swap) makes the .cleaned file Kafka's to judge (it deletes the swaps at or above the lowest
    .cleaned base offset, KAFKA-6264); a .deleted file is moved either way."""
    pdir = log_dir / "t-0"
    cleaned, deleted = pdir / "00000000000000000000.log.cleaned", pdir / "00000000000000000000.index.deleted"
    for f in (cleaned, deleted):
        f.write_bytes(b"leftover")
    into = quarantine_subdirs(PLAN)
    swap = pdir / "00000000000000000005.log.swap"
    swap.write_bytes(b"split")
    refused = run(log_dir, {"op": "quarantine", "path": str(cleaned), "into": into})
    assert refused.returncode == REFUSED and "00000000000000000005.log.swap" in refused.stderr, refused
    assert "KAFKA-6264" in refused.stderr and cleaned.read_bytes() == b"leftover"
    assert run(log_dir, {"op": "quarantine", "path": str(deleted), "into": into}).returncode == 0
    assert (
        not deleted.exists() and Path(quarantine_dir(str(deleted), PLAN)[1], deleted.name).read_bytes() == b"leftover"
    )
    swap.unlink()  # no swap: the .cleaned file is Kafka's to delete at start, moved aside instead
    assert (
        run(log_dir, {"op": "quarantine", "path": str(cleaned), "into": into}).returncode == 0 and not cleaned.exists()
    )
