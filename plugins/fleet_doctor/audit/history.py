"""Publishing an audit run: the findings history (new / persisting / resolved / unverified since the previous run),
the run's summary and its HTML report, in the audit's store (layout: ``fleet_doctor.audit.steps``)."""

from __future__ import annotations

import io
import json
import sys
import time
from collections import Counter
from typing import Any

from fleet_doctor.audit.report import render_audit_html
from fleet_doctor.rules import SEVERITY_ORDER
from fleet_doctor.settings import Settings, safe_run_id

# what identifies a finding from one run to the next
FINDING_KEY = ("rule", "broker_id", "log_dir", "topic", "partition", "segment", "path")


def finding_key(f: dict[str, Any]) -> str:
    return json.dumps([f.get(k) for k in FINDING_KEY])


def metadata_summary(discovered: dict[str, Any], facts: dict[str, Any]) -> dict[str, Any]:
    """Where the run's cluster metadata came from. KRaft: the controller, snapshot file and log end offset the
    staged metadata was read from (the snapshot step's, else discover's), why it could not be read, and the
    controllers that were tried and failed. ZooKeeper: the mode only (its errors are ``zookeeper_error``)."""
    mode = facts.get("metadata_mode") or discovered.get("metadata_mode") or "zookeeper"
    if mode != "kraft":
        return {"metadata_mode": mode}
    staged = "metadata_source" in facts  # the snapshot step's account, when broker_facts read one
    source = facts.get("metadata_source") if staged else discovered.get("metadata_source")
    error = facts.get("metadata_error") if staged else discovered.get("metadata_error")
    errors = facts.get("controller_errors") if staged else discovered.get("controller_errors")
    return {
        "metadata_mode": mode,
        "fenced": list(discovered.get("fenced") or []),
        "metadata_source": source,
        "metadata_error": error,
        "controller_errors": list(errors or []),
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
    they are carried as unverified),
    append the run to the history, write the HTML report and return the compact summary."""
    store = settings.store
    run = safe_run_id(run_id)
    run_key = settings.run_key(run_id)
    findings = store.read_jsonl(f"{run_key}/findings.jsonl")
    spark_summary = store.read_json(f"{run_key}/summary.json") or {}
    runs = [r for r in store.read_jsonl("history/runs.jsonl") if r["audit_run"] != run]
    previous = runs[-1]["audit_run"] if runs else None
    before = (
        {
            finding_key(f): f
            for f in store.read_jsonl(f"history/audit_run={previous}/findings.jsonl")
            if f.get("status") != "resolved"
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
        rows.append(
            {
                **f,
                "status": "persisting" if key in before else "new",
                "first_seen": (before.get(key) or {}).get("first_seen") or run,
            }
        )
    for key, f in before.items():
        if key in now:
            continue
        # a partial run resolves only what it looked at: its brokers' own findings, not the cluster's
        carried = f.get("broker_id") in not_checked or (bool(out_of_scope) and f.get("broker_id") is None)
        rows.append({**f, "status": "unverified" if carried else "resolved", "audit_run": run})
    store.write_jsonl(f"history/audit_run={run}/findings.jsonl", rows)
    active = [r for r in rows if r["status"] in ("new", "persisting", "unverified")]
    by_severity = Counter(r["severity"] for r in active if r["status"] != "unverified")
    status_counts = Counter(r["status"] for r in rows)
    report = f"reports/{run}.html"
    summary = {
        "audit_run": run,
        "cluster": discovered["cluster"],
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "findings": sum(by_severity.values()),
        "by_severity": {s: by_severity.get(s, 0) for s in SEVERITY_ORDER},
        "by_status": {s: status_counts.get(s, 0) for s in ("new", "persisting", "resolved", "unverified")},
        "by_rule": dict(sorted(Counter(r["rule"] for r in active if r["status"] != "unverified").items())),
        "audited": facts["audited"],
        "not_audited": facts["not_audited"],
        "out_of_scope": facts.get("out_of_scope", []),
        "only_in_inventory": discovered["only_in_inventory"],
        "only_in_zookeeper": discovered["only_in_zookeeper"],  # KRaft: only in the metadata log
        "zookeeper_error": discovered.get("zookeeper_error"),
        **metadata_summary(discovered, facts),
        "rules_skipped": spark_summary.get("rules_skipped", {}),
        "report": store.url(report),
        "findings_dataset": store.url(f"findings/audit_run={run}"),
        "previous_run": previous,
    }
    runs.append(
        {k: summary[k] for k in ("audit_run", "finished_at", "by_severity", "by_status", "not_audited", "out_of_scope")}
    )
    store.write_jsonl("history/runs.jsonl", runs)
    store.write_text(f"reports/{run}.json", json.dumps(summary, indent=2) + "\n")
    html = io.StringIO()
    render_audit_html(rows, summary, runs, html, airflow_url(settings))
    store.write_text(report, html.getvalue())
    return summary
