"""
### Kafka fleet audit (nightly)

Audits every broker of the cluster inventory and tells the on-call what is wrong before the next restart hurts.

1. **discover**: brokers from the inventory (`FLEET_DOCTOR_INVENTORY`) and from ZooKeeper `/brokers/ids`; a broker
   known to only one of them is reported, never dropped. A manual run may audit only some brokers (param
   `brokers`); the others' earlier findings are then carried as unverified, not resolved.
2. **stage** (one mapped task per broker, pool `kafka_fleet_audit`): the probe is streamed over the broker's SSH
   connection (`kafka_ssh_<cluster>_<id>`, host key pinned) and run with `nice -n 19` / `ionice -c 3`; its output
   is staged gzip'd and renamed into place only when complete. Retries with exponential backoff; a broker that
   stays unreachable fails its own task only and the report lists it as **not audited**.
3. **snapshot_zookeeper**: topics, partition states, brokers, controller (kazoo, read-only).
4. **detect**: `spark_apps/detect.py` through `SparkSubmitOperator` (connection `spark_default`).
5. **publish**: findings history (new / persisting / resolved), the HTML report, a compact summary in XCom, and
   the `kafka_fleet_findings` asset for the repair DAG.
6. **alert**: critical findings or unaudited brokers go to the configured notifiers (the task log by default).

Operator guide: `docs/audit.md`. Architecture: `docs/architecture.md`.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pendulum
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import Asset, Param, dag, get_current_context, task

from fleet_doctor import audit, inventory
from fleet_doctor.alerts import send_alert
from fleet_doctor.scan import LOCAL_SPARK_CONF, spark_env

SETTINGS = audit.settings_from_env()
FINDINGS = Asset(name="kafka_fleet_findings", uri=audit.asset_uri(SETTINGS.findings_url))


@dag(
    dag_id="kafka_fleet_audit",
    schedule=SETTINGS.schedule,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    max_active_tasks=SETTINGS.pool_slots + 2,  # the pool bounds the stage tasks, not Airflow's per-DAG default (16)
    tags=["kafka", "fleet-doctor", "audit"],
    doc_md=__doc__,
    default_args={"retries": 1, "retry_delay": timedelta(seconds=30)},
    params={"brokers": Param([], type="array", description="audit only these broker ids (empty: the whole fleet)")},
)
def kafka_fleet_audit() -> None:
    @task
    def discover() -> dict[str, Any]:
        settings = audit.settings_from_env()
        settings.store.check()  # an unreachable store or a missing bucket stops the run here, named
        only = get_current_context()["params"].get("brokers") or []
        return audit.discover(inventory.load(settings.inventory), only=only)

    @task
    def brokers_to_stage(discovered: dict[str, Any]) -> list[dict[str, Any]]:
        return discovered["brokers"]

    @task(
        pool=SETTINGS.pool,
        retries=SETTINGS.stage_retries,
        retry_delay=timedelta(seconds=SETTINGS.stage_retry_delay_s),
        retry_exponential_backoff=True,
        map_index_template="broker {{ broker_label }}",
    )
    def stage(broker: dict[str, Any]) -> dict[str, Any]:
        from airflow.providers.ssh.hooks.ssh import SSHHook

        settings = audit.settings_from_env()
        context = get_current_context()
        context["broker_label"] = str(broker["broker_id"])  # type: ignore[typeddict-unknown-key]
        client = SSHHook(ssh_conn_id=broker["ssh_conn_id"], conn_timeout=10).get_conn()
        try:
            return audit.stage_broker(
                client, broker, settings.store, settings.run_key(context["run_id"]), deep=settings.deep,
                verify_crc=settings.verify_crc, timeout=settings.ssh_timeout_s,
            )  # fmt: skip
        finally:
            client.close()

    @task
    def snapshot_zookeeper(discovered: dict[str, Any]) -> int:
        settings = audit.settings_from_env()
        run_key = settings.run_key(get_current_context()["run_id"])
        return audit.snapshot_zookeeper(discovered["zookeeper"], settings.store, f"{run_key}/zk.jsonl")

    @task(trigger_rule="all_done")
    def broker_facts(discovered: dict[str, Any]) -> dict[str, Any]:
        """Runs whatever happened to the stage tasks: only completely staged brokers are audited."""
        settings = audit.settings_from_env()
        run_id = get_current_context()["run_id"]
        facts = audit.write_broker_facts(discovered, settings.store, settings.run_key(run_id))
        if not facts["audited"]:
            raise RuntimeError("no broker could be staged: nothing to audit")
        return {**facts, "detect_args": audit.detect_args(settings, run_id, facts)}

    @task
    def detect_args(facts: dict[str, Any]) -> list[str]:
        return facts["detect_args"]

    @task(outlets=[FINDINGS])
    def publish(discovered: dict[str, Any], facts: dict[str, Any]) -> dict[str, Any]:
        settings = audit.settings_from_env()
        return audit.publish(settings, get_current_context()["run_id"], discovered, facts)

    @task
    def alert(summary: dict[str, Any]) -> str | None:
        return send_alert(summary)

    discovered = discover()
    staged = stage.expand(broker=brokers_to_stage(discovered))
    zk = snapshot_zookeeper(discovered)
    facts = broker_facts(discovered)
    [staged, zk] >> facts
    detect = SparkSubmitOperator(
        task_id="detect",
        application=str(audit.DETECT_APP),
        conn_id="spark_default",
        name="fleet-doctor-detect",
        conf=SETTINGS.detect_conf({k: v for k, v in LOCAL_SPARK_CONF.items() if k != "spark.driver.extraJavaOptions"}),
        jars=SETTINGS.spark_jars or None,
        application_args=detect_args(facts),
        # spark-submit inherits the worker's environment (an s3a:// store's AWS_* credentials: never put them in the
        # DAG, whose arguments Airflow stores and shows)
        env_vars={k: v for k, v in spark_env().items() if k.startswith(("SPARK", "PYSPARK", "PATH"))},
    )
    summary = publish(discovered, facts)
    detect >> summary
    alert(summary)


kafka_fleet_audit()
