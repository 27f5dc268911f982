"""The staged form of the probe's segment, partition and file records (fleet_doctor.staging), on real
corpus output."""

from __future__ import annotations

import gzip
import io
import json
import random
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import types as T

from fleet_doctor import records
from fleet_doctor.detect.frames import PROBE_KINDS, STAGED_PARQUET
from fleet_doctor.probe import Probe, discover_logdirs
from fleet_doctor.staging import (
    STAGED_KINDS,
    ProbeSplitter,
    load_probe,
    read_records,
    split_file,
    staged_keys,
    staged_outputs,
)
from fleet_doctor.store import Store

KINDS = [k.kind for k in STAGED_KINDS]
SCALARS = {
    T.LongType(): pa.int64(),
    T.IntegerType(): pa.int32(),
    T.StringType(): pa.string(),
    T.BooleanType(): pa.bool_(),
}


def arrow_type(t: T.DataType) -> pa.DataType:
    return pa.list_(arrow_type(t.elementType)) if isinstance(t, T.ArrayType) else SCALARS[t]


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
) -> tuple[bytes, dict[str, bytes], ProbeSplitter]:
    js, pqt = io.BytesIO(), {k: io.BytesIO() for k in KINDS}
    splitter = ProbeSplitter(js, pqt, block_lines=block_lines)
    pos = 0
    for n in chunks or [len(data)]:
        splitter.write(data[pos : pos + n])
        pos += n
    splitter.write(data[pos:])
    splitter.close()
    return js.getvalue(), {k: b.getvalue() for k, b in pqt.items()}, splitter


def columnar(pqt: dict[str, bytes]) -> list[dict[str, Any]]:
    return [r for k in KINDS for r in read_records(pqt[k], f"test.{k}.parquet", k)]


def test_detection_reads_a_subset_of_each_table_with_the_same_types():
    for kind in STAGED_KINDS:
        assert STAGED_PARQUET[kind.kind] == "*" + kind.suffix
        stored = records.spark_schema(kind.kind, staged=True)
        for field in PROBE_KINDS[kind.kind].fields:
            if field.name not in stored.fieldNames():  # offset checkpoints' fields: those records stay JSON
                assert not records.KINDS[kind.kind].field(field.name).staged
                assert field.name not in kind.table.names
                continue
            assert kind.table.field(field.name).type == arrow_type(stored[field.name].dataType), (kind.kind, field.name)


def test_every_record_of_the_corpus_goes_to_parquet_and_comes_back_unchanged(corpus_output):
    original = [json.loads(line) for line in corpus_output.splitlines()]
    by_kind = {k: [r for r in original if r["kind"] == k] for k in KINDS}
    assert len(by_kind["segment"]) > 600 and any("index_mismatch_examples" in r for r in by_kind["segment"])
    assert any("deep" in r for r in by_kind["segment"]), "deep mode's segments without a .log are in the output"
    assert any("log_end_offset" in r for r in by_kind["partition"]) and any(
        r["leader_epochs"] for r in by_kind["partition"]
    )
    file_types = {r["file_type"] for r in by_kind["file"]}
    assert {"leader_epoch_checkpoint", "partition_metadata", "segment_leftover", "kraft_snapshot"} <= file_types
    js, pqt, splitter = split(corpus_output, block_lines=97)  # many blocks, a short last one
    # the file records with an object (meta.properties, markers, quorum-state) or an offset checkpoint stay JSON
    as_json = [r for r in by_kind["file"] if {"meta", "content", "checkpoint"} & r.keys()]
    assert {r["file_type"] for r in as_json} == {
        "meta_properties",
        "clean_shutdown",
        "offset_checkpoint",
        "quorum_state",
    }
    assert (splitter.rows["segment"], splitter.kept_json["segment"]) == (len(by_kind["segment"]), 0)
    assert (splitter.rows["partition"], splitter.kept_json["partition"]) == (len(by_kind["partition"]), 0)
    assert (splitter.rows["file"], splitter.kept_json["file"]) == (len(by_kind["file"]) - len(as_json), len(as_json))
    for kind in STAGED_KINDS:
        assert pq.read_table(io.BytesIO(pqt[kind.kind])).schema == kind.table
    kept = [json.loads(line) for line in js.splitlines()]
    assert kept == [r for r in original if r["kind"] not in KINDS or r in as_json]
    # every field of every record, with its value, in the probe's order; fields a record did not have are None
    back = columnar(pqt)
    wanted = [r for k in KINDS for r in by_kind[k] if r not in as_json]
    assert len(back) == len(wanted)
    for w, g in zip(wanted, back, strict=True):
        assert {k: g[k] for k in w} == w
        assert all(g[k] is None for k in g.keys() - w.keys())


def test_the_probe_counts_what_is_staged(corpus_output):
    """probe_end counts each kind as the audit's stage task checks it (rows plus lines kept as JSON)."""
    for run in corpus_output.split(b'{"kind":"probe",')[1:]:
        _, _, splitter = split(b'{"kind":"probe",' + run)
        end = json.loads(run.splitlines()[-1])
        assert end["kind"] == "probe_end"
        assert {k.counted_as: splitter.staged(k.kind) for k in STAGED_KINDS} == {
            k.counted_as: end[k.counted_as] for k in STAGED_KINDS
        }


def test_chunk_boundaries_do_not_matter(corpus_output):
    whole = split(corpus_output)
    rng = random.Random(7)
    chunks = [rng.choice((1, 2, 17, 4096, 65536)) for _ in range(400)]
    cut = split(corpus_output, chunks)
    assert cut[0] == whole[0]
    for k in KINDS:
        assert pq.read_table(io.BytesIO(cut[1][k])).equals(pq.read_table(io.BytesIO(whole[1][k])))


def test_a_line_the_table_cannot_hold_stays_json_verbatim():
    good = b'{"kind":"segment","logdir":"/d","path":"/d/t-0","topic":"t","partition":0,"base_offset":%d}\n'
    odd = [
        b'{"kind":"segment","logdir":"/d","path":"/d/t-0","base_offset":7,"new_field":1}\n',  # a newer probe's field
        b'{"kind":"segment","logdir":"/d","path":"/d/t-0","base_offset":"8"}\n',  # another type
        b'{"kind":"segment","logdir":"/d","path":"/d/t-0","base_offset":9223372036854775808}\n',  # out of range
        b'{"kind":"segment","logdir":"/d","pa\n',  # cut off
        b'{"kind":"segment","logdir":"/d","path":"/d/t-0","base_offset":10} {"kind":"segment","base_offset":11}\n',
        b'{"kind":"partition","logdir":"/d","path":"/d/t-0","leader_epochs":[["x",1]]}\n',  # another type, nested
        b'{"kind":"file","logdir":"/d","path":"/d/t-0/x","file_type":"unknown","extra":{"a":1}}\n',  # an object
        b'{"kind":"file","logdir":"/d","path":"/d/meta.properties","file_type":"meta_properties","meta":{}}\n',
    ]
    part = b'{"kind":"partition","logdir":"/d","path":"/d/t-0","dir":"t-0","topic":"t","partition":0}\n'
    data = b'{"kind":"probe"}\n' + good % 0 + b"".join(odd) + part + good % 100 + b'{"kind":"probe_end"}\n'
    js, pqt, splitter = split(data)
    assert [(splitter.rows[k], splitter.kept_json[k]) for k in KINDS] == [(2, 5), (1, 1), (0, 2)]
    # lines kept without a try come at once; lines a block could not hold when their block is converted
    assert js == b'{"kind":"probe"}\n' + odd[7] + b'{"kind":"probe_end"}\n' + b"".join(odd[:7])
    assert [r["base_offset"] for r in read_records(pqt["segment"], "x", "segment")] == [0, 100]
    assert [r["dir"] for r in read_records(pqt["partition"], "x", "partition")] == ["t-0"]


def test_no_records_and_no_final_newline():
    js, pqt, splitter = split(b'{"kind":"probe"}\n{"kind":"probe_end"}')
    assert js == b'{"kind":"probe"}\n{"kind":"probe_end"}'
    assert all(splitter.staged(k) == 0 and list(read_records(pqt[k], "x", k)) == [] for k in KINDS)


def test_an_unfit_line_is_never_glued_to_a_last_line_without_newline():
    unfit = b'{"kind":"segment","logdir":"/d","path":"/d/t-0","base_offset":1,"new_field":true}\n'
    js, _, splitter = split(b'{"kind":"probe"}\n' + unfit + b'{"kind":"probe_end","complete":true}')
    assert js == b'{"kind":"probe"}\n' + unfit + b'{"kind":"probe_end","complete":true}'
    assert splitter.kept_json["segment"] == 1


def test_one_unfit_line_in_a_big_block_keeps_the_rest_columnar():
    good = b'{"kind":"segment","logdir":"/d","path":"/d/t-0","topic":"t","partition":0,"base_offset":%d}\n'
    lines = [good % i for i in range(5000)]
    lines[3777] = b'{"kind":"segment","logdir":"/d","path":"/d/t-0","base_offset":3777,"new_field":1}\n'
    js, pqt, splitter = split(b"".join(lines))
    assert (splitter.rows["segment"], splitter.kept_json["segment"]) == (4999, 1) and js == lines[3777]
    assert [r["base_offset"] for r in read_records(pqt["segment"], "x", "segment")] == [
        i for i in range(5000) if i != 3777
    ]


def test_a_failed_stage_leaves_the_parquet_writers_closed():
    js, pqt = io.BytesIO(), {k: io.BytesIO() for k in KINDS}
    with pytest.raises(RuntimeError, match="probe died"):
        with ProbeSplitter(js, pqt) as splitter:
            splitter.write(b'{"kind":"segment","logdir":"/d","path":"/d/t-0","base_offset":1}\n')
            raise RuntimeError("probe died")
    # released now, not by a finalizer writing into a discarded stream
    assert not any(s.writer.is_open for s in splitter._sinks.values())
    assert splitter.rows["segment"] == 0  # the block was never converted


@pytest.mark.parametrize("data", [b"", b"PAR1 not parquet", b"\x00" * 100])
def test_not_parquet_is_an_error_naming_the_object(data):
    url = "s3://b/staging/r/probe/broker_id=3/probe.partitions.parquet"
    with pytest.raises(ValueError, match=r"broker_id=3/probe\.partitions\.parquet: not a staged partition records"):
        list(read_records(data, url, "partition"))


def test_another_parquet_file_is_an_error_naming_the_object():
    buf = io.BytesIO()
    pq.write_table(pa.table({"x": [1]}), buf)
    with pytest.raises(ValueError, match=r"f\.parquet: .*no column dir, dir_state, logdir, path"):
        list(read_records(buf.getvalue(), "f.parquet", "partition"))
    # a file of another kind is not taken for this one
    _, pqt, _ = split(b'{"kind":"partition","logdir":"/d","path":"/d/t-0","dir":"t-0"}\n')
    with pytest.raises(ValueError, match=r"p\.parquet: .*no column base_offset, index_bytes"):
        list(read_records(pqt["partition"], "p.parquet", "segment"))
    _, pqt, _ = split(b'{"kind":"file","logdir":"/d","path":"/d/t-0/1.snapshot","file_type":"producer_snapshot"}\n')
    with pytest.raises(ValueError, match=r"f\.parquet: .*no column index_bytes"):  # files have a base_offset too
        list(read_records(pqt["file"], "f.parquet", "segment"))


def test_load_probe_reads_every_part_or_json_alone(tmp_path: Path, corpus_output):
    store = Store(str(tmp_path))
    key = "staging/r/probe/broker_id=1/probe.jsonl.gz"
    assert staged_keys(key) == {
        "segment": "staging/r/probe/broker_id=1/probe.segments.parquet",
        "partition": "staging/r/probe/broker_id=1/probe.partitions.parquet",
        "file": "staging/r/probe/broker_id=1/probe.files.parquet",
    }
    assert staged_keys("probe/broker_id=1/logdir-0.jsonl")["file"] == "probe/broker_id=1/logdir-0.files.parquet"

    with staged_outputs(key, store.writer, gzip_level=1) as (out, parts):
        split_file(io.BytesIO(corpus_output), out, parts)
    assert gzip.decompress((tmp_path / key).read_bytes()).startswith(b'{"kind":"probe",')
    loaded = load_probe(store, key)
    lines = [json.loads(line) for line in corpus_output.splitlines()]
    assert len(loaded) == len(lines)
    for kind in KINDS:
        assert sum(r["kind"] == kind for r in loaded) == sum(r["kind"] == kind for r in lines)
    for staged in staged_keys(key).values():
        (tmp_path / staged).unlink()
    kept_json = [r["kind"] for r in load_probe(store, key)]
    assert "segment" not in kept_json and "partition" not in kept_json and "probe_end" in kept_json


class Recording(io.BytesIO):
    """An output that records, when closed, its name and whether it was committed (no exception)."""

    closed_as: ClassVar[list[tuple[str, bool]]] = []

    def __init__(self, key: str) -> None:
        super().__init__()
        self.key = key

    def __enter__(self) -> Recording:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.closed_as.append((self.key.rsplit("/", 1)[1], exc_type is None))


def test_the_json_lines_are_committed_last():
    """Leaving staged_outputs closes the Parquet objects first: when the JSON Lines exist, so do they."""
    Recording.closed_as = []
    with staged_outputs("p/probe.jsonl.gz", Recording) as (out, parts):
        split_file(io.BytesIO(b'{"kind":"probe"}\n'), out, parts)
    assert Recording.closed_as[-1] == ("probe.jsonl.gz", True)
    assert sorted(Recording.closed_as[:-1]) == [
        ("probe.files.parquet", True),
        ("probe.partitions.parquet", True),
        ("probe.segments.parquet", True),
    ]


def test_a_failure_commits_nothing():
    Recording.closed_as = []
    with pytest.raises(RuntimeError, match="lost the SSH session"):
        with staged_outputs("p/probe.jsonl.gz", Recording) as (out, parts):
            with ProbeSplitter(out, parts) as splitter:
                splitter.write(b'{"kind":"segment","logdir":"/d","path":"/d/t-0","base_offset":1}\n')
                raise RuntimeError("lost the SSH session")
    assert len(Recording.closed_as) == 4 and not any(ok for _, ok in Recording.closed_as)


def test_a_count_that_differs_from_probe_end_is_reported(corpus_output):
    """The audit's stage task fails when the records staged are not as many as the probe counted."""
    run = corpus_output.split(b'{"kind":"probe",')[1]
    _, _, splitter = split(b'{"kind":"probe",' + run)
    end = json.loads(run.splitlines()[-1])
    assert splitter.miscounted(end) == []
    short = dict(end, partitions=end["partitions"] + 1, files=end["files"] - 1)
    assert splitter.miscounted(short) == [
        f"the probe counted {end['partitions'] + 1} partitions but {end['partitions']} were staged as Parquet "
        "and 0 as JSON",
        f"the probe counted {end['files'] - 1} files but {splitter.rows['file']} were staged as Parquet and "
        f"{splitter.kept_json['file']} as JSON",
    ]


def test_a_probe_output_past_its_caps_stops_with_an_error_naming_the_broker() -> None:
    """Issue 28 item 11: a hostile broker's output (a line without end, or without end in size) is cut off at the
    caps with an error naming it, checked chunk by chunk as it arrives."""
    from fleet_doctor.audit.steps import StageError, bounded

    got: list[int] = []
    sink = bounded(lambda d: got.append(len(d)), "broker 7 (10.0.0.7:22)", max_bytes=1 << 30, max_line=1 << 20)
    chunk = b"x" * (64 << 10)
    with pytest.raises(StageError, match=r"broker 7 \(10\.0\.0\.7:22\): a line of the probe's output is longer than"):
        for _ in range(64):  # 4 MiB without a newline
            sink(chunk)
    assert sum(got) <= 1 << 20  # nothing past the cap reached the store
    total = bounded(lambda d: None, "broker 8", max_bytes=1 << 20, max_line=1 << 20)
    line = b"y" * 1023 + b"\n"
    with pytest.raises(StageError, match=r"broker 8: the probe's output passed 1048576 bytes"):
        for _ in range(2048):  # 2 MiB of short lines
            total(line)
    ok = bounded(lambda d: None, "broker 9", max_bytes=1 << 20, max_line=1 << 10)
    for _ in range(100):
        ok(b"z" * 1000 + b"\n")  # long output of short lines within both caps


def test_the_splitter_keeps_a_long_line_in_the_chunks_it_came_in() -> None:
    """A line arriving in many chunks is joined once, when it ends (linear in its size, not quadratic)."""
    out = io.BytesIO()
    parquet = {k.kind: io.BytesIO() for k in STAGED_KINDS}
    with ProbeSplitter(out, parquet) as splitter:
        for _ in range(256):
            splitter.write(b"a" * 4096)
        assert len(splitter._partial) == 256  # kept as chunks, not concatenated on each write
        splitter.write(b'\n{"kind":"other"}\ntail')
    assert out.getvalue() == b"a" * (256 * 4096) + b"\n" + b'{"kind":"other"}\n' + b"tail"
