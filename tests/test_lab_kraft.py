"""The fleet lab in KRaft mode (``fleet-lab up --metadata kraft``) against the real things: sshd per broker, the lab
brokers as combined KRaft nodes, their metadata logs read back by the product's decoder.

Every check reads files, /proc and sockets itself, and the metadata through ``fleet_doctor.cluster_metadata``; nothing
trusts what the lab says it did. The encoder's byte-exactness is checked on the corpus's real KRaft files.
"""

from __future__ import annotations

import filecmp
import json
import os
import shutil
import struct
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fleet_doctor import cluster_metadata as cm
from fleet_doctor import inventory as inv
from fleet_doctor.probe import (
    DEFAULT_SEGMENT_INDEX_BYTES,
    METADATA_TOPIC_UUID,
    SUFFIXED_DIR_RE,
    V2_BATCH_HEADER,
    parse_meta_properties,
    parse_partition_dir_name,
    parse_partition_metadata,
    walk_log,
)
from fleet_lab import kraft
from harness.corpus import CORPUS
from harness.ssh import ssh_client

REPO = Path(__file__).resolve().parents[1]
FLEET_LAB = REPO / "bin" / "fleet-lab"
LAB_TOPICS = {"orders": 6, "payments": 3, "clickstream": 4, "__consumer_offsets": 3, "my-topic": 3}

pytestmark = pytest.mark.timeout(300)


def fleet_lab(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run([str(FLEET_LAB), *args], capture_output=True, text=True, timeout=240)
    if check and r.returncode != 0:
        raise AssertionError(f"fleet-lab {' '.join(args)} exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
    return r


def status(d: Path) -> dict[str, Any]:
    return json.loads(fleet_lab("status", "--dir", str(d), "--json").stdout)


def service(st: dict[str, Any], broker: int, command: str) -> subprocess.CompletedProcess[str]:
    script = Path(st["dir"]) / f"broker-{broker}" / "kafka-service"
    return subprocess.run([str(script), command], capture_output=True, text=True, timeout=120)


def metadata_dir(st: dict[str, Any], broker: int) -> Path:
    b = next(b for b in st["brokers"] if b["id"] == broker)
    return Path(b["log_dirs"][0]) / cm.METADATA_DIR_NAME


def decode(st: dict[str, Any], broker: int) -> list[dict[str, Any]]:
    return cm.read_cluster_metadata(str(metadata_dir(st, broker)))


def kinds(records: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [r for r in records if r["kind"] == kind]


def node_view(st: dict[str, Any], broker: int) -> dict[str, Any]:
    return json.loads((Path(st["dir"]) / f"broker-{broker}" / "kraft-node.json").read_text())


def wait_for(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except (OSError, ValueError, KeyError, cm.ClusterMetadataError) as e:  # a batch being appended
            last = e
        else:
            if last:
                return last
        time.sleep(0.05)
    raise AssertionError(f"{what} within {timeout:.0f} s (last: {last!r})")


def leader_of(st: dict[str, Any]) -> int:
    return status(Path(st["dir"]))["controller"]


def healthy(st: dict[str, Any], down: set[int] = frozenset()) -> bool:  # type: ignore[assignment]
    """The lab's readiness rule, checked here from the leader's metadata log: every running broker registered in its
    current incarnation and unfenced, every partition led by one of them with its running replicas in ISR."""
    records = decode(st, leader_of(st))
    brokers = {r["broker_id"]: r for r in kinds(records, "broker")}
    live = set()
    for b in st["brokers"]:
        if b["id"] in down:
            continue
        reg = brokers.get(b["id"])
        if reg is None or reg["fenced"] or reg["incarnation_id"] != node_view(st, b["id"])["incarnation_id"]:
            return False
        live.add(b["id"])
    for p in kinds(records, "partition_state"):
        if p["leader"] not in live or ({r for r in p["replicas"] if r in live} - set(p["isr"])):
            return False
    return True


def processes_mentioning(needle: str) -> list[int]:
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if needle in cmd and state != "Z":
                out.append(int(pid))
    return out


def listening_hosts(port: int) -> set[str]:
    """Local addresses with a socket listening on ``port`` (/proc/net/tcp and tcp6; v4-mapped v6 as v4)."""
    hosts = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            addr, p = local.split(":")
            if state == "0A" and int(p, 16) == port:
                hosts.add(addr[-8:] if addr.startswith("0000000000000000FFFF0000") else addr)
    return hosts


def segment_files(mdir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(mdir.glob("*.log"))}


@pytest.fixture(scope="module")
def klab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    d = tmp_path_factory.mktemp("kraft") / "lab"
    t0 = time.monotonic()
    fleet_lab("up", "--metadata", "kraft", "--dir", str(d), "--brokers", "3", "--log-dirs-per-broker", "2")
    took = time.monotonic() - t0
    try:
        yield {**status(d), "up_seconds": took}
    finally:
        fleet_lab("down", "--dir", str(d), check=False)


# --------------------------------------------------------------------------------------------
# The encoder: Kafka's own files, re-encoded byte for byte from the decoder's tables
def _reencode(path: Path) -> int:
    data = path.read_bytes()
    pos = n = 0
    while pos + V2_BATCH_HEADER.size <= len(data):
        h = V2_BATCH_HEADER.unpack_from(data, pos)
        batch = data[pos : pos + 12 + h[1]]
        head, records = cm.batch_records(batch)
        if head["control"]:
            (rec,) = records
            _t, name, body = cm.decode_control_record(rec.key, rec.value)
            out = kraft.control_batch(h[0], h[2], name, {k: v for k, v in body.items() if k != "Version"}, h[7])
        else:
            values = []
            for rec in records:
                _k, version, name, body = cm.decode_metadata_record(rec.value)
                values.append(kraft.metadata_record(name, version, body))
            out = kraft.data_batch(h[0], h[2], values, h[7])
        assert out == batch, f"{path}: batch at offset {h[0]} re-encodes differently"
        pos += len(batch)
        n += 1
    assert pos == len(data), f"{path}: {len(data) - pos} trailing bytes"
    return n


@pytest.mark.parametrize(
    "rel",
    [
        "kraft-3.7-ldipoc/kraft-combined-logs/__cluster_metadata-0/00000000000000000000.log",
        "kraft-3.2-3broker-replicated-nurlan/kafka2/__cluster_metadata-0/00000000000000000000.log",
        "kraft-3.5-3broker-greenlemon/kafka1/__cluster_metadata-0/00000000000000028869-0000000189.checkpoint",
        "kraft-3.5-3broker-greenlemon/kafka1/bootstrap.checkpoint",
        "kraft-4.0-multiseg-kscan/kafka-1/__cluster_metadata-0/00000000000004852672-0000000181.checkpoint",
    ],
)
def test_encoder_rewrites_real_kraft_files_byte_for_byte(rel: str) -> None:
    path = CORPUS / rel
    if not path.exists():
        pytest.skip(f"corpus file {rel} not present")
    assert _reencode(path) >= 3


def test_encoder_refuses_what_the_schema_does_not_allow() -> None:
    with pytest.raises(ValueError, match="no such field"):
        kraft.metadata_record("TopicRecord", 0, {"Name": "t", "Bogus": 1})
    with pytest.raises(ValueError, match="has no version"):
        kraft.metadata_record("TopicRecord", 1, {"Name": "t"})
    with pytest.raises(ValueError, match="does not exist in version"):
        kraft.metadata_record("RegisterBrokerRecord", 2, {"BrokerId": 1, "LogDirs": [kraft.random_directory_id()]})
    with pytest.raises(ValueError, match="not nullable"):
        kraft.metadata_record("TopicRecord", 0, {"Name": None})


# --------------------------------------------------------------------------------------------
# up / status / inventory / down
def test_up_is_fast_and_status_names_the_quorum_leader(klab: dict[str, Any]) -> None:
    assert klab["up_seconds"] < 15, f"up took {klab['up_seconds']:.1f} s"
    assert klab["metadata_mode"] == "kraft"
    assert klab["kafka_version"] == "3.7.1"
    assert klab["zookeeper"] is None and klab["zookeeper_running"] is False
    assert klab["controller"] == 1 and klab["quorum_leader_epoch"] == 2  # history in epoch 1, this run's election
    assert klab["controllers"] == [{"id": b["id"], "metadata_log_dir": b["log_dirs"][0]} for b in klab["brokers"]]
    assert all(b["running"] and b["ssh_running"] for b in klab["brokers"])
    for b in klab["brokers"]:  # the listener and sshd, on loopback only
        for port in (b["ssh_port"], int(b["listener"].rsplit(":", 1)[1])):
            assert listening_hosts(port) == {"0100007F"}, (b["id"], port)
    assert not [p for p in processes_mentioning(klab["dir"]) if "zookeeper" in Path(f"/proc/{p}/cmdline").read_text()]
    assert healthy(klab)


def test_inventory_is_a_kraft_inventory_the_product_reads(klab: dict[str, Any]) -> None:
    raw = json.loads(Path(klab["inventory"]).read_text())
    assert raw["metadata_mode"] == "kraft"
    assert "zookeeper" not in raw
    assert raw["controllers"] == [{"id": b["id"], "metadata_log_dir": b["log_dirs"][0]} for b in klab["brokers"]]
    parsed = inv.load(klab["inventory"])
    assert parsed.kraft and [c.id for c in parsed.controllers] == [1, 2, 3]
    assert all(c.combined for c in parsed.controllers)
    conns = json.loads(Path(klab["airflow_connections"]).read_text())
    assert not [c for c in conns if "zk" in c], conns


def test_service_commands_work_over_ssh(klab: dict[str, Any]) -> None:
    parsed = inv.load(klab["inventory"])
    entry = parsed.broker(2)
    client = ssh_client(entry)
    try:
        _, stdout, _ = client.exec_command(entry.service_command("status"), timeout=60)
        out = stdout.read().decode()
        assert stdout.channel.recv_exit_status() == 0, out
        assert "active (running)" in out
    finally:
        client.close()


# --------------------------------------------------------------------------------------------
# The files decode to the lab's state
def test_every_node_decodes_to_the_same_clean_metadata(klab: dict[str, Any]) -> None:
    leader = leader_of(klab)
    wait_for(
        lambda: len({tuple(segment_files(metadata_dir(klab, b["id"])).items()) for b in klab["brokers"]}) == 1,
        10,
        "the followers' metadata logs equal the leader's byte for byte",
    )
    heads = {}
    for b in klab["brokers"]:
        records = decode(klab, b["id"])
        head = records[0]
        heads[b["id"]] = head
        assert head["error"] is None and not kinds(records, "metadata_problem"), records[:1]
        assert not head["log_torn_tail"] and head["log_crc_errors"] == 0 and not head["snapshot_gap"]
        assert head["node_id"] == b["id"] and head["cluster_id"] == klab["cluster_id"]
        assert head["metadata_version_level"] == kraft.METADATA_VERSION_3_7
        assert head["quorum_leader_id"] == leader and head["quorum_leader_epoch"] == klab["quorum_leader_epoch"]
        assert head["quorum_voters"] == [1, 2, 3] and head["quorum_voted_id"] == -1
        assert head["last_leader_change_leader_id"] == leader
        assert head["last_leader_change_epoch"] == klab["quorum_leader_epoch"]
        assert head["snapshot"] is not None and head["log_segments"] >= 2
        mdir = metadata_dir(klab, b["id"])
        assert parse_partition_metadata((mdir / "partition.metadata").read_bytes(), "pm")["topic_id"] == (
            METADATA_TOPIC_UUID
        )
        assert (Path(b["log_dirs"][0]) / kraft.BOOTSTRAP_CHECKPOINT).exists()
    assert len({(h["log_end_offset"], h["snapshot"]) for h in heads.values()}) == 1


def test_metadata_matches_the_brokers_and_their_replica_dirs(klab: dict[str, Any]) -> None:
    records = decode(klab, leader_of(klab))
    dir_ids: dict[str, str] = {}
    for b in klab["brokers"]:
        for d in b["log_dirs"]:
            meta = parse_meta_properties((Path(d) / "meta.properties").read_bytes(), d)
            assert meta["version"] == 1 and meta["broker_id"] == b["id"] and meta["cluster_id"] == klab["cluster_id"]
            dir_ids[d] = meta["directory_id"]
            assert not (Path(d) / ".kafka_cleanshutdown").exists()  # 2.8+ deletes it when it loads the dir
    brokers = {r["broker_id"]: r for r in kinds(records, "broker")}
    for b in klab["brokers"]:
        reg = brokers[b["id"]]
        view = node_view(klab, b["id"])
        assert reg["incarnation_id"] == view["incarnation_id"] and not reg["fenced"]
        assert reg["endpoints"] == [b["listener"]]
        assert reg["log_dirs"] == [dir_ids[d] for d in b["log_dirs"]]
    topics = {r["topic"]: r for r in kinds(records, "topic")}
    assert {t: len(r["partitions"]) for t, r in topics.items()} == LAB_TOPICS
    assert topics["my-topic"]["topic_id"] == "KheAqUg2T_C_ZwEhjgxjzw"  # the corpus partitions keep their ID
    assert topics["orders"]["min_insync_replicas"] == 2
    on_disk: dict[tuple[str, int], dict[int, str]] = {}
    for b in klab["brokers"]:
        for d in b["log_dirs"]:
            for name in os.listdir(d):
                parsed = parse_partition_dir_name(name)
                if not parsed or parsed["dir_state"] != "live" or parsed["topic"] == "__cluster_metadata":
                    continue
                pm = parse_partition_metadata((Path(d) / name / "partition.metadata").read_bytes(), name)
                assert pm["topic_id"] == topics[parsed["topic"]]["topic_id"], (d, name)
                on_disk.setdefault((parsed["topic"], parsed["partition"]), {})[b["id"]] = d
    for p in kinds(records, "partition_state"):
        where = on_disk[(p["topic"], p["partition"])]
        assert sorted(where) == sorted(p["replicas"])
        assert p["directories"] == [dir_ids[where[r]] for r in p["replicas"]]  # JBOD: Directories[i] hosts replica i
        assert set(p["isr"]) == set(p["replicas"]) and p["leader"] in p["replicas"]


def test_snapshot_holds_the_image_the_log_replays(klab: dict[str, Any], tmp_path: Path) -> None:
    """The snapshot and the log say the same: decoding the dir without its snapshots replays every record from 0."""
    mdir = metadata_dir(klab, leader_of(klab))
    with_snapshot = cm.read_cluster_metadata(str(mdir))
    bare = tmp_path / cm.METADATA_DIR_NAME
    shutil.copytree(mdir, bare, ignore=shutil.ignore_patterns("*.checkpoint"))
    replayed = cm.read_cluster_metadata(str(bare))
    assert replayed[0]["snapshot"] is None and not replayed[0]["snapshot_gap"]

    def facts(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [
            {k: v for k, v in r.items() if k != "dir"}
            for r in records
            if r["kind"] in ("broker", "topic", "partition_state")
        ]

    assert facts(with_snapshot) == facts(replayed)


def test_running_node_keeps_its_active_metadata_indexes_preallocated(klab: dict[str, Any]) -> None:
    mdir = metadata_dir(klab, 2)
    active = sorted(mdir.glob("*.index"))[-1]
    assert active.stat().st_size == DEFAULT_SEGMENT_INDEX_BYTES
    lec = (mdir / "leader-epoch-checkpoint").read_text().split("\n")
    assert lec[:2] == ["0", "2"] and lec[2] == "1 0"  # epoch 1 from offset 0, this run's epoch after it


# --------------------------------------------------------------------------------------------
# Brokers going away and coming back
def test_stopped_broker_is_fenced_and_its_partitions_move(klab: dict[str, Any]) -> None:
    before = {(p["topic"], p["partition"]): p for p in kinds(decode(klab, leader_of(klab)), "partition_state")}
    assert service(klab, 3, "stop").returncode == 0
    after_records = wait_for(
        lambda: (
            (r := decode(klab, leader_of(klab)))
            and next(b for b in kinds(r, "broker") if b["broker_id"] == 3)["fenced"]
            and r
        ),
        10,
        "broker 3 fenced",
    )
    reg = next(b for b in kinds(after_records, "broker") if b["broker_id"] == 3)
    assert reg["in_controlled_shutdown"]  # a clean stop is a controlled shutdown first
    for p in kinds(after_records, "partition_state"):
        old = before[(p["topic"], p["partition"])]
        assert p["leader"] != 3
        if len(old["isr"]) > 1:
            assert 3 not in p["isr"]
        if old["leader"] == 3:
            assert p["leader_epoch"] == old["leader_epoch"] + 1 and p["leader"] in old["isr"]
        elif 3 in old["replicas"]:
            assert p["leader_epoch"] == old["leader_epoch"] and p["partition_epoch"] > old["partition_epoch"]
    assert service(klab, 3, "start").returncode == 0
    wait_for(lambda: healthy(klab), 15, "broker 3 back: registered anew, unfenced, in every ISR")
    reg = next(b for b in kinds(decode(klab, leader_of(klab)), "broker") if b["broker_id"] == 3)
    assert reg["incarnation_id"] == node_view(klab, 3)["incarnation_id"] and reg["broker_epoch"] > 0


def test_killed_leader_loses_the_quorum_and_its_session(klab: dict[str, Any]) -> None:
    old_leader, old_epoch = leader_of(klab), status(Path(klab["dir"]))["quorum_leader_epoch"]
    killed_qs = (metadata_dir(klab, old_leader) / "quorum-state").read_bytes()
    assert service(klab, old_leader, "kill").returncode == 0
    new_leader = wait_for(lambda: (lid := leader_of(klab)) not in (None, old_leader) and lid, 10, "a new leader")
    st = status(Path(klab["dir"]))
    assert st["quorum_leader_epoch"] == old_epoch + 1
    for b in klab["brokers"]:
        qs = cm.read_quorum_state(str(metadata_dir(klab, b["id"]) / "quorum-state"))
        if b["id"] == old_leader:
            assert (metadata_dir(klab, b["id"]) / "quorum-state").read_bytes() == killed_qs  # it missed the election
        else:
            assert (qs["leader_id"], qs["leader_epoch"]) == (new_leader, old_epoch + 1)
    # no controlled shutdown: fenced only when its session expires (broker.session.timeout.ms, 3 s in the lab)
    records = wait_for(
        lambda: (
            (r := decode(klab, new_leader))
            and next(b for b in kinds(r, "broker") if b["broker_id"] == old_leader)["fenced"]
            and r
        ),
        10,
        f"broker {old_leader} fenced",
    )
    reg = next(b for b in kinds(records, "broker") if b["broker_id"] == old_leader)
    assert not reg["in_controlled_shutdown"]
    assert not [p for p in kinds(records, "partition_state") if p["leader"] == old_leader]
    untrimmed = sorted(metadata_dir(klab, old_leader).glob("*.index"))[-1]
    assert untrimmed.stat().st_size == DEFAULT_SEGMENT_INDEX_BYTES  # kill -9: left preallocated
    assert service(klab, old_leader, "start").returncode == 0
    wait_for(lambda: healthy(klab), 15, f"broker {old_leader} back")
    wait_for(
        lambda: len({tuple(segment_files(metadata_dir(klab, b["id"])).items()) for b in klab["brokers"]}) == 1,
        10,
        "the metadata logs identical again",
    )


def test_down_stops_every_process_it_started(tmp_path: Path) -> None:
    d = tmp_path / "lab1"
    fleet_lab("up", "--metadata", "kraft", "--dir", str(d), "--brokers", "1")
    st = status(d)
    assert st["controller"] == 1 and healthy(st)
    pids = [st["brokers"][0]["pid"]]
    fleet_lab("down", "--dir", str(d))
    assert not processes_mentioning(str(d))
    for pid in pids:  # gone, or a zombie its parent did not reap (the daemon was detached from the start command)
        stat = Path(f"/proc/{pid}/stat")
        assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"
    mdir = metadata_dir(st, 1)
    records = cm.read_cluster_metadata(str(mdir))
    assert not records[0]["log_torn_tail"]
    epoch = next(b for b in kinds(records, "broker") if b["broker_id"] == 1)["broker_epoch"]
    marker = Path(st["brokers"][0]["log_dirs"][0]) / ".kafka_cleanshutdown"
    assert json.loads(marker.read_text()) == {"version": 0, "brokerEpoch": epoch}  # 3.7's marker: KIP-966
    assert all(p.stat().st_size < DEFAULT_SEGMENT_INDEX_BYTES for p in mdir.glob("*.index"))  # trimmed at the stop


def test_kraft_refuses_versions_it_does_not_write(tmp_path: Path) -> None:
    r = fleet_lab("up", "--metadata", "kraft", "--kafka-version", "3.6.2", "--dir", str(tmp_path / "x"), check=False)
    assert r.returncode == 2 and "3.7" in r.stderr


# --------------------------------------------------------------------------------------------
# Incidents: each does on disk what it says
@pytest.fixture(scope="module")
def ilab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    d = tmp_path_factory.mktemp("kraft-incidents") / "lab"
    fleet_lab("up", "--metadata", "kraft", "--dir", str(d), "--brokers", "3")
    try:
        yield status(d)
    finally:
        fleet_lab("down", "--dir", str(d), check=False)


def replicated_more(st: dict[str, Any], node: int) -> None:
    """Make the controller write (restart a broker that is neither ``node`` nor the leader) and wait until ``node``'s
    log holds those records: proof that its quorum role ran on since."""
    leader = leader_of(st)
    other = next(b["id"] for b in st["brokers"] if b["id"] not in (node, leader))
    before = node_view(st, leader)["end_offset"]
    assert service(st, other, "stop").returncode == 0 and service(st, other, "start").returncode == 0
    wait_for(lambda: healthy(st), 15, f"broker {other} back")
    wait_for(
        lambda: node_view(st, node)["end_offset"] == node_view(st, leader)["end_offset"] > before,
        10,
        f"node {node} replicating the records of broker {other}'s restart",
    )


def inject(st: dict[str, Any], *args: str) -> dict[str, Any]:
    out = fleet_lab("inject", *args, "--dir", st["dir"], "--json").stdout
    return json.loads(out.splitlines()[-1])


def test_kraft_stray_replica_is_renamed_stray_at_the_next_start(ilab: dict[str, Any]) -> None:
    done = inject(ilab, "kraft-stray-replica")
    assert done["rule"] == "stray-replica"
    path = Path(done["paths"][0])
    records = decode(ilab, leader_of(ilab))
    p = next(
        r
        for r in kinds(records, "partition_state")
        if (r["topic"], r["partition"]) == (done["topic"], done["partition"])
    )
    assert done["broker_id"] not in p["replicas"] and path.is_dir()
    pm = parse_partition_metadata((path / "partition.metadata").read_bytes(), str(path))
    assert pm["topic_id"] == p["topic_id"]
    unknown = inject(ilab, "kraft-stray-replica", "--unknown-topic-id")
    upath = Path(unknown["paths"][0])
    upm = parse_partition_metadata((upath / "partition.metadata").read_bytes(), str(upath))
    assert upm["topic_id"] not in {t["topic_id"] for t in kinds(records, "topic")}
    for b in {done["broker_id"], unknown["broker_id"]}:
        assert service(ilab, b, "stop").returncode == 0 and service(ilab, b, "start").returncode == 0
    for gone in (path, upath):
        assert not gone.exists()
        renamed = [n for n in os.listdir(gone.parent) if n.startswith(gone.name + ".") and n.endswith("-stray")]
        assert len(renamed) == 1 and SUFFIXED_DIR_RE.fullmatch(renamed[0]).group("state") == "stray"
    wait_for(lambda: healthy(ilab), 15, "healthy after the restarts")


def test_stray_dir_with_stray_suffix_and_topic_id_mismatch(ilab: dict[str, Any]) -> None:
    done = inject(ilab, "stray-dir", "--suffix", "stray", "--topic", "payments")
    dst = Path(done["paths"][0])
    m = SUFFIXED_DIR_RE.fullmatch(dst.name)
    assert m and m.group("state") == "stray" and m.group("topic") == "payments" and done["rule"] == "stray-dir"
    src = dst.parent / f"payments-{done['partition']}"
    assert not filecmp.dircmp(src, dst).diff_files
    mm = inject(ilab, "topic-id-mismatch", "--topic", "orders", "--broker", "2")
    assert mm["rule"] == "topic-id-mismatch"
    pm = parse_partition_metadata(Path(mm["paths"][0]).read_bytes(), mm["paths"][0])["topic_id"]
    topics = {t["topic"]: t["topic_id"] for t in kinds(decode(ilab, leader_of(ilab)), "topic")}
    assert pm == mm["details"]["topic_id_written"] != topics["orders"] == mm["details"]["topic_id_before"]


def test_quorum_state_divergent_stays_until_a_transition(ilab: dict[str, Any]) -> None:
    done = inject(ilab, "quorum-state-divergent")
    assert done["rule"] == "quorum-state-divergent"
    node = done["broker_id"]
    assert node != leader_of(ilab)
    replicated_more(ilab, node)  # the node runs on, replicating, and does not rewrite it: Kafka never re-reads it
    qs = {b["id"]: cm.read_quorum_state(str(metadata_dir(ilab, b["id"]) / "quorum-state")) for b in ilab["brokers"]}
    assert qs[node]["leader_epoch"] == qs[leader_of(ilab)]["leader_epoch"]
    assert qs[node]["leader_id"] == done["details"]["leader_written"] != qs[leader_of(ilab)]["leader_id"]
    assert decode(ilab, node)[0]["quorum_leader_id"] == done["details"]["leader_written"]


def test_metadata_log_torn_and_crc(ilab: dict[str, Any]) -> None:
    leader = leader_of(ilab)
    for _ in range(3):
        crc = inject(ilab, "metadata-log-torn", "--crc")
        assert crc["rule"] == "metadata-log-torn" and crc["broker_id"] != leader
        head = decode(ilab, crc["broker_id"])[0]
        if head["log_crc_errors"]:
            break
        # the follower copied a snapshot the leader wrote meanwhile (its NoOps keep the log growing) that covers the
        # damaged segment: the decoder starts after the newest snapshot, as Kafka's replay does; damage another
        assert (head["snapshot_end_offset"] or 0) > crc["details"]["batch_offset"], head
    assert head["log_crc_errors"] >= 1 and head["log_first_crc_error_offset"] == crc["details"]["batch_offset"]
    torn = inject(ilab, "metadata-log-torn", "--broker", str(crc["broker_id"]))
    node = torn["broker_id"]
    assert torn["details"]["killed"] and not status(Path(ilab["dir"]))["brokers"][node - 1]["running"]
    seg = Path(torn["paths"][0])
    walked = walk_log(str(seg), torn["segment"])
    assert walked["torn_tail"] and walked["next_offset"] == torn["details"]["torn_after_offset"] + 1
    # the restart recovers (truncates) the log and fetches the rest from the leader again
    assert service(ilab, node, "start").returncode == 0
    wait_for(lambda: healthy(ilab), 15, f"broker {node} back")
    wait_for(
        lambda: not (h := decode(ilab, node)[0])["log_torn_tail"] and h["log_crc_errors"] == 0,
        10,
        "a recovered metadata log",
    )


def test_metadata_snapshot_gap(ilab: dict[str, Any]) -> None:
    # the incident deletes a follower's first metadata segment: the log must have rolled a second one (4 KiB segments,
    # the leader's NoOpRecords fill one in about half a minute), whatever ran in this lab before
    followers = [b["id"] for b in ilab["brokers"] if b["id"] != leader_of(ilab)]
    deadline = time.monotonic() + 180
    while any(len(list(metadata_dir(ilab, b).glob("*.log"))) < 2 for b in followers):
        assert time.monotonic() < deadline, "no follower's metadata log rolled a second segment within 180 s"
        time.sleep(0.5)
    done = inject(ilab, "metadata-snapshot-gap")
    assert done["rule"] == "metadata-snapshot-gap"
    mdir = metadata_dir(ilab, done["broker_id"])
    assert not list(mdir.glob("*.checkpoint"))
    head = decode(ilab, done["broker_id"])[0]
    assert head["snapshot"] is None and head["snapshot_gap"]
    assert head["log_start_offset"] == done["details"]["log_start_offset"] > 0
    deleted = {Path(p).name for p in done["paths"] if p.endswith(".checkpoint")}
    replicated_more(ilab, done["broker_id"])  # a running follower replicates on and fetches no old snapshot back
    assert not deleted & {p.name for p in mdir.glob("*.checkpoint")}


def test_controller_failover_in_kraft_and_zookeeper_incidents_refused(ilab: dict[str, Any]) -> None:
    before = status(Path(ilab["dir"]))
    done = inject(ilab, "controller-failover")
    assert done["details"]["epoch_after"] > done["details"]["epoch_before"] == before["quorum_leader_epoch"]
    assert done["details"]["controller_before"] == before["controller"]
    wait_for(lambda: healthy(ilab), 15, "healthy after the failover")
    r = fleet_lab("inject", "old-client-add-partitions", "--dir", ilab["dir"], check=False)
    assert r.returncode == 2 and "ZooKeeper" in r.stderr


def test_lab_writes_batches_that_follow_kraft_framing(ilab: dict[str, Any]) -> None:
    """Every batch of every node: uncompressed, producer fields -1, data records with null keys and no headers."""
    for b in ilab["brokers"]:
        for seg in sorted(metadata_dir(ilab, b["id"]).glob("*.log")):
            data = seg.read_bytes()
            pos = 0
            while pos + V2_BATCH_HEADER.size <= len(data):
                h = V2_BATCH_HEADER.unpack_from(data, pos)
                if pos + 12 + h[1] > len(data):
                    break  # a torn tail left by a test above on a stopped node
                batch = data[pos : pos + 12 + h[1]]
                assert h[5] & 0x07 == 0 and h[9:12] == (-1, -1, -1)
                head, records = cm.batch_records(batch)
                if not head["control"]:
                    assert all(r.key is None for r in records)
                assert struct.unpack_from(">i", batch, 12)[0] == h[2]
                pos += len(batch)


def test_the_leader_snapshots_every_so_many_bytes_and_followers_take_it(ilab: dict[str, Any]) -> None:
    """metadata.log.max.record.bytes.between.snapshots (8 KiB in the lab): leader restarts write records until the
    active controller writes a new snapshot; the followers hold the same file once their logs reach it, and it holds
    what replaying the log up to it gives."""

    def newest(broker: int) -> tuple[int, int]:
        return max(kraft.snapshot_ids(metadata_dir(ilab, broker)), key=lambda s: (s[1], s[0]), default=(0, 0))

    first = newest(leader_of(ilab))
    for _ in range(12):
        if newest(leader_of(ilab)) != first:
            break
        inject(ilab, "controller-failover")
        wait_for(lambda: healthy(ilab), 15, "healthy after the failover")
    leader = leader_of(ilab)
    end, epoch = newest(leader)
    assert (end, epoch) != first, "no new snapshot after 12 leader restarts"
    name = kraft.snapshot_file_name(end, epoch)
    data = (metadata_dir(ilab, leader) / name).read_bytes()
    for b in ilab["brokers"]:
        if b["id"] != leader:
            wait_for(lambda b=b: (metadata_dir(ilab, b["id"]) / name).exists(), 10, f"node {b['id']} takes {name}")
            assert (metadata_dir(ilab, b["id"]) / name).read_bytes() == data
    records = cm.read_cluster_metadata(str(metadata_dir(ilab, leader)))
    assert records[0]["snapshot"] == name and not kinds(records, "metadata_problem")


# --------------------------------------------------------------------------------------------
# MetadataLog on its own: appends, rolls, truncation, recovery at open
def _noop_batches(log: kraft.MetadataLog, n: int, epoch: int) -> None:
    for _ in range(n):
        rec = kraft.MetadataRecord("NoOpRecord", 0, {})
        log.append(kraft.data_batch(log.next_offset, epoch, [rec.encode()] * 20, kraft.now_ms()))


def _check_index_files(mdir: Path) -> None:
    """Every index entry points inside its segment at a batch start, entries ascend; zeros only after them."""
    for seg in sorted(mdir.glob("*.log")):
        base = int(seg.stem)
        starts = {pos for pos, *_ in kraft.log_batches(seg, base)}
        raw = (mdir / f"{seg.stem}.index").read_bytes()
        entries = [struct.unpack_from(">ii", raw, i) for i in range(0, len(raw) - len(raw) % 8, 8)]
        while entries and entries[-1] == (0, 0) and len(entries) > 1:
            entries.pop()
        if entries == [(0, 0)]:
            entries = []
        assert all(pos in starts for _rel, pos in entries), (seg, entries)
        assert [rel for rel, _ in entries] == sorted(rel for rel, _ in entries)


@pytest.mark.parametrize("running", [False, True])
def test_metadata_log_appends_rolls_and_truncates(tmp_path: Path, running: bool) -> None:
    from fleet_lab.kafka_files import KafkaFeatures

    f = KafkaFeatures.of("3.7.1")
    mdir = tmp_path / cm.METADATA_DIR_NAME
    log = kraft.MetadataLog(mdir, f, 4096, running=running).create()
    _noop_batches(log, 30, 1)
    _noop_batches(log, 30, 2)
    assert len(log.bases) >= 3 and log.next_offset == 60 * 20
    assert (mdir / "leader-epoch-checkpoint").read_text() == "0\n2\n1 0\n2 600\n"
    _check_index_files(mdir)
    log.truncate_to(500)  # inside epoch 1, at a batch boundary
    assert log.next_offset == 500 and log.last is not None and log.last.last_offset == 499
    assert (mdir / "leader-epoch-checkpoint").read_text() == "0\n1\n1 0\n"
    assert walk_log(str(sorted(mdir.glob("*.log"))[-1]), log.bases[-1])["next_offset"] == 500
    _check_index_files(mdir)
    _noop_batches(log, 5, 3)
    assert log.next_offset == 600 and log.epochs[-1] == (3, 500)
    log.close()
    # a torn tail: recovered at open (every segment, from offset 0), as KafkaMetadataLog loads it
    last_seg = sorted(mdir.glob("*.log"))[-1]
    with open(last_seg, "ab") as fh:
        fh.write(last_seg.read_bytes()[:30])
    reopened = kraft.MetadataLog(mdir, f, 4096, running=running).open()
    assert reopened.next_offset == 600 and any("truncated 30 bytes" in r for r in reopened.recovery)
    # a snapshot beyond the log end truncates it fully
    kraft.write_snapshot(mdir, 700, 3, kraft.encode_snapshot([], 3, 0))
    again = kraft.MetadataLog(mdir, f, 4096, running=running).open()
    assert again.next_offset == 700 and again.bases == [700]
    assert not [p for p in mdir.glob("*.log") if p.name != "00000000000000000700.log"]


def test_a_reader_passes_over_no_op_batches_and_nothing_else(tmp_path: Path) -> None:
    """What a lab broker skips re-reading its image for (``after_no_ops``): the active controller's NoOpRecord
    batches after the batch it read last; a record of any other kind, a control batch, a truncation that took its
    last batch away (even with the log grown back over the same offsets), or a log that does not yet reach the end
    it was told, each make it read the log again."""
    from fleet_lab.kafka_files import KafkaFeatures
    from fleet_lab.quorum import QuorumNode

    mdir = tmp_path / cm.METADATA_DIR_NAME
    log = kraft.MetadataLog(mdir, KafkaFeatures.of("3.7.1"), 4096).create()
    fence = kraft.MetadataRecord("FenceBrokerRecord", 0, {"Id": 1, "Epoch": 5})
    log.append(kraft.data_batch(0, 1, [fence.encode()], kraft.now_ms()))
    read_to = log.last
    assert read_to is not None and read_to.last_offset == 0
    assert [r.header for r in kraft.read_batch_refs(mdir)] == [read_to]  # the log's own header is the file's
    _noop_batches(log, 40, 1)  # rolls segments (4 KiB): the walk crosses them
    assert len(log.bases) >= 2
    passed = kraft.after_no_ops(mdir, read_to, log.next_offset)
    assert passed is not None and passed == log.last
    assert kraft.after_no_ops(mdir, read_to, log.next_offset + 1) is None  # the log does not reach that far yet
    assert kraft.after_no_ops(mdir, passed, log.next_offset) == passed  # nothing new: where it stood
    end = log.next_offset
    log.append(kraft.data_batch(end, 1, [fence.encode()], kraft.now_ms()))
    assert kraft.after_no_ops(mdir, passed, log.next_offset) is None  # a FenceBrokerRecord changes the image
    at = log.last
    no_op = kraft.MetadataRecord("NoOpRecord", 0, {}).encode()
    log.append(kraft.data_batch(log.next_offset, 1, [no_op, fence.encode()], kraft.now_ms()))
    assert kraft.after_no_ops(mdir, at, log.next_offset) is None  # a NoOpRecord beside another record
    at = log.last
    log.append(kraft.control_batch(log.next_offset, 2, "LEADER_CHANGE", kraft.leader_change(1, [1], [1]), 0))
    assert kraft.after_no_ops(mdir, at, log.next_offset) is None  # a control batch: read again
    # a truncation, and the log grown back over the same offsets in a new epoch: batches of the same offsets and
    # sizes as those read (one NoOpRecord each), but not them
    read = [r.header for r in kraft.read_batch_refs(mdir, end)]
    log.truncate_to(end)
    for h in read:
        log.append(kraft.data_batch(h.base_offset, 3, [no_op] * (h.last_offset - h.base_offset + 1), kraft.now_ms()))
    again = [r.header for r in kraft.read_batch_refs(mdir, end)]
    assert [(h.base_offset, h.last_offset) for h in again] == [(h.base_offset, h.last_offset) for h in read]
    for h in read:
        assert kraft.after_no_ops(mdir, h, log.next_offset) is None
    assert kraft.after_no_ops(mdir, again[0], log.next_offset) == log.last
    assert kraft.after_no_ops(mdir, passed, log.next_offset) == log.last
    # what the broker asks its quorum node: the same, at the log's end, under the node's lock
    node = QuorumNode(
        {
            "node_id": 1,
            "voters": [{"id": 1, "metadata_log_dir": str(tmp_path)}],
            "directory_ids": {},
            "session_timeout_ms": 9000,
            "snapshot_bytes": 1 << 20,
        },
        KafkaFeatures.of("3.7.1"),
        tmp_path / "run",
        0,
    )
    assert node.mdir == mdir and node.passed_no_ops(passed) is None  # no log open yet
    assert node.log_end() == (0, None)
    node.log = log
    assert node.log_end() == (log.next_offset, log.last)
    assert node.passed_no_ops(passed) == (log.next_offset, log.last)
    assert node.passed_no_ops(read[-1]) is None
    log.append(kraft.data_batch(log.next_offset, 3, [fence.encode()], kraft.now_ms()))
    assert node.passed_no_ops(passed) is None


def test_a_node_with_an_uncommitted_tail_truncates_it_to_the_new_leaders_log(ilab: dict[str, Any]) -> None:
    """An old leader restarting with a batch nobody fetched (appended in its epoch just before it died) finds that
    the new leader's log holds another batch at that offset: it truncates to the last batch both hold and fetches."""
    from fleet_lab.kafka_files import KafkaFeatures

    old = leader_of(ilab)
    epoch = status(Path(ilab["dir"]))["quorum_leader_epoch"]
    assert service(ilab, old, "stop").returncode == 0
    wait_for(lambda: leader_of(ilab) not in (None, old), 10, "a new leader")
    mdir = metadata_dir(ilab, old)
    log = kraft.MetadataLog(mdir, KafkaFeatures.of("3.7.1"), 4096).open()
    offset = log.next_offset
    log.append(kraft.data_batch(offset, epoch, [kraft.MetadataRecord("NoOpRecord", 0, {}).encode()], kraft.now_ms()))
    log.close()
    assert service(ilab, old, "start").returncode == 0
    wait_for(lambda: healthy(ilab), 15, f"broker {old} back")

    def same_batches() -> bool:  # from the offset both logs hold on (incidents above cut some nodes' first segments)
        leader = metadata_dir(ilab, leader_of(ilab))
        start = max(kraft.read_batch_refs(d)[0].header.base_offset for d in (mdir, leader))
        mine, theirs = ([r.header for r in kraft.read_batch_refs(d, start)] for d in (mdir, leader))
        return mine == theirs

    wait_for(same_batches, 10, f"node {old}'s metadata log equal to the leader's again")
    holding = next(r.header for r in kraft.read_batch_refs(mdir, offset))
    assert holding.base_offset == offset and holding.epoch > epoch  # the new leader's batch replaced ours
    server_log = (Path(ilab["dir"]) / f"broker-{old}" / "server.log").read_text()
    assert f"Truncating the metadata log to offset {offset}" in server_log


def test_a_node_restarting_with_a_higher_epoch_moves_the_quorum_past_it(ilab: dict[str, Any]) -> None:
    """Raft: no voter goes back in epochs. A node whose quorum-state holds an epoch above the leader's (restored from
    elsewhere) makes the quorum elect again above it, and follows."""
    leader = leader_of(ilab)
    node = next(b["id"] for b in ilab["brokers"] if b["id"] != leader)
    assert service(ilab, node, "stop").returncode == 0
    high = status(Path(ilab["dir"]))["quorum_leader_epoch"] + 50
    kraft.write_quorum_state(metadata_dir(ilab, node), -1, high, -1, [b["id"] for b in ilab["brokers"]])
    assert service(ilab, node, "start").returncode == 0
    wait_for(lambda: (status(Path(ilab["dir"]))["quorum_leader_epoch"] or 0) > high, 10, f"an epoch above {high}")
    wait_for(lambda: healthy(ilab), 15, "healthy")
    epoch = status(Path(ilab["dir"]))["quorum_leader_epoch"]
    qs = cm.read_quorum_state(str(metadata_dir(ilab, node) / "quorum-state"))
    assert qs["leader_epoch"] == epoch and qs["leader_id"] == leader_of(ilab)
