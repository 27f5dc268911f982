"""The staged form of the probe's output: its bulk records (``segment``, ``partition``, ``file``) as Parquet, which
detection reads without parsing (why: bench/README.md, detection benchmark). One probe run is staged as

- ``<name>.jsonl[.gz]``: every other record (``probe``, ``logdir``, ``probe_end``, the few file records with an
  object or a mixed-type list in them such as ``meta.properties`` and the offset checkpoints), and any line that
  its kind's table cannot hold as it is (a field the table does not know, a value of another type): such a line
  stays JSON, so nothing is lost or changed, and detection still reads it;
- ``<name>.segments.parquet``, ``<name>.partitions.parquet``, ``<name>.files.parquet``: the other lines of each
  kind, as rows with the columns of that kind's table (a field the line does not have is null). Readers
  reconstruct the record with its ``kind``.

The tables are ``fleet_doctor.records``' (the one definition of each record kind). The conversion runs on the
staging side (the Airflow worker, or ``fleet-doctor scan``), in blocks, with Arrow's JSON reader: no per-record
Python on the way but the routing of each line by its first bytes. ``stage_probe`` is the commit protocol that
makes a broker's staged output all-or-nothing in the audit's store.
"""

from __future__ import annotations

import contextlib
import gzip
import io
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from fleet_doctor import records
from fleet_doctor.layout import RunArea

if TYPE_CHECKING:
    import pyarrow as pa

    from fleet_doctor.store import Store


@dataclass(frozen=True)
class StagedKind:
    """One record kind staged as Parquet: its table, the object's suffix, and the ``probe_end`` count of it."""

    kind: str
    suffix: str
    counted_as: str

    @property
    def table(self) -> pa.Schema:
        return records.arrow_schema(self.kind)

    @property
    def json_only_keys(self) -> tuple[bytes, ...]:
        """Keys its table does not have: a line holding one stays JSON without a try (any such line is unfit)."""
        return tuple(b'"%s":' % f.name.encode() for f in records.KINDS[self.kind].fields if not f.staged)

    def key(self, json_key: str) -> str:
        """Where these records of the staged JSON Lines ``json_key`` are: ``probe.jsonl.gz`` ->
        ``probe<suffix>``."""
        stem = json_key.removesuffix(".gz").removesuffix(".jsonl")
        assert stem != json_key, json_key
        return stem + self.suffix


STAGED_KINDS = (
    StagedKind("segment", ".segments.parquet", "segments"),
    StagedKind("partition", ".partitions.parquet", "partitions"),
    StagedKind("file", ".files.parquet", "files"),
)
assert {k.kind for k in STAGED_KINDS} == {k.kind for k in records.STAGED}
# columns that together only that kind's table has
_IDENTITY = {"segment": ("base_offset", "index_bytes"), "partition": ("dir", "dir_state"), "file": ("file_type",)}
_BY_PREFIX = {b'{"kind":"%s"' % k.kind.encode(): k for k in STAGED_KINDS}  # how the probe starts such a line
_KIND_AT = len(b'{"kind":"')
_READ_BLOCK_BYTES = 1 << 24


def staged_keys(json_key: str) -> dict[str, str]:
    """kind -> the key of its Parquet object beside the staged JSON Lines ``json_key``."""
    return {k.kind: k.key(json_key) for k in STAGED_KINDS}


class _Unfit(Exception):
    """Lines the table cannot hold as they are."""


def _parse(kind: StagedKind, parse: Any, lines: list[bytes]) -> pa.Table:
    import pyarrow as pa
    import pyarrow.json as pa_json

    read = pa_json.ReadOptions(use_threads=False, block_size=_READ_BLOCK_BYTES)
    try:
        table = pa_json.read_json(pa.py_buffer(b"".join(lines)), read_options=read, parse_options=parse)
        table.validate(full=True)  # Arrow's JSON reader takes strings that are not UTF-8; Parquet must not
    except pa.ArrowInvalid as e:
        raise _Unfit(str(e)) from e
    # one record of this kind per line (a line holding two objects, or another kind, is not one)
    kinds = table.column("kind").to_pylist()
    if len(kinds) != len(lines) or any(k != kind.kind for k in kinds):
        raise _Unfit(f"not one {kind.kind} record per line")
    return table.drop_columns(["kind"])


class _Sink:
    """The Parquet file of one staged kind, and the lines waiting to be converted into it."""

    def __init__(self, kind: StagedKind, out: BinaryIO) -> None:
        import pyarrow as pa
        import pyarrow.json as pa_json
        import pyarrow.parquet as pq

        self.kind = kind
        self.json_only = kind.json_only_keys  # read for every line: derived once here
        table = kind.table
        self.parse = pa_json.ParseOptions(
            explicit_schema=pa.schema([("kind", pa.string()), *table]), unexpected_field_behavior="error"
        )
        self.writer = pq.ParquetWriter(out, table, compression="zstd")
        self.block: list[bytes] = []


class ProbeSplitter:
    """Takes the probe's stdout in chunks of any size (``write``) and sends every line whole either to
    ``json_out`` (a binary stream) or, for lines of a staged kind, as rows to that kind's Parquet file on
    ``parquet_outs[kind]``. Use it as a context manager: on leaving the block normally it flushes everything, and
    only then are the Parquet files complete (possibly of 0 rows); on an exception it closes the Parquet writers
    without a complete file (the caller's store writers discard the objects). Lines a table cannot hold are
    written to ``json_out`` when their block is converted, so they can come after records the probe printed
    later."""

    def __init__(self, json_out: BinaryIO, parquet_outs: Mapping[str, BinaryIO], *, block_lines: int = 50_000) -> None:
        assert set(parquet_outs) == {k.kind for k in STAGED_KINDS}, sorted(parquet_outs)
        self.json_out = json_out
        self.block_lines = block_lines
        self.rows = dict.fromkeys(parquet_outs, 0)  # kind -> records written as Parquet rows
        # kind -> lines kept as JSON (a key its table does not have, or a line the table cannot hold)
        self.kept_json = dict.fromkeys(parquet_outs, 0)
        self._sinks: dict[bytes, _Sink] = {}
        try:
            for prefix, kind in _BY_PREFIX.items():
                self._sinks[prefix] = _Sink(kind, parquet_outs[kind.kind])
        except BaseException:
            self._close_writers()
            raise
        self._partial: list[bytes] = []  # the start of a line still without its newline, in the chunks it came in

    def staged(self, kind: str) -> int:
        """Every record of ``kind`` staged, in either form."""
        return self.rows[kind] + self.kept_json[kind]

    def miscounted(self, probe_end: Mapping[str, Any]) -> list[str]:
        """How the records staged differ from the counts of the probe's ``probe_end`` record (empty: they agree,
        nothing was lost on the way)."""
        return [
            f"the probe counted {probe_end.get(k.counted_as)} {k.counted_as} but {self.rows[k.kind]} were staged "
            f"as Parquet and {self.kept_json[k.kind]} as JSON"
            for k in STAGED_KINDS
            if self.staged(k.kind) != probe_end.get(k.counted_as)
        ]

    def __enter__(self) -> ProbeSplitter:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.close()
        else:  # the streams are being discarded: no footer is needed, only the writers' resources released
            self._close_writers()

    def _close_writers(self) -> None:
        for sink in self._sinks.values():
            try:
                sink.writer.close()
            except Exception:  # the original exception is the one to report
                pass

    def write(self, data: bytes) -> None:
        cut = data.rfind(b"\n")
        if cut < 0:  # no line ends here: kept as a chunk, never copied again until its line ends (linear time)
            if data:
                self._partial.append(data)
            return
        head = b"".join([*self._partial, data[:cut]]) if self._partial else data[:cut]
        self._partial = [data[cut + 1 :]] if cut + 1 < len(data) else []
        lines = head.split(b"\n")
        other = []
        sinks = self._sinks
        for line in lines:
            # the probe prints compact JSON with "kind" first: '{"kind":"<kind>",'
            sink = sinks.get(line[: line.find(b'"', _KIND_AT) + 1]) if line.startswith(b'{"kind":"') else None
            only_json = sink.json_only if sink is not None else ()
            if sink is not None and not (only_json and any(k in line for k in only_json)):  # no generator per line
                sink.block.append(line + b"\n")
                if len(sink.block) >= self.block_lines:
                    self._flush(sink)
            elif line:
                if sink is not None:
                    self.kept_json[sink.kind.kind] += 1
                other.append(line + b"\n")
        if other:
            self.json_out.write(b"".join(other))

    def close(self) -> None:
        try:
            for sink in self._sinks.values():
                self._flush(sink)
            if self._partial:  # output not ending in a newline: kept as it is, last
                self.json_out.write(b"".join(self._partial))
                self._partial = []
            for sink in self._sinks.values():
                sink.writer.close()
        except BaseException:  # the writers' resources released all the same
            self._close_writers()
            raise

    def _flush(self, sink: _Sink) -> None:
        block, sink.block = sink.block, []
        for table in self._convert(sink, block):
            sink.writer.write_table(table)
            self.rows[sink.kind.kind] += table.num_rows

    def _convert(self, sink: _Sink, lines: list[bytes]) -> Iterator[pa.Table]:
        """The lines as tables, in order; a block with an unfit line is halved until the line is found (rare:
        a probe newer than this table), which stays JSON."""
        if not lines:
            return
        try:
            yield _parse(sink.kind, sink.parse, lines)
        except _Unfit:
            if len(lines) == 1:
                self.json_out.write(lines[0])
                self.kept_json[sink.kind.kind] += 1
                return
            half = len(lines) // 2
            yield from self._convert(sink, lines[:half])
            yield from self._convert(sink, lines[half:])


@contextlib.contextmanager
def staged_outputs(
    json_key: str, open_out: Callable[[str], contextlib.AbstractContextManager[BinaryIO]], *, gzip_level: int = 0
) -> Iterator[tuple[BinaryIO, dict[str, BinaryIO]]]:
    """Open the JSON Lines output ``json_key`` and the Parquet outputs beside it with ``open_out(key)``
    (for instance ``Store.writer``), the JSON Lines first, so that leaving the block closes (commits) the Parquet
    objects first and the JSON Lines last; an exception leaving the block reaches every one of them (a store
    writer then discards its object). ``gzip_level`` > 0: the JSON Lines are gzip'd at that level."""
    with contextlib.ExitStack() as stack:
        json_out = stack.enter_context(open_out(json_key))
        if gzip_level:
            json_out = stack.enter_context(gzip.GzipFile(fileobj=json_out, mode="wb", compresslevel=gzip_level))
        columnar = {kind: stack.enter_context(open_out(key)) for kind, key in staged_keys(json_key).items()}
        yield json_out, columnar


def split_file(source: BinaryIO, json_out: BinaryIO, parquet_outs: Mapping[str, BinaryIO]) -> ProbeSplitter:
    """Split a whole probe output (for instance a local probe run) into its staged parts."""
    with ProbeSplitter(json_out, parquet_outs) as splitter:
        while chunk := source.read(1 << 20):
            splitter.write(chunk)
    return splitter


def split_to_dir(source: BinaryIO, dest: Path, json_name: str) -> ProbeSplitter:
    """Stage a whole probe output as files in the local directory ``dest`` (``json_name`` and its Parquet)."""
    with staged_outputs(str(dest / json_name), lambda p: open(p, "wb")) as (json_out, columnar):
        return split_file(source, json_out, columnar)


def read_records(data: bytes, name: str, kind: str) -> Iterator[dict[str, Any]]:
    """The records of a staged Parquet file of ``kind`` records (its bytes), as the probe printed them (``kind``
    first; fields the line did not have are None). Raises ValueError naming ``name`` when the bytes are not such
    a file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(io.BytesIO(data))
    except (pa.ArrowException, OSError) as e:
        raise ValueError(f"{name}: not a staged {kind} records Parquet file: {e}") from e
    missing = {"logdir", "path", *_IDENTITY[kind]} - set(table.column_names)
    if missing:
        raise ValueError(f"{name}: not a staged {kind} records Parquet file (no column {', '.join(sorted(missing))})")
    for batch in table.to_batches(max_chunksize=65536):
        for row in batch.to_pylist():
            yield {"kind": kind, **row}


def load_probe(store: Store, json_key: str) -> list[dict[str, Any]]:
    """Every record of one staged probe output: the JSON Lines object and the Parquet objects that exist."""
    out = store.read_jsonl(json_key)
    for kind, key in staged_keys(json_key).items():
        data = store.read_bytes(key)
        if data is not None:
            out.extend(read_records(data, store.url(key), kind))
    return out


# ---- the commit protocol of a broker's staged probe output in the audit's store
class StagingError(RuntimeError):
    """The probe's output could not be staged completely (the message names the broker and what differs)."""


def staged_brokers(store: Store, area: RunArea) -> list[int]:
    """Brokers whose probe output is completely staged in ``area``: their JSON Lines object exists (it is committed
    last)."""
    return sorted(b for f in store.files(area.probe_dir) if (b := area.staged_broker(f)) is not None)


def stage_probe(
    store: Store, key: str, produce: Callable[[Callable[[bytes], None]], Mapping[str, Any]], who: str
) -> ProbeSplitter:
    """Stage one probe run at ``key`` (``layout.RunArea.probe``): ``produce(write)`` streams the probe's stdout into
    ``write`` and returns its ``probe_end`` record. A previous attempt's JSON Lines object goes first (old JSON Lines
    never pair with new Parquet); the Parquet objects are committed, then the JSON Lines, only when ``produce`` returned
    and each kind's records staged (Parquet rows plus JSON lines) are as many as ``probe_end`` counted. Anything
    else leaves no JSON Lines object, so the broker does not count as staged."""
    store.delete(key)
    with staged_outputs(key, store.writer, gzip_level=5) as (out, columnar):
        with ProbeSplitter(out, columnar) as splitter:
            end = produce(splitter.write)
        miscounted = splitter.miscounted(end)
        if miscounted:
            raise StagingError(f"{who}: " + "; ".join(miscounted))
    return splitter
