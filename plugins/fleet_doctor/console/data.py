"""What the Kafka fleet view shows, read from the published audit only (``fleet_doctor.audit.history.publish``'s
layout in the store): ``history/runs.jsonl`` (one row per run, oldest first), the latest run's
``history/audit_run=<run>/findings.jsonl`` (every finding with its status new / persisting / unverified /
resolved) and its summary ``reports/<run>.json``, each cluster from its own store (``layout.cluster_store``); the
fleet overview adds each cluster's inventory facts and its repair lock as last seen (``lock_state``), and a cluster's
roll as its worker last wrote it with the operator's holds and skips (``roll_status``)."""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from croniter import croniter

from fleet_doctor import layout, lock_state, roll_status
from fleet_doctor.audit.summary import STANDING, FindingStatus, RunSummary, counts, parse_time
from fleet_doctor.finding_groups import FindingGroup, group_findings
from fleet_doctor.fleet_dags import cron_of
from fleet_doctor.inventory import Inventory
from fleet_doctor.lock_state import NEEDS_HUMAN, LockState
from fleet_doctor.roll_status import Control, RollStatus
from fleet_doctor.rules import severity_rank
from fleet_doctor.store import Store, StoreError


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
    runs = [
        {**r, "by_severity": counts(r.get("by_severity")), "by_status": counts(r.get("by_status"))}
        for r in store.read_jsonl(layout.HISTORY_RUNS)
        if r.get("audit_run")
    ]
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


# ---- the fleet: one row per cluster
STALE_GRACE = dt.timedelta(hours=2)  # how long a scheduled audit may take before it counts as missing


@dataclass(frozen=True)
class ClusterRow:
    """One cluster of the fleet overview: its inventory's facts and its latest published audit (or why it could not
    be read)."""

    cluster: str
    metadata_mode: str
    kafka_versions: list[str]
    brokers: int
    schedule: str | None
    view: FleetView | None
    error: str | None = None  # the cluster's store could not be read
    stale: bool = False  # the latest audit is older than the schedule allows (or there is none)
    lock: LockState | None = None  # the repair lock as last seen (``lock_state``); None: never seen
    lock_error: str | None = None  # its mirror could not be read
    roll: RollView | None = None  # the cluster's roll as last written (``roll_status``)

    @property
    def summary(self) -> RunSummary | None:
        return self.view.summary if self.view else None

    def count(self, severity: str) -> int:
        s = self.summary
        return int(s.by_severity.get(severity, 0)) if s else 0

    @property
    def not_audited(self) -> list[Any]:
        return list(self.summary.not_audited) if self.summary else []

    def sort_key(self) -> tuple[Any, ...]:
        """Worst first: unreadable, then by critical, warning findings, brokers not audited, a repair lock left for a
        person, stale, then name."""
        return (
            self.error is None,
            -self.count("critical"),
            -self.count("warning"),
            -len(self.not_audited),
            not (self.lock is not None and self.lock.state == NEEDS_HUMAN),
            not self.stale,
            self.cluster,
        )


def is_stale(schedule: str | None, finished_at: Any, now: dt.datetime) -> bool:
    """Whether a scheduled audit is missing: the newest one finished before the schedule's last time (less the
    grace an audit has to finish). An unscheduled cluster is never stale."""
    if not schedule:
        return False
    try:
        expected = croniter(cron_of(schedule), now - STALE_GRACE).get_prev(dt.datetime)
    except ValueError:
        return False
    when = parse_time(finished_at)
    return when is None or when < expected


@dataclass(frozen=True)
class RollView:
    """A cluster's roll as its worker last wrote it, and the operator's standing holds and skips, or why they could
    not be read."""

    status: RollStatus | None
    control: Control = field(default_factory=Control)
    error: str | None = None


def read_roll(store: Store) -> RollView:
    """The cluster's roll status and controls (``roll_status``); what went wrong reading them, shown, not raised."""
    errors = []
    status: RollStatus | None = None
    control = Control()
    try:
        status = roll_status.read_status(store)
    except StoreError as err:
        errors.append(str(err))
    try:
        control = roll_status.read_control(store)
    except (StoreError, ValueError) as err:  # the status is shown all the same
        errors.append(str(err))
    return RollView(status, control, "; ".join(errors) or None)


def read_lock(store: Store) -> tuple[LockState | None, str | None]:
    """The cluster's repair lock as last seen, or why its mirror could not be read."""
    try:
        return lock_state.read(store), None
    except StoreError as err:
        return None, str(err)


def cluster_row(inv: Inventory, schedule: str | None, store: Callable[[], Store], now: dt.datetime) -> ClusterRow:
    """A cluster's row: its latest audit from its store (``store()``: finding it may read the data root)."""
    versions = sorted({b.kafka_version for b in inv.brokers})
    lock, lock_error = None, "the cluster's store cannot be read"
    roll: RollView | None = None
    try:
        cluster_store = store()
    except StoreError as err:
        view: FleetView | None = None
        error: str | None = str(err)
    else:
        lock, lock_error = read_lock(cluster_store)  # shown even when the history cannot be read
        roll = read_roll(cluster_store)
        try:
            view, error = load_view(cluster_store), None
        except StoreError as err:
            view, error = None, str(err)
    finished_at = view.summary.finished_at if view and view.summary else None
    return ClusterRow(
        cluster=inv.cluster,
        metadata_mode=inv.metadata_mode,
        kafka_versions=versions,
        brokers=len(inv.brokers),
        schedule=schedule,
        view=view,
        error=error,
        stale=error is None and is_stale(schedule, finished_at, now),
        lock=lock,
        lock_error=lock_error,
        roll=roll,
    )
