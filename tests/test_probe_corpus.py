"""The probe on genuine Kafka data dirs. Every expected number comes from the corpus MANIFEST.md
(decoded there with independent tools) or from file sizes computed here, never from probe output."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from harness.corpus import by_kind, partition, run_probe, segments

Records = list[dict[str, Any]]


@pytest.fixture(scope="module")
def deep(corpus: Path) -> dict[str, Records]:
    """Deep probe with CRC verification, one run per sample, keyed by 'sample/logdir'."""
    out: dict[str, Records] = {}
    for meta in sorted(corpus.glob("*/**/meta.properties")):
        logdir = meta.parent
        out[str(logdir.relative_to(corpus))] = run_probe(logdir, deep=True, verify_crc=True)
    return out


@pytest.fixture(scope="module")
def meta(corpus: Path) -> dict[str, Records]:
    out: dict[str, Records] = {}
    for m in sorted(corpus.glob("*/**/meta.properties")):
        out[str(m.parent.relative_to(corpus))] = run_probe(m.parent)
    return out


def logdir_record(records: Records) -> dict[str, Any]:
    (rec,) = by_kind(records, "logdir")
    return rec


def files(records: Records, file_type: str) -> Records:
    return [r for r in records if r["kind"] == "file" and r["file_type"] == file_type]


def test_all_32_log_dirs_found(deep: dict[str, Records]) -> None:
    assert len(deep) == 32
    for records in deep.values():
        assert records[0]["kind"] == "probe" and records[0]["schema_version"] == 1
        assert records[-1]["kind"] == "probe_end" and records[-1]["complete"] is True


def test_corpus_has_no_damage_the_manifest_does_not_explain(deep: dict[str, Records]) -> None:
    """MANIFEST: every batch CRC is valid, every index entry points at a batch start containing its
    offset, sizes are multiples of the entry size, entries monotonic, nothing untrimmed."""
    segs = [s for records in deep.values() for s in by_kind(records, "segment")]
    assert len(segs) > 300
    for s in segs:
        where = f"{s['path']} base {s['base_offset']}"
        assert s["error"] is None, where
        for idx in ("index", "timeindex"):
            if s[f"has_{idx}"]:
                assert s[f"{idx}_remainder"] == 0, where
                assert s[f"{idx}_zero_tail_entries"] == 0, where
                assert s[f"{idx}_monotonic"] in (True, None), where
        if s["has_log"]:
            assert s["crc_errors"] == 0 and s["torn_tail"] is False and s["offset_errors"] == 0, where
            assert s["valid_bytes"] == s["log_bytes"], where
            assert s["crc_checked"] == s["batch_count"], where
            if s["has_index"]:
                assert s["index_not_batch_start"] == 0, where
                assert s["index_offset_before_batch"] == 0, where
                assert s["index_offset_after_batch"] == 0, where
                assert s["index_beyond_log"] == 0, where
    errors = [r for records in deep.values() for r in records if r.get("error")]
    assert errors == []


def test_index_entries_equal_size_over_entry_size_for_trimmed_indexes(corpus: Path, meta: dict[str, Records]) -> None:
    """All corpus indexes are trimmed, so real entries = file size / entry size (computed with os.stat)."""
    checked = 0
    for records in meta.values():
        for s in by_kind(records, "segment"):
            for idx, esize in (("index", 8), ("timeindex", 12)):
                if s[f"has_{idx}"]:
                    size = os.stat(Path(s["path"]) / f"{s['base_offset']:020d}.{idx}").st_size
                    assert s[f"{idx}_bytes"] == size
                    assert s[f"{idx}_entries"] == size // esize
                    checked += 1
    assert checked > 250


def test_zk31_aryan_totals_and_topic_ids(deep: dict[str, Records]) -> None:
    r = deep["zk-3.1-single-aryan/kafka-logs"]
    parts = by_kind(r, "partition")
    assert len(parts) == 34
    assert sum(p["batch_count"] for p in parts) == 4655
    assert sum(p["record_count"] for p in parts) == 6996
    assert sum(1 for s in by_kind(r, "segment") if s["index_bytes"]) == 14
    assert sum(1 for s in by_kind(r, "segment") if s["timeindex_bytes"]) == 26
    snaps = files(r, "producer_snapshot")
    assert len(snaps) == 29 and all(f["bytes"] == 10 for f in snaps)
    (d0,) = segments(r, "design-0")
    assert (d0["index_bytes"], d0["index_entries"]) == (104, 13)
    assert (d0["index_last_offset"], d0["index_last_position"]) == (427, 54128)
    assert partition(r, "design-0")["topic_id"] == "JWzPWgOsTDqCV2TLEX2N3g"
    for p in range(3):
        assert partition(r, f"design1-{p}")["topic_id"] == "RJI454yPScCX7IO2JuPZvQ"
    assert [s["base_offset"] for s in segments(r, "new_topic-0")] == [2]
    assert [s["base_offset"] for s in segments(r, "new_topic-2")] == [1]
    ld = logdir_record(r)
    assert ld["clean_shutdown"] is True and ld["kraft"] is False
    assert ld["meta"]["broker_id"] == 0 and ld["meta"]["cluster_id"] == "4fi2MkU0Ql2L0cPRncY20Q"
    assert ld["checkpoints"]["log-start-offset-checkpoint"] == {"entries": 0, "error": None}


def test_zk33_geraldine_cleaner_leftovers(deep: dict[str, Records]) -> None:
    r = deep["zk-3.3-cleaner-swap-geraldine/kafka-logs"]
    left = {Path(f["path"]).name: f for f in files(r, "segment_leftover")}
    assert set(left) == {
        "00000000000000000000.log.swap",
        "00000000000000000000.index.swap",
        "00000000000000000000.timeindex.cleaned",
    }
    assert left["00000000000000000000.log.swap"]["bytes"] == 230
    assert left["00000000000000000000.log.swap"]["leftover"] == "swap"
    assert left["00000000000000000000.index.swap"]["bytes"] == 0
    assert left["00000000000000000000.timeindex.cleaned"]["bytes"] == 12
    s0, s15 = segments(r, "__consumer_offsets-18")
    assert (s0["base_offset"], s0["log_bytes"], s0["batch_count"]) == (0, 2849, 15)
    assert (s0["first_offset"], s0["last_offset"]) == (0, 14)
    assert (s0["index_bytes"], s0["timeindex_bytes"], s0["timeindex_entries"]) == (0, 12, 1)
    assert (s15["base_offset"], s15["log_bytes"], s15["first_offset"], s15["last_offset"]) == (15, 799, 15, 17)
    p = partition(r, "__consumer_offsets-18")
    assert (p["high_watermark"], p["recovery_point"], p["cleaner_offset"]) == (18, 3, 0)
    assert p["leftover_files"] == 3 and p["log_end_offset"] == 18
    hello = partition(r, "HelloTopic-0")
    assert (hello["high_watermark"], hello["recovery_point"], hello["log_end_offset"]) == (7, 6, 7)
    assert hello["record_count"] == 1 and hello["log_start_segment_offset"] == 6
    cleaner = [f for f in files(r, "offset_checkpoint") if f["checkpoint"] == "cleaner-offset-checkpoint"]
    assert cleaner[0]["entries"] == [["__consumer_offsets", 18, 0]]
    assert logdir_record(r)["clean_shutdown"] is False


def test_zk25_sagarrao_v2_uncompressed_and_checkpoints(deep: dict[str, Records]) -> None:
    b1 = deep["zk-2.5-multinode-sagarrao/kafka-logs-1"]
    p = partition(b1, "my_topic-1")
    assert p["record_count"] == 691 and p["log_end_offset"] == 691 and p["topic_id"] is None
    (s,) = segments(b1, "my_topic-1")
    assert (s["index_bytes"], s["index_entries"], s["index_last_offset"], s["index_last_position"]) == (
        80,
        10,
        681,
        44847,
    )
    rp = [f for f in files(b1, "offset_checkpoint") if f["checkpoint"] == "recovery-point-offset-checkpoint"]
    assert ["first_topic", 0, 64] in rp[0]["entries"]
    b2 = deep["zk-2.5-multinode-sagarrao/kafka-logs-2"]
    co = partition(b2, "__consumer_offsets-48")
    assert (co["batch_count"], co["record_count"]) == (867, 3867)
    assert co["leader_epochs"] == [[0, 0], [3, 2735], [8, 3867]]
    (s,) = segments(b2, "__consumer_offsets-48")
    assert (s["index_bytes"], s["index_entries"]) == (488, 61)
    b3 = deep["zk-2.5-multinode-sagarrao/kafka-logs-3"]
    ld3 = logdir_record(b3)
    assert ld3["meta"]["cluster_id"] == "DX5lAsjQTsqEsGCyw5f5lA"
    assert logdir_record(b2)["meta"]["cluster_id"] == "dqc8hGyvQ4yospB768Rz2w"
    assert all(v == {"entries": 0, "error": None} for v in ld3["checkpoints"].values())
    assert len(ld3["checkpoints"]) == 4


def test_zk28_snappy(deep: dict[str, Records]) -> None:
    r = deep["zk-2.8-snappy-seanorth/kafka-logs"]
    p = partition(r, "some-topic-0")
    assert (p["batch_count"], p["record_count"], p["log_end_offset"]) == (9, 9, 9)
    assert p["topic_id"] == "vqSmEBIuSwm33bh8npzjMw"
    (s,) = segments(r, "some-topic-0")
    assert s["log_bytes"] == 1989 and s["codecs"] == ["snappy"] and s["magic"] == [2]
    assert (s["first_offset"], s["last_offset"]) == (0, 8)
    assert partition(r, "__consumer_offsets-16")["record_count"] == 69
    assert partition(r, "test-topic-0")["partition_metadata_present"] is False


def test_gzip_and_leader_epochs(deep: dict[str, Records]) -> None:
    r = deep["zk-gzip-leaderepochs-biggerbrain/data"]
    p = partition(r, "lsx1-0")
    assert (p["batch_count"], p["record_count"], p["log_end_offset"]) == (14, 14, 14)
    assert p["leader_epochs"] == [[0, 0], [1, 9], [3, 10], [5, 12], [6, 13], [7, 14]]
    assert p["topic_id"] == "nigi0dJNRASJVYh5eRn0Vg" and p["high_watermark"] == 14
    (s,) = segments(r, "lsx1-0")
    assert s["log_bytes"] == 1398 and s["codecs"] == ["gzip", "none"] and s["max_leader_epoch"] == 6


def test_kafka_0_10_magic_v1(deep: dict[str, Records]) -> None:
    r = deep["zk-0.10-v1format-3zk-xpx/kafka-logs"]
    t = partition(r, "TEST-TOPIC-0")
    assert t["record_count"] == 21211 and t["log_end_offset"] == 21211
    (s,) = segments(r, "TEST-TOPIC-0")
    assert s["log_bytes"] == 1315082 and s["magic"] == [1] and s["crc_checked"] == 21211
    assert partition(r, "foo-0")["record_count"] == 204
    assert partition(r, "topic1-0")["record_count"] == 5
    co = partition(r, "__consumer_offsets-40")
    assert (co["record_count"], co["log_end_offset"], co["high_watermark"]) == (860, 860, 856)
    assert co["leader_epoch_present"] is False and co["leader_epochs"] is None
    ld = logdir_record(r)
    assert ld["meta"]["cluster_id"] is None and ld["meta"]["broker_id"] == 0
    assert "log-start-offset-checkpoint" not in ld["checkpoints"]


def test_vietstock_identical_replicas_and_epochs(deep: dict[str, Records]) -> None:
    for b in ("kafka1", "kafka2", "kafka3"):
        r = deep[f"zk-3broker-3zk-vietstock/{b}"]
        p = partition(r, "__consumer_offsets-33")
        assert (p["batch_count"], p["record_count"], p["log_end_offset"]) == (110, 110, 110)
        (s,) = segments(r, "__consumer_offsets-33")
        assert s["log_bytes"] == 26439
        assert p["topic_id"] == "UlXvXfULSEW-FBWPAe2dzA"
    k1 = partition(deep["zk-3broker-3zk-vietstock/kafka1"], "__consumer_offsets-33")
    assert k1["leader_epochs"] == [[0, 0], [4, 13], [5, 15], [9, 34], [10, 35], [12, 110]]
    k3 = partition(deep["zk-3broker-3zk-vietstock/kafka3"], "__consumer_offsets-33")
    assert k3["leader_epochs"][-1] == [11, 110]
    (s,) = segments(deep["zk-3broker-3zk-vietstock/kafka2"], "__consumer_offsets-33")
    assert (s["index_bytes"], s["index_entries"], s["index_last_offset"], s["index_last_position"]) == (
        40,
        5,
        101,
        24871,
    )
    assert (s["timeindex_bytes"], s["timeindex_entries"]) == (84, 7)
    sd = partition(deep["zk-3broker-3zk-vietstock/kafka3"], "stock-data-0")
    assert sd["leader_epochs"] == [[0, 0], [13, 30], [15, 3244], [17, 4851]]
    assert (sd["recovery_point"], sd["high_watermark"]) == (3244, 40205)
    assert sd["producer_snapshots"] == [4851]


def test_kraft_32_replicated(deep: dict[str, Records]) -> None:
    for b in ("kafka1", "kafka2", "kafka3"):
        r = deep[f"kraft-3.2-3broker-replicated-nurlan/{b}"]
        p = partition(r, "iot-sensors-0")
        assert p["record_count"] == 755 and p["topic_id"] == "6-tydMKdQbO5RazHt_Y8-Q"
        (s,) = segments(r, "iot-sensors-0")
        assert (s["index_bytes"], s["timeindex_bytes"]) == (328, 504)
        assert logdir_record(r)["kraft"] is True
        assert logdir_record(r)["meta"]["cluster_id"] == "EP6hyiddQNW5FPrAvR9kWw"
        assert partition(r, "__cluster_metadata-0")["record_count"] == 188


def test_kraft_35_metadata_log_and_single_record_timeindex(deep: dict[str, Records]) -> None:
    k1 = deep["kraft-3.5-3broker-greenlemon/kafka1"]
    assert partition(k1, "__cluster_metadata-0")["log_end_offset"] == 30638
    assert partition(deep["kraft-3.5-3broker-greenlemon/kafka2"], "__cluster_metadata-0")["log_end_offset"] == 30637
    (s,) = segments(k1, "__cluster_metadata-0")
    assert (s["index_bytes"], s["index_entries"], s["index_last_offset"], s["index_last_position"]) == (
        4000,
        500,
        30634,
        2098159,
    )
    assert s["control_batches"] > 0
    snaps = [f for f in files(k1, "kraft_snapshot")]
    assert [(f["end_offset"], f["epoch"]) for f in snaps] == [(28869, 189)]
    qs = files(k1, "quorum_state")[0]["content"]
    assert (qs["leaderId"], qs["leaderEpoch"]) == (1, 190)
    assert partition(k1, "__cluster_metadata-0")["topic_id"] == "AAAAAAAAAAAAAAAAAAAAAQ"
    (t,) = segments(deep["kraft-3.5-3broker-greenlemon/kafka3"], "payment-create-request-0")
    assert (t["timeindex_bytes"], t["timeindex_entries"]) == (12, 1)
    assert (t["timeindex_last_timestamp"], t["timeindex_last_offset"]) == (1737558122027, 0)


def test_kraft_40_multisegment_compacted_and_index_without_log(deep: dict[str, Records]) -> None:
    r = deep["kraft-4.0-multiseg-kscan/kafka-1"]
    s0 = segments(r, "__consumer_offsets-24")[0]
    assert (s0["base_offset"], s0["batch_count"], s0["first_offset"], s0["last_offset"]) == (0, 17, 2606, 2676)
    assert [s["base_offset"] for s in segments(r, "__consumer_offsets-24")][1] == 2677
    meta = next(s for s in segments(r, "__cluster_metadata-0") if s["base_offset"] == 4076486)
    assert meta["has_log"] is False and meta["log_bytes"] is None
    assert (meta["index_bytes"], meta["index_entries"]) == (111304, 13913)
    # MANIFEST gives the raw entry (relative offset 794648); the probe reports absolute offsets
    assert (meta["index_last_offset"], meta["index_last_position"]) == (4076486 + 794648, 57131090)
    assert meta["timeindex_bytes"] == 166968
    assert len(files(r, "kraft_snapshot")) == 39
    assert len(partition(r, "__cluster_metadata-0")["leader_epochs"]) == 13
    cleaner = [f for f in files(r, "offset_checkpoint") if f["checkpoint"] == "cleaner-offset-checkpoint"]
    assert len(cleaner[0]["entries"]) == 9


def test_zk30_tuyen_large_consumer_offsets(deep: dict[str, Records]) -> None:
    r = deep["zk-3.0-3broker-tuyen/kafka"]
    p = partition(r, "__consumer_offsets-13")
    assert (p["batch_count"], p["record_count"]) == (1339, 3093)
    (s,) = segments(r, "__consumer_offsets-13")
    assert s["log_bytes"] == 298526 and s["has_index"] is False
    assert [partition(r, f"my-first-topic-{i}")["record_count"] for i in range(3)] == [11, 12, 7]
    for b in ("kafka", "kafka-1", "kafka-2"):
        rr = deep[f"zk-3.0-3broker-tuyen/{b}"]
        for i in range(5):
            assert partition(rr, f"new-kafka-topic-{i}")["topic_id"] == "tDEzl3uMQ9abySARWhmx4Q"


def test_zk38_matera_indexes_without_logs(deep: dict[str, Records]) -> None:
    r = deep["zk-3.8-3broker-nolog-matera/kafka-1"]
    (s,) = segments(r, "_schemas-0")
    assert s["has_log"] is False
    assert (s["timeindex_bytes"], s["timeindex_entries"]) == (48, 4)
    assert (s["timeindex_last_timestamp"], s["timeindex_last_offset"]) == (1743683117657, 5)
    p = partition(r, "_schemas-0")
    assert p["leader_epochs"] == [[0, 0], [6, 2], [17, 3], [22, 5]]
    assert (p["recovery_point"], p["high_watermark"]) == (6, 6)
    assert p["topic_id"] == "K4XQkgxTQ7CvH4TXGTsiWw"
    assert logdir_record(r)["clean_shutdown_broker_epoch"] == -1
    k3 = deep["zk-3.8-3broker-nolog-matera/kafka-3"]
    assert logdir_record(k3)["clean_shutdown"] is False
    assert all(p["segment_count"] == 0 for p in by_kind(k3, "partition"))


def test_zk26_coby_compaction_and_tmp_checkpoints(deep: dict[str, Records]) -> None:
    r = deep["zk-2.6-compacted-coby/kafka"]
    s0, s56 = segments(r, "__consumer_offsets-21")
    assert (s0["log_bytes"], s0["batch_count"], s0["first_offset"], s0["last_offset"]) == (353, 2, 52, 55)
    assert (s0["index_bytes"], s0["timeindex_bytes"]) == (0, 12)
    assert (s0["timeindex_last_timestamp"], s0["timeindex_last_offset"]) == (1604777978130, 55)
    assert (s56["first_offset"], s56["last_offset"]) == (56, 59)
    assert partition(r, "__consumer_offsets-21")["cleaner_offset"] == 56
    assert partition(r, "__consumer_offsets-21")["producer_snapshots"] == [56, 60]
    assert [segments(r, f"first_topic-{i}")[0]["base_offset"] for i in range(3)] == [4, 3, 1]
    assert [partition(r, f"TOPIC_NAME-{i}")["record_count"] for i in range(3)] == [4, 2, 4]
    tmp = [f for f in files(r, "offset_checkpoint") if f["temporary"]]
    assert sorted(Path(f["path"]).name for f in tmp) == [
        "log-start-offset-checkpoint.tmp",
        "recovery-point-offset-checkpoint.tmp",
    ]


def test_thillai_identical_replicas(deep: dict[str, Records]) -> None:
    for b in ("kafka-logs-0", "kafka-logs-1", "kafka-logs-2"):
        r = deep[f"zk-3.9-3broker-thillai/{b}"]
        p = partition(r, "my-topic-2")
        assert p["record_count"] == 3 and p["topic_id"] == "KheAqUg2T_C_ZwEhjgxjzw"
        assert segments(r, "my-topic-2")[0]["log_bytes"] == 215
    ids = {
        logdir_record(deep[f"zk-3.9-3broker-thillai/{b}"])["meta"]["broker_id"] for b in ("kafka-logs", "kafka-logs-0")
    }
    assert ids == {0}


def test_metadata_mode_never_reads_logs(meta: dict[str, Records]) -> None:
    segs = [s for records in meta.values() for s in by_kind(records, "segment")]
    assert segs and all("batch_count" not in s and "crc_checked" not in s for s in segs)
    parts = [p for records in meta.values() for p in by_kind(records, "partition")]
    assert all("record_count" not in p and "log_end_offset" not in p for p in parts)
