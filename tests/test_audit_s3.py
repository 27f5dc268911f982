"""The audit DAG with its data store on S3 (``FLEET_DOCTOR_DATA=s3a://...``): a 3-broker fleet lab (real sshd,
ZooKeeper), an S3 server on 127.0.0.1, Airflow (SQLite, `airflow dags test`) and Spark reading and writing through
hadoop-aws. Every staged object, the findings dataset, the history and the report are in the bucket, nothing is
written locally, and the repair plans from the bucket's history."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from fleet_doctor import inventory, layout
from fleet_doctor.repair import tasks
from fleet_doctor.settings import REPO, Settings
from fleet_doctor.store import Store
from fleet_lab import demo, fleet
from fleet_lab.incidents import inject
from harness.ssh import ssh_connect

pytestmark = pytest.mark.timeout(1800)

INCIDENTS: list[tuple[str, dict[str, Any]]] = [
    ("index-orphan", {"broker": 1, "topic": "orders", "partition": 0}),
    ("segment-leftover", {"broker": 2, "topic": "clickstream"}),
    ("kill9-untrimmed-index", {"broker": 3}),  # the one the repair plans for: its indexes are quarantined
]


def test_audit_and_repair_plan_on_an_s3_store(s3: Any, tmp_path: Path) -> None:
    lab_dir, home = tmp_path / "lab", tmp_path / "airflow"
    data = s3.url("kafka-eu1")
    state = fleet.up(lab_dir, brokers=3)
    try:
        env = demo.airflow_environ(home, lab_dir, data)
        env.update(s3.env(), FLEET_DOCTOR_REPAIR_DIR=str(tmp_path / "repairs"))
        demo.prepare(env)
        injected = [inject(state, name, **opts) for name, opts in INCIDENTS]
        r = demo.run_audit(env, timeout=900)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]

        store = demo.store_of(data, env)  # the lab cluster's: clusters/lab/ in the bucket's prefix
        assert store.root == f"{Store(data, env).root}/clusters/lab"
        summary = demo.latest_summary(data, env)
        assert summary is not None and summary["audited"] == [1, 2, 3], summary
        run = summary["audit_run"]
        assert store.list(f"staging/{run}/probe") == ["broker_id=1", "broker_id=2", "broker_id=3"]
        for bid in (1, 2, 3):  # the bulk records as Parquet (written through an S3 stream), the rest JSON Lines
            assert store.list(f"staging/{run}/probe/broker_id={bid}") == [
                "probe.files.parquet",
                "probe.jsonl.gz",
                "probe.partitions.parquet",
                "probe.segments.parquet",
            ]
        staged = set(store.list(f"staging/{run}"))
        assert {"brokers.jsonl", "cluster-metadata.jsonl", "summary.json", "findings.jsonl"} <= staged
        assert summary["report"] == f"{data}/clusters/lab/reports/{run}.html"
        assert summary["findings_dataset"] == f"{data}/clusters/lab/findings/audit_run={run}"

        # the findings dataset Spark wrote through s3a://, read back with another S3 client
        parts = [n for n in store.list(f"findings/audit_run={run}") if n.endswith(".parquet")]
        assert parts, store.list(f"findings/audit_run={run}")
        table = pq.read_table(store._path(f"findings/audit_run={run}/{parts[0]}"), filesystem=store.fs)
        dataset_rules = set(table.column("rule").to_pylist())
        for part in parts[1:]:
            t = pq.read_table(store._path(f"findings/audit_run={run}/{part}"), filesystem=store.fs)
            dataset_rules |= set(t.column("rule").to_pylist())

        rows = store.read_jsonl(layout.history_findings(run))
        for inj in injected:
            hits = [f for f in rows if f["rule"] == inj.rule and f["broker_id"] == inj.broker_id]
            assert any(f["path"] in inj.paths for f in hits), (inj.incident, inj.paths, [f["path"] for f in hits])
            assert inj.rule in dataset_rules
        html = store.read_text(f"reports/{run}.html") or ""
        assert "index-orphan" in html and "segment-leftover" in html
        assert json.loads(store.read_text(f"reports/{run}.json") or "{}")["audit_run"] == run
        # nothing of the audit's data was written on the local disk (here, or in the default data root)
        local = [p for p in tmp_path.rglob("*") if p.name in ("probe.jsonl.gz", "runs.jsonl", f"{run}.html")]
        assert local == []
        default_root = REPO / ".fleet-doctor"
        assert not (default_root / "staging" / run).exists() and not (default_root / "reports" / f"{run}.html").exists()

        # the repair DAG's planning step reads the bucket's history and staged probe output
        settings = Settings.from_env(env).for_cluster("lab")  # as the lab cluster's repair DAG resolves them
        planned = tasks.make_plan(settings, {"audit_run": "latest"})
        assert planned["audit_run"] == run
        # the remote store's repairs go to FLEET_DOCTOR_REPAIR_DIR, there too each cluster's apart
        plan = json.loads((tmp_path / "repairs" / "clusters" / "lab" / planned["hash"] / "plan.json").read_text())
        planned_paths = {a["path"] for b in plan["brokers"] for a in b["actions"]}
        kill9 = next(i for i in injected if i.incident == "kill9-untrimmed-index")
        assert planned_paths and planned_paths & set(kill9.paths), (kill9.paths, planned_paths)

        # the repair's re-verify before it touches anything: an audit outside Airflow (stage, snapshot, spark-submit
        # with the store's settings and jars) into the same bucket's verify/ area gives the very same plan, and
        # leaves the audit's history and findings dataset as they were
        history_before = store.read_bytes(layout.HISTORY_RUNS)
        connect = ssh_connect(inventory.load(settings.inventory))
        verify_run, fresh = tasks.reverify(settings, "manual__r1", {}, connect)
        assert store.list(f"verify/{verify_run}/probe") == ["broker_id=1", "broker_id=2", "broker_id=3"]
        assert fresh.hash == planned["hash"]
        assert store.read_bytes(layout.HISTORY_RUNS) == history_before
        assert f"audit_run={verify_run}" not in store.list("findings")
    finally:
        fleet.down(lab_dir)
