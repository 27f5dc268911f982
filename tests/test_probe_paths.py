"""One way to make each record: the probe's fast branch, its general path and its --jobs workers print the same bytes.

The segment records of a batch of usual segments (a regular .log, .index and .timeindex, no .txnindex) are read by
``probe._regular_segments`` with fewer system calls and formatted by the same summary (``probe.index_summary``) and
record functions as every other segment (``Probe._segment``). Here every segment is also forced through the general
path and the outputs are compared byte for byte: on the real corpus and on indexes mutated every way the rules of
docs/kafka-reference.md §1 care about. The record fields are checked against the probe's field lists, and the
staged tables against them too."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fleet_doctor import probe
from fleet_doctor.probe import FILE_FIELDS, OFFSET_INDEX, RECORD_FIELDS, TIME_INDEX, Probe
from harness.corpus import REPO

VOLATILE = re.compile(rb'"(started_at_ms|elapsed_ms)":\d+')
T0 = 1_700_000_000_000


def probe_bytes(paths: list[Path], *, deep: bool = False) -> bytes:
    out = io.StringIO()
    Probe(out, deep=deep, jobs=1).run([str(p) for p in paths])
    return VOLATILE.sub(rb'"\1":0', out.getvalue().encode("ascii"))


def fast_and_general(paths: list[Path], monkeypatch: pytest.MonkeyPatch) -> tuple[bytes, bytes, int]:
    """The output as printed, the output with every segment made by the general path, and how many segment
    records the fast branch made."""
    made = []
    fast_branch = probe._regular_segments

    def counting(*args):
        done = fast_branch(*args)
        made.append(0 if done is None else len(done[0]))
        return done

    monkeypatch.setattr(probe, "_regular_segments", counting)
    fast = probe_bytes(paths)
    monkeypatch.setattr(probe, "_regular_segments", lambda *args: None)
    general = probe_bytes(paths)
    monkeypatch.setattr(probe, "_regular_segments", fast_branch)
    return fast, general, sum(made)


def corpus_logdirs(corpus: Path) -> list[Path]:
    return sorted(m.parent for m in corpus.glob("*/**/meta.properties"))


def test_fast_and_general_paths_agree_on_every_corpus_segment(corpus: Path, monkeypatch: pytest.MonkeyPatch):
    logdirs = corpus_logdirs(corpus)
    fast, general, by_fast = fast_and_general(logdirs, monkeypatch)
    segments = fast.count(b'{"kind":"segment",')
    # many corpus segments lack an index (the fast branch is for a .log, .index and .timeindex), most others are its
    assert segments > 300 and by_fast > 100
    assert fast == general


def _entries(fmt, ents) -> bytes:
    return b"".join(fmt.entry.pack(*e) for e in ents)


def _ramp(n: int, step: int = 3) -> list[tuple[int, int]]:
    return [(i * step + 1, i * 4096) for i in range(n)]


def _times(n: int) -> list[tuple[int, int]]:
    return [(T0 + i * 10, i * 3 + 1) for i in range(n)]


# (offset-index bytes, time-index bytes): the shapes ref §1 names, on both sides of the 4 KiB head
INDEX_CASES = {
    "clean": (_entries(OFFSET_INDEX, _ramp(5)), _entries(TIME_INDEX, _times(5))),
    "one entry": (_entries(OFFSET_INDEX, _ramp(1)), _entries(TIME_INDEX, _times(1))),
    "empty": (b"", b""),
    "head exactly full": (_entries(OFFSET_INDEX, _ramp(512)), _entries(TIME_INDEX, _times(341))),
    "one past the head": (_entries(OFFSET_INDEX, _ramp(513)), _entries(TIME_INDEX, _times(342))),
    "long clean": (_entries(OFFSET_INDEX, _ramp(1500)), _entries(TIME_INDEX, _times(1000))),
    "long, violation in the head": (
        _entries(OFFSET_INDEX, [*_ramp(100)[:40], (1, 5), *_ramp(1500)[41:]]),
        _entries(TIME_INDEX, [*_times(60), (T0, 1), *_times(1000)[61:]]),
    ),
    "long, only the last entry out of order": (
        _entries(OFFSET_INDEX, [*_ramp(900), (2, 7)]),
        _entries(TIME_INDEX, [*_times(700), (T0 - 1, 9)]),
    ),
    "equal neighbours": (
        _entries(OFFSET_INDEX, [(1, 5), (2, 5), (2, 6)]),  # equal positions allowed, equal offsets not
        _entries(TIME_INDEX, [(T0, 1), (T0, 1), (T0, 2)]),  # equal timestamps and offsets allowed
    ),
    "decreasing": (
        _entries(OFFSET_INDEX, [(5, 0), (9, 4200), (8, 9000), (10, 100)]),
        _entries(TIME_INDEX, [(T0, 1), (T0 - 1, 2), (T0 + 5, 1)]),
    ),
    "negative values": (
        _entries(OFFSET_INDEX, [(-3, -5), (-1, 6), (-2, 7)]),
        _entries(TIME_INDEX, [(-5, -1), (6, -1), (-7, 3)]),
    ),
    "trimmed with zero entries at the end": (
        _entries(OFFSET_INDEX, _ramp(4)) + bytes(8 * 3),
        _entries(TIME_INDEX, _times(2)) + bytes(12),
    ),
    "preallocated": (
        _entries(OFFSET_INDEX, _ramp(3)) + bytes(probe.DEFAULT_SEGMENT_INDEX_BYTES - 24),
        _entries(TIME_INDEX, _times(3)) + bytes(probe.DEFAULT_SEGMENT_INDEX_BYTES // 12 * 12 - 36),
    ),
    "preallocated, entries past the head": (
        _entries(OFFSET_INDEX, _ramp(700)) + bytes(80000),
        _entries(TIME_INDEX, [*_times(400), (T0, 2)]) + bytes(120000),
    ),
    "all zeros": (bytes(4096), bytes(12 * 500)),
    "zero first entry": (bytes(8) + _entries(OFFSET_INDEX, _ramp(3)), bytes(12) + _entries(TIME_INDEX, _times(2))),
    "zero entry inside": (
        _entries(OFFSET_INDEX, [*_ramp(2), (0, 0), *_ramp(5)[2:]]),
        _entries(TIME_INDEX, [*_times(2), (0, 0), *_times(4)[2:]]),
    ),
    "partial entry": (_entries(OFFSET_INDEX, _ramp(3)) + b"\x01\x02\x03", _entries(TIME_INDEX, _times(3)) + b"\x09"),
    "partial entry only": (b"\x00\x01", b"\x00" * 11),
    "partial entry after a zero tail": (_entries(OFFSET_INDEX, _ramp(2)) + bytes(8 * 5) + b"\x07", bytes(13)),
    "long head with a partial entry": (
        _entries(OFFSET_INDEX, _ramp(600)) + b"\x01",
        _entries(TIME_INDEX, _times(500)) + b"\x01\x02",
    ),
}


def _write_segment(pdir: Path, base: int, index: bytes, timeindex: bytes, log: bytes = b"") -> None:
    (pdir / f"{base:020d}.log").write_bytes(log)
    (pdir / f"{base:020d}.index").write_bytes(index)
    (pdir / f"{base:020d}.timeindex").write_bytes(timeindex)


def _mutations(index: bytes, timeindex: bytes) -> list[tuple[bytes, bytes]]:
    """A real segment's indexes, and broken copies of them."""
    out = [(index, timeindex)]
    for data, size in ((index, 8), (timeindex, 12)):
        n = len(data) // size
        other = timeindex if data is index else index
        variants = [
            data + bytes(size * 7),  # a zero tail
            data + b"\x05" * (size - 1),  # a partial entry
            data[: len(data) // 2],  # cut in the middle of an entry
            data * 3,  # repeated: out of order where the copies meet
        ]
        if n >= 2:  # the first two entries swapped
            variants.append(data[size : 2 * size] + data[:size] + data[2 * size :])
        for v in variants:
            out.append((v, other) if data is index else (other, v))
    return out


def test_fast_and_general_paths_agree_on_mutated_indexes(corpus: Path, tmp_path: Path, monkeypatch):
    logdir = tmp_path / "logdir"
    pdir = logdir / "crafted-0"
    pdir.mkdir(parents=True)
    for k, (index, timeindex) in enumerate(INDEX_CASES.values()):
        _write_segment(pdir, 1000 * k, index, timeindex)
    real = [
        p.with_suffix("")
        for p in sorted(corpus.glob("*/**/*.index"))
        if p.stat().st_size >= 16 and p.with_suffix(".timeindex").is_file() and p.with_suffix(".log").is_file()
    ]
    assert len(real) >= 5
    for i, stem in enumerate(real[:12]):
        mdir = logdir / f"real-{i}"
        mdir.mkdir()
        base = int(stem.name)
        index, timeindex = stem.with_suffix(".index").read_bytes(), stem.with_suffix(".timeindex").read_bytes()
        for k, (x, t) in enumerate(_mutations(index, timeindex)):
            _write_segment(mdir, base + 100000 * k, x, t, stem.with_suffix(".log").read_bytes())
    fast, general, by_fast = fast_and_general([logdir], monkeypatch)
    segments = fast.count(b'{"kind":"segment",')
    assert by_fast == segments  # every batch was the fast branch's
    assert fast == general
    records = [json.loads(line) for line in fast.splitlines()]
    crafted = {r["base_offset"] // 1000: r for r in records if r["kind"] == "segment" and r["path"] == str(pdir)}
    shapes = {name: k for k, name in enumerate(INDEX_CASES)}
    assert crafted[shapes["clean"]]["index_monotonic"] is True
    assert crafted[shapes["long, violation in the head"]]["index_first_violation"] == 40
    assert crafted[shapes["long, only the last entry out of order"]]["timeindex_first_violation"] == 700
    assert crafted[shapes["equal neighbours"]]["index_first_violation"] == 2
    assert crafted[shapes["equal neighbours"]]["timeindex_monotonic"] is True
    assert crafted[shapes["preallocated"]]["index_zero_tail_entries"] == probe.DEFAULT_SEGMENT_INDEX_BYTES // 8 - 3
    assert crafted[shapes["partial entry"]]["index_remainder"] == 3


def _run_cli(*args: str) -> bytes:
    cmd = [sys.executable, str(REPO / "plugins" / "fleet_doctor" / "probe.py"), *args]
    r = subprocess.run(cmd, capture_output=True, check=True, timeout=300)
    return VOLATILE.sub(rb'"\1":0', r.stdout)


@pytest.mark.parametrize("mode", [[], ["--deep"]])
def test_jobs_print_the_same_bytes(corpus: Path, mode: list[str]):
    """--jobs 2 and 3 (forked workers) print what --jobs 1 prints, byte for byte."""
    one = _run_cli("--jobs", "1", *mode, "--discover", str(corpus))
    assert one.count(b'{"kind":"partition",') > 20
    for jobs in ("2", "3"):
        assert _run_cli("--jobs", jobs, *mode, "--discover", str(corpus)) == one, jobs


def _in_order(keys: list[str], fields: tuple[str, ...]) -> bool:
    """keys are some of fields, in their order."""
    at = {f: i for i, f in enumerate(fields)}
    return all(k in at for k in keys) and [at[k] for k in keys] == sorted(at[k] for k in keys)


@pytest.mark.parametrize("deep", [False, True])
def test_records_have_the_fields_of_their_kind_in_order(corpus: Path, deep: bool):
    records = [json.loads(line) for line in probe_bytes(corpus_logdirs(corpus), deep=deep).splitlines()]
    seen = set()
    for r in records:
        keys = list(r)
        assert keys[0] == "kind"
        kind = r["kind"]
        seen.add(kind)
        if kind == "file":
            assert keys[1:4] == ["logdir", "path", "file_type"]
            assert _in_order(keys[4:], FILE_FIELDS[r["file_type"]]), r
        else:
            assert _in_order(keys[1:], RECORD_FIELDS[kind]), r
        if kind in ("probe", "logdir", "probe_end"):
            assert tuple(keys[1:]) == RECORD_FIELDS[kind]
        if kind == "segment" and not deep and r["has_index"] and r["has_timeindex"] and r["error"] is None:
            assert tuple(keys[1:]) == probe.SEGMENT_FIELDS  # both indexes read: every field
        if kind == "partition" and "topic" in r:
            expected = probe.PARTITION_FIELDS + (probe.PARTITION_DEEP_FIELDS if deep else ())
            assert tuple(keys[1:]) == expected
    assert seen == {"probe", "logdir", "file", "partition", "segment", "probe_end"}


def test_staged_tables_have_the_probes_fields():
    """The staged Parquet tables name each kind's fields as the probe prints them, in its order."""
    pytest.importorskip("pyarrow")
    from fleet_doctor.records import arrow_schema

    assert tuple(arrow_schema("segment").names) == RECORD_FIELDS["segment"]
    assert tuple(arrow_schema("partition").names) == RECORD_FIELDS["partition"]
    file_fields = {f for fields in FILE_FIELDS.values() for f in fields} | {"logdir", "path", "file_type"}
    assert set(arrow_schema("file").names) <= file_fields
