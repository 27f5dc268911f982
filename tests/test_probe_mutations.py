"""Mutation tests: break genuine Kafka files (copies of the real-data corpus) one way at a time and
check the exact fact the probe reports.

Every expected value is computed here from the bytes the test wrote (struct), from file sizes, or
from MANIFEST.md numbers; none is copied from the probe's output. The corpus itself is never
modified: each test copies what it needs into tmp_path with ``copy_writable``.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path
from typing import Any

import pytest

from harness.corpus import by_kind, copy_writable, partition, run_probe, segments
from harness.kafka_ref import ref_batches, ref_valid_bytes

REPO = Path(__file__).resolve().parents[1]
PROBE_PY = REPO / "plugins" / "fleet_doctor" / "probe.py"

ARYAN = "zk-3.1-single-aryan/kafka-logs"
V1_SAMPLE = "zk-0.10-v1format-3zk-xpx/kafka-logs"
GERALDINE = "zk-3.3-cleaner-swap-geraldine/kafka-logs"

LOG = "00000000000000000000.log"
IDX = "00000000000000000000.index"
TIDX = "00000000000000000000.timeindex"

PREALLOC_INDEX = 10_485_760  # segment.index.bytes default, roundDown(10 MiB, 8)
PREALLOC_TIMEINDEX = 10_485_756  # roundDown(10 MiB, 12)

# MANIFEST.md, zk-3.1-single-aryan: design-0 .index is 104 B, 13 entries, last (427, 54128); the topic ID
DESIGN0_INDEX_BYTES = 104
DESIGN0_INDEX_ENTRIES = 13
DESIGN0_INDEX_LAST = (427, 54128)
DESIGN_TOPIC_ID = "JWzPWgOsTDqCV2TLEX2N3g"
ARYAN_CLUSTER_ID = "4fi2MkU0Ql2L0cPRncY20Q"

MODES = pytest.mark.parametrize("deep", [False, True], ids=["metadata", "deep"])


# --------------------------------------------------------------------------------------------
# Helpers (independent of the probe)
@pytest.fixture
def logdir(tmp_path: Path) -> Path:
    d = tmp_path / "logs"
    d.mkdir()
    return d


def add_partition(corpus: Path, logdir: Path, name: str, sample: str = ARYAN, as_name: str | None = None) -> Path:
    """Copy one partition dir of a corpus sample into logdir (writable)."""
    return copy_writable(corpus / sample / name, logdir / (as_name or name))


def add_file(corpus: Path, logdir: Path, name: str, sample: str = ARYAN) -> Path:
    dst = logdir / name
    shutil.copyfile(corpus / sample / name, dst)
    os.chmod(dst, 0o644)
    return dst


def probe(*paths: Path | str, deep: bool = False, verify_crc: bool = False) -> list[dict[str, Any]]:
    """run_probe (every line must be JSON) plus: it started and finished, so no exception escaped."""
    recs = run_probe(*paths, deep=deep, verify_crc=verify_crc)
    assert recs[0]["kind"] == "probe"
    assert recs[-1]["kind"] == "probe_end"
    assert recs[-1]["complete"] is True
    # the per-partition safety net ("probe failed on ...") means an exception escaped a parser
    for r in recs:
        assert not str(r.get("error") or "").startswith("probe failed"), r
    return recs


def seg(records: list[dict[str, Any]], dirname: str, base: int = 0) -> dict[str, Any]:
    found = [s for s in segments(records, dirname) if s["base_offset"] == base]
    assert len(found) == 1, f"expected one segment {base} in {dirname}, got {len(found)}"
    return found[0]


def file_rec(records: list[dict[str, Any]], path: Path | str) -> dict[str, Any]:
    found = [r for r in records if r["kind"] == "file" and r["path"] == str(path)]
    assert len(found) == 1, f"expected one file record for {path}, got {len(found)}"
    return found[0]


def logdir_rec(records: list[dict[str, Any]]) -> dict[str, Any]:
    found = by_kind(records, "logdir")
    assert len(found) == 1
    return found[0]


def errors_naming(records: list[dict[str, Any]], path: Path | str) -> list[str]:
    """Every error string, in any record or error field, that names path."""
    out = []
    for r in records:
        for k, v in r.items():
            if (k == "error" or k.endswith("_error")) and isinstance(v, str) and str(path) in v:
                out.append(v)
        for cp in (r.get("checkpoints") or {}).values():
            if isinstance(cp.get("error"), str) and str(path) in cp["error"]:
                out.append(cp["error"])
    return out


def v2_last_offset(data: bytes, start: int) -> int:
    base, delta = struct.unpack_from(">q", data, start)[0], struct.unpack_from(">i", data, start + 23)[0]
    return base + delta


def index_entries(data: bytes) -> list[tuple[int, int]]:
    return list(struct.iter_unpack(">ii", data[: len(data) // 8 * 8]))


def timeindex_entries(data: bytes) -> list[tuple[int, int]]:
    return list(struct.iter_unpack(">qi", data[: len(data) // 12 * 12]))


def run_cli(
    *args: str, timeout: float = 60, prefix: tuple[str, ...] = (), python: str = sys.executable
) -> subprocess.CompletedProcess:
    """Run probe.py as a command (optionally under a privilege-dropping prefix). The source goes in on
    stdin (`python3 - ARGS`), as the audit ships it over SSH: the unprivileged user then needs no access
    to the checkout, which may sit in a private directory."""
    with PROBE_PY.open("rb") as src:
        return subprocess.run(
            [*prefix, python, "-", *args], stdin=src, capture_output=True, timeout=timeout, check=False
        )


def parse_lines(stdout: bytes) -> list[dict[str, Any]]:
    lines = stdout.splitlines()
    assert lines, "no output"
    return [json.loads(line) for line in lines]


# --------------------------------------------------------------------------------------------
# Baseline: the unmutated copy reads as MANIFEST says (so a mutation's effect is the mutation's)
def test_baseline_design0_copy(corpus, logdir):
    add_partition(corpus, logdir, "design-0")
    data = (logdir / "design-0" / LOG).read_bytes()
    batches = ref_batches(data)
    recs = probe(logdir, verify_crc=True)
    s = seg(recs, "design-0")
    assert s["index_bytes"] == DESIGN0_INDEX_BYTES
    assert s["index_entries"] == DESIGN0_INDEX_ENTRIES
    assert (s["index_last_offset"], s["index_last_position"]) == DESIGN0_INDEX_LAST
    assert s["batch_count"] == len(batches)
    assert s["valid_bytes"] == len(data) == batches[-1][0] + batches[-1][1]
    assert s["torn_tail"] is False
    assert s["crc_errors"] == 0
    assert s["crc_checked"] == len(batches)
    assert s["index_checked"] == DESIGN0_INDEX_ENTRIES
    assert s["index_beyond_log"] == 0
    assert s["error"] is None
    p = partition(recs, "design-0")
    assert p["topic_id"] == DESIGN_TOPIC_ID
    assert p["error"] is None


# --------------------------------------------------------------------------------------------
# Indexes
@MODES
def test_untrimmed_offset_index(corpus, logdir, deep):
    idx = add_partition(corpus, logdir, "design-0") / IDX
    entries = index_entries(idx.read_bytes())
    assert len(entries) == DESIGN0_INDEX_ENTRIES and entries[-1] == DESIGN0_INDEX_LAST
    os.truncate(idx, PREALLOC_INDEX)
    recs = probe(logdir, deep=deep)
    s = seg(recs, "design-0")
    assert s["index_bytes"] == PREALLOC_INDEX
    assert s["index_entries"] == DESIGN0_INDEX_ENTRIES
    assert s["index_zero_tail_entries"] == PREALLOC_INDEX // 8 - DESIGN0_INDEX_ENTRIES  # 1310720 - 13
    assert s["index_remainder"] == 0
    assert s["index_first_offset"] == entries[0][0]
    assert s["index_last_offset"] == 427
    assert s["index_last_position"] == 54128
    assert s["index_monotonic"] is True
    assert s["error"] is None
    if deep:
        assert s["index_checked"] == DESIGN0_INDEX_ENTRIES
        assert s["index_beyond_log"] == 0
        assert s["index_not_batch_start"] == 0


@MODES
def test_untrimmed_time_index(corpus, logdir, deep):
    tidx = add_partition(corpus, logdir, "design-0") / TIDX
    entries = timeindex_entries(tidx.read_bytes())
    os.truncate(tidx, PREALLOC_TIMEINDEX)
    recs = probe(logdir, deep=deep)
    s = seg(recs, "design-0")
    assert s["timeindex_bytes"] == PREALLOC_TIMEINDEX
    assert s["timeindex_entries"] == len(entries) == 14
    assert s["timeindex_zero_tail_entries"] == PREALLOC_TIMEINDEX // 12 - len(entries)  # 873813 - 14
    assert s["timeindex_remainder"] == 0
    assert s["timeindex_last_timestamp"] == entries[-1][0]
    assert s["timeindex_last_offset"] == entries[-1][1]
    assert s["timeindex_first_timestamp"] == entries[0][0]
    assert s["timeindex_monotonic"] is True
    assert s["error"] is None


@MODES
def test_all_zero_preallocated_indexes_on_empty_segment(corpus, logdir, deep):
    p = add_partition(corpus, logdir, "design2-0")  # MANIFEST: design2 is empty
    assert (p / LOG).stat().st_size == 0
    os.truncate(p / IDX, PREALLOC_INDEX)
    os.truncate(p / TIDX, PREALLOC_TIMEINDEX)
    recs = probe(logdir, deep=deep)
    s = seg(recs, "design2-0")
    assert s["index_bytes"] == PREALLOC_INDEX
    assert s["index_entries"] == 0
    assert s["index_zero_tail_entries"] == 1_310_720
    assert s["index_last_offset"] is None
    assert s["timeindex_entries"] == 0
    assert s["timeindex_zero_tail_entries"] == 873_813
    assert s["timeindex_last_timestamp"] is None
    assert s["error"] is None
    if deep:
        assert s["batch_count"] == 0
        assert s["valid_bytes"] == 0
        assert s["torn_tail"] is False
        assert s["index_checked"] == 0
        assert s["index_beyond_log"] == 0


@MODES
@pytest.mark.parametrize("which", ["index", "timeindex"])
def test_index_size_not_multiple_of_entry_size(corpus, logdir, deep, which):
    f = add_partition(corpus, logdir, "design-0") / (IDX if which == "index" else TIDX)
    orig = f.stat().st_size
    esize = 8 if which == "index" else 12
    with open(f, "ab") as fh:
        fh.write(b"\x01\x02\x03")
    recs = probe(logdir, deep=deep)
    s = seg(recs, "design-0")
    assert s[f"{which}_bytes"] == orig + 3
    assert s[f"{which}_remainder"] == 3
    assert s[f"{which}_entries"] == orig // esize
    assert s[f"{which}_zero_tail_entries"] == 0


@MODES
@pytest.mark.parametrize("which", ["index", "timeindex"])
def test_index_non_monotonic(corpus, logdir, deep, which):
    f = add_partition(corpus, logdir, "design-0") / (IDX if which == "index" else TIDX)
    esize = 8 if which == "index" else 12
    data = bytearray(f.read_bytes())
    ents = index_entries(bytes(data)) if which == "index" else timeindex_entries(bytes(data))
    # the genuine entries strictly increase in both fields, so swapping 5 and 6 breaks order at 6
    assert all(a[0] < b[0] and a[1] < b[1] for a, b in itertools.pairwise(ents))
    e5, e6 = data[5 * esize : 6 * esize], data[6 * esize : 7 * esize]
    data[5 * esize : 6 * esize], data[6 * esize : 7 * esize] = e6, e5
    f.write_bytes(bytes(data))
    recs = probe(logdir, deep=deep)
    s = seg(recs, "design-0")
    assert s[f"{which}_monotonic"] is False
    assert s[f"{which}_first_violation"] == 6
    assert s[f"{which}_entries"] == len(ents)


@MODES
def test_index_entry_past_log_end(corpus, logdir, deep):
    p = add_partition(corpus, logdir, "design-0")
    data = (p / LOG).read_bytes()
    half = len(data) // 2
    os.truncate(p / LOG, half)
    valid = ref_valid_bytes(data[:half])
    ents = index_entries((p / IDX).read_bytes())
    beyond = sum(1 for _rel, pos in ents if pos >= valid)
    assert beyond > 0
    recs = probe(logdir, deep=deep)
    s = seg(recs, "design-0")
    assert s["log_bytes"] == half
    assert s["index_last_position"] == DESIGN0_INDEX_LAST[1]
    assert s["index_last_position"] >= s["log_bytes"]
    if deep:
        assert s["torn_tail"] is True
        assert s["valid_bytes"] == valid
        assert s["index_beyond_log"] == beyond
        assert s["index_checked"] == len(ents)
        assert partition(recs, "design-0")["torn_segments"] == 1


# --------------------------------------------------------------------------------------------
# .log
def test_torn_last_batch(corpus, logdir):
    p = add_partition(corpus, logdir, "design-0")
    data = (p / LOG).read_bytes()
    batches = ref_batches(data)
    last_start, last_size = batches[-1]
    assert last_start + last_size == len(data)
    os.truncate(p / LOG, len(data) - 5)
    recs = probe(logdir, deep=True)
    s = seg(recs, "design-0")
    assert s["torn_tail"] is True
    assert s["valid_bytes"] == last_start
    assert s["batch_count"] == len(batches) - 1
    assert s["last_offset"] == v2_last_offset(data, batches[-2][0])
    assert s["next_offset"] == v2_last_offset(data, batches[-2][0]) + 1
    assert s["log_bytes"] == len(data) - 5
    pr = partition(recs, "design-0")
    assert pr["torn_segments"] == 1
    assert pr["log_end_offset"] == v2_last_offset(data, batches[-2][0]) + 1


@pytest.mark.parametrize(
    "sample,pdir,k",
    [(ARYAN, "design-0", 100), (V1_SAMPLE, "foo-0", 50)],
    ids=["v2-design-0", "v1-foo-0"],
)
def test_flipped_crc_byte(corpus, logdir, sample, pdir, k):
    p = add_partition(corpus, logdir, pdir, sample=sample)
    data = bytearray((p / LOG).read_bytes())
    batches = ref_batches(bytes(data))
    assert ref_valid_bytes(bytes(data)) == len(data)
    start, size = batches[k]
    magic = data[start + 16]
    if magic == 2:
        flip = start + 61 + (size - 61) // 2  # inside the records
    else:
        flip = start + size - 1  # last byte of the value
        stored = struct.unpack_from(">I", data, start + 12)[0]
        assert zlib.crc32(bytes(data[start + 16 : start + size])) == stored  # genuine CRC-32 holds
    data[flip] ^= 0xFF
    if magic != 2:
        assert zlib.crc32(bytes(data[start + 16 : start + size])) != stored
    (p / LOG).write_bytes(bytes(data))

    s = seg(probe(logdir, verify_crc=True), pdir)
    assert s["crc_errors"] == 1
    assert s["first_crc_error_position"] == start
    assert s["crc_checked"] == k + 1
    assert s["valid_bytes"] == start  # recovery truncates at the first invalid batch
    assert s["batch_count"] == k

    # without verify_crc the walk is structural only and completes
    s = seg(probe(logdir, deep=True), pdir)
    assert s["crc_checked"] == 0
    assert s["crc_errors"] == 0
    assert s["batch_count"] == len(batches)
    assert s["valid_bytes"] == len(data)
    assert s["torn_tail"] is False


def test_zero_filled_log_tail(corpus, logdir):
    p = add_partition(corpus, logdir, "design-0")
    data = (p / LOG).read_bytes()
    nbatches = len(ref_batches(data))
    with open(p / LOG, "ab") as fh:
        fh.write(b"\0" * 4096)
    s = seg(probe(logdir, deep=True), "design-0")
    assert s["log_bytes"] == len(data) + 4096
    assert s["torn_tail"] is True
    assert "minimum record overhead (14)" in s["tail_error"]
    assert s["valid_bytes"] == len(data)
    assert s["batch_count"] == nbatches


# --------------------------------------------------------------------------------------------
# partition.metadata
PM_BAD = {
    "garbage_text": b"hello world, this is not a metadata file\n",
    "zero_uuid": b"version: 0\ntopic_id: AAAAAAAAAAAAAAAAAAAAAA",
    "short_id": b"version: 0\ntopic_id: JWzPWgOsTDqCV2TLEX2N3",
    "long_id": b"version: 0\ntopic_id: JWzPWgOsTDqCV2TLEX2N3gAA",
    "missing_topic_id_line": b"version: 0\n",
    "topic_id_only": b"topic_id: JWzPWgOsTDqCV2TLEX2N3g",
    "non_integer_version": b"version: zero\ntopic_id: JWzPWgOsTDqCV2TLEX2N3g",
    "negative_version": b"version: -1\ntopic_id: JWzPWgOsTDqCV2TLEX2N3g",
    "binary_junk": bytes(range(256)) * 2,
    "empty": b"",
}


@pytest.mark.parametrize("case", list(PM_BAD))
def test_malformed_partition_metadata(corpus, logdir, case):
    pm = add_partition(corpus, logdir, "design-0") / "partition.metadata"
    pm.write_bytes(PM_BAD[case])
    recs = probe(logdir)
    pr = partition(recs, "design-0")
    assert pr["partition_metadata_present"] is True
    assert pr["topic_id"] is None
    assert str(pm) in pr["partition_metadata_error"]
    fr = file_rec(recs, pm)
    assert fr["file_type"] == "partition_metadata"
    assert str(pm) in fr["error"]
    if case == "zero_uuid":
        assert "Invalid topic ID" in pr["partition_metadata_error"]
    # the rest of the partition is still read
    assert seg(recs, "design-0")["index_entries"] == DESIGN0_INDEX_ENTRIES


# --------------------------------------------------------------------------------------------
# leader-epoch-checkpoint
LEC_BAD = {
    "bad_version": (b"1\n1\n0 0\n", "Unrecognised version"),
    "count_mismatch": (b"0\n2\n0 0\n", "Expected [2] entries"),
    "non_integer": (b"0\n1\nzero 0\n", "Malformed line"),
    "three_fields": (b"0\n1\n0 0 0\n", "Malformed line"),
    "missing_count": (b"0\n", None),
    "non_integer_count": (b"0\nx\n0 0\n", None),
    "binary_junk": (b"\xff\xfe\x00\x01garbage\x80", None),
}


@pytest.mark.parametrize("case", list(LEC_BAD))
def test_malformed_leader_epoch_checkpoint(corpus, logdir, case):
    lec = add_partition(corpus, logdir, "design-0") / "leader-epoch-checkpoint"
    content, wording = LEC_BAD[case]
    lec.write_bytes(content)
    recs = probe(logdir)
    pr = partition(recs, "design-0")
    assert pr["leader_epoch_present"] is True
    assert pr["leader_epochs"] is None
    assert pr["latest_leader_epoch"] is None
    assert str(lec) in pr["leader_epoch_error"]
    if wording:
        assert wording in pr["leader_epoch_error"]
    assert str(lec) in file_rec(recs, lec)["error"]


@pytest.mark.parametrize(
    "content,expected",
    [
        (b"", []),  # a replica never assigned an epoch (MANIFEST: normal)
        (b"0\n0\n", []),
        (b"0\n3\n0 0\n4 13\n5 15\n", [[0, 0], [4, 13], [5, 15]]),
        # negative values parse (Kafka's checkpoint reader accepts them; LeaderEpochFileCache.assign
        # rejects them at load): the probe states the fact verbatim for the detection app to judge
        (b"0\n1\n-1 0\n", [[-1, 0]]),
    ],
    ids=["empty", "zero_entries", "three_entries", "negative_epoch"],
)
def test_valid_leader_epoch_checkpoint(corpus, logdir, content, expected):
    lec = add_partition(corpus, logdir, "design-0") / "leader-epoch-checkpoint"
    lec.write_bytes(content)
    recs = probe(logdir)
    pr = partition(recs, "design-0")
    assert pr["leader_epoch_error"] is None
    assert pr["leader_epochs"] == expected
    assert pr["latest_leader_epoch"] == (expected[-1][0] if expected else None)
    assert file_rec(recs, lec).get("error") is None


# --------------------------------------------------------------------------------------------
# Offset checkpoint files (log-dir root)
CHECKPOINTS = [
    "recovery-point-offset-checkpoint",
    "log-start-offset-checkpoint",
    "replication-offset-checkpoint",
    "cleaner-offset-checkpoint",
]
CP_BAD = {
    "bad_version": (b"1\n0\n", "Unrecognised version"),
    "count_mismatch": (b"0\n2\ndesign 0 5\n", "Expected [2] entries"),
    "malformed_line": (b"0\n1\ndesign 0\n", "Malformed line"),
    "non_integer_offset": (b"0\n1\ndesign 0 x\n", "Malformed line"),
    "non_integer_count": (b"0\nx\n", "Malformed line"),
    "binary_junk": (b"\x00\xff\x10garbage\x80", None),
}


def _cp_cases():
    for name in CHECKPOINTS:
        yield pytest.param(name, "bad_version", id=f"{name}-bad_version")
    for case in CP_BAD:
        if case != "bad_version":
            yield pytest.param(CHECKPOINTS[0], case, id=f"{CHECKPOINTS[0]}-{case}")


@pytest.mark.parametrize("cp,case", list(_cp_cases()))
def test_malformed_offset_checkpoint(corpus, logdir, cp, case):
    add_partition(corpus, logdir, "design-0")
    f = logdir / cp
    content, wording = CP_BAD[case]
    f.write_bytes(content)
    recs = probe(logdir)
    ld = logdir_rec(recs)
    assert ld["checkpoints"][cp]["entries"] is None
    assert str(f) in ld["checkpoints"][cp]["error"]
    if wording:
        assert wording in ld["checkpoints"][cp]["error"]
    fr = file_rec(recs, f)
    assert fr["file_type"] == "offset_checkpoint"
    assert str(f) in fr["error"]
    assert fr["entries"] is None


@pytest.mark.parametrize("cp", CHECKPOINTS)
def test_empty_offset_checkpoint_is_valid(corpus, logdir, cp):
    add_partition(corpus, logdir, "design-0")
    f = logdir / cp
    f.write_bytes(b"")
    recs = probe(logdir)
    assert logdir_rec(recs)["checkpoints"][cp] == {"entries": 0, "error": None}
    fr = file_rec(recs, f)
    assert fr["error"] is None
    assert fr["entries"] == []
    assert fr["bytes"] == 0


def test_valid_recovery_point_reaches_partition(corpus, logdir):
    add_partition(corpus, logdir, "design-0")
    (logdir / "recovery-point-offset-checkpoint").write_bytes(b"0\n2\ndesign 0 436\nother 3 7\n")
    recs = probe(logdir)
    assert logdir_rec(recs)["checkpoints"]["recovery-point-offset-checkpoint"] == {"entries": 2, "error": None}
    assert partition(recs, "design-0")["recovery_point"] == 436


# --------------------------------------------------------------------------------------------
# meta.properties
META_BAD = {
    "binary_junk": b"\xff\xfe\x00version=0\x80\n",
    "non_integer_broker_id": b"version=0\nbroker.id=abc\ncluster.id=x\n",
    "non_integer_version": b"version=zero\nbroker.id=0\n",
    "non_integer_node_id": b"version=1\nnode.id=one\n",
}


def test_meta_properties_baseline(corpus, logdir):
    add_file(corpus, logdir, "meta.properties")
    meta = logdir_rec(probe(logdir))["meta"]
    assert (meta["version"], meta["broker_id"], meta["cluster_id"]) == (0, 0, ARYAN_CLUSTER_ID)


@pytest.mark.parametrize("case", list(META_BAD))
def test_malformed_meta_properties(corpus, logdir, case):
    f = logdir / "meta.properties"
    f.write_bytes(META_BAD[case])
    recs = probe(logdir)
    ld = logdir_rec(recs)
    assert ld["meta"] is None
    assert str(f) in ld["meta_error"]
    assert str(f) in file_rec(recs, f)["error"]


# --------------------------------------------------------------------------------------------
# Garbage in segment files
def test_random_bytes_as_log(corpus, logdir):
    p = add_partition(corpus, logdir, "design-0")
    junk = random.Random(20240501).randbytes(8192)
    (p / LOG).write_bytes(junk)
    valid = ref_valid_bytes(junk)
    ents = index_entries((p / IDX).read_bytes())
    for verify in (False, True):
        s = seg(probe(logdir, deep=True, verify_crc=verify), "design-0")
        assert s["log_bytes"] == 8192
        assert s["valid_bytes"] == valid
        assert s["torn_tail"] is (valid != len(junk))
        assert s["batch_count"] == len(ref_batches(junk))
        assert s["index_beyond_log"] == sum(1 for _r, pos in ents if pos >= valid)
        assert s["error"] is None


@MODES
@pytest.mark.parametrize("which", ["index", "timeindex"])
def test_random_bytes_as_index(corpus, logdir, deep, which):
    p = add_partition(corpus, logdir, "design-0")
    esize = 8 if which == "index" else 12
    nbytes = 1000 if which == "index" else 996
    junk = random.Random(7 + esize).randbytes(nbytes)
    (p / (IDX if which == "index" else TIDX)).write_bytes(junk)
    ents = index_entries(junk) if which == "index" else timeindex_entries(junk)
    assert all(e != (0, 0) for e in ents)  # no zero entry, so every entry is "real"
    # independent order check: offset index strictly increasing offsets, non-decreasing positions;
    # time index non-decreasing in both fields
    viol = None
    for i in range(1, len(ents)):
        a, b = ents[i - 1], ents[i]
        bad = (b[0] <= a[0] or b[1] < a[1]) if which == "index" else (b[0] < a[0] or b[1] < a[1])
        if bad:
            viol = i
            break
    recs = probe(logdir, deep=deep)
    s = seg(recs, "design-0")
    assert s[f"{which}_bytes"] == nbytes
    assert s[f"{which}_entries"] == nbytes // esize
    assert s[f"{which}_zero_tail_entries"] == 0
    assert s[f"{which}_remainder"] == 0
    assert s[f"{which}_monotonic"] is (viol is None)
    assert s[f"{which}_first_violation"] == viol
    if deep and which == "index":
        assert s["index_checked"] == len(ents)  # every garbage entry is accounted for
        assert s["batch_count"] == len(ref_batches((p / LOG).read_bytes()))


# A directory where Kafka expects a file: Kafka's read fails (IOException), so the probe must say so.
DIR_TARGETS = [
    ("design-0", "partition.metadata"),
    ("design-0", "leader-epoch-checkpoint"),
    ("design-0", IDX),
    ("design-0", TIDX),
    ("design-0", LOG),
    ("recovery-point-offset-checkpoint",),
    ("meta.properties",),
]


@pytest.mark.parametrize("target", DIR_TARGETS, ids=lambda t: "/".join(t))
def test_directory_where_file_expected(corpus, logdir, target):
    add_partition(corpus, logdir, "design-0")
    add_file(corpus, logdir, "meta.properties")
    add_file(corpus, logdir, "recovery-point-offset-checkpoint")
    victim = logdir.joinpath(*target)
    victim.unlink()
    victim.mkdir()
    (victim / "inner").write_bytes(b"x")
    recs = probe(logdir, deep=True)
    assert errors_naming(recs, victim), f"no error names {victim}"
    if target[-1] in (IDX, TIDX, LOG):
        s = seg(recs, "design-0")
        assert str(victim) in s["error"]
        if target[-1] == LOG:
            assert s["has_log"] is False
        else:
            assert s["index_entries" if target[-1] == IDX else "timeindex_entries"] is None


# --------------------------------------------------------------------------------------------
# Unreadable files: tests run as root, so read as nobody via setpriv
NOBODY = ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups")


@pytest.fixture(scope="module")
def nobody_python() -> str:
    if shutil.which("setpriv") is None or os.geteuid() != 0:
        pytest.skip("needs root and setpriv to drop privileges")
    for cand in ("/usr/bin/python3", "/bin/python3", sys.executable):
        try:
            r = subprocess.run([*NOBODY, cand, "-c", "pass"], capture_output=True, timeout=30, check=False)
        except OSError:
            continue
        if r.returncode == 0:
            return cand
    pytest.fail("no python3 executable by uid 65534")


@pytest.fixture
def world_dir():
    """A temp dir uid 65534 can traverse (tmp_path sits under a 0700 dir)."""
    d = Path(tempfile.mkdtemp(prefix="fd-unreadable-"))
    os.chmod(d, 0o755)
    yield d
    for root, dirs, _files in os.walk(d):
        for n in dirs:
            os.chmod(os.path.join(root, n), 0o755)
    shutil.rmtree(d)


UNREADABLE_TARGETS = [
    ("design-0", "partition.metadata"),
    ("design-0", "leader-epoch-checkpoint"),
    ("design-0", IDX),
    ("design-0", TIDX),
    ("design-0", LOG),
    ("design-0",),
    ("recovery-point-offset-checkpoint",),
    ("meta.properties",),
]


@pytest.mark.parametrize("target", UNREADABLE_TARGETS, ids=lambda t: "/".join(t))
def test_unreadable_file(corpus, world_dir, nobody_python, target):
    ld = world_dir / "logs"
    ld.mkdir()
    add_partition(corpus, ld, "design-0")
    add_file(corpus, ld, "meta.properties")
    add_file(corpus, ld, "recovery-point-offset-checkpoint")
    for root, dirs, files in os.walk(ld):
        for n in dirs:
            os.chmod(os.path.join(root, n), 0o755)
        for n in files:
            os.chmod(os.path.join(root, n), 0o644)
    os.chmod(ld, 0o755)
    victim = ld.joinpath(*target)
    os.chmod(victim, 0)
    r = run_cli("--deep", str(ld), prefix=NOBODY, python=nobody_python)
    assert r.returncode == 0, r.stderr
    recs = parse_lines(r.stdout)
    assert recs[-1]["kind"] == "probe_end"
    assert errors_naming(recs, victim), f"no error names {victim}"
    if target == ("design-0",):
        assert str(victim) in partition(recs, "design-0")["error"]
    elif target[0] == "design-0" and target[-1] != LOG:
        # only the unreadable file is lost: the walk of the .log still happens
        assert seg(recs, "design-0")["batch_count"] == len(ref_batches((ld / "design-0" / LOG).read_bytes()))


# FIFOs: opening one for reading blocks until a writer appears; the probe must not hang on one.
@pytest.mark.parametrize(
    "target,deep",
    [
        (("design-0", "partition.metadata"), False),
        (("design-0", IDX), False),
        (("design-0", IDX), True),
        (("recovery-point-offset-checkpoint",), False),
    ],
    ids=["partition.metadata", "index", "index-deep", "recovery-point-offset-checkpoint"],
)
def test_fifo_where_file_expected_does_not_hang(corpus, logdir, target, deep):
    add_partition(corpus, logdir, "design-0")
    victim = logdir.joinpath(*target)
    if victim.exists():
        victim.unlink()
    os.mkfifo(victim)
    try:
        r = run_cli(*(["--deep"] if deep else []), str(logdir), timeout=3)
    except subprocess.TimeoutExpired:
        pytest.fail(f"probe hung opening the FIFO {victim}")
    assert r.returncode == 0
    recs = parse_lines(r.stdout)
    assert errors_naming(recs, victim), f"no error names {victim}"


# --------------------------------------------------------------------------------------------
# Symlinks pointing outside the log dir are reported, never followed
SYMLINK_TARGETS = [
    ("design-0",),
    ("design-0", LOG),
    ("design-0", IDX),
    ("design-0", "partition.metadata"),
    ("recovery-point-offset-checkpoint",),
]


@pytest.mark.parametrize("target", SYMLINK_TARGETS, ids=lambda t: "/".join(t))
def test_symlink_outside_logdir_not_followed(corpus, logdir, tmp_path, target):
    add_partition(corpus, logdir, "design-0")
    add_file(corpus, logdir, "recovery-point-offset-checkpoint")
    outside = tmp_path / "outside"
    outside.mkdir()
    link = logdir.joinpath(*target)
    real = outside / link.name
    shutil.move(link, real)
    os.symlink(real, link)
    recs = probe(logdir, deep=True)
    assert errors_naming(recs, link), f"no error names {link}"
    if target == ("design-0",):
        assert [r for r in recs if r["kind"] == "partition"] == []
        assert by_kind(recs, "segment") == []
        assert file_rec(recs, link)["file_type"] == "symlink"
        assert logdir_rec(recs)["partition_dirs"] == 0
    elif target[-1] == LOG:
        s = seg(recs, "design-0")
        assert s["has_log"] is False
        assert s.get("batch_count") is None  # not walked
    elif target[-1] == IDX:
        s = seg(recs, "design-0")
        assert s["index_entries"] is None
        assert s.get("index_checked") is None  # not matched against the log either
    elif target[-1] == "partition.metadata":
        assert partition(recs, "design-0")["topic_id"] is None
    else:
        assert "recovery-point-offset-checkpoint" not in logdir_rec(recs)["checkpoints"]
        assert partition(recs, "design-0")["recovery_point"] is None


def test_symlink_inside_logdir_is_followed(corpus, logdir):
    p = add_partition(corpus, logdir, "design-0")
    n = len(ref_batches((p / LOG).read_bytes()))
    stash = logdir / "stash"
    stash.mkdir()
    shutil.move(p / LOG, stash / LOG)
    os.symlink(stash / LOG, p / LOG)
    s = seg(probe(logdir, deep=True), "design-0")
    assert s["error"] is None
    assert s["batch_count"] == n


# --------------------------------------------------------------------------------------------
# Names
def test_unicode_topic_name_cli(corpus, logdir):
    name = "tópic ünï 名-0"
    add_partition(corpus, logdir, "design-0", as_name=name)
    r = run_cli("--deep", str(logdir))
    assert r.returncode == 0
    recs = parse_lines(r.stdout)
    pr = partition(recs, name)
    assert (pr["topic"], pr["partition"], pr["dir_state"]) == ("tópic ünï 名", 0, "live")
    assert pr["path"] == str(logdir / name)
    s = seg(recs, name)
    assert s["topic"] == "tópic ünï 名"
    assert s["index_entries"] == DESIGN0_INDEX_ENTRIES


def test_undecodable_file_names_round_trip(corpus, logdir):
    bad_dir = b"bad\xff\xfename-3"
    bad_file = b"junk\xff\xc3(.bin"
    pdir = add_partition(corpus, logdir, "design-0", as_name=os.fsdecode(bad_dir))
    with open(os.path.join(os.fsencode(pdir), bad_file), "wb") as fh:
        fh.write(b"12345")
    r = run_cli("--deep", str(logdir))
    assert r.returncode == 0
    recs = parse_lines(r.stdout)  # every line is JSON
    pr = [x for x in recs if x["kind"] == "partition"]
    assert len(pr) == 1
    assert os.fsencode(pr[0]["dir"]) == bad_dir
    assert os.fsencode(pr[0]["topic"]) == b"bad\xff\xfename"
    assert pr[0]["partition"] == 3
    want = os.path.join(os.fsencode(pdir), bad_file)
    files = [x for x in recs if x["kind"] == "file" and os.fsencode(x["path"]) == want]
    assert len(files) == 1
    assert files[0]["bytes"] == 5
    assert seg(recs, pr[0]["dir"])["index_entries"] == DESIGN0_INDEX_ENTRIES


def test_non_ascii_digit_segment_name(corpus, logdir):
    # str.isdigit() is true for superscript digits but int() rejects them: the name is just an
    # unknown file, and must not cost the partition its other records
    p = add_partition(corpus, logdir, "design-0")
    odd = "²" * 20 + ".log"
    (p / odd).write_bytes(b"")
    recs = probe(logdir, deep=True)
    pr = partition(recs, "design-0")
    assert pr["error"] is None
    assert seg(recs, "design-0")["index_entries"] == DESIGN0_INDEX_ENTRIES
    assert file_rec(recs, p / odd)["bytes"] == 0


@pytest.mark.parametrize("state", ["delete", "future", "stray"])
def test_suffixed_partition_dirs(corpus, logdir, state):
    uid = "0123456789abcdef0123456789abcdef"
    name = f"design-0.{uid}-{state}"
    add_partition(corpus, logdir, "design-0", as_name=name)
    recs = probe(logdir, deep=True)
    pr = partition(recs, name)
    assert (pr["topic"], pr["partition"], pr["dir_state"], pr["dir_uid"]) == ("design", 0, state, uid)
    assert seg(recs, name)["index_entries"] == DESIGN0_INDEX_ENTRIES


def test_synthetic_segment_leftovers(corpus, logdir):
    p = add_partition(corpus, logdir, "design-0")
    made = {
        "00000000000000000000.log.deleted": ("log", "deleted", 100),
        "00000000000000000000.index.swap": ("index", "swap", 16),
        "00000000000000000000.timeindex.cleaned": ("timeindex", "cleaned", 24),
        "00000000000000000000.txnindex.deleted": ("txnindex", "deleted", 0),
        "00000000000000000436.snapshot.deleted": ("snapshot", "deleted", 10),
    }
    for n, (_ext, _suf, size) in made.items():
        (p / n).write_bytes(b"\x01" * size)
    recs = probe(logdir, deep=True)
    for n, (ext, suf, size) in made.items():
        fr = file_rec(recs, p / n)
        assert fr["file_type"] == "segment_leftover"
        assert (fr["base_offset"], fr["segment_file"], fr["leftover"], fr["bytes"]) == (
            int(n[:20]),
            ext,
            suf,
            size,
        )
    pr = partition(recs, "design-0")
    assert pr["leftover_files"] == len(made)
    assert pr["segment_count"] == 1
    assert seg(recs, "design-0")["batch_count"] == len(ref_batches((p / LOG).read_bytes()))


def test_genuine_cleaner_leftovers(corpus):
    # MANIFEST zk-3.3-cleaner-swap-geraldine: __consumer_offsets-18 stopped mid-clean
    recs = probe(corpus / GERALDINE, deep=True)
    d = "__consumer_offsets-18"
    left = {Path(r["path"]).name: r for r in recs if r.get("file_type") == "segment_leftover"}
    assert {n: (r["segment_file"], r["leftover"], r["bytes"], r["base_offset"]) for n, r in left.items()} == {
        "00000000000000000000.log.swap": ("log", "swap", 230, 0),
        "00000000000000000000.index.swap": ("index", "swap", 0, 0),
        "00000000000000000000.timeindex.cleaned": ("timeindex", "cleaned", 12, 0),
    }
    assert all(r["partition_dir"] == d for r in left.values())
    pr = partition(recs, d)
    assert pr["leftover_files"] == 3
    assert [s["base_offset"] for s in segments(recs, d)] == [0, 15]
    s0, s15 = seg(recs, d, 0), seg(recs, d, 15)
    assert (s0["log_bytes"], s0["batch_count"], s0["first_offset"], s0["last_offset"]) == (2849, 15, 0, 14)
    assert (s15["log_bytes"], s15["first_offset"], s15["last_offset"]) == (799, 15, 17)


@pytest.mark.slow
def test_huge_partition_dir(corpus, logdir):
    p = add_partition(corpus, logdir, "design-0")
    n_seg, n_junk = 10_000, 10_000
    for i in range(n_seg):
        open(p / f"{1000 + i:020d}.log", "wb").close()
    for i in range(n_junk):
        open(p / f"junk-{i:05d}", "wb").close()
    recs = probe(logdir, deep=True)
    pr = partition(recs, "design-0")
    assert pr["error"] is None
    assert pr["segment_count"] == n_seg + 1
    assert len(segments(recs, "design-0")) == n_seg + 1
    junk = [r for r in recs if r["kind"] == "file" and Path(r["path"]).name.startswith("junk-")]
    assert len(junk) == n_junk
    assert all(r["file_type"] == "unknown" for r in junk)
    assert recs[-1]["segments"] == n_seg + 1


# --------------------------------------------------------------------------------------------
# CLI
@pytest.mark.parametrize("kind", ["missing", "regular_file"])
def test_cli_bad_logdir_path(tmp_path, kind):
    target = tmp_path / "no" / "such" / "logdir"
    if kind == "regular_file":
        target = tmp_path / "afile"
        target.write_bytes(b"not a dir")
    r = run_cli(str(target))
    assert r.returncode == 0, r.stderr
    recs = parse_lines(r.stdout)
    assert [x["kind"] for x in recs] == ["probe", "logdir", "probe_end"]
    ld = recs[1]
    assert ld["exists"] is False
    assert str(target) in ld["error"]
    assert recs[-1]["errors"] == 1
    assert recs[-1]["complete"] is True


def test_corpus_left_unmodified(corpus):
    # every mutation above worked on a copy: the genuine files still read as MANIFEST says
    d = corpus / ARYAN / "design-0"
    idx = (d / IDX).read_bytes()
    assert len(idx) == DESIGN0_INDEX_BYTES
    assert index_entries(idx)[-1] == DESIGN0_INDEX_LAST
    assert (d / LOG).stat().st_size == 55300
    assert ref_valid_bytes((d / LOG).read_bytes()) == 55300
    assert (d / "partition.metadata").read_bytes() == b"version: 0\ntopic_id: " + DESIGN_TOPIC_ID.encode()


def test_deep_full_scan_of_a_preallocated_index_skips_the_zero_tail_but_counts_it(tmp_path: Path) -> None:
    """Deep mode reads every real entry; the 10 MiB preallocated tail is found from the end in bulk
    (a running broker's active indexes must not cost a Python loop over 1.3 M zero entries each)."""
    from fleet_doctor.probe import OFFSET_INDEX, TIME_INDEX, read_index_summary

    idx = tmp_path / "00000000000000000100.index"
    entries = [(5, 0), (9, 4200), (0, 0), (20, 9000)]  # a zero entry inside: not part of the tail
    idx.write_bytes(b"".join(OFFSET_INDEX.entry.pack(*e) for e in entries))
    with open(idx, "r+b") as f:
        f.truncate(10485760)
    s = read_index_summary(str(idx), OFFSET_INDEX, full=True)
    assert s["entries"] == 4 and s["zero_tail_entries"] == 10485760 // 8 - 4
    assert s["zero_entries_inside"] == 1 and s["last"] == (20, 9000) and s["monotonic"] is False
    tidx = tmp_path / "00000000000000000100.timeindex"
    tidx.write_bytes(TIME_INDEX.entry.pack(1000, 3) + TIME_INDEX.entry.pack(2000, 7) + b"\0" * (10485756 - 24))
    t = read_index_summary(str(tidx), TIME_INDEX, full=True)
    assert t["entries"] == 2 and t["zero_tail_entries"] == 10485756 // 12 - 2 and t["monotonic"] is True
    empty = tmp_path / "00000000000000000200.index"
    empty.write_bytes(b"\0" * 4096)
    e = read_index_summary(str(empty), OFFSET_INDEX, full=True)
    assert e["entries"] == 0 and e["zero_tail_entries"] == 512


def test_deep_scan_reads_no_hole_of_a_sparse_preallocated_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kafka preallocates an active index with RandomAccessFile.setLength: on ext4/XFS the 10 MiB tail is a hole.
    Deep mode asks the file system where the data ends (SEEK_DATA / SEEK_HOLE) and reads only up to there; the
    summary is the one of the same entries followed by written zeros, which are read."""
    from fleet_doctor.probe import OFFSET_INDEX, TIME_INDEX, read_index_summary

    read = []
    real_pread = os.pread
    monkeypatch.setattr(os, "pread", lambda fd, n, pos: read.append(n) or real_pread(fd, n, pos))
    for fmt, size, entries in (
        (OFFSET_INDEX, 10485760, [(5, 0), (9, 4200), (0, 0), (20, 9000)]),
        (TIME_INDEX, 10485756, [(1000, 3), (2000, 7)]),
    ):
        data = b"".join(fmt.entry.pack(*e) for e in entries)
        sparse, written = tmp_path / f"sparse.{fmt.ext}", tmp_path / f"written.{fmt.ext}"
        sparse.write_bytes(data)
        os.truncate(sparse, size)  # setLength: a hole after the first block
        written.write_bytes(data + bytes(size - len(data)))
        fd = os.open(sparse, os.O_RDONLY)
        try:
            if os.lseek(fd, 0, os.SEEK_HOLE) >= size:
                pytest.skip("this file system reports no holes (lseek SEEK_HOLE)")
        finally:
            os.close(fd)
        read.clear()
        from_sparse = read_index_summary(str(sparse), fmt, full=True)
        assert sum(read) <= 1 << 16, "the hole was read"
        read.clear()
        assert read_index_summary(str(written), fmt, full=True) == from_sparse
        assert sum(read) >= size - (1 << 20)  # written zeros are data: read to find the tail
    # a hole between data: the data after it is found and read
    mid = tmp_path / "mid.index"
    with open(mid, "wb") as f:
        f.write(OFFSET_INDEX.entry.pack(5, 0))
        f.seek(4 << 20)
        f.write(OFFSET_INDEX.entry.pack(9, 4200))
        f.truncate(10485760)
    s = read_index_summary(str(mid), OFFSET_INDEX, full=True)
    assert s["entries"] == (4 << 20) // 8 + 1 and s["last"] == (9, 4200)


def _probe_records(path: Path) -> list[dict]:
    import io

    from fleet_doctor.probe import Probe

    out = io.StringIO()
    Probe(out).run([str(path)])
    recs = [json.loads(line) for line in out.getvalue().splitlines()]
    for r in recs:
        r.pop("started_at_ms", None)
        r.pop("elapsed_ms", None)
    return recs


def test_metadata_fast_path_batches_and_their_fallback_give_the_same_records(tmp_path: Path, monkeypatch) -> None:
    """The fast branch (usual segments in batches of system calls) and the per-segment path it falls back to
    on any error must print the same records, for any batch size."""
    import importlib.util

    from fleet_doctor import probe

    spec = importlib.util.spec_from_file_location(
        "gen_tree", Path(__file__).resolve().parents[1] / "bench" / "gen_tree.py"
    )
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    tree = tmp_path / "tree"
    gen.generate(str(tree), 700, 25, 3)
    reference = _probe_records(tree)
    assert sum(r["kind"] == "segment" for r in reference) == 700
    for chunk in (1, 3, 64):
        monkeypatch.setattr(probe, "_SEGMENT_BATCH", chunk)
        assert _probe_records(tree) == reference, chunk

    calls = []

    def broken(*args, **kwargs):
        calls.append(1)
        raise OSError("simulated: a file vanished during the batch")

    monkeypatch.setattr(probe, "_regular_segments", broken)
    assert _probe_records(tree) == reference
    assert len(calls) >= 700 // 64  # the fast path was really taken, and every batch fell back
