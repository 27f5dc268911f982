"""The staged form of the probe's ``segment`` records: Parquet instead of JSON Lines.

On a big broker nearly every line the probe prints is a ``segment`` record (25 of 27 lines with 25 segments
a partition), and parsing those lines was most of detection's time. Staging therefore splits the probe's
output (docs/probe-schema.md) in two, per probe run:

- ``<name>.jsonl[.gz]``: every other record, and any segment line that this table cannot hold as it is
  (a field it does not know, a value of another type): such a line stays JSON, so nothing is lost or
  changed, and detection still reads it;
- ``<name>.segments.parquet``: the other segment lines, with the columns of ``SEGMENT_TABLE`` (a field the
  line does not have is null). Readers reconstruct the record with ``kind = "segment"``.

``SEGMENT_TABLE`` is the one description of this format; detection's Spark schema reads a subset of it
(tests/test_staged_segments.py checks the types agree). The conversion runs on the staging side (the Airflow
worker, or ``fleet-doctor scan``), in blocks, with Arrow's JSON reader: no per-record Python on the way.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, BinaryIO

import pyarrow as pa
import pyarrow.json as pa_json
import pyarrow.parquet as pq

if TYPE_CHECKING:
    from fleet_doctor.store import Store

SEGMENT_PREFIX = b'{"kind":"segment",'  # how the probe starts a segment line (compact JSON, "kind" first)
SEGMENTS_SUFFIX = ".segments.parquet"

_I64, _I32, _STR, _BOOL = pa.int64(), pa.int32(), pa.string(), pa.bool_()
_MISMATCH = pa.struct([("problem", _STR), ("index_offset", _I64), ("index_position", _I64), ("batch", pa.list_(_I64))])
# every field a segment record has (docs/probe-schema.md, "segment"), in the probe's order
SEGMENT_TABLE = pa.schema(
    [
        ("logdir", _STR),
        ("path", _STR),
        ("topic", _STR),
        ("partition", _I32),
        ("base_offset", _I64),
        ("active", _BOOL),
        ("has_log", _BOOL),
        ("log_bytes", _I64),
        ("log_mtime_ms", _I64),
        ("has_txnindex", _BOOL),
        ("txnindex_bytes", _I64),
        ("has_index", _BOOL),
        ("index_bytes", _I64),
        ("index_entries", _I64),
        ("index_zero_tail_entries", _I64),
        ("index_remainder", _I64),
        ("index_monotonic", _BOOL),
        ("index_checked_entries", _I64),
        ("index_first_violation", _I64),
        ("index_first_offset", _I64),
        ("index_last_offset", _I64),
        ("index_last_position", _I64),
        ("has_timeindex", _BOOL),
        ("timeindex_bytes", _I64),
        ("timeindex_entries", _I64),
        ("timeindex_zero_tail_entries", _I64),
        ("timeindex_remainder", _I64),
        ("timeindex_monotonic", _BOOL),
        ("timeindex_checked_entries", _I64),
        ("timeindex_first_violation", _I64),
        ("timeindex_first_timestamp", _I64),
        ("timeindex_last_timestamp", _I64),
        ("timeindex_last_offset", _I64),
        # deep mode
        ("deep", pa.null()),  # present (and null) when deep mode had no .log to walk
        ("batch_count", _I64),
        ("record_count", _I64),
        ("uncounted_batches", _I64),
        ("first_offset", _I64),
        ("last_offset", _I64),
        ("next_offset", _I64),
        ("max_timestamp", _I64),
        ("valid_bytes", _I64),
        ("torn_tail", _BOOL),
        ("tail_error", _STR),
        ("magic", pa.list_(_I64)),
        ("codecs", pa.list_(_STR)),
        ("crc_checked", _I64),
        ("crc_errors", _I64),
        ("first_crc_error_position", _I64),
        ("offset_errors", _I64),
        ("first_offset_error_position", _I64),
        ("control_batches", _I64),
        ("transactional_batches", _I64),
        ("max_leader_epoch", _I64),
        ("index_checked", _I64),
        ("index_not_batch_start", _I64),
        ("index_offset_before_batch", _I64),
        ("index_offset_after_batch", _I64),
        ("index_beyond_log", _I64),
        ("index_mismatch_examples", pa.list_(_MISMATCH)),
        ("error", _STR),
    ]
)
_READ_SCHEMA = pa.schema([("kind", _STR), *SEGMENT_TABLE])
_PARSE = pa_json.ParseOptions(explicit_schema=_READ_SCHEMA, unexpected_field_behavior="error")
_READ = pa_json.ReadOptions(use_threads=False, block_size=1 << 24)


def segments_key(json_key: str) -> str:
    """Where the segment records of the staged JSON Lines ``json_key`` are: ``probe.jsonl.gz`` ->
    ``probe.segments.parquet``."""
    stem = json_key.removesuffix(".gz").removesuffix(".jsonl")
    assert stem != json_key, json_key
    return stem + SEGMENTS_SUFFIX


class _Unfit(Exception):
    """Lines the table cannot hold as they are."""


def _parse(lines: list[bytes]) -> pa.Table:
    try:
        table = pa_json.read_json(pa.py_buffer(b"".join(lines)), read_options=_READ, parse_options=_PARSE)
    except pa.ArrowInvalid as e:
        raise _Unfit(str(e)) from e
    # one segment record per line (a line holding two objects, or another kind, is not one)
    kinds = table.column("kind").to_pylist()
    if len(kinds) != len(lines) or any(k != "segment" for k in kinds):
        raise _Unfit("not one segment record per line")
    return table.drop_columns(["kind"])


class ProbeSplitter:
    """Takes the probe's stdout in chunks of any size (``write``) and sends every line whole either to
    ``json_out`` (a binary stream) or, for segment lines, as rows to a Parquet file on ``parquet_out``.
    Use it as a context manager: on leaving the block normally it flushes both, and only then is the Parquet
    file complete (possibly of 0 rows); on an exception it closes the Parquet writer without a complete file
    (the caller's store writer discards the object). Segment lines the table cannot hold are written to
    ``json_out`` when their block is converted, so they can come after records the probe printed later."""

    def __init__(self, json_out: BinaryIO, parquet_out: BinaryIO, *, block_lines: int = 50_000) -> None:
        self.json_out = json_out
        self.block_lines = block_lines
        self.segments = 0  # segment records written as Parquet rows
        self.segments_as_json = 0  # segment lines kept as JSON (the table cannot hold them unchanged)
        self._writer = pq.ParquetWriter(parquet_out, SEGMENT_TABLE, compression="zstd")
        self._partial = b""
        self._block: list[bytes] = []

    def __enter__(self) -> ProbeSplitter:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.close()
        else:
            try:  # the stream is being discarded: no footer is needed, only the writer's resources released
                self._writer.close()
            except Exception:  # the original exception is the one to report
                pass

    def write(self, data: bytes) -> None:
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        other = []
        for line in lines:
            if line.startswith(SEGMENT_PREFIX):
                self._block.append(line + b"\n")
            elif line:
                other.append(line + b"\n")
        if other:
            self.json_out.write(b"".join(other))
        if len(self._block) >= self.block_lines:
            self._flush()

    def close(self) -> None:
        self._flush()
        if self._partial:  # output not ending in a newline: kept as it is, last
            self.json_out.write(self._partial)
            self._partial = b""
        self._writer.close()

    def _flush(self) -> None:
        block, self._block = self._block, []
        for table in self._convert(block):
            self._writer.write_table(table)
            self.segments += table.num_rows

    def _convert(self, lines: list[bytes]) -> Iterator[pa.Table]:
        """The lines as tables, in order; a block with an unfit line is halved until the line is found (rare:
        a probe newer than this table), which stays JSON."""
        if not lines:
            return
        try:
            yield _parse(lines)
        except _Unfit:
            if len(lines) == 1:
                self.json_out.write(lines[0])
                self.segments_as_json += 1
                return
            half = len(lines) // 2
            yield from self._convert(lines[:half])
            yield from self._convert(lines[half:])


def split_file(source: BinaryIO, json_out: BinaryIO, parquet_out: BinaryIO) -> ProbeSplitter:
    """Split a whole probe output (for instance a local probe run) into its two staged parts."""
    with ProbeSplitter(json_out, parquet_out) as splitter:
        while chunk := source.read(1 << 20):
            splitter.write(chunk)
    return splitter


def read_records(data: bytes, name: str) -> Iterator[dict[str, Any]]:
    """The segment records of a staged ``*.segments.parquet`` (its bytes), as the probe printed them
    (``kind`` first; fields the line did not have are None). Raises ValueError naming ``name`` when the
    bytes are not such a file."""
    try:
        table = pq.read_table(io.BytesIO(data))
    except (pa.ArrowException, OSError) as e:
        raise ValueError(f"{name}: not a staged segments Parquet file: {e}") from e
    missing = {"path", "base_offset"} - set(table.column_names)
    if missing:
        raise ValueError(f"{name}: not a staged segments Parquet file (no column {', '.join(sorted(missing))})")
    for batch in table.to_batches(max_chunksize=65536):
        for row in batch.to_pylist():
            yield {"kind": "segment", **row}


def load_probe(store: Store, json_key: str) -> list[dict[str, Any]]:
    """Every record of one staged probe output: the JSON Lines object and, when it exists, its segments."""
    records = store.read_jsonl(json_key)
    key = segments_key(json_key)
    data = store.read_bytes(key)
    if data is not None:
        records.extend(read_records(data, store.url(key)))
    return records
