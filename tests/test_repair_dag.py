"""The repair DAG's integrity: manual, one run at a time, plan -> human approval -> execute, the form's params."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import inventories
from harness.dags import ZK_CLUSTER, dag_bag, parse

REPO = Path(__file__).resolve().parents[1]
REPAIR, RESTORE = f"kafka_fleet_repair__{ZK_CLUSTER}", f"kafka_fleet_restore__{ZK_CLUSTER}"


def one_cluster(tmp_path: Path) -> Path:
    return inventories.write(tmp_path / "inventory.json", inventories.inventory(ZK_CLUSTER, brokers=3))


def test_repair_dag_is_manual_and_approval_gated() -> None:
    dag = dag_bag().dags[REPAIR]
    assert dag.schedule is None and dag.max_active_runs == 1
    assert {"kafka", "fleet-doctor", "repair", f"cluster:{ZK_CLUSTER}", "zookeeper"} <= set(dag.tags)
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
    approve, approve_zk = dag.get_task("approve"), dag.get_task("approve_zookeeper")  # each its own approval
    assert type(approve).__name__ == type(approve_zk).__name__ == "PlanApprovalOperator"
    assert approve.response_timeout.total_seconds() == 24 * 3600
    assert "plan" in approve.subject and "markdown" in approve.body
    # the options are the plan's: its approving option (from the plan task's XCom, rendered) and Reject
    assert "options" in approve.template_fields and approve.options[1] == "Reject" and not approve.multiple
    assert "['approve_option']" in approve.options[0] and "['zookeeper_approve_option']" in approve_zk.options[0]
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
    dry_run = params.get_param("dry_run").schema  # the Trigger form shows it by its title, with what it does
    assert "Dry run" in dry_run["title"] and "write nothing" in params.get_param("dry_run").description
    assert params["healthy_polls"] >= 3 and params["isr_timeout_s"] >= 60  # minutes, not seconds


def test_restore_dag_is_manual_and_takes_a_plan() -> None:
    dag = dag_bag().dags[RESTORE]
    assert dag.schedule is None and dag.max_active_runs == 1
    assert {"restore", f"cluster:{ZK_CLUSTER}"} <= set(dag.tags)
    assert {t.task_id: sorted(t.downstream_task_ids) for t in dag.tasks} == {
        "plan": ["approve", "restore"],
        "approve": ["restore"],
        "restore": [],
    }  # a restore changes brokers too: it runs only after a human approved its plan
    approve = dag.get_task("approve")
    assert type(approve).__name__ == "PlanApprovalOperator" and approve.options[1] == "Reject"
    assert "['approve_option']" in approve.options[0]
    assert {"plan", "attempt", "brokers", "start", "min_insync_replicas"} <= set(dag.params)
    assert dag.params.get_param("plan").schema["pattern"] == "^[0-9a-f]{12,64}$"


def test_approvers_reach_the_approve_tasks_as_hitl_users(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """FLEET_DOCTOR_APPROVERS as Airflow's HITL users ({"id", "name"}), not plain names: those made the approve task
    fail when it created its request (TypeError: string indices must be integers)."""
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "airflow"))
    bag = parse(REPO / "dags" / "kafka_fleet_repair.py", one_cluster(tmp_path), FLEET_DOCTOR_APPROVERS="alice, bob")
    assert bag.import_errors == {}
    dag = bag.dags[REPAIR]
    for task_id in ("approve", "approve_zookeeper"):
        assert dag.get_task(task_id).assigned_users == [{"id": "alice", "name": "alice"}, {"id": "bob", "name": "bob"}]


def test_an_s3_endpoint_with_credentials_never_reaches_a_dag(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The endpoint goes into the detect task's Spark conf, which is serialized with the DAG and shown in the UI:
    one with credentials in it makes the DAG files fail to load, with a message that names the variable, not the
    secret."""
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "airflow"))
    bag = parse(
        REPO / "dags",
        one_cluster(tmp_path),
        FLEET_DOCTOR_DATA="s3a://bucket/fleet-doctor",
        FLEET_DOCTOR_REPAIR_DIR=str(tmp_path / "repairs"),
        FLEET_DOCTOR_S3_ENDPOINT="http://AKIAKEY:s3cr3t@127.0.0.1:9000",
    )
    assert bag.dags == {}
    errors = "\n".join(bag.import_errors.values())
    assert "FLEET_DOCTOR_S3_ENDPOINT" in errors and "no credentials" in errors
    assert "s3cr3t" not in errors and "AKIAKEY" not in errors


def test_the_approve_task_skips_only_its_own_downstream_on_reject(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PlanApprovalOperator.execute_complete on the parsed repair DAG, with events as Airflow hands them over after
    an answer: Reject skips the direct downstream task only (execute, not the ZooKeeper branch); the approving option
    skips nothing; a timeout, an answer that is not an option, or options that lost their approving one fail the
    task (so the acting task never runs)."""
    from datetime import UTC, datetime

    from airflow.providers.standard.exceptions import HITLTimeoutError

    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "airflow"))
    dag = dag_bag().dags[REPAIR]
    approve = dag.get_task("approve")
    option = "Approve: restart 3 brokers, change 6 files (plan 0123456789ab)"
    approve.options = [option, "Reject"]  # as Airflow renders the template from the plan task's XCom
    skipped: list[tuple[object, list[str]]] = []
    approve.skip = lambda ti, tasks: skipped.append((ti, sorted(t.task_id for t in tasks)))  # type: ignore[method-assign]
    ti = object()

    def answer(chosen: str) -> dict[str, object]:
        user = {"id": "alice", "name": "alice"}
        return {
            "chosen_options": [chosen],
            "params_input": {},
            "responded_at": datetime.now(UTC),
            "responded_by_user": user,
        }

    context = {"task": approve, "ti": ti}
    assert approve.execute_complete(context, answer("Reject"))["chosen_options"] == ["Reject"]
    assert skipped == [(ti, ["execute"])] and approve.hitl_summary_extra["approved"] is False
    skipped.clear()
    assert approve.execute_complete(context, answer(option))["chosen_options"] == [option]
    assert skipped == [] and approve.hitl_summary_extra["approved"] is True
    with pytest.raises(HITLTimeoutError):
        approve.execute_complete(context, {"error": "no answer in 24 h", "error_type": "timeout"})
    with pytest.raises(ValueError, match="not in"):
        approve.execute_complete(context, answer("Approve: restart 1 broker (plan 0123456789ab)"))
    approve.options = ["Reject", "Reject"]  # the plan task's XCom changed: no approving option left
    with pytest.raises(ValueError, match="no approving option"):
        approve.execute_complete(context, answer("Reject"))
    assert skipped == []
