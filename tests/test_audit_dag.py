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
from harness import inventories
from harness.dags import FLEET, KRAFT_CLUSTER, ZK_CLUSTER, dag_bag, parse

REPO = Path(__file__).resolve().parents[1]
AUDIT = f"kafka_fleet_audit__{ZK_CLUSTER}"


@pytest.fixture
def dag():
    return dag_bag().dags[AUDIT]


def test_schedule_runs_and_tags(dag) -> None:
    # nightly at 02:00 by default, spread over a 120-minute window: the second of two clusters (by name) at 03:00
    assert dag.timetable.expression == "0 3 * * *"
    assert dag.max_active_runs == 1 and dag.catchup is False
    assert {"kafka", "fleet-doctor", "audit", f"cluster:{ZK_CLUSTER}", "zookeeper"} <= set(dag.tags)
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
    assert stage.pool == "kafka_fleet_audit"  # one pool for the fleet
    # the pool (32 slots by default: a 20-broker cluster stages in one wave) bounds staging, not the DAG's own cap;
    # with two clusters each may take all of it
    assert stage.max_active_tis_per_dagrun == Settings.from_env().pool_slots == 32
    assert dag.max_active_tasks == 32 + 2
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


def test_publish_emits_the_clusters_findings_asset(dag) -> None:
    outlets = dag.get_task("publish").outlets
    assert [a.name for a in outlets] == [f"kafka_fleet_findings__{ZK_CLUSTER}"]
    assert outlets[0].uri.endswith(f"/clusters/{ZK_CLUSTER}/findings")


def test_each_cluster_has_its_own_dags_tagged_with_its_metadata_mode() -> None:
    bag = dag_bag()
    fleet = [d["cluster"] for d in FLEET]
    assert sorted(bag.dags) == sorted(
        f"kafka_fleet_{kind}__{c}" for kind in ("audit", "repair", "restore", "purge", "roll") for c in fleet
    )
    kraft = bag.dags[f"kafka_fleet_audit__{KRAFT_CLUSTER}"]
    assert {"kraft", f"cluster:{KRAFT_CLUSTER}", "audit"} <= set(kraft.tags) and "zookeeper" not in kraft.tags
    assert {"kraft", f"cluster:{KRAFT_CLUSTER}", "repair"} <= set(bag.dags[f"kafka_fleet_repair__{KRAFT_CLUSTER}"].tags)
    assert {"kraft", f"cluster:{KRAFT_CLUSTER}", "roll"} <= set(bag.dags[f"kafka_fleet_roll__{KRAFT_CLUSTER}"].tags)
    # the first cluster's nightly audit starts at the schedule's time, the second's half the window after it
    assert kraft.timetable.expression == "0 2 * * *"


def test_the_audits_spread_over_the_window_unless_an_inventory_sets_its_schedule(tmp_path: Path) -> None:
    clusters = [inventories.inventory(f"c{i}") for i in range(4)]
    clusters[2]["schedule"] = "@hourly"
    bag = parse(REPO / "dags", inventories.fleet_dir(tmp_path / "fleet", *clusters), FLEET_DOCTOR_AUDIT_WINDOW="90")
    assert bag.import_errors == {}
    schedules = {c: bag.dags[f"kafka_fleet_audit__{c}"].timetable.expression for c in ("c0", "c1", "c2", "c3")}
    assert schedules == {"c0": "0 2 * * *", "c1": "30 2 * * *", "c2": "0 * * * *", "c3": "0 3 * * *"}


def test_a_broken_inventory_never_hides_the_other_clusters_dags(tmp_path: Path) -> None:
    fleet = inventories.fleet_dir(tmp_path / "fleet", inventories.inventory("good"))
    inventories.write(fleet / "broken.json", "{not json")
    inventories.write(fleet / "bad-schedule.json", inventories.inventory("bad", schedule="at two"))
    missing = inventories.inventory("missing-field")
    del missing["brokers"]
    inventories.write(fleet / "missing.json", missing)
    bag = parse(REPO / "dags", fleet)
    assert bag.import_errors == {}
    assert sorted(bag.dags) == [f"kafka_fleet_{k}__good" for k in ("audit", "purge", "repair", "restore", "roll")]
    # and a cluster added shows up at the next parse
    inventories.write(fleet / "new.json", inventories.inventory("new"))
    assert "kafka_fleet_audit__new" in parse(REPO / "dags", fleet).dags


def test_many_clusters_share_the_pool_fairly(tmp_path: Path) -> None:
    fleet = inventories.fleet_dir(tmp_path / "fleet", *(inventories.inventory(f"c{i:02d}") for i in range(50)))
    bag = parse(REPO / "dags", fleet)
    stage = bag.dags["kafka_fleet_audit__c07"].get_task("stage")
    assert stage.pool == "kafka_fleet_audit" and stage.max_active_tis_per_dagrun == 4  # 2 x 32 / 50, at least 4
    schedules = {bag.dags[f"kafka_fleet_audit__c{i:02d}"].timetable.expression for i in range(50)}
    assert len(schedules) == 50  # 120 minutes over 50 clusters: no two start together


def test_a_missing_inventory_is_an_import_error_that_names_it(tmp_path: Path) -> None:
    bag = parse(REPO / "dags", tmp_path / "nowhere.json")
    assert bag.dags == {} and all("nowhere.json" in e for e in bag.import_errors.values())


def test_schedule_and_pool_are_configurable(tmp_path: Path) -> None:
    inv = inventories.write(tmp_path / "prod.json", inventories.inventory("prod"))
    code = (
        "import sys; sys.path.insert(0, 'plugins');"
        "from airflow.dag_processing.dagbag import DagBag;"
        "d = DagBag(dag_folder='dags').dags['kafka_fleet_audit__prod'];"
        "print(d.timetable.expression, d.get_task('stage').pool)"
    )
    env = dict(
        os.environ,
        AIRFLOW_HOME=str(tmp_path / "af"),
        FLEET_DOCTOR_INVENTORY=str(inv),
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
