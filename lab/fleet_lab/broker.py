"""The fleet lab's broker: a stand-in for the Kafka broker JVM, faithful wherever Fleet Doctor touches it.

It is controlled like a service (``kafka-service start|stop|status|kill`` over the broker's sshd) and
does, in this order, what a ZooKeeper-mode Kafka broker of the configured version does:

1. locks every log dir (``.lock``, a POSIX lock as FileChannel.tryLock takes it) and checks
   ``meta.properties``;
2. loads the logs (kafka-reference.md §2.1-§2.4, §1.4): deletes ``.deleted``/``.cleaned`` files,
   completes ``.swap`` files, deletes orphan indexes, rebuilds missing indexes, applies the version's
   index sanity check (0.8: a failure is fatal; 0.9-2.2: the segment is recovered; 2.3+: trusted),
   recovers the segments above the recovery point after an unclean shutdown, then preallocates the
   active segment's indexes to ``segment.index.bytes``. ``.kafka_cleanshutdown`` is deleted before
   loading (2.8+) or after all logs loaded (0.8.2-2.7). A missing ``leader-epoch-checkpoint`` is
   created empty (0.11+); entries come only from recovered segments (``LeaderEpochCache``);
3. registers ``/brokers/ids/<id>`` (ephemeral), competes for ``/controller`` and bumps
   ``/controller_epoch``; as controller it mints a random topic ID for every *new* topic znode without
   ``topic_id`` and for all of them when it takes over (never on a partition modification: KAFKA-14190),
   creates partition ``state`` znodes and moves leadership off dead brokers;
4. for every replica ZooKeeper assigns to it: creates the log if missing (its leader-epoch-checkpoint
   empty), as leader of a new leader epoch assigns (epoch, LEO) to the leader epoch cache (2.1+),
   writes ``partition.metadata`` where it has no topic ID yet, and on its first look after start treats
   a ``partition.metadata`` that differs from ZooKeeper as Kafka does (InconsistentTopicIdException: the
   replica stays out of ISR); otherwise it joins ISR;
5. on SIGTERM (a clean stop): trims the active indexes, writes the offset checkpoints and
   ``.kafka_cleanshutdown``, closes its ZooKeeper session. ``kill -9`` leaves the preallocated indexes
   and no marker, exactly as a crashed Kafka does.

It writes no records while running; the lab writes them before it starts (``fleet_lab.fleet``).

In KRaft mode (``BrokerConfig.kraft``: a combined broker and controller, Kafka 3.7) steps 3 and 4 are the node's
instead: it runs its quorum role (``fleet_lab.quorum``: the metadata log, elections, the active controller), waits for
its metadata log to catch up, skips ``__cluster_metadata-0`` when it loads the logs, renames stray replicas
``-stray`` with the image the product's decoder reads from its metadata log (LogManager.isStrayKraftReplica, 3.7.1),
creates the logs the image assigns to it, and at a clean stop asks for a controlled shutdown before it stops the
quorum role and closes the metadata log.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleet_doctor.probe import (
    CLEAN_SHUTDOWN_FILE,
    DEFAULT_SEGMENT_INDEX_BYTES,
    LEADER_EPOCH_CHECKPOINT,
    LOCK_FILE,
    META_PROPERTIES,
    OFFSET_INDEX_ENTRY,
    PARTITION_METADATA,
    TIME_INDEX_ENTRY,
    parse_leader_epoch_checkpoint,
    parse_meta_properties,
    parse_offset_checkpoint,
    parse_partition_dir_name,
    parse_partition_metadata,
    parse_segment_file_name,
    segment_file_name,
    walk_log,
)
from fleet_lab import python_path
from fleet_lab.kafka_files import (
    KafkaFeatures,
    RecoveryResult,
    batch_leader_epochs,
    create_checkpoint_file,
    encode_offset_checkpoint,
    preallocate_index,
    recover_segment,
    trim_index,
    write_atomic,
    write_clean_shutdown,
    write_leader_epoch_checkpoint,
    write_meta_properties,
    write_partition_metadata,
)
from fleet_lab.zk_server import pid_alive, process_mentions

METADATA_DIR = "__cluster_metadata-0"  # KRaft's metadata log (fleet_lab.kraft), loaded by the raft role, not here

LOG = logging.getLogger("kafka.server.KafkaServer")
LOG_MANAGER = logging.getLogger("kafka.log.LogManager")
LOG_LOADER = logging.getLogger("kafka.log.LogLoader")
STATE_CHANGE = logging.getLogger("state.change.logger")
PARTITION = logging.getLogger("kafka.cluster.Partition")
CONTROLLER = logging.getLogger("kafka.controller.KafkaController")
RECONCILE_MIN_INTERVAL_S = 0.05  # passes run when a watched znode changes, at most this often ...
# ... and at least this often. ZooKeeper mode: every pass re-arms a watch on each znode it read, and a new session (the
# one thing that drops them) wakes the loop too (_connect_zookeeper's listener), as KafkaZkClient's state change
# handlers do: the timed pass only covers a missed event. A pass reads every topic znode and the state znode of each
# partition (the controller: of all of them), and every 2 s that was most of an idle lab's CPU (a broker ~0.7 %,
# ZooKeeper ~2 % of one CPU, measured). KRaft mode: the quorum role's changes wake it (QuorumNode.on_change).
RECONCILE_SAFETY_S = {"zookeeper": 10.0, "kraft": 2.0}
KRAFT_CATCH_UP_S = 10.0  # KRaft: how long a starting broker waits for the metadata log to catch up with the leader's
KRAFT_SHUTDOWN_S = 15.0  # KRaft: how long a stopping broker waits for the controller to move its partitions
EXIT_FATAL = 1


# --------------------------------------------------------------------------------------------
# Configuration (broker.json, written by the lab)
@dataclass(frozen=True)
class BrokerConfig:
    broker_id: int
    zookeeper: str  # connect string with chroot
    log_dirs: list[str]
    kafka_version: str
    listener_port: int
    run_dir: str  # pid file, server.log, state
    cluster_id: str | None = None
    session_timeout_s: float = 4.0
    segment_index_bytes: int = DEFAULT_SEGMENT_INDEX_BYTES
    log_load_delay_ms: int = 0  # per partition: makes a big broker's slow log load reproducible
    # the load stalls (a disk that stopped answering) once this many logs have loaded, until the broker is killed:
    # a kill during the load that leaves exactly these logs loaded (0: no stall)
    log_load_stall_after: int = 0
    # ZooKeeper mode: how long the controlled shutdown of a clean stop takes (the controller moving the broker's
    # leaders away while it stays registered): makes a stop slower than a restart tool's stop gate reproducible
    controlled_shutdown_ms: int = 0
    # KRaft (combined broker and controller, no ZooKeeper): node_id, voters [{id, run_dir, metadata_log_dir}],
    # quorum_lock, directory_ids {log dir: directory.id}, segment_bytes, snapshot_bytes, session_timeout_ms
    kraft: dict[str, Any] | None = None
    rack: str | None = None  # broker.rack: in its registration (ZooKeeper's /brokers/ids/<id>, KRaft's RegisterBroker)
    # log recovery after an unclean stop, in bytes of segment per second (0: instant): a big broker's recovery as
    # Kafka's takes it, proportional to the bytes past the recovery point (kafka-reference.md §2.4)
    recovery_bytes_per_s: float = 0.0

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> BrokerConfig:
        with open(path, encoding="utf-8") as f:
            return cls(**json.load(f))

    def save(self, path: str | os.PathLike[str]) -> None:
        write_atomic(Path(path), json.dumps(self.__dict__, indent=2).encode("utf-8"))

    @property
    def pid_file(self) -> Path:
        return Path(self.run_dir) / "broker.pid"

    @property
    def log_file(self) -> Path:
        return Path(self.run_dir) / "server.log"

    @property
    def state_file(self) -> Path:
        return Path(self.run_dir) / "broker.state"


class StartupFatal(Exception):
    """What makes KafkaServer.startup fail: logged as FATAL, the process exits."""

    java_class = "java.lang.IllegalArgumentException"
    during_log_loading = True


class ForeignDirFatal(StartupFatal):
    """A directory in a log dir that is not a partition dir (Log.parseTopicPartitionName: KafkaException)."""

    java_class = "org.apache.kafka.common.KafkaException"


class SocketBindFatal(StartupFatal):
    """SocketServer could not bind its listener (Kafka: KafkaException, the broker shuts down)."""

    java_class = "org.apache.kafka.common.KafkaException"
    during_log_loading = False


class MetadataDirFatal(StartupFatal):
    """KRaft: the metadata log dir went offline (KIP-858: the node shuts down)."""

    java_class = "org.apache.kafka.common.errors.KafkaStorageException"
    during_log_loading = False


class LogDirOffline(Exception):
    """An IOException/KafkaStorageException that takes one log dir offline."""


# --------------------------------------------------------------------------------------------
# Logs
class LeaderEpochCache:
    """LeaderEpochFileCache of one partition over its ``leader-epoch-checkpoint`` (kafka-reference.md §4.2).

    When Kafka writes the file (K@2.8.2 C/log/Log.scala, C/server/epoch/LeaderEpochFileCache.scala; K@3.9
    S/epoch/LeaderEpochFileCache.java, UnifiedLog.maybeCreateLeaderEpochCache):

    - loading (or creating) a log with message format v2 constructs a LeaderEpochCheckpointFile, whose CheckpointFile
      constructor creates the file *empty* (0 bytes) if it is missing; the cache reads it and writes nothing;
    - ``assign`` (a new entry) flushes the whole cache: LogSegment.recover assigns the epoch of each recovered v2 batch
      above the latest one; Partition.makeLeader assigns (leader epoch, log end offset) from 2.1 (KAFKA-7415); a
      leader's and a follower's appends assign the epoch of their batches (the lab appends nothing while running);
    - truncations flush when they remove entries: at the end of every load the cache is cut to [log start, LEO)
      (``truncateFromEnd`` then ``truncateFromStart``, which re-inserts its first entry at the log start offset).

    So Kafka does not rebuild the file from the log at load, except for the segments it recovers: a log whose file was
    removed comes back with an empty file until the broker recovers a segment, becomes leader or appends."""

    def __init__(self, path: Path, features: KafkaFeatures, entries: list[tuple[int, int]]) -> None:
        self.path = path
        self.f = features
        self.entries = list(entries)  # as read: Kafka's constructor keeps them (2.4+ through assign, not flushed)

    def latest_epoch(self) -> int | None:
        return self.entries[-1][0] if self.entries else None

    def flush(self) -> None:
        write_leader_epoch_checkpoint(self.path.parent, self.entries)

    def assign(self, epoch: int, start_offset: int) -> bool:
        """LeaderEpochFileCache.assign: append (epoch, start offset) and flush if it is news; returns whether it was."""
        if not self.f.leader_epoch_assign_truncates_conflicts:
            # 0.11-2.0: only an epoch above the latest starting at or after the latest start offset is appended
            last = self.entries[-1] if self.entries else (-1, -1)
            if not (epoch >= 0 and epoch > last[0] and start_offset >= last[1]):
                return False
        else:
            if self.entries and not (epoch != self.entries[-1][0] or start_offset < self.entries[-1][1]):
                return False  # isUpdateNeeded
            removed = []  # maybeTruncateNonMonotonicEntries
            while self.entries and (self.entries[-1][0] >= epoch or self.entries[-1][1] >= start_offset):
                removed.insert(0, self.entries.pop())
            if len(removed) > 1 or (removed and removed[0][1] != start_offset):
                LOG_LOADER.warning(
                    "[LeaderEpochCache %s] New epoch entry EpochEntry(epoch=%d, startOffset=%d) caused truncation of "
                    "conflicting entries %s. Cache now contains %d entries.",
                    self.path.parent.name,
                    epoch,
                    start_offset,
                    removed,
                    len(self.entries),
                )
        self.entries.append((epoch, start_offset))
        self.flush()
        return True

    def truncate_from_end(self, end_offset: int) -> None:
        """Remove the entries starting at or after ``end_offset`` (flushed only if any was removed)."""
        kept = [e for e in self.entries if e[1] < end_offset]
        if end_offset >= 0 and len(kept) != len(self.entries):
            self.entries = kept
            self.flush()

    def truncate_from_start(self, start_offset: int) -> None:
        """Remove the entries starting at or before ``start_offset`` and put the last of them back at
        ``start_offset`` (flushed whenever one was removed, even if the content comes out the same)."""
        before = [e for e in self.entries if e[1] <= start_offset]
        if before:
            self.entries = [(before[-1][0], start_offset)] + [e for e in self.entries if e[1] > start_offset]
            self.flush()


@dataclass
class HostedLog:
    topic: str
    partition: int
    path: Path
    log_dir: Path
    topic_id: str | None
    log_start_offset: int
    log_end_offset: int
    active_base: int
    segments: int = 1
    active_entries: dict[str, int] = field(default_factory=dict)  # ext -> entries known in memory
    inconsistent_topic_id: bool = False
    looked_at: bool = False  # the first LeaderAndIsr after start has been processed
    epochs: LeaderEpochCache | None = None  # None: a message format without leader epochs (before 0.11)
    leader_epoch: int = -1  # Partition.leaderEpoch: the newest leader epoch this process acted on (-1 at start)


def _entry_at(path: Path, entry: Any, n: int) -> tuple[int, int]:
    """Entry number ``n`` of an index file, as the broker's mmap reads it."""
    with open(path, "rb") as f:
        f.seek(n * entry.size)
        return entry.unpack(f.read(entry.size))


def _index_sanity_error(path: Path, base: int, features: KafkaFeatures) -> str | None:
    """The message LogSegment.sanityCheck / OffsetIndex.sanityCheck throws, or None (§1.3)."""
    size = path.stat().st_size
    if size % OFFSET_INDEX_ENTRY.size:
        return f"Index file {path} is corrupt, found {size} bytes which is neither positive nor a multiple of 8."
    entries = size // OFFSET_INDEX_ENTRY.size
    if entries == 0:
        return None
    rel, _ = _entry_at(path, OFFSET_INDEX_ENTRY, entries - 1)
    last = base + rel
    if features.strict_index_last_offset and last <= base:
        if not features.at_least("0.10.1"):
            return (
                f"Corrupt index found, index file ({path}) has non-zero size but the last offset is {last} "
                f"and the base offset is {base}"
            )
        return (
            f"Corrupt index found, index file ({path}) has non-zero size but the last offset is {last} "
            f"which is no larger than the base offset {base}."
        )
    if not features.strict_index_last_offset and last < base:
        return (
            f"Corrupt index found, index file ({path}) has non-zero size but the last offset is {last} "
            f"which is less than the base offset {base}."
        )
    return None


def _time_index_sanity_error(path: Path, base: int) -> str | None:
    size = path.stat().st_size
    if size % TIME_INDEX_ENTRY.size:
        return f"Time index file {path} is corrupt, found {size} bytes which is neither positive nor a multiple of 12."
    entries = size // TIME_INDEX_ENTRY.size
    if entries == 0:
        return None
    first_ts, _ = _entry_at(path, TIME_INDEX_ENTRY, 0)
    last_ts, rel = _entry_at(path, TIME_INDEX_ENTRY, entries - 1)
    if last_ts < first_ts:
        return (
            f"Corrupt time index found, time index file ({path}) has non-zero size but the last timestamp is "
            f"{last_ts} which is less than the first timestamp {first_ts}"
        )
    if base + rel < base:
        return (
            f"Corrupt time index found, time index file ({path}) has non-zero size but the last offset is {base + rel}"
        )
    return None


class LogLoader:
    """Load one log dir as LogManager.loadLogs does for the configured version."""

    def __init__(self, cfg: BrokerConfig, features: KafkaFeatures) -> None:
        self.cfg = cfg
        self.f = features
        # Kafka's LogManager gauges (3.3+, KIP-831) as the broker state shows them: what is left to recover
        self.remaining_logs = 0
        self.remaining_segments = 0

    def to_recover(self, log_dirs: list[Path]) -> None:
        """Count, before loading, the logs and segments an unclean stop leaves to recover in ``log_dirs``: the
        segments from the one holding each log's recovery point (§2.4), and publish the broker's RECOVERY state."""
        for log_dir in log_dirs:
            if (log_dir / CLEAN_SHUTDOWN_FILE).exists():
                continue
            try:
                points = self._read_checkpoint(log_dir, "recovery-point-offset-checkpoint")
                entries = sorted(os.scandir(log_dir), key=lambda e: e.name)
            except (OSError, LogDirOffline):
                continue
            for entry in entries:
                parsed = parse_partition_dir_name(entry.name)
                if not parsed or parsed["dir_state"] != "live" or entry.name == METADATA_DIR or not entry.is_dir():
                    continue
                bases = _log_bases(Path(entry.path))
                point = points.get((parsed["topic"], parsed["partition"]), 0)
                start = max([b for b in bases if b <= point], default=bases[0] if bases else 0)
                self.remaining_logs += 1
                self.remaining_segments += sum(1 for b in bases if b >= start)
        if self.remaining_logs:
            self.publish(event=True)

    def publish(self, event: bool = False) -> None:
        _set_state(self.cfg, "recovering", f"{self.remaining_logs} {self.remaining_segments}", event=event)

    def _read_checkpoint(self, log_dir: Path, name: str) -> dict[tuple[str, int], int]:
        path = log_dir / name
        if not path.exists():
            return {}
        try:
            entries, _ = parse_offset_checkpoint(path.read_bytes(), str(path))
        except (OSError, ValueError) as e:
            raise LogDirOffline(f"Error while reading checkpoint file {path}: {e}") from e
        return {(t, p): o for t, p, o in entries}

    def load_dir(self, log_dir: Path) -> tuple[list[HostedLog], bool]:
        marker = log_dir / CLEAN_SHUTDOWN_FILE
        had_clean = marker.exists()
        if had_clean and self.f.deletes_clean_shutdown_marker_first:
            marker.unlink()
            LOG_MANAGER.info("Skipping recovery for all logs in %s since clean shutdown file was found", log_dir)
        recovery_points = self._read_checkpoint(log_dir, "recovery-point-offset-checkpoint")
        log_starts = (
            self._read_checkpoint(log_dir, "log-start-offset-checkpoint")
            if self.f.has_log_start_offset_checkpoint
            else {}
        )
        logs = []
        for entry in sorted(os.scandir(log_dir), key=lambda e: e.name):
            parsed = parse_partition_dir_name(entry.name)
            if parsed is None and entry.is_dir():  # e.g. lost+found, or anything left in the log dir by hand
                raise ForeignDirFatal(
                    f"Found directory {entry.path}, '{entry.name}' is not in the form of topic-partition or "
                    "topic-partition.uniqueId-delete (if marked for deletion).\nKafka's log directories (and "
                    "children) should only contain Kafka topic data."
                )
            if parsed is None or not entry.is_dir(follow_symlinks=False) or parsed["dir_state"] != "live":
                continue
            if self.cfg.kraft is not None and entry.name == METADATA_DIR:
                continue  # LogManager skips it: the raft manager owns the metadata log (fleet_lab.quorum)
            tp = (parsed["topic"], parsed["partition"])
            LOG_MANAGER.info("Loading log '%s'", entry.name)
            logs.append(
                self.load_log(
                    Path(entry.path), log_dir, tp, had_clean, recovery_points.get(tp, 0), log_starts.get(tp, 0)
                )
            )
            LOG_MANAGER.info("Completed load of log %s with %d segments", entry.name, logs[-1].segments)
            if not had_clean and self.remaining_logs:
                self.remaining_logs -= 1
                self.publish()
            if self.cfg.log_load_delay_ms:
                time.sleep(self.cfg.log_load_delay_ms / 1000.0)
            while self.cfg.log_load_stall_after and len(logs) >= self.cfg.log_load_stall_after:
                time.sleep(3600)  # until killed
        return logs, had_clean

    def _recovery_time(self, segment: Path) -> None:
        """A recovered segment costs its bytes at the lab's recovery rate (``recovery_bytes_per_s``)."""
        if self.remaining_segments:
            self.remaining_segments -= 1
        if self.cfg.recovery_bytes_per_s > 0:
            with contextlib.suppress(OSError):
                time.sleep(segment.stat().st_size / self.cfg.recovery_bytes_per_s)
        self.publish()

    def load_log(
        self, path: Path, log_dir: Path, tp: tuple[str, int], had_clean: bool, recovery_point: int, log_start: int
    ) -> HostedLog:
        f = self.f
        names = sorted(os.listdir(path))
        # §2.1 step 1-2: stray files of an interrupted deletion, cleaning or swap
        for name in names:
            parsed = parse_segment_file_name(name)
            if parsed and parsed[2] in ("deleted", "cleaned"):
                os.unlink(path / name)
        for name in names:
            parsed = parse_segment_file_name(name)
            if parsed and parsed[2] == "swap" and (path / name).exists():
                LOG_LOADER.info("Recovering file %s by renaming from %s files.", name[: -len(".swap")], "swap")
                os.replace(path / name, path / name[: -len(".swap")])
        names = sorted(os.listdir(path))
        bases = sorted({p[0] for n in names if (p := parse_segment_file_name(n)) and p[1] == "log" and not p[2]})
        # §2.1 step 3: orphan indexes
        for name in names:
            parsed = parse_segment_file_name(name)
            if parsed and parsed[1] in ("index", "timeindex") and not parsed[2] and parsed[0] not in bases:
                LOG_LOADER.warning("Found an orphaned index file %s, with no corresponding log file.", path / name)
                os.unlink(path / name)
        topic_id = None
        pm = path / PARTITION_METADATA
        if pm.exists():
            if not f.uses_topic_ids:
                pm.unlink()  # IBP < 2.8: keepPartitionMetadataFile = false (§4.1)
            else:
                try:
                    topic_id = parse_partition_metadata(pm.read_bytes(), str(pm))["topic_id"]
                except (OSError, ValueError) as e:
                    raise LogDirOffline(f"Error while reading partition metadata file {pm}: {e}") from e
        epochs = None
        if f.has_leader_epoch_checkpoint:
            # initializeLeaderEpochCache (2.x) / maybeCreateLeaderEpochCache (3.x), before the segments load: the
            # checkpoint file's constructor creates a missing file empty, then the cache reads it (LeaderEpochCache)
            lec = path / LEADER_EPOCH_CHECKPOINT
            create_checkpoint_file(lec)
            try:
                entries = parse_leader_epoch_checkpoint(lec.read_bytes(), str(lec))
            except (OSError, ValueError) as e:
                raise LogDirOffline(f"Error while reading checkpoint file {lec}: {e}") from e
            epochs = LeaderEpochCache(lec, f, [(e, o) for e, o in entries])

        def recover(base: int, with_epochs: bool) -> RecoveryResult:
            res = recover_segment(path, base, f)
            if with_epochs and epochs is not None:
                # LogSegment.recover: a v2 batch whose partition leader epoch is above the cache's latest is assigned
                lowest = 0 if f.recovery_assigns_leader_epoch_zero else 1
                for epoch, offset in batch_leader_epochs(path / segment_file_name(base, "log"), base):
                    latest = epochs.latest_epoch()
                    if epoch >= lowest and (latest is None or epoch > latest):
                        epochs.assign(epoch, offset)
            return res

        if not bases:
            (path / segment_file_name(0, "log")).touch()
            bases = [0]
        # §1.4: missing and corrupt indexes
        for base in bases:
            log_path = path / segment_file_name(base, "log")
            index = path / segment_file_name(base, "index")
            if not index.exists():
                LOG_LOADER.error(
                    "Could not find offset index file corresponding to log file %s, "
                    "recovering segment and rebuilding index files...",
                    log_path,
                )
                recover(base, f.index_rebuild_recovers_leader_epochs)
                continue
            if f.index_sanity_at_load == "rebuild":
                problem = _index_sanity_error(index, base, f)
                tindex = path / segment_file_name(base, "timeindex")
                if problem is None and f.has_time_index and tindex.exists():
                    problem = _time_index_sanity_error(tindex, base)
                if problem:
                    LOG_LOADER.warning(
                        "Found a corrupted index file corresponding to log file %s due to %s}, "
                        "recovering segment and rebuilding index files...",
                        log_path,
                        problem,
                    )
                    recover(base, False)  # 0.9-2.2: Log.recoverSegment(segment) without the epoch cache
            if f.has_time_index and not (path / segment_file_name(base, "timeindex")).exists():
                (path / segment_file_name(base, "timeindex")).touch()
        # §2.4: recovery after an unclean shutdown, from the segment holding the recovery point
        if not had_clean:
            start = max([b for b in bases if b <= recovery_point], default=bases[0])
            for i, base in enumerate(bases):
                if base < start:
                    continue
                LOG_LOADER.info("Recovering unflushed segment %d in log %s", base, path.name)
                res = recover(base, True)
                self._recovery_time(path / segment_file_name(base, "log"))
                if res.truncated_bytes:
                    LOG_LOADER.warning("Corruption found in segment %d, truncating to offset %s", base, res.next_offset)
                    for later in bases[i + 1 :]:
                        for ext in ("log", "index", "timeindex", "txnindex"):
                            with contextlib.suppress(FileNotFoundError):
                                os.unlink(path / segment_file_name(later, ext))
                    bases = bases[: i + 1]
                    break
        active = bases[-1]
        walked = walk_log(str(path / segment_file_name(active, "log")), active)
        leo = walked["next_offset"] if walked["next_offset"] is not None else active
        log = HostedLog(tp[0], tp[1], path, log_dir, topic_id, max(log_start, bases[0]), leo, active, len(bases))
        if epochs is not None:
            # the end of every load: the cache cut to [log start, LEO) (flushed only when an entry goes)
            epochs.truncate_from_end(leo)
            epochs.truncate_from_start(log.log_start_offset)
            log.epochs = epochs
        # the active segment is re-expanded (resizeIndexes(maxIndexSize)); the entries known in memory are
        # the whole length of the file as it was opened (§1.2)
        for ext, entry in (("index", OFFSET_INDEX_ENTRY), ("timeindex", TIME_INDEX_ENTRY)):
            if ext == "timeindex" and not f.has_time_index:
                continue
            p = path / segment_file_name(active, ext)
            log.active_entries[ext] = p.stat().st_size // entry.size if p.exists() else 0
            preallocate_index(p, entry, self.cfg.segment_index_bytes)
        if f.index_sanity_at_load == "fatal":
            # 0.8 Log.loadSegments: after recoverLog, every segment's offset index is sanity-checked and a
            # failure propagates out of LogManager: the broker does not start
            for base in bases:
                index = path / segment_file_name(base, "index")
                size = index.stat().st_size
                entries = log.active_entries["index"] if base == active else size // OFFSET_INDEX_ENTRY.size
                problem = _sanity_08(index, base, entries, size)
                if problem:
                    raise StartupFatal(f"requirement failed: {problem}")
        return log


def _log_bases(path: Path) -> list[int]:
    """The base offsets of the segments of a partition dir (their .log files)."""
    try:
        names = os.listdir(path)
    except OSError:
        return []
    return sorted({p[0] for n in names if (p := parse_segment_file_name(n)) and p[1] == "log" and not p[2]})


def _sanity_08(index: Path, base: int, entries: int, size: int) -> str | None:
    """OffsetIndex.sanityCheck @0.8.2.2 on the entries known in memory."""
    if entries:
        rel, _ = _entry_at(index, OFFSET_INDEX_ENTRY, entries - 1)
        if base + rel <= base:
            return (
                f"Corrupt index found, index file ({index}) has non-zero size but the last offset is {base + rel} "
                f"and the base offset is {base}"
            )
    if size % OFFSET_INDEX_ENTRY.size:
        return f"Index file {index.name} is corrupt, found {size} bytes which is not positive or not a multiple of 8."
    return None


# --------------------------------------------------------------------------------------------
# The broker process
class LabBroker:
    def __init__(self, cfg: BrokerConfig) -> None:
        self.cfg = cfg
        self.f = KafkaFeatures.of(cfg.kafka_version)
        self.logs: dict[tuple[str, int], HostedLog] = {}
        self.offline_dirs: set[Path] = set()
        self.stop_event = threading.Event()
        self.wake = threading.Event()
        self.zk: Any = None
        self.lock_fds: list[int] = []
        self.is_controller = False
        self.controller_epoch = 0
        self.controller_topics: dict[str, str | None] = {}
        self.listener: socket.socket | None = None
        self.reported_mismatch: dict[tuple[str, int], str] = {}
        self.broker_epoch = 0
        self.quorum: Any = None  # KRaft: the node's fleet_lab.quorum.QuorumNode
        self.kraft_image: Any = None  # KRaft: the metadata image last read from this node's metadata log
        self.kraft_image_offset = -1
        self.kraft_image_last: Any = None  # KRaft: the header of the last batch the image was read to (or passed)

    # ---- startup
    def startup(self) -> None:
        LOG.info("[KafkaServer id=%d] starting (lab broker, Kafka %s behaviour)", self.cfg.broker_id, self.f.version)
        self._lock_log_dirs()
        self._check_meta_properties()
        if self.cfg.kraft is not None:
            self._start_quorum()
        loader = LogLoader(self.cfg, self.f)
        loader.to_recover([Path(d) for d in self.cfg.log_dirs])
        markers_to_delete = []
        for d in map(Path, self.cfg.log_dirs):
            try:
                logs, had_clean = loader.load_dir(d)
            except LogDirOffline as e:
                if self.f.version < KafkaFeatures.of("1.0").version:
                    raise StartupFatal(str(e)) from e
                LOG_MANAGER.error("%s. Stopping serving logs in dir %s", e, d)
                self.offline_dirs.add(d)
                continue
            if had_clean and not self.f.deletes_clean_shutdown_marker_first:
                markers_to_delete.append(d / CLEAN_SHUTDOWN_FILE)
            for log in logs:
                self.logs[(log.topic, log.partition)] = log
        if self.offline_dirs and len(self.offline_dirs) == len(self.cfg.log_dirs):
            raise StartupFatal(f"Shutdown broker because all log dirs in {', '.join(self.cfg.log_dirs)} have failed")
        if self.quorum is not None and Path(self.cfg.log_dirs[0]) in self.offline_dirs:
            # KIP-858: a KRaft node whose metadata log dir fails shuts down
            raise MetadataDirFatal(f"Shutdown broker because the metadata log dir {self.cfg.log_dirs[0]} has failed")
        for m in markers_to_delete:  # 0.8.2-2.7: the marker goes only once every log of the dir loaded
            with contextlib.suppress(FileNotFoundError):
                m.unlink()
        if self.quorum is not None:
            self._read_kraft_image()
            self._rename_stray_logs()
        self.write_checkpoints()
        self._listen()
        if self.quorum is not None:
            self._kraft_pass()
            self.quorum.set_state("running")
        else:
            self._connect_zookeeper()
        LOG.info("[KafkaServer id=%d] started", self.cfg.broker_id)

    def _lock_log_dirs(self) -> None:
        for d in map(Path, self.cfg.log_dirs):
            d.mkdir(parents=True, exist_ok=True)
            fd = os.open(d / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                os.close(fd)
                raise StartupFatal(
                    f"Failed to acquire lock on file .lock in {d}. A Kafka instance in another process or thread "
                    "is using this directory."
                ) from e
            self.lock_fds.append(fd)

    def _check_meta_properties(self) -> None:
        seen: dict[str, Any] = {}
        for d in map(Path, self.cfg.log_dirs):
            p = d / META_PROPERTIES
            if not p.exists() and self.cfg.kraft is not None:
                raise StartupFatal(
                    f"No `meta.properties` found in {d} (have you run `kafka-storage.sh` to format the directory?)"
                )
            if not p.exists():
                if self.f.at_least("0.9"):
                    write_meta_properties(d, self.cfg.broker_id, self.cfg.cluster_id, self.f)
                continue
            try:
                meta = parse_meta_properties(p.read_bytes(), str(p))
            except (OSError, ValueError) as e:
                raise StartupFatal(f"Failed to read {p}: {e}") from e
            if meta["broker_id"] is not None and meta["broker_id"] != self.cfg.broker_id:
                raise StartupFatal(
                    f"Configured broker.id {self.cfg.broker_id} doesn't match stored broker.id "
                    f"Some({meta['broker_id']}) in meta.properties. If you moved your data, make sure your "
                    "configured broker.id matches. If you intend to create a new broker, you should remove all "
                    "data in your data directories (log.dirs)."
                )
            for k in ("broker_id", "cluster_id"):
                if meta[k] is not None and seen.setdefault(k, meta[k]) != meta[k]:
                    raise StartupFatal(f"Found inconsistent {k.replace('_', '.')} values in meta.properties files")

    def _listen(self) -> None:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", self.cfg.listener_port))
        except OSError as e:  # Kafka's SocketServer: fatal, the broker shuts down
            s.close()
            raise SocketBindFatal(
                f"Socket server failed to bind to 127.0.0.1:{self.cfg.listener_port}: {e.strerror}."
            ) from e
        s.listen(16)
        self.listener = s
        threading.Thread(target=self._accept_loop, daemon=True, name="listener").start()

    def _accept_loop(self) -> None:
        while self.listener is not None:
            try:
                conn, _ = self.listener.accept()
                conn.close()
            except OSError:
                return

    def _connect_zookeeper(self) -> None:
        from kazoo.client import KazooClient

        logging.getLogger("kazoo").setLevel(logging.WARNING)
        self.zk = KazooClient(hosts=self.cfg.zookeeper, timeout=self.cfg.session_timeout_s)
        # any change of the session's state wakes the loop: after an expiry the new session has no registration and
        # no watches, and the next pass makes both again (kazoo calls this on its own thread: it only sets an event)
        self.zk.add_listener(self._poke)
        try:
            self.zk.start(timeout=15)
        except Exception as e:  # kazoo raises its own timeout type
            raise StartupFatal(f"Timed out waiting for connection while in state: CONNECTING ({e})") from e
        self._register()

    def _register(self) -> None:
        from kazoo.exceptions import NodeExistsError

        path = f"/brokers/ids/{self.cfg.broker_id}"
        data = {
            "features": {},
            "listener_security_protocol_map": {"PLAINTEXT": "PLAINTEXT"},
            "endpoints": [f"PLAINTEXT://127.0.0.1:{self.cfg.listener_port}"],
            "jmx_port": -1,
            "port": self.cfg.listener_port,
            "host": "127.0.0.1",
            "version": 5 if self.f.at_least("2.7") else 4,
            "timestamp": str(int(time.time() * 1000)),
        }
        if self.cfg.rack is not None and self.f.at_least("0.10"):  # BrokerIdZNode v3+: broker.rack (KIP-36)
            data["rack"] = self.cfg.rack
        if not self.f.at_least("0.9"):  # 0.8's BrokerIdZNode: version 1, no endpoints
            data = {
                "jmx_port": -1,
                "timestamp": data["timestamp"],
                "host": "127.0.0.1",
                "version": 1,
                "port": self.cfg.listener_port,
            }
        deadline = time.monotonic() + self.cfg.session_timeout_s * 3 + 5
        while True:
            try:
                self.zk.create(path, json.dumps(data).encode(), ephemeral=True, makepath=True)
                break
            except NodeExistsError:
                # the znode of our previous (killed) session: Kafka retries until that session expires
                if time.monotonic() > deadline:
                    raise StartupFatal(
                        f"Error while creating ephemeral at {path}, node already exists and owner does not "
                        "match current session"
                    ) from None
                time.sleep(0.2)
        self.broker_epoch = self.zk.exists(path).czxid
        LOG.info(
            "Registered broker %d at path %s with addresses: PLAINTEXT://127.0.0.1:%d, czxid (broker epoch): %d",
            self.cfg.broker_id,
            path,
            self.cfg.listener_port,
            self.broker_epoch,
        )

    # ---- running
    def run(self) -> None:
        from kazoo.exceptions import KazooException

        safety_s = RECONCILE_SAFETY_S["kraft" if self.quorum is not None else "zookeeper"]
        while not self.stop_event.is_set():
            try:
                if self.quorum is not None:
                    self._kraft_pass()
                elif self.zk.connected:
                    if not self.zk.exists(f"/brokers/ids/{self.cfg.broker_id}", watch=self._poke):
                        self._register()  # a new session after expiry: register again
                    self._elect()
                    if self.is_controller:
                        self._controller_pass()
                        self._preferred_election(
                            {int(b) for b in self.zk.get_children("/brokers/ids", watch=self._poke)}
                        )
                    self._replica_pass()
            except (KazooException, OSError, ValueError) as e:
                LOG.warning("lab broker pass failed: %s", e)
            except StartupFatal as e:
                LOG.error("%s", e)
            self.stop_event.wait(RECONCILE_MIN_INTERVAL_S)
            # a ZooKeeper watch, a new session, a quorum change or a stop request wakes the next pass
            self.wake.wait(safety_s)
            self.wake.clear()

    def _poke(self, _event: Any = None) -> None:
        self.wake.set()

    def request_stop(self) -> None:
        self.stop_event.set()
        self.wake.set()

    def _elect(self) -> None:
        from kazoo.exceptions import NodeExistsError, NoNodeError

        try:
            data, _ = self.zk.get("/controller", watch=self._poke)
            self.is_controller_now(json.loads(data).get("brokerid") == self.cfg.broker_id)
            return
        except NoNodeError:
            pass
        payload = {"version": 1, "brokerid": self.cfg.broker_id, "timestamp": str(int(time.time() * 1000))}
        if self.f.at_least("3.4"):
            payload = {**payload, "version": 2, "kraftControllerEpoch": -1}
        try:
            self.zk.create("/controller", json.dumps(payload).encode(), ephemeral=True)
        except NodeExistsError:
            self.zk.exists("/controller", watch=self._poke)
            return
        try:
            raw, stat = self.zk.get("/controller_epoch")
            epoch = int(raw) + 1
            self.zk.set("/controller_epoch", str(epoch).encode(), version=stat.version)
        except NoNodeError:
            epoch = 1
            self.zk.create("/controller_epoch", b"1", makepath=True)
        self.controller_epoch = epoch
        CONTROLLER.info(
            "[Controller id=%d] %d successfully elected as the controller. Epoch incremented to %d",
            self.cfg.broker_id,
            self.cfg.broker_id,
            epoch,
        )
        self.controller_topics = {}
        self.is_controller_now(True)

    def is_controller_now(self, value: bool) -> None:
        if self.is_controller and not value:
            CONTROLLER.info("[Controller id=%d] Resigned", self.cfg.broker_id)
        self.is_controller = value

    def _topics(self) -> dict[str, tuple[dict[str, Any], Any]]:
        from kazoo.exceptions import NoNodeError

        out = {}
        for t in self.zk.get_children("/brokers/topics", watch=self._poke):
            try:
                raw, stat = self.zk.get(f"/brokers/topics/{t}", watch=self._poke)
                out[t] = (json.loads(raw), stat)
            except (NoNodeError, ValueError):
                continue
        return out

    def _controller_pass(self) -> None:
        from kazoo.exceptions import BadVersionError, NodeExistsError

        live = {int(b) for b in self.zk.get_children("/brokers/ids", watch=self._poke)}
        for topic, (znode, stat) in sorted(self._topics().items()):
            if topic not in self.controller_topics:
                # TopicChange (a new topic, or every topic when this controller took over): processTopicIds
                if self.f.uses_topic_ids and not znode.get("topic_id"):
                    from fleet_lab.kafka_files import random_topic_id

                    new = dict(znode, version=3, topic_id=random_topic_id())
                    new.setdefault("adding_replicas", {})
                    new.setdefault("removing_replicas", {})
                    try:
                        self.zk.set(f"/brokers/topics/{topic}", json.dumps(new).encode(), version=stat.version)
                    except BadVersionError:
                        continue
                    CONTROLLER.info(
                        "[Controller id=%d] Assigned topic ID %s to topic %s",
                        self.cfg.broker_id,
                        new["topic_id"],
                        topic,
                    )
                    znode = new
                self.controller_topics[topic] = znode.get("topic_id")
            for p, replicas in sorted(znode.get("partitions", {}).items(), key=lambda kv: int(kv[0])):
                path = f"/brokers/topics/{topic}/partitions/{p}/state"
                existing = self.zk.exists(path, watch=self._poke)
                if existing is None:
                    isr = [b for b in replicas if b in live]
                    state = {
                        "controller_epoch": self.controller_epoch,
                        "leader": isr[0] if isr else -1,
                        "version": 1,
                        "leader_epoch": 0,
                        "isr": isr or list(replicas[:1]),
                    }
                    with contextlib.suppress(NodeExistsError):
                        self.zk.create(path, json.dumps(state).encode(), makepath=True)
                    continue
                raw, st = self.zk.get(path, watch=self._poke)
                state = json.loads(raw)
                if not set(state["isr"]) <= live or state["leader"] not in live:
                    # about to act on a broker's absence: read the registrations again first (a broker may have come
                    # back since this pass began; Kafka's controller acts on broker changes in the order they came)
                    live = {int(b) for b in self.zk.get_children("/brokers/ids", watch=self._poke)}
                isr = [b for b in state["isr"] if b in live] or state["isr"]
                leader = state["leader"]
                if leader not in live:
                    candidates = [b for b in replicas if b in state["isr"] and b in live]
                    leader = candidates[0] if candidates else -1
                if leader == state["leader"] and isr == state["isr"]:
                    continue
                new_state = dict(state, leader=leader, isr=isr, controller_epoch=self.controller_epoch)
                if leader != state["leader"]:
                    new_state["leader_epoch"] = state["leader_epoch"] + 1
                with contextlib.suppress(BadVersionError):
                    self._change_state(topic, p, state, new_state, st.version)

    def _change_state(self, topic: str, p: Any, state: dict[str, Any], new: dict[str, Any], version: int) -> None:
        """The controller's write of a partition's state znode, version-checked (kazoo's BadVersionError when it
        changed meanwhile), logged as Kafka's state change logger does."""
        self.zk.set(f"/brokers/topics/{topic}/partitions/{p}/state", json.dumps(new).encode(), version=version)
        STATE_CHANGE.info(
            "[Controller id=%d epoch=%d] Changed partition %s-%s from %s to %s",
            self.cfg.broker_id,
            self.controller_epoch,
            topic,
            p,
            state,
            new,
        )

    def _preferred_election(self, live: set[int]) -> None:
        """KafkaController's PreferredReplicaElection (``/admin/preferred_replica_election``, written by the election
        tool): each listed partition led by its preferred replica (the first of its replicas) where that replica is
        alive and in ISR, a new leader epoch; then the znode is deleted, which tells the tool the election is over."""
        from kazoo.exceptions import BadVersionError, NoNodeError

        from fleet_lab.admin import PREFERRED_PATH

        try:
            raw, _ = self.zk.get(PREFERRED_PATH, watch=self._poke)
        except NoNodeError:
            self.zk.exists(PREFERRED_PATH, watch=self._poke)
            return
        try:
            wanted = [(p["topic"], int(p["partition"])) for p in json.loads(raw)["partitions"]]
        except (ValueError, KeyError, TypeError):
            wanted = []
        CONTROLLER.info(
            "[Controller id=%d] Starting replica leader election (PREFERRED) for partitions %s triggered by "
            "AdminClientTriggered",
            self.cfg.broker_id,
            ",".join(f"{t}-{p}" for t, p in wanted),
        )
        topics = self._topics()
        for topic, p in wanted:
            replicas = (topics.get(topic, ({}, None))[0].get("partitions") or {}).get(str(p)) or []
            for _attempt in range(5):  # a broker's ISR write may come between the read and the write: read again
                with contextlib.suppress(BadVersionError):
                    self._elect_preferred(topic, p, replicas, live)
                    break
        with contextlib.suppress(NoNodeError):
            self.zk.delete(PREFERRED_PATH)

    def _elect_preferred(self, topic: str, p: int, replicas: list[int], live: set[int]) -> None:
        """One partition of a preferred election: its first replica made leader (a new leader epoch) when it is
        alive and in ISR (kazoo's BadVersionError when the state changed since it was read)."""
        from kazoo.exceptions import NoNodeError

        from fleet_lab.admin import not_available

        try:
            raw_state, st = self.zk.get(f"/brokers/topics/{topic}/partitions/{p}/state")
        except NoNodeError:
            return
        state = json.loads(raw_state)
        preferred = replicas[0] if replicas else None
        if preferred is None or state["leader"] == preferred:
            return
        if preferred not in live or preferred not in state["isr"]:
            CONTROLLER.error(
                "[Controller id=%d] Error completing replica leader election (PREFERRED) for partition %s-%d: %s",
                self.cfg.broker_id,
                topic,
                p,
                not_available(f"{topic}-{p}"),
            )
            return
        new = dict(
            state, leader=preferred, leader_epoch=state["leader_epoch"] + 1, controller_epoch=self.controller_epoch
        )
        self._change_state(topic, p, state, new, st.version)

    def _pick_log_dir(self) -> Path | None:
        online = [Path(d) for d in self.cfg.log_dirs if Path(d) not in self.offline_dirs]
        if not online:
            return None
        counts = {d: sum(1 for lg in self.logs.values() if lg.log_dir == d) for d in online}
        return min(online, key=lambda d: (counts[d], str(d)))

    def _create_log(self, topic: str, partition: int) -> HostedLog | None:
        log_dir = self._pick_log_dir()
        if log_dir is None:
            return None
        path = log_dir / f"{topic}-{partition}"
        path.mkdir(exist_ok=True)
        (path / segment_file_name(0, "log")).touch()
        log = HostedLog(topic, partition, path, log_dir, None, 0, 0, 0)
        for ext, entry in (("index", OFFSET_INDEX_ENTRY), ("timeindex", TIME_INDEX_ENTRY)):
            if ext == "timeindex" and not self.f.has_time_index:
                continue
            log.active_entries[ext] = 0
            preallocate_index(path / segment_file_name(0, ext), entry, self.cfg.segment_index_bytes)
        if self.f.has_leader_epoch_checkpoint:
            # a new log's LeaderEpochCheckpointFile: created empty; the leader's makeLeader then assigns (epoch, 0)
            create_checkpoint_file(path / LEADER_EPOCH_CHECKPOINT)
            log.epochs = LeaderEpochCache(path / LEADER_EPOCH_CHECKPOINT, self.f, [])
        LOG_MANAGER.info("Created log for partition %s-%d in %s", topic, partition, path)
        self.logs[(topic, partition)] = log
        return log

    def _replica_pass(self) -> None:
        from kazoo.exceptions import BadVersionError, NoNodeError

        me = self.cfg.broker_id
        for topic, (znode, _stat) in self._topics().items():
            zk_id = znode.get("topic_id") if self.f.uses_topic_ids else None
            for p, replicas in znode.get("partitions", {}).items():
                if me not in replicas:
                    continue
                tp = (topic, int(p))
                log = self.logs.get(tp)
                if log is None:
                    log = self._create_log(topic, int(p))
                    if log is None:
                        continue
                if zk_id:
                    if log.topic_id is None:
                        log.topic_id = zk_id  # assignTopicId: "flush-metadata-file"
                        write_partition_metadata(log.path, zk_id)
                    elif log.topic_id != zk_id and self.reported_mismatch.get(tp) != zk_id:
                        self.reported_mismatch[tp] = zk_id
                        if not log.looked_at:
                            log.inconsistent_topic_id = True
                            STATE_CHANGE.error(
                                "[Broker id=%d] Topic Id in memory: %s does not match the topic Id for partition "
                                "%s-%s provided in the request: %s.",
                                me,
                                log.topic_id,
                                topic,
                                p,
                                zk_id,
                            )
                            LOG_MANAGER.error(
                                "kafka.common.InconsistentTopicIdException: Tried to assign topic ID %s to log for "
                                "topic partition %s-%s,but log already contained topic ID %s",
                                zk_id,
                                topic,
                                p,
                                log.topic_id,
                            )
                        else:
                            STATE_CHANGE.error(
                                "[Broker id=%d] Topic ID in memory: %s does not match the topic ID for partition "
                                "%s-%s received: %s.",
                                me,
                                log.topic_id,
                                topic,
                                p,
                                zk_id,
                            )
                log.looked_at = True
                path = f"/brokers/topics/{topic}/partitions/{p}/state"
                try:
                    raw, st = self.zk.get(path, watch=self._poke)
                except NoNodeError:
                    self.zk.exists(path, watch=self._poke)
                    continue
                state = json.loads(raw)
                offline = log.inconsistent_topic_id or log.log_dir in self.offline_dirs
                if not offline and state["leader_epoch"] > log.leader_epoch:
                    # a LeaderAndIsr with a newer leader epoch (after a start, any: the partition's epoch is -1);
                    # a partition skipped for its topic ID or an offline dir takes no leader or follower role
                    self._become_leader_or_follower(log, state)
                new_isr = None
                if offline and me in state["isr"] and len(state["isr"]) > 1:
                    new_isr = [b for b in state["isr"] if b != me]
                elif not offline and me not in state["isr"] and state["leader"] != -1:
                    new_isr = [*state["isr"], me]
                if new_isr is not None:
                    with contextlib.suppress(BadVersionError):
                        self.zk.set(path, json.dumps(dict(state, isr=new_isr)).encode(), version=st.version)
                        STATE_CHANGE.info("[Partition %s-%s broker=%d] ISR updated to %s", topic, p, me, new_isr)

    def _become_leader_or_follower(self, log: HostedLog, state: dict[str, Any]) -> None:
        """Partition.makeLeader / makeFollower for a newer leader epoch. From 2.1 (KAFKA-7415) makeLeader assigns
        (leader epoch, log end offset) to the epoch cache, which flushes leader-epoch-checkpoint; makeFollower writes
        nothing (a follower's file changes only when it truncates or appends fetched batches, which the lab's
        brokers do not: they replicate nothing)."""
        previous, log.leader_epoch = log.leader_epoch, state["leader_epoch"]
        if state["leader"] != self.cfg.broker_id:
            return
        PARTITION.info(
            "[Partition %s-%d broker=%d] %s-%d starts at leader epoch %d from offset %d. Previous leader epoch was %d.",
            log.topic,
            log.partition,
            self.cfg.broker_id,
            log.topic,
            log.partition,
            log.leader_epoch,
            log.log_end_offset,
            previous,
        )
        if log.epochs is not None and self.f.becoming_leader_assigns_leader_epoch:
            log.epochs.assign(log.leader_epoch, log.log_end_offset)

    # ---- KRaft (combined mode): the broker role over the metadata log (fleet_lab.quorum runs the raft role)
    def _start_quorum(self) -> None:
        """KafkaRaftServer: the raft manager loads the metadata log and joins the quorum; the broker registers and
        waits until its metadata log has caught up with the leader's before LogManager loads the logs (bounded: with
        no quorum the lab broker goes on with the metadata it has)."""
        from fleet_lab.quorum import QuorumNode

        node = QuorumNode(self.cfg.kraft or {}, self.f, Path(self.cfg.run_dir), self.cfg.listener_port)
        node.rack = self.cfg.rack
        if not node.take_liveness():
            raise StartupFatal(f"Another process of node {self.cfg.broker_id} holds {self.cfg.run_dir}/kraft.lock")
        self.quorum = node
        node.on_change = self._poke
        node.open_log()
        node.start()
        deadline = time.monotonic() + KRAFT_CATCH_UP_S
        while not node.caught_up() and time.monotonic() < deadline:
            time.sleep(0.02)
        if not node.caught_up():
            LOG.warning(
                "[BrokerServer id=%d] No quorum leader within %.0f s: loading the logs with the metadata on disk",
                self.cfg.broker_id,
                KRAFT_CATCH_UP_S,
            )

    def _read_kraft_image(self) -> Any:
        """The image of this node's metadata log, read by the product's decoder (what BrokerMetadataPublisher
        holds); re-read only when the log grew by more than the active controller's NoOpRecords (which an idle
        controller writes every ``metadata.max.idle.interval.ms``, 500 ms: re-reading the whole log for
        each cost an idle lab broker about a quarter of its CPU)."""
        from fleet_lab.kraft import read_image

        mdir = self.quorum.mdir
        try:
            if self.kraft_image is not None and self.kraft_image_last is not None:
                # the batch read last still in place (not truncated away, even if the log grew back to the same end),
                # nothing but NoOpRecords after it
                stands = self.quorum.passed_no_ops(self.kraft_image_last)
                if stands is not None:
                    self.kraft_image_offset, self.kraft_image_last = stands
                    return self.kraft_image
            end, last = self.quorum.log_end()  # before the read: a log changed meanwhile is read again next time
            if self.kraft_image is not None and self.kraft_image_last is None and end == self.kraft_image_offset:
                return self.kraft_image  # a log with no batch to hold on to (empty, or a snapshot's end): by its end
            _head, image = read_image(mdir)
        except Exception as e:  # the dir unreadable right now: keep the image we have
            if self.kraft_image is None:
                raise StartupFatal(f"Cannot read the metadata log {mdir}: {e}") from e
            LOG.warning("[BrokerServer id=%d] metadata log not readable: %s", self.cfg.broker_id, e)
            return self.kraft_image
        self.kraft_image, self.kraft_image_offset, self.kraft_image_last = image, end, last
        return self.kraft_image

    def _rename_stray_logs(self) -> None:
        """LogManager.loadLogs with isStrayKraftReplica (3.7.1+; 3.7.0's deleteStrayKRaftReplicas renames the same
        way): a log with no topic ID, a topic ID the image does not hold, or a partition whose replicas exclude this
        broker is renamed <topic>-<partition>.<uuid>-stray and kept (kafka-reference.md §2.1 item 6, kraft-ref §7)."""
        image = self.kraft_image
        me = self.cfg.broker_id
        for tp, log in sorted(self.logs.items()):
            topic = image.topics.get(log.topic_id) if log.topic_id else None
            reg = topic["partitions"].get(log.partition) if topic else None
            if reg is not None and me in reg["Replicas"]:
                continue
            dst = log.path.with_name(f"{log.topic}-{log.partition}.{uuid.uuid4().hex}-stray")
            os.rename(log.path, dst)
            del self.logs[tp]
            LOG_MANAGER.warning(
                "Found stray log dir %s: %s. Renamed it to %s",
                log.path,
                "it has no topic ID"
                if not log.topic_id
                else f"topic ID {log.topic_id} is not in the metadata image"
                if topic is None
                else f"the replicas of {log.topic}-{log.partition} do not include broker {me}",
                dst.name,
            )

    def _kraft_pass(self) -> None:
        """ReplicaManager.applyDelta for this broker: a log for every replica the image assigns to it (its
        partition.metadata from the TopicRecord), leader epochs as it becomes leader, and the partitions it cannot
        serve (an inconsistent topic ID, an offline log dir) reported to the controller."""
        image = self._read_kraft_image()
        me = self.cfg.broker_id
        mine = image.brokers.get(me)
        if mine is not None and mine["IncarnationId"] == self.quorum.incarnation_id:
            self.broker_epoch = mine["BrokerEpoch"]
        offline = []
        for tid, topic in sorted(image.topics.items(), key=lambda kv: kv[1]["name"]):
            for p, reg in sorted(topic["partitions"].items()):
                if me not in reg["Replicas"]:
                    continue
                tp = (topic["name"], p)
                log = self.logs.get(tp)
                if log is None and tp in self._offline_replicas():
                    offline.append(tp)  # its log dir is offline: served by nobody here, not re-created elsewhere
                    continue
                if log is None:
                    log = self._create_log(topic["name"], p)
                    if log is None:
                        offline.append(tp)
                        continue
                if log.topic_id is None:
                    log.topic_id = tid
                    write_partition_metadata(log.path, tid)
                elif log.topic_id != tid and self.reported_mismatch.get(tp) != tid:
                    self.reported_mismatch[tp] = tid
                    log.inconsistent_topic_id = True
                    STATE_CHANGE.error(
                        "[Broker id=%d] Topic Id in memory: %s does not match the topic Id for partition %s-%d "
                        "provided in the request: %s.",
                        me,
                        log.topic_id,
                        topic["name"],
                        p,
                        tid,
                    )
                if log.inconsistent_topic_id or log.log_dir in self.offline_dirs:
                    offline.append(tp)
                    continue
                if reg["LeaderEpoch"] > log.leader_epoch:
                    self._become_leader_or_follower(log, {"leader": reg["Leader"], "leader_epoch": reg["LeaderEpoch"]})
        self.quorum.set_offline(offline)

    def _offline_replicas(self) -> set[tuple[str, int]]:
        """(topic, partition) of the partition dirs in this broker's offline log dirs."""
        out = set()
        for d in self.offline_dirs:
            with contextlib.suppress(OSError):
                for name in os.listdir(d):
                    parsed = parse_partition_dir_name(name)
                    if parsed and parsed["dir_state"] == "live":
                        out.add((parsed["topic"], parsed["partition"]))
        return out

    def _kraft_controlled_shutdown(self) -> None:
        """BrokerLifecycleManager's controlled shutdown: the broker asks for it and waits until the controller has
        moved its leaderships and ISR memberships (its own metadata log shows InControlledShutdown), unless there is
        no quorum to ask; then the raft role stops and the metadata log is closed cleanly."""
        from fleet_lab.kraft import read_image

        node = self.quorum
        node.set_state("shutting-down")
        deadline = time.monotonic() + KRAFT_SHUTDOWN_S
        while time.monotonic() < deadline and node.has_quorum():
            try:
                _head, image = read_image(node.mdir)
            except Exception:  # a batch being appended: look again
                time.sleep(0.02)
                continue
            reg = image.brokers.get(self.cfg.broker_id)
            if reg is None or reg["IncarnationId"] != node.incarnation_id:
                break  # not registered in this incarnation: nothing to move
            if (reg["Fenced"] or reg["InControlledShutdown"]) and node.committed(node.end_offset()):
                break  # the controller's records are committed: a new leader will have them
            time.sleep(0.02)
        node.stop()

    # ---- shutdown
    def write_checkpoints(self) -> None:
        for d in map(Path, self.cfg.log_dirs):
            if d in self.offline_dirs:
                continue
            logs = sorted((lg for lg in self.logs.values() if lg.log_dir == d), key=lambda lg: (lg.topic, lg.partition))
            end = [(lg.topic, lg.partition, lg.log_end_offset) for lg in logs]
            write_atomic(d / "recovery-point-offset-checkpoint", encode_offset_checkpoint(end))
            write_atomic(d / "replication-offset-checkpoint", encode_offset_checkpoint(end))
            if self.f.has_log_start_offset_checkpoint:
                starts = [(lg.topic, lg.partition, lg.log_start_offset) for lg in logs if lg.log_start_offset > 0]
                write_atomic(d / "log-start-offset-checkpoint", encode_offset_checkpoint(starts))

    def shutdown(self) -> None:
        LOG.info("[KafkaServer id=%d] shutting down", self.cfg.broker_id)
        _set_state(self.cfg, "shutting-down", event=False)
        if self.quorum is not None:
            self._kraft_controlled_shutdown()
        if self.zk is not None and self.cfg.controlled_shutdown_ms:
            LOG.info(
                "[KafkaServer id=%d] Starting controlled shutdown (the controller moves leadership away: %d ms)",
                self.cfg.broker_id,
                self.cfg.controlled_shutdown_ms,
            )
            time.sleep(self.cfg.controlled_shutdown_ms / 1000.0)
        if self.zk is not None:
            with contextlib.suppress(Exception):
                self.zk.stop()
                self.zk.close()
        if self.listener is not None:
            listener, self.listener = self.listener, None
            listener.close()
        for log in self.logs.values():
            if log.log_dir in self.offline_dirs:
                continue
            for ext, entry in (("index", OFFSET_INDEX_ENTRY), ("timeindex", TIME_INDEX_ENTRY)):
                if ext in log.active_entries:
                    p = log.path / segment_file_name(log.active_base, ext)
                    with contextlib.suppress(FileNotFoundError):
                        trim_index(p, log.active_entries[ext], entry)
        self.write_checkpoints()
        for d in map(Path, self.cfg.log_dirs):
            if d not in self.offline_dirs:
                write_clean_shutdown(d, self.f, self.broker_epoch)
        for fd in self.lock_fds:
            os.close(fd)
        if self.quorum is not None:
            self.quorum.release()
        LOG.info("[KafkaServer id=%d] shut down completed", self.cfg.broker_id)


# --------------------------------------------------------------------------------------------
# Process entry points: run (foreground daemon) and the service control commands
def _setup_logging(cfg: BrokerConfig) -> None:
    handler = logging.FileHandler(cfg.log_file, encoding="utf-8")
    handler.setFormatter(logging.Formatter("[%(asctime)s] %(levelname)s %(message)s (%(name)s)"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    logging.addLevelName(logging.CRITICAL, "FATAL")
    logging.addLevelName(logging.WARNING, "WARN")


def _set_state(cfg: BrokerConfig, state: str, detail: str = "", event: bool = True) -> None:
    """``<state> <pid> [detail]`` in the broker's state file (the recovery's remaining logs and segments)."""
    write_atomic(cfg.state_file, f"{state} {os.getpid()} {detail}".rstrip().encode() + b"\n")
    if event:
        record_event(cfg, state)


def record_event(cfg: BrokerConfig, event: str, pid: int | None = None) -> None:
    """The lab's own record of what happened to the broker process (starting, running, failed, stopped,
    stop/kill requests): one JSON line per event in <run_dir>/events.jsonl, with wall-clock times, so tests
    can check restart order without trusting the product that did the restarts."""
    line = json.dumps({"ts": time.time(), "broker_id": cfg.broker_id, "event": event, "pid": pid or os.getpid()})
    with open(Path(cfg.run_dir) / "events.jsonl", "a", encoding="utf-8") as f:
        f.write(line + "\n")


def run(cfg: BrokerConfig) -> int:
    _setup_logging(cfg)
    Path(cfg.run_dir).mkdir(parents=True, exist_ok=True)
    write_atomic(cfg.pid_file, f"{os.getpid()}\n".encode())
    _set_state(cfg, "starting")
    broker = LabBroker(cfg)
    signal.signal(signal.SIGTERM, lambda *_: broker.request_stop())
    signal.signal(signal.SIGINT, lambda *_: broker.request_stop())
    try:
        broker.startup()
    except Exception as e:
        if isinstance(e, StartupFatal) and e.during_log_loading:
            logging.getLogger("kafka.log.LogManager").error(
                "There was an error in one of the threads during logs loading: %s: %s",
                e.java_class,
                e,
            )
        elif not isinstance(e, StartupFatal):  # a lab defect, not a Kafka behaviour: keep the traceback
            LOG.exception("unexpected error during startup")
        who = (
            f"[Kafka Server {cfg.broker_id}],"
            if broker.f.version < KafkaFeatures.of("0.9").version
            else (f"[KafkaServer id={cfg.broker_id}]")
        )
        LOG.critical("%s Fatal error during KafkaServer startup. Prepare to shutdown", who)
        LOG.critical("%s: %s", getattr(e, "java_class", type(e).__name__), e)
        _set_state(cfg, "failed")
        with contextlib.suppress(Exception):
            if broker.zk is not None:
                broker.zk.stop()
        with contextlib.suppress(Exception):
            if broker.quorum is not None:
                broker.quorum.stop()
                broker.quorum.release()
        return EXIT_FATAL
    _set_state(cfg, "running")
    broker.run()
    broker.shutdown()
    _set_state(cfg, "stopped")
    cfg.pid_file.unlink(missing_ok=True)
    return 0


def running_pid(cfg: BrokerConfig) -> int | None:
    """The PID of this broker's daemon if it runs (the PID file is checked against /proc: no PID reuse)."""
    try:
        pid = int(cfg.pid_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return pid if process_mentions(pid, f"{cfg_path_of(cfg)}\0run") else None  # argv: --config PATH run


def cfg_path_of(cfg: BrokerConfig) -> Path:
    return Path(cfg.run_dir) / "broker.json"


def start(cfg: BrokerConfig, timeout: float = 60.0) -> int:
    pid = running_pid(cfg)
    if pid:
        print(f"kafka (broker {cfg.broker_id}) is already running, pid {pid}")
        return 0
    Path(cfg.run_dir).mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.environ.get("PYTHONPATH") or python_path())  # as the service script set it
    with open(Path(cfg.run_dir) / "broker.out", "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fleet_lab.broker", "--config", str(cfg_path_of(cfg)), "run"],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # detached from the ssh session that started it
            close_fds=True,
            env=env,
        )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = cfg.state_file.read_text().split() if cfg.state_file.exists() else []
        if state and int(state[1]) == proc.pid and state[0] == "running":
            print(f"kafka (broker {cfg.broker_id}) started, pid {proc.pid}")
            return 0
        if state and int(state[1]) == proc.pid and state[0] == "recovering" and cfg.recovery_bytes_per_s > 0:
            # a recovery that takes its time (the lab's recovery rate): the service is started, as systemctl start
            # returns while Kafka recovers its logs; the broker registers once they are loaded
            print(f"kafka (broker {cfg.broker_id}) started, pid {proc.pid}: recovering its logs")
            return 0
        if proc.poll() is not None:
            fatal = [ln for ln in _tail(cfg.log_file, 40) if " FATAL " in ln or " ERROR " in ln]
            print(f"kafka (broker {cfg.broker_id}) failed to start (exit {proc.returncode})", file=sys.stderr)
            for line in fatal[-4:] or _tail(Path(cfg.run_dir) / "broker.out", 10):
                print(line, file=sys.stderr)
            return 1
        time.sleep(0.05)
    print(f"kafka (broker {cfg.broker_id}) did not start within {timeout:.0f} s", file=sys.stderr)
    return 1


def _tail(path: Path, n: int) -> list[str]:
    try:
        return path.read_text(encoding="utf-8", errors="replace").splitlines()[-n:]
    except OSError:
        return []


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.05)
    return False


def stop(cfg: BrokerConfig, timeout: float = 60.0) -> int:
    pid = running_pid(cfg)
    if not pid:
        print(f"kafka (broker {cfg.broker_id}) is not running")
        return 0
    record_event(cfg, "stop-requested", pid)
    os.kill(pid, signal.SIGTERM)
    if _wait_gone(pid, timeout):
        print(f"kafka (broker {cfg.broker_id}) stopped")
        return 0
    print(f"kafka (broker {cfg.broker_id}) did not stop within {timeout:.0f} s", file=sys.stderr)
    return 1


def kill(cfg: BrokerConfig) -> int:
    pid = running_pid(cfg)
    if not pid:
        print(f"kafka (broker {cfg.broker_id}) is not running")
        return 0
    record_event(cfg, "kill-requested", pid)
    os.kill(pid, signal.SIGKILL)
    _wait_gone(pid, 10)
    print(f"kafka (broker {cfg.broker_id}) killed (SIGKILL), pid {pid}")
    return 0


def status(cfg: BrokerConfig) -> int:
    pid = running_pid(cfg)
    if pid:
        print(f"kafka (broker {cfg.broker_id}): active (running), pid {pid}")
        return 0
    state = cfg.state_file.read_text().split()[0] if cfg.state_file.exists() else "inactive"
    print(f"kafka (broker {cfg.broker_id}): inactive ({'failed' if state == 'failed' else 'dead'})")
    return 3  # systemctl status: 3 = not running


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="kafka-service", description="control a fleet lab broker like a service")
    p.add_argument("--config", required=True, help="the broker's broker.json")
    p.add_argument("command", choices=["start", "stop", "status", "kill", "run", "state", "leader-election"])
    p.add_argument("--timeout", type=float, default=60.0)
    args, rest = p.parse_known_args(argv)
    cfg = BrokerConfig.load(args.config)
    if args.command == "leader-election":  # kafka-leader-election.sh's options follow (fleet_lab.admin)
        from fleet_lab.admin import leader_election

        return leader_election(cfg, rest)
    if rest:
        p.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.command == "state":
        from fleet_lab.admin import broker_state

        return broker_state(cfg, running_pid(cfg) is not None)
    if args.command == "run":
        return run(cfg)
    if args.command == "start":
        return start(cfg, args.timeout)
    if args.command == "stop":
        return stop(cfg, args.timeout)
    if args.command == "kill":
        return kill(cfg)
    return status(cfg)


if __name__ == "__main__":
    sys.exit(main())
