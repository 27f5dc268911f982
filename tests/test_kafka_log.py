"""The lab's file writers (fleet_lab.kafka_files) against genuine Kafka files and independent readers."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import pytest

from fleet_doctor.probe import parse_offset_checkpoint, valid_topic_id
from fleet_lab.kafka_files import (
    KafkaFeatures,
    PartitionLogWriter,
    Record,
    encode_leader_epoch_checkpoint,
    encode_legacy_message,
    encode_offset_checkpoint,
    encode_partition_metadata,
    encode_v2_batch,
    random_topic_id,
    recover_segment,
)
from harness.kafka_ref import ref_batches, ref_crc32c, ref_v2_batch

THILLAI = "zk-3.9-3broker-thillai"


def test_partition_metadata_and_leader_epoch_bytes_equal_the_corpus(corpus: Path) -> None:
    part = corpus / THILLAI / "kafka-logs-1" / "my-topic-2"
    assert encode_partition_metadata("KheAqUg2T_C_ZwEhjgxjzw") == (part / "partition.metadata").read_bytes()
    assert encode_leader_epoch_checkpoint([(0, 0)]) == (part / "leader-epoch-checkpoint").read_bytes()


def test_offset_checkpoint_round_trips_through_kafkas_framing(corpus: Path) -> None:
    src = corpus / THILLAI / "kafka-logs-1" / "replication-offset-checkpoint"
    entries, _ = parse_offset_checkpoint(src.read_bytes(), str(src))
    data = encode_offset_checkpoint([tuple(e) for e in entries])
    assert data == src.read_bytes()  # the same lines in the same order give the same bytes


def test_v2_batches_of_the_corpus_reencode_byte_for_byte(corpus: Path) -> None:
    data = (corpus / THILLAI / "kafka-logs-1" / "my-topic-2" / "00000000000000000000.log").read_bytes()
    batches = ref_batches(data)
    assert batches
    for start, size in batches:
        raw = data[start : start + size]
        b = ref_v2_batch(raw)
        assert b["attributes"] == 0
        records = [Record(ts, k, v) for ts, _, k, v in b["records"]]
        again = encode_v2_batch(
            b["base_offset"],
            records,
            b["leader_epoch"],
            producer_id=b["producer_id"],
            producer_epoch=b["producer_epoch"],
            base_sequence=b["base_sequence"],
        )
        assert again == raw


def test_v1_messages_of_the_corpus_reencode_byte_for_byte(corpus: Path) -> None:
    data = (corpus / "zk-0.10-v1format-3zk-xpx" / "kafka-logs" / "topic1-0" / "00000000000000000000.log").read_bytes()
    checked = 0
    for start, size in ref_batches(data):
        raw = data[start : start + size]
        offset, _, _, magic, attributes = struct.unpack_from(">qiIbb", raw)
        if magic != 1 or attributes != 0:
            continue
        (ts,) = struct.unpack_from(">q", raw, 18)
        (klen,) = struct.unpack_from(">i", raw, 26)
        key = None if klen < 0 else raw[30 : 30 + klen]
        vpos = 30 + max(klen, 0)
        (vlen,) = struct.unpack_from(">i", raw, vpos)
        value = None if vlen < 0 else raw[vpos + 4 : vpos + 4 + vlen]
        assert encode_legacy_message(offset, 1, Record(ts, key, value)) == raw
        checked += 1
    assert checked > 0


@pytest.mark.parametrize("version", ["0.8.2.2", "0.10.0.1", "0.10.2.1", "1.1.1", "2.8.2", "3.9.0"])
def test_writer_output_is_valid_kafka_for_each_version(tmp_path: Path, version: str) -> None:
    f = KafkaFeatures.of(version)
    w = PartitionLogWriter(tmp_path / "t-0", f, segment_bytes=16384)
    for i in range(400):
        w.append(
            [Record(1_700_000_000_000 + i * 10 + j, b"k", b"v" * 40) for j in range(1 + i % 3)], leader_epoch=i // 200
        )
    state = w.close()
    d = tmp_path / "t-0"
    logs = sorted(d.glob("*.log"))
    assert len(logs) > 2
    assert bool(list(d.glob("*.timeindex"))) == f.has_time_index
    assert (d / "leader-epoch-checkpoint").exists() == f.has_leader_epoch_checkpoint
    next_offset = 0
    entries_checked = 0
    for log in logs:
        base = int(log.name[:20])
        assert base == next_offset  # segments are contiguous
        data = log.read_bytes()
        batches = ref_batches(data)
        assert sum(s for _, s in batches) == len(data)
        starts = {}
        for start, size in batches:
            raw = data[start : start + size]
            magic = raw[16]
            assert magic == f.magic
            (stored,) = struct.unpack_from(">I", raw, 17 if magic == 2 else 12)
            if magic == 2:
                assert stored == ref_crc32c(raw[21:])
                b = ref_v2_batch(raw)
                first, last = b["base_offset"], b["base_offset"] + b["last_offset_delta"]
            else:
                assert stored == zlib.crc32(raw[16:]) & 0xFFFFFFFF
                first = last = struct.unpack_from(">q", raw)[0]
            starts[start] = (first, last)
            next_offset = last + 1
        idx = (d / f"{base:020d}.index").read_bytes()
        assert len(idx) % 8 == 0
        for n in range(len(idx) // 8):
            rel, pos = struct.unpack_from(">ii", idx, n * 8)
            first, last = starts[pos]  # every entry points at a batch start ...
            assert first <= base + rel <= last  # ... whose offsets contain it
            entries_checked += 1
    assert state.log_end_offset == next_offset
    assert entries_checked >= len(logs)
    if f.has_leader_epoch_checkpoint:
        assert (d / "leader-epoch-checkpoint").read_text() == f"0\n2\n0 0\n1 {state.leader_epochs[1][1]}\n"


def test_recovery_rebuilds_the_indexes_the_append_path_wrote_and_truncates_a_torn_tail(tmp_path: Path) -> None:
    f = KafkaFeatures.of("3.6.2")
    w = PartitionLogWriter(tmp_path / "t-0", f, segment_bytes=1 << 20)
    for i in range(300):
        w.append([Record(1_700_000_000_000 + i, b"k", b"x" * 100)])
    w.close()
    d = tmp_path / "t-0"
    idx, tidx, log = (d / f"{0:020d}.{ext}" for ext in ("index", "timeindex", "log"))
    written = idx.read_bytes(), tidx.read_bytes()
    size = log.stat().st_size
    with open(log, "ab") as out:
        out.write(log.read_bytes()[:30])  # half a batch header
    idx.unlink()
    tidx.write_bytes(b"\0" * 120)
    res = recover_segment(d, 0, f)
    assert res.truncated_bytes == 30 and res.next_offset == 300
    assert log.stat().st_size == size
    assert (idx.read_bytes(), tidx.read_bytes()) == written


def test_random_topic_ids_are_kafka_uuids() -> None:
    ids = {random_topic_id() for _ in range(200)}
    assert len(ids) == 200
    assert all(valid_topic_id(i) and not i.startswith("-") for i in ids)


def test_the_probes_crc32c_is_the_bit_by_bit_one_on_every_length_and_streamed() -> None:
    """``probe.crc32c`` takes eight bytes a step (slicing-by-8) and the rest one at a time: equal to the bit-by-bit
    reference on lengths 0-40 and on a 64 KiB one, from bytes, a bytearray or a memoryview slice, and continued."""
    import random

    from fleet_doctor.probe import crc32c

    rng = random.Random(30)
    for n in [*range(41), 65536 + 3]:
        data = bytes(rng.randrange(256) for _ in range(n))
        want = ref_crc32c(data)
        assert crc32c(data) == crc32c(bytearray(data)) == crc32c(memoryview(b"x" + data)[1:]) == want, n
        cut = n // 3
        assert crc32c(data[cut:], crc32c(data[:cut])) == want, n  # a stream continued
    assert crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value
