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
from fleet_doctor.finding_groups import group_findings
from fleet_doctor.probe import LEADER_EPOCH_CHECKPOINT, PARTITION_METADATA
from fleet_doctor.rules import RULES_BY_ID, Remediation, get, rule_ids_with
from fleet_doctor.store import Store
from fleet_doctor.zookeeper.cluster import DEFAULT_ENTITY, KAFKA_DEFAULT_MIN_ISR, MIN_ISR

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
FILES_SHOWN = 5  # files listed per group in an approval text: the buttons come after it; plan.json has them all
ROWS_SHOWN = 10  # ZooKeeper topics and unaddressed groups listed, likewise
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
    risk: dict[str, Any] = field(default_factory=dict)  # restart_risk: for the approver, not in the hash

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
            d["cluster"],
            d["audit_run"],
            d["scope"],
            brokers,
            [ZkAction(**z) for z in d["zookeeper"]],
            d["skipped"],
            d.get("risk") or {},
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

    @property
    def dry_run(self) -> bool:
        """The plan runs as a dry run (the form's ``dry_run``, one of the gates: part of the hash)."""
        return bool((self.scope.get("gates") or {}).get("dry_run"))

    def _files(self) -> int:
        return sum(len(b.actions) for b in self.brokers)

    def approve_option(self) -> str:
        """The approval's one "yes" (an option of the request): what approving this plan does, and which plan. The
        acting task accepts exactly this answer (``repair.approval.check``), derived from the stored plan."""
        n, files = len(self.restart_order), self._files()
        if self.dry_run:
            return f"Approve dry run: {n} {_s(n, 'broker')}, nothing written (plan {self.hash[:12]})"
        return f"Approve: restart {n} {_s(n, 'broker')}, change {files} {_s(files, 'file')} (plan {self.hash[:12]})"

    def zookeeper_approve_option(self) -> str:
        n = len(self.zookeeper)
        if self.dry_run:
            return f"Approve dry run: {n} topic {_s(n, 'ID')}, nothing written (plan {self.hash[:12]})"
        return f"Approve: write {n} topic {_s(n, 'ID')} to ZooKeeper (plan {self.hash[:12]})"

    def subject(self) -> str:
        c = self.counts()
        return (
            f"Kafka repair {plain(self.cluster)} plan {self.hash[:12]}: {'DRY RUN, ' if self.dry_run else ''}"
            f"restart {c['brokers_restarted']} broker(s), remove {c['files_removed']} and quarantine "
            f"{c['files_quarantined']} file(s)"
        )

    def zookeeper_subject(self) -> str:
        return (
            f"Kafka repair {plain(self.cluster)} plan {self.hash[:12]}: {'DRY RUN, ' if self.dry_run else ''}"
            f"write back the topic ID of {len(self.zookeeper)} topic(s) in ZooKeeper (preventive)"
        )

    def hash_line(self) -> str:
        """The full plan hash, in both approval texts: the task that acts checks the answer was given to it."""
        return HASH_LINE.format(self.hash)

    def _dry_run_lines(self) -> list[str]:
        if not self.dry_run:
            return []
        return [
            "**DRY RUN: nothing will be written.** Every read and check runs and every command is logged; no file "
            "changes, no broker stops, no ZooKeeper write.",
            "",
        ]

    def _undo_line(self, plan_dir: str) -> str:
        return (
            f"- **Undo:** trigger `kafka_fleet_restore` with plan `{self.hash[:16]}`: it puts this plan's backups back "
            f"(its own approval, the controller last). Full plan: {md_cell(plan_dir + '/plan.json', table=False)}."
        )

    def zookeeper_markdown(self, plan_dir: str | None = None) -> str:
        """The text of the ZooKeeper approval: a summary first, then the topics (at most ``ROWS_SHOWN``)."""
        if not self.zookeeper:
            return "No ZooKeeper action in this plan.\n"
        where = plan_dir or f"<repairs dir>/{self.hash}"
        n = len(self.zookeeper)
        out = [
            f"### Preventive ZooKeeper repair, plan `{self.hash[:12]}`, cluster {md_cell(self.cluster, table=False)}",
            "",
            *self._dry_run_lines(),
            f"- **What:** write back the lost `topic_id` of {n} topic znode(s), the ID every replica's "
            "`partition.metadata` agrees on, with a version-checked update after re-reading every replica.",
            f"- **Where:** cluster {md_cell(self.cluster, table=False)}, ZooKeeper only: no broker restarts.",
            "- **Risk:** none to running clients. Without it, the next controller failover mints a **new** ID and "
            "every replica goes out of ISR (KAFKA-14190).",
            f"- **Undo:** remove the `topic_id` field from the znode again (zookeeper-shell `set`). Full plan: "
            f"{md_cell(where + '/plan.json', table=False)}.",
            "",
            self.hash_line(),
            "",
            "| topic | topic ID written | why |",
            "|---|---|---|",
        ]
        out += [f"| {md_cell(z.topic)} | {md_cell(z.topic_id)} | {z.reason} |" for z in self.zookeeper[:ROWS_SHOWN]]
        if n > ROWS_SHOWN:
            out += ["", f"… and {n - ROWS_SHOWN} more topic(s): full list in {md_cell(where + '/plan.json', False)}."]
        return "\n".join(out) + "\n"

    def _internal_lines(self) -> list[str]:
        """With ``include_internal`` (ticked by a person), the summary says so and names the internal topics the
        plan touches: their replicas are otherwise never part of a topic-ID repair."""
        if not self.scope.get("include_internal"):
            return []
        touched: dict[str, set[tuple[int, int | None]]] = defaultdict(set)
        for b in self.brokers:
            for a in b.actions:
                if a.topic in INTERNAL_TOPICS:
                    touched[a.topic].add((b.broker_id, a.partition))
        shown = [
            f"{md_cell(t, table=False)} ({len({p for _, p in touched[t]})} partition(s), {len(touched[t])} replica(s))"
            for t in sorted(touched)
        ]
        return [f"- **Internal topics included:** {', '.join(shown) or 'none of them is touched by this plan'}."]

    def to_markdown(self, plan_dir: str | None = None) -> str:
        """The text of the broker approval: a summary (what, where, how many, risk, the full hash, backups, undo),
        the restart preview, then the details per broker, one block per group of files (``finding_groups``), at
        most ``FILES_SHOWN`` files each, and each rule's "why" once. ``plan_dir``: where plan.json is, named for
        the full lists (the request's buttons come after the text: it stays short whatever the plan's size)."""
        c = self.counts()
        where = plan_dir or f"<repairs dir>/{self.hash}"
        order = " → ".join(map(str, self.restart_order)) or "none"
        controller = next((b.broker_id for b in self.brokers if b.is_controller), None)
        if controller is None:
            ctl = " (no active controller in the audit's snapshot)"
        elif controller in self.restart_order:
            ctl = f" (the active controller, broker {controller}, last)"
        else:
            ctl = f" (the active controller, broker {controller}, is not restarted)"
        rules = sorted({a.rule for b in self.brokers for a in b.actions})
        what = []
        if c["files_removed"]:
            what.append(f"back up and remove {c['files_removed']} topic-ID file(s)")
        if c["files_quarantined"]:
            what.append(f"quarantine {c['files_quarantined']} index file(s) (moved aside, Kafka rebuilds them)")
        out = [
            f"### Repair plan `{self.hash[:12]}` for cluster {md_cell(self.cluster, table=False)}",
            "",
            *self._dry_run_lines(),
            f"- **What:** {' and '.join(what) or 'nothing'}, then restart each changed broker, one at a time "
            f"({', '.join(md_cell(r, table=False) for r in rules) or 'no rule'}).",
            f"- **Where:** cluster {md_cell(self.cluster, table=False)}, restart order **{order}**{ctl}; from audit "
            f"run {md_cell(self.audit_run, table=False)}.",
            *self._internal_lines(),
            f"- **How many:** {c['files_removed'] + c['files_quarantined']} file(s) backed up first, "
            f"{c['files_removed']} removed, {c['files_quarantined']} quarantined; {c['brokers_restarted']} broker(s) "
            f"restarted; {len(self.skipped)} finding(s) in scope not addressed.",
            *self._risk_lines(),
            f"- **Backups:** per broker a tar.gz with a sha256 manifest, fetched to "
            f"{md_cell(where + '/attempts/<run>/broker-<id>/', table=False)} before anything changes; quarantined "
            f"files stay on the broker in `<partition dir>/{QUARANTINE_DIR}/<plan>/`.",
            self._undo_line(where),
            *self._gates_lines(),
            "",
            self.hash_line(),
            "",
            "#### Restart preview",
            "",
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
        out += self._broker_details(where)
        out += self._why_lines(rules)
        if self.zookeeper:
            n = len(self.zookeeper)
            out += ["", "#### ZooKeeper (preventive, separate approval)", "", "| action | topic | topic ID |"]
            out += ["|---|---|---|"]
            out += [f"| {z.action} | {md_cell(z.topic)} | {md_cell(z.topic_id)} |" for z in self.zookeeper[:ROWS_SHOWN]]
            if n > ROWS_SHOWN:
                out += ["", f"… and {n - ROWS_SHOWN} more topic(s) in {md_cell(where + '/plan.json', False)}."]
        out += self._skipped_lines(where)
        return "\n".join(out) + "\n"

    def _risk_lines(self) -> list[str]:
        """What the restarts may cost: partitions under min ISR (or without any other in-sync replica) while a
        broker is down, as the audit saw the ISR, and the log recovery of brokers that stopped uncleanly."""
        risks = []
        for b in self.brokers:
            if not b.restart:
                continue
            seen = (self.risk.get("brokers") or {}).get(str(b.broker_id)) or {}
            if seen.get("offline"):
                risks.append(
                    f"broker {b.broker_id} is the only in-sync replica of {seen['offline']} partition(s): they are "
                    "unavailable while it restarts"
                )
            if seen.get("under_min_isr"):
                shown = ", ".join(md_cell(t, table=False) for t in seen["under_min_isr_examples"])
                more = seen["under_min_isr"] - len(seen["under_min_isr_examples"])
                risks.append(
                    f"while broker {b.broker_id} is down, {seen['under_min_isr']} partition(s) go under "
                    f"min.insync.replicas ({shown}{f', and {more} more' if more else ''}): its pre-check halts the "
                    "run there unless their ISR has grown by then"
                )
            p = b.preview
            if p and p.last_stop_clean is False:
                risks.append(
                    f"broker {b.broker_id} stopped uncleanly: its start recovers {p.segments_above_recovery_point} "
                    f"segment(s), {_mib(p.bytes_above_recovery_point)}, est. {p.estimated_recovery_s:.0f} s"
                )
            elif p and p.untrimmed_indexes_with_marker:
                risks.append(
                    f"broker {b.broker_id} was killed while loading its logs ({p.untrimmed_indexes_with_marker} "
                    f"untrimmed index(es) despite the clean-shutdown marker): est. recovery "
                    f"{p.estimated_recovery_s:.0f} s"
                )
        if not self.risk:
            risks.append("ISR not assessed for this plan (no restart_risk)")
        elif not self.risk.get("cluster_default_known"):
            risks.append(self._unknown_default_line())
        elif not risks:
            risks.append(
                f"none seen at audit time: every partition keeps min.insync.replicas ({self.risk.get('min_isr')}, "
                f"{md_cell(self.risk.get('min_isr_source') or 'source not recorded', table=False)}, unless the "
                "topic sets its own) with any one of these brokers down; the pre-check checks again before each stop"
            )
        if len(risks) == 1:
            return [f"- **Risk:** {risks[0]}."]
        return ["- **Risk:**", *(f"  - {r}." for r in risks)]

    def _unknown_default_line(self) -> str:
        """The risk when ZooKeeper's cluster-wide min.insync.replicas was not known at plan time: said, with what
        was counted instead and the partitions it matters most for, never read as "no risk"."""
        static = self.risk.get("static_min_isr")
        assumed = (
            f"counted here with {static} (the brokers' static default, inventory or form) for topics without their "
            "own setting"
            if static
            else "no static default is set (inventory or form): Kafka's 1 unless ZooKeeper holds one"
        )
        line = (
            f"cluster default min.insync.replicas not known: the pre-check reads it (ZooKeeper's "
            f"`{CLUSTER_DEFAULT_PATH}`) before each stop and halts the run there if a partition would go under it; "
            f"{assumed}"
        )
        thin = self.risk.get("thinnest")
        if thin:
            shown = ", ".join(md_cell(t, table=False) for t in thin["examples"])
            more = thin["partitions"] - len(thin["examples"])
            n = thin["in_sync_left"]
            line += (
                f"; with one of these brokers down, {thin['partitions']} partition(s) of topics without their own "
                f"setting keep only {n} in-sync {_s(n, 'replica')} ({shown}{f', and {more} more' if more else ''}): "
                f"under min ISR if that default is above {n}"
            )
        return line

    def _broker_details(self, where: str) -> list[str]:
        """Per broker in restart order, one block per group of files (rule and action), at most ``FILES_SHOWN``."""
        out = ["", "#### Details per broker"]
        nth = {bid: i for i, bid in enumerate(self.restart_order, 1)}
        for b in self.brokers:
            if not b.actions:
                continue
            role = " (controller)" if b.is_controller else ""
            restarted = f": restarted {_ordinal(nth[b.broker_id])}" if b.broker_id in nth else ""
            out += ["", f"**Broker {b.broker_id}**{role}{restarted}"]
            for g in group_findings(_action_rows(b)):
                action = g.findings[0]["action"]
                verb = "back up and remove" if action == "remove" else action
                topics = g.topics
                shown_topics = ", ".join(md_cell(t, table=False) for t in topics[:3])
                if len(topics) > 3:
                    shown_topics += f" and {len(topics) - 3} more topic(s)"
                out += [
                    "",
                    f"{md_cell(g.rule, table=False)}: {verb} {g.count} file(s) of {g.partitions} partition(s)"
                    + (f" in {shown_topics}" if topics else ""),
                    "",
                ]
                out += [f"- {md_cell(p, table=False)}" for p in g.paths[:FILES_SHOWN]]
                if g.count > FILES_SHOWN:
                    out.append(
                        f"- … and {g.count - FILES_SHOWN} more: full list in {md_cell(where + '/plan.json', False)}"
                    )
        return out

    def _why_lines(self, rules: list[str]) -> list[str]:
        """Each rule's "why" (the registry's) and what the plan does about it, said once."""
        if not rules:
            return []
        out = ["", "#### Why, per rule", ""]
        for rule in rules:
            known = RULES_BY_ID.get(rule)
            reasons = sorted({a.reason for b in self.brokers for a in b.actions if a.rule == rule})
            why = f"{known.title}. {known.why}" if known else "not in the rule registry"
            out.append(f"- {md_cell(rule, table=False)}: {why} The plan: {'; '.join(reasons)}.")
        return out

    def _skipped_lines(self, where: str) -> list[str]:
        """The findings in scope that no action addresses: first each decision left to a human (its topic and the
        candidate topic IDs with their replica counts), then one line per group of the others (at most
        ``ROWS_SHOWN`` of each)."""
        if not self.skipped:
            return []
        out = ["", f"#### Not addressed by this plan: {len(self.skipped)} finding(s)", ""]
        out += self._decision_lines(where)
        groups = group_findings(
            {**s, "message": s.get("why") or "", "severity": _severity(str(s.get("rule")))}
            for s in self.skipped
            if not s.get("decision")
        )
        for g in groups[:ROWS_SHOWN]:
            broker = "cluster" if g.broker_id is None else f"broker {g.broker_id}"
            out.append(f"- {broker}, {md_cell(g.rule, table=False)} ×{g.count}: {plain(g.example)}")
        if len(groups) > ROWS_SHOWN:
            out.append(f"- … and {len(groups) - ROWS_SHOWN} more group(s) in {md_cell(where + '/plan.json', False)}")
        return out

    def _decision_lines(self, where: str) -> list[str]:
        """One line per decision left to a human (``decisions``): the topic, what to decide, the candidate topic IDs
        with how many replicas hold each (in the audit's probe); at most ``ROWS_SHOWN``."""
        decisions = self.decisions
        out = []
        for d in decisions[:ROWS_SHOWN]:
            held = d.get("replicas_per_id") or {}
            ids = ", ".join(
                md_cell(i, table=False) + (f" ({held[i]} {_s(held[i], 'replica')})" if i in held else "")
                for i in d.get("topic_ids") or ()
            )
            broker = "" if d.get("broker_id") is None else f" (broker {d['broker_id']})"
            out.append(
                f"- **A decision for a human:** topic {md_cell(d.get('topic'), table=False)}{broker}, "
                f"{plain(d['decision'])}: {ids or 'no topic ID seen'}. ZooKeeper has none; the plan touches none "
                "of its replicas."
            )
        if len(decisions) > ROWS_SHOWN:
            out.append(
                f"- … and {len(decisions) - ROWS_SHOWN} more decision(s) in {md_cell(where + '/plan.json', False)}"
            )
        return out

    def _gates_lines(self) -> list[str]:
        """The run's gates as approved (part of the hash): a second person sees what the first one set."""
        gates = self.scope.get("gates") or {}
        if not gates:
            return []
        shown = ", ".join(f"`{k}` {md_cell(v, table=False)}" for k, v in sorted(gates.items()))
        return [f"- **Gates:** {shown}."]


def _s(n: int, word: str) -> str:
    return word if n == 1 else f"{word}s"


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def _severity(rule: str) -> str:
    known = RULES_BY_ID.get(rule)
    return known.severity_for(None).value if known else "info"


def _action_rows(b: BrokerPlan) -> list[dict[str, Any]]:
    """A broker's file actions as rows ``finding_groups`` groups: one group per rule and action."""
    return [
        {**asdict(a), "broker_id": b.broker_id, "message": f"{a.action}: {a.reason}", "severity": _severity(a.rule)}
        for a in b.actions
    ]


CLUSTER_DEFAULT_PATH = f"/config/brokers/{DEFAULT_ENTITY}"  # ZooKeeper's cluster-wide dynamic broker config


def default_min_isr(cluster_default: int | None, static_min_isr: int | None) -> tuple[int, str]:
    """The ``min.insync.replicas`` of a topic without its own, and where it comes from, resolved as the health gates
    resolve it (``zookeeper.cluster.Cluster.cluster_min_isr``): ZooKeeper's cluster-wide default
    (``/config/brokers/<default>``), else the brokers' static default (the form's or the inventory's:
    ``tasks.static_min_isr``), else Kafka's 1."""
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
    replicas_per_id: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))  # topic -> ID -> replicas
    for bid, recs in facts.probe.items():
        for r in recs:
            if r.get("kind") == "partition":
                partitions[(bid, r["path"])] = r
                if r.get("topic_id"):
                    topic_ids_on_disk[r["topic"]].add(r["topic_id"])
                    replicas_per_id[r["topic"]][r["topic_id"]] += 1
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
            topic = f.get("topic") or ""
            skipped.append(_split_entry(f, zk_ids.get(topic), dict(replicas_per_id.get(topic) or {})))
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


def _split_entry(f: dict[str, Any], zk_id: str | None, on_disk: dict[str, int]) -> dict[str, Any]:
    """A topic-id-split in the plan: no file action of its own. With a ZooKeeper ID its replicas that differ from it
    are topic-id-mismatch findings (acted on there); without one no side can be called right: a decision for a human
    (which ID to keep: ``topic_ids``, each held by ``replicas_per_id[id]`` replicas in the audit's probe), and nothing
    of the topic is touched."""
    entry = {k: f.get(k) for k in ("rule", "broker_id", "topic", "partition", "path")}
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
