"""Findings as the detection app writes them, for tests of what reads them (history, alerts, plans)."""

from __future__ import annotations

from typing import Any


def finding(rule: str, broker: int | None, path: str, severity: str = "critical") -> dict[str, Any]:
    return {
        "rule": rule,
        "severity": severity,
        "broker_id": broker,
        "log_dir": "/d",
        "topic": "t",
        "partition": 0,
        "segment": None,
        "path": path,
        "message": f"{rule} at {path}",
    }
