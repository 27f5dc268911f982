"""Property-based tests of the probe's parsers and walkers (hypothesis).

Contract under test:
* the text parsers (checkpoints, partition.metadata, meta.properties) may raise ONLY ValueError,
  whose message names the file: the probe turns it into an error record;
* the binary readers and name parsers raise nothing on any input;
* the probe as a whole never raises and prints only JSON lines, whatever bytes the files hold.
"""

from __future__ import annotations

import base64
import functools
import gzip
import io
import itertools
import json
import operator
import os
import re
import struct
import tempfile
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from fleet_doctor import probe as P
from harness.corpus import CORPUS
from harness.kafka_ref import ref_batches, ref_valid_bytes

FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
FUZZ_SLOW = settings(FUZZ, max_examples=100)

FAKE_PATH = "/fuzz/logdir/t-0/some-file"
DESIGN0 = CORPUS / "zk-3.1-single-aryan" / "kafka-logs" / "design-0" / "00000000000000000000.log"
FOO0 = CORPUS / "zk-0.10-v1format-3zk-xpx" / "kafka-logs" / "foo-0" / "00000000000000000000.log"


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


def write(scratch: Path, name: str, data: bytes) -> str:
    p = scratch / name
    p.write_bytes(data)
    return str(p)


# --------------------------------------------------------------------------------------------
# Strategies
TEXTY = st.text(alphabet=" \t\r\n0123456789-+_:=#!.,abcxyzAQgw²٣\u00e9", max_size=24)
LINE = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63).map(str),
    st.sampled_from(
        [
            "0",
            "1",
            "version: 0",
            "version: 1",
            "version:0",
            "topic_id: JWzPWgOsTDqCV2TLEX2N3g",
            "topic_id: AAAAAAAAAAAAAAAAAAAAAA",
            "topic_id: ",
            "design 0 436",
            "0 0",
            "broker.id=0",
            "node.id=x",
            "version=1",
            "cluster.id=4fi2MkU0Ql2L0cPRncY20Q",
            "a\\=b=c",
            "",
        ]
    ),
    TEXTY,
)
STRUCTURED_TEXT = st.lists(LINE, max_size=8).map(lambda ls: "\n".join(ls).encode("utf-8"))
ANY_BYTES = st.one_of(st.binary(max_size=400), STRUCTURED_TEXT)


# --------------------------------------------------------------------------------------------
# Text parsers: only ValueError, naming the file
def _check_only_value_error(fn, data):
    try:
        return True, fn(data, FAKE_PATH)
    except ValueError as e:
        assert FAKE_PATH in str(e), f"error does not name the file: {e}"
        return False, None


@FUZZ
@given(data=ANY_BYTES)
@example(data=b"0\n1\n")
@example(data=b"0\n")
@example(data=b"\n\n")
def test_parse_offset_checkpoint(data):
    ok, out = _check_only_value_error(P.parse_offset_checkpoint, data)
    if ok:
        entries, version = out
        assert version in (0, None)
        if version is None:
            assert entries == []
        for e in entries:
            assert isinstance(e[0], str) and e[0]
            assert isinstance(e[1], int) and isinstance(e[2], int)


@FUZZ
@given(data=ANY_BYTES)
@example(data=b"0")
@example(data=b"0\n1\n0 0\n\n")
def test_parse_leader_epoch_checkpoint(data):
    ok, out = _check_only_value_error(P.parse_leader_epoch_checkpoint, data)
    if ok:
        assert all(len(e) == 2 and all(isinstance(x, int) for x in e) for e in out)


@FUZZ
@given(data=ANY_BYTES)
@example(data=b"version: 0\ntopic_id: JWzPWgOsTDqCV2TLEX2N3g")
@example(data=b"version: 0\nversion: 0")
def test_parse_partition_metadata(data):
    ok, out = _check_only_value_error(P.parse_partition_metadata, data)
    if ok:
        assert isinstance(out["version"], int) and out["version"] >= 0
        assert P.valid_topic_id(out["topic_id"])
        assert out["topic_id"] != P.ZERO_UUID


@FUZZ
@given(data=ANY_BYTES)
@example(data=b"version=1\nnode.id=3\ndirectory.id=XHhkr4tkSsD900pOQ8pPfg")
def test_parse_meta_properties(data):
    ok, out = _check_only_value_error(P.parse_meta_properties, data)
    if ok:
        assert set(out) >= {"properties", "version", "broker_id", "cluster_id", "directory_id"}
        assert out["broker_id"] is None or isinstance(out["broker_id"], int)


@FUZZ
@given(data=ANY_BYTES)
def test_parse_properties(data):
    ok, out = _check_only_value_error(P.parse_properties, data)
    if ok:
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in out.items())


# --------------------------------------------------------------------------------------------
# Index summary
INDEX_FORMATS = {"index": P.OFFSET_INDEX, "timeindex": P.TIME_INDEX}


@FUZZ
@given(data=st.binary(max_size=9000), which=st.sampled_from(list(INDEX_FORMATS)), full=st.booleans())
@example(data=b"", which="index", full=False)
@example(data=b"\0" * 5000, which="timeindex", full=False)
def test_read_index_summary_random(scratch, data, which, full):
    s = INDEX_FORMATS[which]
    out = P.read_index_summary(write(scratch, "random.idx", data), s, full=full)
    n = len(data) // s.size
    assert out["bytes"] == len(data)
    assert out["remainder"] == len(data) % s.size
    assert out["entries"] + out["zero_tail_entries"] == n
    assert 0 <= out["entries"] <= n
    assert 0 <= out["checked_entries"] <= out["entries"]
    if out["entries"] == 0:
        assert out["last"] is None


def _nonzero_entries(which):
    if which == "index":
        e = st.tuples(st.integers(-(2**31), 2**31 - 1), st.integers(-(2**31), 2**31 - 1))
    else:
        e = st.tuples(st.integers(-(2**63), 2**63 - 1), st.integers(-(2**31), 2**31 - 1))
    return e.filter(lambda t: t != (0, 0))


@st.composite
def index_with_zero_tail(draw):
    which = draw(st.sampled_from(list(INDEX_FORMATS)))
    ents = draw(st.lists(_nonzero_entries(which), max_size=700))
    tail = draw(st.integers(0, 2000))
    extra = draw(st.binary(max_size=draw(st.integers(0, INDEX_FORMATS[which].size - 1))))
    return which, ents, tail, extra


@FUZZ
@given(case=index_with_zero_tail(), full=st.booleans())
def test_read_index_summary_zero_tail(scratch, case, full):
    """Non-zero entries then a preallocated zero tail: both modes find exactly the real entries."""
    which, ents, tail, extra = case
    s = INDEX_FORMATS[which]
    data = b"".join(s.entry.pack(*e) for e in ents) + b"\0" * (tail * s.size) + extra
    out = P.read_index_summary(write(scratch, "tail.idx", data), s, full=full)
    assert out["entries"] == len(ents)
    assert out["zero_tail_entries"] == tail
    assert out["remainder"] == len(extra)
    assert out["last"] == (tuple(ents[-1]) if ents else None)
    assert out["first"] == (tuple(ents[0]) if ents else None)


def _ref_in_order(which: str, prev: tuple, entry: tuple) -> bool:
    """docs/kafka-reference.md §1.1, written out here on its own: offset index, relative offsets strictly increase
    and positions never decrease; time index, timestamps and offsets never decrease."""
    if which == "index":
        return entry[0] > prev[0] and entry[1] >= prev[1]
    return entry[0] >= prev[0] and entry[1] >= prev[1]


def _ref_first_violation(which: str, ents: list) -> int | None:
    return next((i for i in range(1, len(ents)) if not _ref_in_order(which, ents[i - 1], ents[i])), None)


@st.composite
def index_case(draw):
    """An index's entries as they go wrong: small values so that equal and decreasing neighbours are common, up to
    1300 entries (several times a 4 KiB head), with zeros anywhere, then a zero tail and a partial entry."""
    which = draw(st.sampled_from(list(INDEX_FORMATS)))
    value = st.one_of(st.integers(-3, 60), st.integers(-(2**31), 2**31 - 1))
    step = st.tuples(st.integers(-2, 9), st.integers(-2, 9))
    start = draw(st.tuples(value, value))
    steps = draw(st.lists(step, max_size=1300))
    ents = [start]
    for d in steps:
        ents.append((ents[-1][0] + d[0], ents[-1][1] + d[1]))
    lo = (-(2**31), -(2**31)) if which == "index" else (-(2**63), -(2**31))
    hi = (2**31 - 1, 2**31 - 1) if which == "index" else (2**63 - 1, 2**31 - 1)
    ents = [tuple(max(lo[k], min(hi[k], e[k])) for k in (0, 1)) for e in ents]
    for i in draw(st.lists(st.integers(0, len(ents) - 1), max_size=3)):
        ents[i] = (0, 0)
    tail = draw(st.integers(0, 600))
    extra = draw(st.binary(max_size=INDEX_FORMATS[which].size - 1))
    return which, ents, tail, extra


@FUZZ
@given(case=index_case())
@example(case=("index", [(i + 1, i) for i in range(512)], 0, b""))  # a head exactly full, clean
@example(case=("index", [(i + 1, i) for i in range(513)], 0, b""))  # one entry past the head
@example(case=("timeindex", [(i, i) for i in range(341)] + [(5, 400)], 3, b"\1"))  # the last entry out of order
def test_index_summaries_agree_with_a_reference_model(scratch, case):
    """Both summaries against the rules of docs/kafka-reference.md §1.1 written out on their own. Deep mode checks
    every entry; metadata mode reads the 4 KiB head and the last real entry, and finds the zero tail by binary
    search (so its inputs here have zeros only in the tail)."""
    which, ents, tail, extra = case
    fmt = INDEX_FORMATS[which]
    data = b"".join(fmt.entry.pack(*e) for e in ents) + bytes(tail * fmt.size) + extra
    path = write(scratch, "model.idx", data)
    n = len(data) // fmt.size
    real = max((i + 1 for i, e in enumerate(ents) if e != (0, 0)), default=0)
    viol = _ref_first_violation(which, ents[:real])
    full = P.read_index_summary(path, fmt, full=True)
    assert full == {
        "bytes": len(data),
        "entries": real,
        "zero_tail_entries": n - real,
        "remainder": len(extra),
        "monotonic": (viol is None) if real else None,
        "checked_entries": real,
        "first_violation": viol,
        "first": next((e for e in ents if e != (0, 0)), None),
        "last": ents[real - 1] if real else None,
        "zero_entries_inside": sum(e == (0, 0) for e in ents[:real]),
    }
    ents = [e for e in ents if e != (0, 0)]  # metadata mode: real entries, then the tail
    data = b"".join(fmt.entry.pack(*e) for e in ents) + bytes(tail * fmt.size) + extra
    head = P.HEAD_READ_BYTES // fmt.size
    checked = min(len(ents), head)
    viol = _ref_first_violation(which, ents[:checked])
    if viol is None and len(ents) > checked and not _ref_in_order(which, ents[checked - 1], ents[-1]):
        viol = len(ents) - 1
    assert P.read_index_summary(write(scratch, "model.idx", data), fmt) == {
        "bytes": len(data),
        "entries": len(ents),
        "zero_tail_entries": len(data) // fmt.size - len(ents),
        "remainder": len(extra),
        "monotonic": (viol is None) if ents else None,
        "checked_entries": checked,
        "first_violation": viol,
        "first": ents[0] if ents else None,
        "last": ents[-1] if ents else None,
    }


@pytest.mark.parametrize("which", list(INDEX_FORMATS))
def test_index_order_rule_is_data(which):
    """Each index kind's order rule is one operator per entry field (ref §1.1), and the checks follow it."""
    fmt = INDEX_FORMATS[which]
    assert fmt.order == ((operator.lt, operator.le) if which == "index" else (operator.le, operator.le))
    for a, b in itertools.product([(1, 5), (2, 5), (1, 6), (0, 4), (2, 4)], repeat=2):
        flat = a + b
        assert fmt.ordered(flat) == _ref_in_order(which, a, b)
        assert fmt.first_violation(flat) == (None if _ref_in_order(which, a, b) else 1)


# --------------------------------------------------------------------------------------------
# walk_log
@st.composite
def batch_like(draw):
    """Bytes that look like a run of batches: plausible size fields and magics, random contents,
    maybe a torn tail, so the walker goes past the first header."""
    out = b""
    for _ in range(draw(st.integers(0, 6))):
        length = draw(st.one_of(st.integers(-3, 120), st.integers(-(2**31), 2**31 - 1)))
        magic = draw(st.sampled_from([0, 1, 2, 3, 255]))
        attrs = draw(st.integers(0, 255))
        body_len = max(0, min(length - 6, 300)) if length >= 6 else 0
        body = draw(st.binary(min_size=body_len, max_size=body_len))
        out += struct.pack(
            ">qiIbB", draw(st.integers(-5, 5000)), length, 0, magic - 256 if magic > 127 else magic, attrs
        )
        out += body
    out += draw(st.binary(max_size=40))
    return out


@FUZZ
@given(
    data=st.one_of(st.binary(max_size=2000), batch_like()),
    verify=st.booleans(),
    base=st.one_of(st.none(), st.integers(0, 10_000)),
)
@example(data=b"\0" * 16, verify=False, base=None)
@example(data=b"\0" * 17, verify=True, base=0)
def test_walk_log_random(scratch, data, verify, base):
    w = P.walk_log(write(scratch, "random.log", data), base, verify_crc=verify)
    ref = ref_valid_bytes(data)
    assert 0 <= w["valid_bytes"] <= len(data)
    if verify:
        assert w["valid_bytes"] <= ref
        assert w["valid_bytes"] in {0} | {p + s for p, s in ref_batches(data)}
    else:
        assert w["valid_bytes"] == ref
        assert w["batch_count"] == len(ref_batches(data))
    if not w["torn_tail"] and w["crc_errors"] == 0:
        assert w["valid_bytes"] == len(data)
    json.dumps(w)  # the probe serialises it as is


def _prefix_batches(path: Path, n: int) -> bytes:
    data = path.read_bytes()
    b = ref_batches(data)
    assert len(b) >= n
    return data[: b[n - 1][0] + b[n - 1][1]]


@functools.cache
def real_sequences() -> dict[str, bytes]:
    """The first 30 genuine batches of a v2 log and of a v1 log from the corpus."""
    return {"v2-design-0": _prefix_batches(DESIGN0, 30), "v1-foo-0": _prefix_batches(FOO0, 30)}


@st.composite
def mutated_real(draw):
    name = draw(st.sampled_from(["v1-foo-0", "v2-design-0"]))
    orig = real_sequences()[name]
    data = bytearray(orig)
    muts = draw(st.lists(st.tuples(st.integers(0, len(orig) - 1), st.integers(0, 255)), max_size=6))
    for pos, val in muts:
        data[pos] = val
    cut = draw(st.one_of(st.none(), st.integers(0, len(orig))))
    if cut is not None:
        data = data[:cut]
    return name, bytes(data), muts, cut


@FUZZ
@given(case=mutated_real(), verify=st.booleans())
def test_walk_log_mutated_real_batches(scratch, case, verify):
    name, data, muts, cut = case
    orig = real_sequences()[name]
    w = P.walk_log(write(scratch, "mutated.log", data), 0, verify_crc=verify)
    assert 0 <= w["valid_bytes"] <= len(data)
    # every original batch that ends before the first change is still valid
    first_change = min([p for p, v in muts if orig[p] != v] + [cut if cut is not None else len(orig)])
    intact = [p + s for p, s in ref_batches(orig) if p + s <= first_change]
    assert w["valid_bytes"] >= (intact[-1] if intact else 0)
    if not verify:
        assert w["valid_bytes"] == ref_valid_bytes(data)
    if data == orig:
        assert w["valid_bytes"] == len(orig)
        assert w["batch_count"] == 30
        assert w["crc_errors"] == 0


# --------------------------------------------------------------------------------------------
# Legacy compressed wrappers and snappy
@FUZZ
@given(wrapper=st.binary(max_size=300), magic=st.sampled_from([0, 1]), codec=st.integers(0, 7))
@example(wrapper=b"", magic=0, codec=1)
@example(wrapper=b"\0" * 40, magic=1, codec=2)
def test_count_legacy_inner_random(wrapper, magic, codec):
    out = P.count_legacy_inner(wrapper, magic, codec)
    assert out is None or (isinstance(out, int) and out >= 0)


@FUZZ
@given(data=st.binary(max_size=300))
@example(data=b"")
@example(data=b"\x05\x00")
@example(data=b"\x82SNAPPY\x00" + b"\0" * 8 + b"\0\0\0\x05ab")
def test_snappy_decompress_random(data):
    out = P._snappy_decompress(data)
    assert out is None or isinstance(out, bytes)


def _snappy_literals(data: bytes) -> bytes:
    """Encode data as a raw snappy block of literal elements only (format_description.txt)."""
    n = len(data)
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            break
    for i in range(0, len(data), 60):
        chunk = data[i : i + 60]
        out.append((len(chunk) - 1) << 2)
        out += chunk
    return bytes(out)


@FUZZ
@given(data=st.binary(max_size=500), xerial=st.booleans())
def test_snappy_literal_round_trip(data, xerial):
    block = _snappy_literals(data)
    if xerial:
        block = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1) + struct.pack(">i", len(block)) + block
    assert P._snappy_decompress(block) == data


def _v1_message(offset: int, value: bytes, attrs: int = 0) -> bytes:
    body = struct.pack(">bbq", 1, attrs, 1_500_000_000_000) + struct.pack(">i", -1) + struct.pack(">i", len(value))
    body += value
    crc = zlib.crc32(body)
    return struct.pack(">qiI", offset, 4 + len(body), crc) + body


@FUZZ
@given(values=st.lists(st.binary(max_size=40), min_size=1, max_size=20), codec=st.sampled_from([1, 2]))
def test_count_legacy_inner_counts_wrapped_messages(values, codec):
    inner = b"".join(_v1_message(i, v) for i, v in enumerate(values))
    payload = gzip.compress(inner) if codec == 1 else _snappy_literals(inner)
    wrapper = _v1_message(len(values) - 1, payload, attrs=codec)
    assert P.count_legacy_inner(wrapper, 1, codec) == len(values)


# --------------------------------------------------------------------------------------------
# Names
@FUZZ
@given(name=st.one_of(st.text(max_size=40), st.from_regex(r"\A[0-9²٣]{20}\.[a-z]{3,9}(\.[a-z]{4,7})?\Z")))
@example(name="²" * 20 + ".log")
@example(name="00000000000000000000.log.swap")
@example(name="0000000000000000000.log")
def test_parse_segment_file_name_total(name):
    out = P.parse_segment_file_name(name)
    if out is not None:
        base, ext, suffix = out
        assert base >= 0
        assert ext in (*P.SEGMENT_EXTENSIONS, "snapshot")
        assert suffix in (None, *P.LEFTOVER_SUFFIXES)


@FUZZ
@given(
    base=st.integers(0, 10**20 - 1),
    ext=st.sampled_from([*P.SEGMENT_EXTENSIONS, "snapshot"]),
    suffix=st.sampled_from([None, *P.LEFTOVER_SUFFIXES]),
)
def test_segment_file_name_round_trip(base, ext, suffix):
    name = P.segment_file_name(base, ext) + ("." + suffix if suffix else "")
    assert P.parse_segment_file_name(name) == (base, ext, suffix)


@FUZZ
@given(name=st.text(max_size=60))
@example(name="-0")
@example(name="a-٣")
def test_parse_partition_dir_name_total(name):
    out = P.parse_partition_dir_name(name)
    if out is not None:
        assert out["partition"] >= 0
        assert out["dir_state"] in ("live", "delete", "future", "stray")


TOPIC = st.from_regex(r"\A[a-zA-Z0-9._-]{1,60}\Z")


@FUZZ
@given(
    topic=TOPIC,
    part=st.integers(0, 10**6),
    state=st.sampled_from([None, "delete", "future", "stray"]),
    uid=st.from_regex(r"\A[0-9a-f]{32}\Z"),
)
def test_partition_dir_name_round_trip(topic, part, state, uid):
    name = f"{topic}-{part}" + (f".{uid}-{state}" if state else "")
    assert P.parse_partition_dir_name(name) == {
        "topic": topic,
        "partition": part,
        "dir_state": state or "live",
        "dir_uid": uid if state else None,
    }


def _is_kafka_uuid(text: str) -> bool:
    """Independent: 22 url-safe base64 chars that decode to 16 bytes and re-encode identically."""
    if not re.fullmatch(r"[A-Za-z0-9_-]{22}", text):
        return False
    raw = base64.urlsafe_b64decode(text + "==")
    return len(raw) == 16 and base64.urlsafe_b64encode(raw).rstrip(b"=").decode() == text


@FUZZ
@given(text=st.one_of(st.text(max_size=30), st.from_regex(r"\A[A-Za-z0-9_-]{21,23}\n?\Z")))
@example(text="AAAAAAAAAAAAAAAAAAAAAQ\n")
@example(text="JWzPWgOsTDqCV2TLEX2N3h")
def test_valid_topic_id_matches_base64(text):
    assert P.valid_topic_id(text) is _is_kafka_uuid(text)


@FUZZ
@given(raw=st.binary(min_size=16, max_size=16))
def test_valid_topic_id_accepts_every_uuid(raw):
    assert P.valid_topic_id(base64.urlsafe_b64encode(raw).rstrip(b"=").decode())


# --------------------------------------------------------------------------------------------
# The whole probe on a partition of random files
PARTITION_FILES = [
    "00000000000000000000.log",
    "00000000000000000000.index",
    "00000000000000000000.timeindex",
    "partition.metadata",
    "leader-epoch-checkpoint",
]
LOGDIR_FILES = ["recovery-point-offset-checkpoint", "replication-offset-checkpoint", "meta.properties"]


@FUZZ_SLOW
@given(
    pfiles=st.dictionaries(st.sampled_from(PARTITION_FILES), st.one_of(st.binary(max_size=1500), STRUCTURED_TEXT)),
    lfiles=st.dictionaries(st.sampled_from(LOGDIR_FILES), ANY_BYTES),
    deep=st.booleans(),
    verify=st.booleans(),
)
def test_probe_never_raises_on_random_files(pfiles, lfiles, deep, verify):
    with tempfile.TemporaryDirectory() as d:
        ld = os.path.join(d, "logs")
        pdir = os.path.join(ld, "fuzz-0")
        os.makedirs(pdir)
        for n, data in pfiles.items():
            with open(os.path.join(pdir, n), "wb") as f:
                f.write(data)
        for n, data in lfiles.items():
            with open(os.path.join(ld, n), "wb") as f:
                f.write(data)
        out = io.StringIO()
        P.Probe(out, deep=deep, verify_crc=verify).run([ld])
        recs = [json.loads(line) for line in out.getvalue().splitlines()]
    assert recs[0]["kind"] == "probe"
    assert recs[-1]["kind"] == "probe_end" and recs[-1]["complete"] is True
    parts = [r for r in recs if r["kind"] == "partition"]
    assert len(parts) == 1
    assert parts[0]["error"] is None  # no exception reached the per-partition safety net
    segs = [r for r in recs if r["kind"] == "segment"]
    has_segment = any(n.startswith("0000") for n in pfiles)
    assert len(segs) == (1 if has_segment else 0)
    if segs:
        assert segs[0]["error"] is None  # nothing was caught inside the segment either
    if segs and "00000000000000000000.log" in pfiles:
        assert segs[0]["log_bytes"] == len(pfiles["00000000000000000000.log"])
        if deep or verify:
            assert 0 <= segs[0]["valid_bytes"] <= segs[0]["log_bytes"]


@FUZZ
@given(
    head=st.binary(max_size=64),
    zeros=st.integers(min_value=0, max_value=300),
    inside=st.lists(st.integers(min_value=0, max_value=300), max_size=3),
    block=st.integers(min_value=1, max_value=40),
)
def test_zero_tail_end_matches_rstrip(head: bytes, zeros: int, inside: list[int], block: int) -> None:
    """The block-wise zero-tail search of deep mode agrees with bytes.rstrip, zeros inside the data included."""
    buf = bytearray(head + bytes(zeros))
    for i in inside:  # non-zero bytes anywhere, also deep inside the tail
        if i < len(buf):
            buf[i] = 7
    buf = bytes(buf)
    assert P._nonzero_end(buf, block) == len(buf.rstrip(b"\0"))
    with tempfile.TemporaryFile() as f:
        f.write(buf)
        f.flush()
        assert P._zero_tail_start(f.fileno(), len(buf), block * 3) == len(buf.rstrip(b"\0"))
