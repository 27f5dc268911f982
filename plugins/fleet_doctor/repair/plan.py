"""What a repair (or a restore) will do, as data: content-addressed and frozen.

A plan says, per broker in restart order (the active controller last), exactly which files are backed up and then
removed or quarantined, whether the broker restarts, and a preview of the log recovery each restart costs; the
preventive ZooKeeper actions are listed apart (they need their own approval), and so are the findings in scope that
no action addresses. ``repair.planner`` builds it (the only place that does), ``repair.approval_text`` renders it for
the approver, ``repair.executor`` runs it.

The plan's hash is the SHA-256 of its canonical JSON (sorted keys, no timestamps): the same fleet and the same
findings give the same hash, so "what runs is what was approved" can be checked right before acting. A plan cannot
change once built (frozen dataclasses, tuples, read-only mappings): what is hashed is what was built.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Any, NoReturn

from fleet_doctor.probe import (
    LEADER_EPOCH_CHECKPOINT,
    PARTITION_METADATA,
    SEGMENT_EXTENSIONS,
    parse_partition_dir_name,
    parse_segment_file_name,
)

# in the partition dir: a rename on one filesystem, and log loading skips directories there; never in the log dir
# itself, where Kafka refuses to start on a directory that is not a partition dir (the lost+found trap)
QUARANTINE_DIR = "fleet-doctor-quarantine"
REMOVABLE = (PARTITION_METADATA, LEADER_EPOCH_CHECKPOINT)  # what a remove action may remove: the topic-ID files
QUARANTINABLE = tuple(f".{ext}" for ext in SEGMENT_EXTENSIONS if ext != "log")  # a segment's indexes, never its log
# a -stray replica dir cannot stay in its log dir once quarantined (Kafka parses every directory there as a partition
# and refuses one that is not), nor in a partition dir: it goes beside the log dir, on its filesystem (a rename, never
# a copy): <parent of the log dir>/fleet-doctor-stray-quarantine/<log dir name>/<plan hash[:16]>/
STRAY_QUARANTINE_DIR = "fleet-doctor-stray-quarantine"
# the leftovers a plan may move aside: what Kafka deletes at its next start anyway (kafka-reference.md §2.1 step 1).
# Never a .swap: Kafka completes most of them at start, and one may hold the only copy of its records
QUARANTINABLE_LEFTOVERS = ("deleted", "cleaned")


def leftover_file(path: str) -> bool:
    """Whether ``path`` names a ``<base>.<ext>.deleted`` or ``.cleaned`` file of a segment or producer snapshot (a
    leftover a plan may quarantine)."""
    parsed = parse_segment_file_name(path.rsplit("/", 1)[-1])
    return bool(parsed and parsed[2] in QUARANTINABLE_LEFTOVERS)


def stray_replica_dir(path: str) -> bool:
    """Whether ``path`` names a replica dir Kafka renamed ``<topic>-<partition>.<uid>-stray`` (KRaft 3.7+)."""
    parsed = parse_partition_dir_name(path.rstrip("/").rsplit("/", 1)[-1])
    return bool(parsed and parsed["dir_state"] == "stray")


def stray_quarantine(log_dir: str, plan_hash: str) -> str:
    """Where a plan quarantines a -stray replica dir of ``log_dir``: beside the log dir (``STRAY_QUARANTINE_DIR``)."""
    parent, _, name = log_dir.rstrip("/").rpartition("/")
    return f"{parent}/{STRAY_QUARANTINE_DIR}/{name}/{plan_hash[:16]}"


class FrozenDict(dict):  # type: ignore[type-arg]
    """A read-only dict: JSON encodes it as a dict (the hash is unchanged), nothing can change it after the build."""

    def _frozen(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError("a plan is frozen once built: build another one (repair.planner)")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = __ior__ = _frozen  # type: ignore[assignment]

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenDict, (dict(self),))


class FrozenList(list):  # type: ignore[type-arg]
    """A read-only list: equal to the list it was made from, JSON encodes it as one."""

    def _frozen(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError("a plan is frozen once built: build another one (repair.planner)")

    __setitem__ = __delitem__ = __iadd__ = __imul__ = _frozen  # type: ignore[assignment]
    append = extend = insert = pop = remove = clear = sort = reverse = _frozen  # type: ignore[assignment]

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenList, (list(self),))


def frozen(value: Any) -> Any:
    """``value`` with every dict made a ``FrozenDict`` and every list a ``FrozenList``, recursively."""
    if isinstance(value, Mapping):
        return FrozenDict({k: frozen(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return FrozenList(frozen(v) for v in value)
    return value


def thawed(value: Any) -> Any:
    """The inverse of ``frozen``: plain dicts and lists (for JSON and for callers that build on a copy)."""
    if isinstance(value, Mapping):
        return {k: thawed(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [thawed(v) for v in value]
    return value


@dataclass(frozen=True)
class FileAction:
    action: str  # "remove" (after backup), "quarantine" (moved aside) or "restore" (a backup put back)
    path: str
    rule: str
    topic: str | None
    partition: int | None
    reason: str


@dataclass(frozen=True)
class RestartPreview:
    last_stop_clean: bool | None  # every log dir had .kafka_cleanshutdown when probed (None: broker was running)
    running: bool
    segments_above_recovery_point: int
    bytes_above_recovery_point: int
    indexes_rebuilt: int  # segments whose indexes Kafka rebuilds at start (quarantined or missing)
    bytes_to_rebuild: int
    estimated_recovery_s: float
    # stopped with the marker present yet with untrimmed (preallocated) indexes: a clean stop trims them, so the
    # broker was killed while it loaded its logs after a clean stop (seed-000) and the marker is not to be trusted
    untrimmed_indexes_with_marker: int = 0


@dataclass(frozen=True)
class BrokerPlan:
    broker_id: int
    is_controller: bool
    restart: bool
    actions: tuple[FileAction, ...] = ()
    preview: RestartPreview | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "actions", tuple(self.actions))

    @property
    def backup_paths(self) -> list[str]:
        """The files backed up before the change: every planned file but what is moved and never copied (a -stray
        replica dir, a leftover segment file: up to a segment's gigabyte; the quarantine keeps every byte on the
        broker's own filesystem, and the journal says where)."""
        return sorted({a.path for a in self.actions if not (stray_replica_dir(a.path) or leftover_file(a.path))})


@dataclass(frozen=True)
class ZkAction:
    action: str  # "restore-topic-id"
    topic: str
    topic_id: str
    reason: str


@dataclass(frozen=True)
class Plan:
    cluster: str
    audit_run: str
    scope: Mapping[str, Any]
    brokers: tuple[BrokerPlan, ...]  # in restart order: the controller last
    zookeeper: tuple[ZkAction, ...]
    skipped: tuple[Mapping[str, Any], ...]  # findings in scope that no action addresses, with why
    risk: Mapping[str, Any] = field(default_factory=FrozenDict)  # planner.restart_risk: for the approver, not hashed

    def __post_init__(self) -> None:
        object.__setattr__(self, "scope", frozen(self.scope))
        object.__setattr__(self, "skipped", tuple(frozen(s) for s in self.skipped))
        object.__setattr__(self, "risk", frozen(self.risk))
        object.__setattr__(self, "brokers", tuple(self.brokers))
        object.__setattr__(self, "zookeeper", tuple(self.zookeeper))

    def canonical(self) -> dict[str, Any]:
        """What the approver approves: cluster, scope, the per-broker actions and order, the ZooKeeper actions.
        Not the audit run id nor the restart previews (log sizes move on a live broker): a re-verification
        against a fresh probe gives the same hash exactly when the same files would be touched in the same order."""
        return {
            "cluster": self.cluster,
            "scope": thawed(self.scope),
            "brokers": [
                {
                    "broker_id": b.broker_id,
                    "is_controller": b.is_controller,
                    "restart": b.restart,
                    "actions": [asdict(a) for a in b.actions],
                }
                for b in self.brokers
            ],
            "zookeeper": [asdict(z) for z in self.zookeeper],
        }

    def to_json(self) -> str:
        return json.dumps(thawed(asdict(self)), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Plan:
        d = json.loads(text)
        brokers = [
            BrokerPlan(
                b["broker_id"],
                b["is_controller"],
                b["restart"],
                tuple(FileAction(**a) for a in b["actions"]),
                RestartPreview(**b["preview"]) if b.get("preview") else None,
            )
            for b in d["brokers"]
        ]
        zookeeper = tuple(ZkAction(**z) for z in d["zookeeper"])
        return cls(
            d["cluster"], d["audit_run"], d["scope"], tuple(brokers), zookeeper, d["skipped"], d.get("risk") or {}
        )

    def canonical_json(self) -> str:
        return json.dumps(self.canonical(), sort_keys=True, separators=(",", ":"))

    @cached_property
    def hash(self) -> str:
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()

    @property
    def decisions(self) -> list[Mapping[str, Any]]:
        """The findings the plan leaves to a human to decide (a topic-id-split without a ZooKeeper ID: which topic ID
        to keep): each a ``skipped`` entry with ``decision`` (what to decide) and ``topic_ids`` (the choices)."""
        return [s for s in self.skipped if s.get("decision")]

    @property
    def restart_order(self) -> list[int]:
        return [b.broker_id for b in self.brokers if b.restart]

    @property
    def files(self) -> int:
        """How many files the plan changes, on every broker."""
        return sum(len(b.actions) for b in self.brokers)

    def counts(self) -> dict[str, int]:
        return {
            "brokers_restarted": len(self.restart_order),
            "files_removed": sum(a.action == "remove" for b in self.brokers for a in b.actions),
            "files_quarantined": sum(
                a.action == "quarantine" and not stray_replica_dir(a.path) for b in self.brokers for a in b.actions
            ),
            "replicas_quarantined": sum(
                a.action == "quarantine" and stray_replica_dir(a.path) for b in self.brokers for a in b.actions
            ),
            # of files_quarantined: the .deleted / .cleaned leftovers (moved, never copied into a backup)
            "leftovers_quarantined": sum(
                a.action == "quarantine" and leftover_file(a.path) for b in self.brokers for a in b.actions
            ),
            "zookeeper_actions": len(self.zookeeper),
        }

    @property
    def kraft(self) -> bool:
        """The plan was made for a KRaft cluster (its scope says so: the approver sees it, the hash covers it)."""
        return self.scope.get("metadata_mode") == "kraft"

    @property
    def gates(self) -> Mapping[str, Any]:
        """The gates the approver saw (the form's, at plan time: part of the hash; ``repair.gates``)."""
        return self.scope.get("gates") or FrozenDict()

    @property
    def dry_run(self) -> bool:
        """The plan runs as a dry run (the form's ``dry_run``, one of the gates: part of the hash)."""
        return bool(self.gates.get("dry_run"))

    @property
    def controller(self) -> int | None:
        """The active controller when the plan was made (None: the audit's snapshot named none)."""
        return next((b.broker_id for b in self.brokers if b.is_controller), None)


def controller_last(brokers: Iterable[BrokerPlan], controller: int | None) -> list[BrokerPlan]:
    """``brokers`` in their order, the controller moved last (Strimzi, Cruise Control: restarting the active
    controller forces an election and every broker reloads metadata; kafka-reference.md §7)."""
    return sorted(brokers, key=lambda b: b.broker_id == controller)


def restart_order(
    brokers: Iterable[BrokerPlan], controller: int | None, voters: Iterable[int] = ()
) -> list[BrokerPlan]:
    """``brokers`` in their order, the KRaft voters (controllers, combined nodes) after the other brokers, the active
    controller last (``controller_last``; kraft-reference.md §8: the quorum's members one at a time, the leader
    last, as Strimzi's KafkaRoller orders them)."""
    quorum = set(voters)
    return sorted(brokers, key=lambda b: (b.broker_id in quorum, b.broker_id == controller))


def planned_path_ok(action: str, path: str, log_dirs: Iterable[str]) -> bool:
    """A plan's file is ``<log dir>/<partition dir>/<name>`` of one of the broker's log dirs, and a file its action
    may touch (defence in depth: the plan was built from probe output, itself from the broker's disk)."""
    parts = path.split("/")
    if len(parts) < 3 or any(p in ("", ".", "..") for p in parts[1:]) or "\n" in path:
        return False
    if action == "quarantine" and stray_replica_dir(path):  # <log dir>/<topic>-<p>.<uid>-stray, moved whole
        return "/".join(parts[:-1]) in {d.rstrip("/") for d in log_dirs}
    parent, name = "/".join(parts[:-2]), parts[-1]
    if parent not in {d.rstrip("/") for d in log_dirs}:
        return False
    if action == "remove":
        return name in REMOVABLE
    if action == "quarantine":
        return name.endswith(QUARANTINABLE) or leftover_file(name)
    return action == "restore" and (name in REMOVABLE or name.endswith(QUARANTINABLE))  # what a repair took away
