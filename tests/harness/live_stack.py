"""Shared pieces of the live-stack repair tests (the lab and the live Airflow they run on: ``harness.shared``): the
fast gates, where a plan and an attempt sit in the store, and what the tests read back from the lab on their own
(files, the lab's event record, ZooKeeper), never from the product under test."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

from fleet_doctor.airflow_links import audit_dag, purge_dag, repair_dag, restore_dag
from fleet_doctor.layout import attempt_name
from fleet_doctor.repair.plan import QUARANTINE_DIR
from fleet_lab import fleet
from fleet_lab.fleet import broker_events as events  # the live tests import it from here
from fleet_lab.fleet import zk_json  # noqa: F401  (the live tests import it from here)

LAB_CLUSTER = "lab"  # the lab's cluster (fleet_lab.fleet's default name): its DAGs
AUDIT, REPAIR, RESTORE = audit_dag(LAB_CLUSTER), repair_dag(LAB_CLUSTER), restore_dag(LAB_CLUSTER)
PURGE = purge_dag(LAB_CLUSTER)
FAST = {"healthy_polls": 2, "poll_interval_s": 1, "pause_between_brokers_s": 0, "isr_timeout_s": 120}
REPAIRABLE = ("partition.metadata", "leader-epoch-checkpoint")


def plan_dir(data: Path, request: dict[str, Any]) -> Path:
    """The repair plan an approval request is about (its hash prefix is in the subject)."""
    prefix = re.search(r"plan ([0-9a-f]{12})", request["subject"]).group(1)  # type: ignore[union-attr]
    (d,) = [d for d in (data / "repairs").iterdir() if d.name.startswith(prefix)]
    return d


def attempt_of(data: Path, request: dict[str, Any], run: str) -> Path:
    """Where one repair run's attempt at the plan keeps its journal, result and backups."""
    return plan_dir(data, request) / "attempts" / attempt_name(run)


def fleet_snapshot(state: fleet.LabState) -> dict[str, Any]:
    """Everything a repair could change, read straight from the lab: the repairable files (content), the index
    files (size and mtime: active ones are 10 MiB), quarantine folders, process starts and stop requests per
    broker, and each broker's registration (its czxid changes with every re-registration)."""
    files: dict[str, Any] = {}
    for b in state.brokers:
        for d in map(Path, b.log_dirs):
            for f in d.glob(f"*/{QUARANTINE_DIR}/*/*"):
                files[str(f)] = hashlib.sha256(f.read_bytes()).hexdigest()
            for f in d.glob("*/*"):
                if f.name in REPAIRABLE:
                    files[str(f)] = hashlib.sha256(f.read_bytes()).hexdigest()
                elif f.suffix in (".index", ".timeindex"):
                    st = f.stat()
                    files[str(f)] = (st.st_size, st.st_mtime_ns)
    ev = events(state)
    zk = state.zk_client()
    try:
        ids = {b: zk.exists(f"/brokers/ids/{b}") for b in (x.id for x in state.brokers)}
        regs = {b: (s.czxid if s else None) for b, s in ids.items()}
    finally:
        zk.stop()
        zk.close()
    return {
        "files": files,
        "starts": {b: sum(e["event"] == "running" for e in es) for b, es in ev.items()},
        "stops": {b: sum(e["event"] in ("stop-requested", "kill-requested") for e in es) for b, es in ev.items()},
        "registrations": regs,
    }


def scrape(af: Any, user: str | None = None) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """The Kafka fleet view's /metrics as Prometheus scrapes it (a bearer token: ``user``'s JWT), parsed by Prometheus'
    own parser: metric name -> {sorted labels: value}."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    req = urllib.request.Request(
        f"{af.base}/kafka-fleet/metrics", headers={"Authorization": f"Bearer {af.token(user)}"}
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = r.read().decode()
    return {
        f.name: {tuple(sorted(s.labels.items())): s.value for s in f.samples}
        for f in text_string_to_metric_families(text)
    }
