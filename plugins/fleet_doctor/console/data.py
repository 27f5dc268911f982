"""What the Kafka fleet view shows, read from the published audit only (``fleet_doctor.audit.history.publish``'s
layout in the store): ``history/runs.jsonl`` (one row per run, oldest first), the latest run's
``history/audit_run=<run>/findings.jsonl`` (every finding with its status new / persisting / unverified /
resolved) and its summary ``reports/<run>.json``. One store holds one deployment's history: its summaries name
the cluster."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from fleet_doctor.finding_groups import FindingGroup, group_findings
from fleet_doctor.repair.plan import INDEX_RULES, INTERNAL_TOPICS, TOPIC_ID_RULES, ZK_TOPIC_ID_RULES
from fleet_doctor.rules import RULES, Remediation, severity_rank
from fleet_doctor.store import Store

REPORT_ONLY = Remediation.REPORT_ONLY.value
REPAIR_DAG = "kafka_fleet_repair"
RESTORE_DAG = "kafka_fleet_restore"
APPROVAL_DAGS = (REPAIR_DAG, RESTORE_DAG)  # the DAGs whose runs wait for a person's approval (Required Actions)
PREFIX = "kafka-fleet"  # the app's mount (/kafka-fleet) and the nav entry's in-app route (/plugin/kafka-fleet)


def in_airflow(page: str = "") -> str:
    """The path, relative to Airflow's base URL, that opens one of the view's pages inside Airflow's UI (the nav
    entry's route, then the page as Airflow mirrors it): ``in_airflow(f"repair?{scope.query()}")`` is
    ``plugin/kafka-fleet/kafka-fleet/repair?rule=...``, for links from outside (the report, an alert)."""
    return f"plugin/{PREFIX}/{PREFIX}/{page}"


ACTIVE = ("new", "persisting", "unverified")


@dataclass(frozen=True)
class FleetView:
    """The latest published audit of one store and the runs before it."""

    store_url: str
    runs: list[dict[str, Any]]  # history/runs.jsonl, oldest first (all of it: the page shows the last N)
    summary: dict[str, Any] | None  # reports/<latest>.json; None when there is no run yet
    rows: list[dict[str, Any]] = field(default_factory=list)  # the latest run's findings, every status
    missing_summary: bool = False  # the history names a run whose summary is not in the store

    @property
    def latest(self) -> str | None:
        return self.runs[-1]["audit_run"] if self.runs else None

    @property
    def groups(self) -> list[FindingGroup]:
        """The findings still standing (new, persisting, unverified), one group per (broker, rule, cause)."""
        return group_findings(r for r in self.rows if r.get("status") in ACTIVE)

    @property
    def resolved(self) -> list[FindingGroup]:
        """The previous run's findings that this run no longer sees."""
        return group_findings(r for r in self.rows if r.get("status") == "resolved")

    def run_ids(self) -> set[str]:
        return {str(r["audit_run"]) for r in self.runs}


def load_view(store: Store) -> FleetView:
    """The store's latest audit. Raises ``StoreError`` (naming the object) when it cannot be read."""
    runs = [r for r in store.read_jsonl("history/runs.jsonl") if r.get("audit_run")]
    if not runs:
        return FleetView(store.url(), [], None)
    latest = str(runs[-1]["audit_run"])
    summary = store.read_json(f"reports/{latest}.json")
    rows = store.read_jsonl(f"history/audit_run={latest}/findings.jsonl")
    if not isinstance(summary, dict):  # published only in part: what the history row says
        return FleetView(store.url(), runs, dict(runs[-1]), rows, missing_summary=True)
    return FleetView(store.url(), runs, summary, rows)


def broker_label(broker_id: Any) -> str:
    return "cluster" if broker_id is None else str(broker_id)


def is_repairable(group: FindingGroup) -> bool:
    """A group the repair DAG acts on: its rule's remediation is not report-only."""
    return bool(group.remediation) and group.remediation != REPORT_ONLY


@dataclass(frozen=True)
class RepairScope:
    """The repair DAG's scope params (``dags/kafka_fleet_repair.py``) a repair link pre-fills. ``include_internal``
    is never inferred from the topics: only a person ticks it (PRODUCT.md, internal topics are repaired only when
    explicitly included); ``internal_topics_note`` says what the repair does with the internal topics it names."""

    rules: tuple[str, ...] = ()
    brokers: tuple[int, ...] = ()
    topics: tuple[str, ...] = ()
    include_internal: bool = False
    dry_run: bool = False
    audit_run: str = "latest"

    @classmethod
    def of_group(cls, group: FindingGroup) -> RepairScope:
        return cls(
            rules=(group.rule,),
            brokers=() if group.broker_id is None else (int(group.broker_id),),
            topics=tuple(group.topics),
        )

    @classmethod
    def from_query(cls, query: Iterable[tuple[str, str]]) -> tuple[RepairScope, list[str]]:
        """The scope in a repair page's query (repeatable ``rule``, ``broker``, ``topic``; ``include_internal``,
        ``dry_run``, ``audit_run``) and what in it was not usable (a broker id that is not a number)."""
        values: dict[str, list[str]] = defaultdict(list)
        for key, value in query:
            values[key].append(value)
        problems = []
        brokers = []
        for b in values["broker"]:
            try:
                brokers.append(int(b))
            except ValueError:
                problems.append(f"broker {b!r} is not a broker id (a number): left out")
        scope = cls(
            rules=tuple(dict.fromkeys(values["rule"])),
            brokers=tuple(dict.fromkeys(brokers)),
            topics=tuple(dict.fromkeys(values["topic"])),
            include_internal=_flag(values["include_internal"]),
            dry_run=_flag(values["dry_run"]),
            audit_run=(values["audit_run"] or ["latest"])[-1] or "latest",
        )
        return scope, problems

    @property
    def internal_topics(self) -> tuple[str, ...]:
        """The internal topics (``__consumer_offsets``, ``__transaction_state``) the scope's topics name."""
        return tuple(t for t in self.topics if t in INTERNAL_TOPICS)

    def internal_topics_note(self) -> str | None:
        """What the repair will do with the internal topics the scope names while *include internal topics* is not
        ticked (None: it names none, or the box is ticked). As ``repair.plan.build_plan`` does it: the topic-ID
        repair leaves an internal topic's replicas alone (the approval lists them as not addressed), while a
        quarantine of broken index files and a restore of ZooKeeper's topic ID do not depend on the box."""
        internal = self.internal_topics
        if not internal or self.include_internal:
            return None
        rules = set(self.rules) or {r.id for r in RULES}
        out = [f"This scope names internal topics ({', '.join(internal)}) and Include internal topics is not ticked."]
        if rules & TOPIC_ID_RULES:
            out.append(
                "The topic-ID repair leaves them out unless you tick it; the approval lists their findings as not "
                "addressed: internal topic (include_internal is off)."
            )
        if rules & INDEX_RULES:
            out.append("Their broken index files are quarantined whether or not it is ticked.")
        if rules & ZK_TOPIC_ID_RULES:
            out.append("A topic ID missing from their ZooKeeper znode is restored whether or not it is ticked.")
        if len(out) == 1:
            out.append("The rules in scope do not repair them either way.")
        return " ".join(out)

    def query(self) -> str:
        """The repair page's query string for this scope (``repair?<query>``)."""
        pairs: list[tuple[str, str]] = [("rule", r) for r in self.rules]
        pairs += [("broker", str(b)) for b in self.brokers]
        pairs += [("topic", t) for t in self.topics]
        if self.include_internal:
            pairs.append(("include_internal", "1"))
        if self.dry_run:
            pairs.append(("dry_run", "1"))
        if self.audit_run != "latest":
            pairs.append(("audit_run", self.audit_run))
        return urlencode(pairs)

    def conf(self) -> dict[str, Any]:
        """The DAG run conf the repair page's form submits unchanged."""
        return {
            "audit_run": self.audit_run,
            "rules": list(self.rules),
            "brokers": list(self.brokers),
            "topics": list(self.topics),
            "include_internal": self.include_internal,
            "dry_run": self.dry_run,
        }


def _flag(values: list[str]) -> bool:
    return bool(values) and values[-1].strip().lower() in ("1", "true", "yes", "on")


def matrix(groups: Iterable[FindingGroup]) -> tuple[list[str], dict[str, dict[str, tuple[int, str]]]]:
    """Findings by rule × broker: the broker columns (ids in order, the cluster's own last) and per rule, per broker,
    (findings, worst severity)."""
    cells: dict[str, dict[str, list[FindingGroup]]] = defaultdict(lambda: defaultdict(list))
    brokers: set[Any] = set()
    for g in groups:
        cells[g.rule][broker_label(g.broker_id)].append(g)
        brokers.add(g.broker_id)
    columns = [broker_label(b) for b in sorted(brokers, key=lambda b: (b is None, b if b is not None else 0))]
    out: dict[str, dict[str, tuple[int, str]]] = {}

    def worst(rule: str) -> int:
        return min(severity_rank(g.severity) for gs in cells[rule].values() for g in gs)

    for rule in sorted(cells, key=lambda r: (worst(r), r)):
        out[rule] = {
            b: (sum(g.count for g in gs), min((g.severity for g in gs), key=severity_rank))
            for b, gs in cells[rule].items()
        }
    return columns, out


def distinct(values: Iterable[str]) -> list[tuple[str, int]]:
    """Each value once, in first-seen order, with how often it came."""
    seen: dict[str, int] = {}
    for v in values:
        seen[v] = seen.get(v, 0) + 1
    return list(seen.items())


def cluster_name(summary: Mapping[str, Any] | None) -> str:
    return str((summary or {}).get("cluster") or "(unnamed cluster)")
