"""Alerting for the audit: the on-call message goes to the task log, and to every notifier configured in
``FLEET_DOCTOR_NOTIFIERS`` (a JSON list of ``{"class": "dotted.path.Notifier", "kwargs": {...}}``), e.g.

    [{"class": "airflow.providers.slack.notifications.slack.SlackNotifier",
      "kwargs": {"slack_conn_id": "slack_oncall", "channel": "#kafka-oncall", "text": "{message}"}}]

String kwargs may contain ``{message}`` (the alert text) and ``{report}`` (the report's location; with
``FLEET_DOCTOR_REPORT_BASE_URL`` set, a URL). A notifier that fails is logged and does not hide the others.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
from typing import Any

from fleet_doctor.audit import alert_message

LOG = logging.getLogger(__name__)


def report_url(summary: dict[str, Any]) -> str:
    base = os.environ.get("FLEET_DOCTOR_REPORT_BASE_URL")
    return f"{base.rstrip('/')}/{os.path.basename(summary['report'])}" if base else summary["report"]


def configured_notifiers() -> list[tuple[str, dict[str, Any]]]:
    raw = os.environ.get("FLEET_DOCTOR_NOTIFIERS")
    if not raw:
        return []
    specs = json.loads(raw)
    if not isinstance(specs, list) or not all(isinstance(s, dict) and "class" in s for s in specs):
        raise ValueError('FLEET_DOCTOR_NOTIFIERS must be a JSON list of {"class": ..., "kwargs": {...}}')
    return [(s["class"], dict(s.get("kwargs") or {})) for s in specs]


def send_alert(summary: dict[str, Any], context: dict[str, Any] | None = None) -> str | None:
    """Log the alert (WARNING) and send it to the configured notifiers; returns the message or None."""
    url = report_url(summary)
    message = alert_message(summary, url)
    if message is None:
        LOG.info("no critical finding and every broker audited: no alert")
        return None
    LOG.warning("ALERT %s", message)
    for dotted, kwargs in configured_notifiers():
        module, _, name = dotted.rpartition(".")
        try:
            cls = getattr(importlib.import_module(module), name)
            filled = {k: v.format(message=message, report=url) if isinstance(v, str) else v for k, v in kwargs.items()}
            notifier = cls(**filled)
            notifier.notify(context or {})
        except Exception:  # one broken notifier must not hide the alert from the others
            LOG.exception("notifier %s failed", dotted)
    return message
