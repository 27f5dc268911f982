"""What a repair or a restore must refuse on a KRaft cluster, and why (../shared/docs/kraft-reference.md §8; issue
30): each refusal names the file, says what Kafka would do with the change, and what to do instead. The KRaft planner
and restore check every planned action here before anything is approved; nothing here reads or changes a broker.

Refused:

- **editing or deleting ``partition.metadata``**: on KRaft a replica without it (or with another topic ID) is
  renamed ``-stray`` at the next start and its data leaves the partition (``LogManager.isStrayKraftReplica``,
  KAFKA-16814); the ZooKeeper-era fix of seed-004 destroys the replica here;
- **deleting or editing ``quorum-state``**: a missing file is an empty state, so the voter could vote twice in one
  epoch; an unparsable one stops the node;
- **deleting, quarantining or restoring anything of ``__cluster_metadata-0``** (segments, indexes, snapshots, its
  ``.checkpoint`` files) on a voter: the log is rolled back and the voter may help elect a leader missing committed
  records; Kafka's procedure for a lost metadata dir is a re-format and a catch-up (``kafka-storage.sh format``), one
  voter at a time;
- **restoring a backup onto a voter's metadata log dir's own files** (``meta.properties``): node and directory ids
  are the quorum's;
- **``.kafka_cleanshutdown``**: Eligible Leader Replicas (KIP-966) trust it; never forged or removed;
- **the ZooKeeper topic-ID write**: a KRaft cluster has no ZooKeeper, its topic IDs are the metadata log's;
- **anything while more than one voter is impaired** (not readable, or behind the quorum's high watermark): no
  supported procedure, and a broker restart would need the quorum.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable

from fleet_doctor.cluster_metadata import METADATA_DIR_NAME as METADATA_DIR
from fleet_doctor.probe import CLEAN_SHUTDOWN_FILE as CLEAN_SHUTDOWN
from fleet_doctor.probe import META_PROPERTIES, PARTITION_METADATA, QUORUM_STATE
from fleet_doctor.repair.plan import FileAction
from fleet_doctor.repair.quorum import impaired_refusal

__all__ = ["action_refusal", "impaired_refusal", "plan_refusals", "zookeeper_write_refusal"]


def _in_metadata_dir(path: str) -> bool:
    return METADATA_DIR in posixpath.normpath(path).split("/")


def action_refusal(action: FileAction, metadata_log_dirs: Iterable[str] = ()) -> str | None:
    """Why ``action`` may not run on a KRaft cluster (None: it may). ``metadata_log_dirs``: the voters' metadata log
    dirs (``metadata.log.dir``, the inventory's controllers')."""
    path = posixpath.normpath(action.path)
    name = posixpath.basename(path)
    verb = {"remove": "removing", "quarantine": "quarantining", "restore": "restoring"}.get(action.action, "changing")
    if name == PARTITION_METADATA:
        return (
            f"{path}: {verb} partition.metadata is refused on KRaft: at the next start Kafka renames a replica without "
            "it (or with another topic ID) to <topic>-<partition>.<id>-stray and its data leaves the partition "
            "(LogManager.isStrayKraftReplica, KAFKA-16814). A topic-ID mismatch on KRaft is fixed by Kafka itself "
            "when the replica becomes stray; repair the stray replica instead (quarantine it, broker stopped)"
        )
    if name == QUORUM_STATE:
        return (
            f"{path}: {verb} quorum-state is refused: a missing file is an empty state (the voter could vote twice in "
            "one epoch), an unparsable one stops the node. Leader and epoch differences between voters are normal "
            "during an election; a node whose quorum-state is damaged is re-formatted and caught up (docs/kraft.md)"
        )
    if _in_metadata_dir(path):
        return (
            f"{path}: {verb} a file of {METADATA_DIR} is refused on a voter: its metadata log would roll back and it "
            "could help elect a leader missing committed records. A lost or damaged metadata dir is replaced by "
            "Kafka's procedure: wait until a majority of voters are caught up, move the dir away, kafka-storage.sh "
            "format with the same cluster id, start, and let it catch up before touching another voter"
        )
    if name == CLEAN_SHUTDOWN:
        return (
            f"{path}: {verb} .kafka_cleanshutdown is refused: Eligible Leader Replicas (KIP-966) trust it; only Kafka "
            "writes or removes it"
        )
    dirs = {posixpath.normpath(d) for d in metadata_log_dirs}
    if name == META_PROPERTIES and (posixpath.dirname(path) in dirs or action.action == "restore"):
        return (
            f"{path}: {verb} meta.properties is refused: its node.id and directory.id are the quorum's and the "
            "controller's registration's; a node whose meta.properties is wrong is re-formatted (kafka-storage.sh)"
        )
    return None


def zookeeper_write_refusal(cluster: str) -> str:
    """The ZooKeeper topic-ID write, asked of a KRaft cluster."""
    return (
        f"cluster {cluster} is a KRaft cluster: it has no ZooKeeper, and its topic IDs are the metadata log's; the "
        "ZooKeeper topic-ID write (rule topic-id-mismatch's ZooKeeper step) does not apply. Nothing was written"
    )


def plan_refusals(actions: Iterable[FileAction], metadata_log_dirs: Iterable[str] = ()) -> list[str]:
    """Every refusal of the planned ``actions``, in order (empty: none)."""
    dirs = list(metadata_log_dirs)
    return [why for a in actions if (why := action_refusal(a, dirs)) is not None]
