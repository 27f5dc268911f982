"""Repair plans: what a repair will do, as data, content-addressed, rendered for the approver.

A plan is built from one audit run's findings (``history/audit_run=<run>/findings.jsonl``), its staged probe
output (for the restart preview) and its ZooKeeper snapshot (the controller, the topic IDs). It says, per
broker, exactly which files are backed up and then removed (``partition.metadata`` and
``leader-epoch-checkpoint`` of replicas whose topic ID differs from ZooKeeper's: kafka-reference.md §6, the repair
of KAFKA-14190) or quarantined (the index files of the index rules: moved aside, never deleted; Kafka rebuilds
them at start, §1.4), whether the broker restarts, and the restart order: the active controller last. Each
restart carries a preview of the log recovery it will cost. Preventive ZooKeeper actions (restoring a dropped
``topic_id`` every replica agrees on) are listed separately and need their own approval.

The plan's hash is the SHA-256 of its canonical JSON (sorted keys, no timestamps): the same fleet and the same
findings give the same hash, so "what runs is what was approved" can be checked right before acting.
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from fleet_doctor.audit.staging import load_probe, probe_key, staged_brokers
from fleet_doctor.probe import LEADER_EPOCH_CHECKPOINT, PARTITION_METADATA
from fleet_doctor.rules import Remediation, get, rule_ids_with
from fleet_doctor.store import Store

# what the plan does for a finding is its rule's remediation in the registry (fleet_doctor.rules)
TOPIC_ID_RULES = rule_ids_with(Remediation.REMOVE_TOPIC_ID_FILES)
INDEX_RULES = rule_ids_with(Remediation.QUARANTINE_INDEX)
ZK_TOPIC_ID_RULES = rule_ids_with(Remediation.RESTORE_ZK_TOPIC_ID)
# report-only, but the plan says what it means for the repair: with a ZooKeeper ID its odd replicas are the
# topic-id-mismatch findings; without one, which ID to keep is a decision for a human (RULES.md, "Remediation")
TOPIC_ID_SPLIT = get("topic-id-split").id
INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state"})
RECOVERY_BYTES_PER_S = 100 * 1024 * 1024  # rough log recovery rate (batch walk + index rebuild) for the preview
# in the partition dir: a rename on one filesystem, and log loading skips directories there; never in the log dir
# itself, where Kafka refuses to start on a directory that is not a partition dir (the lost+found trap)
QUARANTINE_DIR = "fleet-doctor-quarantine"
_BACKTICKS = re.compile(r"`+")
HASH_LINE = "Plan hash: `{}`"  # the last line of both approval texts: the acting task checks it (repair.approval)
_HASH_LINES = re.compile(r"^Plan hash: `([0-9a-f]{64})`$", re.MULTILINE)
_SHOWN_AS = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _visible(ch: str) -> str:
    """A character that could start a new line or hide what follows (control, format such as a right-to-left
    override, line and paragraph separators) as its escape: ``\\n``, ``\\x1b``, ``\\u202e``."""
    if unicodedata.category(ch) not in ("Cc", "Cf", "Zl", "Zp"):
        return ch
    return _SHOWN_AS.get(ch) or (f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}")


def plain(text: object) -> str:
    """A value for one line of plain text (the approval's subject): control characters shown as escapes."""
    return "".join(map(_visible, str(text)))


def md_cell(text: object, table: bool = True) -> str:
    """A value that comes from a broker (a path, a topic, a topic ID; any name on a broker's disk) as a Markdown
    code span that stays one inline value whatever it holds: inside a code span Markdown and HTML are literal
    (``<script>``, ``[x](javascript:...)``, ``**``), control characters and line breaks are shown as escapes, the
    fence is one backtick longer than any run of backticks inside, and in a table row ``|`` is escaped (GFM splits
    cells on a bare pipe even inside a code span)."""
    s = plain(text)
    if not s:
        return "(empty)"
    if table:
        s = s.replace("|", "\\|")
    fence = "`" * (max((len(m) for m in _BACKTICKS.findall(s)), default=0) + 1)
    pad = " " if s.startswith("`") or s.endswith("`") or (s.startswith(" ") and s.endswith(" ")) else ""
    return f"{fence}{pad}{s}{pad}{fence}"


@dataclass(frozen=True)
class FileAction:
    action: str  # "remove" (after backup) or "quarantine" (moved aside)
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


@dataclass
class BrokerPlan:
    broker_id: int
    is_controller: bool
    restart: bool
    actions: list[FileAction] = field(default_factory=list)
    preview: RestartPreview | None = None

    @property
    def backup_paths(self) -> list[str]:
        return sorted({a.path for a in self.actions})


@dataclass(frozen=True)
class ZkAction:
    action: str  # "restore-topic-id"
    topic: str
    topic_id: str
    reason: str


@dataclass
class Plan:
    cluster: str
    audit_run: str
    scope: dict[str, Any]
    brokers: list[BrokerPlan]  # in restart order: the controller last
    zookeeper: list[ZkAction]
    skipped: list[dict[str, Any]]  # findings in scope that no action addresses, with why

    def canonical(self) -> dict[str, Any]:
        """What the approver approves: cluster, scope, the per-broker actions and order, the ZooKeeper actions.
        Not the audit run id nor the restart previews (log sizes move on a live broker): a re-verification
        against a fresh probe gives the same hash exactly when the same files would be touched in the same order."""
        return {
            "cluster": self.cluster,
            "scope": self.scope,
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
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Plan:
        d = json.loads(text)
        brokers = [
            BrokerPlan(
                b["broker_id"],
                b["is_controller"],
                b["restart"],
                [FileAction(**a) for a in b["actions"]],
                RestartPreview(**b["preview"]) if b.get("preview") else None,
            )
            for b in d["brokers"]
        ]
        return cls(
            d["cluster"], d["audit_run"], d["scope"], brokers, [ZkAction(**z) for z in d["zookeeper"]], d["skipped"]
        )

    def canonical_json(self) -> str:
        return json.dumps(self.canonical(), sort_keys=True, separators=(",", ":"))

    @property
    def hash(self) -> str:
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()

    @property
    def decisions(self) -> list[dict[str, Any]]:
        """The findings the plan leaves to a human to decide (a topic-id-split without a ZooKeeper ID: which topic ID
        to keep): each a ``skipped`` entry with ``decision`` (what to decide) and ``topic_ids`` (the choices)."""
        return [s for s in self.skipped if s.get("decision")]

    @property
    def restart_order(self) -> list[int]:
        return [b.broker_id for b in self.brokers if b.restart]

    def counts(self) -> dict[str, int]:
        return {
            "brokers_restarted": len(self.restart_order),
            "files_removed": sum(a.action == "remove" for b in self.brokers for a in b.actions),
            "files_quarantined": sum(a.action == "quarantine" for b in self.brokers for a in b.actions),
            "zookeeper_actions": len(self.zookeeper),
        }

    def subject(self) -> str:
        c = self.counts()
        return (
            f"Kafka repair {plain(self.cluster)} plan {self.hash[:12]}: restart {c['brokers_restarted']} broker(s), "
            f"remove {c['files_removed']} and quarantine {c['files_quarantined']} file(s)"
        )

    def zookeeper_subject(self) -> str:
        return (
            f"Kafka repair {plain(self.cluster)} plan {self.hash[:12]}: write back the topic ID of "
            f"{len(self.zookeeper)} topic(s) in ZooKeeper (preventive)"
        )

    def zookeeper_markdown(self) -> str:
        if not self.zookeeper:
            return "No ZooKeeper action in this plan.\n"
        out = [
            f"### Preventive ZooKeeper repair, plan `{self.hash[:12]}`, cluster {md_cell(self.cluster, table=False)}",
            "",
            "Each topic znode below has lost its `topic_id` (a pre-2.8 admin tool rewrote it) while every replica's "
            "`partition.metadata` agrees on one ID. The next controller failover would mint a **new** ID and every "
            "replica would go out of ISR (KAFKA-14190). Approving writes the agreed ID back with a version-checked "
            "update, after re-reading every replica; no broker restarts.",
            "",
            "| topic | topic ID written | why |",
            "|---|---|---|",
        ]
        out += [f"| {md_cell(z.topic)} | {md_cell(z.topic_id)} | {z.reason} |" for z in self.zookeeper]
        out += ["", "Undo: remove the `topic_id` field from the znode again (e.g. with zookeeper-shell `set`)."]
        return "\n".join([*out, "", self.hash_line()]) + "\n"

    def hash_line(self) -> str:
        """The full plan hash, in both approval texts: the task that acts checks the answer was given to it."""
        return HASH_LINE.format(self.hash)

    def to_markdown(self) -> str:
        c = self.counts()
        out = [
            f"### Repair plan `{self.hash[:12]}` for cluster {md_cell(self.cluster, table=False)} "
            f"(audit run {md_cell(self.audit_run, table=False)})",
            "",
            f"Restart order (one broker at a time, the active controller last): "
            f"**{' → '.join(map(str, self.restart_order)) or 'none'}**. "
            f"{c['files_removed']} file(s) backed up and removed, {c['files_quarantined']} quarantined "
            f"(moved to `<partition dir>/{QUARANTINE_DIR}/<plan>/`), every file backed up first.",
            "",
            *self._gates_lines(),
            "| order | broker | controller | last stop clean | above recovery point | indexes rebuilt "
            "| est. recovery |",
            "|---:|---:|---|---|---:|---:|---:|",
        ]
        for i, b in enumerate(self.brokers, 1):
            p = b.preview
            if p is None:
                continue
            clean = "running" if p.running else ("yes" if p.last_stop_clean else "**no**")
            if p.untrimmed_indexes_with_marker:
                clean = f"marker, but **{p.untrimmed_indexes_with_marker} untrimmed index(es)**: killed mid-load"
            out.append(
                f"| {i if b.restart else '-'} | {b.broker_id} | {'**yes**' if b.is_controller else ''} | {clean} | "
                f"{p.segments_above_recovery_point} seg, {_mib(p.bytes_above_recovery_point)} | "
                f"{p.indexes_rebuilt} ({_mib(p.bytes_to_rebuild)}) | {p.estimated_recovery_s:.0f} s |"
            )
        for b in self.brokers:
            if not b.actions:
                continue
            out += ["", f"**Broker {b.broker_id}**", "", "| action | file | rule | why |", "|---|---|---|---|"]
            for a in b.actions:
                out.append(f"| {a.action} | {md_cell(a.path)} | {md_cell(a.rule)} | {a.reason} |")
        if self.zookeeper:
            out += [
                "",
                "**ZooKeeper (preventive, separate approval)**",
                "",
                "| action | topic | topic ID |",
                "|---|---|---|",
            ]
            out += [f"| {z.action} | {md_cell(z.topic)} | {md_cell(z.topic_id)} |" for z in self.zookeeper]
        if self.skipped:
            out += ["", f"Not addressed by this plan: {len(self.skipped)} finding(s) (report only or out of scope)."]
        return "\n".join([*out, "", self.hash_line()]) + "\n"

    def _gates_lines(self) -> list[str]:
        """The run's gates as approved (part of the hash): a second person sees what the first one set."""
        gates = self.scope.get("gates") or {}
        if not gates:
            return []
        shown = ", ".join(f"`{k}` {md_cell(v, table=False)}" for k, v in sorted(gates.items()))
        return [f"Gates: {shown}.", ""]


def hashes_in(markdown: str) -> list[str]:
    """The plan hashes an approval text names on a line of its own (``Plan hash: `...```): a value from a broker
    never starts a line there (``md_cell`` shows line breaks as escapes)."""
    return _HASH_LINES.findall(markdown)


def _mib(n: int) -> str:
    return f"{n / 1048576:.1f} MiB"


# --------------------------------------------------------------------------------------------
@dataclass
class FleetFacts:
    """What the plan needs from one audit run: per broker the probe records, and the ZooKeeper snapshot."""

    probe: dict[int, list[dict[str, Any]]]
    zk: list[dict[str, Any]]

    @classmethod
    def load(cls, store: Store, run_key: str) -> FleetFacts:
        """The staged probe output of every broker of the audit run at ``run_key``, and its ZooKeeper snapshot."""
        probe = {bid: load_probe(store, probe_key(run_key, bid)) for bid in staged_brokers(store, run_key)}
        return cls(probe, store.read_jsonl(f"{run_key}/zk.jsonl"))

    @property
    def controller(self) -> int | None:
        for r in self.zk:
            if r.get("kind") == "cluster":
                return r.get("controller_id")
        return None

    def out_of_isr(self) -> set[int]:
        """Brokers that are an assigned replica of some partition but not in its ISR."""
        replicas = {r["topic"]: r.get("partitions") or {} for r in self.zk if r.get("kind") == "topic"}
        out = set()
        for r in self.zk:
            if r.get("kind") == "partition_state" and r.get("isr") is not None:
                assigned = replicas.get(r["topic"], {}).get(str(r["partition"])) or []
                out |= set(assigned) - set(r["isr"])
        return out

    def zk_topic_ids(self) -> dict[str, str | None]:
        return {r["topic"]: r.get("topic_id") for r in self.zk if r.get("kind") == "topic"}


def restart_preview(records: list[dict[str, Any]], quarantined_segments: set[tuple[str, int]]) -> RestartPreview:
    """What the broker's next start costs (kafka-reference.md §2.4, §1.4): after an unclean stop the segments
    from the one holding the recovery point are recovered; segments whose index is gone are rebuilt either way."""
    logdirs = [r for r in records if r.get("kind") == "logdir"]
    running = any(r.get("lock_held_by_pid") for r in logdirs)
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


def _in_scope(f: dict[str, Any], scope: dict[str, Any]) -> bool:
    if scope.get("rules") and f["rule"] not in scope["rules"]:
        return False
    if scope.get("brokers") and f.get("broker_id") not in scope["brokers"]:
        return False
    return not (scope.get("topics") and f.get("topic") not in scope["topics"])


def build_plan(
    cluster: str,
    audit_run: str,
    findings: Iterable[dict[str, Any]],
    facts: FleetFacts,
    *,
    rules: Iterable[str] = (),
    brokers: Iterable[int] = (),
    topics: Iterable[str] = (),
    hold_out: Iterable[int] = (),
    include_internal: bool = False,
) -> Plan:
    scope = {
        "rules": sorted(set(rules)),
        "brokers": sorted(set(brokers)),
        "topics": sorted(set(topics)),
        "hold_out": sorted(set(hold_out)),
        "include_internal": include_internal,
    }
    held = set(scope["hold_out"])
    controller = facts.controller
    actions: dict[int, dict[str, FileAction]] = defaultdict(dict)
    quarantined: dict[int, set[tuple[str, int]]] = defaultdict(set)
    skipped: list[dict[str, Any]] = []
    restore: dict[str, set[str]] = defaultdict(set)
    zk_ids = facts.zk_topic_ids()
    # the probe records, indexed once: partition dir -> partition record, (dir, base offset) -> segment record
    partitions: dict[tuple[int, str], dict[str, Any]] = {}
    segments: dict[tuple[int, str, int], dict[str, Any]] = {}
    topic_ids_on_disk: dict[str, set[str]] = defaultdict(set)
    for bid, recs in facts.probe.items():
        for r in recs:
            if r.get("kind") == "partition":
                partitions[(bid, r["path"])] = r
                if r.get("topic_id"):
                    topic_ids_on_disk[r["topic"]].add(r["topic_id"])
            elif r.get("kind") == "segment":
                segments[(bid, r["path"], r["base_offset"])] = r
    replica_ids = {key: r.get("topic_id") for key, r in partitions.items()}
    for f in findings:
        if f.get("status") in ("resolved",) or not _in_scope(f, scope):
            continue
        bid = f.get("broker_id")
        why = None
        if bid is not None and bid in held:
            why = "broker held out of this run"
        elif f["rule"] in TOPIC_ID_RULES:
            pdir = _partition_dir(f)
            on_disk = replica_ids.get((bid, pdir))
            in_zk = zk_ids.get(f.get("topic") or "")
            if f.get("topic") in INTERNAL_TOPICS and not include_internal:
                why = "internal topic (include_internal is off)"
            elif not in_zk:
                why = "ZooKeeper has no topic ID to converge on (restore it first)"
            elif on_disk == in_zk:
                why = "this replica already holds ZooKeeper's topic ID"
            else:
                for name in (PARTITION_METADATA, LEADER_EPOCH_CHECKPOINT):
                    p = f"{pdir}/{name}"
                    actions[bid][p] = FileAction(
                        "remove",
                        p,
                        f["rule"],
                        f.get("topic"),
                        f.get("partition"),
                        "the broker re-creates it from ZooKeeper's topic ID at its next start (KAFKA-14190 repair)",
                    )
        elif f["rule"] in INDEX_RULES and f.get("segment") is not None:
            pdir = _partition_dir(f)
            for ext in ("index", "timeindex"):
                p = f"{pdir}/{f['segment']:020d}.{ext}"
                actions[bid].setdefault(
                    p,
                    FileAction(
                        "quarantine",
                        p,
                        f["rule"],
                        f.get("topic"),
                        f.get("partition"),
                        "moved aside; Kafka rebuilds the segment's indexes at start",
                    ),
                )
            quarantined[bid].add((pdir, f["segment"]))
        elif f["rule"] in ZK_TOPIC_ID_RULES:
            restore[f["topic"]] |= topic_ids_on_disk.get(f["topic"], set())
            continue
        elif f["rule"] == TOPIC_ID_SPLIT:
            skipped.append(_split_entry(f, zk_ids.get(f.get("topic") or ""), topic_ids_on_disk.get(f.get("topic"))))
            continue
        else:
            why = "report only"
        if why:
            skipped.append({k: f.get(k) for k in ("rule", "broker_id", "topic", "partition", "path")} | {"why": why})
    # existing files only: a quarantine of an index that is already missing would fail the backup
    plans = []
    for bid in sorted(set(actions) | {b for b in facts.probe if b not in held}):
        acts = sorted(actions.get(bid, {}).values(), key=lambda a: (a.path, a.action))
        acts = [a for a in acts if _exists_in_probe(bid, a.path, partitions, segments)]
        plans.append(
            BrokerPlan(
                broker_id=bid,
                is_controller=bid == controller,
                restart=bool(acts),
                actions=acts,
                preview=restart_preview(facts.probe.get(bid, []), quarantined.get(bid, set())),
            )
        )
    # restarts first; among them brokers already out of ISR first (restarting them costs no replica), the controller
    # last
    lagging = facts.out_of_isr()
    plans.sort(key=lambda b: (b.broker_id not in lagging, b.broker_id))
    plans = sorted(controller_last(plans, controller), key=lambda b: not b.restart)
    zk_actions = [
        ZkAction("restore-topic-id", t, next(iter(ids)), "every replica holds this topic ID; the znode has none")
        for t, ids in sorted(restore.items())
        if len(ids) == 1
    ]
    return Plan(cluster, audit_run, scope, plans, zk_actions, skipped)


def _split_entry(f: dict[str, Any], zk_id: str | None, on_disk: set[str] | None) -> dict[str, Any]:
    """A topic-id-split in the plan: no file action of its own. With a ZooKeeper ID its replicas that differ from it
    are topic-id-mismatch findings (acted on there); without one no side can be called right: a decision for a human
    (which ID to keep), and nothing of the topic is touched."""
    entry = {k: f.get(k) for k in ("rule", "broker_id", "topic", "partition", "path")}
    if zk_id:
        why = "no action of its own: the replicas that differ from ZooKeeper's topic ID are its topic-id-mismatches"
        return entry | {"why": why}
    why = (
        "a decision for a human: ZooKeeper has no topic ID for the topic and its replicas hold several; which one to "
        "keep is not the plan's to choose, so it touches none of them"
    )
    return entry | {"why": why, "decision": "which topic ID to keep", "topic_ids": sorted(on_disk or ())}


def controller_last(brokers: list[BrokerPlan], controller: int | None) -> list[BrokerPlan]:
    """``brokers`` in their order, the controller moved last (Strimzi, Cruise Control: restarting the active
    controller forces an election and every broker reloads metadata; kafka-reference.md §7)."""
    return sorted(brokers, key=lambda b: b.broker_id == controller)


def _partition_dir(f: dict[str, Any]) -> str:
    path = f.get("path") or ""
    name = path.rsplit("/", 1)[-1]
    if name in (PARTITION_METADATA, LEADER_EPOCH_CHECKPOINT) or name[:20].isdigit():
        return path.rsplit("/", 1)[0]
    return path


def _exists_in_probe(
    bid: int,
    path: str,
    partitions: dict[tuple[int, str], dict[str, Any]],
    segments: dict[tuple[int, str, int], dict[str, Any]],
) -> bool:
    """The file was there when the audit probed (the backup step re-checks on the broker)."""
    pdir, _, name = path.rpartition("/")
    if name == PARTITION_METADATA:
        return bool(partitions.get((bid, pdir), {}).get("partition_metadata_present"))
    if name == LEADER_EPOCH_CHECKPOINT:
        return bool(partitions.get((bid, pdir), {}).get("leader_epoch_present"))
    if name[:20].isdigit():
        return bool(segments.get((bid, pdir, int(name[:20])), {}).get(f"has_{name[21:]}"))
    return False
