"""ZooKeeper snapshot of Kafka's metadata: real corpus snapshots, a real ZooKeeper 3.8, garbage files, the CLI.

No mocks: the live tests run Debian's ZooKeeper 3.8 (fleet_lab.zk_server) on 127.0.0.1 and write the
znodes with kazoo the way Kafka's KafkaZkClient does (kafka/zk/ZkData.scala, docs/kafka-reference.md §5).
"""

from __future__ import annotations

import gzip
import json
import os
import socket
import struct
import subprocess
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from kazoo.client import KazooClient

from fleet_doctor.zookeeper import snapshot as Z
from fleet_lab.zk_server import ZooKeeperServer, four_letter_word, free_port, pid_alive
from harness.corpus import CORPUS, REPO

CLI = REPO / "bin" / "fleet-doctor"
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

ARYAN = CORPUS / "zk-3.1-single-aryan" / "zookeeper"
THILLAI = CORPUS / "zk-3.9-3broker-thillai" / "zookeeper" / "version-2"  # snapshots nest in version-2/version-2
THILLAI_124 = THILLAI / "version-2" / "snapshot.124"


def by_kind(records: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [r for r in records if r["kind"] == kind]


def topics(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["topic"]: r for r in by_kind(records, "topic")}


def states(records: list[dict[str, Any]], topic: str) -> dict[int, dict[str, Any]]:
    return {r["partition"]: r for r in by_kind(records, "partition_state") if r["topic"] == topic}


def cluster(records: list[dict[str, Any]]) -> dict[str, Any]:
    (c,) = by_kind(records, "cluster")
    return c


def body(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Everything but the zk_snapshot header (which says where and when the tree was read)."""
    assert records[0]["kind"] == "zk_snapshot" and records[-1]["kind"] == "zk_snapshot_end"
    return records[1:]


def check_shape(records: list[dict[str, Any]]) -> None:
    """Order and counts the schema promises; every record survives a JSON round trip."""
    assert records[0]["kind"] == "zk_snapshot" and records[0]["schema_version"] == 1
    assert records[1]["kind"] == "cluster"
    end = records[-1]
    assert end["kind"] == "zk_snapshot_end" and end["complete"] is True
    assert end["topics"] == len(by_kind(records, "topic"))
    assert end["brokers"] == len(by_kind(records, "broker"))
    assert end["partition_states"] == len(by_kind(records, "partition_state"))
    assert end["records_with_errors"] == sum(1 for r in records if r.get("error"))
    assert json.loads(json.dumps(records, allow_nan=False)) == records


# ------------------------------------------------------------------------------------------------
# (a) Real snapshots from the corpus (numbers from MANIFEST.md)
# ------------------------------------------------------------------------------------------------

ALL_CORPUS_SNAPSHOTS = sorted(p for p in CORPUS.glob("*/**/snapshot.*") if Z.zxid_from_name(p.name) is not None)


def test_every_corpus_snapshot_parses_with_a_valid_checksum() -> None:
    assert len(ALL_CORPUS_SNAPSHOTS) == 66
    for snap in ALL_CORPUS_SNAPSHOTS:
        info = Z.SnapshotInfo(file=str(snap))
        n = sum(1 for _ in Z.iter_snapshot(snap, info))
        assert info.complete and info.version == 2 and info.dbid == -1, snap
        assert n == info.znodes >= 4, snap  # at least /, /zookeeper, /zookeeper/quota (+ /zookeeper/config)
        recs = Z.read_snapshot_file(snap)
        check_shape(recs)
        assert recs[-1]["records_with_errors"] == 0, snap
        assert recs[0]["last_zxid"] == Z.zxid_from_name(snap.name)
        # no corpus cluster set a cluster-wide dynamic broker config: /config/brokers/<default> is absent in each
        c = cluster(recs)
        assert c["cluster_default_config"] == {} and c["cluster_default_min_insync_replicas"] is None, snap


def test_a_corpus_snapshot_without_a_cluster_default_is_known_to_have_none() -> None:
    """aryan's newest snapshot has /config/brokers (Kafka creates it) but no <default> under it: ZooKeeper holds no
    cluster-wide min.insync.replicas, which is known (the brokers' static default applies), not unknown."""
    from fleet_doctor.repair.planner import FleetFacts

    tree, _ = Z.read_snapshot_tree(Z.newest_snapshot(ARYAN))
    assert "/config/topics/design" in tree and Z.CLUSTER_DEFAULT_CONFIG not in tree
    info = Z.SnapshotInfo(file="aryan")
    assert "/config/brokers" in {p for p, _ in Z.iter_snapshot(Z.newest_snapshot(ARYAN), info)}
    recs = Z.read_snapshot_file(ARYAN)
    assert FleetFacts({}, recs).cluster_default_min_isr() == (True, None)
    unread = [{**r, "cluster_default_config": None} if r["kind"] == "cluster" else r for r in recs]  # NoAuth live
    assert FleetFacts({}, unread).cluster_default_min_isr() == (False, None)
    old = [{k: v for k, v in r.items() if not k.startswith("cluster_default")} for r in recs]  # staged before
    assert FleetFacts({}, old).cluster_default_min_isr() == (False, None)


@pytest.mark.parametrize(
    ("data", "config", "min_isr", "error"),
    [
        (b'{"version":1,"config":{"min.insync.replicas":"2","retention.ms":"1"}}', "dict", 2, None),
        (b'{"version":1,"config":{"retention.ms":"1"}}', "dict", None, None),
        (b'{"version":1}', {}, None, None),  # sets nothing, as the health gates read it
        (b'{"version":1,"config":{"min.insync.replicas":"two"}}', "dict", None, "'two' is not a positive integer"),
        (b'{"version":1,"config":{"min.insync.replicas":"0"}}', "dict", None, "'0' is not a positive integer"),
        (b'{"version":1,"config":["min.insync.replicas"]}', None, None, "config is not an object"),
        (b'{"version":1,"config":', None, None, "malformed JSON in znode /kafka/config/brokers/<default>"),
    ],
)
def test_the_cluster_wide_default_from_a_snapshot_file(
    tmp_path: Path, data: bytes, config: Any, min_isr: int | None, error: str | None
) -> None:
    """/config/brokers/<default> (ConfigEntityName.Default) under Kafka's chroot: its config and min.insync.replicas
    on the cluster record, read as the health gates read it; a bad value is an error naming the znode (chroot
    included), never a crash, and the plan's facts then say the default is not known."""
    from fleet_doctor.repair.planner import FleetFacts

    nodes = [("/", b"", 0), *_tree_nodes("/kafka", "K")]
    nodes += [("/kafka/config", None, 0), ("/kafka/config/brokers", None, 0)]
    nodes += [("/kafka/config/brokers/<default>", data, 0), ("/kafka/config/brokers/1", data, 0)]
    snap = tmp_path / "snapshot.3"
    snap.write_bytes(jute_snapshot(nodes))
    recs = Z.read_snapshot_file(snap, chroot="/kafka")
    check_shape(recs)
    c = cluster(recs)
    want = json.loads(data)["config"] if config == "dict" else config
    assert c["cluster_default_config"] == want and c["cluster_default_min_insync_replicas"] == min_isr
    if error is None:
        assert c["error"] is None and FleetFacts({}, recs).cluster_default_min_isr() == (True, min_isr)
    else:
        assert error in c["error"] and "/kafka/config/brokers/<default>" in c["error"]
        assert FleetFacts({}, recs).cluster_default_min_isr() == (False, None)


def test_newest_snapshot_is_chosen_by_zxid_not_by_name() -> None:
    assert Z.newest_snapshot(ARYAN).name == "snapshot.32f"  # by name, snapshot.f7 would sort last
    assert Z.newest_snapshot(THILLAI).name == "snapshot.124"
    assert Z.newest_snapshot(CORPUS / "zk-3broker-3zk-vietstock" / "zoo3" / "data").name == "snapshot.12000001c0"
    assert Z.newest_snapshot(CORPUS / "zk-0.10-v1format-3zk-xpx" / "zookeeper3").name == "snapshot.100000001"
    assert Z.zxid_from_name("snapshot.12000001c0") == 0x12000001C0
    assert Z.zxid_from_name("snapshot.1f.gz") == 0x1F
    assert Z.zxid_from_name("snapshot.xyz") is None and Z.zxid_from_name("log.1") is None


def test_aryan_topic_ids_and_the_recreated_design_topic() -> None:
    recs = Z.read_snapshot_file(ARYAN)
    check_shape(recs)
    assert recs[0]["file"].endswith("version-2/snapshot.32f") and recs[0]["last_zxid"] == 0x32F
    assert cluster(recs)["cluster_id"] == "4fi2MkU0Ql2L0cPRncY20Q"
    assert {t: r["topic_id"] for t, r in topics(recs).items()} == {
        "__consumer_offsets": "R20IR_EMTDGiSaE0B5fbyA",
        "design": "JWzPWgOsTDqCV2TLEX2N3g",
        "design1": "m2GaXl4TSyaBZB5R8-wtaA",
        "design2": "fp0I2sNQST-mA8JQMWpPQg",
        "new_topic": "tFxF7Ue2RE2iDqvP0eq8DQ",
        "quickstart-events": "XRnvgspBQPmwTEAXBZaszg",
    }
    design = topics(recs)["design"]
    assert design["znode_version"] == 3 and sorted(design["partitions"]) == ["0", "1", "2"]
    assert topics(recs)["__consumer_offsets"]["config"]["cleanup.policy"] == "compact"
    older = Z.read_snapshot_file(ARYAN / "version-2" / "snapshot.f7")
    assert topics(older)["design"]["topic_id"] == "-rKdLLykRi2fb7UTIXfk3g"  # deleted and recreated since
    assert "design1" not in topics(older)


def test_thillai_assignment_leader_epochs_brokers_and_controller() -> None:
    recs = Z.read_snapshot_file(THILLAI)
    check_shape(recs)
    my = topics(recs)["my-topic"]
    assert my["topic_id"] == "KheAqUg2T_C_ZwEhjgxjzw"
    assert my["partitions"] == {"0": [2, 1, 0], "1": [1, 0, 2], "2": [0, 2, 1]}
    assert my["replication_factor"] == 3 and my["adding_replicas"] == {} and my["removing_replicas"] == {}
    st_ = states(recs, "my-topic")
    assert [st_[p]["leader_epoch"] for p in (0, 1, 2)] == [4, 4, 2]
    assert [st_[p]["leader"] for p in (0, 1, 2)] == [2, 1, 0]  # the preferred (first) replicas lead
    c = cluster(recs)
    assert c["cluster_id"] == "5Zq3CuTXQtybJ1dLd4w1sg" and c["controller_id"] == 0
    assert c["controller"]["version"] == 2 and c["controller"]["kraftControllerEpoch"] == -1
    brokers = by_kind(recs, "broker")
    assert [b["broker_id"] for b in brokers] == [0, 1, 2]
    assert [b["port"] for b in brokers] == [9092, 9093, 9094]
    assert all(b["znode_version"] == 5 and b["ephemeral_owner"] != 0 for b in brokers)
    assert all(b["broker_epoch"] > 0 and isinstance(b["timestamp"], int) for b in brokers)
    assert recs[0]["zk_sessions"] == 3  # one session per registered broker
    assert {"mycart", "rahul", "test-topic"} <= set(topics(recs))
    assert not {"incoming", "sendToEmail", "outgoing"} & set(topics(recs))  # created after the snapshot


def test_coby_topic_without_topic_id_lists_only_partition_0() -> None:
    recs = Z.read_snapshot_file(CORPUS / "zk-2.6-compacted-coby" / "zookeeper")
    assert recs[0]["file"].endswith("snapshot.d3")
    t = topics(recs)["TOPIC_NAME"]
    assert t["topic_id"] is None and t["znode_version"] == 2 and t["partitions"] == {"0": [0]}
    assert list(states(recs, "TOPIC_NAME")) == [0]
    assert all(r["topic_id"] is None for r in topics(recs).values())
    assert cluster(recs)["cluster_id"] == "ZKvfWGPWS2y_WLRfPcgxwA"


def test_kafka_0_10_topic_znodes_are_version_1_without_topic_id() -> None:
    recs = Z.read_snapshot_file(CORPUS / "zk-0.10-v1format-3zk-xpx" / "zookeeper1")
    assert recs[0]["file"].endswith("snapshot.12a")
    assert set(topics(recs)) == {"TEST-TOPIC", "foo", "topic1", "__consumer_offsets"}
    for t in topics(recs).values():
        assert t["znode_version"] == 1 and t["topic_id"] is None and t["adding_replicas"] == {}
    assert cluster(recs)["cluster_id"] == "TWd1kkNyTmq4UxgoVo3Q-w"
    assert cluster(recs)["controller"] == {"version": 1, "brokerid": 0, "timestamp": "1479457129311"}
    (b,) = by_kind(recs, "broker")
    assert b["znode_version"] == 3 and b["features"] is None and b["listener_security_protocol_map"] is None


def test_three_node_ensembles() -> None:
    """zk-0.10: identical snapshots on all three nodes; vietstock: the nodes' newest snapshots differ."""
    xpx = CORPUS / "zk-0.10-v1format-3zk-xpx"
    for name in ("snapshot.0", "snapshot.5", "snapshot.1c", "snapshot.24"):
        bodies = [body(Z.read_snapshot_file(xpx / f"zookeeper{i}" / "version-2" / name)) for i in (1, 2, 3)]
        assert bodies[0] == bodies[1] == bodies[2]
    zk3 = Z.read_snapshot_file(xpx / "zookeeper3")  # snapshot.100000001: a new leader epoch
    assert set(topics(zk3)) == set(topics(Z.read_snapshot_file(xpx / "zookeeper1")))
    assert by_kind(zk3, "broker") == [] and cluster(zk3)["controller"] is None  # sessions gone

    viet = CORPUS / "zk-3broker-3zk-vietstock"
    assert cluster(Z.read_snapshot_file(viet / "zoo1" / "data"))["kafka_tree_found"] is False  # only snapshot.0
    zoo3 = Z.read_snapshot_file(viet / "zoo3" / "data")
    assert {t: r["topic_id"] for t, r in topics(zoo3).items()} == {
        "__consumer_offsets": "UlXvXfULSEW-FBWPAe2dzA",
        "stock-data": "AziPZX4CRYqRpA8xY-jtkg",
    }
    assert cluster(zoo3)["cluster_id"] == "SSvj9MZKTYSm5DtUiDeP0Q"
    epochs = []
    for snap in sorted(
        (viet / "zoo3" / "data" / "version-2").glob("snapshot.*"), key=lambda p: Z.zxid_from_name(p.name)
    ):
        st_ = states(Z.read_snapshot_file(snap), "stock-data")
        epochs += [st_[0]["leader_epoch"]] if st_ else []
    assert epochs == sorted(epochs) and epochs[-1] == 15
    zoo2 = Z.read_snapshot_file(viet / "zoo2" / "data")
    assert zoo2[0]["file"].endswith("snapshot.1000000006")
    assert states(zoo2, "stock-data")[0]["leader_epoch"] == 11 and "__consumer_offsets" not in topics(zoo2)


def test_sagarrao_snapshot_is_an_empty_zk_3_5_tree() -> None:
    snap = CORPUS / "zk-2.5-multinode-sagarrao" / "zookeeperlogsM" / "version-2" / "snapshot.0"
    info = Z.SnapshotInfo(file=str(snap))
    paths = [p for p, _ in Z.iter_snapshot(snap, info)]
    assert paths == ["/", "/zookeeper", "/zookeeper/config", "/zookeeper/quota"]  # 3.5 added /zookeeper/config
    assert info.seal_end_offset == snap.stat().st_size == 424  # no 3.6+ digest after the seal
    recs = Z.read_snapshot_file(snap)
    assert [r["kind"] for r in recs] == ["zk_snapshot", "cluster", "zk_snapshot_end"]
    assert cluster(recs)["kafka_tree_found"] is False and recs[-1]["topics"] == 0


def test_matera_schemas_state_history() -> None:
    vdir = CORPUS / "zk-3.8-3broker-nolog-matera" / "zookeeper" / "data" / "version-2"
    history = []
    for snap in sorted(vdir.glob("snapshot.*"), key=lambda p: Z.zxid_from_name(p.name)):
        st_ = states(Z.read_snapshot_file(snap), "_schemas")
        if st_:
            history.append((st_[0]["leader"], st_[0]["leader_epoch"]))
    assert history == [(1, 2), (-1, 4), (3, 9), (2, 14), (-1, 16), (3, 19), (-1, 21)]
    latest = Z.read_snapshot_file(vdir)
    assert {t: r["topic_id"] for t, r in topics(latest).items()} == {
        "_schemas": "K4XQkgxTQ7CvH4TXGTsiWw",
        "__consumer_offsets": "96G_wDmhTpOPsJGh0S-uPg",
    }
    assert states(latest, "_schemas")[0]["zk_version"] == 27  # partitionEpoch: one bump per state change


@pytest.mark.parametrize(
    ("sample", "cluster_id", "topic_ids"),
    [
        (
            "zk-3.3-cleaner-swap-geraldine/zookeeper-data",
            "zLo43Rr5SS-awyq0u2P8Vw",
            {"HelloTopic": "IEbvf2YUR3eueCiLab0Pkw", "quickstart-events": "NRg3bqlQSzWKk46W7BLzUA"},
        ),
        (
            "zk-2.8plus-producerstate-cheynee/zookeeper",
            "ZmlSuuTkSbGvW-kGeZJaOA",
            {
                "comment": "scFeuJd8TdqTyNL-RU5sxg",
                "publish": "_6hPo1FdSzqYRggkMHlHcw",
                "test": "bsYhg7j0T_KweMDInnlBdA",
            },
        ),
        (
            "zk-3.0-3broker-tuyen/zookeeper",
            "ZAJx9RX0SFuisj92dpmVfg",
            {"my-first-topic": "2P63MtzYTASmr9ZbB4Mf_Q", "my-sec-topic": "joH35UhYSU2YfK2dMFa9TQ"},
        ),
    ],
)
def test_manifest_cluster_and_topic_ids(sample: str, cluster_id: str, topic_ids: dict[str, str]) -> None:
    recs = Z.read_snapshot_file(CORPUS / sample)
    assert cluster(recs)["cluster_id"] == cluster_id
    assert {t: topics(recs)[t]["topic_id"] for t in topic_ids} == topic_ids


# ------------------------------------------------------------------------------------------------
# Hand-built jute snapshots: ZooKeeper 3.4 layout (no /zookeeper/config, no digest), gzip, chroot
# ------------------------------------------------------------------------------------------------


def _ustring(s: str | None) -> bytes:
    if s is None:
        return struct.pack(">i", -1)
    b = s.encode()
    return struct.pack(">i", len(b)) + b


def _buffer(b: bytes | None) -> bytes:
    return struct.pack(">i", -1) if b is None else struct.pack(">i", len(b)) + b


def jute_snapshot(nodes: list[tuple[str, bytes | None, int]], digest: bool = False) -> bytes:
    """A snapshot as FileSnap writes it; nodes are (path, data, ephemeralOwner) in pre-order, root first."""
    out = bytearray(struct.pack(">iiq", 0x5A4B534E, 2, -1))
    owners = sorted({o for _, _, o in nodes if o})
    out += struct.pack(">i", len(owners)) + b"".join(struct.pack(">qi", o, 30000) for o in owners)
    out += struct.pack(">iqiI", 1, 1, 1, 31) + _ustring("world") + _ustring("anyone")  # ACL cache: 1 -> OPEN
    for i, (path, data, owner) in enumerate(nodes, 1):
        out += _ustring("" if path == "/" else path) + _buffer(data) + struct.pack(">q", -1)
        out += struct.pack(">qqqqiiiqq", i, i, 1700000000000, 1700000000000, 0, 0, 0, owner, i)
    out += _ustring("/")
    out += struct.pack(">q", zlib.adler32(bytes(out))) + _ustring("/")
    if digest:
        out += struct.pack(">qiq", len(nodes), 2, 0x1234)
        out += struct.pack(">q", zlib.adler32(bytes(out))) + _ustring("/")
    return bytes(out)


def _tree_nodes(prefix: str, cluster_id: str) -> list[tuple[str, bytes | None, int]]:
    topic = {"version": 3, "partitions": {"0": [1]}, "topic_id": "AAAAAAAAAAAAAAAAAAAAAA"}
    return [
        (prefix or "/", b"", 0),
        (f"{prefix}/brokers", None, 0),
        (f"{prefix}/brokers/ids", None, 0),
        (f"{prefix}/brokers/ids/1", json.dumps({"version": 5, "host": "h", "port": 1}).encode(), 77),
        (f"{prefix}/brokers/topics", None, 0),
        (f"{prefix}/brokers/topics/t", json.dumps(topic).encode(), 0),
        (f"{prefix}/cluster", None, 0),
        (f"{prefix}/cluster/id", json.dumps({"version": "1", "id": cluster_id}).encode(), 0),
    ]


def test_zk_3_4_layout_gzip_and_chroot(tmp_path: Path) -> None:
    nodes = [("/", b"", 0), *_tree_nodes("/east", "EAST"), *_tree_nodes("/west", "WEST")]
    nodes += [("/zookeeper", b"", 0), ("/zookeeper/quota", b"", 0)]
    plain = tmp_path / "snapshot.2a"
    plain.write_bytes(jute_snapshot(nodes))
    east = Z.read_snapshot_file(plain, chroot="/east/")
    assert east[0]["chroot"] == "/east" and cluster(east)["cluster_id"] == "EAST"
    assert [b["ephemeral_owner"] for b in by_kind(east, "broker")] == [77]
    assert cluster(Z.read_snapshot_file(plain, chroot="/west"))["cluster_id"] == "WEST"
    assert cluster(Z.read_snapshot_file(plain))["kafka_tree_found"] is False  # nothing at the root
    with_digest = tmp_path / "d" / "version-2" / "snapshot.2a"
    with_digest.parent.mkdir(parents=True)
    with_digest.write_bytes(jute_snapshot(nodes, digest=True))
    assert body(Z.read_snapshot_file(with_digest.parent.parent, chroot="/east")) == body(east)
    gz = tmp_path / "snapshot.2a.gz"
    gz.write_bytes(gzip.compress(plain.read_bytes()))
    gz_recs = Z.read_snapshot_file(gz, chroot="/east")
    assert gz_recs[0]["compression"] == "gzip" and body(gz_recs) == body(east)
    gz.write_bytes(gzip.compress(plain.read_bytes())[:-30])
    with pytest.raises(ValueError, match=r"snapshot\.2a\.gz"):
        Z.read_snapshot_file(gz, chroot="/east")
    with pytest.raises(ValueError, match="invalid chroot"):
        Z.read_snapshot_file(plain, chroot="east")


def test_malformed_znodes_become_error_records_naming_the_znode(tmp_path: Path) -> None:
    nodes = [
        ("/", b"", 0),
        ("/brokers", None, 0),
        ("/brokers/ids", None, 0),
        ("/brokers/ids/1", b'{"version":5,"host":', 5),
        ("/brokers/ids/2", b'{"version":5,"port":1e999}', 6),
        ("/brokers/ids/x", b"{}", 7),
        ("/brokers/topics", None, 0),
        ("/brokers/topics/t", b'{"version":3,"partitions":{"0":"1,2"},"topic_id":7}', 0),
        ("/brokers/topics/t/partitions", None, 0),
        ("/brokers/topics/t/partitions/0", None, 0),
        ("/brokers/topics/t/partitions/0/state", b"\xff\xfe", 0),
        ("/brokers/topics/u", b"[1, 2]", 0),
        ("/config", None, 0),
        ("/config/topics", None, 0),
        ("/config/topics/u", b'{"version":1,"config":{"min.insync.replicas":"two"}}', 0),
        ("/controller", b"NaN", 9),
        ("/controller_epoch", b"seven", 0),
    ]
    snap = tmp_path / "snapshot.10"
    snap.write_bytes(jute_snapshot(nodes))
    recs = Z.read_snapshot_file(snap)
    check_shape(recs)
    c = cluster(recs)
    assert "malformed JSON in znode /controller" in c["error"] and "/controller_epoch" in c["error"]
    b1, b2, bx = by_kind(recs, "broker")
    assert b1["broker_id"] == 1 and "malformed JSON in znode /brokers/ids/1" in b1["error"]
    assert b2["port"] is None and "out of range" in b2["error"]
    assert b1["broker_epoch"] == 4 and b1["host"] is None
    assert bx["broker_id"] is None and "/brokers/ids/x" in bx["error"]
    t, u = topics(recs)["t"], topics(recs)["u"]
    assert t["partitions"] == {} and t["topic_id"] is None and "/brokers/topics/t" in t["error"]
    assert "expected a JSON object" in u["error"] and "/config/topics/u" in u["error"]
    assert u["min_insync_replicas"] is None and u["config"] == {"min.insync.replicas": "two"}
    assert "/brokers/topics/t/partitions/0/state" in states(recs, "t")[0]["error"]
    assert recs[-1]["records_with_errors"] == 7


# ------------------------------------------------------------------------------------------------
# (c) Garbage and truncation: ValueError naming the file, nothing else
# ------------------------------------------------------------------------------------------------

REAL = THILLAI_124.read_bytes()
REAL_SEAL_END = 25180 - 33  # the 3.6+ digest and its seal (33 bytes) follow the first seal


def test_seal_end_offset_of_a_zk_3_6_snapshot() -> None:
    info = Z.SnapshotInfo(file="x")
    for _ in Z.iter_snapshot(THILLAI_124, info):
        pass
    assert len(REAL) == 25180 and info.seal_end_offset == REAL_SEAL_END


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "truncated: file header"),
        (b"PK\x03\x04" + bytes(40), "not a ZooKeeper snapshot"),
        (b"ZKSN\x00\x00\x00\x03" + bytes(30), "unsupported snapshot version 3"),
        (REAL[:16] + b"\x7f\xff\xff\xff" + REAL[20:], "session count 2147483647 cannot fit"),
        (REAL[:1000], "truncated"),
        (
            REAL[: REAL_SEAL_END - 6] + bytes([REAL[REAL_SEAL_END - 6] ^ 1]) + REAL[REAL_SEAL_END - 5 :],
            "checksum mismatch",
        ),
        (REAL[: REAL_SEAL_END - 1] + b"x", "bad seal"),
        (b"\x82SNAPPY\x00" + bytes(20), "snappy-compressed"),
        (b"\x1f\x8b" + bytes(20), "corrupt compressed stream"),
    ],
)
def test_garbage_is_a_value_error_naming_file_and_offset(tmp_path: Path, data: bytes, message: str) -> None:
    snap = tmp_path / "snapshot.99"
    snap.write_bytes(data)
    with pytest.raises(ValueError, match=message) as e:
        Z.read_snapshot_file(snap)
    assert str(snap) in str(e.value) and "byte offset" in str(e.value)


def _parse_bytes(path: Path, data: bytes) -> list[dict[str, Any]]:
    path.write_bytes(data)
    return Z.read_snapshot_file(path)


@pytest.fixture(scope="module")
def fuzz_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz") / "snapshot.1"


@FUZZ
@given(data=st.one_of(st.binary(max_size=600), st.binary(max_size=600).map(lambda b: REAL[:16] + b)))
@example(data=REAL[:16] + struct.pack(">i", 0) + struct.pack(">i", 1) + bytes(8) + struct.pack(">i", -2))
def test_random_bytes_raise_only_value_error(fuzz_file: Path, data: bytes) -> None:
    try:
        _parse_bytes(fuzz_file, data)
    except ValueError as e:
        assert str(fuzz_file) in str(e)


@FUZZ
@given(cut=st.integers(min_value=0, max_value=len(REAL) - 1))
@example(cut=REAL_SEAL_END - 1)
@example(cut=REAL_SEAL_END)
def test_truncated_real_snapshot_is_a_value_error_until_its_seal(fuzz_file: Path, cut: int) -> None:
    if cut < REAL_SEAL_END:
        with pytest.raises(ValueError, match=r"snapshot\.1"):
            _parse_bytes(fuzz_file, REAL[:cut])
    else:  # only the optional 3.6+ digest is cut: ZooKeeper loads such a file too
        assert body(_parse_bytes(fuzz_file, REAL[:cut])) == body(Z.read_snapshot_file(THILLAI_124))


@FUZZ
@given(pos=st.integers(min_value=0, max_value=REAL_SEAL_END - 1), delta=st.integers(min_value=1, max_value=255))
def test_any_changed_byte_before_the_seal_is_a_value_error(fuzz_file: Path, pos: int, delta: int) -> None:
    mutated = bytearray(REAL)
    mutated[pos] = (mutated[pos] + delta) % 256
    with pytest.raises(ValueError, match=r"snapshot\.1"):  # Adler32 catches every single-byte change
        _parse_bytes(fuzz_file, bytes(mutated))


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8,
)
_KAFKA_PATHS = [
    "/brokers",
    "/cluster/id",
    "/controller",
    "/controller_epoch",
    "/brokers/ids/1",
    "/brokers/topics/t",
    "/brokers/topics/t/partitions/0/state",
    "/config/topics/t",
    "/admin/delete_topics/t",
]
_FIELDS = ["version", "partitions", "topic_id", "adding_replicas", "leader", "isr", "config", "id", "brokerid"]


@FUZZ
@given(
    st.dictionaries(
        st.sampled_from(_KAFKA_PATHS),
        st.one_of(
            st.none(),
            st.binary(max_size=40),
            st.dictionaries(st.sampled_from(_FIELDS), _JSON, max_size=4).map(lambda d: json.dumps(d).encode()),
        ),
    )
)
def test_records_never_raise_whatever_the_znode_data(tree: dict[str, bytes | None]) -> None:
    stat = Z.ZStat(1, 1, 0, 0, 0, 0, 0, 0, 1)
    origin = Z.Origin("file", None, "", "f", 1, 0)
    recs = list(Z.records_from_tree({p: Z.ZNode(d, stat) for p, d in tree.items()}, origin))
    check_shape(recs)


# ------------------------------------------------------------------------------------------------
# (b) A real ZooKeeper 3.8, written to as Kafka writes it
# ------------------------------------------------------------------------------------------------

PERSISTENT_PATHS = [  # KafkaZkClient.makeSurePersistentPathsExist (ZkData.scala PersistentZkPaths)
    "/consumers",
    "/admin/delete_topics",
    "/brokers/ids",
    "/brokers/topics",
    "/brokers/seqid",
    "/cluster",
    "/config/changes",
    "/config/topics",
    "/config/clients",
    "/config/users",
    "/config/brokers",
    "/config/ips",
    "/isr_change_notification",
    "/latest_producer_id_block",
    "/log_dir_event_notification",
]


# Reconnect quickly (and forever) when the test restarts ZooKeeper, as a broker's session would.
RECONNECT = {"max_tries": -1, "delay": 0.05, "max_delay": 0.5}


def _json(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


class KafkaCluster:
    """Writes znodes as Kafka 2.8+/3.x brokers and their controller do; one ZooKeeper session per broker."""

    def __init__(self, connect: str, chroot: str, cluster_id: str) -> None:
        self.connect = connect + chroot
        self.chroot = chroot
        if chroot:
            with _client(connect) as root:
                root.ensure_path(chroot)
        self.admin = KazooClient(hosts=self.connect, connection_retry=RECONNECT)
        self.admin.start(timeout=10)
        for p in PERSISTENT_PATHS:
            self.admin.ensure_path(p)
        self.admin.create("/cluster/id", _json({"version": "1", "id": cluster_id}))  # ClusterIdZNode
        self.brokers: dict[int, KazooClient] = {}

    def register_broker(self, broker_id: int, port: int, rack: str | None = None) -> None:
        """BrokerIdZNode v5 (IBP >= 2.7), an EPHEMERAL znode of the broker's own session."""
        reg = {
            "features": {},
            "listener_security_protocol_map": {"PLAINTEXT": "PLAINTEXT"},
            "endpoints": [f"PLAINTEXT://broker{broker_id}:{port}"],
            "jmx_port": -1,
            "port": port,
            "host": f"broker{broker_id}",
            "version": 5,
            "timestamp": str(1700000000000 + broker_id),
        }
        if rack is not None:
            reg["rack"] = rack
        zk = KazooClient(hosts=self.connect, connection_retry=RECONNECT)
        zk.start(timeout=10)
        zk.create(f"/brokers/ids/{broker_id}", _json(reg), ephemeral=True)
        self.brokers[broker_id] = zk

    def elect_controller(self, broker_id: int) -> None:
        """KafkaZkClient.registerControllerAndIncrementControllerEpoch: one multi-op."""
        zk = self.brokers[broker_id]
        if not zk.exists("/controller_epoch"):
            zk.create("/controller_epoch", b"0")  # KafkaController.InitialControllerEpoch
        data, stat = zk.get("/controller_epoch")
        tx = zk.transaction()
        ctrl = {"version": 2, "brokerid": broker_id, "timestamp": "1700000000100", "kraftControllerEpoch": -1}
        tx.create("/controller", _json(ctrl), ephemeral=True)
        tx.set_data("/controller_epoch", str(int(data) + 1).encode(), version=stat.version)
        assert not any(isinstance(r, Exception) for r in tx.commit())

    def resign_controller(self) -> None:
        self.admin.delete("/controller")

    def create_topic(
        self,
        topic: str,
        partitions: dict[str, list[int]],
        topic_id: str | None,
        config: dict[str, str],
        adding: dict[str, list[int]] | None = None,
        removing: dict[str, list[int]] | None = None,
    ) -> None:
        """AdminZkClient.createTopicWithAssignment: config znode first, then the TopicZNode (v3, or v2 w/o id)."""
        self.admin.create(f"/config/topics/{topic}", _json({"version": 1, "config": config}))
        znode: dict[str, Any] = {
            "partitions": partitions,
            "adding_replicas": adding or {},
            "removing_replicas": removing or {},
            "version": 3 if topic_id else 2,
        }
        if topic_id:
            znode["topic_id"] = topic_id
        self.admin.create(f"/brokers/topics/{topic}", _json(znode))

    def set_state(self, topic: str, p: int, leader: int, epoch: int, isr: list[int], **extra: int) -> None:
        """TopicPartitionStateZNode: created by the controller, then updated with setData (zkVersion += 1)."""
        path = f"/brokers/topics/{topic}/partitions/{p}/state"
        state = {"controller_epoch": 2, "leader": leader, "version": 1, "leader_epoch": epoch, "isr": isr, **extra}
        if self.admin.exists(path):
            self.admin.set(path, _json(state))
        else:
            self.admin.create(path, _json(state), makepath=True)

    def mark_for_deletion(self, topic: str) -> None:
        self.admin.create(f"/admin/delete_topics/{topic}")  # createDeleteTopicPath: no data

    def broker_znode(self, broker_id: int) -> tuple[int, int]:
        """(czxid = broker epoch, ephemeralOwner = the broker's session id)."""
        stat = self.admin.exists(f"/brokers/ids/{broker_id}")
        assert stat is not None and stat.ephemeralOwner == self.brokers[broker_id].client_id[0]
        return stat.czxid, stat.ephemeralOwner

    def close(self) -> None:
        for zk in [*self.brokers.values(), self.admin]:
            zk.stop()
            zk.close()


class _client:
    def __init__(self, hosts: str) -> None:
        self.zk = KazooClient(hosts=hosts)

    def __enter__(self) -> KazooClient:
        self.zk.start(timeout=10)
        return self.zk

    def __exit__(self, *exc: object) -> None:
        self.zk.stop()
        self.zk.close()


ORDERS_ID = "3v3Oi9WDQmqlBlCj4cvlEw"
DOOMED_ID = "7tFr0xZcS2eRk4tT9oQb1w"
PAYMENTS_ID = "Q2xvdWRzQW5kUmFpbl9fXw"
EAST_ID = "ZWFzdGVybi1ldmVudHMtMA"


def _java_processes_under(path: Path) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if str(path).encode() in cmdline:
                found.append(int(entry.name))
    return found


@pytest.fixture(scope="module")
def zk_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServer]:
    base = tmp_path_factory.mktemp("zookeeper")
    server = ZooKeeperServer(base).start()
    pid = server.pid
    assert pid is not None and pid_alive(pid)
    try:
        yield server
    finally:
        server.stop()
        assert not pid_alive(pid), f"ZooKeeper PID {pid} still running"
        assert _java_processes_under(base) == []


@pytest.fixture(scope="module")
def kafka(zk_server: ZooKeeperServer) -> Iterator[dict[str, KafkaCluster]]:
    main = KafkaCluster(zk_server.connect, "", "Xq9yVfGdRmWz3k8LbN2pQA")
    east = KafkaCluster(zk_server.connect, "/kafka-east", "ZWFzdC1jbHVzdGVyLWlkLTA")
    try:
        main.register_broker(1, 9092)
        main.register_broker(2, 9093)
        main.register_broker(3, 9094, rack="rack-c")
        main.elect_controller(1)
        main.resign_controller()
        main.elect_controller(2)  # a failover: controller epoch 2
        main.create_topic(
            "orders", {"0": [1, 2, 3], "1": [2, 3, 1], "2": [3, 1, 2]}, ORDERS_ID, {"min.insync.replicas": "2"}
        )
        main.set_state("orders", 0, 1, 0, [1, 2, 3])
        main.set_state("orders", 1, 2, 0, [2, 3, 1])
        main.set_state("orders", 1, 2, 1, [2, 3])  # ISR shrink: leader epoch and zkVersion move on
        main.set_state("orders", 2, 3, 0, [3, 1, 2], leader_recovery_state=0)  # 3.2+
        main.create_topic(
            "payments", {"0": [1, 2, 3]}, PAYMENTS_ID, {"min.insync.replicas": "2"}, {"0": [3]}, {"0": [2]}
        )
        main.set_state("payments", 0, 1, 0, [1, 2, 3])
        main.create_topic("legacy", {"0": [1]}, None, {})  # rewritten by a pre-2.8 admin client: no topic_id
        main.set_state("legacy", 0, -1, 3, [1])
        main.create_topic("doomed", {"0": [2]}, DOOMED_ID, {"retention.ms": "1000"})
        main.set_state("doomed", 0, 2, 0, [2])
        main.mark_for_deletion("doomed")
        main.admin.create("/brokers/topics/broken", b'{"version":3,"partitions":{"0":[1,')
        east.register_broker(11, 9192)
        east.elect_controller(11)
        east.create_topic("east-events", {"0": [11]}, EAST_ID, {"min.insync.replicas": "1"})
        east.set_state("east-events", 0, 11, 0, [11])
        # kafka-configs --entity-type brokers --entity-default --alter --add-config min.insync.replicas=2
        east.admin.create(
            "/config/brokers/<default>", _json({"version": 1, "config": {"min.insync.replicas": "2"}}), makepath=True
        )
        yield {"main": main, "east": east}
    finally:
        main.close()
        east.close()


def expected_broker(k: KafkaCluster, broker_id: int, port: int, rack: str | None = None) -> dict[str, Any]:
    czxid, owner = k.broker_znode(broker_id)
    return {
        "kind": "broker",
        "broker_id": broker_id,
        "host": f"broker{broker_id}",
        "port": port,
        "endpoints": [f"PLAINTEXT://broker{broker_id}:{port}"],
        "listener_security_protocol_map": {"PLAINTEXT": "PLAINTEXT"},
        "rack": rack,
        "jmx_port": -1,
        "timestamp": 1700000000000 + broker_id,
        "znode_version": 5,
        "broker_epoch": czxid,
        "ephemeral_owner": owner,
        "features": {},
        "error": None,
    }


def _topic(name: str, topic_id: str | None, parts: dict[str, list[int]], **kw: Any) -> dict[str, Any]:
    rec = {
        "kind": "topic",
        "topic": name,
        "topic_id": topic_id,
        "znode_version": 3 if topic_id else 2,
        "partitions": parts,
        "adding_replicas": {},
        "removing_replicas": {},
        "replication_factor": len(next(iter(parts.values()))),
        "min_insync_replicas": None,
        "config": {},
        "marked_for_deletion": False,
        "error": None,
    }
    rec.update(kw)
    return rec


def _state(topic: str, p: int, leader: int, epoch: int, isr: list[int], zk_version: int = 0, lrs: int | None = None):
    return {
        "kind": "partition_state",
        "topic": topic,
        "partition": p,
        "leader": leader,
        "leader_epoch": epoch,
        "isr": isr,
        "controller_epoch": 2,
        "leader_recovery_state": lrs,
        "znode_version": 1,
        "zk_version": zk_version,
        "error": None,
    }


def test_live_snapshot_of_a_kafka_tree(zk_server: ZooKeeperServer, kafka: dict[str, KafkaCluster]) -> None:
    main = kafka["main"]
    recs = Z.read_live(zk_server.connect)
    check_shape(recs)
    head = recs[0]
    assert head["source"] == "live" and head["zookeeper"] == zk_server.connect and head["chroot"] is None
    assert head["file"] is None and head["read_only_server"] is False and head["last_zxid"] > 0
    c = cluster(recs)
    assert c == {
        "kind": "cluster",
        "kafka_tree_found": True,
        "cluster_id": "Xq9yVfGdRmWz3k8LbN2pQA",
        "controller_id": 2,
        "controller_epoch": 2,
        "controller_epoch_zk_version": 2,
        "controller": {"version": 2, "brokerid": 2, "timestamp": "1700000000100", "kraftControllerEpoch": -1},
        "topics_marked_for_deletion": ["doomed"],
        "cluster_default_config": {},  # no cluster-wide dynamic broker config
        "cluster_default_min_insync_replicas": None,
        "error": None,
    }
    assert by_kind(recs, "broker") == [
        expected_broker(main, 1, 9092),
        expected_broker(main, 2, 9093),
        expected_broker(main, 3, 9094, "rack-c"),
    ]
    t = topics(recs)
    assert t["orders"] == _topic(
        "orders",
        ORDERS_ID,
        {"0": [1, 2, 3], "1": [2, 3, 1], "2": [3, 1, 2]},
        min_insync_replicas=2,
        config={"min.insync.replicas": "2"},
    )
    assert t["payments"] == _topic(
        "payments",
        PAYMENTS_ID,
        {"0": [1, 2, 3]},
        adding_replicas={"0": [3]},
        removing_replicas={"0": [2]},
        replication_factor=2,  # replicas being added do not count
        min_insync_replicas=2,
        config={"min.insync.replicas": "2"},
    )
    assert t["legacy"] == _topic("legacy", None, {"0": [1]})
    assert t["doomed"] == _topic(
        "doomed", DOOMED_ID, {"0": [2]}, config={"retention.ms": "1000"}, marked_for_deletion=True
    )
    assert t["broken"]["partitions"] == {} and "malformed JSON in znode /brokers/topics/broken" in t["broken"]["error"]
    assert by_kind(recs, "partition_state") == [
        _state("doomed", 0, 2, 0, [2]),
        _state("legacy", 0, -1, 3, [1]),
        _state("orders", 0, 1, 0, [1, 2, 3]),
        _state("orders", 1, 2, 1, [2, 3], zk_version=1),
        _state("orders", 2, 3, 0, [3, 1, 2], lrs=0),
        _state("payments", 0, 1, 0, [1, 2, 3]),
    ]
    assert [r.get("topic") for r in recs if r["kind"] in ("topic", "partition_state")][:3] == [
        "broken",
        "doomed",
        "doomed",
    ]
    assert recs[-1] == {
        "kind": "zk_snapshot_end",
        "complete": True,
        "topics": 5,
        "brokers": 3,
        "partition_states": 6,
        "records_with_errors": 1,
        "skipped_znodes": [],
    }
    assert "east-events" not in t and "/kafka-east" not in json.dumps(recs)


def test_live_snapshot_under_a_chroot(zk_server: ZooKeeperServer, kafka: dict[str, KafkaCluster]) -> None:
    recs = Z.read_live(zk_server.connect + "/kafka-east")
    check_shape(recs)
    assert recs[0]["chroot"] == "/kafka-east" and recs[0]["zookeeper"] == zk_server.connect
    c = cluster(recs)
    assert (c["cluster_id"], c["controller_id"], c["controller_epoch"]) == ("ZWFzdC1jbHVzdGVyLWlkLTA", 11, 1)
    assert by_kind(recs, "broker") == [expected_broker(kafka["east"], 11, 9192)]
    assert list(topics(recs)) == ["east-events"]
    assert topics(recs)["east-events"]["min_insync_replicas"] == 1
    assert c["cluster_default_config"] == {"min.insync.replicas": "2"} and c["cluster_default_min_insync_replicas"] == 2
    nowhere = Z.read_live(zk_server.connect + "/no-such-chroot")
    assert cluster(nowhere)["kafka_tree_found"] is False and nowhere[-1]["topics"] == 0


class VanishingClient(KazooClient):
    """A real kazoo client; right after it lists /brokers/ids, broker 9's session closes (a broker stops)."""

    victim: KazooClient | None = None

    def get_children(self, path: str, *args: Any, **kwargs: Any) -> Any:
        children = super().get_children(path, *args, **kwargs)
        if path == "/brokers/ids" and self.victim is not None:
            self.victim.stop()  # closeSession: ZooKeeper deletes the ephemeral znode
            self.victim.close()
            self.victim = None
            assert self.exists("/brokers/ids/9") is None
        return children


def test_znode_vanishing_between_listing_and_reading_is_noted(zk_server: ZooKeeperServer) -> None:
    hosts = zk_server.connect + "/vanish"
    with _client(zk_server.connect) as root:
        root.ensure_path("/vanish/brokers/ids")
    broker9 = KazooClient(hosts=hosts)
    broker9.start(timeout=10)
    broker9.create("/brokers/ids/9", _json({"version": 5, "host": "b9", "port": 1}), ephemeral=True)
    broker9.create("/brokers/ids/8", _json({"version": 5, "host": "b8", "port": 1}))
    zk = VanishingClient(hosts=hosts)
    zk.victim = broker9
    zk.start(timeout=10)
    try:
        reader = Z._LiveReader(zk)
        reader.read()
    finally:
        zk.stop()
        zk.close()
    assert reader.skipped == [{"path": "/brokers/ids/9", "reason": "vanished between listing and reading"}]
    recs = list(Z.records_from_tree(reader.tree, Z.Origin("live", "x", "/vanish", None, None, None), reader.skipped))
    assert [b["broker_id"] for b in by_kind(recs, "broker")] == [8]
    assert recs[-1]["skipped_znodes"] == reader.skipped


@pytest.fixture(scope="module")
def restarted_snapshot(zk_server: ZooKeeperServer, kafka: dict[str, KafkaCluster]) -> Path:
    """Restart ZooKeeper: it writes a snapshot of the loaded database, ephemerals of live sessions included."""
    return zk_server.restart()


def test_snapshot_file_of_the_same_server_gives_the_same_records(
    zk_server: ZooKeeperServer, kafka: dict[str, KafkaCluster], restarted_snapshot: Path
) -> None:
    assert restarted_snapshot.parent == zk_server.snapshot_dir
    for chroot in ("", "/kafka-east"):
        live = Z.read_live(zk_server.connect + chroot)
        offline = Z.read_snapshot_file(restarted_snapshot, chroot=chroot)
        check_shape(offline)
        assert offline[0]["source"] == "file" and offline[0]["file"] == str(restarted_snapshot)
        assert offline[0]["last_zxid"] == Z.zxid_from_name(restarted_snapshot.name)
        assert offline[0]["last_zxid"] >= live[0]["last_zxid"]  # nothing written since the restart
        assert body(offline) == body(live)
        assert all(b["ephemeral_owner"] != 0 for b in by_kind(offline, "broker"))
    assert len(by_kind(offline, "broker")) == 1  # /kafka-east's broker 11
    main = Z.read_snapshot_file(zk_server.data_dir)  # a data dir: its newest version-2/snapshot.*
    assert len(by_kind(main, "broker")) == 3 and cluster(main)["controller_id"] == 2


@pytest.mark.live  # starts its own ZooKeeper server
def test_zkserver_lifecycle_leaves_no_process(tmp_path: Path) -> None:
    with ZooKeeperServer(tmp_path / "zk", snap_count=2) as zk:
        pid = zk.pid
        assert pid is not None and pid_alive(pid)
        host, port = zk.connect.split(":")
        assert host == "127.0.0.1" and four_letter_word(host, int(port), "ruok") == "imok"
        assert "Mode: standalone" in four_letter_word(host, int(port), "srvr")
        assert four_letter_word(host, int(port), "dump") != "imok"  # not whitelisted
        assert zk.latest_snapshot() is not None  # ZooKeeper snapshots at every start
        cfg = (tmp_path / "zk" / "conf" / "zoo.cfg").read_text()
        assert "admin.enableServer=false" in cfg and "clientPortAddress=127.0.0.1" in cfg
    assert not pid_alive(pid)
    assert _java_processes_under(tmp_path / "zk") == []
    assert four_letter_word(host, int(port), "ruok") == ""
    assert (tmp_path / "zk" / "zookeeper.log").stat().st_size > 0
    zk.stop()  # idempotent


# ------------------------------------------------------------------------------------------------
# (d) bin/fleet-doctor zk-snapshot
# ------------------------------------------------------------------------------------------------


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(CLI), "zk-snapshot", *args], capture_output=True, text=True, timeout=60)


def _jsonl(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines()]


def test_cli_live(zk_server: ZooKeeperServer, kafka: dict[str, KafkaCluster]) -> None:
    res = _cli("--zookeeper", zk_server.connect + "/kafka-east")
    assert res.returncode == 0, res.stderr
    recs = _jsonl(res.stdout)
    assert body(recs) == body(Z.read_live(zk_server.connect + "/kafka-east"))


def test_cli_from_snapshot_file(tmp_path: Path) -> None:
    res = _cli("--from-snapshot-file", str(THILLAI_124))
    assert res.returncode == 0 and res.stderr == ""
    assert _jsonl(res.stdout)[1:] == Z.read_snapshot_file(THILLAI_124)[1:]
    out = tmp_path / "zk.jsonl"
    res = _cli("--from-snapshot-file", str(ARYAN), "--output", str(out))
    assert res.returncode == 0 and res.stdout == ""
    assert _jsonl(out.read_text())[0]["file"].endswith("snapshot.32f")
    assert os.listdir(tmp_path) == ["zk.jsonl"]


def test_cli_errors_exit_2_with_a_message(tmp_path: Path) -> None:
    garbage = tmp_path / "snapshot.5"
    garbage.write_bytes(REAL[:500])
    res = _cli("--from-snapshot-file", str(garbage))
    assert res.returncode == 2 and res.stdout == "" and str(garbage) in res.stderr and "truncated" in res.stderr
    res = _cli("--from-snapshot-file", str(tmp_path / "missing"))
    assert res.returncode == 2 and "No such file" in res.stderr
    res = _cli("--zookeeper", f"127.0.0.1:{free_port()}", "--timeout", "1")
    assert res.returncode == 2 and "no connection within 1s" in res.stderr and "Traceback" not in res.stderr
    assert _cli().returncode == 2
    assert _cli("--zookeeper", "h:1", "--from-snapshot-file", "x").returncode == 2
    res = _cli("--zookeeper", "h:1", "--chroot", "/k")
    assert res.returncode == 2 and "--chroot is for --from-snapshot-file" in res.stderr
    res = _cli("--from-snapshot-file", str(THILLAI_124), "--output", str(tmp_path / "no" / "dir" / "x"))
    assert res.returncode == 2 and "No such file" in res.stderr


def test_free_port_is_outside_the_ephemeral_range_and_bindable() -> None:
    """Ports for servers that restart (lab brokers, sshd) must not come from the range outgoing
    connections take their local ports from, or a restart can meet "Address already in use"."""
    low, high = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    for _ in range(20):
        port = free_port()
        assert not low <= port <= high
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_free_ports_are_distinct_and_never_one_already_given(monkeypatch: pytest.MonkeyPatch) -> None:
    """A lab's ports are chosen at once: a broker's listener is bound only when the broker starts, after every sshd,
    so a port chosen for it must not be chosen again for a later sshd (nor be one a stopped broker keeps)."""
    from fleet_lab import zk_server

    given = iter([20001, 20001, 20002, 20003, 20002, 20004, 20005])  # what free_port answers, in turn
    monkeypatch.setattr(zk_server, "free_port", lambda host="127.0.0.1": next(given))
    assert zk_server.free_ports(3, taken=[20003]) == [20001, 20002, 20004]
