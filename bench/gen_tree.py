#!/usr/bin/env python3
"""Generate a deterministic, realistic Kafka log dir for benchmarking the probe.

    python3 bench/gen_tree.py --out /tmp/tree --segments 100000 [--segments-per-partition 25] [--seed 1]

The result is one log dir (``--out`` itself) as a cleanly shut down KRaft broker leaves it:

* ``meta.properties`` (version 1), ``.kafka_cleanshutdown`` ({"version":0,"brokerEpoch":N}) and the four
  offset checkpoint files (``0\\nN\\ntopic partition offset\\n`` ...; the cleaner checkpoint lists only the
  compacted topic);
* partition dirs ``<topic>-<p>``, each with ``partition.metadata`` (``version: 0\\ntopic_id: <uuid>``, no
  trailing newline), ``leader-epoch-checkpoint`` (``0\\n1\\n0 0\\n``), a producer snapshot at the active
  segment's base offset, and K segments;
* each segment: ``<20-digit base>.log`` as a sparse 1 MiB file (never written, so it costs no disk), a
  trimmed ``.index`` with a handful of real big-endian (relOffset, position) entries and a trimmed
  ``.timeindex`` with (timestamp, relOffset) entries;
* the active (last) segment of a few partitions is left untrimmed, as a running broker leaves it: the
  ``.index``/``.timeindex`` are sparse files of the preallocated 10 MiB with only their first entries
  written, so the probe's binary search for the zero tail is exercised.

The on-disk formats (index entry structs, file names, the preallocated size) come from
``fleet_doctor.probe`` so they are defined once. Same arguments, same tree, byte for byte (mtimes aside).
"""

import argparse
import base64
import os
import random
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "plugins"))

from fleet_doctor import probe as P

LOG_BYTES = 1 << 20  # sparse size of every .log
INDEX_INTERVAL_BYTES = 4096  # log.index.interval.bytes: one index entry per ~4 KiB of appends
TIMEINDEX_PREALLOC = (P.DEFAULT_SEGMENT_INDEX_BYTES // P.TIME_INDEX_ENTRY.size) * P.TIME_INDEX_ENTRY.size
COMPACTED_TOPIC = "__consumer_offsets"
BASE_TIMESTAMP_MS = 1700000000000
# a v1 producer snapshot holding no producers: version int16, crc uint32 (not checked by the probe), count int32
SNAPSHOT_BYTES = b"\x00\x01" + bytes(8)


def topic_id(rng):
    """A Kafka Uuid string: url-safe base64 of 16 random bytes without padding (22 chars), never zero."""
    while True:
        raw = bytes(rng.getrandbits(8) for _ in range(16))
        if raw != bytes(16) and raw != bytes(15) + b"\x01":
            return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def write_file(path, data=b"", size=None):
    """Create path holding data; with size, extend it (sparse) to size bytes."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        if data:
            os.write(fd, data)
        if size is not None and size > len(data):
            os.ftruncate(fd, size)
    finally:
        os.close(fd)


def topic_layout(seed):
    """Endless (topic, partition, topic_id) stream: the compacted topic, then topics of varied widths.

    A prefix of the stream does not depend on how many partitions are taken, so a larger tree contains a smaller.
    """
    rng = random.Random(f"{seed}/layout")
    tid = topic_id(rng)
    for p in range(50):
        yield COMPACTED_TOPIC, p, tid
    t = 0
    while True:
        width = rng.choice((1, 3, 6, 12, 24, 48))
        name = f"{rng.choice(('orders', 'payments', 'clicks', 'audit', 'metrics'))}.events-{t}"
        tid = topic_id(rng)
        for p in range(width):
            yield name, p, tid
        t += 1


def segment_index_bytes(rng, n_msgs, ts0, entries):
    """(index bytes, timeindex bytes) for one segment: `entries` strictly increasing, non-zero entries."""
    oi, ti = [], []
    rel_step = max(1, n_msgs // (entries + 1))
    pos_step = max(INDEX_INTERVAL_BYTES, (LOG_BYTES - INDEX_INTERVAL_BYTES) // (entries + 1))
    ts = ts0
    for k in range(1, entries + 1):
        rel = k * rel_step + rng.randrange(rel_step) // 2
        pos = k * pos_step + rng.randrange(0, pos_step // 2, 61)
        ts += rng.randrange(1, 5000)
        oi.append(P.OFFSET_INDEX_ENTRY.pack(rel, pos))
        ti.append(P.TIME_INDEX_ENTRY.pack(ts, rel))
    return b"".join(oi), b"".join(ti)


def generate(out, segments, per_partition, seed, untrimmed_every=20, broker_id=1):
    """Write the tree; return {"partitions", "segments", "created"}.

    `out` must be empty, absent, or a tree this function wrote with the same seed, K and untrimmed_every and a
    segment count that is a multiple of K: then only the missing partitions are added (and the log-dir files
    rewritten), which is how the benchmark grows its 100k tree to 200k.
    """
    if segments < 1 or per_partition < 1 or untrimmed_every < 1:
        raise ValueError("--segments, --segments-per-partition and --untrimmed-every must be >= 1")
    os.makedirs(out, exist_ok=True)
    checkpoints = {name: [] for name in P.OFFSET_CHECKPOINT_FILES}
    remaining = segments
    created = 0
    for idx, (topic, part, tid) in enumerate(topic_layout(seed)):
        if remaining == 0:
            break
        k = min(per_partition, remaining)
        remaining -= k
        rng = random.Random(f"{seed}/{idx}")
        pdir = os.path.join(out, f"{topic}-{part}")
        try:
            os.mkdir(pdir)
            write = True
            created += 1
        except FileExistsError:
            have = sum(1 for n in os.listdir(pdir) if n.endswith(".log"))
            if have != k:
                raise ValueError(f"{pdir} holds {have} segments, not {k}: generate into an empty dir") from None
            write = False
        if write:
            write_file(os.path.join(pdir, P.PARTITION_METADATA), f"version: 0\ntopic_id: {tid}".encode("ascii"))
            write_file(os.path.join(pdir, P.LEADER_EPOCH_CHECKPOINT), b"0\n1\n0 0\n")
        untrimmed = idx % untrimmed_every == untrimmed_every // 2
        base = rng.randrange(0, 1000) * 1000 if rng.random() < 0.5 else 0
        first_base = base
        ts = BASE_TIMESTAMP_MS + rng.randrange(86400000)
        for s in range(k):
            active = s == k - 1
            n_msgs = rng.randrange(2000, 60000)
            entries = rng.randrange(1, 4) if active and untrimmed else rng.randrange(2, 9)
            oi, ti = segment_index_bytes(rng, n_msgs, ts, entries)
            ts = P.TIME_INDEX_ENTRY.unpack_from(ti, len(ti) - P.TIME_INDEX_ENTRY.size)[0] + rng.randrange(1, 1000)
            if write:
                f = {ext: os.path.join(pdir, P.segment_file_name(base, ext)) for ext in ("log", "index", "timeindex")}
                write_file(f["log"], size=LOG_BYTES)
                if active and untrimmed:
                    # a running broker's active segment: preallocated, only the first entries written
                    write_file(f["index"], oi, size=P.DEFAULT_SEGMENT_INDEX_BYTES)
                    write_file(f["timeindex"], ti, size=TIMEINDEX_PREALLOC)
                else:
                    write_file(f["index"], oi)
                    write_file(f["timeindex"], ti)
                if active:
                    # producer state snapshot at the active segment's base offset (written on roll)
                    write_file(os.path.join(pdir, P.segment_file_name(base, "snapshot")), SNAPSHOT_BYTES)
            if not active:
                base += n_msgs
        log_end = base + n_msgs
        checkpoints["recovery-point-offset-checkpoint"].append((topic, part, log_end))
        checkpoints["log-start-offset-checkpoint"].append((topic, part, first_base))
        checkpoints["replication-offset-checkpoint"].append((topic, part, log_end))
        if topic == COMPACTED_TOPIC:
            checkpoints["cleaner-offset-checkpoint"].append((topic, part, first_base))
    for name, entries in checkpoints.items():
        lines = ["0", str(len(entries))] + [f"{t} {p} {o}" for t, p, o in entries]
        write_file(os.path.join(out, name), ("\n".join(lines) + "\n").encode("ascii"))
    rng = random.Random(f"{seed}/broker")
    write_file(
        os.path.join(out, P.META_PROPERTIES),
        (
            f"#\n#Tue Nov 14 22:13:20 UTC 2023\nnode.id={broker_id}\ndirectory.id={topic_id(rng)}\nversion=1\n"
            f"cluster.id={topic_id(rng)}\n"
        ).encode("ascii"),
    )
    write_file(os.path.join(out, P.CLEAN_SHUTDOWN_FILE), b'{"version":0,"brokerEpoch":%d}' % (seed + 42))
    return {"partitions": len(checkpoints["log-start-offset-checkpoint"]), "segments": segments, "created": created}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--out", required=True, help="log dir to create (empty or absent, or a smaller tree from the same seed to grow)"
    )
    ap.add_argument("--segments", type=int, default=100000, help="total segments (default 100000)")
    ap.add_argument("--segments-per-partition", type=int, default=25, help="K segments per partition (default 25)")
    ap.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    ap.add_argument(
        "--untrimmed-every",
        type=int,
        default=20,
        help="leave the active segment's indexes untrimmed (10 MiB sparse) in 1 of every N partitions (default 20)",
    )
    a = ap.parse_args(argv)
    info = generate(a.out, a.segments, a.segments_per_partition, a.seed, a.untrimmed_every)
    sys.stdout.write(f"{a.out}: {info['partitions']} partitions, {info['segments']} segments\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
