"""`bin/fleet-doctor scan` end to end: probe, ZooKeeper snapshot file, spark-submit of the detection app.

One real run (spark-submit takes a while): the genuine zk-3.1-single-aryan log dir against its newest
ZooKeeper snapshot. MANIFEST.md: design1-0/1/2 hold topic ID RJI454yPScCX7IO2JuPZvQ in partition.metadata,
snapshot.32f has m2GaXl4TSyaBZB5R8-wtaA; every other topic ID matches; the broker shut down cleanly and
every index is present and trimmed.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from fleet_doctor.rules import RULES, Scope

REPO = Path(__file__).resolve().parents[1]
FLEET_DOCTOR = REPO / "bin" / "fleet-doctor"
ARYAN = "zk-3.1-single-aryan"
FINDING_KEYS = {"rule", "severity", "broker_id", "log_dir", "topic", "partition", "segment", "path", "message"}


def scan(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(FLEET_DOCTOR), "scan", *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def aryan_scan(corpus) -> tuple[subprocess.CompletedProcess, dict[str, Any]]:
    proc = scan(
        str(corpus / ARYAN / "kafka-logs"),
        "--zk-snapshot-file",
        str(corpus / ARYAN / "zookeeper" / "version-2" / "snapshot.32f"),
        "--kafka-version",
        "3.1.0",
        "--format",
        "json",
    )
    assert proc.stdout, proc.stderr
    return proc, json.loads(proc.stdout)


def test_exit_status_is_1_with_findings(aryan_scan):
    proc, report = aryan_scan
    assert proc.returncode == 1, proc.stderr
    assert any(f["severity"] in ("warning", "critical") for f in report["findings"])


def test_json_shape(aryan_scan):
    _, report = aryan_scan
    assert set(report) == {"findings", "summary"}
    assert report["findings"]
    for f in report["findings"]:
        assert FINDING_KEYS <= set(f), f
        assert f["severity"] in ("info", "warning", "critical")
        assert f["broker_id"] in (0, None)  # broker.id=0 in meta.properties; None for ZooKeeper-level findings
    summary = report["summary"]
    assert summary["findings"] == len(report["findings"])
    assert sum(summary["by_severity"].values()) == len(report["findings"])
    assert summary["rules_skipped"] == {}


def test_the_genuine_design1_topic_id_mismatch(aryan_scan, corpus):
    _, report = aryan_scan
    hits = [f for f in report["findings"] if f["rule"] == "topic-id-mismatch"]
    assert sorted((f["topic"], f["partition"]) for f in hits) == [("design1", 0), ("design1", 1), ("design1", 2)]
    logdir = corpus / ARYAN / "kafka-logs"
    for f in hits:
        assert f["severity"] == "critical"
        assert f["broker_id"] == 0 and f["log_dir"] == str(logdir)
        assert f["path"] == str(logdir / f"design1-{f['partition']}" / "partition.metadata")
        assert "RJI454yPScCX7IO2JuPZvQ" in f["message"] and "m2GaXl4TSyaBZB5R8-wtaA" in f["message"]


def test_no_index_or_segment_damage_on_a_clean_broker(aryan_scan):
    """Clean shutdown, every index present and trimmed: no segment rule fires."""
    _, report = aryan_scan
    segment_rules = {r.id for r in RULES if r.scope is Scope.SEGMENT}
    assert [f for f in report["findings"] if f["rule"] in segment_rules] == []


def test_nonexistent_path_is_a_usage_error(tmp_path):
    proc = scan(str(tmp_path / "no-such-log-dir"), "--format", "json", timeout=60)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert "no-such-log-dir" in proc.stderr and "not a directory" in proc.stderr
