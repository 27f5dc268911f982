"""Builds the test fleet for the detection tests: genuine corpus log dirs staged as brokers, the
mutations that must trigger each rule, and the ZooKeeper state they are checked against.

The fleet (staged broker id: source, Kafka version):

- 0, 1, 2: ``zk-3.9-3broker-thillai`` kafka-logs-0/1/2, a real 3-broker ZooKeeper cluster (3.9.0).
  Its ZooKeeper snapshot ``snapshot.124`` is the cluster state.
- 3: ``zk-3.1-single-aryan`` kafka-logs, its partitions other than ``__consumer_offsets`` (3.1.0).
- 8, 10, 11, 20, 36: copies of aryan's ``design-0/1/2`` under Kafka 0.8.2, 1.0.0, 1.1.0 (running),
  2.0.0 and 3.6.0: the same bytes under different versions show the version-banded severities.

The aryan-derived log dirs join thillai's cluster: their meta.properties get the staged broker id and
thillai's cluster.id, their checkpoint files keep aryan's entries for the partitions copied, and the
ZooKeeper state adds aryan's ``snapshot.32f`` topic and partition-state records for those topics, the
assignment moved from broker 0 to the brokers holding the copies, plus registrations for the added
brokers. ``build_fleet(..., mutate=False)`` is the pristine twin: the same layout, nothing broken.

Every mutation is one entry of ``MUTATIONS``: the rule, where it must fire (broker, topic, partition,
segment, path relative to the log dir) and the severity expected there; the tests are parametrized
over that table. The expected values come from the bytes written here and from MANIFEST.md, never
from the probe's or detection's output.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleet_doctor.probe import Probe
from fleet_doctor.staging import split_to_dir
from fleet_doctor.zookeeper import snapshot as zk_snapshot
from harness.corpus import copy_writable

THILLAI = "zk-3.9-3broker-thillai"
THILLAI_ZK = "zookeeper/version-2/version-2/snapshot.124"
THILLAI_CLUSTER_ID = "5Zq3CuTXQtybJ1dLd4w1sg"  # MANIFEST.md
ARYAN = "zk-3.1-single-aryan"
ARYAN_ZK = "zookeeper/version-2/snapshot.32f"
ARYAN_CLUSTER_ID = "4fi2MkU0Ql2L0cPRncY20Q"  # MANIFEST.md
# MANIFEST.md: design1-0/1/2 partition.metadata hold this ID, ZooKeeper snapshot.32f has m2GaXl4TSyaBZB5R8-wtaA
ARYAN_DESIGN1_DISK_ID = "RJI454yPScCX7IO2JuPZvQ"
ARYAN_DESIGN1_ZK_ID = "m2GaXl4TSyaBZB5R8-wtaA"

ARYAN_PARTITIONS = [
    "design-0",
    "design-1",
    "design-2",
    "design1-0",
    "design1-1",
    "design1-2",
    "design2-0",
    "new_topic-0",
    "new_topic-1",
    "new_topic-2",
    "quickstart-events-0",
]
DESIGN = ["design-0", "design-1", "design-2"]
VERSION_BROKERS = {8: "0.8.2", 10: "1.0.0", 11: "1.1.0", 20: "2.0.0", 36: "3.6.0"}
RUNNING = {11}  # broker 11 is running: its active segments' indexes are legitimately preallocated
BROKERS = {0: "3.9.0", 1: "3.9.0", 2: "3.9.0", 3: "3.1.0", **VERSION_BROKERS}
DESIGN_REPLICAS = [3, *VERSION_BROKERS]

PREALLOC_INDEX = 10_485_760  # segment.index.bytes rounded down to 8 (kafka-reference §1.2)
PREALLOC_TIMEINDEX = 10_485_756  # rounded down to 12
SEG0 = "00000000000000000000"
OTHER_TOPIC_ID = "Zq9vYc2NSaWm1T4kR8uXbA"  # a valid 22-char Kafka Uuid that no corpus topic has
STRAY_UID = "5f3a9c0e2b7d4e6f8a1b2c3d4e5f6a7b"


@dataclass(frozen=True)
class Spot:
    """Where a finding must appear. ``path`` is relative to the broker's log dir (None: not checked,
    a ZooKeeper path starts with 'zk:')."""

    rule: str
    broker_id: int | None
    topic: str | None
    partition: int | None
    segment: int | None
    path: str | None
    severity: str
    message_has: tuple[str, ...] = ()

    @property
    def id(self) -> str:
        where = f"b{self.broker_id}" if self.broker_id is not None else "cluster"
        tp = f"{self.topic}-{self.partition}" if self.partition is not None else (self.topic or "")
        seg = f"@{self.segment}" if self.segment is not None else ""
        leaf = "" if self.path is None else "/" + self.path.rsplit("/", 1)[-1]
        return f"{self.rule}:{where}:{tp}{seg}{leaf}"


# ---------------------------------------------------------------------------------- file helpers
def _idx_entries(path: Path, fmt: str) -> list[tuple[int, int]]:
    data = path.read_bytes()
    size = struct.calcsize(fmt)
    return [struct.unpack_from(fmt, data, i) for i in range(0, len(data) - len(data) % size, size)]


def _write_entries(path: Path, fmt: str, entries: list[tuple[int, int]]) -> None:
    path.write_bytes(b"".join(struct.pack(fmt, *e) for e in entries))


def _v2_batches(log: Path) -> list[tuple[int, int, int]]:
    """(position, base offset, size) of each v2 batch (header fields per kafka-reference §3.1)."""
    data = log.read_bytes()
    out, pos = [], 0
    while pos + 12 <= len(data):
        base, length = struct.unpack_from(">qi", data, pos)
        out.append((pos, base, 12 + length))
        pos += 12 + length
    return out


def _rewrite_checkpoint(src: Path, dst: Path, keep: set[tuple[str, int]]) -> None:
    lines = src.read_text().splitlines()
    if len(lines) < 2:
        shutil.copyfile(src, dst)
        return
    entries = [ln for ln in lines[2:] if ln.strip() and (ln.split()[0], int(ln.split()[1])) in keep]
    dst.write_text("\n".join([lines[0], str(len(entries)), *entries]) + "\n")


def _aryan_logdir(corpus: Path, dst: Path, broker_id: int, partitions: list[str]) -> Path:
    """A log dir holding genuine aryan partition dirs, adopted into thillai's cluster."""
    src = corpus / ARYAN / "kafka-logs"
    dst.mkdir(parents=True)
    meta = (src / "meta.properties").read_text()
    meta = meta.replace(f"cluster.id={ARYAN_CLUSTER_ID}", f"cluster.id={THILLAI_CLUSTER_ID}")
    meta = meta.replace("broker.id=0", f"broker.id={broker_id}")
    (dst / "meta.properties").write_text(meta)
    shutil.copyfile(src / ".kafka_cleanshutdown", dst / ".kafka_cleanshutdown")
    keep = set()
    for name in partitions:
        copy_writable(src / name, dst / name)
        topic, _, part = name.rpartition("-")
        keep.add((topic, int(part)))
    for cp in (
        "recovery-point-offset-checkpoint",
        "replication-offset-checkpoint",
        "log-start-offset-checkpoint",
        "cleaner-offset-checkpoint",
    ):
        _rewrite_checkpoint(src / cp, dst / cp, keep)
    for p in dst.rglob("*"):
        os.chmod(p, 0o755 if p.is_dir() else 0o644)
    return dst


# ---------------------------------------------------------------------------------- ZooKeeper
def zk_records(corpus: Path) -> list[dict[str, Any]]:
    """thillai's snapshot.124 plus aryan's snapshot.32f topics, moved onto the aryan-derived brokers."""
    thillai = zk_snapshot.read_snapshot_file(corpus / THILLAI / THILLAI_ZK)
    aryan = zk_snapshot.read_snapshot_file(corpus / ARYAN / ARYAN_ZK)
    topics = {name.rpartition("-")[0] for name in ARYAN_PARTITIONS}
    out = [r for r in thillai if r["kind"] != "zk_snapshot_end"]
    template = next(r for r in thillai if r["kind"] == "broker" and r["broker_id"] == 0)
    for bid in sorted({3, *VERSION_BROKERS}):
        out.append(dict(template, broker_id=bid, port=19000 + bid, endpoints=[f"PLAINTEXT://localhost:{19000 + bid}"]))
    for r in aryan:
        if r.get("topic") not in topics:
            continue
        replicas = DESIGN_REPLICAS if r["topic"] == "design" else [3]
        r = dict(r)
        if r["kind"] == "topic":
            r["partitions"] = {p: list(replicas) for p in r["partitions"]}
            r["replication_factor"] = len(replicas)
        elif r["kind"] == "partition_state":
            assert r["leader"] == 0 and r["isr"] == [0], r  # snapshot.32f: broker 0 led everything
            r["leader"], r["isr"] = replicas[0], list(replicas)
        out.append(r)
    return out


def _zk_topic(records: list[dict[str, Any]], topic: str) -> dict[str, Any]:
    return next(r for r in records if r["kind"] == "topic" and r["topic"] == topic)


def _zk_state(records: list[dict[str, Any]], topic: str, partition: int) -> dict[str, Any]:
    return next(
        r for r in records if r["kind"] == "partition_state" and r["topic"] == topic and r["partition"] == partition
    )


# ---------------------------------------------------------------------------------- mutations
def S(rule, broker, topic, partition, segment, path, severity, *message_has) -> Spot:
    return Spot(rule, broker, topic, partition, segment, path, severity, tuple(message_has))


IDX0, TIDX0, LOG0 = f"{SEG0}.index", f"{SEG0}.timeindex", f"{SEG0}.log"

# rule -> the spots a mutation below must make it fire at (and that the pristine twin must not show)
MUTATIONS: list[Spot] = [
    # --- segment and index files: aryan partitions on broker 3 (3.1.0)
    S("index-last-offset", 3, "design", 0, 0, f"design-0/{IDX0}", "critical", "last offset is -1"),
    S("index-size", 3, "design", 1, 0, f"design-1/{IDX0}", "warning", "99 bytes"),
    S("index-not-monotonic", 3, "design", 2, 0, f"design-2/{IDX0}", "critical", "entry 2"),
    S("index-beyond-log", 3, "design1", 0, 0, f"design1-0/{IDX0}", "critical"),
    S("timeindex-last-timestamp", 3, "design1", 1, 0, f"design1-1/{TIDX0}", "critical"),
    S("index-not-monotonic", 3, "design1", 1, 0, f"design1-1/{TIDX0}", "critical"),
    S("index-entry-mismatch", 3, "design1", 2, 0, f"design1-2/{IDX0}", "warning"),
    S("index-orphan", 3, "design2", 0, 0, f"design2-0/{IDX0}", "warning"),
    S("index-missing", 3, "new_topic", 0, 2, "new_topic-0/00000000000000000002.log", "warning"),
    S("segment-leftover", 3, "new_topic", 1, 0, f"new_topic-1/{LOG0}.deleted", "warning"),
    S("segment-overlap", 3, "new_topic", 2, 0, f"new_topic-2/{LOG0}", "critical", "base offset 1"),
    S("file-unreadable", 3, "quickstart-events", 0, 0, None, "warning", f"quickstart-events-0/{TIDX0}"),
    S("leader-epoch-ahead", 3, "quickstart-events", 0, None, "quickstart-events-0/leader-epoch-checkpoint", "warning"),
    S("unclean-shutdown", 3, None, None, None, "", "warning"),
    # --- deep-scan damage in thillai's own logs (broker 0)
    S("log-torn-tail", 0, "__consumer_offsets", 26, 0, f"__consumer_offsets-26/{LOG0}", "warning"),
    S("log-crc", 0, "__consumer_offsets", 31, 0, f"__consumer_offsets-31/{LOG0}", "critical"),
    # --- partition metadata (thillai brokers 1 and 2)
    S("partition-metadata-malformed", 1, "mycart", 0, None, "mycart-0/partition.metadata", "critical"),
    S("leader-epoch-not-monotonic", 1, "my-topic", 1, None, "my-topic-1/leader-epoch-checkpoint", "warning"),
    S("leader-epoch-malformed", 2, "mycart", 1, None, "mycart-1/leader-epoch-checkpoint", "critical"),
    S("leader-epoch-ahead", 2, "my-topic", 2, None, "my-topic-2/leader-epoch-checkpoint", "warning", "[1,9]"),
    S("stray-dir", 2, "mycart", 2, None, f"mycart-2.{STRAY_UID}-delete", "warning"),
    # --- cross-source
    # one finding for the topic, naming both IDs; info: ZooKeeper has an ID, so the odd replica is the mismatch below
    S(
        "topic-id-split",
        None,
        "my-topic",
        None,
        None,
        "zk:/brokers/topics/my-topic",
        "info",
        f"{OTHER_TOPIC_ID} (1 replica) on broker 2 partition 0",
        "are its topic-id-mismatch findings",
    ),
    S("topic-id-mismatch", 2, "my-topic", 0, None, "my-topic-0/partition.metadata", "critical", OTHER_TOPIC_ID),
    S("topic-id-mismatch", 0, "test-topic", 0, None, "test-topic-0/partition.metadata", "critical", OTHER_TOPIC_ID),
    S("topic-id-missing-in-zk", None, "rahul", None, None, "zk:/brokers/topics/rahul", "critical"),
    S("replica-not-assigned", 2, "rahul", 0, None, "rahul-0", "warning"),
    S("replica-dir-missing", 1, "mycart", 2, None, None, "warning"),
    S("under-replicated", None, "my-topic", 1, None, "zk:/brokers/topics/my-topic/partitions/1/state", "warning"),
    S("offline-partition", None, "mycart", 0, None, "zk:/brokers/topics/mycart/partitions/0/state", "critical"),
    S("unsafe-replication", None, "design", None, None, "zk:/brokers/topics/design", "warning"),
    # --- log dirs
    S("checkpoint-malformed", 1, None, None, None, "replication-offset-checkpoint", "critical"),
    S("checkpoint-dangling", 2, "mycart", 5, None, "recovery-point-offset-checkpoint", "info"),
    S("meta-mismatch", 0, None, None, None, "meta.properties", "critical", ARYAN_CLUSTER_ID),
]


# the same damage on brokers 8/10/11/20/36: rule, partition dir, file -> severity by broker (None: silent)
def _by_version(b8, b10, b11, b20, b36) -> dict[int, str | None]:
    return dict(zip(VERSION_BROKERS, (b8, b10, b11, b20, b36), strict=True))


C, W = "critical", "warning"
VERSIONED: list[tuple[str, str, str, dict[int, str | None]]] = [
    # an untrimmed (preallocated, zero-tailed) index: 0.8 fails startup, 0.9-2.2 rebuild it, 2.3+ trust it;
    # the active segment of a running broker (11) is legitimately preallocated
    ("index-untrimmed", "design-0", IDX0, _by_version(C, W, None, W, C)),
    ("index-untrimmed", "design-0", TIDX0, _by_version(C, W, None, W, C)),
    # Kafka reads the zero tail as entries, last entry (base, 0): last offset == base offset, <= 1.1 only
    ("index-last-offset", "design-0", IDX0, _by_version(C, W, None, None, None)),
    # the zero tail's last timestamp 0 < first: checked from 0.10.1 (not on 0.8), trusted from 2.3
    ("timeindex-last-timestamp", "design-0", TIDX0, _by_version(None, W, None, W, C)),
    # one real entry whose offset is the base offset: "last offset == base offset with entries", <= 1.1 only
    ("index-last-offset", "design-1", IDX0, _by_version(C, W, W, None, None)),
    # an entry at a batch start whose offset lies past that batch: benign on 2.0+ (multi-batch appends)
    ("index-entry-mismatch", "design-2", IDX0, _by_version(W, W, W, None, None)),
]


def _mutate_aryan_broker3(ld: Path, corpus: Path) -> None:
    # index-last-offset (< base on every version): one entry whose relative offset is -1
    p = ld / "design-0" / IDX0
    first = _idx_entries(p, ">ii")[0]
    _write_entries(p, ">ii", [(-1, first[1])])
    # index-size: 3 stray bytes after 96 bytes of entries
    with (ld / "design-1" / IDX0).open("ab") as f:
        f.write(b"\x01\x02\x03")
    # index-not-monotonic: entries 1 and 2 swapped (the violation is at entry 2)
    p = ld / "design-2" / IDX0
    e = _idx_entries(p, ">ii")
    e[1], e[2] = e[2], e[1]
    _write_entries(p, ">ii", e)
    # index-beyond-log: the log cut at the batch the last index entry points at (a batch boundary)
    last_pos = _idx_entries(ld / "design1-0" / IDX0, ">ii")[-1][1]
    os.truncate(ld / "design1-0" / LOG0, last_pos)
    # timeindex-last-timestamp: the last timestamp set below the first
    p = ld / "design1-1" / TIDX0
    e = _idx_entries(p, ">qi")
    e[-1] = (e[0][0] - 1000, e[-1][1])
    _write_entries(p, ">qi", e)
    # index-entry-mismatch: entry 3 points one byte past its batch start (still monotonic)
    p = ld / "design1-2" / IDX0
    e = _idx_entries(p, ">ii")
    e[3] = (e[3][0], e[3][1] + 1)
    _write_entries(p, ">ii", e)
    # index-orphan: the (empty) log removed, its indexes left
    (ld / "design2-0" / LOG0).unlink()
    # index-missing: the offset index of segment 2 removed
    (ld / "new_topic-0" / "00000000000000000002.index").unlink()
    # segment-leftover: an async-delete leftover
    shutil.copyfile(ld / "new_topic-1" / LOG0, ld / "new_topic-1" / f"{LOG0}.deleted")
    # segment-overlap: a segment at base 0 whose offsets (0..435) run past the next segment's base 1
    for ext in ("log", "index", "timeindex"):
        shutil.copyfile(
            corpus / ARYAN / "kafka-logs" / "design-0" / f"{SEG0}.{ext}", ld / "new_topic-2" / f"{SEG0}.{ext}"
        )
    # file-unreadable: a directory where the time index should be
    p = ld / "quickstart-events-0" / TIDX0
    p.unlink()
    p.mkdir()
    (p / "inner").write_bytes(b"x")
    # leader-epoch-ahead (ZooKeeper): epoch 5 on disk, ZooKeeper's state says leader_epoch 0
    (ld / "quickstart-events-0" / "leader-epoch-checkpoint").write_text("0\n1\n5 0\n")
    # unclean-shutdown: no clean-shutdown marker
    (ld / ".kafka_cleanshutdown").unlink()


def _mutate_versioned(ld: Path) -> None:
    # design-0: both indexes preallocated to segment.index.bytes (zero tail), as after kill -9
    os.truncate(ld / "design-0" / IDX0, PREALLOC_INDEX)
    os.truncate(ld / "design-0" / TIDX0, PREALLOC_TIMEINDEX)
    # design-1: one entry, relative offset 0 (last offset == base offset), at a real batch position
    p = ld / "design-1" / IDX0
    _write_entries(p, ">ii", [(0, _idx_entries(p, ">ii")[0][1])])
    # design-2: entry 4's offset moved one past its single-record batch (still below entry 5's offset)
    p = ld / "design-2" / IDX0
    e = _idx_entries(p, ">ii")
    assert e[4][0] + 1 < e[5][0]
    e[4] = (e[4][0] + 1, e[4][1])
    _write_entries(p, ">ii", e)


def _checkpoint_add(path: Path, line: str) -> None:
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], str(int(lines[1]) + 1), *lines[2:], line]) + "\n")


def _mutate_thillai(b: dict[int, Path]) -> None:
    # broker 0: a torn tail (the last batch cut short) and a CRC error (a record byte flipped)
    log = b[0] / "__consumer_offsets-26" / LOG0
    os.truncate(log, log.stat().st_size - 5)
    log = b[0] / "__consumer_offsets-31" / LOG0
    pos, _base, size = _v2_batches(log)[-1]
    assert size > 70
    data = bytearray(log.read_bytes())
    data[pos + 65] ^= 0xFF
    log.write_bytes(bytes(data))
    # broker 0: a disk from another cluster
    meta = b[0] / "meta.properties"
    meta.write_text(meta.read_text().replace(THILLAI_CLUSTER_ID, ARYAN_CLUSTER_ID))
    # broker 1
    (b[1] / "mycart-0" / "partition.metadata").write_text("version: 0\ntopic_id: AAAAAAAAAAAAAAAAAAAAAA")
    (b[1] / "my-topic-1" / "leader-epoch-checkpoint").write_text("0\n2\n8 0\n2 0\n")
    (b[1] / "replication-offset-checkpoint").write_text("0\n2\nmycart 0\n")
    shutil.rmtree(b[1] / "mycart-2")
    # broker 2
    (b[2] / "mycart-1" / "leader-epoch-checkpoint").write_text("0\n1\nbogus\n")
    (b[2] / "my-topic-2" / "leader-epoch-checkpoint").write_text("0\n2\n0 0\n1 9\n")
    (b[2] / "my-topic-0" / "partition.metadata").write_text(f"version: 0\ntopic_id: {OTHER_TOPIC_ID}")
    shutil.copytree(b[2] / "mycart-2", b[2] / f"mycart-2.{STRAY_UID}-delete")
    shutil.copytree(b[0] / "rahul-0", b[2] / "rahul-0")
    _checkpoint_add(b[2] / "recovery-point-offset-checkpoint", "mycart 5 0")


def _mutate_zk(records: list[dict[str, Any]]) -> None:
    _zk_topic(records, "test-topic")["topic_id"] = OTHER_TOPIC_ID
    _zk_topic(records, "rahul")["topic_id"] = None
    _zk_state(records, "my-topic", 1)["isr"] = [1, 0]
    _zk_state(records, "mycart", 0)["leader"] = -1
    design = _zk_topic(records, "design")
    design["min_insync_replicas"] = len(DESIGN_REPLICAS)
    design["config"] = {**(design.get("config") or {}), "min.insync.replicas": str(len(DESIGN_REPLICAS))}


# ---------------------------------------------------------------------------------- staging
@dataclass
class Fleet:
    root: Path
    logdirs: dict[int, Path]
    probe_dir: Path
    brokers_path: Path
    zk_path: Path
    zk: list[dict[str, Any]]


def stage(root: Path, logdirs: dict[int, list[Path]], *, deep: bool, verify_crc: bool) -> Path:
    """Probe each broker's log dirs and stage the output as the audit does: segment, partition and file records
    as Parquet. The probe's output as it printed it is kept beside, as ``root/probe-as-printed/broker_id=<N>/``:
    the form of output staged before records went to Parquet, which detection still reads."""
    probe_dir = root / "probe"
    for bid, dirs in logdirs.items():
        dest = probe_dir / f"broker_id={bid}"
        dest.mkdir(parents=True)
        text = io.StringIO()
        Probe(text, deep=deep, verify_crc=verify_crc).run([str(d) for d in dirs])
        output = text.getvalue().encode("utf-8")
        printed = root / "probe-as-printed" / f"broker_id={bid}"
        printed.mkdir(parents=True)
        (printed / "probe.jsonl").write_bytes(output)
        split_to_dir(io.BytesIO(output), dest, "probe.jsonl")
    return probe_dir


def write_jsonl(path: Path, records: list[dict[str, Any]]) -> Path:
    with path.open("w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    return path


def build_fleet(
    corpus: Path,
    root: Path,
    *,
    mutate: bool,
    edit: Callable[[dict[int, Path], list[dict[str, Any]]], None] | None = None,
) -> Fleet:
    """The fleet (``mutate``: every mutation of ``MUTATIONS`` applied); ``edit`` changes the log dirs (by broker id)
    and the ZooKeeper records further before they are probed and staged."""
    root.mkdir(parents=True)
    logs = root / "logs"
    b: dict[int, Path] = {}
    for i in (0, 1, 2):
        b[i] = copy_writable(corpus / THILLAI / f"kafka-logs-{i}", logs / f"broker-{i}")
    b[3] = _aryan_logdir(corpus, logs / "broker-3", 3, ARYAN_PARTITIONS)
    for bid in VERSION_BROKERS:
        b[bid] = _aryan_logdir(corpus, logs / f"broker-{bid}", bid, DESIGN)
    zk = zk_records(corpus)
    if mutate:
        _mutate_thillai(b)
        _mutate_aryan_broker3(b[3], corpus)
        for bid in VERSION_BROKERS:
            _mutate_versioned(b[bid])
        _mutate_zk(zk)
    if edit is not None:
        edit(b, zk)
    probe_dir = stage(root, {bid: [d] for bid, d in b.items()}, deep=True, verify_crc=True)
    facts = [{"broker_id": bid, "kafka_version": ver, "running": bid in RUNNING} for bid, ver in BROKERS.items()]
    return Fleet(
        root=root,
        logdirs=b,
        probe_dir=probe_dir,
        brokers_path=write_jsonl(root / "brokers.jsonl", facts),
        zk_path=write_jsonl(root / "zk.jsonl", zk),
        zk=zk,
    )
