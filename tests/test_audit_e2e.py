"""The audit DAG end to end on a 3-broker fleet lab: real sshd, ZooKeeper, Spark (local) and Airflow (SQLite,
`airflow dags test`). Expected findings come from what the incidents did on disk, checked independently."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from fleet_doctor.audit.summary import RunSummary
from fleet_doctor.staging import STAGED_KINDS
from fleet_lab import demo
from fleet_lab import fleet as lab
from fleet_lab.incidents import inject

pytestmark = pytest.mark.timeout(1800)

INCIDENTS: list[tuple[str, dict[str, Any]]] = [
    ("index-orphan", {"broker": 1, "topic": "orders", "partition": 0}),
    ("partition-metadata-malformed", {"broker": 1, "topic": "payments"}),
    ("stray-dir", {"broker": 2, "topic": "orders"}),
    ("segment-leftover", {"broker": 2, "topic": "clickstream"}),
    ("log-torn-tail", {"broker": 3, "topic": "clickstream"}),
    ("index-bad-size", {"broker": 3, "topic": "orders"}),
    ("old-client-add-partitions", {"topic": "payments", "partitions": 4}),
]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("audit")
    lab_dir, home, data = root / "lab", root / "airflow", root / "data"
    state = lab.up(lab_dir, brokers=3)
    try:
        env = demo.airflow_environ(home, lab_dir, data)
        env["FLEET_DOCTOR_STAGE_RETRY_DELAY"] = "1"
        demo.prepare(env)
        # the lab cluster's store in the data root (layout.cluster_store): clusters/lab/
        yield {"state": state, "env": env, "data": data, "home": home, "store": Path(demo.store_of(data).base)}
    finally:
        lab.down(lab_dir)


def audit(fleet: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]], subprocess.CompletedProcess[str]]:
    r = demo.run_audit(fleet["env"], timeout=900)
    summary = demo.latest_summary(fleet["data"])
    assert summary is not None, r.stdout[-3000:] + r.stderr[-3000:]
    rows_path = fleet["store"] / "history" / f"audit_run={summary['audit_run']}" / "findings.jsonl"
    rows = [json.loads(line) for line in rows_path.read_text().splitlines()]
    return summary, rows, r


def task_states(fleet: dict[str, Any]) -> dict[tuple[str, int], tuple[str, int]]:
    """(task_id, map_index) -> (state, try_number) of the latest run, read from Airflow's metadata DB."""
    with sqlite3.connect(fleet["home"] / "airflow.db") as db:
        (run_id,) = db.execute(
            "SELECT run_id FROM dag_run WHERE dag_id = 'kafka_fleet_audit__lab' ORDER BY id DESC LIMIT 1"
        ).fetchone()
        rows = db.execute(
            "SELECT task_id, map_index, state, try_number FROM task_instance WHERE dag_id = 'kafka_fleet_audit__lab' "
            "AND run_id = ?",
            (run_id,),
        ).fetchall()
    return {(t, m): (s, n) for t, m, s, n in rows}


def warning_or_above(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r["severity"] in ("critical", "warning") and r["status"] != "resolved"]


def test_audit_end_to_end(fleet: dict[str, Any]) -> None:
    state: lab.LabState = fleet["state"]
    # 1. a pristine lab: nothing at warning or above
    summary, rows, r = audit(fleet)
    assert r.returncode == 0, r.stdout[-3000:]
    assert warning_or_above(rows) == [], rows
    assert summary["audited"] == [1, 2, 3] and summary["not_audited"] == []
    assert Path(summary["report"]).is_file()
    # the run's start (discover's) and its end: its duration (the fleet metrics' last_audit_duration_seconds)
    assert summary["cluster"] == "lab" and 0 < RunSummary.from_dict(summary).duration_s < 900
    staged = sorted((fleet["store"] / "staging").glob("*/probe/broker_id=*/probe.jsonl.gz"))
    assert len(staged) == 3
    # each broker's segment, partition and file records went to Parquet beside its JSON Lines, all of them but
    # the file records holding objects (meta.properties) or offset checkpoints (probe_end counts them)
    for js in staged:
        records = [json.loads(line) for line in gzip.decompress(js.read_bytes()).splitlines()]
        assert not [r for r in records if r["kind"] in ("segment", "partition")]
        assert {r["file_type"] for r in records if r["kind"] == "file"} <= {"meta_properties", "offset_checkpoint"}
        end = next(r for r in records if r["kind"] == "probe_end")
        for kind in STAGED_KINDS:
            columnar = pq.read_table(js.with_name("probe" + kind.suffix))
            kept = sum(r["kind"] == kind.kind for r in records)
            assert columnar.num_rows + kept == end[kind.counted_as] and columnar.num_rows > 0, (js, kind.kind)

    # 2. incidents on different brokers: each one found with its rule, broker, partition and file
    injected = [inject(state, name, **opts) for name, opts in INCIDENTS]
    summary, rows, r = audit(fleet)
    assert r.returncode == 0, r.stdout[-3000:]
    for inj in injected:
        hits = [
            f
            for f in rows
            if f["rule"] == inj.rule
            and f.get("broker_id") == inj.broker_id
            and f.get("topic") == inj.topic
            and (inj.partition is None or f.get("partition") == inj.partition)
        ]
        assert hits, f"{inj.incident}: no {inj.rule} finding for broker {inj.broker_id} {inj.topic}-{inj.partition}"
        if inj.paths and inj.broker_id is not None:
            assert any(f.get("path") in inj.paths for f in hits), (inj.paths, [f.get("path") for f in hits])
        assert all(f["status"] == "new" for f in hits)
    assert summary["by_status"]["new"] >= len(INCIDENTS)
    html = Path(summary["report"]).read_text()
    assert "Findings over time" in html and "<svg" in html and "index-orphan" in html

    # 3. a second run: the same findings persist; a cleared incident is resolved
    stray = next(i for i in injected if i.incident == "stray-dir")
    shutil.rmtree(stray.paths[0])
    summary, rows2, r = audit(fleet)
    assert r.returncode == 0, r.stdout[-3000:]
    by_rule = {(f["rule"], f.get("broker_id"), f.get("path")): f["status"] for f in rows2}
    assert by_rule[("stray-dir", 2, stray.paths[0])] == "resolved"
    assert summary["by_status"]["resolved"] >= 1
    others = [f for f in rows2 if f["rule"] != "stray-dir"]
    assert others and all(f["status"] == "persisting" for f in others), [
        (f["rule"], f["status"]) for f in others if f["status"] != "persisting"
    ]


def test_unreachable_broker_is_reported_not_audited(fleet: dict[str, Any]) -> None:
    state: lab.LabState = fleet["state"]
    victim = state.broker(2)
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "airflow"), "dags", "test", "kafka_fleet_audit__lab"],
        env=fleet["env"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        time.sleep(2)  # the run has started: now broker 2's sshd goes away
        os.killpg(victim.sshd_pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
    summary = demo.latest_summary(fleet["data"])
    assert summary is not None, out[-3000:]
    assert summary["not_audited"] == [2] and summary["audited"] == [1, 3]
    states = task_states(fleet)
    stage = {m: v for (t, m), v in states.items() if t == "stage"}
    assert stage[1] == ("failed", 3)  # broker 2 (map index 1): failed after its 2 retries
    assert stage[0][0] == "success" and stage[2][0] == "success"
    assert states[("detect", -1)][0] == "success" and states[("publish", -1)][0] == "success"
    assert "Not audited" in Path(summary["report"]).read_text()
    rows = [
        json.loads(line)
        for line in (fleet["store"] / "history" / f"audit_run={summary['audit_run']}" / "findings.jsonl")
        .read_text()
        .splitlines()
    ]
    # broker 2's earlier findings are carried as unverified, not reported resolved
    assert {f["status"] for f in rows if f.get("broker_id") == 2} <= {"unverified"}
