"""The unit tier's fakes (tests/harness/fakes.py) against the real things: the same calls on ``BrokerHost`` over a lab
broker's real sshd and on ``FakeHost``, and the same reads from ``Cluster`` on the lab's real ZooKeeper and from
``FakeCluster``, must answer alike. A fake that drifts from what the product really meets fails here, not in the
executor's table test.

The real side runs twice: as root, and as a least-privilege SSH user (issue 28 item 2): the lab's brokers run as
``kafka`` and own their files, the product logs in as ``kafka-doctor`` (not root, not Kafka's), and every read and
change of Kafka's files goes through ``sudo -n -u kafka`` as the inventory's ``kafka_user`` says."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import pwd
import shutil
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleet_doctor import inventory
from fleet_doctor.repair import backups
from fleet_doctor.repair.broker import ssh_hosts
from fleet_doctor.repair.errors import RepairError
from fleet_doctor.repair.executor import wait_until
from fleet_doctor.repair.on_broker import LOCK_HELD
from fleet_doctor.zookeeper.cluster import Cluster
from fleet_lab import fleet
from harness.fakes import FakeCluster, FakeFleet, FakeHost, FakePartition
from harness.ssh import ssh_connect

pytestmark = pytest.mark.timeout(300)
BROKER = 1
PLAN_HASH = "c" * 64


SSH_USER, KAFKA_USER = "kafka-doctor", "kafka"


@pytest.fixture(scope="module", params=["root", "least-privilege"])
def lab(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    users: dict[str, str] = {}
    if request.param == "least-privilege":
        if os.geteuid() != 0:
            pytest.skip("the least-privilege lab makes its users and their sudoers rule: root only")
        users = {"ssh_user": SSH_USER, "kafka_user": KAFKA_USER}
        tmp = Path(tempfile.mkdtemp(prefix="fleet-doctor-contract-"))  # in /tmp: the lab's users can reach it
        tmp.chmod(0o755)
    else:
        tmp = tmp_path_factory.mktemp("contract")
    try:
        state = fleet.up(tmp / "lab", brokers=3, kafka_version="3.6.2", racks=3, **users)
        inv = inventory.load(tmp / "lab" / "inventory.json")
        zk = state.zk_client()
        try:
            yield {"state": state, "inv": inv, "zk": zk, "tmp": tmp, "users": users}
        finally:
            zk.stop()
    finally:
        if (tmp / "lab" / "lab.json").is_file():
            fleet.down(tmp / "lab")
        if users:
            shutil.rmtree(tmp)


def planned_files(state: fleet.LabState) -> list[str]:
    """A partition's topic-ID files and its first index on broker 1: what a repair of it touches."""
    log_dir = Path(state.broker(BROKER).log_dirs[0])
    pdir = sorted(d for d in log_dir.iterdir() if d.is_dir() and (d / "partition.metadata").is_file())[0]
    index = sorted(pdir.glob("*.index"))[0]
    return [str(pdir / "leader-epoch-checkpoint"), str(pdir / "partition.metadata"), str(index)]


def mirror(lab: dict[str, Any], paths: list[str]) -> FakeFleet:
    """A ``FakeFleet`` holding what the lab holds now: broker 1's planned files, who runs, each partition's ISR."""
    real = Cluster(lab["zk"])
    parts = [
        FakePartition(p["topic"], p["partition"], p["replicas"], p["isr"], p["leader"], p["min_isr"])
        for p in real.partitions()
    ]
    files = {b.id: {} for b in lab["inv"].brokers}
    files[BROKER] = {p: Path(p).read_bytes() for p in paths}
    racks = {b: r for b, r in real.racks().items() if r is not None}
    return FakeFleet(files, parts, controller=real.controller(), running=set(real.registered()), racks=racks)


def reads(cluster: Cluster) -> dict[str, Any]:
    """What the health gates read, as comparable data (ISR membership of broker 1 per partition)."""
    parts = cluster.partitions()
    return {
        "registered": sorted(cluster.registered()),
        "partitions": sorted((p["topic"], p["partition"], tuple(p["replicas"])) for p in parts),
        "broker_in_isr": sorted((p["topic"], p["partition"]) for p in parts if BROKER in p["isr"]),
        "in_isr": Cluster.in_isr(parts, BROKER),
    }


def test_the_fake_host_answers_as_the_real_one(lab: dict[str, Any], tmp_path: Path) -> None:
    state, inv = lab["state"], lab["inv"]
    paths = planned_files(state)
    originals = {p: Path(p).read_bytes() for p in paths}
    fake_fleet = mirror(lab, paths)
    real = ssh_hosts(inv, ssh_connect(inv))(BROKER, [])
    fake = FakeHost(fake_fleet, BROKER)
    real_cluster, fake_cluster = Cluster(lab["zk"]), FakeCluster(fake_fleet)
    missing = paths[0].rsplit("/", 1)[0] + "/no-such-file"
    quarantined = f"{paths[2].rsplit('/', 1)[0]}/fleet-doctor-quarantine/{PLAN_HASH[:16]}/{Path(paths[2]).name}"
    try:
        # who it is, whether it runs, who holds its log dirs' lock
        assert isinstance(real.identity(), str) and isinstance(fake.identity(), str)
        assert real.running() is fake.running() is True
        assert bool(real.lock_holders()) is bool(fake.lock_holders()) is True
        # the change's user can change the planned files' dirs (checked before a stop, the lock not taken)
        assert real.can_change(paths) is None and fake.can_change(paths) is None
        assert reads(real_cluster) == reads(fake_cluster)
        # the files' checksums, a missing one named
        assert real.sums([*paths, missing]) == fake.sums([*paths, missing])
        # a change refused while the broker holds the lock: nothing changed
        assert real.remove(paths[1]).exit_status == fake.remove(paths[1]).exit_status == LOCK_HELD
        assert real.sums(paths) == fake.sums(paths)
        # stopped: not running, no lock holder, deregistered and out of every ISR it could leave
        real.service("stop", 60)
        fake.service("stop", 60)
        wait_until(lambda: BROKER not in real_cluster.registered() and not real.running(), 60, "the lab broker stop")
        assert real.running() is fake.running() is False
        assert real.lock_holders() == fake.lock_holders() == []
        wait_until(lambda: reads(real_cluster) == reads(fake_cluster), 60, "the same ISR after the stop")
        assert real_cluster.controller() != BROKER and fake_cluster.controller() != BROKER
        # a clean stop trims the active segment's indexes (Kafka's doing, not the host's): the fake's files follow
        originals = {p: Path(p).read_bytes() for p in paths}
        fake_fleet.brokers[BROKER] = dict(originals)
        # a backup: the same members with the same checksums, its own checksum as the tarball's
        tarballs = tmp_path / "real.tar.gz", tmp_path / "fake.tar.gz"
        made = real.backup(paths, tarballs[0]), fake.backup(paths, tarballs[1])
        for tarball, bk in zip(tarballs, made, strict=True):
            assert backups.sha256_file(tarball) == bk.sha256
            assert backups.tar_manifest(tarball) == {p: hashlib.sha256(d).hexdigest() for p, d in originals.items()}
            assert backups.member_names(tarball) == [p.lstrip("/") for p in paths]
        # the change: a removal and a quarantine, then the same files present and missing on both
        for host in (real, fake):
            assert host.remove(paths[1]).exit_status == 0
            assert host.remove(paths[1]).exit_status == 0  # idempotent
            assert host.quarantine(paths[2], PLAN_HASH).exit_status == 0
            assert host.quarantine(paths[2], PLAN_HASH).exit_status == 0  # gone already: nothing to do
        assert real.sums([*paths, quarantined]) == fake.sums([*paths, quarantined])
        # put back from the backup: as it was, owned as its partition dir
        for host, tarball, bk in zip((real, fake), tarballs, made, strict=True):
            host.put_back(tarball, bk.sha256, backups.member_names(tarball))
            host.own_as_parent(paths)
        assert real.sums(paths) == fake.sums(paths)
        assert {p: Path(p).read_bytes() for p in paths} == originals
        owners = real.owners(paths)
        assert len(set(owners.values())) == 1 and set(fake.owners(paths)) == set(owners)
        if lab["users"]:  # put back as Kafka's own files, by an SSH user that is neither root nor Kafka
            kafka = pwd.getpwnam(KAFKA_USER)
            assert set(owners.values()) == {f"{kafka.pw_uid}:{kafka.pw_gid}"}
            assert real.remote.run("id -un").stdout.strip() == SSH_USER
        # started again: running, registered, back in ISR on both
        real.service("start", 60)
        fake.service("start", 60)
        wait_until(lambda: BROKER in real_cluster.registered(), 60, "the lab broker's registration")
        fleet.wait_healthy(state, timeout=60)
        assert real.running() is fake.running() is True
        assert reads(real_cluster) == reads(fake_cluster)
    finally:
        real.close()
        Path(quarantined).unlink(missing_ok=True)
        if not fleet.running_pid(state.broker(BROKER).config()):
            fleet.run_service(state.broker(BROKER), "start")


def settled(cluster: Cluster, quiet_s: float = 1.5, timeout: float = 30) -> None:
    """Until the controller has done moving leadership: the leaders unchanged for ``quiet_s``."""
    import time

    last, since, deadline = None, time.monotonic(), time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = sorted((p["topic"], p["partition"], p["leader"], tuple(p["isr"])) for p in cluster.partitions())
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return
        time.sleep(0.1)
    raise AssertionError(f"the lab's leadership did not settle within {timeout} s")


def test_a_rolls_reads_and_elections_answer_as_the_real_ones(lab: dict[str, Any]) -> None:
    """What a roll asks besides the repair's calls: the racks, the broker's state, a preferred election through the
    broker's election tool and through ZooKeeper's znode."""
    state, inv = lab["state"], lab["inv"]
    real = ssh_hosts(inv, ssh_connect(inv))(BROKER, [])
    real_cluster = Cluster(lab["zk"])
    try:
        fake_fleet = mirror(lab, [])
        fake, fake_cluster = FakeHost(fake_fleet, BROKER), FakeCluster(fake_fleet)
        assert real_cluster.racks() == fake_cluster.racks() == {1: "rack-0", 2: "rack-1", 3: "rack-2"}
        assert real.broker_state().name == fake.broker_state().name == "RUNNING"  # type: ignore[union-attr]
        for who in (BROKER, 3):  # each restarted: its leadership moved away and stays away
            fleet.run_service(state.broker(who), "stop")
            wait_until(lambda who=who: who not in real_cluster.registered(), 60, "the lab broker stop")
            if who == BROKER:
                stopped = FakeHost(mirror(lab, []), BROKER)
                stopped.fleet.running.discard(BROKER)
                assert real.broker_state() is None and stopped.broker_state() is None  # the command exits 3
            fleet.run_service(state.broker(who), "start")
            fleet.wait_healthy(state, timeout=60)
        settled(real_cluster)

        def preferred(broker: int) -> list[tuple[str, int]]:
            return sorted((p["topic"], p["partition"]) for p in real_cluster.partitions() if p["replicas"][0] == broker)

        mine, theirs = preferred(BROKER), preferred(3)
        fake_fleet = mirror(lab, [])  # the leadership as the controller left it after the restarts (settled)
        fake = FakeHost(fake_fleet, BROKER)
        elected = real.elect_preferred(mine, 60)
        assert elected == fake.elect_preferred(mine, 60), elected
        assert None in elected.values()  # broker 1 lost some of its partitions to the restarts: elected back
        assert real.elect_preferred(mine, 60) == fake.elect_preferred(mine, 60) == dict.fromkeys(elected, "noop")
        by_zk = real_cluster.elect_preferred(theirs, 60)  # through ZooKeeper's /admin/preferred_replica_election
        by_fake = FakeCluster(fake_fleet).elect_preferred(theirs, 60)
        assert by_zk == {k: None if v in (None, "noop") else v for k, v in by_fake.items()}, (by_zk, by_fake)
    finally:
        real.close()


def test_a_change_its_user_cannot_make_is_refused_before_the_stop(lab: dict[str, Any]) -> None:
    """An SSH user that is not Kafka's, with no ``kafka_user`` to act as: the pre-check names the dir and the user
    while the broker still runs (before, the change failed once the broker was down and ``changing`` journaled)."""
    if not lab["users"]:
        pytest.skip("root can change every file: the least-privilege lab only")
    inv = lab["inv"]
    as_itself = dataclasses.replace(inv, brokers=[dataclasses.replace(b, kafka_user="") for b in inv.brokers])
    host = ssh_hosts(as_itself, ssh_connect(as_itself))(BROKER, [])
    paths = planned_files(lab["state"])
    try:
        with pytest.raises(RepairError, match=rf"cannot run as the SSH user {SSH_USER}: refused: .*: uid \d+ cannot"):
            host.can_change(paths)
        assert host.running()  # nothing stopped, nothing changed
    finally:
        host.close()


def test_a_restore_refused_mid_upload_says_why(lab: dict[str, Any], tmp_path: Path) -> None:
    """A backup larger than the SSH window (4 MiB) sent to a change that refuses before reading it (its tmp_dir not
    the Kafka user's to write): the broker's own refusal comes back, not the closed channel that cut the upload."""
    if not lab["users"]:
        pytest.skip("root can write every tmp_dir: the least-privilege lab only")
    inv = lab["inv"]
    unwritable = dataclasses.replace(
        inv,
        brokers=[dataclasses.replace(b, tmp_dir=str(lab["tmp"])) for b in inv.brokers],  # root's, 0755
    )
    host = ssh_hosts(unwritable, ssh_connect(unwritable))(BROKER, [])
    tarball = tmp_path / "big.tar.gz"
    with tarfile.open(tarball, "w:gz") as tar:
        info = tarfile.TarInfo("x/big")
        info.size = 4 << 20
        tar.addfile(info, io.BytesIO(os.urandom(4 << 20)))
    try:
        with pytest.raises(RepairError, match=r"cannot spool the backup there"):
            host.put_back(tarball, backups.sha256_file(tarball), ["x/big"])
    finally:
        host.close()
