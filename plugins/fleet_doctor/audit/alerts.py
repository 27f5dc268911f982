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
from collections.abc import Mapping
from typing import Any

from fleet_doctor.audit.summary import RunSummary
from fleet_doctor.inventory import InventoryError
from fleet_doctor.settings import Settings

LOG = logging.getLogger(__name__)


def report_url(summary: RunSummary, base: str = "") -> str:
    """Where people open the run's report: ``<base>/<run>.html`` (``{cluster}`` in the base: the run's cluster),
    else the report's place in the store."""
    if not base:
        return summary.report
    return f"{base.replace('{cluster}', summary.cluster).rstrip('/')}/{os.path.basename(summary.report)}"


def alert_message(summary: RunSummary, report_url: str | None = None) -> str | None:
    """The on-call message when there are critical findings or brokers (KRaft: controllers) that could not be
    audited, else None."""
    crit = summary.critical
    controllers = sorted({e["controller"] for e in summary.controller_errors})  # their logs went unchecked
    if not crit and not summary.not_audited and not summary.cluster_facts_unread and not controllers:
        return None
    parts = [f"Kafka Fleet Doctor, cluster {summary.cluster}, audit {summary.audit_run}:"]
    parts.append(
        f"{crit} critical, {summary.by_severity.get('warning', 0)} warning finding(s) "
        f"({summary.by_status.get('new', 0)} new, {summary.by_status.get('resolved', 0)} resolved)."
    )
    if summary.by_rule:
        parts.append("Rules: " + ", ".join(f"{r} {n}" for r, n in summary.by_rule.items()) + ".")
    if summary.not_audited:
        parts.append(f"NOT AUDITED (unreachable): brokers {', '.join(map(str, summary.not_audited))}.")
    if summary.zookeeper_error:
        parts.append(summary.zookeeper_error)
    if summary.metadata_error:  # KRaft: no controller's metadata log could be read
        parts.append(summary.metadata_error)
    elif controllers:
        parts.append(f"NOT READ (KRaft controllers' metadata logs): {', '.join(map(str, controllers))}.")
    parts.append(f"Report: {report_url or summary.report}")
    return " ".join(parts)


def _is_notifier(cls: Any) -> bool:
    from airflow.sdk import BaseNotifier

    return isinstance(cls, type) and issubclass(cls, BaseNotifier)


def cluster_notifiers(settings: Settings) -> list[tuple[str, dict[str, Any]]]:
    """The cluster's own notifiers (its inventory's ``notifiers``), besides the fleet's."""
    if settings.cluster is None:
        return []
    try:
        notifiers = settings.load_inventory().notifiers
    except InventoryError:  # the fleet's notifiers still get the alert
        LOG.exception("cluster %s: its own notifiers are not read", settings.cluster)
        return []
    return [(n["class"], dict(n.get("kwargs") or {})) for n in notifiers]


def send_alert(
    settings: Settings, summary: Mapping[str, Any] | RunSummary, context: dict[str, Any] | None = None
) -> str | None:
    """Log the alert (WARNING) and send it to the configured notifiers; returns the message or None. ``summary``:
    the run's (``history.publish``'s, as the DAG's XCom holds it)."""
    if not isinstance(summary, RunSummary):
        summary = RunSummary.from_dict(summary)
    url = report_url(summary, settings.report_base_url)
    message = alert_message(summary, url)
    if message is None:
        LOG.info("no critical finding and every broker audited: no alert")
        return None
    LOG.warning("ALERT %s", message)
    fleet_wide = [(True, spec) for spec in settings.notifier_specs()]
    for from_deployment, (dotted, kwargs) in fleet_wide + [(False, spec) for spec in cluster_notifiers(settings)]:
        module, _, name = dotted.rpartition(".")
        try:
            cls = getattr(importlib.import_module(module), name)
            if not from_deployment and not _is_notifier(cls):
                # an inventory is edited by more people than the deployment: it may name Airflow notifiers only,
                # never any class the workers (which hold every broker's SSH key) would build and call
                LOG.error(
                    "cluster %s: %s is not an Airflow notifier (BaseNotifier): not used", settings.cluster, dotted
                )
                continue
            filled = {k: v.format(message=message, report=url) if isinstance(v, str) else v for k, v in kwargs.items()}
            notifier = cls(**filled)
            notifier.notify(context or {})
        except Exception:  # one broken notifier must not hide the alert from the others
            LOG.exception("notifier %s failed", dotted)
    return message
