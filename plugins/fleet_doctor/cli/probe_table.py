"""Turn probe JSON Lines into a per-log-dir summary an operator can read in a terminal."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, TextIO


@dataclass
class LogDirSummary:
    logdir: str
    partitions: int = 0
    segments: int = 0
    bytes: int = 0
    broker_id: int | None = None  # meta.properties, when readable
    cluster_id: str | None = None
    kraft: bool | None = None
    clean_shutdown: bool | None = None
    batches: int | None = None
    records: int | None = None
    topics: set[str] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)
    leftovers: int = 0
    torn_segments: int = 0
    crc_errors: int = 0
    untrimmed_indexes: int = 0
    missing_indexes: int = 0


def read_records(lines: Iterable[str]) -> Iterator[dict[str, Any]]:
    for n, line in enumerate(lines, 1):
        line = line.strip()
        if not line:
            continue
        try:
            yield json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"probe output line {n} is not JSON: {e}") from e


def summarize(records: Iterable[dict[str, Any]]) -> list[LogDirSummary]:
    dirs: dict[str, LogDirSummary] = {}

    def get(logdir: str) -> LogDirSummary:
        return dirs.setdefault(logdir, LogDirSummary(logdir))

    for r in records:
        kind = r.get("kind")
        if kind not in ("logdir", "partition", "segment", "file"):
            continue
        s = get(r["logdir"])
        if r.get("error"):
            s.errors.append(r["error"])
        if kind == "logdir":
            meta = r.get("meta") or {}
            s.broker_id = meta.get("broker_id")
            s.cluster_id = meta.get("cluster_id")
            s.kraft = r.get("kraft")
            s.clean_shutdown = r.get("clean_shutdown")
        elif kind == "partition":
            s.partitions += 1
            if r.get("topic"):
                s.topics.add(r["topic"])
            if r.get("partition_metadata_error"):
                s.errors.append(r["partition_metadata_error"])
            if r.get("leader_epoch_error"):
                s.errors.append(r["leader_epoch_error"])
            if "record_count" in r:
                s.batches = (s.batches or 0) + (r.get("batch_count") or 0)
                s.records = (s.records or 0) + (r.get("record_count") or 0)
                s.torn_segments += r.get("torn_segments") or 0
                s.crc_errors += r.get("crc_errors") or 0
        elif kind == "segment":
            s.segments += 1
            s.bytes += (r.get("log_bytes") or 0) + (r.get("index_bytes") or 0) + (r.get("timeindex_bytes") or 0)
            if r.get("index_zero_tail_entries") or r.get("timeindex_zero_tail_entries"):
                s.untrimmed_indexes += 1
            if r.get("has_log") and not r.get("has_index"):
                s.missing_indexes += 1
        elif kind == "file":
            if r.get("file_type") == "segment_leftover":
                s.leftovers += 1
            if r.get("file_type") == "offset_checkpoint" and r.get("error"):
                pass  # already counted as an error above
    return list(dirs.values())


def render_table(summaries: list[LogDirSummary], out: TextIO) -> None:
    deep = any(s.records is not None for s in summaries)
    head = ["log dir", "broker", "mode", "clean", "parts", "segs", "MiB"]
    if deep:
        head += ["batches", "records", "torn", "crc"]
    head += ["no-idx", "untrim", "leftover", "errors"]
    rows = []
    for s in summaries:
        row = [
            s.logdir,
            "-" if s.broker_id is None else str(s.broker_id),
            "kraft" if s.kraft else "zk",
            {True: "yes", False: "no", None: "?"}[s.clean_shutdown],
            str(s.partitions),
            str(s.segments),
            f"{s.bytes / 1048576:.1f}",
        ]
        if deep:
            row += [str(s.batches or 0), str(s.records or 0), str(s.torn_segments), str(s.crc_errors)]
        row += [str(s.missing_indexes), str(s.untrimmed_indexes), str(s.leftovers), str(len(s.errors))]
        rows.append(row)
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(head)]
    out.write("  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)).rstrip() + "\n")
    for r in rows:
        out.write("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() + "\n")
    errs = [(s.logdir, e) for s in summaries for e in s.errors]
    if errs:
        out.write(f"\n{len(errs)} file(s) could not be read or parsed:\n")
        for logdir, e in errs[:50]:
            out.write(f"  {logdir}: {e}\n")
        if len(errs) > 50:
            out.write(f"  ... and {len(errs) - 50} more (see --format jsonl)\n")
