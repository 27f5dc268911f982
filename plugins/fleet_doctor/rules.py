"""The rule registry: every detection rule, defined once.

Rule ids are a public interface (reports, the repair planner, alerts and outside checks match on
them): never rename one. The detection app, the docs (docs/rules.md is generated from here), the
report and the repair planner all read this registry. Version boundaries and wording follow
../shared/docs/kafka-reference.md (cited per rule as "ref §n").
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum
from functools import total_ordering


@total_ordering
class Severity(Enum):
    """Finding severities, least severe first: the one definition of their order (reports, summaries and the
    detection app's sort read ``SEVERITY_ORDER``)."""

    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"

    @property
    def rank(self) -> int:
        return list(Severity).index(self)

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Severity):
            return NotImplemented
        return self.rank < other.rank


SEVERITY_ORDER: tuple[str, ...] = tuple(s.value for s in reversed(Severity))  # worst first: critical, warning, info


def severity_rank(value: str) -> int:
    """0 for the worst severity, then 1, 2; an unknown value sorts after all of them."""
    return SEVERITY_ORDER.index(value) if value in SEVERITY_ORDER else len(SEVERITY_ORDER)


class Remediation(Enum):
    """What a repair plan does for a finding of the rule (fleet_doctor.repair.plan acts on exactly these;
    ../shared/docs/RULES.md, "Remediation each rule maps to")."""

    QUARANTINE_INDEX = "quarantine-index"  # move index files aside while stopped; Kafka rebuilds them
    REMOVE_TOPIC_ID_FILES = "remove-topic-id-files"  # back up + remove partition.metadata, leader-epoch-checkpoint
    RESTORE_ZK_TOPIC_ID = "restore-zk-topic-id"  # guarded ZooKeeper write of the replicas' agreed topic ID
    # KRaft: a -stray replica proven stray by its topic ID moved out of the log dir while its broker is stopped
    QUARANTINE_STRAY_REPLICA = "quarantine-stray-replica"
    # the .deleted / .cleaned files Kafka deletes at its next start, moved aside instead while the broker is stopped
    QUARANTINE_LEFTOVER = "quarantine-leftover"
    REPORT_ONLY = "report-only"


class Scope(Enum):
    SEGMENT = "segment"  # facts from one partition directory's segment files
    PARTITION = "partition"  # partition directory metadata
    CROSS_SOURCE = "cross-source"  # needs ZooKeeper and/or several brokers
    LOG_DIR = "log-dir"
    CONTROLLER = "controller"  # a KRaft controller's __cluster_metadata-0 and quorum-state


class Needs(Enum):
    METADATA = "metadata"  # the probe's default mode
    DEEP = "deep"  # the probe's --deep (walks .log batch headers)
    CRC = "crc"  # the probe's --verify-crc
    ZOOKEEPER = "zookeeper"  # a ZooKeeper snapshot
    FLEET = "fleet"  # probe output of several brokers, compared (skipped when a run audits only some)
    # KRaft only (silent on a ZooKeeper cluster): the cluster facts decoded from __cluster_metadata (the image), and
    # the controllers' own metadata logs and quorum-state (fleet-doctor cluster-metadata on each controller)
    METADATA_LOG = "metadata-log"


_VERSION_RE = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?")


@total_ordering
@dataclass(frozen=True)
class KafkaVersion:
    """A Kafka release as (major, minor, patch); "0.10.1.0" and "3.9.0-SNAPSHOT" parse too."""

    major: int
    minor: int
    patch: int = 0

    @classmethod
    def parse(cls, text: str) -> KafkaVersion:
        m = _VERSION_RE.match(text.strip())
        if not m:
            raise ValueError(f"not a Kafka version: {text!r} (expected e.g. 0.8.2, 2.8, 3.9.0)")
        major, minor, patch = int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)
        if major == 0:
            # 0.x releases have four parts (0.10.1.0): the third one is the minor feature release.
            rest = text.strip().split(".")
            patch = int(rest[2]) if len(rest) > 2 and rest[2].isdigit() else 0
        return cls(major, minor, patch)

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, KafkaVersion):
            return NotImplemented
        return (self.major, self.minor, self.patch) < (other.major, other.minor, other.patch)

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}"

    @property
    def number(self) -> int:
        """The version as one comparable number (3 digits each for minor and patch): how detection compares them."""
        return self.major * 1_000_000 + self.minor * 1_000 + self.patch


def v(text: str) -> KafkaVersion:
    return KafkaVersion.parse(text)


@dataclass(frozen=True)
class SeverityBand:
    """Severity for Kafka versions >= since (until the next band)."""

    since: KafkaVersion
    severity: Severity
    behaviour: str  # what that Kafka version does with the damage


@dataclass(frozen=True)
class Rule:
    id: str
    title: str
    scope: Scope
    needs: Needs
    condition: str
    why: str
    bands: tuple[SeverityBand, ...]
    remediation: Remediation
    reference: str
    applies_from: KafkaVersion = field(default_factory=lambda: v("0.8.0"))
    applies_until: KafkaVersion | None = None  # exclusive

    def applies_to(self, version: KafkaVersion | None) -> bool:
        if version is None:
            return True
        if version < self.applies_from:
            return False
        return self.applies_until is None or version < self.applies_until

    def band_for(self, version: KafkaVersion | None) -> SeverityBand:
        """The band in force on a broker of this Kafka version; unknown version → the worst band."""
        if version is None:
            return max(self.bands, key=lambda b: b.severity)
        chosen = self.bands[0]
        for band in self.bands:
            if band.since <= version:
                chosen = band
        return chosen

    def severity_for(self, version: KafkaVersion | None) -> Severity:
        return self.band_for(version).severity

    def behaviour_for(self, version: KafkaVersion | None) -> str:
        return self.band_for(version).behaviour


def _catalogue(text: str) -> tuple[Rule, ...]:
    """The rules of a catalogue text: per rule ``<id>: <title>``, then indented lines: the properties (``scope S,
    needs N, remediation R`` and optionally ``from V``, ``until V``), ``reference``, ``condition``, ``why`` and one
    ``<version>+  <severity>[: <behaviour>]`` per severity band, oldest first; a value goes on over the lines below it
    that are indented further."""
    rules = []
    for block in text.strip().split("\n\n"):
        head, *lines = block.splitlines()
        rule_id, _, title = head.partition(": ")
        entries: list[list[str]] = []
        for line in lines:
            if line.startswith(" " * 8):
                entries[-1][1] += " " + line.strip()
            else:
                key, _, value = line.strip().partition(" ")
                entries.append([key, value.strip()])
        props = dict(part.strip().split(" ", 1) for part in " ".join(entries[0]).split(","))
        fields = {k: val for k, val in entries[1:] if not k.endswith("+")}
        unknown = (set(props) - {"scope", "needs", "remediation", "from", "until"}) | (
            set(fields) - {"reference", "condition", "why"}
        )
        if unknown or rule_id in {r.id for r in rules}:
            raise ValueError(f"rule catalogue, {rule_id}: unknown key(s) {sorted(unknown)} or a second definition")
        bands = tuple(
            SeverityBand(v(k[:-1]), Severity(sev), behaviour)
            for k, val in entries[1:]
            if k.endswith("+")
            for sev, _, behaviour in [val.partition(": ")]
        )
        rules.append(
            Rule(
                rule_id,
                title,
                Scope(props["scope"]),
                Needs(props["needs"]),
                fields["condition"],
                fields["why"],
                bands,
                Remediation(props["remediation"]),
                fields.get("reference", ""),
                v(props.get("from", "0.8.0")),
                v(props["until"]) if "until" in props else None,
            )
        )
    return tuple(rules)


# Version boundaries and wording follow ../shared/docs/kafka-reference.md ("ref §n").
CATALOGUE = """
index-untrimmed: Offset or time index still holds its preallocated zero tail
    scope segment, needs metadata, remediation quarantine-index
    reference   ref §1.2–§1.4
    condition   an index has zero entries after its last real one (or exactly segment.index.bytes) on a segment that is
                not the active segment of a running broker
    why         Kafka preallocates the active segment's indexes to 10 MiB and trims them only on a clean close; after
                kill -9 the whole length counts as entries and the last entry is zero (seed-000).
    0.8.0+      critical: startup fails: 'Corrupt index found ... last offset is N and the base offset is N'
    0.9.0+      warning: detected at startup, deleted and rebuilt (slow restart)
    2.3.0+      critical: no longer checked below the recovery point: trusted, giving wrong lookups and early time-based
                deletion (KAFKA-10207)

index-last-offset: Offset index last offset not above its base offset
    scope segment, needs metadata, remediation quarantine-index
    reference   ref §1.3
    condition   entries > 0 and last offset <= base offset (Kafka <= 1.1) or < base offset (>= 2.0)
    why         This is the offset-index sanity check whose failure is the 'Corrupt index found' of the 0.8 startup
                error; 2.0 relaxed it to 'less than' (KAFKA-7076).
    0.8.0+      critical: startup fails (IllegalArgumentException: Corrupt index found)
    0.9.0+      warning: index deleted and rebuilt at startup
    2.3.0+      critical: not checked at load: the index is trusted

index-size: Index size is not a whole number of entries
    scope segment, needs metadata, remediation quarantine-index
    reference   ref §1.2–§1.3
    condition   .index size not a multiple of 8, .timeindex size not a multiple of 12
    why         Kafka rounds the size down when it opens the file; the partial entry is a sign of a torn write or a
                foreign file.
    0.8.0+      critical: startup fails: 'Index file ... is corrupt, found N bytes which is not positive or not a
                multiple of 8'
    0.9.0+      warning: rebuilt at startup
    2.3.0+      warning: rounded down and trusted

index-not-monotonic: Index entries go backwards
    scope segment, needs metadata, remediation quarantine-index
    reference   ref §1.1
    condition   offsets or positions (time index: timestamps or offsets) decrease before the zero tail
    why         Index lookups binary-search the entries; out-of-order entries return wrong positions, so fetches read
                the wrong data or fail.
    0.8.0+      critical: lookups return wrong positions

index-beyond-log: Index entry points at or past the end of the log
    scope segment, needs metadata, remediation quarantine-index
    reference   ref §2.5
    condition   an index entry's position is at or beyond the .log size (deep: beyond the valid bytes)
    why         Typical after a truncated or torn log: a fetch for those offsets reads past the data.
    0.8.0+      critical: fetches for the affected offsets fail

timeindex-last-timestamp: Time index last timestamp below its first
    scope segment, needs metadata, remediation quarantine-index, from 0.10.1
    reference   ref §1.3
    condition   last timestamp < first timestamp (<= on 0.10.1–1.0)
    why         The time index sanity check; a zero last timestamp also makes time retention treat the segment as
                ancient and delete it early.
    0.10.1+     warning: rebuilt at startup
    2.3.0+      critical: trusted: time retention may delete the segment early

index-orphan: Index file without its log segment
    scope segment, needs metadata, remediation report-only
    reference   ref §2.1
    condition   .index/.timeindex with no .log of the same base offset
    why         Kafka deletes orphaned index files at startup ('Found an orphaned index file'); their presence means the
                log was removed by hand or lost.
    0.8.0+      warning: deleted at startup

index-missing: Log segment without its offset index
    scope segment, needs metadata, remediation report-only
    reference   ref §1.4
    condition   .log with no .index
    why         Kafka rebuilds a missing index by reading the whole segment at startup: restart time grows with the
                segment size.
    0.8.0+      warning: rebuilt at startup (recovery time)

segment-leftover: Leftover .swap/.cleaned/.deleted file
    scope segment, needs metadata, remediation quarantine-leftover
    reference   ref §2.1
    condition   .swap, .cleaned or .deleted files (interrupted compaction, split or deletion)
    why         At startup Kafka deletes .cleaned/.deleted files and completes or discards swaps; a leftover shows an
                interrupted log-cleaner or deletion and a startup that will rewrite segments.
    0.8.0+      warning: completed or deleted at startup

segment-overlap: Segments overlap or are out of order
    scope segment, needs deep, remediation report-only
    reference   ref §2.4
    condition   a segment's next offset is beyond the next segment's base offset, or offsets precede the base
    why         Overlapping segments break offset lookups and can fail log loading.
    0.8.0+      critical: log loading fails or serves wrong data

log-torn-tail: Last batch of a log is incomplete or invalid
    scope segment, needs deep, remediation report-only
    reference   ref §2.5, §3.3
    condition   the bytes after the last valid batch do not form a batch (incomplete write, zero fill, bad header); on
                KRaft not in a __cluster_metadata-0 the controllers input decoded (metadata-log-torn's)
    why         Recovery truncates the segment at the last valid batch and deletes every later segment of the partition.
    0.8.0+      warning: truncated by recovery at the next unclean start

log-crc: Batch CRC mismatch
    scope segment, needs crc, remediation report-only
    reference   ref §3
    condition   a batch's stored CRC differs from CRC-32C (v2) / CRC-32 (v0/v1) of its bytes; on KRaft not in a
                __cluster_metadata-0 the controllers input decoded (metadata-log-torn's)
    why         Corrupt data on disk: recovery truncates there; consumers of a replica serving it get CorruptRecord.
    0.8.0+      critical: recovery truncates at the corrupt batch; data after it is lost on this replica

index-entry-mismatch: Offset-index entry does not point at its batch
    scope segment, needs deep, remediation report-only
    reference   ref §2.6
    condition   an offset-index entry does not point at the start of a batch containing its offset
    why         Like kafka-dump-log --verify-index-only. On 2.0+ an entry whose offset lies past its batch is benign
                when one append wrote several batches.
    0.8.0+      warning: lookups land on the wrong batch

file-unreadable: File could not be read or parsed
    scope segment, needs metadata, remediation report-only
    condition   a file could not be read (permissions, I/O error) or parsed
    why         Kafka would fail on the same file; an auditor that cannot read it cannot vouch for it.
    0.8.0+      warning: depends on the file

partition-metadata-malformed: partition.metadata unparsable or with an invalid topic ID
    scope partition, needs metadata, remediation report-only, from 2.8.0
    reference   ref §4.1
    condition   partition.metadata unparsable, or a zero/invalid topic ID
    why         Any read error of partition.metadata takes the whole log dir offline (KafkaStorageException).
    0.8.0+      critical: the log dir goes offline

leader-epoch-malformed: leader-epoch-checkpoint unparsable
    scope partition, needs metadata, remediation report-only, from 0.11.0
    reference   ref §4.2
    condition   leader-epoch-checkpoint unparsable
    why         A corrupt checkpoint takes the log dir offline, as for the offset checkpoints.
    0.8.0+      critical: the log dir goes offline

leader-epoch-not-monotonic: Leader epochs or their start offsets decrease
    scope partition, needs metadata, remediation report-only, from 0.11.0
    reference   ref §4.2
    condition   epochs or start offsets decrease between entries
    why         Kafka drops conflicting entries at load ('caused truncation of conflicting entries'); follower
                truncation decisions then use a different history.
    0.8.0+      warning: conflicting entries dropped at load

leader-epoch-ahead: Leader epoch cache ahead of the log or of ZooKeeper
    scope cross-source, needs deep, remediation report-only, from 0.11.0
    reference   ref §4.2, §5
    condition   a start offset beyond the log end offset, or an epoch above ZooKeeper's leader_epoch
    why         The cache is truncated at load; an epoch above the controller's state means the replica saw a leadership
                the cluster no longer knows.
    0.8.0+      warning: truncated at load

stray-dir: Lingering -delete, -future or -stray partition directory
    scope partition, needs metadata, remediation quarantine-stray-replica
    reference   ref §2.1
    condition   a partition directory named <topic>-<p>.<uid>-delete, -future or -stray
    why         Disk held by logs that are being (or failed to be) deleted or moved; KRaft 3.7+ renames replicas it does
                not own to -stray instead of deleting them.
    0.8.0+      warning: disk space held; no automatic cleanup for -stray

topic-id-mismatch: Replica topic ID differs from ZooKeeper's
    scope cross-source, needs zookeeper, remediation remove-topic-id-files, from 2.8.0
    reference   ref §4.1, §6
    condition   a replica's partition.metadata topic ID differs from the /brokers/topics/<t> topic_id
    why         After the next restart the broker answers INCONSISTENT_TOPIC_ID and the replica stays out of ISR
                (seed-004, KAFKA-14190).
    0.8.0+      critical: replica leaves ISR on restart

topic-id-split: Replicas disagree on a topic's ID
    scope cross-source, needs fleet, remediation report-only, from 2.8.0
    reference   ref §4.1, §6
    condition   replicas of one topic hold more than one topic ID in partition.metadata: one finding per topic, naming
                each ID and the replicas (broker, partitions) that hold it
    why         At most one of them can match the controller's ID; the others fail the topic-ID check. When ZooKeeper
                (on KRaft the metadata log) has an ID, the replicas that differ from it are topic-id-mismatch findings,
                critical one by one and repaired there, and a replica holding that ID is never flagged: the split
                only sums them up (info, nothing to do of its own). When it has none, no side can be called right:
                the split is the critical finding, and which ID to keep is a decision for a human (the repair plan
                names it and touches nothing).
    0.8.0+      critical: no topic ID in ZooKeeper (or the metadata log) to converge on: some replicas leave ISR at
                their next start (with one: info, its topic-id-mismatch findings are the critical ones)

topic-id-missing-in-zk: Topic znode has lost its topic_id
    scope cross-source, needs zookeeper, remediation restore-zk-topic-id, from 2.8.0
    reference   ref §5, §6
    condition   the /brokers/topics/<t> znode has no topic_id while brokers run IBP >= 2.8
    why         The next controller failover mints a new random ID and every existing replica then mismatches: drift
                ahead (KAFKA-14190).
    0.8.0+      critical: a new topic ID is minted at the next controller failover

replica-not-assigned: Partition directory not in the assignment
    scope cross-source, needs zookeeper, remediation report-only
    reference   ref §5
    condition   a partition directory on a broker that the assignment does not place there, or of an unknown topic
    why         Leftovers of a reassignment or deletion: disk held, and a confusing second copy.
    0.8.0+      warning: ignored or deleted by the broker

replica-dir-missing: Assigned replica has no directory
    scope cross-source, needs zookeeper, remediation report-only
    reference   ref §5
    condition   an assigned replica has no partition directory on its broker
    why         The broker will re-create and re-replicate it; a lost disk or wiped dir shows up here.
    0.8.0+      warning: re-replicated from the leader

under-replicated: Partition under-replicated
    scope cross-source, needs zookeeper, remediation report-only
    reference   ref §5
    condition   ISR smaller than the replica set (partition state)
    why         One more failure may take the partition below min.insync.replicas; no rolling restart is safe.
    0.8.0+      warning: reduced redundancy

offline-partition: Partition has no live leader
    scope cross-source, needs zookeeper, remediation report-only
    reference   ref §5
    condition   the partition state has no leader (-1) or its leader is not registered; on KRaft not judged when the
                metadata shows a deliberately stopped cluster (every broker fenced after a controlled shutdown, or
                nothing of it running in a scan of copied dirs): brokers fenced under live controllers count
    why         Producers and consumers of the partition are down now.
    0.8.0+      critical: unavailable

unsafe-replication: Topic cannot survive any rolling restart
    scope cross-source, needs zookeeper, remediation report-only
    reference   ref §7.1
    condition   replication factor 1, or min.insync.replicas >= replication factor
    why         Restarting any of its brokers makes partitions unavailable: flag it before anyone plans a restart.
    0.8.0+      warning: unavailable during any broker restart

checkpoint-malformed: Offset checkpoint file unparsable
    scope log-dir, needs metadata, remediation report-only
    reference   ref §2.3
    condition   recovery-point-, log-start-, replication- or cleaner-offset-checkpoint unparsable
    why         CheckpointFileWithFailureHandler marks the log dir offline before it throws.
    0.8.0+      critical: the log dir goes offline

checkpoint-dangling: Checkpoint entry for a partition with no directory
    scope log-dir, needs metadata, remediation report-only
    reference   ref §2.3
    condition   a checkpoint entry names a partition with no directory in that log dir
    why         Harmless to Kafka, but it shows a directory removed by hand or a lost disk.
    0.8.0+      info: ignored

unclean-shutdown: Log dir of a stopped broker without a clean-shutdown marker
    scope log-dir, needs metadata, remediation report-only
    reference   ref §2.2, §2.4
    condition   a stopped broker's log dir without .kafka_cleanshutdown
    why         The next start recovers every segment above the recovery point: the bytes there estimate the work.
    0.8.0+      warning: log recovery at the next start

meta-mismatch: meta.properties disagree
    scope cross-source, needs metadata, remediation report-only
    reference   ref §2
    condition   meta.properties broker.id/node.id or cluster.id differ between a broker's log dirs, or from ZooKeeper's
                cluster id
    why         Kafka refuses to start with inconsistent meta.properties; a foreign cluster.id means a disk from another
                cluster.
    0.8.0+      critical: the broker refuses to start

stray-replica: Replica KRaft will treat as stray at the next start
    scope cross-source, needs metadata-log, remediation report-only, from 3.0.0
    reference   ref §2.1 item 6, kraft-ref §7
    condition   on a KRaft broker, a live partition directory whose partition.metadata has no topic ID, whose topic ID
                is absent from the metadata image, or whose partition's replicas in the image exclude the broker
    why         At startup the broker compares every log with the metadata image (LogManager.isStrayKraftReplica):
                3.0-3.6 delete a stray log, 3.7+ rename it <topic>-<p>.<uuid>-stray and keep it. A replica whose
                topic ID differs from the TopicRecord is stray too: its data is not the topic's any more. Before
                3.7.1 a log without a topic ID fails the start ('does not have a topic ID, which is not allowed when
                running in KRaft mode'): critical on those versions.
    3.0.0+      critical: deleted at the next start (BrokerMetadataPublisher.deleteStrayReplicas)
    3.7.0+      warning: renamed -stray at the next start and kept: disk held, no automatic cleanup

metadata-log-torn: Controller's metadata log has a torn tail or a CRC failure
    scope controller, needs metadata-log, remediation report-only, from 3.0.0
    reference   kraft-ref §2, ref §2.5, §3.3
    condition   a batch of a node's __cluster_metadata-0 log (or snapshot) fails its CRC-32C, or the bytes after the
                last valid batch do not form a batch (on a combined node, deep mode's log-torn-tail and log-crc leave
                that log to this rule)
    why         Recovery truncates the metadata log at the last valid batch; the node then fetches the rest from the
                quorum leader. A CRC failure before the end loses every later record on that node, and a leader
                that holds it cannot serve them.
    3.0.0+      warning: truncated at the next start and fetched again from the leader (a CRC failure: critical)

metadata-snapshot-gap: Metadata log starts after the newest snapshot
    scope controller, needs metadata-log, remediation report-only, from 3.0.0
    reference   kraft-ref §1, §5
    condition   a node's __cluster_metadata-0 log starts after the newest snapshot's end offset (or, with no snapshot,
                after offset 0): the records between them are on neither
    why         The metadata image is the newest snapshot plus the log after it; with records missing the node's
                image cannot be rebuilt from its own files (a leader cannot serve them either).
    3.0.0+      critical: the node's metadata image misses records

quorum-state-divergent: Controllers' quorum-state files disagree
    scope controller, needs metadata-log, remediation report-only, from 3.0.0
    reference   kraft-ref §6
    condition   two nodes of one cluster name different leaders for the same epoch (critical); a node's log holds
                batches of an epoch above its own quorum-state's, both from the decoder's read of that node
                (warning); a node with no leader at an epoch above every node's log (warning: stuck in elections); a
                node behind the highest epoch that names a leader, whose log holds no batch of that epoch (info: it
                missed the election or has not replicated it yet)
    why         Raft allows one leader per epoch: two are a split brain or a file copied between nodes. A log ahead of
                its quorum-state means the file was rolled back. A voter cut off from the quorum without pre-vote
                (before Kafka 4.0) keeps raising its epoch as a candidate, leaderId -1; it rejoins as a follower once
                it reaches the leader. A node one election behind is replication lag.
    3.0.0+      critical: two leaders for one epoch (a quorum-state rolled back, a voter stuck in elections:
                warning; a node behind: info)

metadata-record-unknown: Metadata the decoder does not know or cannot read
    scope controller, needs metadata-log, remediation report-only, from 3.0.0
    reference   kraft-ref §3, §4
    condition   a record of __cluster_metadata-0 with an apiKey or version outside the decoder's table, one it could
                not decode or apply, or a metadata file it could not read (the finding names the file and offset)
    why         The record was skipped: the audit's view of the cluster may miss what it changes. Usually a Kafka
                release newer than the decoder.
    3.0.0+      warning: the audit's cluster facts may be incomplete
"""
RULES: tuple[Rule, ...] = _catalogue(CATALOGUE)

RULES_BY_ID: dict[str, Rule] = {r.id: r for r in RULES}
# Kafka's own topics: a topic-ID repair leaves their replicas alone unless a person includes them (PRODUCT.md, safety
# invariant 6); the Kafka fleet view says so when a repair link names one
INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state"})
# a name Kafka accepts for a topic (org.apache.kafka.common.internals.Topic.validate): these characters, at most 249
# of them, neither "." nor "..". A partition dir on disk may hold any name; a repair's scope only ever names these
_LEGAL_TOPIC = re.compile(r"[a-zA-Z0-9._-]{1,249}")


def legal_topic(name: str) -> bool:
    return bool(_LEGAL_TOPIC.fullmatch(name)) and name not in (".", "..")


def rule_ids_with(remediation: Remediation) -> frozenset[str]:
    """The ids of the rules whose findings a repair plan addresses with ``remediation``."""
    return frozenset(r.id for r in RULES if r.remediation is remediation)


def get(rule_id: str) -> Rule:
    try:
        return RULES_BY_ID[rule_id]
    except KeyError:
        raise KeyError(f"unknown rule id {rule_id!r}; known: {', '.join(sorted(RULES_BY_ID))}") from None


def markdown(rules: Iterable[Rule] = RULES) -> str:
    """docs/rules.md, generated (python -m fleet_doctor.rules > docs/rules.md)."""
    lines = [
        "# Detection rules",
        "",
        "Generated from `plugins/fleet_doctor/rules.py` by `python -m fleet_doctor.rules > docs/rules.md`;",
        "a test fails when this file is stale. Rule ids are a public interface. `ref §` points into",
        "`../shared/docs/kafka-reference.md`, `kraft-ref §` into `../shared/docs/kraft-reference.md`.",
        "",
        "On a KRaft cluster the cluster facts (`needs zookeeper`) are the image decoded from its metadata log",
        "(`fleet-doctor cluster-metadata`), and the messages name the metadata log instead of ZooKeeper. Rules that",
        "need `metadata-log` are KRaft's own: they run only on a KRaft cluster (the `controller` scope on the",
        "controllers' own metadata logs and `quorum-state`) and never on a ZooKeeper one.",
        "",
        "| id | scope | needs | severity by Kafka version | remediation |",
        "|---|---|---|---|---|",
    ]
    for r in rules:
        bands = "; ".join(f"{b.since}+: **{b.severity.value}**" for b in r.bands)
        lines.append(f"| `{r.id}` | {r.scope.value} | {r.needs.value} | {bands} | {r.remediation.value} |")
    lines.append("")
    for r in rules:
        until = f" up to {r.applies_until}" if r.applies_until else ""
        lines += [
            f"## `{r.id}`: {r.title}",
            "",
            f"- **Condition:** {r.condition}.",
            f"- **Why it matters:** {r.why}",
            f"- **Applies to:** Kafka {r.applies_from}+{until}. **Needs:** {r.needs.value}. "
            f"**Remediation:** {r.remediation.value}." + (f" **Reference:** {r.reference}." if r.reference else ""),
        ]
        for b in r.bands:
            lines.append(f"- Kafka {b.since}+: **{b.severity.value}**" + (f": {b.behaviour}." if b.behaviour else "."))
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown(), end="")
