"""What the Kafka fleet view shows, read from the published audit only (``fleet_doctor.audit.history.publish``'s
layout in the store): ``history/runs.jsonl`` (one row per run, oldest first), the latest run's
``history/audit_run=<run>/findings.jsonl`` (every finding with its status new / persisting / unverified /
resolved) and its summary ``reports/<run>.json``. One store holds one deployment's history: its summaries name
the cluster."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from fleet_doctor import layout
from fleet_doctor.audit.summary import STANDING, FindingStatus, RunSummary
from fleet_doctor.finding_groups import FindingGroup, group_findings
from fleet_doctor.rules import severity_rank
from fleet_doctor.store import Store


@dataclass(frozen=True)
class FleetView:
    """The latest published audit of one store and the runs before it."""

    store_url: str
    runs: list[dict[str, Any]]  # history/runs.jsonl, oldest first (all of it: the page shows the last N)
    summary: RunSummary | None  # reports/<latest>.json; None when there is no run yet
    rows: list[dict[str, Any]] = field(default_factory=list)  # the latest run's findings, every status
    missing_summary: bool = False  # the history names a run whose summary is not in the store

    @property
    def latest(self) -> str | None:
        return self.runs[-1]["audit_run"] if self.runs else None

    @property
    def groups(self) -> list[FindingGroup]:
        """The findings still standing (new, persisting, unverified), one group per (broker, rule, cause)."""
        return group_findings(r for r in self.rows if r.get("status") in STANDING)

    @property
    def resolved(self) -> list[FindingGroup]:
        """The previous run's findings that this run no longer sees."""
        return group_findings(r for r in self.rows if r.get("status") == FindingStatus.RESOLVED)

    def run_ids(self) -> set[str]:
        return {str(r["audit_run"]) for r in self.runs}


def load_view(store: Store) -> FleetView:
    """The store's latest audit. Raises ``StoreError`` (naming the object) when it cannot be read."""
    runs = [r for r in store.read_jsonl(layout.HISTORY_RUNS) if r.get("audit_run")]
    if not runs:
        return FleetView(store.url(), [], None)
    latest = str(runs[-1]["audit_run"])
    summary = store.read_json(layout.report_json(latest))
    rows = store.read_jsonl(layout.history_findings(latest))
    if not isinstance(summary, dict):  # published only in part: what the history row says
        return FleetView(store.url(), runs, RunSummary.from_dict(runs[-1]), rows, missing_summary=True)
    return FleetView(store.url(), runs, RunSummary.from_dict(summary), rows)


def broker_label(broker_id: Any) -> str:
    return "cluster" if broker_id is None else str(broker_id)


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


def cluster_name(summary: RunSummary | None) -> str:
    return (summary.cluster if summary else "") or "(unnamed cluster)"
