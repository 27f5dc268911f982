"""How Fleet Doctor is found in Airflow: the DAG ids, the Kafka fleet view's mount, and the repair a link pre-fills.

One definition each, read by the DAG files, the Kafka fleet view (``fleet_doctor.console``), the audit's report (its
links into Airflow) and the live tests. Nothing here imports Airflow.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

from fleet_doctor.finding_groups import FindingGroup
from fleet_doctor.rules import INTERNAL_TOPICS, RULES, Remediation, legal_topic, rule_ids_with

# the DAG kinds: each cluster of the fleet has one DAG of each, <kind>__<cluster> (fleet_doctor.fleet_dags)
AUDIT_DAG = "kafka_fleet_audit"
REPAIR_DAG = "kafka_fleet_repair"
RESTORE_DAG = "kafka_fleet_restore"
PURGE_DAG = "kafka_fleet_purge"
ROLL_DAG = "kafka_fleet_roll"
KINDS = (AUDIT_DAG, REPAIR_DAG, RESTORE_DAG, PURGE_DAG, ROLL_DAG)
SEPARATOR = "__"
REPORT_ONLY = Remediation.REPORT_ONLY.value
PREFIX = "kafka-fleet"  # the app's mount (/kafka-fleet) and the nav entry's in-app route (/plugin/kafka-fleet)


def audit_dag(cluster: str) -> str:
    """The cluster's nightly audit DAG."""
    return f"{AUDIT_DAG}{SEPARATOR}{cluster}"


def repair_dag(cluster: str) -> str:
    """The cluster's repair DAG (manual, human-approved)."""
    return f"{REPAIR_DAG}{SEPARATOR}{cluster}"


def restore_dag(cluster: str) -> str:
    """The cluster's restore DAG: a repair's backups put back."""
    return f"{RESTORE_DAG}{SEPARATOR}{cluster}"


def purge_dag(cluster: str) -> str:
    """The cluster's purge DAG: a repair's quarantine deleted, after its own approval."""
    return f"{PURGE_DAG}{SEPARATOR}{cluster}"


def roll_dag(cluster: str) -> str:
    """The cluster's rolling restart DAG (manual, human-approved)."""
    return f"{ROLL_DAG}{SEPARATOR}{cluster}"


def approval_dags(cluster: str) -> tuple[str, ...]:
    """The cluster's DAGs whose runs wait for a person's approval (Required Actions)."""
    return repair_dag(cluster), restore_dag(cluster), purge_dag(cluster), roll_dag(cluster)


def cluster_of(dag_id: str) -> tuple[str, str] | None:
    """(kind, cluster) of one of Fleet Doctor's DAG ids; None for any other DAG."""
    kind, sep, cluster = dag_id.partition(SEPARATOR)
    return (kind, cluster) if sep and kind in KINDS and cluster else None


def in_airflow(page: str = "") -> str:
    """The path, relative to Airflow's base URL, that opens one of the view's pages inside Airflow's UI (the nav
    entry's route, then the page as Airflow mirrors it): ``in_airflow(cluster_page("prod", f"repair?{query}"))`` is
    ``plugin/kafka-fleet/kafka-fleet/clusters/prod/repair?rule=...``, for links from outside (the report, an
    alert); ``in_airflow()``, the fleet overview."""
    return f"plugin/{PREFIX}/{PREFIX}/{page}"


def cluster_page(cluster: str, page: str = "") -> str:
    """One of a cluster's pages in the view, relative to its mount: ``clusters/<cluster>/<page>``."""
    return f"clusters/{quote(cluster, safe='')}/{page}"


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
    def of_rule(cls, groups: Iterable[FindingGroup]) -> RepairScope:
        """One rule's repair across every broker it was found on (``groups``: that rule's), as one plan: the topics
        of its findings when every group names some, else every topic."""
        groups = list(groups)
        rules = tuple(dict.fromkeys(g.rule for g in groups))
        topics = sorted({t for g in groups for t in g.topics}) if all(g.topics for g in groups) else []
        return cls(rules=rules, topics=tuple(topics))

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
        topics = []
        for t in values["topic"]:
            if legal_topic(t):
                topics.append(t)
            else:  # a partition dir may hold any name; the form's topics are comma-separated Kafka topic names
                problems.append(f"topic {t!r} is not a Kafka topic name: left out")
        scope = cls(
            rules=tuple(dict.fromkeys(values["rule"])),
            brokers=tuple(dict.fromkeys(brokers)),
            topics=tuple(dict.fromkeys(topics)),
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
        ticked (None: it names none, or the box is ticked). As ``repair.planner.build_plan`` does it: the topic-ID
        repair leaves an internal topic's replicas alone (the approval lists them as not addressed), while a
        quarantine of broken index files and a restore of ZooKeeper's topic ID do not depend on the box."""
        internal = self.internal_topics
        if not internal or self.include_internal:
            return None
        rules = set(self.rules) or {r.id for r in RULES}
        out = [f"This scope names internal topics ({', '.join(internal)}) and Include internal topics is not ticked."]
        if rules & rule_ids_with(Remediation.REMOVE_TOPIC_ID_FILES):
            out.append(
                "The topic-ID repair leaves them out unless you tick it; the approval lists their findings as not "
                "addressed: internal topic (include_internal is off)."
            )
        if rules & rule_ids_with(Remediation.QUARANTINE_INDEX):
            out.append("Their broken index files are quarantined whether or not it is ticked.")
        if rules & rule_ids_with(Remediation.QUARANTINE_LEFTOVER):
            out.append("Their leftover .deleted and .cleaned files are quarantined whether or not it is ticked.")
        if rules & rule_ids_with(Remediation.RESTORE_ZK_TOPIC_ID):
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
