"""What a published audit run says: each finding's status since the previous run, and the run's summary, typed.

``RunSummary`` is what ``audit.history.publish`` returns (the audit DAG's XCom) and stores as
``reports/<run>.json`` (``layout.report_json``); the report, the alert and the Kafka fleet view read it through this
type. Its JSON is an interface: fields are added, never renamed (a renamed one keeps its old name as an alias:
``only_in_zookeeper``, which on a KRaft cluster means "only in the metadata log", is ``only_in_cluster_metadata``).
"""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any


class FindingStatus(enum.StrEnum):
    """A finding of a published run, against the previous run."""

    NEW = "new"  # not in the previous run
    PERSISTING = "persisting"  # in the previous run too
    UNVERIFIED = "unverified"  # the previous run's, carried: its broker was not audited this time
    RESOLVED = "resolved"  # the previous run's, no longer seen

    @property
    def standing(self) -> bool:
        """Still standing (new, persisting or unverified): what the view and the report count."""
        return self is not FindingStatus.RESOLVED


STANDING = tuple(s.value for s in FindingStatus if s.standing)
TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"  # a summary's times (UTC)


def parse_time(text: Any) -> dt.datetime | None:
    """A summary's time (``2026-11-29T02:00:00Z``), None when it is not one."""
    try:
        return dt.datetime.strptime(str(text), TIME_FORMAT).replace(tzinfo=dt.UTC)
    except ValueError:
        return None


def count(value: Any) -> int:
    """A stored count as a number: what is not a whole non-negative number (a hand-edited or damaged store) is 0."""
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return max(value, 0)
    if isinstance(value, float) and value.is_integer():
        return max(int(value), 0)
    if isinstance(value, str) and value.strip().isdecimal():
        try:
            return int(value)
        except ValueError:  # decimal digits of another script that int() still refuses
            return 0
    return 0


def counts(value: Any) -> dict[str, int]:
    """A stored map of counts (``by_severity``, ...) as names -> numbers (``count``); not a map: empty."""
    return {str(k): count(v) for k, v in value.items()} if isinstance(value, Mapping) else {}


@dataclass(frozen=True)
class RunSummary:
    """One published audit run (``history.publish``)."""

    audit_run: str
    cluster: str
    finished_at: str
    findings: int  # standing findings, the unverified ones left out
    by_severity: dict[str, int]
    by_status: dict[str, int]
    by_rule: dict[str, int]
    audited: list[int]
    not_audited: list[int]  # unreachable: their earlier findings are carried as unverified
    out_of_scope: list[int]  # a run of only some brokers
    only_in_inventory: list[int]  # not registered in the cluster's registry (ZooKeeper, or the metadata log)
    only_in_cluster_metadata: list[int]  # registered there, not in the inventory
    report: str
    findings_dataset: str
    previous_run: str | None = None
    zookeeper_error: str | None = None  # ZooKeeper could not be read: no cluster facts this run
    metadata_mode: str = "zookeeper"
    # KRaft: brokers registered but fenced, where the cluster facts came from, why none could be read, and the
    # controllers that could not be read
    fenced: list[int] = field(default_factory=list)
    metadata_source: dict[str, Any] | None = None
    metadata_error: str | None = None
    controller_errors: list[dict[str, Any]] = field(default_factory=list)
    rules_skipped: dict[str, str] = field(default_factory=dict)  # rule -> why the detection app did not evaluate it
    started_at: str = ""  # when the run's discover began ("" in a summary written before it was recorded)

    @property
    def duration_s(self) -> float | None:
        """From the run's start to its publication (None when either time is unknown)."""
        start, end = parse_time(self.started_at), parse_time(self.finished_at)
        return (end - start).total_seconds() if start and end else None

    @property
    def kraft(self) -> bool:
        return self.metadata_mode == "kraft"

    @property
    def critical(self) -> int:
        return self.by_severity.get("critical", 0)

    @property
    def cluster_facts_unread(self) -> str | None:
        """Why this run had no cluster facts (None: it had them)."""
        return self.zookeeper_error or self.metadata_error

    def to_dict(self) -> dict[str, Any]:
        """The summary as JSON (XCom, ``reports/<run>.json``), with the old name of each renamed field beside it."""
        out = asdict(self)
        out["only_in_zookeeper"] = out["only_in_cluster_metadata"]
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunSummary:
        """A stored summary, written by this version or an older one (a field it lacks takes its default)."""
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values.setdefault("only_in_cluster_metadata", list(data.get("only_in_zookeeper") or []))
        for name in ("by_severity", "by_status", "by_rule"):
            values[name] = counts(values.get(name))
        values["findings"] = count(values.get("findings"))
        for name in ("audited", "not_audited", "out_of_scope", "only_in_inventory"):
            values.setdefault(name, [])
        for name in ("audit_run", "cluster", "finished_at", "report", "findings_dataset"):
            values.setdefault(name, "")
        return cls(**values)
