"""The KRaft metadata decoder (fleet_doctor.cluster_metadata): real Kafka 3.2 / 3.5 / 3.7 / 4.0 metadata dirs from
the corpus (checked against the partition.metadata files Kafka wrote independently, and against MANIFEST.md), the
replay rules on logs written by the lab's encoder (fleet_lab.kraft, through harness/kraft_encode.py), hostile input,
the CLI and the bundle."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fleet_doctor import cluster_metadata as cm
from fleet_doctor import probe
from harness import kraft_encode as ke
from harness.corpus import CORPUS, REPO

CLI = REPO / "bin" / "fleet-doctor"
NURLAN = "kraft-3.2-3broker-replicated-nurlan"
GREENLEMON = "kraft-3.5-3broker-greenlemon"
LDIPOC = "kraft-3.7-ldipoc"
KSCAN = "kraft-4.0-multiseg-kscan"
# each real KRaft cluster: its log dirs (greenlemon's kafka/ is another, earlier deployment: MANIFEST.md)
CLUSTERS = {
    NURLAN: ["kafka1", "kafka2", "kafka3"],
    GREENLEMON: ["kafka1", "kafka2", "kafka3"],
    GREENLEMON + "/kafka": ["kafka"],
    LDIPOC: ["kraft-combined-logs"],
    KSCAN: ["kafka-1"],
}
ALL_NODES = [
    (sample.split("/")[0], node) for sample, nodes in CLUSTERS.items() for node in nodes
]  # (sample, log dir) pairs


ORDER = ["cluster_metadata", "cluster", "broker", "topic", "broker_config", "metadata_problem", "cluster_metadata_end"]


def decode(path: Path | str) -> list[dict[str, Any]]:
    """The decoder's records, checked for the order docs/cluster-metadata-schema.md gives, and for JSON."""
    records = cm.read_cluster_metadata(str(path))
    rank = [ORDER.index("topic" if r["kind"] == "partition_state" else r["kind"]) for r in records]
    assert rank == sorted(rank) and rank[:2] == [0, 1] and rank[-1] == 6 and rank.count(6) == 1
    assert [json.loads(line) for line in cm.format_records(records).splitlines()] == records
    return records


def kinds(records: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [r for r in records if r["kind"] == kind]


def topics(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["topic"]: r for r in kinds(records, "topic")}


def problems(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return kinds(records, "metadata_problem")


@pytest.fixture(scope="module")
def real(corpus: Path) -> dict[tuple[str, str], list[dict[str, Any]]]:
    return {(sample, node): decode(corpus / sample / node) for sample, node in ALL_NODES}


# --------------------------------------------------------------------------------------------
# Real metadata dirs
@pytest.mark.parametrize(("sample", "node"), ALL_NODES)
def test_real_sample_decodes_completely_without_problems(real: dict, sample: str, node: str) -> None:
    records = real[(sample, node)]
    head, end = records[0], records[-1]
    assert head["kind"] == "cluster_metadata" and head["source"] == "kraft" and head["schema_version"] == 1
    assert head["dir"] == str(CORPUS / sample / node / "__cluster_metadata-0")
    assert head["error"] is None
    assert problems(records) == []
    assert not head["log_torn_tail"] and head["log_crc_errors"] == 0 and not head["snapshot_gap"]
    assert not head["open_transaction"]
    assert end == {
        "kind": "cluster_metadata_end",
        "complete": True,
        "topics": len(kinds(records, "topic")),
        "brokers": len(kinds(records, "broker")),
        "partition_states": len(kinds(records, "partition_state")),
        "broker_configs": len(kinds(records, "broker_config")),
        "records_with_errors": 0,
        "problems": 0,
        "problems_suppressed": 0,
    }
    # the order of docs/cluster-metadata-schema.md
    order = [r["kind"] for r in records]
    assert order[1] == "cluster"
    names = [r["topic"] for r in kinds(records, "topic")]
    assert names == sorted(names)
    assert [r["broker_id"] for r in kinds(records, "broker")] == sorted(
        r["broker_id"] for r in kinds(records, "broker")
    )
    for t in kinds(records, "topic"):
        i = records.index(t)
        states = records[i + 1 : i + 1 + len(t["partitions"])]
        assert [s["partition"] for s in states] == sorted(int(p) for p in t["partitions"])
        assert all(s["kind"] == "partition_state" and s["topic"] == t["topic"] for s in states)
        for s in states:
            assert s["replicas"] == t["partitions"][str(s["partition"])]
            assert s["zk_version"] == s["partition_epoch"] >= 0
            assert s["leader_epoch"] >= 0
            assert set(s["isr"]) <= set(s["replicas"])
            assert len(s["directories"]) == len(s["replicas"])


@pytest.mark.parametrize("cluster", sorted(CLUSTERS))
def test_every_topic_id_equals_partition_metadata_on_every_node(real: dict, cluster: str) -> None:
    """The metadata of each node of a cluster against the partition.metadata Kafka wrote in every partition dir of
    every node of that cluster: same topic ID, the partition exists, and the node is one of its replicas."""
    sample = cluster.split("/")[0]
    checked = 0
    for meta_node in CLUSTERS[cluster]:
        records = real[(sample, meta_node)]
        by_name = topics(records)
        for node in CLUSTERS[cluster]:
            logdir = CORPUS / sample / node
            node_id = real[(sample, node)][0]["node_id"]
            for d in sorted(os.listdir(logdir)):
                info = probe.parse_partition_dir_name(d)
                if info is None or d == cm.METADATA_DIR_NAME:
                    continue
                pm = logdir / d / "partition.metadata"
                topic_id = probe.parse_partition_metadata(pm.read_bytes(), str(pm))["topic_id"]
                t = by_name[info["topic"]]
                assert t["topic_id"] == topic_id, (meta_node, node, d)
                replicas = t["partitions"][str(info["partition"])]
                assert node_id in replicas, (meta_node, node, d, replicas)
                checked += 1
    assert checked > 0


def test_greenlemon_kafka_dir_is_another_deployment_with_other_topic_ids(real: dict) -> None:
    """MANIFEST.md: the same cluster.id, node.id 1, different topic IDs (the genuine disagreement)."""
    old = real[(GREENLEMON, "kafka")]
    new = real[(GREENLEMON, "kafka1")]
    assert old[0]["cluster_id"] == new[0]["cluster_id"] == "EpwKlK0lR6qKZW0cGwZz8w"
    assert old[0]["node_id"] == new[0]["node_id"] == 1
    ids = {name: (topics(old)[name]["topic_id"], topics(new)[name]["topic_id"]) for name in topics(old)}
    assert ids == {
        "__consumer_offsets": ("8kxbPVz3SZmX1PRku-RYPQ", "crCKTd0wTl6bQClKBtax4Q"),
        "delivery-create-request": ("TH8lAlj8SDOOGacFAYFcKA", "cp-NpW6vRj6q1bIA5SUr8g"),
        "payment-create-request": ("v8JUoU12Rauv3D90NxhOKA", "waOfnfkeQj2nhh7-Sgl6Cw"),
    }
    # "Its __cluster_metadata has 6,013 records": offsets 0..6012, one single-node quorum
    assert old[0]["log_end_offset"] == 6013 and old[0]["snapshot"] is None
    assert old[0]["quorum_voters"] == [1]
    # and the kafka/ dir's partition dirs disagree with kafka1..3's metadata
    pm = CORPUS / GREENLEMON / "kafka" / "__consumer_offsets-0" / "partition.metadata"
    assert (
        probe.parse_partition_metadata(pm.read_bytes(), str(pm))["topic_id"]
        != topics(new)["__consumer_offsets"]["topic_id"]
    )


@pytest.mark.parametrize(
    ("sample", "node", "node_id", "leader", "epoch", "voted", "voters"),
    [
        (NURLAN, "kafka1", 1, 1, 3, -1, [1, 2, 3]),
        (NURLAN, "kafka2", 2, 1, 3, -1, [1, 2, 3]),
        (NURLAN, "kafka3", 3, 1, 3, -1, [1, 2, 3]),
        # MANIFEST.md: quorum-state diverges, kafka1 and kafka3 say leader 1 epoch 190, kafka2 leader 3 epoch 189
        (GREENLEMON, "kafka1", 1, 1, 190, -1, [1, 2, 3]),
        (GREENLEMON, "kafka2", 2, 3, 189, -1, [1, 2, 3]),
        (GREENLEMON, "kafka3", 3, 1, 190, -1, [1, 2, 3]),
        (GREENLEMON, "kafka", 1, 1, 4, -1, [1]),
        (LDIPOC, "kraft-combined-logs", 1, 1, 1, -1, [1]),
        (KSCAN, "kafka-1", 1, 1, 193, -1, [1]),
    ],
)
def test_node_ids_and_quorum_state(
    real: dict, sample: str, node: str, node_id: int, leader: int, epoch: int, voted: int, voters: list[int]
) -> None:
    records = real[(sample, node)]
    head = records[0]
    assert head["node_id"] == node_id
    assert (head["quorum_leader_id"], head["quorum_leader_epoch"], head["quorum_voted_id"]) == (leader, epoch, voted)
    assert head["quorum_voters"] == voters and head["quorum_data_version"] == 0
    cluster = kinds(records, "cluster")[0]
    assert (cluster["controller_id"], cluster["controller_epoch"]) == (leader, epoch)
    assert cluster["kafka_tree_found"] is True and cluster["topics_marked_for_deletion"] == []


def test_cluster_ids(real: dict) -> None:
    assert {real[k][0]["cluster_id"] for k in real if k[0] == NURLAN} == {"EP6hyiddQNW5FPrAvR9kWw"}
    assert real[(LDIPOC, "kraft-combined-logs")][0]["cluster_id"] == "q1w2e3r4t5y6u7i8o9p0"  # hand-set, not a uuid
    assert all(kinds(r, "cluster")[0]["cluster_id"] == r[0]["cluster_id"] for r in real.values())


def test_greenlemon_logs_snapshots_and_last_leader_change(real: dict) -> None:
    """MANIFEST.md: kafka1's LEO is 30,638, kafka2/kafka3's 30,637; snapshots 28869-189 (kafka1, kafka2) and
    28870-189 (kafka3). kafka1 alone holds the epoch-190 LEADER_CHANGE batch."""
    heads = {n: real[(GREENLEMON, n)][0] for n in ("kafka1", "kafka2", "kafka3")}
    assert {n: h["log_end_offset"] for n, h in heads.items()} == {"kafka1": 30638, "kafka2": 30637, "kafka3": 30637}
    assert {n: h["snapshot"] for n, h in heads.items()} == {
        "kafka1": "00000000000000028869-0000000189.checkpoint",
        "kafka2": "00000000000000028869-0000000189.checkpoint",
        "kafka3": "00000000000000028870-0000000189.checkpoint",
    }
    assert heads["kafka3"]["snapshot_end_offset"] == 28870 and heads["kafka3"]["snapshot_epoch"] == 189
    assert {n: (h["last_leader_change_leader_id"], h["last_leader_change_epoch"]) for n, h in heads.items()} == {
        "kafka1": (1, 190),
        "kafka2": (3, 189),
        "kafka3": (3, 189),
    }
    assert {n: h["log_max_epoch"] for n, h in heads.items()} == {"kafka1": 190, "kafka2": 189, "kafka3": 189}
    assert all(h["log_start_offset"] == 0 and h["log_segments"] == 1 for h in heads.values())
    assert heads["kafka1"]["last_applied_offset"] == 30637
    assert all(h["metadata_version_level"] == 11 for h in heads.values())  # 3.5-IV2
    # __consumer_offsets-14/26/36 are RF3 with identical replicas on the three nodes
    for n in ("kafka1", "kafka2", "kafka3"):
        parts = topics(real[(GREENLEMON, n)])["__consumer_offsets"]["partitions"]
        assert len(parts) == 50
        assert all(sorted(parts[p]) == [1, 2, 3] for p in ("14", "26", "36"))


def test_the_quorums_controller_is_the_same_whichever_nodes_metadata_is_used(real: dict) -> None:
    """Each node's view (``node_controller``: its quorum-state's leader, else its last LEADER_CHANGE's) and the
    cluster's (``quorum_controller``: a majority of the voters at the newest epoch). greenlemon's real quorum-states
    disagree (kafka2 still at epoch 189 under leader 3): the cluster's controller is 1 at 190 from any two of three
    nodes that agree, and none from two that disagree. Which node's log is the freshest does not enter."""
    heads = [real[(GREENLEMON, n)][0] for n in ("kafka1", "kafka2", "kafka3")]
    assert [cm.node_controller(h) for h in heads] == [(1, 190), (3, 189), (1, 190)]
    assert [
        (r["controller_id"], r["controller_epoch"])
        for n in ("kafka1", "kafka2", "kafka3")
        for r in kinds(real[(GREENLEMON, n)], "cluster")
    ] == [(1, 190), (3, 189), (1, 190)]  # the decoder's cluster record: that node's view
    for order in ([0, 1, 2], [2, 1, 0], [1, 0, 2]):
        assert cm.quorum_controller([heads[k] for k in order], 3) == (1, 190)
    assert cm.quorum_controller(heads[:2], 3) == (None, 190)  # one view each at the newest epoch of two read
    assert cm.quorum_controller(heads[1:2], 1) == (3, 189)  # a single voter: its own view
    # the demo's quorum-state-divergent: node 3's file names leader 2 at the leader's epoch (its log follows 1)
    lab = [{"quorum_leader_id": 1, "quorum_leader_epoch": 2}] * 2 + [{"quorum_leader_id": 2, "quorum_leader_epoch": 2}]
    assert cm.node_controller(lab[2]) == (2, 2) and cm.quorum_controller(lab[::-1], 3) == (1, 2)
    # mid-election (-1): the node's last LEADER_CHANGE stands for its view; none known at all: no view
    electing = {"quorum_leader_id": -1, "quorum_leader_epoch": 8, "last_leader_change_leader_id": 2}
    assert cm.node_controller({**electing, "last_leader_change_epoch": 7}) == (2, 7)
    assert cm.node_controller({"quorum_leader_id": -1, "quorum_leader_epoch": 8}) == (None, None)
    assert cm.majority_leader([(None, 8), (2, 7), (2, 7)], 3) == (None, 8)  # the newest epoch has no leader yet
    assert cm.majority_leader([], 3) == (None, None)


def test_greenlemon_nodes_agree_on_the_image(real: dict) -> None:
    """Three nodes, two snapshots and logs one batch apart: the same topics, assignments and brokers."""

    def image(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [r for r in records if r["kind"] in ("topic", "broker", "broker_config")]

    a, b, c = (image(real[(GREENLEMON, n)]) for n in ("kafka1", "kafka2", "kafka3"))
    assert a == b == c
    assert sorted(topics(real[(GREENLEMON, "kafka1")])) == [
        "__consumer_offsets",
        "delivery-create-request",
        "delivery-create-response",
        "payment-create-request",
        "payment-create-response",
        "payment-failed",
    ]


def test_nurlan_three_identical_logs_give_identical_records(real: dict) -> None:
    """MANIFEST.md: __cluster_metadata-0 (188 records) is identical on all 3 nodes."""
    outs = []
    for node in CLUSTERS[NURLAN]:
        records = real[(NURLAN, node)]
        outs.append([r for r in records if r["kind"] != "cluster_metadata"])
        head = records[0]
        assert head["log_end_offset"] == 188 and head["snapshot"] is None and head["log_start_offset"] == 0
        assert head["metadata_version_level"] is None  # 3.2: no FeatureLevelRecord (3.0-IV1)
    assert outs[0] == outs[1] == outs[2]
    t = topics(real[(NURLAN, "kafka1")])
    assert {n: (r["topic_id"], len(r["partitions"]), r["replication_factor"]) for n, r in t.items()} == {
        "iot-sensors": ("6-tydMKdQbO5RazHt_Y8-Q", 3, 3),
        "_schemas": ("63PU6i9-Tb6YLAtiOJydAQ", 1, 3),
        "__consumer_offsets": ("GvlhOvYeRNGJQgNm7jrSTQ", 50, 1),
    }
    # a cleanly shut down KRaft cluster: its brokers stay registered, fenced
    brokers = kinds(real[(NURLAN, "kafka1")], "broker")
    assert [(b["broker_id"], b["fenced"]) for b in brokers] == [(1, True), (2, True), (3, True)]
    assert brokers[0]["endpoints"] == ["PLAINTEXT://kafka1:9192", "EXTERNAL://localhost:9094"]
    assert (brokers[0]["host"], brokers[0]["port"]) == ("kafka1", 9192)


def test_kscan_snapshot_only(real: dict) -> None:
    """MANIFEST.md: both .log segments are ABSENT, the index is present; the latest of 39 snapshots is decoded."""
    records = real[(KSCAN, "kafka-1")]
    head = records[0]
    assert head["snapshot"] == "00000000000005072231-0000000193.checkpoint"
    assert (head["snapshot_end_offset"], head["snapshot_epoch"]) == (5072231, 193)
    assert head["log_segments"] == 0 and head["log_start_offset"] is None and head["log_end_offset"] is None
    assert head["log_max_epoch"] is None
    assert head["last_applied_offset"] == 5072230 and not head["snapshot_gap"]
    assert head["metadata_version_level"] == 25 and head["features"]["transaction.version"] == 2
    t = topics(records)
    assert {n: len(r["partitions"]) for n, r in t.items()} == {
        "__consumer_offsets": 50,
        "checkport-results": 16,
        "scan-check-port": 16,
        "scan-full-results": 1,
        "scan-full-topic": 1,
        "scan-results": 16,
        "scan-topic": 1,
        "write_ip_ranges": 16,
    }
    (broker,) = kinds(records, "broker")
    assert broker["broker_id"] == 1 and broker["fenced"] is False  # not cleanly shut down
    assert broker["endpoints"] == ["BROKER://192.168.89.138:9092"] and broker["host"] == "192.168.89.138"
    # Kafka 4.0 writes directories: the broker's log dir id, as meta.properties says
    meta = probe.parse_meta_properties((CORPUS / KSCAN / "kafka-1" / "meta.properties").read_bytes(), "mp")
    assert broker["log_dirs"] == [meta["directory_id"]]
    assert all(s["directories"] == [meta["directory_id"]] for s in kinds(records, "partition_state"))


def test_ldipoc_directories_and_min_isr(real: dict) -> None:
    records = real[(LDIPOC, "kraft-combined-logs")]
    assert records[0]["metadata_version_level"] == 19  # 3.7-IV4
    meta = probe.parse_meta_properties((CORPUS / LDIPOC / "kraft-combined-logs" / "meta.properties").read_bytes(), "m")
    (broker,) = kinds(records, "broker")
    assert broker["log_dirs"] == [meta["directory_id"]] == ["XHhkr4tkSsD900pOQ8pPfg"]
    t = topics(records)
    assert t["__consumer_offsets"]["config"] == {
        "cleanup.policy": "compact",
        "compression.type": "producer",
        "segment.bytes": "104857600",
    }
    assert "14" in t["__consumer_offsets"]["partitions"]  # listed by the checkpoints; its dir never committed


def test_re_encoding_every_real_record_gives_kafkas_bytes(corpus: Path) -> None:
    """The schema table is the lab's encoder's too: every metadata and control record Kafka wrote in the corpus,
    decoded and re-encoded from METADATA_RECORDS / CONTROL_RECORDS, is byte for byte what Kafka wrote."""
    seen: dict[str, int] = {}
    files = sorted(corpus.glob("kraft-*/*/__cluster_metadata-0/*.log")) + sorted(
        corpus.glob("kraft-*/*/__cluster_metadata-0/*.checkpoint")
    )
    files += sorted(corpus.glob("kraft-*/*/bootstrap.checkpoint"))
    for path in files:
        with open(path, "rb") as f:

            def on_batch(pos: int, first: int, last: int, size: int, f=f, path=path) -> None:
                f.seek(pos)
                head, records = cm.batch_records(f.read(size))
                for rec in records:
                    if head["control"]:
                        _ctype, name, body = cm.decode_control_record(rec.key, rec.value)
                        assert ke.control_record(name, **body) == (rec.key, rec.value), (path, rec.offset)
                    else:
                        _key, version, name, body = cm.decode_metadata_record(rec.value)
                        assert ke.metadata_value(name, version, **body) == rec.value, (path, rec.offset, name)
                    seen[name] = seen.get(name, 0) + 1

            res = probe.walk_log(str(path), verify_crc=True, on_batch=on_batch)
            assert res["crc_errors"] == 0 and not res["torn_tail"], path
    for name in (
        "TopicRecord",
        "PartitionRecord",
        "PartitionChangeRecord",
        "RegisterBrokerRecord",
        "BrokerRegistrationChangeRecord",
        "FenceBrokerRecord",
        "UnfenceBrokerRecord",
        "FeatureLevelRecord",
        "ConfigRecord",
        "ProducerIdsRecord",
        "NoOpRecord",
        "LEADER_CHANGE",
        "SNAPSHOT_HEADER",
        "SNAPSHOT_FOOTER",
    ):
        assert seen.get(name), (name, seen)


# --------------------------------------------------------------------------------------------
# The replay rules, on logs written by the test encoder
TOPIC_A = "AAAAAAAAAAAAAAAAAAAAAw"  # any 16 bytes; these are readable
TOPIC_B = "BBBBBBBBBBBBBBBBBBBBBw"
TOPIC_C = "CCCCCCCCCCCCCCCCCCCCCw"
TOPIC_D = "DDDDDDDDDDDDDDDDDDDDDw"
TOPIC_E = "EEEEEEEEEEEEEEEEEEEEEw"
DIR_1 = "ZGlyMWRpcjFkaXIxZGlyMQ"
DIR_2 = "ZGlyMmRpcjJkaXIyZGlyMg"
INCARNATION = "aW5jYXJuYXRpb24tMDAwMQ"


def register(broker_id: int, epoch: int, host: str) -> bytes:
    return ke.metadata_value(
        "RegisterBrokerRecord",
        3,
        BrokerId=broker_id,
        IncarnationId=INCARNATION,
        BrokerEpoch=epoch,
        EndPoints=[
            {"Name": "INTERNAL", "Host": host, "Port": 9093, "SecurityProtocol": 1},
            {"Name": "PLAINTEXT", "Host": host, "Port": 9092, "SecurityProtocol": 0},
        ],
        Features=[{"Name": "metadata.version", "MinSupportedVersion": 1, "MaxSupportedVersion": 19}],
        Rack=f"r{broker_id}",
        Fenced=True,
        LogDirs=[DIR_1 if broker_id == 1 else DIR_2],
    )


def partition(topic_id: str, pid: int, replicas: list[int], version: int = 1) -> bytes:
    fields: dict[str, Any] = {"Directories": [DIR_1 if r == 1 else DIR_2 for r in replicas]} if version >= 1 else {}
    return ke.metadata_value(
        "PartitionRecord",
        version,
        PartitionId=pid,
        TopicId=topic_id,
        Replicas=replicas,
        Isr=replicas,
        Leader=replicas[0],
        LeaderEpoch=0,
        PartitionEpoch=0,
        **fields,
    )


def config(rtype: int, rname: str, name: str, value: str | None) -> bytes:
    return ke.metadata_value("ConfigRecord", ResourceType=rtype, ResourceName=rname, Name=name, Value=value)


def topic(name: str, topic_id: str) -> bytes:
    return ke.metadata_value("TopicRecord", Name=name, TopicId=topic_id)


def story() -> list[bytes]:
    """Batches (offsets 0..29) exercising every replay rule; one record per data batch, as offsets are easier so."""
    values: list[bytes] = [
        b"",  # 0: LEADER_CHANGE (below)
        ke.metadata_value("FeatureLevelRecord", Name="metadata.version", FeatureLevel=19),  # 1
        register(1, 10, "b1"),  # 2
        register(2, 11, "b2"),  # 3
        ke.metadata_value("UnfenceBrokerRecord", Id=1, Epoch=10),  # 4
        ke.metadata_value("BrokerRegistrationChangeRecord", 1, BrokerId=2, BrokerEpoch=11, Fenced=-1),  # 5
        topic("orders", TOPIC_A),  # 6
        partition(TOPIC_A, 0, [1, 2]),  # 7
        partition(TOPIC_A, 1, [2, 1]),  # 8
        config(2, "orders", "min.insync.replicas", "2"),  # 9
        config(4, "", "log.retention.ms", "1000"),  # 10
        config(4, "1", "log.cleaner.threads", "2"),  # 11
        ke.metadata_value("PartitionChangeRecord", PartitionId=0, TopicId=TOPIC_A, Leader=2, Isr=[2]),  # 12
        ke.metadata_value(
            "BrokerRegistrationChangeRecord", 1, BrokerId=1, BrokerEpoch=10, Fenced=1, InControlledShutdown=1
        ),  # 13
        topic("gone", TOPIC_B),  # 14
        partition(TOPIC_B, 0, [1]),  # 15
        config(2, "gone", "retention.ms", "5"),  # 16
        ke.metadata_value("RemoveTopicRecord", TopicId=TOPIC_B),  # 17
        ke.metadata_value("BeginTransactionRecord", Name="create txn"),  # 18
        topic("txn", TOPIC_C),  # 19
        partition(TOPIC_C, 0, [2], version=0),  # 20
        ke.metadata_value("EndTransactionRecord"),  # 21
        ke.metadata_value("BeginTransactionRecord"),  # 22
        topic("aborted", TOPIC_D),  # 23
        ke.metadata_value("AbortTransactionRecord", Reason="controller failover"),  # 24
        ke.metadata_value("NoOpRecord"),  # 25
        register(3, 12, "b3"),  # 26
        ke.metadata_value("UnregisterBrokerRecord", BrokerId=3, BrokerEpoch=12),  # 27
        ke.metadata_value("BeginTransactionRecord", Name="left open"),  # 28
        topic("open", TOPIC_E),  # 29
    ]
    out = [ke.control_batch(0, "LEADER_CHANGE", epoch=1, LeaderId=1, Voters=[{"VoterId": 1}, {"VoterId": 2}])]
    out += [ke.data_batch(off, [v], epoch=1) for off, v in enumerate(values) if off > 0]
    return out


def make_dir(
    root: Path,
    segments: dict[int, bytes] | None = None,
    snapshots: dict[tuple[int, int], bytes] | None = None,
    quorum_state: str | None = '{"clusterId":"","leaderId":1,"leaderEpoch":1,"votedId":-1,"appliedOffset":0,'
    '"currentVoters":[{"voterId":1},{"voterId":2}],"data_version":0}',
    meta: str | None = "version=1\nnode.id=1\ncluster.id=Y2x1c3Rlci1pZC0wMDAwMQ\ndirectory.id=" + DIR_1 + "\n",
) -> Path:
    """A log dir holding a __cluster_metadata-0 dir with these segments / snapshots; returns the metadata dir."""
    mdir = root / cm.METADATA_DIR_NAME
    mdir.mkdir(parents=True)
    for base, data in (segments or {}).items():
        (mdir / probe.segment_file_name(base, "log")).write_bytes(data)
    for (end, epoch), data in (snapshots or {}).items():
        (mdir / f"{end:020d}-{epoch:010d}.checkpoint").write_bytes(data)
    if quorum_state is not None:
        (mdir / "quorum-state").write_text(quorum_state)
    if meta is not None:
        (root / "meta.properties").write_text(meta)
    (mdir / "partition.metadata").write_text("version: 0\ntopic_id: AAAAAAAAAAAAAAAAAAAAAQ")
    return mdir


def snapshot_bytes(values: list[bytes], epoch: int = 1, footer: bool = True) -> bytes:
    """A snapshot as RecordsSnapshotWriter writes it: batches from offset 0, header first, footer last."""
    out = ke.control_batch(0, "SNAPSHOT_HEADER", epoch=epoch, LastContainedLogTimestamp=1)
    out += ke.data_batch(1, values, epoch=epoch)
    if footer:
        out += ke.control_batch(1 + len(values), "SNAPSHOT_FOOTER", epoch=epoch)
    return out


def test_replay_rules(tmp_path: Path) -> None:
    mdir = make_dir(tmp_path, segments={0: b"".join(story())})
    records = decode(tmp_path)
    head = records[0]
    assert head["dir"] == str(mdir) and head["node_id"] == 1 and head["cluster_id"] == "Y2x1c3Rlci1pZC0wMDAwMQ"
    assert head["metadata_version_level"] == 19 and head["features"] == {"metadata.version": 19}
    assert (head["log_start_offset"], head["log_end_offset"]) == (0, 30)
    assert (head["last_leader_change_leader_id"], head["last_leader_change_epoch"]) == (1, 1)
    # the transaction left open at offset 28 is not applied
    assert head["open_transaction"] is True and head["last_applied_offset"] == 27
    assert head["records_replayed"] == 22  # 29 data records, less 5 transaction markers, the aborted and the open one
    (p,) = problems(records)
    assert (
        p["problem"] == "open-transaction" and p["offset"] == 28 and p["file"] == str(mdir / "00000000000000000000.log")
    )
    assert p["message"].startswith(str(mdir / "00000000000000000000.log") + ", offset 28")
    assert set(topics(records)) == {"orders", "txn"}  # gone removed, aborted dropped, open not applied
    orders = topics(records)["orders"]
    assert orders["topic_id"] == TOPIC_A and orders["partitions"] == {"0": [1, 2], "1": [2, 1]}
    assert orders["min_insync_replicas"] == 2 and orders["config"] == {"min.insync.replicas": "2"}
    assert orders["replication_factor"] == 2 and orders["adding_replicas"] == {} == orders["removing_replicas"]
    states = {(s["topic"], s["partition"]): s for s in kinds(records, "partition_state")}
    s0 = states[("orders", 0)]
    assert (s0["leader"], s0["leader_epoch"], s0["isr"], s0["partition_epoch"], s0["zk_version"]) == (2, 1, [2], 1, 1)
    assert s0["directories"] == [DIR_1, DIR_2] and s0["leader_recovery_state"] == 0
    s1 = states[("orders", 1)]
    assert (s1["leader"], s1["leader_epoch"], s1["isr"], s1["partition_epoch"]) == (2, 0, [2, 1], 0)
    assert states[("txn", 0)]["directories"] == [probe.ZERO_UUID]  # v0: MIGRATING
    assert topics(records)["txn"]["config"] == {} and topics(records)["txn"]["min_insync_replicas"] is None
    brokers = {b["broker_id"]: b for b in kinds(records, "broker")}
    assert sorted(brokers) == [1, 2]  # 3 unregistered
    b1, b2 = brokers[1], brokers[2]
    assert (b1["fenced"], b1["in_controlled_shutdown"], b2["fenced"], b2["in_controlled_shutdown"]) == (
        True,
        True,
        False,
        False,
    )
    assert b1["endpoints"] == ["INTERNAL://b1:9093", "PLAINTEXT://b1:9092"]
    assert (b1["host"], b1["port"], b1["rack"], b1["broker_epoch"]) == ("b1", 9092, "r1", 10)
    assert b1["listener_security_protocol_map"] == {"INTERNAL": "SSL", "PLAINTEXT": "PLAINTEXT"}
    assert b1["features"] == {"metadata.version": {"min_version": 1, "max_version": 19}}
    assert b1["log_dirs"] == [DIR_1] and b1["incarnation_id"] == INCARNATION
    assert kinds(records, "broker_config") == [
        {
            "kind": "broker_config",
            "broker_id": None,
            "resource_name": "",
            "config": {"log.retention.ms": "1000"},
            "error": None,
        },
        {
            "kind": "broker_config",
            "broker_id": 1,
            "resource_name": "1",
            "config": {"log.cleaner.threads": "2"},
            "error": None,
        },
    ]
    assert kinds(records, "cluster")[0]["controller_id"] == 1


def test_a_topic_name_reused_after_removal_is_keyed_by_topic_id(tmp_path: Path) -> None:
    values = [
        topic("t", TOPIC_A),
        partition(TOPIC_A, 0, [1]),
        config(2, "t", "retention.ms", "1"),
        ke.metadata_value("RemoveTopicRecord", TopicId=TOPIC_A),
        topic("t", TOPIC_B),
        partition(TOPIC_B, 0, [2]),
        partition(TOPIC_B, 1, [2]),
        ke.metadata_value("ConfigRecord", ResourceType=2, ResourceName="t", Name="cleanup.policy", Value="compact"),
        ke.metadata_value("ConfigRecord", ResourceType=2, ResourceName="t", Name="cleanup.policy", Value=None),
    ]
    make_dir(tmp_path, segments={0: ke.data_batch(0, values)})
    records = decode(tmp_path)
    (t,) = kinds(records, "topic")
    assert (t["topic_id"], t["partitions"], t["config"]) == (TOPIC_B, {"0": [2], "1": [2]}, {})
    assert problems(records) == []


def test_partition_change_merge_rules(tmp_path: Path) -> None:
    values = [
        topic("t", TOPIC_A),
        partition(TOPIC_A, 0, [1, 2]),
        # a reassignment 1,2 -> 2,3: replicas, adding, the directories; then its completion; then an unclean election
        ke.metadata_value(
            "PartitionChangeRecord",
            1,
            PartitionId=0,
            TopicId=TOPIC_A,
            Replicas=[1, 2, 3],
            AddingReplicas=[3],
            RemovingReplicas=[1],
            Directories=[DIR_1, DIR_2, DIR_2],
        ),
        ke.metadata_value(
            "PartitionChangeRecord",
            2,
            PartitionId=0,
            TopicId=TOPIC_A,
            EligibleLeaderReplicas=[2],
            LastKnownElr=[1],
        ),
    ]
    make_dir(tmp_path, segments={0: ke.data_batch(0, values)})
    records = decode(tmp_path)
    (t,) = kinds(records, "topic")
    assert t["adding_replicas"] == {"0": [3]} and t["removing_replicas"] == {"0": [1]}
    assert t["replication_factor"] == 2  # 3 replicas, one of them being added
    (s,) = kinds(records, "partition_state")
    assert (s["adding_replicas"], s["removing_replicas"]) == ([3], [1])
    assert (s["replicas"], s["directories"], s["leader"], s["leader_epoch"], s["partition_epoch"]) == (
        [1, 2, 3],
        [DIR_1, DIR_2, DIR_2],
        1,
        0,
        2,
    )
    assert (s["eligible_leader_replicas"], s["last_known_elr"]) == ([2], [1])
    more = [
        ke.metadata_value(
            "PartitionChangeRecord",
            PartitionId=0,
            TopicId=TOPIC_A,
            Replicas=[2, 3],
            AddingReplicas=[],
            RemovingReplicas=[],
            Leader=-1,
            LeaderRecoveryState=1,
        ),
    ]
    shutil.rmtree(tmp_path / cm.METADATA_DIR_NAME)
    make_dir(tmp_path, segments={0: ke.data_batch(0, values), 4: ke.data_batch(4, more)}, meta=None)
    records = decode(tmp_path)
    (s,) = kinds(records, "partition_state")
    assert (s["replicas"], s["leader"], s["leader_epoch"], s["leader_recovery_state"], s["partition_epoch"]) == (
        [2, 3],
        -1,
        1,
        1,
        3,
    )
    # replicas changed without directories: DirectoryId.createDirectoriesFrom keeps each kept replica's directory
    assert s["directories"] == [DIR_2, DIR_2]
    assert kinds(records, "topic")[0]["adding_replicas"] == {}
    # a new replica is UNASSIGNED (Uuid 0, 1), the others keep theirs whatever their position; no replicas: unchanged
    later = [
        ke.metadata_value("PartitionChangeRecord", PartitionId=0, TopicId=TOPIC_A, Replicas=[4, 3, 2]),
        ke.metadata_value("PartitionChangeRecord", PartitionId=0, TopicId=TOPIC_A, Isr=[3]),
    ]
    shutil.rmtree(tmp_path / cm.METADATA_DIR_NAME)
    segs = {0: ke.data_batch(0, values), 4: ke.data_batch(4, more), 5: ke.data_batch(5, later)}
    make_dir(tmp_path, segments=segs, meta=None)
    (s,) = kinds(decode(tmp_path), "partition_state")
    assert s["replicas"] == [4, 3, 2] and s["isr"] == [3]
    assert s["directories"] == [cm.UNASSIGNED_DIR, DIR_2, DIR_2]
    assert cm.UNASSIGNED_DIR == cm.uuid_text(bytes(15) + b"\x01")


def test_latest_snapshot_is_by_epoch_then_offset_and_the_log_resumes_after_it(tmp_path: Path) -> None:
    old = snapshot_bytes([topic("old", TOPIC_A)], epoch=1)
    new = snapshot_bytes([topic("new", TOPIC_B), partition(TOPIC_B, 0, [1])], epoch=2)
    log = ke.data_batch(0, [topic("before", TOPIC_C)]) + ke.data_batch(5, [topic("after", TOPIC_D)], epoch=2)
    mdir = make_dir(tmp_path, segments={0: log}, snapshots={(9, 1): old, (5, 2): new})
    (mdir / "00000000000000000020-0000000003.checkpoint.part").write_bytes(b"garbage")  # in progress: not one
    (mdir / "00000000000000000030-0000000003.checkpoint.deleted").write_bytes(b"garbage")
    records = decode(tmp_path)
    head = records[0]
    assert head["snapshot"] == "00000000000000000005-0000000002.checkpoint"
    assert (head["snapshot_end_offset"], head["snapshot_epoch"], head["snapshot_gap"]) == (5, 2, False)
    assert set(topics(records)) == {"new", "after"}  # "before" (offset 0) is below the snapshot's end
    assert head["last_applied_offset"] == 5 and head["log_end_offset"] == 6
    assert problems(records) == []


def test_snapshot_gap(tmp_path: Path) -> None:
    snap = snapshot_bytes([topic("t", TOPIC_A)])
    make_dir(tmp_path, segments={20: ke.data_batch(20, [topic("u", TOPIC_B)])}, snapshots={(10, 1): snap})
    records = decode(tmp_path)
    head = records[0]
    assert head["snapshot_gap"] is True and head["log_start_offset"] == 20
    (p,) = problems(records)
    assert p["problem"] == "snapshot-gap" and p["offset"] == 20
    assert "records 10..19 are missing" in p["message"]
    # no snapshot at all and a log that does not start at 0
    shutil.rmtree(tmp_path / cm.METADATA_DIR_NAME)
    make_dir(tmp_path, segments={7: ke.data_batch(7, [topic("u", TOPIC_B)])}, meta=None)
    records = decode(tmp_path)
    assert records[0]["snapshot_gap"] is True
    assert [p["problem"] for p in problems(records)] == ["snapshot-gap"]


def test_a_snapshot_without_its_footer_is_incomplete(tmp_path: Path) -> None:
    mdir = make_dir(tmp_path, snapshots={(2, 1): snapshot_bytes([topic("t", TOPIC_A)], footer=False)})
    records = decode(mdir)  # the metadata dir itself works as well as its log dir
    (p,) = problems(records)
    assert p["problem"] == "torn-tail" and "SnapshotFooter" in p["message"]
    assert p["file"] == str(mdir / "00000000000000000002-0000000001.checkpoint")
    assert set(topics(records)) == {"t"}


# --------------------------------------------------------------------------------------------
# Hostile input: a problem or an error naming the file (and the offset), never a crash
def good_log() -> bytes:
    return b"".join(story()[:12])  # offsets 0..11, no transaction


def test_truncated_batch_is_a_torn_tail(tmp_path: Path) -> None:
    log = good_log()
    last = story()[11]
    mdir = make_dir(tmp_path, segments={0: log[: len(log) - len(last) // 2]})
    seg = str(mdir / "00000000000000000000.log")
    records = decode(tmp_path)
    head = records[0]
    assert head["log_torn_tail"] is True and head["log_end_offset"] == 11 and head["last_applied_offset"] == 10
    assert head["log_tail_error"].startswith(seg + ": batch at byte")
    (p,) = problems(records)
    assert (p["problem"], p["file"], p["offset"], p["position"]) == ("torn-tail", seg, 11, len(log) - len(last))
    assert p["message"].startswith(f"{seg}, offset 11 (byte {len(log) - len(last)}): ")
    assert records[-1]["complete"] is True and records[-1]["problems"] == 1


def test_flipped_byte_is_a_crc_failure_and_recovery_stops_there(tmp_path: Path) -> None:
    batches = story()[:12]
    pos = sum(len(b) for b in batches[:5]) + 70  # inside batch 5's records
    first = bytearray(b"".join(batches[:8]))
    first[pos] ^= 0x01
    mdir = make_dir(tmp_path, segments={0: bytes(first), 8: b"".join(batches[8:12])})
    seg0 = str(mdir / "00000000000000000000.log")
    records = decode(tmp_path)
    head = records[0]
    assert head["log_crc_errors"] == 1 and head["log_first_crc_error_offset"] == 5
    assert "Record is corrupt" in head["log_tail_error"] and head["log_end_offset"] == 5
    assert head["last_applied_offset"] == 4 and head["log_torn_tail"] is False
    ps = problems(records)
    assert [(p["problem"], p["file"], p["offset"]) for p in ps] == [("crc", seg0, 5), ("crc", seg0, None)]
    assert "1 later segment(s) not read" in ps[1]["message"]
    assert topics(records) == {}  # the topic at offset 6 is after the corrupt batch


def test_unknown_record_type_and_version_are_skipped_with_a_problem_naming_the_offset(tmp_path: Path) -> None:
    values = [
        topic("a", TOPIC_A),
        ke.raw_metadata_value(99, 0, b"\x00"),  # an apiKey this decoder does not know
        ke.metadata_value("TopicRecord", Name="b", TopicId=TOPIC_B)[:2] + b"\x07" + b"\x02b" + b"\0" * 16 + b"\x00",
        topic("c", TOPIC_C),
    ]
    # the third value: TopicRecord at version 7 (only 0 exists)
    mdir = make_dir(
        tmp_path,
        segments={0: ke.data_batch(0, values) + ke.batch(4, [(b"\x00\x00\x00\x63", b"\x00\x00")], control=True)},
    )
    seg = str(mdir / "00000000000000000000.log")
    records = decode(tmp_path)
    ps = problems(records)
    assert [(p["problem"], p["offset"], p["file"]) for p in ps] == [
        ("unknown-record", 1, seg),
        ("unsupported-version", 2, seg),
        ("unknown-record", 4, seg),
    ]
    assert "apiKey 99" in ps[0]["message"] and ps[0]["message"].startswith(seg + ", offset 1 (byte 0)")
    assert "TopicRecord version 7 is not supported" in ps[1]["message"]
    assert "unknown control record type 99" in ps[2]["message"]
    assert set(topics(records)) == {"a", "c"}
    assert records[0]["last_applied_offset"] == 3


def test_unknown_tagged_fields_are_skipped_as_kafka_does(tmp_path: Path) -> None:
    body = ke.encode_message(cm.METADATA_RECORDS[2], {"Name": "t", "TopicId": TOPIC_A}, 0)
    assert body.endswith(b"\x00")
    value = ke.uvarint(1) + ke.uvarint(2) + ke.uvarint(0) + body[:-1] + b"\x01" + b"\x09\x03abc"
    make_dir(tmp_path, segments={0: ke.data_batch(0, [value])})
    records = decode(tmp_path)
    assert problems(records) == [] and set(topics(records)) == {"t"}


@pytest.mark.parametrize("n", [1, 3, 126, 127, 128, 400])
def test_replica_arrays_of_every_length_read_alike(n: int) -> None:
    """Arrays of numbers and UUIDs are read in one step below 127 elements (a one-byte length) and element by
    element above: both give the same fields, and a truncated array is an error naming the field either way."""
    replicas = list(range(1, n + 1))
    value = partition(TOPIC_A, 0, replicas)
    _key, _version, name, fields = cm.decode_metadata_record(value)
    assert name == "PartitionRecord" and fields["Replicas"] == replicas and fields["Isr"] == replicas
    assert fields["Directories"] == [DIR_1 if r == 1 else DIR_2 for r in replicas]
    with pytest.raises(cm.DecodeError, match=r"\(field Directories\)|Directories needs"):
        cm.decode_metadata_record(value[: value.index(cm.uuid_bytes(DIR_1)) + 8])


def test_the_image_holds_each_replica_list_and_id_once() -> None:
    """200,000 partitions over a few replica sets: the image keeps one tuple per distinct list and one str per topic
    and directory ID (the decoder's memory on a big cluster, bench/README.md), and a change replaces, never edits."""
    img = cm.Image()
    img.replay("TopicRecord", cm.decode_metadata_record(topic("a", TOPIC_A))[3])
    for pid in range(3):
        assert img.replay("PartitionRecord", cm.decode_metadata_record(partition(TOPIC_A, pid, [1, 2]))[3]) is None
    a, b, c = (img.topics[TOPIC_A]["partitions"][pid] for pid in range(3))
    assert a["Replicas"] == (1, 2) and a["Replicas"] is b["Replicas"] is c["Replicas"] is a["Isr"]
    assert a["TopicId"] is b["TopicId"] and a["Directories"][0] is b["Directories"][0]
    assert a["AddingReplicas"] == () and a["EligibleLeaderReplicas"] is a["LastKnownElr"]
    change = ke.metadata_value("PartitionChangeRecord", 0, PartitionId=1, TopicId=TOPIC_A, Isr=[2])
    assert img.replay("PartitionChangeRecord", cm.decode_metadata_record(change)[3]) is None
    assert b["Isr"] == (2,) and a["Isr"] == (1, 2) and c["Isr"] is a["Isr"]


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        # PartitionRecord whose Replicas array claims 2^31-2 elements: refused before any allocation
        (
            ke.uvarint(1) + ke.uvarint(3) + ke.uvarint(0) + b"\0\0\0\0" + b"\1" * 16 + ke.uvarint(0x7FFFFFFF),
            "Tried to allocate a collection of size 2147483646",
        ),
        # a TopicRecord name of 1 GiB
        (ke.uvarint(1) + ke.uvarint(2) + ke.uvarint(0) + ke.uvarint(1 << 30) + b"x", "string field Name had invalid"),
        # a non-nullable string serialized as null
        (ke.uvarint(1) + ke.uvarint(2) + ke.uvarint(0) + ke.uvarint(0), "non-nullable field Name"),
        # a varint that never ends
        (ke.uvarint(1) + b"\xff" * 20, "apiKey at byte"),
        # frame version 0
        (b"\x00\x02\x00", "frame version 0"),
        # bytes left over after the record
        (ke.metadata_value("NoOpRecord") + b"\x00", "left over"),
        # a tagged field that claims more bytes than there are
        (ke.uvarint(1) + ke.uvarint(20) + ke.uvarint(0) + b"\x01\x00" + ke.uvarint(1 << 28), "tagged field 0 needs"),
    ],
    ids=["huge-array", "huge-string", "null-string", "endless-varint", "frame-0", "left-over", "huge-tag"],
)
def test_hostile_record_values_are_undecodable_records(tmp_path: Path, value: bytes, needle: str) -> None:
    import tracemalloc

    mdir = make_dir(tmp_path, segments={0: ke.data_batch(0, [topic("a", TOPIC_A), value, topic("b", TOPIC_B)])})
    tracemalloc.start()
    try:
        records = decode(tmp_path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20
    (p,) = problems(records)
    assert (p["problem"], p["offset"], p["file"]) == ("undecodable", 1, str(mdir / "00000000000000000000.log"))
    assert needle in p["message"], p["message"]
    assert set(topics(records)) == {"a", "b"}


def test_hostile_batches(tmp_path: Path) -> None:
    """A batch claiming 2^31-1 records, a compressed batch KRaft never writes, a record length past the batch."""
    claims = ke.batch(1, [(None, topic("x", TOPIC_B))], count=0x7FFFFFFF)
    snappy = bytearray(ke.data_batch(2, [topic("y", TOPIC_C)]))
    snappy[22] = 2  # attributes low byte: codec 2 (snappy); reseal the CRC so the framing is valid
    snappy[17:21] = probe.crc32c(bytes(snappy[21:])).to_bytes(4, "big")
    log = ke.data_batch(0, [topic("a", TOPIC_A)]) + claims + bytes(snappy) + ke.data_batch(3, [topic("d", TOPIC_D)])
    mdir = make_dir(tmp_path, segments={0: log})
    records = decode(tmp_path)
    ps = problems(records)
    assert [(p["problem"], p["offset"]) for p in ps] == [("undecodable", 1), ("undecodable", 2)]
    assert "claims 2147483647 records" in ps[0]["message"] and "snappy-compressed batch" in ps[1]["message"]
    assert all(p["file"] == str(mdir / "00000000000000000000.log") for p in ps)
    assert set(topics(records)) == {"a", "d"}


def test_garbage_segment(tmp_path: Path) -> None:
    mdir = make_dir(tmp_path, segments={0: os.urandom(1000), 5: good_log()})
    seg = str(mdir / "00000000000000000000.log")
    records = decode(tmp_path)
    head = records[0]
    assert head["log_torn_tail"] is True and head["log_tail_error"].startswith(seg + ": ")
    ps = problems(records)
    assert ps[0]["problem"] == "torn-tail" and ps[0]["file"] == seg and ps[0]["position"] == 0
    assert ps[1]["message"] == seg + ": 1 later segment(s) not read: Kafka's recovery truncates the log here"
    assert topics(records) == {} and kinds(records, "broker") == []


def test_gzip_batches_are_read(tmp_path: Path) -> None:
    make_dir(tmp_path, segments={0: ke.gzip_batch(ke.data_batch(0, [topic("a", TOPIC_A), topic("b", TOPIC_B)]))})
    records = decode(tmp_path)
    assert problems(records) == [] and set(topics(records)) == {"a", "b"}


def test_a_gzip_bomb_is_one_problem(tmp_path: Path) -> None:
    """97,845 bytes that inflate to 64 MiB of empty records (the safety review's file drove the decoder to 791 MB
    and 97 s): inflating stops at what KRaft writes in one batch, one problem names the file and the batch, and the
    batches around it are read. Memory and time: bench/kraft_decoder_bench.py."""
    bomb = ke.empty_records_gzip_batch(64 << 20, base_offset=1)
    assert len(bomb) == 97_845
    log = ke.data_batch(0, [topic("a", TOPIC_A)]) + bomb + ke.data_batch(2, [topic("c", TOPIC_C)])
    mdir = make_dir(tmp_path, segments={0: log})
    records = decode(tmp_path)
    (p,) = problems(records)
    assert (p["problem"], p["offset"], p["file"]) == ("undecodable", 1, str(mdir / "00000000000000000000.log"))
    assert f"gzip batch inflates to more than {cm.MAX_INFLATED_BYTES} bytes" in p["message"]
    assert set(topics(records)) == {"a", "c"}


def test_a_batch_of_empty_records_stops_after_a_few_problems(tmp_path: Path) -> None:
    """Under the inflate limit, a batch of 200,000 records with null values: ten problems and one saying the rest
    of the batch is skipped, not 200,000 (the records are checked and made one at a time: the batch never becomes
    200,000 objects)."""
    log = ke.data_batch(0, [topic("a", TOPIC_A)]) + ke.empty_records_gzip_batch(7 * 200_000, base_offset=1)
    make_dir(tmp_path, segments={0: log})
    records = decode(tmp_path)
    ps = problems(records)
    assert len(ps) == cm.BATCH_UNDECODABLE_MAX + 1
    assert {p["message"].split(": ", 1)[1] for p in ps[:-1]} == {"metadata record with a null value"}
    assert ps[-1]["message"].endswith(
        f"{cm.BATCH_UNDECODABLE_MAX} records of this batch could not be decoded; its other "
        f"{200_000 - cm.BATCH_UNDECODABLE_MAX} records are skipped"
    )
    assert set(topics(records)) == {"a"}
    assert records[0]["image_complete"] is False  # records that may be good ones were skipped: not a whole image
    _head, count, lazy = cm.iter_batch_records(ke.empty_records_gzip_batch(7 * 1000))
    assert count == 1000 and not isinstance(lazy, list) and next(lazy).value is None


def test_a_batch_is_checked_whole_before_its_first_record(tmp_path: Path) -> None:
    """Records are handed out lazily, yet a batch with a bad record is refused whole, as before: none applied."""
    good = ke.data_batch(0, [topic("a", TOPIC_A), topic("b", TOPIC_B)])
    bad = bytearray(good)
    bad[-1] = 10  # the last record's header count (zigzag varint 10 = 5): 5 headers in no bytes
    bad[17:21] = probe.crc32c(bytes(bad[21:])).to_bytes(4, "big")
    with pytest.raises(cm.DecodeError, match="claims 5 headers"):
        cm.iter_batch_records(bytes(bad))
    make_dir(tmp_path, segments={0: bytes(bad)})
    records = decode(tmp_path)
    assert topics(records) == {} and [p["problem"] for p in problems(records)] == ["undecodable"]


def test_clear_elr_clears_the_named_topic_or_every_topic(tmp_path: Path) -> None:
    """ClearElrRecord (KIP-966): a topic's partitions lose their ELR and last known ELR; "" clears every topic's.
    Replay visits only partitions that have either (an index), so 10,000 of them over 10,000 partitions stay linear:
    bench/kraft_decoder_bench.py."""

    def elr(t: str, pid: int, e: list[int], lke: list[int]) -> bytes:
        return ke.metadata_value(
            "PartitionChangeRecord", 2, PartitionId=pid, TopicId=t, EligibleLeaderReplicas=e, LastKnownElr=lke
        )

    def clear(name: str) -> bytes:
        return ke.metadata_value("ClearElrRecord", TopicName=name)

    base = [topic("a", TOPIC_A), partition(TOPIC_A, 0, [1, 2]), partition(TOPIC_A, 1, [2, 1])]
    base += [topic("b", TOPIC_B), partition(TOPIC_B, 0, [1, 2])]
    base += [elr(TOPIC_A, 0, [2], [1]), elr(TOPIC_A, 1, [], [2]), elr(TOPIC_B, 0, [1], [])]

    def states(values: list[bytes]) -> dict[tuple[str, int], tuple[list[int], list[int]]]:
        shutil.rmtree(tmp_path / cm.METADATA_DIR_NAME, ignore_errors=True)
        make_dir(tmp_path, segments={0: ke.data_batch(0, values)}, meta=None)
        records = decode(tmp_path)
        assert problems(records) == []
        names = {t["topic_id"]: t["topic"] for t in kinds(records, "topic")}
        return {
            (names[s["topic_id"]], s["partition"]): (s["eligible_leader_replicas"], s["last_known_elr"])
            for s in kinds(records, "partition_state")
        }

    assert states(base) == {("a", 0): ([2], [1]), ("a", 1): ([], [2]), ("b", 0): ([1], [])}
    assert states([*base, clear("a")]) == {("a", 0): ([], []), ("a", 1): ([], []), ("b", 0): ([1], [])}
    assert states([*base, clear("nope")]) == states(base)
    assert states([*base, clear("")]) == {k: ([], []) for k in states(base)}
    # cleared, set again, cleared again; a removed topic's name taken by a new topic: the new one is cleared
    again = [*base, clear(""), elr(TOPIC_B, 0, [2], [2]), clear("b")]
    assert states(again)[("b", 0)] == ([], [])
    reborn = [*base, ke.metadata_value("RemoveTopicRecord", TopicId=TOPIC_A), topic("a", TOPIC_C)]
    reborn += [partition(TOPIC_C, 0, [1, 2]), elr(TOPIC_C, 0, [1], [2])]
    assert states([*reborn, clear("a")])[("a", 0)] == ([], []) and states(reborn)[("a", 0)] == ([1], [2])
    # an image filled directly (the lab's, from the decoder's output) is indexed again before it replays
    filled = cm.Image()
    filled.topics = {TOPIC_A: {"name": "a", "partitions": {0: {"EligibleLeaderReplicas": [2], "LastKnownElr": [1]}}}}
    filled.reindex()
    filled.replay("ClearElrRecord", {"TopicName": "a"})
    assert filled.topics[TOPIC_A]["partitions"][0] == {"EligibleLeaderReplicas": (), "LastKnownElr": ()}


def test_the_decoder_runs_within_its_memory_and_cpu_limits(tmp_path: Path) -> None:
    """As a controller runs it (``audit.kraft.decode_command``): over a limit it stops with exit 3 and one line
    naming the dir and the limit, not the host's memory or CPU."""
    from fleet_doctor.audit.kraft import decode_command

    command = decode_command(str(tmp_path))
    assert "python3 - --max-memory-mib 4096 --max-cpu-s 600 " in command and "nice -n 19" in command
    make_dir(tmp_path, segments={0: ke.data_batch(0, [topic("a", TOPIC_A)])})

    def run(*args: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(["python3", "-", *args], input=cm.bundle(), capture_output=True, cwd="/", timeout=120)

    ok = run("--max-memory-mib", "512", "--max-cpu-s", "60", str(tmp_path))
    assert ok.returncode == 0 and b'"topic":"a"' in ok.stdout
    slow = tmp_path / "slow"  # 8 MB to inflate, a million records to check
    make_dir(slow, segments={0: ke.empty_records_gzip_batch(8_000_000)})
    starved = run("--max-memory-mib", "1", str(slow))  # below what the interpreter already holds
    assert starved.returncode == 3, starved.stderr
    assert starved.stderr.decode().strip() == (
        f"cluster-metadata: error: {slow} needs more than the decoder's 1 MiB of memory (--max-memory-mib); "
        "nothing printed after that point"
    )
    spent = run("--max-cpu-s", "1", str(slow))
    assert spent.returncode == 3, spent.stderr
    assert spent.stderr.decode().strip() == (
        f"cluster-metadata: error: {slow} takes more than the decoder's 1 s of CPU (--max-cpu-s); nothing printed "
        "after that point"
    )
    for bad in (["--max-cpu-s", "0", str(tmp_path)], ["--max-memory-mib", "x", str(tmp_path)], ["--max-cpu-s"]):
        assert run(*bad).returncode == 2


def test_unreadable_files(tmp_path: Path) -> None:
    """Something that is not a regular file where a segment, quorum-state or meta.properties should be."""
    mdir = make_dir(tmp_path, segments={5: good_log()}, quorum_state=None, meta=None)
    (mdir / "00000000000000000000.log").mkdir()
    (mdir / "quorum-state").mkdir()
    os.mkfifo(tmp_path / "meta.properties")
    records = decode(tmp_path)
    head = records[0]
    ps = problems(records)
    assert [(p["problem"], p["file"]) for p in ps] == [
        ("unreadable", str(tmp_path / "meta.properties")),
        ("unreadable", str(mdir / "quorum-state")),
        ("unreadable", str(mdir / "00000000000000000000.log")),
    ]
    assert "is not a regular file" in ps[2]["message"]
    assert head["error"].count(";") == 1 and str(mdir / "quorum-state") in head["error"]
    assert head["node_id"] is None and head["quorum_leader_id"] is None
    assert head["log_tail_error"] == str(mdir / "00000000000000000000.log") + " cannot be read"
    assert topics(records) == {}


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("not json", "is not JSON"),
        ("[1, 2]", "is not a JSON object"),
        ('{"leaderId": "1", "leaderEpoch": 2, "data_version": 0}', "leaderId is '1', not an integer"),
        ('{"leaderId": 1, "leaderEpoch": 2, "data_version": 0, "currentVoters": [1]}', "currentVoters"),
    ],
)
def test_malformed_quorum_state(tmp_path: Path, content: str, needle: str) -> None:
    mdir = make_dir(tmp_path, segments={0: good_log()}, quorum_state=content)
    records = decode(tmp_path)
    (p,) = problems(records)
    assert p["file"] == str(mdir / "quorum-state") and needle in p["message"]
    assert needle in records[0]["error"] and records[0]["quorum_leader_id"] is None
    # the controller then comes from the last LEADER_CHANGE
    assert kinds(records, "cluster")[0]["controller_id"] == 1


def test_quorum_state_v1_and_no_leader(tmp_path: Path) -> None:
    make_dir(
        tmp_path,
        segments={0: good_log()},
        quorum_state='{"leaderId":-1,"leaderEpoch":7,"votedId":2,"votedDirectoryId":"AAAAAAAAAAAAAAAAAAAAAA",'
        '"data_version":1}',
    )
    records = decode(tmp_path)
    head = records[0]
    assert (head["quorum_leader_id"], head["quorum_leader_epoch"], head["quorum_voted_id"]) == (-1, 7, 2)
    assert head["quorum_data_version"] == 1 and head["quorum_voters"] is None
    cluster = kinds(records, "cluster")[0]
    assert (cluster["controller_id"], cluster["controller_epoch"]) == (1, 1)  # mid-election: the last LEADER_CHANGE


def test_problems_per_file_are_capped(tmp_path: Path) -> None:
    values = [ke.raw_metadata_value(77, 0) for _ in range(cm.PROBLEMS_PER_FILE_MAX + 50)]
    make_dir(tmp_path, segments={0: ke.data_batch(0, values)})
    records = decode(tmp_path)
    assert len(problems(records)) == cm.PROBLEMS_PER_FILE_MAX
    assert records[-1]["problems"] == cm.PROBLEMS_PER_FILE_MAX and records[-1]["problems_suppressed"] == 50


def test_records_for_what_the_image_does_not_hold_are_inconsistent(tmp_path: Path) -> None:
    values = [
        partition(TOPIC_A, 0, [1]),
        ke.metadata_value("PartitionChangeRecord", PartitionId=3, TopicId=TOPIC_A, Leader=1),
        ke.metadata_value("FenceBrokerRecord", Id=9, Epoch=1),
        ke.metadata_value("RemoveTopicRecord", TopicId=TOPIC_B),
        ke.metadata_value("EndTransactionRecord"),
    ]
    make_dir(tmp_path, segments={0: ke.data_batch(0, values)})
    ps = problems(decode(tmp_path))
    assert [(p["problem"], p["offset"]) for p in ps] == [("inconsistent", i) for i in range(5)]
    assert f"topic ID {TOPIC_A}, which the image does not hold" in ps[0]["message"]


@pytest.mark.parametrize("case", ["missing", "file", "empty-metadata-dir", "plain-dir", "only-other-files"])
def test_dirs_that_are_not_metadata_dirs_are_errors_naming_them(tmp_path: Path, case: str) -> None:
    target = tmp_path / "x"
    if case == "file":
        target.write_text("x")
    elif case == "empty-metadata-dir":
        target = tmp_path / cm.METADATA_DIR_NAME
        target.mkdir()
    elif case == "plain-dir":
        target.mkdir()
        (target / "orders-0").mkdir()
    elif case == "only-other-files":
        target = make_dir(tmp_path)
        (target / "00000000000000000000.index").write_bytes(b"\0" * 8)
        (target / "00000000000000000000.log.deleted").write_bytes(good_log())
        (target / "00000000000000000009-0000000001.checkpoint.part").write_bytes(b"")
    with pytest.raises(cm.ClusterMetadataError) as e:
        decode(target)
    assert str(target) in str(e.value)


def test_odd_names(tmp_path: Path) -> None:
    """A log dir path with spaces, a newline and non-ASCII / non-UTF-8 bytes; stray files with odd names inside."""
    root = Path(os.fsdecode(bytes(tmp_path) + b"/odd dir\n\xc3\xbc\xff"))
    mdir = make_dir(root, segments={0: good_log()})
    (mdir / "00000000000000000000.log ").write_bytes(b"junk")  # not a segment name
    (mdir / os.fsdecode(b"\xff.checkpoint")).write_bytes(b"junk")
    (mdir / "1-1.checkpoint").write_bytes(b"junk")
    records = decode(root)
    assert records[0]["dir"] == str(mdir) and problems(records) == []
    text = cm.format_records(records)
    assert [json.loads(line)["kind"] for line in text.splitlines()] == [r["kind"] for r in records]
    assert "\n" not in text.splitlines()[0]


# --------------------------------------------------------------------------------------------
# The CLI and the program shipped to controllers
TAKEN_AT = re.compile(rb'"taken_at_ms":\d+')


def same_but_clock(a: bytes, b: bytes) -> bool:
    """Byte-identical apart from taken_at_ms (when reading started)."""
    return TAKEN_AT.sub(b"T", a) == TAKEN_AT.sub(b"T", b)


@pytest.mark.parametrize(("sample", "node"), [(GREENLEMON, "kafka1"), (KSCAN, "kafka-1"), (NURLAN, "kafka2")])
def test_bundle_on_stdin_prints_what_the_library_returns(corpus: Path, sample: str, node: str) -> None:
    """As audit/kraft.py runs it on a controller: ``python3 - DIR`` with bundle() on stdin, no fleet_doctor around."""
    path = corpus / sample / node
    res = subprocess.run(
        ["python3", "-", str(path)],
        input=cm.bundle(),
        capture_output=True,
        check=True,
        cwd="/",
        env={"PATH": os.environ["PATH"], "LC_ALL": "C"},  # no PYTHONPATH: only the bundle's modules
    )
    assert res.stderr == b""
    assert same_but_clock(res.stdout, cm.format_records(decode(path)).encode("utf-8"))
    assert res.stdout.endswith(b'"problems_suppressed":0}\n')


def test_bundle_errors_exit_2_with_one_line(tmp_path: Path) -> None:
    res = subprocess.run(["python3", "-", str(tmp_path)], input=cm.bundle(), capture_output=True, cwd="/")
    assert res.returncode == 2 and res.stdout == b""
    assert res.stderr.decode().splitlines() == [
        f"cluster-metadata: error: {tmp_path} is neither a __cluster_metadata-0 dir nor a log dir holding one"
    ]
    res = subprocess.run(["python3", "-"], input=cm.bundle(), capture_output=True, cwd="/")
    assert res.returncode == 2 and res.stderr.startswith(b"usage: ")


def test_bundle_and_module_are_stdlib_only_and_python36_compatible() -> None:
    import ast

    src = Path(cm.__file__).read_text()
    ast.parse(src, feature_version=(3, 6))
    ast.parse(cm.bundle().decode(), feature_version=(3, 6))
    modules = set()
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Import):
            modules.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            modules.add(node.module.split(".")[0])
    assert modules - set(sys.stdlib_module_names) == {"fleet_doctor", "probe"}
    vermin = shutil.which("vermin") or str(Path(sys.executable).parent / "vermin")
    res = subprocess.run(
        [vermin, "--no-tips", "--violations", "-t=3.6-", "--eval-annotations", cm.__file__],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stdout + res.stderr


def test_cli_prints_and_writes_atomically(corpus: Path, tmp_path: Path) -> None:
    path = corpus / LDIPOC / "kraft-combined-logs"
    res = subprocess.run([str(CLI), "cluster-metadata", str(path)], capture_output=True, check=True)
    assert same_but_clock(res.stdout, cm.format_records(decode(path)).encode("utf-8"))
    out = tmp_path / "out.jsonl"
    subprocess.run([str(CLI), "cluster-metadata", str(path), "--output", str(out)], check=True)
    assert same_but_clock(out.read_bytes(), res.stdout)
    assert os.listdir(tmp_path) == ["out.jsonl"]  # no temporary file left behind


def test_cli_errors_exit_2_with_one_line(tmp_path: Path) -> None:
    res = subprocess.run([str(CLI), "cluster-metadata", str(tmp_path / "nope")], capture_output=True, text=True)
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.splitlines() == [
        "fleet-doctor cluster-metadata: error: %s is not a directory" % (tmp_path / "nope")
    ]
    res = subprocess.run([str(CLI), "cluster-metadata"], capture_output=True, text=True)
    assert res.returncode == 2 and "usage" in res.stderr


def test_scan_accepts_cluster_metadata_dirs() -> None:
    from fleet_doctor.cli.main import build_parser

    args = build_parser().parse_args(["scan", "/x", "--cluster-metadata", "/a", "--cluster-metadata", "/b"])
    assert args.cluster_metadata == ["/a", "/b"]
    assert build_parser().parse_args(["scan", "/x"]).cluster_metadata is None


def test_batches_whose_offsets_go_back_are_skipped(tmp_path: Path) -> None:
    log = ke.data_batch(0, [topic("a", TOPIC_A), topic("b", TOPIC_B)]) + ke.data_batch(1, [topic("c", TOPIC_C)])
    log += ke.data_batch(2, [topic("d", TOPIC_D)])
    mdir = make_dir(tmp_path, segments={0: log})
    records = decode(tmp_path)
    (p,) = problems(records)
    assert (p["problem"], p["offset"], p["file"]) == ("inconsistent", 1, str(mdir / "00000000000000000000.log"))
    assert set(topics(records)) == {"a", "b", "d"} and records[0]["log_end_offset"] == 3


def test_bundle_ignores_another_fleet_doctor_on_the_host(corpus: Path, tmp_path: Path) -> None:
    """A controller with some other fleet_doctor package importable: the bundle still uses its own probe."""
    fake = tmp_path / "site" / "fleet_doctor"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise SystemExit('the host fleet_doctor was imported')\n")
    path = corpus / NURLAN / "kafka1"
    res = subprocess.run(
        ["python3", "-", str(path)],
        input=cm.bundle(),
        capture_output=True,
        cwd="/",
        env={"PATH": os.environ["PATH"], "PYTHONPATH": str(tmp_path / "site")},
    )
    assert res.returncode == 0, res.stderr
    assert same_but_clock(res.stdout, cm.format_records(decode(path)).encode("utf-8"))


def test_schema_doc_lists_every_field_of_every_record_kind(real: dict, tmp_path: Path) -> None:
    """docs/cluster-metadata-schema.md documents exactly the fields the decoder prints, kind by kind."""
    doc = (REPO / "docs" / "cluster-metadata-schema.md").read_text()
    documented: dict[str, set[str]] = {}
    problem_kinds: list[str] = []
    kind = table = None
    lines = doc.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"## `([a-z_]+)`", line)
        if m:
            kind = m.group(1)
            documented[kind] = set()
        elif line.startswith("## "):
            kind = None
        elif line.startswith("|---"):
            continue
        elif i + 1 < len(lines) and lines[i + 1].startswith("|---"):
            table = line.split("|")[1].strip()  # a table's header row: "field" or "`problem`"
        elif kind and line.startswith("| `") and table == "field":
            documented[kind].update(re.findall(r"`([a-z_]+)`", line.split("|")[1]))
        elif kind == "metadata_problem" and line.startswith("| `"):
            problem_kinds += re.findall(r"`([a-z-]+)`", line.split("|")[1])
    assert tuple(problem_kinds) == cm.PROBLEM_KINDS
    make_dir(tmp_path, segments={0: b"".join(story())})
    printed: dict[str, set[str]] = {}
    for records in [*real.values(), decode(tmp_path)]:
        for r in records:
            printed.setdefault(r["kind"], set()).update(k for k in r if k != "kind")
    assert "broker_config" in printed and "metadata_problem" in printed
    assert {k: documented.get(k) for k in printed} == printed


def _batches(data: bytes) -> list[tuple[int, int]]:
    """(position, size) of each batch of a valid log."""
    out = []
    pos = 0
    while pos < len(data):
        size = 12 + int.from_bytes(data[pos + 8 : pos + 12], "big")
        out.append((pos, size))
        pos += size
    return out


@pytest.mark.parametrize("reseal", [True, False], ids=["resealed-crc", "raw"])
def test_fuzzed_real_log_never_crashes(corpus: Path, tmp_path: Path, reseal: bool) -> None:
    """Random byte changes in a real metadata log (nurlan's), with the CRC resealed (so the record contents reach the
    decoder) or not: always complete output, every problem naming the segment; never an exception."""
    import random

    src = (corpus / NURLAN / "kafka1" / "__cluster_metadata-0" / "00000000000000000000.log").read_bytes()
    batches = _batches(src)
    rng = random.Random(18)
    mdir = make_dir(tmp_path, segments={0: src})
    seg = mdir / "00000000000000000000.log"
    seen: set[str] = set()
    for _ in range(300):
        data = bytearray(src)
        pos, size = rng.choice(batches)
        for _ in range(rng.choice([1, 1, 2, 8])):
            i = pos + rng.randrange(21 if reseal else 0, size)
            data[i] = rng.choice([0, 0xFF, data[i] ^ (1 << rng.randrange(8)), rng.randrange(256)])
        if reseal:
            data[pos + 17 : pos + 21] = probe.crc32c(bytes(data[pos + 21 : pos + size])).to_bytes(4, "big")
        if rng.random() < 0.2:
            data = data[: rng.randrange(len(data))]
        seg.write_bytes(bytes(data))
        records = decode(tmp_path)
        assert records[-1]["complete"] is True
        for p in problems(records):
            assert p["file"] == str(seg) and p["message"].startswith(str(seg))
            seen.add(p["problem"])
    assert seen >= ({"undecodable"} if reseal else {"crc"})


def test_an_oversized_transaction_is_dropped_with_a_problem(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cm, "TXN_RECORDS_MAX", 3)
    ids = [TOPIC_A, TOPIC_B, TOPIC_C, TOPIC_D]
    values = [ke.metadata_value("BeginTransactionRecord")] + [topic(f"t{i}", tid) for i, tid in enumerate(ids)]
    values.append(ke.metadata_value("EndTransactionRecord"))
    make_dir(tmp_path, segments={0: ke.data_batch(0, values)})
    records = decode(tmp_path)
    ps = problems(records)
    assert [(p["problem"], p["offset"]) for p in ps] == [("undecodable", 4), ("inconsistent", 5)]
    assert "begun at offset 0 holds more than 3 records; dropped" in ps[0]["message"]
    assert set(topics(records)) == {"t3"} and records[0]["open_transaction"] is False


def test_a_damaged_newest_snapshot_gives_way_to_the_one_before(tmp_path: Path) -> None:
    older = snapshot_bytes([topic("old", TOPIC_A)], epoch=1)
    newer = bytearray(snapshot_bytes([topic("new", TOPIC_B), topic("newer", TOPIC_C)], epoch=2))
    newer[-30] ^= 0xFF  # inside the footer batch: a CRC failure
    log = ke.data_batch(0, [topic("zero", TOPIC_D)]) + ke.data_batch(1, [topic("one", TOPIC_E)])
    mdir = make_dir(tmp_path, segments={0: log}, snapshots={(1, 1): older, (3, 2): bytes(newer)})
    records = decode(tmp_path)
    head = records[0]
    assert (head["snapshot"], head["snapshot_end_offset"], head["snapshot_epoch"]) == (
        "00000000000000000001-0000000001.checkpoint",
        1,
        1,
    )
    assert set(topics(records)) == {"old", "one"}  # the older snapshot, then the log from its end offset
    (p,) = problems(records)
    assert (p["problem"], p["file"]) == ("crc", str(mdir / "00000000000000000003-0000000002.checkpoint"))
    # Kafka loads only its newest snapshot: the node cannot load it, and the facts here are older ones, not whole
    assert "the snapshot is unusable" in p["message"] and "fails to load a corrupt one" in p["message"]
    assert "truncates" not in p["message"]
    assert "come from the older snapshot 00000000000000000001-0000000001.checkpoint instead" in p["message"]
    assert head["snapshot_fallback"] == ["00000000000000000003-0000000002.checkpoint"]
    assert head["image_complete"] is False and head["snapshot_gap"] is False and head["error"] is None
    assert cm.log_position(head) == (False, 1, 2)
    # when no snapshot is intact, the newest is used as far as it is valid: not whole either
    (mdir / "00000000000000000001-0000000001.checkpoint").write_bytes(older[:-10])
    records = decode(tmp_path)
    head = records[0]
    assert head["snapshot"] == "00000000000000000003-0000000002.checkpoint"
    assert set(topics(records)) == {"new", "newer"}
    assert sorted(p["problem"] for p in problems(records)) == ["crc", "torn-tail"]
    assert head["snapshot_fallback"] == [] and head["image_complete"] is False
    assert cm.log_position(head)[0] is False
    (crc,) = [p for p in problems(records) if p["problem"] == "crc"]
    assert "no snapshot is intact: the facts here come from this one as far as it is valid" in crc["message"]
    (torn,) = [p for p in problems(records) if p["problem"] == "torn-tail"]
    assert "the snapshot is incomplete, unusable" in torn["message"]


def test_a_flipped_byte_in_kscans_newest_snapshot_is_not_whole(corpus: Path, tmp_path: Path) -> None:
    """The review's case: kscan's newest snapshot with one byte flipped; the snapshot before it (end offset 5071582)
    is whole, but the facts from it are older than the node's own: never the freshest on a tie, or silently."""
    shutil.copytree(corpus / KSCAN / "kafka-1" / cm.METADATA_DIR_NAME, tmp_path / cm.METADATA_DIR_NAME)
    newest = tmp_path / cm.METADATA_DIR_NAME / "00000000000005072231-0000000193.checkpoint"
    newest.chmod(0o644)
    data = bytearray(newest.read_bytes())
    data[5000] ^= 0x01
    newest.write_bytes(bytes(data))
    records = decode(tmp_path)
    head = records[0]
    assert (head["snapshot"], head["snapshot_end_offset"]) == ("00000000000005071582-0000000193.checkpoint", 5071582)
    assert head["snapshot_fallback"] == [newest.name] and head["image_complete"] is False
    assert cm.log_position(head) == (False, 193, 5071582)
    (p,) = problems(records)
    assert p["problem"] == "crc" and p["file"] == str(newest) and "unusable" in p["message"]


def test_segments_wholly_below_the_snapshot_are_not_opened(tmp_path: Path) -> None:
    """Segment 0 ends below the snapshot's end offset (segment 3 starts at 3): nothing in it is needed, so it is not
    opened (here it could not be: a directory), and the replay goes on with segment 3."""
    snap = snapshot_bytes([topic("t", TOPIC_A)], epoch=1)
    seg3 = ke.data_batch(3, [topic("u", TOPIC_B)], epoch=1)
    mdir = make_dir(tmp_path, segments={3: seg3}, snapshots={(4, 1): snap})
    (mdir / "00000000000000000000.log").mkdir()
    records = decode(tmp_path)
    head = records[0]
    assert problems(records) == [] and head["image_complete"] is True
    assert (head["log_start_offset"], head["log_end_offset"]) == (0, 4)
    assert set(topics(records)) == {"t"}  # u (offset 3) is below the snapshot's end offset
    (mdir / "00000000000000000003.log").write_bytes(seg3 + ke.data_batch(4, [topic("v", TOPIC_C)], epoch=1))
    records = decode(tmp_path)
    assert problems(records) == [] and set(topics(records)) == {"t", "v"}
    assert cm.log_position(records[0]) == (True, 1, 5)


def _stale_listdir(monkeypatch: pytest.MonkeyPatch, mdir: Path, log_bases: tuple[int, ...], times: int) -> list[int]:
    """os.listdir of mdir gives a stale listing the first ``times`` calls (files Kafka renamed meanwhile): snapshot
    2's checkpoint, quorum-state and the log segments of ``log_bases``."""
    stale = ["00000000000000000002-0000000001.checkpoint", "quorum-state"]
    stale += [probe.segment_file_name(b, "log") for b in log_bases]
    real_listdir = os.listdir
    calls = [0]

    def listdir(path: Any = ".") -> list[str]:
        if os.path.abspath(str(path)) == str(mdir):
            calls[0] += 1
            if calls[0] <= times:
                return list(stale)
        return real_listdir(path)

    monkeypatch.setattr(cm.os, "listdir", listdir)
    return calls


def test_a_segment_deleted_during_the_read_lists_the_dir_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Listed: snapshot 2, segments 0, 4, 6. Then Kafka wrote snapshot 6 and renamed segments 0 and 4 .deleted: the
    replay meets segment 0 gone, lists the dir again, and replays snapshot 6 and segment 6."""
    old = snapshot_bytes([topic("old", TOPIC_A)], epoch=1)
    new = snapshot_bytes([topic("old", TOPIC_A), topic("new", TOPIC_B)], epoch=1)
    mdir = make_dir(
        tmp_path, segments={6: ke.data_batch(6, [topic("later", TOPIC_C)])}, snapshots={(2, 1): old, (6, 1): new}
    )
    (mdir / "00000000000000000000.log.deleted").write_bytes(b"gone")
    calls = _stale_listdir(monkeypatch, mdir, (0, 4, 6), times=1)
    records = decode(tmp_path)
    head = records[0]
    assert calls[0] == 2
    assert problems(records) == [] and head["image_complete"] is True and head["log_tail_error"] is None
    assert head["snapshot"] == "00000000000000000006-0000000001.checkpoint"
    assert set(topics(records)) == {"old", "new", "later"}
    assert cm.log_position(head) == (True, 1, 7)


def test_a_needed_segment_gone_twice_leaves_the_image_not_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same, but the second listing is stale as well: the replay stops at the missing segment, names it, and the
    image is not whole (before: the replay stopped silently, error null, and the stale image counted as whole)."""
    old = snapshot_bytes([topic("old", TOPIC_A)], epoch=1)
    mdir = make_dir(
        tmp_path,
        segments={2: ke.data_batch(2, [topic("two", TOPIC_B)]), 6: ke.data_batch(6, [topic("later", TOPIC_C)])},
        snapshots={(2, 1): old},
    )
    calls = _stale_listdir(monkeypatch, mdir, (2, 4, 6), times=2)
    records = decode(tmp_path)
    head = records[0]
    assert calls[0] == 2
    seg4 = str(mdir / "00000000000000000004.log")
    (p,) = problems(records)
    assert (p["problem"], p["file"], p["offset"]) == ("unreadable", seg4, None)
    assert "the image stops at offset 3" in p["message"] and "(1 later segment(s)) are not replayed" in p["message"]
    assert head["image_complete"] is False and head["log_tail_error"] == seg4 + " cannot be read"
    assert set(topics(records)) == {"old", "two"}
    assert cm.log_position(head)[0] is False


@pytest.mark.parametrize("node", ["kafka1", "kafka2", "kafka3"])
def test_greenlemon_whole_log_replay_equals_kafkas_snapshot_plus_tail(corpus: Path, tmp_path: Path, node: str) -> None:
    """greenlemon's logs start at offset 0: replaying all 30,000-odd records without the snapshot gives exactly the
    image of Kafka's own snapshot plus the log after it (partition and leader epochs, ISRs, fencing, configs), which
    checks the replay rules against what Kafka itself wrote."""
    src = corpus / GREENLEMON / node / cm.METADATA_DIR_NAME
    dst = tmp_path / cm.METADATA_DIR_NAME
    shutil.copytree(src, dst)
    for p in dst.glob("*.checkpoint"):
        p.unlink()
    with_snapshot, whole = decode(src), decode(dst)
    assert whole[0]["snapshot"] is None and whole[0]["records_replayed"] > 30000 and problems(whole) == []

    def image(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [r for r in records if r["kind"] in ("broker", "topic", "partition_state", "broker_config")]

    assert image(whole) == image(with_snapshot)
    assert whole[0]["last_applied_offset"] == with_snapshot[0]["last_applied_offset"]


def _python36() -> str | None:
    """A real Python 3.6 (the oldest a controller may have), if this machine has one."""
    candidates = [os.environ.get("FLEET_DOCTOR_PYTHON36", "")]
    candidates += sorted(str(p) for p in Path.home().glob(".pyenv/versions/3.6*/bin/python3.6"))
    candidates.append(shutil.which("python3.6") or "")
    for c in candidates:
        if c and subprocess.run([c, "-c", "import sys; assert sys.version_info[:2] == (3, 6)"]).returncode == 0:
            return c
    return None


@pytest.mark.parametrize(
    ("sample", "node"), [(GREENLEMON, "kafka1"), (KSCAN, "kafka-1"), (LDIPOC, "kraft-combined-logs")]
)
def test_bundle_runs_on_python36(corpus: Path, sample: str, node: str) -> None:
    py36 = _python36()
    if py36 is None:
        pytest.skip("no Python 3.6 on this machine (set FLEET_DOCTOR_PYTHON36)")
    path = corpus / sample / node
    res = subprocess.run([py36, "-", str(path)], input=cm.bundle(), capture_output=True, cwd="/", env={})
    assert res.returncode == 0 and res.stderr == b"", res.stderr
    assert same_but_clock(res.stdout, cm.format_records(decode(path)).encode("utf-8"))
