"""The repair DAG's integrity: manual, one run at a time, plan -> human approval -> execute, the form's params."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_repair_dag_is_manual_and_approval_gated(tmp_path: Path) -> None:
    os.environ.setdefault("AIRFLOW_HOME", str(tmp_path / "airflow"))
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(REPO / "dags"))
    assert bag.import_errors == {}
    dag = bag.dags["kafka_fleet_repair"]
    assert dag.schedule is None and dag.max_active_runs == 1
    assert {"kafka", "fleet-doctor", "repair"} <= set(dag.tags)
    down = {t.task_id: set(t.downstream_task_ids) for t in dag.tasks}
    assert down == {
        "plan": {"brokers_to_repair", "execute", "zookeeper_to_repair", "restore_topic_ids"},
        "brokers_to_repair": {"approve"},
        "approve": {"execute"},
        "execute": set(),
        "zookeeper_to_repair": {"approve_zookeeper"},
        "approve_zookeeper": {"restore_topic_ids"},
        "restore_topic_ids": set(),
    }
    assert type(dag.get_task("approve_zookeeper")).__name__ == "ApprovalOperator"  # its own approval
    approve = dag.get_task("approve")
    assert type(approve).__name__ == "ApprovalOperator"
    assert approve.response_timeout.total_seconds() == 24 * 3600
    assert "plan" in approve.subject and "markdown" in approve.body
    params = dag.params
    for name in (
        "audit_run",
        "rules",
        "brokers",
        "topics",
        "hold_out",
        "include_internal",
        "dry_run",
        "pause_between_brokers_s",
        "healthy_polls",
        "isr_timeout_s",
    ):
        assert name in params
    assert params["include_internal"] is False and params["dry_run"] is False
    assert params["healthy_polls"] >= 3 and params["isr_timeout_s"] >= 60  # minutes, not seconds


def test_restore_dag_is_manual_and_takes_a_plan(tmp_path: Path) -> None:
    os.environ.setdefault("AIRFLOW_HOME", str(tmp_path / "airflow"))
    from airflow.dag_processing.dagbag import DagBag

    dag = DagBag(dag_folder=str(REPO / "dags")).dags["kafka_fleet_restore"]
    assert dag.schedule is None and dag.max_active_runs == 1
    assert [t.task_id for t in dag.tasks] == ["restore"]
    assert {"plan", "brokers", "start"} <= set(dag.params)
