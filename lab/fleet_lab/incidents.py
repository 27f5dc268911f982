"""Incidents the fleet lab injects on demand, and the seed reports replayed end to end.

Each incident reproduces a Kafka mechanism (kafka-reference.md is cited per incident) and returns what it
did as a record: ``incident``, ``broker_id``, ``log_dir``, ``topic``, ``partition``, ``segment``,
``paths`` (absolute), ``rule`` (the detection rule that must report it) and ``mechanism``. Tests check
the claimed state by reading files and znodes, never by trusting this record.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleet_doctor.cluster_metadata import read_quorum_state
from fleet_doctor.probe import (
    CLEAN_SHUTDOWN_FILE,
    KRAFT_SNAPSHOT_RE,
    LEADER_EPOCH_CHECKPOINT,
    PARTITION_METADATA,
    QUORUM_STATE,
    ZERO_UUID,
    parse_partition_metadata,
    segment_file_name,
)
from fleet_lab.broker import BrokerConfig, running_pid
from fleet_lab.fleet import (
    LabBrokerState,
    LabError,
    LabState,
    live_replica_dirs,
    own_as_kafka,
    partition_topic_ids,
    quorum_leader,
    read_metadata,
    run_service,
    wait_healthy,
)
from fleet_lab.kafka_files import log_batches, random_topic_id, segment_bases, write_partition_metadata
from fleet_lab.kraft import METADATA_DIR, read_batch, read_batch_refs, snapshot_ids, write_quorum_state


@dataclass
class Target:
    broker_id: int
    log_dir: Path
    topic: str
    partition: int
    path: Path  # the partition dir

    def segments(self) -> list[int]:
        return segment_bases(self.path)

    def file(self, base: int, ext: str) -> Path:
        return self.path / segment_file_name(base, ext)


@dataclass
class Injected:
    incident: str
    rule: str | None
    mechanism: str
    broker_id: int | None = None
    log_dir: str | None = None
    topic: str | None = None
    partition: int | None = None
    segment: int | None = None
    paths: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def find_target(state: LabState, broker: int | None, topic: str | None, partition: int | None) -> Target:
    """A replica of ``topic`` (default ``orders``) on ``broker`` (default: the first broker hosting it)."""
    topic = topic or "orders"
    brokers = [state.broker(broker)] if broker is not None else state.brokers
    for b in brokers:
        for d in map(Path, b.log_dirs):
            for t, p, pdir in sorted(live_replica_dirs(d), key=lambda r: r[1]):
                if t == topic and (partition is None or p == partition):
                    return Target(b.id, d, topic, p, pdir)
    raise LabError(
        f"no replica of {topic}"
        + (f"-{partition}" if partition is not None else "")
        + (f" on broker {broker}" if broker is not None else "")
        + " in the lab"
    )


def _older_segment(t: Target) -> int:
    segs = t.segments()
    if len(segs) < 2:
        raise LabError(f"{t.path} has a single segment; pick a partition with an inactive segment")
    return segs[0]


def _base(t: Target, incident: str, rule: str | None, mechanism: str, segment: int | None, *paths: Path) -> Injected:
    return Injected(
        incident, rule, mechanism, t.broker_id, str(t.log_dir), t.topic, t.partition, segment, [str(p) for p in paths]
    )


# --------------------------------------------------------------------------------------------
# file damage
def index_bad_size(state: LabState, t: Target) -> Injected:
    base = _older_segment(t)
    idx = t.file(base, "index")
    with open(idx, "ab") as f:
        f.write(b"\0\0\0")
    return _base(
        t,
        "index-bad-size",
        "index-size",
        "an .index whose length is not a multiple of 8 (a torn resize or a copy cut short): OffsetIndex.sanityCheck "
        "'Index file ... is corrupt, found N bytes which is neither positive nor a multiple of 8' (reference §1.3)",
        base,
        idx,
    )


def index_orphan(state: LabState, t: Target) -> Injected:
    base = _older_segment(t)
    log = t.file(base, "log")
    log.unlink()
    left = [p for p in (t.file(base, "index"), t.file(base, "timeindex")) if p.exists()]
    return _base(
        t,
        "index-orphan",
        "index-orphan",
        "segment deletion interrupted between the .log and its indexes (LogSegment.delete removes the .log first); "
        "Kafka deletes the orphans at the next start: 'Found an orphaned index file ...' (reference §2.1 step 3)",
        base,
        *left,
    )


def index_missing(state: LabState, t: Target) -> Injected:
    base = _older_segment(t)
    idx = t.file(base, "index")
    idx.unlink()
    return _base(
        t,
        "index-missing",
        "index-missing",
        "the .index of a segment is gone (deleted by hand, as the seed-000 workaround does, or lost): Kafka rebuilds "
        "it by recovering the segment at the next start, which costs restart time (reference §1.4)",
        base,
        idx,
    )


def segment_leftover(state: LabState, t: Target) -> Injected:
    base = _older_segment(t)
    moved = []
    for ext in ("log", "index", "timeindex"):
        src = t.file(base, ext)
        if src.exists():
            dst = src.with_name(src.name + ".deleted")
            os.replace(src, dst)
            moved.append(dst)
    return _base(
        t,
        "segment-leftover",
        "segment-leftover",
        "retention renamed the oldest segment to *.deleted for asynchronous deletion (file.delete.delay.ms) and the "
        "broker died before the delete ran; Kafka removes them at the next start (reference §2.1 step 1)",
        base,
        *moved,
    )


def log_torn_tail(state: LabState, t: Target) -> Injected:
    active = t.segments()[-1]
    log = t.file(active, "log")
    batches = log_batches(log, active)
    if not batches:
        raise LabError(f"{log} holds no batch to tear; pick a partition with records")
    pos, _, _, size = batches[-1]
    with open(log, "rb") as f:
        f.seek(pos)
        last = f.read(size)
    with open(log, "ab") as f:
        f.write(last[: size // 2])  # half of a batch: its header promises more bytes than the file holds
    return _base(
        t,
        "log-torn-tail",
        "log-torn-tail",
        "a crash in the middle of an append left half a batch at the end of the active segment; recovery truncates "
        "it: 'Found invalid messages in log segment ... at byte offset N' (reference §2.5)",
        active,
        log,
    )


def log_crc(state: LabState, t: Target) -> Injected:
    base = _older_segment(t)
    log = t.file(base, "log")
    batches = log_batches(log, base)
    pos, _, _, size = batches[len(batches) // 2]
    flip_at = pos + size - 2  # inside the last record's value: covered by the CRC, not the header
    with open(log, "r+b") as f:
        f.seek(flip_at)
        b = f.read(1)
        f.seek(flip_at)
        f.write(bytes([b[0] ^ 0xFF]))
    inj = _base(
        t,
        "log-crc",
        "log-crc",
        "bit rot in a closed segment: the batch's CRC (CRC-32C for v2, CRC-32 for v0/v1) no longer matches; a "
        "fetch or recovery of it fails with CorruptRecordException (reference §3)",
        base,
        log,
    )
    inj.details = {"batch_position": pos, "byte_flipped_at": flip_at}
    return inj


def partition_metadata_malformed(state: LabState, t: Target) -> Injected:
    pm = t.path / PARTITION_METADATA
    pm.write_bytes(f"version: 0\ntopic_id: {ZERO_UUID}".encode())
    return _base(
        t,
        "partition-metadata-malformed",
        "partition-metadata-malformed",
        "partition.metadata holding the zero UUID (a hand edit or a broken tool): 'Invalid topic ID in partition "
        "metadata file'; the read error takes the whole log dir offline at the next start (reference §4.1)",
        None,
        pm,
    )


def leader_epoch_malformed(state: LabState, t: Target) -> Injected:
    lec = t.path / LEADER_EPOCH_CHECKPOINT
    lec.write_bytes(b"0\n2\n0 0\n")
    return _base(
        t,
        "leader-epoch-malformed",
        "leader-epoch-malformed",
        "a leader-epoch-checkpoint cut short (2 entries announced, 1 present): 'Expected [2] entries in checkpoint "
        "file ..., but found only [1]'; the log dir goes offline at the next start (reference §4.2, §2.3)",
        None,
        lec,
    )


def checkpoint_malformed(state: LabState, t: Target) -> Injected:
    cp = t.log_dir / "recovery-point-offset-checkpoint"
    lines = cp.read_text().splitlines()
    if len(lines) < 3:
        raise LabError(f"{cp} has no entry to damage")
    lines[2] = lines[2].rsplit(" ", 1)[0]  # "topic partition" without its offset
    cp.write_text("\n".join(lines) + "\n")
    inj = _base(
        t,
        "checkpoint-malformed",
        "checkpoint-malformed",
        "a torn recovery-point-offset-checkpoint line: 'Malformed line in checkpoint file [...]'; LogManager marks "
        "the dir offline (reference §2.3). A running broker rewrites the file at its next checkpoint or clean stop: "
        "inject on a stopped broker to keep the damage",
        None,
        cp,
    )
    inj.partition = None
    inj.topic = None
    return inj


def stray_dir(state: LabState, t: Target, suffix: str = "delete") -> Injected:
    if suffix not in ("delete", "stray"):
        raise LabError(f"--suffix must be delete or stray ({suffix!r})")
    dst = t.log_dir / f"{t.topic}-{t.partition}.{uuid.uuid4().hex}-{suffix}"
    shutil.copytree(t.path, dst)
    if suffix == "stray":
        mechanism = (
            "a KRaft broker (3.7+) found the replica stray at startup (no topic ID, a topic ID the metadata does not "
            "hold, or an assignment without this broker: LogManager.isStrayKraftReplica) and renamed it "
            "<topic>-<partition>.<uuid>-stray; Kafka keeps it, nobody serves it, it is left for an operator "
            "(reference §2.1 item 6, kraft-reference §7)"
        )
    else:
        mechanism = (
            "topic deletion renamed the replica to <topic>-<partition>.<uuid>-delete and the broker died before the "
            "asynchronous delete: a lingering -delete directory (reference §2.1)"
        )
    inj = _base(t, "stray-dir", "stray-dir", mechanism, None, dst)
    inj.details = {"suffix": suffix}
    return inj


def topic_id_mismatch(state: LabState, t: Target) -> Injected:
    pm = t.path / PARTITION_METADATA
    old = None
    with contextlib.suppress(OSError, ValueError):
        old = parse_partition_metadata(pm.read_bytes(), str(pm))["topic_id"]
    new = random_topic_id()
    write_partition_metadata(t.path, new)
    if state.kraft:
        mechanism = (
            "a replica whose partition.metadata holds a topic ID the metadata log's TopicRecord does not (restored "
            "from another cluster's backup, or a topic deleted and re-created while the broker was away): a running "
            "broker keeps the ID it loaded; at its next start Kafka 3.7.1+ finds the ID absent from the image and "
            "renames the replica -stray (LogManager.isStrayKraftReplica), then creates it empty and re-replicates"
        )
    else:
        mechanism = (
            "a replica whose partition.metadata holds another topic ID than ZooKeeper's /brokers/topics/<t>: at its "
            "next start the broker logs InconsistentTopicIdException and keeps the replica out of ISR"
        )
    inj = _base(t, "topic-id-mismatch", "topic-id-mismatch", mechanism, None, pm)
    inj.details = {"topic_id_before": old, "topic_id_written": new}
    return inj


# --------------------------------------------------------------------------------------------
# KRaft incidents (a lab up with --metadata kraft)
def _need_kraft(state: LabState, incident: str) -> None:
    if not state.kraft:
        raise LabError(f"{incident} needs a KRaft lab (fleet-lab up --metadata kraft); this one runs ZooKeeper")


def _follower(state: LabState, broker: int | None) -> LabBrokerState:
    """``--broker``, else the highest node id that does not lead the quorum."""
    if broker is not None:
        return state.broker(broker)
    leader = quorum_leader(state)
    others = [b for b in state.brokers if leader is None or b.id != leader[0]]
    return (others or state.brokers)[-1]


def _metadata_dir(b: LabBrokerState) -> Path:
    return Path(b.log_dirs[0]) / METADATA_DIR


def kraft_stray_replica(
    state: LabState, broker: int | None, topic: str | None, partition: int | None, unknown_topic_id: bool
) -> Injected:
    """A replica dir on a broker the assignment does not place it on (or, ``unknown_topic_id``, of a topic the
    metadata does not know), copied from a real replica with its partition.metadata."""
    _need_kraft(state, "kraft-stray-replica")
    records = read_metadata(state)
    assignment = {(r["topic"], r["partition"]): r["replicas"] for r in records if r["kind"] == "partition_state"}
    ids = {r["topic"]: r["topic_id"] for r in records if r["kind"] == "topic"}
    want_topic = topic or ("orders" if unknown_topic_id else None)
    choice = None
    for (t, p), replicas in sorted(assignment.items()):
        if (want_topic and t != want_topic) or (partition is not None and p != partition) or t.startswith("__"):
            continue
        hosts = [b for b in state.brokers if b.id in replicas]
        if unknown_topic_id:
            target = state.broker(broker) if broker is not None else hosts[0]
        else:
            outside = [b for b in state.brokers if b.id not in replicas and (broker is None or b.id == broker)]
            if not outside:
                continue
            target = outside[0]
        choice = (t, p, replicas, hosts[0], target)
        break
    if choice is None:
        raise LabError(
            "no partition"
            + (f" of {want_topic}" if want_topic else "")
            + (f" {partition}" if partition is not None else "")
            + (f" that broker {broker} does not host" if broker is not None and not unknown_topic_id else "")
            + " to place a stray replica of (every broker hosts it?)"
        )
    t, p, replicas, source_broker, target = choice
    src = find_target(state, source_broker.id, t, p).path
    log_dir = Path(target.log_dirs[0])
    if unknown_topic_id:
        name = f"{t}-retired"
        dst = log_dir / f"{name}-{p}"
        shutil.copytree(src, dst)
        topic_id = random_topic_id()
        write_partition_metadata(dst, topic_id)
        why = f"its topic ID {topic_id} is not in the metadata (a topic deleted while the broker was away)"
    else:
        name = t
        dst = log_dir / f"{t}-{p}"
        shutil.copytree(src, dst)
        topic_id = ids.get(t)
        why = f"the assignment of {t}-{p} is {replicas}, without broker {target.id}"
    inj = Injected(
        "kraft-stray-replica",
        "stray-replica",
        "a replica left on a KRaft broker that the metadata no longer places there (a reassignment or topic deletion "
        "it missed while offline, a dir copied by hand): Kafka 3.7.1+ finds it stray at the next start "
        "(LogManager.isStrayKraftReplica) and renames it <topic>-<partition>.<uuid>-stray; 3.0-3.6 delete it "
        "(reference §2.1 item 6, kraft-reference §7). " + why,
        target.id,
        str(log_dir),
        name,
        p,
        None,
        [str(dst)],
    )
    inj.details = {"topic_id": topic_id, "assignment": replicas, "copied_from_broker": source_broker.id}
    return inj


def metadata_log_torn(state: LabState, broker: int | None, crc: bool) -> Injected:
    _need_kraft(state, "metadata-log-torn")
    b = _follower(state, broker)
    mdir = _metadata_dir(b)
    details: dict[str, Any] = {}
    if not crc:
        # a crash in the middle of an append: the node dies (kill -9), half a batch stays at the log's end
        if running_pid(b.config()):
            r = run_service(b, "kill")
            if r.returncode != 0:
                raise LabError(f"kill of broker {b.id} failed: {r.stdout}{r.stderr}")
            details["killed"] = True
        refs = read_batch_refs(mdir)
        if not refs:
            raise LabError(f"{mdir} holds no batch to tear")
        last = refs[-1]
        data = read_batch(last)
        with open(last.segment, "ab") as f:
            f.write(data[: len(data) // 2])
        path = last.segment
        details.update({"torn_after_offset": last.header.last_offset, "bytes_appended": len(data) // 2})
        mechanism = (
            "the node was killed in the middle of an append to its metadata log: half a batch after the last "
            "complete one. At the next start KafkaMetadataLog recovers the log from offset 0 and truncates it; "
            "meanwhile the file fails Kafka's own reading (kraft-reference §1, kafka-reference §2.5)"
        )
    else:
        refs = read_batch_refs(mdir)
        data_refs = [r for r in refs if not r.header.control and r.header.last_offset + 1 < refs[-1].header.base_offset]
        if not data_refs:
            raise LabError(f"{mdir} holds no closed data batch to damage")
        # the newest closed data batch past the newest snapshot: one in the middle is soon covered by a snapshot
        # (every 8 KiB of metadata here), and the replay, as Kafka's, starts after the newest snapshot
        snap_end = max((end for end, _epoch in snapshot_ids(mdir)), default=0)
        ref = ([r for r in data_refs if r.header.base_offset >= snap_end] or data_refs)[-1]
        flip_at = ref.position + ref.header.size - 2  # inside the last record's value: covered by the CRC
        with open(ref.segment, "r+b") as f:
            f.seek(flip_at)
            byte = f.read(1)
            f.seek(flip_at)
            f.write(bytes([byte[0] ^ 0xFF]))
        path = ref.segment
        details.update({"batch_offset": ref.header.base_offset, "byte_flipped_at": flip_at})
        mechanism = (
            "bit rot in the node's metadata log: a batch's CRC-32C no longer matches; Kafka's recovery at the next "
            "start truncates the log at that batch and the node fetches the rest from the leader again "
            "(kraft-reference §2, kafka-reference §3)"
        )
    inj = Injected(
        "metadata-log-torn", "metadata-log-torn", mechanism, b.id, b.log_dirs[0], METADATA_DIR.rsplit("-", 1)[0], 0
    )
    inj.segment = int(path.name.split(".")[0])
    inj.paths = [str(path)]
    inj.details = {"crc": crc, **details}
    return inj


def quorum_state_divergent(state: LabState, broker: int | None) -> Injected:
    _need_kraft(state, "quorum-state-divergent")
    if len(state.brokers) < 2:
        raise LabError("quorum-state-divergent needs at least 2 voters")
    b = _follower(state, broker)
    qs_path = _metadata_dir(b) / QUORUM_STATE
    before = read_quorum_state(str(qs_path))
    if before is None:
        raise LabError(f"{qs_path} does not exist")
    voters = [x.id for x in state.brokers]
    other = (
        next(v for v in voters if v != before["leader_id"] and v != b.id)
        if len(voters) > 2
        else next(v for v in voters if v != before["leader_id"])
    )
    write_quorum_state(qs_path.parent, other, before["leader_epoch"], -1, voters)
    inj = Injected(
        "quorum-state-divergent",
        "quorum-state-divergent",
        "a node's quorum-state naming another leader at the same epoch (a file restored from a backup or edited by "
        "hand; Raft allows one leader per epoch): Kafka reads it only at startup and rewrites it at its next "
        "election transition (kraft-reference §6)",
        b.id,
        b.log_dirs[0],
        paths=[str(qs_path)],
    )
    inj.details = {
        "leader_before": before["leader_id"],
        "leader_written": other,
        "epoch": before["leader_epoch"],
    }
    return inj


def metadata_snapshot_gap(state: LabState, broker: int | None) -> Injected:
    _need_kraft(state, "metadata-snapshot-gap")
    b = _follower(state, broker)
    mdir = _metadata_dir(b)
    bases = segment_bases(mdir)
    if len(bases) < 2:
        raise LabError(f"{mdir} has a single segment: nothing to delete before the log's head")
    removed = []
    for name in sorted(os.listdir(mdir)):
        if KRAFT_SNAPSHOT_RE.fullmatch(name) or any(
            name == segment_file_name(bases[0], ext) for ext in ("log", "index", "timeindex")
        ):
            os.unlink(mdir / name)
            removed.append(str(mdir / name))
    inj = Injected(
        "metadata-snapshot-gap",
        "metadata-snapshot-gap",
        "the metadata log's first segment and every snapshot gone (deleted by hand or by a cleanup tool that took "
        "the .checkpoint files for junk): the log starts at offset "
        f"{bases[1]}, and no snapshot covers the records before it, so the node cannot rebuild the image "
        "(KafkaMetadataLog keeps segments only behind a snapshot; kraft-reference §1, §5)",
        b.id,
        b.log_dirs[0],
        paths=removed,
    )
    inj.details = {"log_start_offset": bases[1]}
    return inj


def kraft_controller_failover(state: LabState) -> Injected:
    """KRaft: the active controller restarted (a clean stop and start): the others elect a new leader in a new
    epoch."""
    before = quorum_leader(state)
    if before is None:
        raise LabError("the quorum has no leader")
    b = state.broker(before[0])
    for cmd in ("stop", "start"):
        r = run_service(b, cmd)
        if r.returncode != 0:
            raise LabError(f"{cmd} of broker {b.id} failed: {r.stdout}{r.stderr}")
    _wait(lambda: (quorum_leader(state) or (0, 0))[1] > before[1], 20, "no new quorum leader was elected")
    after = quorum_leader(state)
    inj = Injected(
        "controller-failover",
        None,
        "the active controller restarted: the remaining voters elect a new leader in a new epoch (quorum-state "
        "rewritten, a LEADER_CHANGE control batch), which fences the old broker incarnation and registers the new "
        "one (kraft-reference §6)",
    )
    inj.details = {
        "controller_before": before[0],
        "epoch_before": before[1],
        "controller_after": after[0] if after else None,
        "epoch_after": after[1] if after else None,
    }
    return inj


# --------------------------------------------------------------------------------------------
# process and ZooKeeper incidents
def kill9_untrimmed_index(state: LabState, broker: int | None) -> Injected:
    b = state.broker(broker if broker is not None else state.brokers[0].id)
    cfg = b.config()
    if not running_pid(cfg):
        raise LabError(f"broker {b.id} is not running: nothing to kill")
    r = run_service(b, "kill")
    if r.returncode != 0:
        raise LabError(f"kill of broker {b.id} failed: {r.stdout}{r.stderr}")
    untrimmed = []
    for d in map(Path, b.log_dirs):
        for part in sorted(os.listdir(d)):
            pdir = d / part
            if not pdir.is_dir():
                continue
            logs = segment_bases(pdir)
            if logs:
                for ext in ("index", "timeindex"):
                    f = pdir / segment_file_name(logs[-1], ext)
                    if f.exists() and f.stat().st_size >= cfg.segment_index_bytes - 12:
                        untrimmed.append(str(f))
    return Injected(
        "kill9-untrimmed-index",
        "index-untrimmed",
        "kill -9 of a running broker: the active segments' indexes stay preallocated to segment.index.bytes "
        "(10 MiB of zeros after the real entries) and no .kafka_cleanshutdown is written (reference §1.2, §2.2)",
        b.id,
        None,
        None,
        None,
        None,
        untrimmed,
        {"clean_shutdown_markers": [str(Path(d) / CLEAN_SHUTDOWN_FILE) for d in b.log_dirs]},
    )


def old_client_add_partitions(state: LabState, topic: str | None, partitions: int | None) -> Injected:
    topic = topic or "orders"
    zk = state.zk_client()
    try:
        raw, stat = zk.get(f"/brokers/topics/{topic}")
        znode = json.loads(raw)
        assignment = {int(p): r for p, r in znode["partitions"].items()}
        old_count = len(assignment)
        new_count = partitions or old_count * 2
        if new_count <= old_count:
            raise LabError(f"{topic} already has {old_count} partitions")
        rf = len(next(iter(assignment.values())))
        live = sorted(int(i) for i in zk.get_children("/brokers/ids"))
        for p in range(old_count, new_count):
            assignment[p] = [live[(p + k) % len(live)] for k in range(min(rf, len(live)))]
        # what a pre-2.8 AdminUtils.writeTopicPartitionAssignment writes: version 1, no topic_id
        new = {"version": 1, "partitions": {str(p): r for p, r in sorted(assignment.items())}}
        zk.set(f"/brokers/topics/{topic}", json.dumps(new).encode(), version=stat.version)
        added = list(range(old_count, new_count))
        _wait(
            lambda: all(zk.exists(f"/brokers/topics/{topic}/partitions/{p}/state") for p in added),
            20,
            f"the controller did not create state znodes for {topic} {added}",
        )
    finally:
        zk.stop()
        zk.close()
    inj = Injected(
        "old-client-add-partitions",
        "topic-id-missing-in-zk",
        "a pre-2.8 `kafka-topics --zookeeper --alter --partitions` (or CMAK via Curator) rewrites "
        "/brokers/topics/<t> as {version:1, partitions} and drops topic_id; the controller's partition-modification "
        "handler never restores it (KAFKA-14190, reference §5, §6)",
        topic=topic,
    )
    inj.details = {"old_topic_id": znode.get("topic_id"), "partitions_before": old_count, "partitions_after": new_count}
    return inj


def controller_failover(state: LabState) -> Injected:
    zk = state.zk_client()
    try:
        raw, _ = zk.get("/controller")
        old = json.loads(raw)["brokerid"]
        epoch_before = int(zk.get("/controller_epoch")[0])
        zk.delete("/controller")
        _wait(
            lambda: zk.exists("/controller") and int(zk.get("/controller_epoch")[0]) > epoch_before,
            20,
            "no new controller was elected",
        )
        new = json.loads(zk.get("/controller")[0])["brokerid"]
        epoch = int(zk.get("/controller_epoch")[0])
        # the new controller processes every topic (processTopicIds): wait until it is done
        _wait(
            lambda: (
                all(
                    json.loads(zk.get(f"/brokers/topics/{t}")[0]).get("topic_id")
                    for t in zk.get_children("/brokers/topics")
                )
                or not state.features.uses_topic_ids
            ),
            20,
            "the new controller did not assign topic IDs",
        )
    finally:
        zk.stop()
        zk.close()
    inj = Injected(
        "controller-failover",
        None,
        "the /controller znode deleted (as the seed-004 report does by hand): every broker races to recreate it, the "
        "winner bumps /controller_epoch and, with IBP >= 2.8, mints a new random topic ID for every topic znode "
        "without one (KafkaController.processTopicIds, reference §5)",
    )
    inj.details = {"controller_before": old, "controller_after": new, "controller_epoch": epoch}
    return inj


def _wait(check: Callable[[], Any], timeout: float, message: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            if check():
                return
        time.sleep(0.1)
    raise LabError(f"{message} within {timeout:.0f} s")


FILE_INCIDENTS: dict[str, Callable[[LabState, Target], Injected]] = {
    "index-bad-size": index_bad_size,
    "index-orphan": index_orphan,
    "index-missing": index_missing,
    "segment-leftover": segment_leftover,
    "log-torn-tail": log_torn_tail,
    "log-crc": log_crc,
    "partition-metadata-malformed": partition_metadata_malformed,
    "leader-epoch-malformed": leader_epoch_malformed,
    "checkpoint-malformed": checkpoint_malformed,
    "stray-dir": stray_dir,
    "topic-id-mismatch": topic_id_mismatch,
}
KRAFT_INCIDENTS = ("kraft-stray-replica", "metadata-log-torn", "quorum-state-divergent", "metadata-snapshot-gap")
ZOOKEEPER_INCIDENTS = ("old-client-add-partitions",)
INCIDENTS = (
    "kill9-untrimmed-index",
    "old-client-add-partitions",
    "controller-failover",
    *FILE_INCIDENTS,
    *KRAFT_INCIDENTS,
)


def inject(state: LabState, incident: str, **options: Any) -> Injected:
    """Inject ``incident`` (the options as ``fleet-lab inject``'s); in a lab whose brokers run as a Kafka user, every
    file the lab wrote as root is the broker's own afterwards, as Kafka's are."""
    injected = _inject(state, incident, **options)
    own_as_kafka(state)
    return injected


def _inject(
    state: LabState,
    incident: str,
    *,
    broker: int | None = None,
    topic: str | None = None,
    partition: int | None = None,
    partitions: int | None = None,
    suffix: str = "delete",
    crc: bool = False,
    unknown_topic_id: bool = False,
) -> Injected:
    if incident in ZOOKEEPER_INCIDENTS and state.kraft:
        raise LabError(f"{incident} needs ZooKeeper; this lab runs KRaft")
    if incident == "kill9-untrimmed-index":
        return kill9_untrimmed_index(state, broker)
    if incident == "old-client-add-partitions":
        return old_client_add_partitions(state, topic, partitions)
    if incident == "controller-failover":
        return kraft_controller_failover(state) if state.kraft else controller_failover(state)
    if incident == "kraft-stray-replica":
        return kraft_stray_replica(state, broker, topic, partition, unknown_topic_id)
    if incident == "metadata-log-torn":
        return metadata_log_torn(state, broker, crc)
    if incident == "quorum-state-divergent":
        return quorum_state_divergent(state, broker)
    if incident == "metadata-snapshot-gap":
        return metadata_snapshot_gap(state, broker)
    if incident not in FILE_INCIDENTS:
        raise LabError(f"unknown incident {incident!r}; known: {', '.join(INCIDENTS)}")
    target = find_target(state, broker, topic, partition)
    if incident == "stray-dir":
        return stray_dir(state, target, suffix)
    return FILE_INCIDENTS[incident](state, target)


# --------------------------------------------------------------------------------------------
# scenarios: the seed reports, step by step
@dataclass
class Step:
    step: str
    ok: bool
    details: dict[str, Any] = field(default_factory=dict)


def _isr(zk: Any, topic: str, p: int) -> list[int]:
    return json.loads(zk.get(f"/brokers/topics/{topic}/partitions/{p}/state")[0])["isr"]


def scenario_seed_004(state: LabState, broker: int | None = None, topic: str = "seed-004") -> list[Step]:
    """seed-004 steps 1-8: topic created by an old client, partitions added by an old client, controller
    failover, broker restart -> the restarted broker stays out of ISR for the old partitions."""
    if not state.features.uses_topic_ids:
        raise LabError(f"seed-004 needs a lab at Kafka >= 2.8 (this one runs {state.kafka_version})")
    steps: list[Step] = []
    n = len(state.brokers)
    rf = min(3, n)
    ids = [b.id for b in state.brokers]
    zk = state.zk_client()
    try:
        # 1. a pre-2.8 client creates the topic: a version-1 znode without topic_id; the controller mints one
        assignment = {str(p): [ids[(p + k) % n] for k in range(rf)] for p in range(3)}
        zk.create(f"/config/topics/{topic}", json.dumps({"version": 1, "config": {}}).encode(), makepath=True)
        zk.create(f"/brokers/topics/{topic}", json.dumps({"version": 1, "partitions": assignment}).encode())
        _wait(lambda: json.loads(zk.get(f"/brokers/topics/{topic}")[0]).get("topic_id"), 20, "no topic ID minted")
        first_id = json.loads(zk.get(f"/brokers/topics/{topic}")[0])["topic_id"]
        _wait(
            lambda: all(
                partition_topic_ids(state).get((b, topic, p)) == first_id
                for p, rs in assignment.items()
                for b in rs
                for p in [int(p)]
            ),
            20,
            "replicas did not write partition.metadata",
        )
        steps.append(
            Step(
                "1 old client creates the topic; the controller mints its topic ID",
                True,
                {"topic_id": first_id, "assignment": assignment},
            )
        )
        steps.append(Step("2-3 produce and consume work (the lab writes no records while running)", True))
        # 4. the old client adds partitions: topic_id dropped from the znode
        inj = old_client_add_partitions(state, topic, 6)
        znode = json.loads(zk.get(f"/brokers/topics/{topic}")[0])
        steps.append(
            Step("4 old client adds partitions 3-5; the znode loses topic_id", "topic_id" not in znode, inj.details)
        )
        _wait(
            lambda: all(
                (b, topic, p) in partition_topic_ids(state)
                for p, rs in znode["partitions"].items()
                for b in rs
                for p in [int(p)]
            ),
            20,
            "new partitions were not created",
        )
        ids_now = partition_topic_ids(state)
        new_without_id = all(
            ids_now[(b, topic, int(p))] is None for p, rs in znode["partitions"].items() if int(p) >= 3 for b in rs
        )
        steps.append(Step("5 new partitions serve; their replicas have no partition.metadata yet", new_without_id))
        # 6. controller failover: a new random topic ID
        fo = controller_failover(state)
        second_id = json.loads(zk.get(f"/brokers/topics/{topic}")[0])["topic_id"]
        _wait(
            lambda: all(
                partition_topic_ids(state).get((b, topic, int(p))) == second_id
                for p, rs in znode["partitions"].items()
                if int(p) >= 3
                for b in rs
            ),
            20,
            "new partitions did not get the new topic ID",
        )
        ids_now = partition_topic_ids(state)
        old_keep = all(
            ids_now[(b, topic, int(p))] == first_id for p, rs in znode["partitions"].items() if int(p) < 3 for b in rs
        )
        steps.append(
            Step(
                "6 controller failover mints a new topic ID; new partitions take it, old keep the old one",
                second_id != first_id and old_keep,
                {**fo.details, "old_topic_id": first_id, "new_topic_id": second_id},
            )
        )
        all_in_isr = all(set(rs) <= set(_isr(zk, topic, int(p))) for p, rs in znode["partitions"].items())
        steps.append(Step("7 running brokers stay in ISR", all_in_isr))
        # 8. restart one broker
        victim = state.broker(broker if broker is not None else ids[0])
        for cmd in ("stop", "start"):
            r = run_service(victim, cmd)
            if r.returncode != 0:
                raise LabError(f"{cmd} of broker {victim.id} failed: {r.stdout}{r.stderr}")
        hosted = sorted(int(p) for p, rs in znode["partitions"].items() if victim.id in rs)
        expect_out = [p for p in hosted if p < 3]
        expect_in = [p for p in hosted if p >= 3]

        def settled() -> bool:
            return all(victim.id not in _isr(zk, topic, p) for p in expect_out) and all(
                victim.id in _isr(zk, topic, p) for p in expect_in
            )

        ok = True
        try:
            _wait(settled, 20, "ISR did not settle")
        except LabError:
            ok = False
        out_of_isr = [p for p in hosted if victim.id not in _isr(zk, topic, p)]
        log_lines = [
            ln
            for ln in (Path(victim.run_dir) / "server.log").read_text().splitlines()
            if "does not match the topic Id" in ln and topic in ln
        ]
        steps.append(
            Step(
                f"8 broker {victim.id} restarted: out of ISR for the partitions whose partition.metadata "
                "holds the old topic ID",
                ok and out_of_isr == expect_out and bool(log_lines),
                {
                    "broker_id": victim.id,
                    "out_of_isr": out_of_isr,
                    "expected_out_of_isr": expect_out,
                    "kafka_error": log_lines[-1] if log_lines else None,
                },
            )
        )
    finally:
        zk.stop()
        zk.close()
    return steps


def scenario_seed_000(state: LabState, broker: int | None = None) -> list[Step]:
    """seed-000: a 0.8 broker killed with kill -9 while it loads its logs after a clean stop keeps the
    clean-shutdown marker (0.8.2-2.7 delete it only after every log loaded) and the active segments'
    indexes it had already preallocated; at the next start recovery is skipped, the sanity check reads
    the 10 MiB zero tail as entries and the broker refuses to start: "Corrupt index found ... last offset
    is B and the base offset is B" (reference §1.4, §2.2)."""
    if state.features.index_sanity_at_load != "fatal":
        raise LabError(
            f"seed-000 needs a lab at Kafka 0.8.x (this one runs {state.kafka_version}): "
            "fleet-lab up --kafka-version 0.8.2.2"
        )
    b = state.broker(broker if broker is not None else state.brokers[0].id)
    steps: list[Step] = []
    r = run_service(b, "stop")
    steps.append(
        Step(
            f"1 broker {b.id} stopped cleanly (indexes trimmed, .kafka_cleanshutdown written)",
            r.returncode == 0 and all((Path(d) / CLEAN_SHUTDOWN_FILE).exists() for d in b.log_dirs),
        )
    )
    cfg = b.config()
    # the load stalls after two logs (a hung disk): the kill finds the same two loaded whatever the machine's load
    slow = BrokerConfig(**{**cfg.__dict__, "log_load_stall_after": 2})
    slow.save(b.config_path)
    log = Path(b.run_dir) / "server.log"
    mark = log.stat().st_size if log.exists() else 0
    starter = subprocess.Popen(
        [str(b.service_script), "start"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:

        def loaded() -> list[str]:
            with open(log, encoding="utf-8", errors="replace") as f:
                f.seek(mark)
                return [ln for ln in f if "Completed load of log" in ln]

        # kill it once two logs have loaded: their active indexes are preallocated, the marker is kept
        _wait(lambda: len(loaded()) >= 2, 60, "the broker did not load its logs")
        killed = run_service(b, "kill")
    finally:
        starter.communicate(timeout=60)
        cfg.save(b.config_path)
    loaded_logs = [ln.split("Completed load of log ")[1].split(" with")[0] for ln in loaded()]
    untrimmed = []
    for d in map(Path, b.log_dirs):
        for name in loaded_logs:
            pdir = d / name
            if pdir.is_dir():
                bases = segment_bases(pdir)
                idx = pdir / segment_file_name(bases[-1], "index")
                if idx.exists() and idx.stat().st_size >= cfg.segment_index_bytes - 8:
                    untrimmed.append(str(idx))
    markers = all((Path(d) / CLEAN_SHUTDOWN_FILE).exists() for d in b.log_dirs)
    steps.append(
        Step(
            f"2 kill -9 of broker {b.id} while it loads its logs: marker kept, preallocated indexes left",
            killed.returncode == 0 and markers and bool(untrimmed),
            {"loaded_before_kill": loaded_logs, "untrimmed_indexes": untrimmed, "clean_shutdown_marker_kept": markers},
        )
    )
    r = run_service(b, "start")
    fatal = [ln for ln in log.read_text().splitlines() if "Corrupt index found" in ln]
    steps.append(
        Step(
            f"3 broker {b.id} refuses to start: Corrupt index found",
            r.returncode != 0 and bool(fatal) and running_pid(b.config()) is None,
            {"exit_status": r.returncode, "kafka_error": fatal[-1] if fatal else None},
        )
    )
    return steps


SCENARIOS: dict[str, tuple[str, Callable[..., list[Step]]]] = {
    "seed-000": ("0.8.2.2", scenario_seed_000),
    "seed-004": ("2.8.2", scenario_seed_004),
}


def run_scenario(state: LabState, name: str, broker: int | None = None) -> list[Step]:
    if name not in SCENARIOS:
        raise LabError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}")
    if state.kraft:
        raise LabError(f"scenario {name} replays a ZooKeeper-mode seed report; this lab runs KRaft")
    wait_healthy(state, timeout=30)
    return SCENARIOS[name][1](state, broker=broker)
