"""Building a repair plan: the one place a ``Plan`` is made, whole (scope, gates, actions, order, risk), then frozen.

A plan is built from one audit run's findings (the history's), its staged probe output (for the restart preview and
to act only on files that exist) and its cluster facts (the controller, the topic IDs, the ISR). What the plan does
for a finding is its rule's remediation in the registry (``fleet_doctor.rules``), and each remediation has its
planner here, registered in ``PLANNERS`` (as detection's ``@detector`` registry does): a new remediation is one
function. The planners add, per broker, the files backed up and then removed (``partition.metadata`` and
``leader-epoch-checkpoint`` of replicas whose topic ID differs from ZooKeeper's: kafka-reference.md §6, the repair of
KAFKA-14190) or quarantined (the index files of the index rules: moved aside, never deleted; Kafka rebuilds them at
start, §1.4), and the preventive ZooKeeper actions (a dropped ``topic_id`` every replica agrees on), which need their
own approval. Each restart carries a preview of the log recovery it will cost, and the plan a risk line (partitions
under min ISR while each broker is down) for the approver: not hashed, since the ISR moves.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fleet_doctor import layout
from fleet_doctor.audit.summary import FindingStatus
from fleet_doctor.probe import (
    LEADER_EPOCH_CHECKPOINT,
    PARTITION_METADATA,
    parse_partition_dir_name,
    parse_segment_file_name,
    segment_file_name,
)
from fleet_doctor.repair.errors import RepairError
from fleet_doctor.repair.kraft_refusals import action_refusal, zookeeper_write_refusal
from fleet_doctor.repair.plan import (
    QUARANTINE_DIR,
    BrokerPlan,
    FileAction,
    Plan,
    RestartPreview,
    ZkAction,
    controller_last,
    leftover_file,
    stray_quarantine,
    stray_replica_dir,
)
from fleet_doctor.rules import INTERNAL_TOPICS, RULES_BY_ID, Remediation, get, legal_topic
from fleet_doctor.staging import load_probe, staged_brokers
from fleet_doctor.store import Store
from fleet_doctor.zookeeper.cluster import CLUSTER_DEFAULT_PATH, KAFKA_DEFAULT_MIN_ISR, MIN_ISR

RECOVERY_BYTES_PER_S = 100 * 1024 * 1024  # rough log recovery rate (batch walk + index rebuild) for the preview
INDEX_FILES = ("index", "timeindex")  # what the quarantine of a segment's indexes moves aside (Kafka rebuilds both)
# report-only, but the plan says what it means for the repair: with a ZooKeeper ID its odd replicas are the
# topic-id-mismatch findings; without one, which ID to keep is a decision for a human (RULES.md, "Remediation")
TOPIC_ID_SPLIT = get("topic-id-split").id


# --------------------------------------------------------------------------------------------
@dataclass
class FleetFacts:
    """What the plan needs from one audit run: per broker the probe records, and the cluster facts (ZooKeeper's
    snapshot, or the KRaft metadata log's image)."""

    probe: dict[int, list[dict[str, Any]]]
    zk: list[dict[str, Any]]

    @classmethod
    def load(cls, store: Store, area: layout.RunArea) -> FleetFacts:
        """The staged probe output of every broker of the audit run staged in ``area``, and its cluster facts."""
        probe = {bid: load_probe(store, area.probe(bid)) for bid in staged_brokers(store, area)}
        return cls(probe, area.read_cluster_facts(store))

    @property
    def controller(self) -> int | None:
        for r in self.zk:
            if r.get("kind") == "cluster":
                return r.get("controller_id")
        return None

    @property
    def cluster_id(self) -> str | None:
        """The Kafka cluster's id as the audit read it (ZooKeeper's ``/cluster/id``, KRaft's ``cluster.id``)."""
        return next((r.get("cluster_id") for r in self.zk if r.get("kind") == "cluster" and r.get("cluster_id")), None)

    def out_of_isr(self) -> set[int]:
        """Brokers that are an assigned replica of some partition but not in its ISR."""
        replicas = {r["topic"]: r.get("partitions") or {} for r in self.zk if r.get("kind") == "topic"}
        out = set()
        for r in self.zk:
            if r.get("kind") == "partition_state" and r.get("isr") is not None:
                assigned = replicas.get(r["topic"], {}).get(str(r["partition"])) or []
                out |= set(assigned) - set(r["isr"])
        return out

    def cluster_default_min_isr(self) -> tuple[bool, int | None]:
        """ZooKeeper's cluster-wide default ``min.insync.replicas`` (``/config/brokers/<default>``) as the audit's
        snapshot read it: (known, value). Known with None: the znode is absent or sets none (the brokers' static
        default applies). Not known: the snapshot could not read it (not readable, malformed, a bad value: the
        cluster record's ``error`` says which), or its facts have no such field (KRaft, or staged before the audit
        read it)."""
        for r in self.zk:
            if r.get("kind") != "cluster":
                continue
            config = r.get("cluster_default_config")
            if not isinstance(config, dict):
                return False, None
            value = r.get("cluster_default_min_insync_replicas")
            if config.get(MIN_ISR) is not None and value is None:
                return False, None  # set but not a valid value: the pre-check refuses it
            return True, value
        return False, None

    def zk_topic_ids(self) -> dict[str, str | None]:
        return {r["topic"]: r.get("topic_id") for r in self.zk if r.get("kind") == "topic"}


# --------------------------------------------------------------------------------------------
# restart preview and risk: for the approver
def restart_preview(records: list[dict[str, Any]], quarantined_segments: set[tuple[str, int]]) -> RestartPreview:
    """What the broker's next start costs (kafka-reference.md §2.4, §1.4): after an unclean stop the segments
    from the one holding the recovery point are recovered; segments whose index is gone are rebuilt either way."""
    logdirs = [r for r in records if r.get("kind") == "logdir"]
    running = _was_running(records)
    clean = None if running else all(r.get("clean_shutdown") for r in logdirs)
    untrimmed = 0
    if clean:
        untrimmed = sum(
            1
            for r in records
            if r.get("kind") == "segment" and (r.get("index_zero_tail_entries") or r.get("timeindex_zero_tail_entries"))
        )
    rp = {r["path"]: r.get("recovery_point") for r in records if r.get("kind") == "partition"}
    segs = defaultdict(list)
    for r in records:
        if r.get("kind") == "segment":
            segs[r["path"]].append(r)
    above = above_bytes = rebuilt = rebuilt_bytes = 0
    for path, ss in segs.items():
        ss.sort(key=lambda r: r["base_offset"])
        point = rp.get(path) or 0
        start = max([s["base_offset"] for s in ss if s["base_offset"] <= point], default=ss[0]["base_offset"])
        for s in ss:
            size = s.get("log_bytes") or 0
            if s["base_offset"] >= start:
                above += 1
                above_bytes += size
            if (path, s["base_offset"]) in quarantined_segments or (s.get("has_log") and not s.get("has_index")):
                rebuilt += 1
                rebuilt_bytes += size
    # a controlled stop is clean: only the rebuilt indexes cost time; a broker already down uncleanly recovers more
    cost = rebuilt_bytes + (above_bytes if clean is False else 0)
    return RestartPreview(
        clean, running, above, above_bytes, rebuilt, rebuilt_bytes, round(cost / RECOVERY_BYTES_PER_S, 1), untrimmed
    )


def default_min_isr(cluster_default: int | None, static_min_isr: int | None) -> tuple[int, str]:
    """The ``min.insync.replicas`` of a topic without its own, and where it comes from, resolved as the health gates
    resolve it (``zookeeper.cluster.Cluster.cluster_min_isr``): ZooKeeper's cluster-wide default
    (``/config/brokers/<default>``), else the brokers' static default (the form's or the inventory's:
    ``gates.static_min_isr``), else Kafka's 1."""
    if cluster_default is not None:
        return cluster_default, f"ZooKeeper's {CLUSTER_DEFAULT_PATH}"
    if static_min_isr is not None:
        return static_min_isr, "the brokers' static default (inventory or form)"
    return KAFKA_DEFAULT_MIN_ISR, "Kafka's default"


def restart_risk(
    facts: FleetFacts,
    brokers: Iterable[int],
    static_min_isr: int | None = None,
    cluster_default: int | None = None,
    cluster_default_known: bool | None = None,
) -> dict[str, Any]:
    """Per broker of ``brokers``, as the audit's ZooKeeper snapshot saw the ISR: the partitions that go under
    min.insync.replicas while it is down and those it is the only in-sync replica of. For the approver; not part of
    the hash (the ISR moves).

    A topic's min.insync.replicas is its own setting, else ``default_min_isr``: ZooKeeper's cluster-wide default
    (``cluster_default``, as the audit read ``/config/brokers/<default>``: ``FleetFacts.cluster_default_min_isr``)
    first. ``cluster_default_known``: whether the audit read that znode (None: known when ``cluster_default`` is
    given); known and ``cluster_default`` None means ZooKeeper holds none and the static default applies, as in the
    pre-check. When not known (a failed read, facts staged before the audit read it), the partitions are counted
    with the static default (or Kafka's 1), the result says ``cluster_default_known`` False, and ``thinnest`` names
    the partitions of topics without their own setting that keep the fewest in-sync replicas with one of these
    brokers down (under min ISR if the cluster default is above that); the pre-check reads the real value before
    each stop."""
    known = cluster_default is not None if cluster_default_known is None else cluster_default_known
    default, source = default_min_isr(cluster_default if known else None, static_min_isr)
    topic_min = {r["topic"]: r.get("min_insync_replicas") for r in facts.zk if r.get("kind") == "topic"}
    out: dict[str, Any] = {}
    thin: dict[str, int] = {}  # partition of a topic without its own setting -> fewest in-sync left
    for bid in brokers:
        under, offline = [], 0
        for r in facts.zk:
            isr = r.get("isr") if r.get("kind") == "partition_state" else None
            if not isr or bid not in isr:
                continue
            name = f"{r['topic']}-{r['partition']}"
            if len(isr) == 1:
                offline += 1
                continue
            if len(isr) - 1 < (topic_min.get(r["topic"]) or default):
                under.append(name)
            if not topic_min.get(r["topic"]):
                thin[name] = min(thin.get(name, len(isr) - 1), len(isr) - 1)
        out[str(bid)] = {
            "under_min_isr": len(under),
            "under_min_isr_examples": sorted(under)[:3],
            "offline": offline,
        }
    risk: dict[str, Any] = {"min_isr": default, "min_isr_source": source, "static_min_isr": static_min_isr}
    risk["brokers"] = out
    risk["cluster_default_known"] = known
    if not known and thin:
        fewest = min(thin.values())
        at = sorted(p for p, n in thin.items() if n == fewest)
        risk["thinnest"] = {"in_sync_left": fewest, "partitions": len(at), "examples": at[:3]}
    return risk


# --------------------------------------------------------------------------------------------
# the planners, one per remediation
@dataclass
class _Build:
    """One plan in the making: the audit's facts indexed once, and what the planners have added so far."""

    facts: FleetFacts
    include_internal: bool
    kraft: bool = False
    actions: dict[int, dict[str, FileAction]] = field(default_factory=lambda: defaultdict(dict))
    quarantined: dict[int, set[tuple[str, int]]] = field(default_factory=lambda: defaultdict(set))
    skipped: list[dict[str, Any]] = field(default_factory=list)
    zk_topic_ids: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))  # topic -> IDs to write back
    # the probe records, indexed once: partition dir -> partition record, (dir, base offset) -> segment record
    partitions: dict[tuple[int, str], dict[str, Any]] = field(default_factory=dict)
    segments: dict[tuple[int, str, int], dict[str, Any]] = field(default_factory=dict)
    topic_ids_on_disk: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    replicas_per_id: dict[str, dict[str, int]] = field(default_factory=dict)  # topic -> ID -> replicas
    # (broker, partition dir) -> {file name: "swap" / "cleaned" / "deleted"} of its segment_leftover file records
    leftovers: dict[tuple[int, str], dict[str, str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for bid, recs in self.facts.probe.items():
            for r in recs:
                if r.get("kind") == "partition":
                    self.partitions[(bid, r["path"])] = r
                    if r.get("topic_id"):
                        self.topic_ids_on_disk[r["topic"]].add(r["topic_id"])
                        per_id = self.replicas_per_id.setdefault(r["topic"], {})
                        per_id[r["topic_id"]] = per_id.get(r["topic_id"], 0) + 1
                elif r.get("kind") == "segment":
                    self.segments[(bid, r["path"], r["base_offset"])] = r
                elif r.get("kind") == "file" and r.get("file_type") == "segment_leftover":
                    pdir, _, name = str(r["path"]).rpartition("/")
                    self.leftovers.setdefault((bid, pdir), {})[name] = r.get("leftover") or ""
        self.zk_ids = self.facts.zk_topic_ids()
        self.image_topic_ids = {r.get("topic_id") for r in self.facts.zk if r.get("kind") == "topic"} - {None}

    def add(self, bid: int, action: str, path: str, f: Mapping[str, Any], reason: str) -> None:
        """A file action for a finding (the first action planned for a path wins)."""
        self.actions[bid].setdefault(
            path, FileAction(action, path, f["rule"], f.get("topic"), f.get("partition"), reason)
        )

    def exists(self, bid: int, path: str) -> bool:
        """The file was there when the audit probed (the backup step re-checks on the broker)."""
        if stray_replica_dir(path):
            return (bid, path) in self.partitions
        pdir, _, name = path.rpartition("/")
        if leftover_file(path):
            return name in self.leftovers.get((bid, pdir), {})
        if name == PARTITION_METADATA:
            return bool(self.partitions.get((bid, pdir), {}).get("partition_metadata_present"))
        if name == LEADER_EPOCH_CHECKPOINT:
            return bool(self.partitions.get((bid, pdir), {}).get("leader_epoch_present"))
        if name[:20].isdigit():
            return bool(self.segments.get((bid, pdir, int(name[:20])), {}).get(f"has_{name[21:]}"))
        return False


# A planner acts on one finding in scope (its broker not held out): it adds file or ZooKeeper actions to the build,
# and returns why the finding is not addressed (None: addressed, or it wrote its own entry of ``skipped``).
Planner = Callable[[_Build, Mapping[str, Any]], str | None]
PLANNERS: dict[Remediation, Planner] = {}


def planner(remediation: Remediation) -> Callable[[Planner], Planner]:
    """Register the planner of a remediation (one per remediation: ``build_plan`` looks it up by the rule's)."""

    def register(fn: Planner) -> Planner:
        if remediation in PLANNERS:
            raise ValueError(f"two planners for {remediation.value}")
        PLANNERS[remediation] = fn
        return fn

    return register


@planner(Remediation.REMOVE_TOPIC_ID_FILES)
def _remove_topic_id_files(build: _Build, f: Mapping[str, Any]) -> str | None:
    """A replica whose ``partition.metadata`` holds another topic ID than ZooKeeper's: both topic-ID files go (backed
    up); the broker re-creates them from ZooKeeper's ID at its next start."""
    bid = f.get("broker_id")
    pdir = _partition_dir(f)
    on_disk = build.partitions.get((bid, pdir), {}).get("topic_id")  # type: ignore[arg-type]
    in_zk = build.zk_ids.get(f.get("topic") or "")
    if f.get("topic") in INTERNAL_TOPICS and not build.include_internal:
        return "internal topic (include_internal is off)"
    if build.kraft:  # the whole remedy is refused there, not half of it (kraft_refusals)
        return action_refusal(FileAction("remove", f"{pdir}/{PARTITION_METADATA}", f["rule"], None, None, ""))
    if not in_zk:
        return "ZooKeeper has no topic ID to converge on (restore it first)"
    if on_disk == in_zk:
        return "this replica already holds ZooKeeper's topic ID"
    for name in (PARTITION_METADATA, LEADER_EPOCH_CHECKPOINT):
        why = "the broker re-creates it from ZooKeeper's topic ID at its next start (KAFKA-14190 repair)"
        build.add(bid, "remove", f"{pdir}/{name}", f, why)  # type: ignore[arg-type]
    return None


@planner(Remediation.QUARANTINE_INDEX)
def _quarantine_index(build: _Build, f: Mapping[str, Any]) -> str | None:
    """A segment's broken index: its offset and time index are moved aside; Kafka rebuilds both at start."""
    if f.get("segment") is None:
        return "report only"
    bid, pdir = f.get("broker_id"), _partition_dir(f)
    for ext in INDEX_FILES:
        why = "moved aside; Kafka rebuilds the segment's indexes at start"
        build.add(bid, "quarantine", f"{pdir}/{segment_file_name(f['segment'], ext)}", f, why)  # type: ignore[arg-type]
    build.quarantined[bid].add((pdir, f["segment"]))  # type: ignore[index]
    return None


@planner(Remediation.RESTORE_ZK_TOPIC_ID)
def _restore_zk_topic_id(build: _Build, f: Mapping[str, Any]) -> str | None:
    """A topic znode without ``topic_id``: the ID every replica holds is written back (when they hold one)."""
    build.zk_topic_ids[f["topic"]] |= build.topic_ids_on_disk.get(f["topic"], set())
    return None


@planner(Remediation.QUARANTINE_STRAY_REPLICA)
def _quarantine_stray_replica(build: _Build, f: Mapping[str, Any]) -> str | None:
    """A ``-stray`` replica dir on a KRaft broker (3.7+ renames a replica it finds stray and keeps it: KAFKA-15605
    leaves it to the operator), proven stray by its topic ID: the ``partition.metadata`` it holds names a topic ID
    the metadata image does not hold (a topic deleted, or an older incarnation of one whose name now has another
    ID). Moved whole beside its log dir while the broker is stopped (a running broker keeps its stray logs open);
    deleting the quarantine is a plan of its own. A ``-delete`` dir is Kafka's to delete, a ``-future`` one a move
    between log dirs in progress: neither is touched."""
    bid, path = f.get("broker_id"), _partition_dir(f)
    if not stray_replica_dir(path):
        return "report only: a -delete dir is Kafka's to delete at its next start, a -future dir a move in progress"
    if not build.kraft:
        return "report only: a -stray dir on a ZooKeeper cluster was not made by this cluster's Kafka (look at it)"
    record = build.partitions.get((bid, path), {})  # type: ignore[arg-type]
    topic, on_disk = f.get("topic") or record.get("topic"), record.get("topic_id")
    if not on_disk:
        return "not proven stray: its partition.metadata holds no topic ID (the audit could not read one)"
    if on_disk in build.image_topic_ids:
        return f"not proven stray: its topic ID {on_disk} is in the metadata image (a replica of a live topic)"
    now = build.zk_ids.get(topic or "")
    proof = (
        f"its topic ID {on_disk} is not in the metadata image: an older incarnation of {topic} (now {now})"
        if now
        else f"its topic ID {on_disk} is not in the metadata image: topic {topic} was deleted"
    )
    log_dir = path.rsplit("/", 1)[0]
    why = f"{proof}; moved whole to {stray_quarantine(log_dir, '<plan hash>')}/ with the broker stopped"
    build.add(bid, "quarantine", path, f, why)  # type: ignore[arg-type]
    return None


@planner(Remediation.QUARANTINE_LEFTOVER)
def _quarantine_leftover(build: _Build, f: Mapping[str, Any]) -> str | None:
    """A ``.deleted`` or ``.cleaned`` file of an interrupted deletion or log cleaning: Kafka deletes it at its next
    start (kafka-reference.md §2.1 step 1); moved aside instead, with the broker stopped, into its partition dir's
    quarantine, never copied (a ``.log.deleted`` is up to a segment's size), kept until a purge deletes it. Left alone,
    with the reason: a ``.swap`` (Kafka completes it at start, replacing the segments it covers: §2.1 step 2; it may
    hold the only copy of their records), and a ``.cleaned`` in a partition dir that holds a ``.swap`` (Kafka deletes
    the swaps at or above the lowest ``.cleaned`` base offset, an incomplete split, KAFKA-6264; without the
    ``.cleaned`` it would complete them: checked again on the broker at the change, ``on_broker.quarantine``). A
    running broker with nothing else to repair keeps them (``_leftovers_only_where_a_restart_is_due``)."""
    bid, path = f.get("broker_id"), str(f.get("path") or "")
    pdir, _, name = path.rpartition("/")
    parsed = parse_segment_file_name(name)
    if parsed is None or parsed[2] is None:
        return "report only: not a .swap, .cleaned or .deleted file of a segment"
    if parsed[2] == "swap":
        return (
            "left alone: Kafka completes a .swap at its next start, replacing the segments it covers "
            "(kafka-reference.md §2.1 step 2), and it may hold the only copy of their records; one at or above the "
            "partition's lowest .cleaned base offset Kafka deletes itself (an incomplete split, KAFKA-6264)"
        )
    here = build.leftovers.get((bid, pdir), {})  # type: ignore[arg-type]
    if parsed[2] == "cleaned" and "swap" in here.values():
        return (
            "left alone: its partition dir holds a .swap, and Kafka deletes the swaps at or above the lowest .cleaned "
            "base offset (an incomplete split, KAFKA-6264); moved aside, it would make Kafka complete them instead"
        )
    state = parse_partition_dir_name(pdir.rsplit("/", 1)[-1])
    if not state or state["dir_state"] != "live":
        return "report only: not in a live partition dir (Kafka deletes a -delete dir whole; -future, -stray are apart)"
    what = "an interrupted deletion" if parsed[2] == "deleted" else "an interrupted log cleaning"
    why = (
        f"a leftover of {what}: Kafka deletes it at its next start (kafka-reference.md §2.1 step 1); moved to "
        f"{pdir}/{QUARANTINE_DIR}/<plan hash>/ instead with the broker stopped, never copied, kept until a purge"
    )
    build.add(bid, "quarantine", path, f, why)  # type: ignore[arg-type]
    return None


@planner(Remediation.REPORT_ONLY)
def _report_only(build: _Build, f: Mapping[str, Any]) -> str | None:
    """Nothing to do; a topic-id-split says what it means for the repair (``_split_entry``)."""
    if f["rule"] != TOPIC_ID_SPLIT:
        return "report only"
    topic = f.get("topic") or ""
    build.skipped.append(_split_entry(f, build.zk_ids.get(topic), dict(build.replicas_per_id.get(topic) or {})))
    return None


def _split_entry(f: Mapping[str, Any], zk_id: str | None, on_disk: dict[str, int]) -> dict[str, Any]:
    """A topic-id-split in the plan: no file action of its own. With a ZooKeeper ID its replicas that differ from it
    are topic-id-mismatch findings (acted on there); without one no side can be called right: a decision for a human
    (which ID to keep: ``topic_ids``, each held by ``replicas_per_id[id]`` replicas in the audit's probe), and nothing
    of the topic is touched."""
    entry = _skipped(f)
    if zk_id:
        why = "no action of its own: the replicas that differ from ZooKeeper's topic ID are its topic-id-mismatches"
        return entry | {"why": why}
    why = (
        "a decision for a human: ZooKeeper has no topic ID for the topic and its replicas hold several; which one to "
        "keep is not the plan's to choose, so it touches none of them"
    )
    counts = {i: on_disk[i] for i in sorted(on_disk)}
    decision = {"decision": "which topic ID to keep", "topic_ids": list(counts), "replicas_per_id": counts}
    return entry | {"why": why} | decision


def _skipped(f: Mapping[str, Any]) -> dict[str, Any]:
    return {k: f.get(k) for k in ("rule", "broker_id", "topic", "partition", "path")}


def _partition_dir(f: Mapping[str, Any]) -> str:
    path = f.get("path") or ""
    name = path.rsplit("/", 1)[-1]
    if name in (PARTITION_METADATA, LEADER_EPOCH_CHECKPOINT) or name[:20].isdigit():
        return path.rsplit("/", 1)[0]
    return path


def _in_scope(f: Mapping[str, Any], scope: Mapping[str, Any]) -> bool:
    if scope.get("rules") and f["rule"] not in scope["rules"]:
        return False
    if scope.get("brokers") and f.get("broker_id") not in scope["brokers"]:
        return False
    return not (scope.get("topics") and f.get("topic") not in scope["topics"])


# --------------------------------------------------------------------------------------------
def build_plan(
    cluster: str,
    audit_run: str,
    findings: Iterable[Mapping[str, Any]],
    facts: FleetFacts,
    *,
    rules: Iterable[str] = (),
    brokers: Iterable[int] = (),
    topics: Iterable[str] = (),
    hold_out: Iterable[int] = (),
    include_internal: bool = False,
    gates: Mapping[str, Any] | None = None,
    static_min_isr: int | None = None,
    kraft: bool = False,
    metadata_log_dirs: Iterable[str] = (),
) -> Plan:
    """The plan for ``findings`` of one audit run, whole and frozen. The scope (``rules``, ``brokers``, ``topics``,
    ``hold_out``, ``include_internal``) and ``gates`` (the form's values that decide how carefully it runs:
    ``repair.gates.gates_of``; None: none recorded) are part of the hash: the approver sees them. The risk line is
    counted with ZooKeeper's cluster-wide ``min.insync.replicas`` as the audit's snapshot read it, over
    ``static_min_isr`` (``repair.gates.static_min_isr``); the pre-check reads it again before each stop. ``kraft``:
    the cluster is a KRaft one (``metadata_log_dirs``: its voters' metadata log dirs): every action Kafka's design
    refuses there (``repair.kraft_refusals``) is left out, in ``skipped`` with the refusal that says why and what to
    do instead, and so is every ZooKeeper write."""
    named = sorted(set(topics))
    illegal = [t for t in named if not legal_topic(t)]
    if illegal:  # the form's topics are split on commas by the page: a name that is not Kafka's is not a topic
        raise RepairError(
            f"topics {illegal[:5]}: not Kafka topic names (letters, digits, '.', '_', '-', at most 249): the scope "
            "is refused, nothing was planned"
        )
    scope: dict[str, Any] = {
        "rules": sorted(set(rules)),
        "brokers": sorted(set(brokers)),
        "topics": sorted(set(topics)),
        "hold_out": sorted(set(hold_out)),
        "include_internal": include_internal,
    }
    if gates is not None:
        scope["gates"] = dict(gates)
    if facts.cluster_id:  # the cluster this plan is for: the repair refuses another (``session.lock_key``)
        scope["cluster_id"] = facts.cluster_id
    if kraft:  # what the approver reads about the lock, the gates and the refusals (approval_text)
        scope["metadata_mode"] = "kraft"
    held = set(scope["hold_out"])
    build = _Build(facts, include_internal, kraft)
    for f in findings:
        if f.get("status") == FindingStatus.RESOLVED or not _in_scope(f, scope):
            continue
        bid = f.get("broker_id")
        if bid is not None and bid in held:
            why: str | None = "broker held out of this run"
        else:
            rule = RULES_BY_ID.get(f["rule"])  # a rule id the registry does not know: report only
            why = PLANNERS[rule.remediation](build, f) if rule else "report only"
        if why:
            build.skipped.append(_skipped(f) | {"why": why})
    if kraft:
        _refuse_on_kraft(build, list(metadata_log_dirs), cluster)
    _leftovers_only_where_a_restart_is_due(build)
    controller = facts.controller
    plans = []
    for bid in sorted(set(build.actions) | {b for b in facts.probe if b not in held}):
        acts = sorted(build.actions.get(bid, {}).values(), key=lambda a: (a.path, a.action))
        # existing files only: a quarantine of an index that is already missing would fail the backup
        acts = [a for a in acts if build.exists(bid, a.path)]
        preview = restart_preview(facts.probe.get(bid, []), build.quarantined.get(bid, set()))
        plans.append(BrokerPlan(bid, bid == controller, bool(acts), tuple(acts), preview))
    # restarts first; among them brokers already out of ISR first (restarting them costs no replica), the controller
    # last
    lagging = facts.out_of_isr()
    plans.sort(key=lambda b: (b.broker_id not in lagging, b.broker_id))
    plans = sorted(controller_last(plans, controller), key=lambda b: not b.restart)
    zk_actions = [
        ZkAction("restore-topic-id", t, next(iter(ids)), "every replica holds this topic ID; the znode has none")
        for t, ids in sorted(build.zk_topic_ids.items())
        if len(ids) == 1
    ]
    known, cluster_default = facts.cluster_default_min_isr()
    restarted = [b.broker_id for b in plans if b.restart]
    risk = restart_risk(facts, restarted, static_min_isr, cluster_default, known)
    return Plan(cluster, audit_run, scope, tuple(plans), tuple(zk_actions), tuple(build.skipped), risk)


def _leftovers_only_where_a_restart_is_due(build: _Build) -> None:
    """A broker that was running at the audit and has nothing to repair but leftovers is not restarted for them: its
    ``.deleted`` files are retention's and the cleaner's, deleted by the broker itself after ``file.delete.delay.ms``,
    and a ``.cleaned`` one is the cleaner at work. Its leftovers go into ``skipped`` with that reason. A stopped broker
    (its next start would delete them) or one the plan restarts anyway has them moved aside."""
    for bid, actions in build.actions.items():
        leftovers = [a for a in actions.values() if a.action == "quarantine" and leftover_file(a.path)]
        others = [a for a in actions.values() if a not in leftovers and build.exists(bid, a.path)]
        if not leftovers or others or not _was_running(build.facts.probe.get(bid, [])):
            continue
        for a in leftovers:
            del actions[a.path]
            why = (
                "left alone: the broker was running at the audit and has nothing else to repair; a running broker "
                "deletes its .deleted files itself (file.delete.delay.ms) and a .cleaned file is its cleaner at work, "
                "so a restart just to move them aside is not planned"
            )
            entry = {"rule": a.rule, "broker_id": bid, "topic": a.topic, "partition": a.partition, "path": a.path}
            build.skipped.append(entry | {"why": why})


def _was_running(records: list[dict[str, Any]]) -> bool:
    """The broker held its log dirs' lock when the audit probed it (a running Kafka)."""
    return any(r.get("lock_held_by_pid") for r in records if r.get("kind") == "logdir")


def _refuse_on_kraft(build: _Build, metadata_log_dirs: list[str], cluster: str) -> None:
    """Take out of the build what a KRaft cluster refuses (``kraft_refusals``), each into ``skipped`` with its
    refusal: a file action Kafka's design forbids there, and any ZooKeeper write."""
    for bid, actions in build.actions.items():
        for path, a in list(actions.items()):
            why = action_refusal(a, metadata_log_dirs)
            if why is not None:
                del actions[path]
                entry = {"rule": a.rule, "broker_id": bid, "topic": a.topic, "partition": a.partition, "path": path}
                build.skipped.append(entry | {"why": why})
    for topic in sorted(build.zk_topic_ids):
        entry = {"rule": None, "broker_id": None, "topic": topic, "partition": None, "path": None}
        build.skipped.append(entry | {"why": zookeeper_write_refusal(cluster)})
    build.zk_topic_ids.clear()


_UNPLANNED = {r.remediation for r in RULES_BY_ID.values()} - set(PLANNERS)
if _UNPLANNED:  # a remediation of the registry without its planner fails at import, not in a repair
    raise RuntimeError(f"no planner for remediation(s) {sorted(m.value for m in _UNPLANNED)}")
