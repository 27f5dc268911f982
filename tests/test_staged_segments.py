"""The staged form of the probe's segment records (fleet_doctor.staged_segments), on real corpus output."""

from __future__ import annotations

import io
import json
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import types as T

from fleet_doctor.detection import SEGMENT_SCHEMA
from fleet_doctor.probe import Probe, discover_logdirs
from fleet_doctor.staged_segments import (
    SEGMENT_PREFIX,
    SEGMENT_TABLE,
    ProbeSplitter,
    load_probe,
    read_records,
    segments_key,
    split_file,
)
from fleet_doctor.store import Store

SPARK_TO_ARROW = {T.LongType(): pa.int64(), T.IntegerType(): pa.int32(), T.StringType(): pa.string(),
                  T.BooleanType(): pa.bool_()}  # fmt: skip


@pytest.fixture(scope="module")
def corpus_output(corpus) -> bytes:
    """The probe's output over every corpus log dir, in deep mode with CRC checks (every segment field) and in
    metadata mode."""
    out = io.StringIO()
    logdirs = discover_logdirs([str(corpus)])
    Probe(out, deep=True, verify_crc=True).run(logdirs)
    Probe(out, deep=False, verify_crc=False).run(logdirs)
    return out.getvalue().encode("utf-8")


def split(
    data: bytes, chunks: list[int] | None = None, block_lines: int = 50_000
) -> tuple[bytes, bytes, ProbeSplitter]:
    js, pqt = io.BytesIO(), io.BytesIO()
    splitter = ProbeSplitter(js, pqt, block_lines=block_lines)
    pos = 0
    for n in chunks or [len(data)]:
        splitter.write(data[pos : pos + n])
        pos += n
    splitter.write(data[pos:])
    splitter.close()
    return js.getvalue(), pqt.getvalue(), splitter


def records(js: bytes, pqt: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in js.splitlines()] + list(read_records(pqt, "test.segments.parquet"))


def test_detection_reads_a_subset_of_the_table_with_the_same_types():
    for field in SEGMENT_SCHEMA.fields:
        assert SEGMENT_TABLE.field(field.name).type == SPARK_TO_ARROW[field.dataType], field.name


def test_every_segment_of_the_corpus_goes_to_parquet_and_comes_back_unchanged(corpus_output):
    original = [json.loads(line) for line in corpus_output.splitlines()]
    segments = [r for r in original if r["kind"] == "segment"]
    assert len(segments) > 600 and any("index_mismatch_examples" in r for r in segments)
    assert any("deep" in r for r in segments), "deep mode's segments without a .log are in the corpus output"
    js, pqt, splitter = split(corpus_output, block_lines=97)  # many blocks, a short last one
    assert splitter.segments == len(segments) and splitter.segments_as_json == 0
    assert b'"kind":"segment"' not in js
    assert pq.read_table(io.BytesIO(pqt)).schema == SEGMENT_TABLE
    back = records(js, pqt)
    assert [r for r in back if r["kind"] != "segment"] == [r for r in original if r["kind"] != "segment"]
    # every field of every record, with its value, in the probe's order; fields a record did not have are None
    got = [r for r in back if r["kind"] == "segment"]
    assert len(got) == len(segments)
    for w, g in zip(segments, got, strict=True):
        assert {k: g[k] for k in w} == w
        assert all(g[k] is None for k in g.keys() - w.keys())


def test_chunk_boundaries_do_not_matter(corpus_output):
    whole = split(corpus_output)
    rng = random.Random(7)
    chunks = [rng.choice((1, 2, 17, 4096, 65536)) for _ in range(400)]
    cut = split(corpus_output, chunks)
    assert cut[0] == whole[0]
    assert pq.read_table(io.BytesIO(cut[1])).equals(pq.read_table(io.BytesIO(whole[1])))


def test_a_segment_line_the_table_cannot_hold_stays_json_verbatim():
    good = b'{"kind":"segment","logdir":"/d","path":"/d/t-0","topic":"t","partition":0,"base_offset":%d}\n'
    odd = [
        b'{"kind":"segment","logdir":"/d","path":"/d/t-0","base_offset":7,"new_field":1}\n',  # a newer probe's field
        b'{"kind":"segment","logdir":"/d","path":"/d/t-0","base_offset":"8"}\n',  # another type
        b'{"kind":"segment","logdir":"/d","path":"/d/t-0","base_offset":9223372036854775808}\n',  # out of range
        b'{"kind":"segment","logdir":"/d","pa\n',  # cut off
        b'{"kind":"segment","logdir":"/d","path":"/d/t-0","base_offset":10} {"kind":"segment","base_offset":11}\n',
    ]
    data = b'{"kind":"probe"}\n' + good % 0 + b"".join(odd) + good % 100 + b'{"kind":"probe_end","complete":true}\n'
    js, pqt, splitter = split(data)
    assert splitter.segments == 2 and splitter.segments_as_json == 5
    assert js == b'{"kind":"probe"}\n{"kind":"probe_end","complete":true}\n' + b"".join(odd)
    assert [r["base_offset"] for r in read_records(pqt, "x")] == [0, 100]


def test_no_segments_and_no_final_newline():
    js, pqt, splitter = split(b'{"kind":"probe"}\n{"kind":"probe_end"}')
    assert js == b'{"kind":"probe"}\n{"kind":"probe_end"}'
    assert splitter.segments == 0 and list(read_records(pqt, "x")) == []


def test_an_unfit_line_is_never_glued_to_a_last_line_without_newline():
    unfit = b'{"kind":"segment","logdir":"/d","path":"/d/t-0","base_offset":1,"new_field":true}\n'
    js, _, splitter = split(b'{"kind":"probe"}\n' + unfit + b'{"kind":"probe_end","complete":true}')
    assert js == b'{"kind":"probe"}\n' + unfit + b'{"kind":"probe_end","complete":true}'
    assert splitter.segments_as_json == 1


def test_one_unfit_line_in_a_big_block_keeps_the_rest_columnar():
    good = b'{"kind":"segment","logdir":"/d","path":"/d/t-0","topic":"t","partition":0,"base_offset":%d}\n'
    lines = [good % i for i in range(5000)]
    lines[3777] = b'{"kind":"segment","logdir":"/d","path":"/d/t-0","base_offset":3777,"new_field":1}\n'
    js, pqt, splitter = split(b"".join(lines))
    assert (splitter.segments, splitter.segments_as_json) == (4999, 1) and js == lines[3777]
    assert [r["base_offset"] for r in read_records(pqt, "x")] == [i for i in range(5000) if i != 3777]


def test_a_failed_stage_leaves_the_parquet_writer_closed():
    js, pqt = io.BytesIO(), io.BytesIO()
    with pytest.raises(RuntimeError, match="probe died"):
        with ProbeSplitter(js, pqt) as splitter:
            splitter.write(b'{"kind":"segment","logdir":"/d","path":"/d/t-0","base_offset":1}\n')
            raise RuntimeError("probe died")
    assert not splitter._writer.is_open  # released now, not by a finalizer writing into a discarded stream
    assert splitter.segments == 0  # the block was never converted


@pytest.mark.parametrize("data", [b"", b"PAR1 not parquet", b"\x00" * 100])
def test_not_parquet_is_an_error_naming_the_object(data):
    with pytest.raises(ValueError, match=r"broker_id=3/probe\.segments\.parquet: not a staged segments Parquet file"):
        list(read_records(data, "s3://b/staging/r/probe/broker_id=3/probe.segments.parquet"))


def test_another_parquet_file_is_an_error_naming_the_object():
    buf = io.BytesIO()
    pq.write_table(pa.table({"x": [1]}), buf)
    with pytest.raises(ValueError, match=r"f\.parquet: .*no column base_offset, path"):
        list(read_records(buf.getvalue(), "f.parquet"))


def test_load_probe_reads_both_parts_or_json_alone(tmp_path: Path, corpus_output):
    store = Store(str(tmp_path))
    key = "staging/r/probe/broker_id=1/probe.jsonl.gz"
    assert segments_key(key) == "staging/r/probe/broker_id=1/probe.segments.parquet"
    assert segments_key("probe/broker_id=1/logdir-0.jsonl") == "probe/broker_id=1/logdir-0.segments.parquet"
    import gzip

    with store.writer(key) as raw, gzip.GzipFile(fileobj=raw, mode="wb") as out, store.writer(segments_key(key)) as seg:
        split_file(io.BytesIO(corpus_output), out, seg)
    loaded = load_probe(store, key)
    assert len(loaded) == len(corpus_output.splitlines())
    assert sum(r["kind"] == "segment" for r in loaded) == corpus_output.count(SEGMENT_PREFIX)
    (tmp_path / segments_key(key)).unlink()
    assert [r["kind"] for r in load_probe(store, key)] == [
        json.loads(line)["kind"] for line in corpus_output.splitlines() if not line.startswith(SEGMENT_PREFIX)
    ]
