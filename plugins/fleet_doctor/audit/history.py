"""Publishing an audit run: the findings history (new / persisting / resolved / unverified since the previous run),
the run's summary and its HTML report, in the audit's store (``fleet_doctor.layout``)."""

from __future__ import annotations

import io
import json
import sys
import time
from collections import Counter
from typing import Any

from fleet_doctor import layout
from fleet_doctor.audit.report import render_audit_html
from fleet_doctor.audit.summary import TIME_FORMAT, FindingStatus, RunSummary
from fleet_doctor.layout import safe_run_id
from fleet_doctor.rules import SEVERITY_ORDER
from fleet_doctor.settings import Settings

# what identifies a finding from one run to the next
FINDING_KEY = ("rule", "broker_id", "log_dir", "topic", "partition", "segment", "path")


def latest_whole_fleet_run(store: Any) -> str | None:
    """The newest published audit of the whole fleet (a run of only some brokers is no base for a plan); None."""
    runs = [r for r in store.read_jsonl(layout.HISTORY_RUNS) if not r.get("out_of_scope")]
    return runs[-1]["audit_run"] if runs else None


def finding_key(f: dict[str, Any]) -> str:
    return json.dumps([f.get(k) for k in FINDING_KEY])


def metadata_summary(discovered: dict[str, Any], facts: dict[str, Any]) -> dict[str, Any]:
    """Where the run's cluster metadata came from. KRaft: the controller, snapshot file and log end offset the
    staged metadata was read from, why it could not be read, and the controllers that were tried and failed (the
    snapshot step's account, read once per run). ZooKeeper: the mode only (its errors are ``zookeeper_error``)."""
    mode = discovered.get("metadata_mode", "zookeeper")  # a discovery made before the mode was passed on: ZooKeeper
    if mode != "kraft":
        return {"metadata_mode": mode}
    return {
        "metadata_mode": mode,
        "fenced": list(discovered.get("fenced") or []),
        "metadata_source": facts.get("metadata_source"),
        "metadata_error": facts.get("metadata_error"),
        "controller_errors": list(facts.get("controller_errors") or []),
    }


def airflow_url(settings: Settings) -> str | None:
    """Airflow's UI as people open it, for the report's links into the Kafka fleet view: ``FLEET_DOCTOR_AIRFLOW_URL``,
    else Airflow's ``[api] base_url`` when this runs inside Airflow (a task); None: the report links nowhere."""
    if settings.airflow_url:
        return settings.airflow_url
    if "airflow" not in sys.modules:  # a run outside Airflow (scan, tests): do not load Airflow for a URL
        return None
    from airflow.configuration import conf

    url = conf.get("api", "base_url", fallback=None)
    return str(url).rstrip("/") if url else None


def publish(settings: Settings, run_id: str, discovered: dict[str, Any], facts: dict[str, Any]) -> dict[str, Any]:
    """Mark every finding new / persisting versus the previous run, add the previous run's findings that are
    gone as resolved (unless their broker was not audited this time, unreachable or out of the run's scope: then
    they are carried as unverified), append the run to the history, write the HTML report and return the run's
    summary (``RunSummary.to_dict``)."""
    store = settings.store
    run = safe_run_id(run_id)
    area = layout.staging(run_id)
    findings = store.read_jsonl(area.findings_json)
    spark_summary = store.read_json(area.summary) or {}
    runs = [r for r in store.read_jsonl(layout.HISTORY_RUNS) if r["audit_run"] != run]
    previous = runs[-1]["audit_run"] if runs else None
    before = (
        {
            finding_key(f): f
            for f in store.read_jsonl(layout.history_findings(previous))
            if f.get("status") != FindingStatus.RESOLVED
        }
        if previous
        else {}
    )
    not_audited = set(facts["not_audited"])
    out_of_scope = set(facts.get("out_of_scope", []))
    not_checked = not_audited | out_of_scope
    rows = []
    now = {finding_key(f): f for f in findings}
    for key, f in now.items():
        status = FindingStatus.PERSISTING if key in before else FindingStatus.NEW
        rows.append({**f, "status": status.value, "first_seen": (before.get(key) or {}).get("first_seen") or run})
    for key, f in before.items():
        if key in now:
            continue
        # a partial run resolves only what it looked at: its brokers' own findings, not the cluster's
        carried = f.get("broker_id") in not_checked or (bool(out_of_scope) and f.get("broker_id") is None)
        status = FindingStatus.UNVERIFIED if carried else FindingStatus.RESOLVED
        rows.append({**f, "status": status.value, "audit_run": run})
    store.write_jsonl(layout.history_findings(run), rows)
    verified = [r for r in rows if r["status"] in (FindingStatus.NEW, FindingStatus.PERSISTING)]
    by_severity = Counter(r["severity"] for r in verified)
    status_counts = Counter(r["status"] for r in rows)
    only_in_metadata = discovered.get("only_in_cluster_metadata", discovered.get("only_in_zookeeper", []))
    summary = RunSummary(
        audit_run=run,
        cluster=discovered["cluster"],
        finished_at=time.strftime(TIME_FORMAT, time.gmtime()),
        findings=sum(by_severity.values()),
        by_severity={s: by_severity.get(s, 0) for s in SEVERITY_ORDER},
        by_status={s.value: status_counts.get(s.value, 0) for s in FindingStatus},
        by_rule=dict(sorted(Counter(r["rule"] for r in verified).items())),
        audited=facts["audited"],
        not_audited=facts["not_audited"],
        out_of_scope=facts.get("out_of_scope", []),
        only_in_inventory=discovered["only_in_inventory"],
        only_in_cluster_metadata=list(only_in_metadata),
        zookeeper_error=discovered.get("zookeeper_error"),
        **metadata_summary(discovered, facts),
        rules_skipped=spark_summary.get("rules_skipped", {}),
        report=store.url(layout.report_html(run)),
        findings_dataset=store.url(layout.findings_dataset(run)),
        previous_run=previous,
        started_at=str(discovered.get("started_at") or ""),
    )
    runs.append(
        {
            "audit_run": run,
            "cluster": summary.cluster,
            "finished_at": summary.finished_at,
            "by_severity": summary.by_severity,
            "by_status": summary.by_status,
            "not_audited": summary.not_audited,
            "out_of_scope": summary.out_of_scope,
        }
    )
    store.write_jsonl(layout.HISTORY_RUNS, runs)
    store.write_text(layout.report_json(run), json.dumps(summary.to_dict(), indent=2) + "\n")
    html = io.StringIO()
    render_audit_html(rows, summary, runs, html, airflow_url(settings))
    store.write_text(layout.report_html(run), html.getvalue())
    return summary.to_dict()
