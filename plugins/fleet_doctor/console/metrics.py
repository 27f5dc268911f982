"""The fleet's health as Prometheus metrics (``GET /kafka-fleet/metrics``, text exposition format 0.0.4): per cluster,
from its latest published audit, the same facts as the fleet overview (``console.data.ClusterRow``). docs/fleet.md,
"Metrics", has every metric with a scrape config and a Grafana panel.

Written here once: the names, their help and types, and the label escaping. Gauges only: each value is a state read
from the store at the scrape, not a count this process keeps.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from fleet_doctor.audit.summary import STANDING, parse_time
from fleet_doctor.console.data import ClusterRow
from fleet_doctor.inventory import InventoryProblem

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
PREFIX = "kafka_fleet"
METRICS: dict[str, str] = {  # name (without the prefix) -> help
    "cluster_info": "A cluster of the fleet (1), with its metadata mode and Kafka versions as labels",
    "store_up": "Whether the cluster's store could be read at this scrape (1) or not (0)",
    "brokers": "Brokers of the cluster: in its inventory, audited, not audited (unreachable) and out of scope in its "
    "latest audit",
    "findings": "Standing findings of the cluster's latest audit by severity, rule and status (new, persisting, "
    "unverified)",
    "last_audit_end_timestamp_seconds": "When the cluster's latest audit was published (Unix time)",
    "last_audit_duration_seconds": "How long the cluster's latest audit took, from its start to its publication",
    "audit_stale": "Whether the cluster's latest audit is older than its schedule allows (1) or not (0)",
    "pending_approvals": "Repair and restore approvals of the cluster waiting for a person",
    "repair_lock_held": "Whether the cluster's repair lock was held (1) or free (0) when last seen (no sample: never "
    "seen)",
    "repair_lock_needs_human": "Whether the cluster's repair lock was held with no worker executing the repair (1): a "
    "halted repair waits for a person",
    "repair_lock_seen_timestamp_seconds": "When the cluster's repair lock was last seen, by a repair or an audit (Unix "
    "time)",
    "inventory_problems": "Inventory files of the fleet that give no cluster (named on the fleet page to users who may "
    "read every cluster)",
}


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _sample(name: str, labels: Mapping[str, str], value: float) -> str:
    inner = ",".join(f'{k}="{_label(str(v))}"' for k, v in labels.items())
    number = repr(float(value)) if not float(value).is_integer() else str(int(value))
    return f"{PREFIX}_{name}{{{inner}}} {number}" if inner else f"{PREFIX}_{name} {number}"


def _findings(row: ClusterRow) -> Iterable[tuple[dict[str, str], int]]:
    """(labels, count) of the latest audit's standing findings, by severity, rule and status."""
    counts: dict[tuple[str, str, str], int] = {}
    for f in row.view.rows if row.view else []:
        status = str(f.get("status") or "")
        if status in STANDING:
            key = (str(f.get("severity") or ""), str(f.get("rule") or ""), status)
            counts[key] = counts.get(key, 0) + 1
    for (severity, rule, status), n in sorted(counts.items()):
        yield {"cluster": row.cluster, "severity": severity, "rule": rule, "status": status}, n


def render_metrics(
    rows: list[ClusterRow], problems: list[InventoryProblem], pending: Mapping[str, int] | None = None
) -> str:
    """The exposition: every metric's HELP and TYPE, then its samples, one per cluster (and per label set)."""
    samples: dict[str, list[str]] = {name: [] for name in METRICS}
    for row in sorted(rows, key=lambda r: r.cluster):
        c = {"cluster": row.cluster}
        info = {**c, "metadata_mode": row.metadata_mode, "kafka_versions": ",".join(row.kafka_versions)}
        samples["cluster_info"].append(_sample("cluster_info", info, 1))
        samples["store_up"].append(_sample("store_up", c, 0 if row.error else 1))
        s = row.summary
        brokers = {"inventory": row.brokers}
        if s is not None:
            brokers.update(audited=len(s.audited), not_audited=len(s.not_audited), out_of_scope=len(s.out_of_scope))
        for state, n in brokers.items():
            samples["brokers"].append(_sample("brokers", {**c, "state": state}, n))
        for labels, n in _findings(row):
            samples["findings"].append(_sample("findings", labels, n))
        if s is not None:
            end = parse_time(s.finished_at)
            if end is not None:
                samples["last_audit_end_timestamp_seconds"].append(
                    _sample("last_audit_end_timestamp_seconds", c, end.timestamp())
                )
            if s.duration_s is not None:
                samples["last_audit_duration_seconds"].append(_sample("last_audit_duration_seconds", c, s.duration_s))
        samples["audit_stale"].append(_sample("audit_stale", c, int(row.stale)))
        if pending is not None:
            samples["pending_approvals"].append(_sample("pending_approvals", c, pending.get(row.cluster, 0)))
        if row.lock is not None:
            samples["repair_lock_held"].append(_sample("repair_lock_held", c, int(row.lock.held)))
            samples["repair_lock_needs_human"].append(_sample("repair_lock_needs_human", c, int(row.lock.needs_human)))
            samples["repair_lock_seen_timestamp_seconds"].append(
                _sample("repair_lock_seen_timestamp_seconds", c, row.lock.observed_at)
            )
    samples["inventory_problems"].append(_sample("inventory_problems", {}, len(problems)))
    out = []
    for name, help_text in METRICS.items():
        out.append(f"# HELP {PREFIX}_{name} {help_text}")
        out.append(f"# TYPE {PREFIX}_{name} gauge")
        out += samples[name]
    return "\n".join(out) + "\n"
