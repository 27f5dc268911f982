"""The audit DAG's integrity: it imports, and its graph, schedule, pool, retries and tags are what the runbook says."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from fleet_doctor.settings import Settings

REPO = Path(__file__).resolve().parents[1]


def load_dag(tmp_path: Path, **env: str):
    os.environ.setdefault("AIRFLOW_HOME", str(tmp_path / "airflow"))
    for k, v in env.items():
        os.environ[k] = v
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(REPO / "dags"))
    assert bag.import_errors == {}
    return bag.dags["kafka_fleet_audit"]


@pytest.fixture
def dag(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("FLEET_DOCTOR_AUDIT_SCHEDULE", "0 2 * * *")
    monkeypatch.delenv("FLEET_DOCTOR_AUDIT_POOL", raising=False)
    return load_dag(tmp_path)


def test_schedule_runs_and_tags(dag) -> None:
    assert dag.timetable.expression == "0 2 * * *"  # nightly at 02:00 by default
    assert dag.max_active_runs == 1 and dag.catchup is False
    assert {"kafka", "fleet-doctor", "audit"} <= set(dag.tags)
    assert dag.doc_md and "not audited" in dag.doc_md
    assert dag.params["brokers"] == []  # the nightly run audits the whole fleet; a manual run may pick brokers


def test_graph_is_the_runbook(dag) -> None:
    down = {t.task_id: set(t.downstream_task_ids) for t in dag.tasks}
    # no pass-through tasks: stage maps over discover's brokers, detect takes broker_facts' detect_args key
    assert down["discover"] == {"stage", "snapshot_metadata", "broker_facts", "publish"}
    assert down["stage"] == {"broker_facts"} and down["snapshot_metadata"] == {"broker_facts"}
    assert down["broker_facts"] == {"detect", "publish"}
    assert down["detect"] == {"publish"} and down["publish"] == {"alert"} and down["alert"] == set()


def test_stage_is_mapped_pooled_and_retried(dag) -> None:
    stage = dag.get_task("stage")
    assert stage.pool == "kafka_fleet_audit"
    # the pool (32 slots by default: a 20-broker fleet stages in one wave) bounds staging, not the DAG's own cap
    assert dag.max_active_tasks == Settings.from_env().pool_slots + 2  # 34 unless configured
    assert stage.retries == 2 and stage.retry_exponential_backoff
    assert type(stage).__name__.endswith("MappedOperator")  # one task instance per broker
    # a failed broker must not stop the audit of the others
    assert str(dag.get_task("broker_facts").trigger_rule) in ("all_done", "TriggerRule.ALL_DONE")


def test_detect_is_spark_submit_of_the_detection_app(dag) -> None:
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    detect = dag.get_task("detect")
    assert isinstance(detect, SparkSubmitOperator)
    assert detect._conn_id == "spark_default"
    assert detect.application.endswith("spark_apps/detect.py") and Path(detect.application).is_file()
    # nothing of a local driver is pinned at parse time: the profile comes from the connection's master when it runs
    assert "spark.driver.host" not in (detect.conf or {})


def test_publish_emits_the_findings_asset(dag) -> None:
    outlets = dag.get_task("publish").outlets
    assert [a.name for a in outlets] == ["kafka_fleet_findings"]


def test_schedule_and_pool_are_configurable(tmp_path: Path) -> None:
    code = (
        "import sys; sys.path.insert(0, 'plugins');"
        "from airflow.dag_processing.dagbag import DagBag;"
        "d = DagBag(dag_folder='dags').dags['kafka_fleet_audit'];"
        "print(d.timetable.expression, d.get_task('stage').pool)"
    )
    env = dict(
        os.environ,
        AIRFLOW_HOME=str(tmp_path / "af"),
        FLEET_DOCTOR_AUDIT_SCHEDULE="30 3 * * 1-5",
        FLEET_DOCTOR_AUDIT_POOL="audit_eu1",
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "30 3 * * 1-5 audit_eu1"


@pytest.mark.parametrize(
    "connection,profile",
    [
        ({"conn_type": "spark", "host": "local[2]"}, "local"),
        ({"conn_type": "spark", "host": "spark://spark-master", "port": 7077}, "cluster"),
        (
            {"conn_type": "spark", "host": "spark://spark-master", "port": 7077, "extra": {"deploy-mode": "cluster"}},
            "cluster",
        ),
        ({"conn_type": "spark", "host": "yarn"}, "cluster"),
    ],
)
def test_detect_submits_with_the_spark_profile_of_its_connections_master(
    monkeypatch: pytest.MonkeyPatch, connection: dict, profile: str
) -> None:
    """The profile is chosen when the task runs, from the master the spark_default connection names; the library
    goes along as a --py-files archive; a local master gets this interpreter's Spark and a loopback driver, a cluster
    master none of that. Checked on the spark-submit command the Spark provider builds from the task."""
    from fleet_doctor import spark
    from fleet_doctor.audit.detect_task import DetectOperator

    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps(connection))
    op = DetectOperator(task_id="detect", conn_id="spark_default", conf={"spark.extra": "1"}, application_args=["-x"])
    op.prepare()
    cmd = op._get_hook()._build_spark_submit_command(op.application)
    confs = {cmd[i + 1].split("=", 1)[0]: cmd[i + 1].split("=", 1)[1] for i, c in enumerate(cmd) if c == "--conf"}
    assert {k: v for k, v in confs.items() if k.startswith("spark.") and "appMasterEnv" not in k} == {
        **spark.PROFILES[profile],
        "spark.extra": "1",
    }
    assert "spark.driver.extraJavaOptions" not in confs  # the nightly run is no short run: the full JIT
    py_files = cmd[cmd.index("--py-files") + 1]
    with zipfile.ZipFile(py_files) as zf:
        assert {"fleet_doctor/detect/__init__.py", "fleet_doctor/rules.py"} <= set(zf.namelist())
    assert cmd[-2:] == [op.application, "-x"]
    if profile == "local":
        assert op.env_vars["SPARK_LOCAL_IP"] == "127.0.0.1" and op.env_vars["PYSPARK_PYTHON"] == sys.executable
    else:
        assert not op.env_vars and not any("appMasterEnv" in c or "127.0.0.1" in c for c in cmd)
