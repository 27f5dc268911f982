"""The probe on hostile data: deep mode runs nightly on brokers, so a segment or a name crafted to hurt it must end
as a record naming the file, with the probe's memory bounded, never as a crash or an out-of-memory kill."""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import re
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet_doctor import probe as P
from harness.corpus import REPO, by_kind, run_probe
from harness.kafka_ref import ref_legacy_message

PROBE = REPO / "plugins" / "fleet_doctor" / "probe.py"
GZIP, SNAPPY = 1, 2
RSS_BUDGET_KIB = 64 << 10


def _bench_rss_wrapper() -> str:
    """bench/probe_bench.py's wrapper that runs a script as __main__ and reports its peak RSS (VmHWM, KiB) and its
    children's on stderr: the rusage of the probe as our child would carry this (pytest's) RSS over fork + exec."""
    spec = importlib.util.spec_from_file_location("probe_bench", REPO / "bench" / "probe_bench.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return str(module.RSS_WRAPPER)


RSS_WRAPPER = _bench_rss_wrapper()


def gzip_bomb(inflated: int) -> bytes:
    """A gzip stream of one valid v1 message of `inflated` bytes with a value of zeros (deflate packs zeros
    ~1000:1), compressed a MiB at a time."""
    value_len = inflated - 34  # offset, size, crc, magic, attributes, timestamp, key length, value length
    body_head = struct.pack(">bbqii", 1, 0, 1_700_000_000_000, -1, value_len)
    crc = zlib.crc32(body_head)
    zeros = bytes(1 << 20)
    for n in (len(zeros),) * (value_len >> 20) + (value_len & ((1 << 20) - 1),):
        crc = zlib.crc32(zeros[:n], crc)
    z = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    out = [z.compress(struct.pack(">qiI", 0, 4 + len(body_head) + value_len, crc) + body_head)]
    for n in (len(zeros),) * (value_len >> 20) + (value_len & ((1 << 20) - 1),):
        out.append(z.compress(zeros[:n]))
    return b"".join(out) + z.flush()


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def snappy_zeros(inflated: int) -> bytes:
    """A raw snappy block (format_description.txt) of `inflated` zero bytes: a 1-byte literal, then 64-byte copies
    at offset 1 (3 bytes each: ~21:1, the most snappy packs)."""
    copies, tail = divmod(inflated - 1, 64)
    out = _varint(inflated) + b"\x00\x00" + bytes([(63 << 2) | 2, 1, 0]) * copies
    return out + (bytes([((tail - 1) << 2) | 2, 1, 0]) if tail else b"")


def snappy_literal(data: bytes) -> bytes:
    """A raw snappy block of `data` as one literal (a 4-byte length: tag 63 << 2)."""
    return _varint(len(data)) + bytes([63 << 2]) + (len(data) - 1).to_bytes(4, "little") + data


def xerial(*blocks: bytes) -> bytes:
    """Snappy as SnappyOutputStream frames it: magic, version 1, compatible version 1, int32-prefixed blocks."""
    return b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1) + b"".join(struct.pack(">i", len(b)) + b for b in blocks)


def write_logdir(root: Path, partitions: dict[str, bytes]) -> Path:
    logdir = root / "kafka-logs"
    logdir.mkdir()
    (logdir / "meta.properties").write_text("version=0\nbroker.id=1\n")
    for name, log in partitions.items():
        (logdir / name).mkdir()
        (logdir / name / "00000000000000000000.log").write_bytes(log)
    return logdir


def run_probe_measured(*args: str) -> tuple[list[dict], int, int]:
    """Run probe.py as a broker does (its own process), returning its records, its peak RSS and its children's
    (the forked --jobs worker), in KiB."""
    p = subprocess.run(
        [sys.executable, "-c", RSS_WRAPPER, str(PROBE), *args], capture_output=True, text=True, timeout=300
    )
    m = re.search(r"^VmHWM (\d+) (\d+)$", p.stderr, re.M)
    assert p.returncode == 0 and m, p.stderr
    return [json.loads(line) for line in p.stdout.splitlines()], int(m.group(1)), int(m.group(2))


TS = 1_700_000_000_000
BLOCK = P.SNAPPY_BLOCK_MAX
# partition dir -> (codec, why its wrapper's records are not counted, or None when they are)
BOMBS = {
    "gz-0": ("gzip", f"gzip value inflates to more than {P.LEGACY_INFLATED_MAX} bytes"),
    "snappy-0": ("snappy", f"snappy value inflates to more than {P.LEGACY_INFLATED_MAX} bytes"),
    "snappy-1": ("snappy", f"a snappy block of {80 << 20} bytes, more than {BLOCK}"),
    "snappy-2": ("snappy", None),
}


@pytest.fixture(scope="module")
def bombs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """A log dir whose partitions each hold a segment of an ordinary v1 message, then a v1 wrapper whose value
    inflates far: gzip, one valid inner message of 255 MiB (~255 KiB on disk); snappy framed, five blocks of 16 MiB;
    one raw snappy block of 80 MiB; and one raw snappy block as big as the probe decodes, a literal of random bytes
    (~16 MiB on disk) holding one valid inner message, which is counted."""
    gz = gzip_bomb(255 << 20)
    assert len(gz) < 256 << 10
    one = ref_legacy_message(0, 1, os.urandom(BLOCK - 34), timestamp=TS)
    values = {
        "gz-0": gz,
        "snappy-0": xerial(*[snappy_zeros(BLOCK)] * 5),
        "snappy-1": snappy_zeros(80 << 20),
        "snappy-2": snappy_literal(one),
    }
    first = ref_legacy_message(0, 1, b"ordinary", timestamp=TS)
    logs = {}
    for name, value in values.items():
        codec = GZIP if BOMBS[name][0] == "gzip" else SNAPPY
        logs[name] = first + ref_legacy_message(1, 1, value, attributes=codec, timestamp=TS)
    return write_logdir(tmp_path_factory.mktemp("bombs"), logs), len(first)


def test_legacy_compression_bombs_are_reported_within_64_mib(bombs: tuple[Path, int]) -> None:
    logdir, at = bombs
    records, rss, children = run_probe_measured("--deep", "--verify-crc", str(logdir))
    assert rss < RSS_BUDGET_KIB and children < RSS_BUDGET_KIB, (rss, children)
    assert by_kind(records, "probe_end"), "the probe ended its output"
    for dirname, (codec, why) in BOMBS.items():
        log = logdir / dirname / "00000000000000000000.log"
        (seg,) = [r for r in by_kind(records, "segment") if r["path"] == str(log.parent)]
        (part,) = [r for r in by_kind(records, "partition") if r["dir"] == dirname]
        assert seg["batch_count"] == 2 and seg["crc_errors"] == 0 and seg["torn_tail"] is False
        assert part.get("error") is None
        if why is None:
            assert (seg["record_count"], seg["uncounted_batches"], seg["error"]) == (2, 0, None)
            continue
        assert seg["record_count"] == 1 and seg["uncounted_batches"] == 1 == part["uncounted_batches"]
        assert seg["error"] == f"v0/v1 {codec} message at byte {at} of {log}: {why}; its records are not counted"


def test_legacy_wrappers_are_counted_across_inflate_steps(tmp_path: Path) -> None:
    """Inner messages of every size from 14 bytes up, their headers cut by the INFLATE_STEP pieces of the
    streamed count, inflating to a few MiB: all counted, through the bytes API and through a .log walk."""
    inner = [ref_legacy_message(i, 1, bytes(i % 700), timestamp=i) for i in range(12_000)]
    raw = b"".join(inner)
    assert len(raw) > 40 * P.INFLATE_STEP
    wrapper = ref_legacy_message(len(inner) - 1, 1, _gzip(raw), attributes=GZIP)
    assert P.count_legacy_inner(wrapper, 1, GZIP) == len(inner)
    # the last inner message cut short is not counted; a cut gzip stream makes the wrapper uncountable, quietly
    assert P.count_legacy_inner(ref_legacy_message(0, 1, _gzip(raw[:-1]), attributes=GZIP), 1, GZIP) == len(inner) - 1
    assert P.count_legacy_inner(ref_legacy_message(0, 1, _gzip(raw)[:-9], attributes=GZIP), 1, GZIP) is None
    log = tmp_path / "00000000000000000000.log"
    log.write_bytes(wrapper + ref_legacy_message(len(inner), 1, b"after", attributes=0))
    w = P.walk_log(str(log), 0, verify_crc=True)
    assert (w["batch_count"], w["record_count"], w["uncounted_batches"], w["crc_errors"]) == (2, len(inner) + 1, 0, 0)
    assert "errors" not in w


def _ref_count(inner: bytes) -> int:
    """The complete v0/v1 messages at the start of inflated bytes, read whole (what the probe counts in steps)."""
    count = pos = 0
    while pos + 12 <= len(inner):
        size = struct.unpack_from(">i", inner, pos + 8)[0]
        if size < 14 or pos + 12 + size > len(inner):
            break
        count += 1
        pos += 12 + size
    return count


@settings(max_examples=300, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 90), max_size=30),
    tail=st.binary(max_size=20),
    cuts=st.lists(st.integers(0, 3000), max_size=12),
)
def test_streamed_count_is_the_count_of_the_whole(sizes: list[int], tail: bytes, cuts: list[int]) -> None:
    inner = b"".join(ref_legacy_message(i, i % 2, bytes(n)) for i, n in enumerate(sizes)) + tail
    bounds = sorted({0, len(inner), *(c % (len(inner) + 1) for c in cuts)})
    steps = [inner[a:b] for a, b in itertools.pairwise(bounds)]
    assert P._count_inner_messages(iter(steps)) == _ref_count(inner)


def _gzip(data: bytes) -> bytes:
    z = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    return z.compress(data) + z.flush()


# --------------------------------------------------------------------------------------------
# Names from brokers: "$" matches before a trailing newline, so every name pattern must match the whole name
@pytest.mark.parametrize(
    "name", ["topic-0\n", "topic-0.0123456789abcdef-delete\n", "topic-0.0123456789abcdef-future\n", "topic-0\n\n"]
)
def test_a_name_with_a_trailing_newline_is_no_partition_dir_name(name: str) -> None:
    assert P.parse_partition_dir_name(name) is None
    assert P.parse_partition_dir_name(name.rstrip("\n")) is not None


def test_names_with_a_trailing_newline_parse_as_nothing() -> None:
    assert P.parse_segment_file_name("00000000000000000000.log\n") is None
    assert P.KRAFT_SNAPSHOT_RE.match("00000000000000000100-0000000001.checkpoint\n") is None
    assert P.valid_topic_id("AAAAAAAAAAAAAAAAAAAAAQ") and not P.valid_topic_id("AAAAAAAAAAAAAAAAAAAAAQ\n")


def test_partition_dir_named_with_a_trailing_newline_is_reported_as_an_odd_dir(tmp_path: Path) -> None:
    logdir = write_logdir(tmp_path, {"topic-0": b"", "topic-0\n": b""})
    records = run_probe(logdir)
    assert [r["dir"] for r in by_kind(records, "partition")] == ["topic-0"]
    (rec,) = by_kind(records, "logdir")
    assert rec["partition_dirs"] == 1 and rec["other_entries"] == 1
    (odd,) = [r for r in by_kind(records, "file") if r["file_type"] == "unknown_dir"]
    assert odd["name"] == "topic-0\n" and odd["path"] == str(logdir / "topic-0\n")
    assert not [r for r in by_kind(records, "segment") if r["path"].endswith("\n")]


def test_a_checkpoint_with_more_entries_than_any_broker_holds_is_refused_unread(tmp_path: Path) -> None:
    """A 64 MiB recovery-point checkpoint of short lines took the probe to 2.1 GiB: refused before it is split."""
    from fleet_doctor.probe import CHECKPOINT_ENTRIES_MAX, parse_offset_checkpoint

    n = CHECKPOINT_ENTRIES_MAX + 1
    data = b"0\n%d\n" % n + b"a 0 0\n" * n
    with pytest.raises(ValueError, match="more than 262144 entries"):
        parse_offset_checkpoint(data, str(tmp_path / "recovery-point-offset-checkpoint"))
    ok = b"0\n3\n" + b"a 0 0\na 1 0\na 2 0\n"
    assert parse_offset_checkpoint(ok, "x")[0] == [["a", 0, 0], ["a", 1, 0], ["a", 2, 0]]
