"""Alerting for the audit: the on-call message goes to the task log, and to every notifier configured in
``FLEET_DOCTOR_NOTIFIERS`` (a JSON list of ``{"class": "dotted.path.Notifier", "kwargs": {...}}``), e.g.

    [{"class": "airflow.providers.slack.notifications.slack.SlackNotifier",
      "kwargs": {"slack_conn_id": "slack_oncall", "channel": "#kafka-oncall", "text": "{message}"}}]

String kwargs may contain ``{message}`` (the alert text) and ``{report}`` (the report's location; with
``FLEET_DOCTOR_REPORT_BASE_URL`` set, a URL). A notifier that fails is logged and does not hide the others.
"""

from __future__ import annotations

import importlib
import logging
import os
from typing import Any

from fleet_doctor.settings import Settings

LOG = logging.getLogger(__name__)


def report_url(summary: dict[str, Any], base: str = "") -> str:
    return f"{base.rstrip('/')}/{os.path.basename(summary['report'])}" if base else summary["report"]


def alert_message(summary: dict[str, Any], report_url: str | None = None) -> str | None:
    """The on-call message when there are critical findings or brokers (KRaft: controllers) that could not be
    audited, else None."""
    crit = summary["by_severity"]["critical"]
    unread = summary.get("zookeeper_error") or summary.get("metadata_error")  # no cluster facts this run
    controllers = sorted({e["controller"] for e in summary.get("controller_errors") or []})  # their logs unchecked
    if not crit and not summary["not_audited"] and not unread and not controllers:
        return None
    parts = [f"Kafka Fleet Doctor, cluster {summary['cluster']}, audit {summary['audit_run']}:"]
    parts.append(
        f"{crit} critical, {summary['by_severity']['warning']} warning finding(s) "
        f"({summary['by_status']['new']} new, {summary['by_status']['resolved']} resolved)."
    )
    if summary["by_rule"]:
        parts.append("Rules: " + ", ".join(f"{r} {n}" for r, n in summary["by_rule"].items()) + ".")
    if summary["not_audited"]:
        parts.append(f"NOT AUDITED (unreachable): brokers {', '.join(map(str, summary['not_audited']))}.")
    if summary.get("zookeeper_error"):
        parts.append(summary["zookeeper_error"])
    if summary.get("metadata_error"):  # KRaft: no controller's metadata log could be read
        parts.append(summary["metadata_error"])
    elif controllers:
        parts.append(f"NOT READ (KRaft controllers' metadata logs): {', '.join(map(str, controllers))}.")
    parts.append(f"Report: {report_url or summary['report']}")
    return " ".join(parts)


def send_alert(settings: Settings, summary: dict[str, Any], context: dict[str, Any] | None = None) -> str | None:
    """Log the alert (WARNING) and send it to the configured notifiers; returns the message or None."""
    url = report_url(summary, settings.report_base_url)
    message = alert_message(summary, url)
    if message is None:
        LOG.info("no critical finding and every broker audited: no alert")
        return None
    LOG.warning("ALERT %s", message)
    for dotted, kwargs in settings.notifier_specs():
        module, _, name = dotted.rpartition(".")
        try:
            cls = getattr(importlib.import_module(module), name)
            filled = {k: v.format(message=message, report=url) if isinstance(v, str) else v for k, v in kwargs.items()}
            notifier = cls(**filled)
            notifier.notify(context or {})
        except Exception:  # one broken notifier must not hide the alert from the others
            LOG.exception("notifier %s failed", dotted)
    return message
