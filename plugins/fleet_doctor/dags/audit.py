"""
### Kafka fleet audit (nightly), one DAG per cluster: `kafka_fleet_audit__<cluster>`

Audits every broker of the cluster's inventory and tells the on-call what is wrong before the next restart hurts.
One DAG per cluster of `FLEET_DOCTOR_INVENTORY` (a file, or a directory with one cluster per `*.json`); a cluster
without a schedule of its own starts within the fleet's window (docs/fleet.md).

1. **discover**: brokers from the cluster's inventory and their registrations: ZooKeeper
   `/brokers/ids`, or on a KRaft cluster the brokers registered and unfenced in the most up-to-date metadata log of
   the controllers (read over SSH); a broker known to only one of them is reported, never dropped. A manual run
   may audit only some brokers (param `brokers`); the others' earlier findings are then carried as unverified, not
   resolved.
2. **stage** (one mapped task per broker, pool `kafka_fleet_audit`): the probe is streamed over the broker's SSH
   connection (`kafka_ssh_<cluster>_<id>`, host key pinned) and run with `nice -n 19` / `ionice -c 3`; its output
   is staged gzip'd and renamed into place only when complete. Retries with exponential backoff; a broker that
   stays unreachable fails its own task only and the report lists it as **not audited**.
3. **snapshot_metadata**: topics, partition states, brokers, controller: from ZooKeeper (kazoo, read-only), or on
   a KRaft cluster decoded from each controller's `__cluster_metadata` log over SSH (host key pinned, read once per
   run, by discover); the most up-to-date log gives the cluster facts (the report names its controller and
   snapshot), every controller's own log header and problems go to the KRaft rules.
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
from airflow.sdk import DAG, Asset, Param, dag, get_current_context, task

from fleet_doctor import layout, zookeeper
from fleet_doctor.audit import alerts, history, steps
from fleet_doctor.audit.detect_task import DetectOperator
from fleet_doctor.fleet_dags import ClusterDags
from fleet_doctor.remote import airflow_ssh_client
from fleet_doctor.settings import Settings


def every_cluster(parsed: Settings, clusters: list[ClusterDags]) -> dict[str, DAG]:
    """Each cluster's audit DAG, by id (``parsed``: the settings read when the DAG file is parsed)."""
    return {c.audit: kafka_fleet_audit(c, parsed) for c in clusters}


def kafka_fleet_audit(cluster: ClusterDags, parsed: Settings) -> DAG:
    """The cluster's audit DAG. ``parsed`` shapes it; every task resolves its own settings, for its cluster."""
    name = cluster.cluster
    findings = Asset(name=f"kafka_fleet_findings__{name}", uri=parsed.for_cluster(name).findings_asset_uri())

    def settings() -> Settings:
        return Settings.from_env().for_cluster(name)

    @dag(
        dag_id=cluster.audit,
        schedule=cluster.schedule,
        start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
        catchup=False,
        max_active_runs=1,
        max_active_tasks=cluster.stage_slots + 2,  # stage's share of the pool, not Airflow's per-DAG default (16)
        tags=cluster.tags("audit"),
        doc_md=__doc__,
        default_args={"retries": 1, "retry_delay": timedelta(seconds=30)},
        params={"brokers": Param([], type="array", description="audit only these broker ids (empty: every broker)")},
    )
    def audit() -> None:
        @task
        def discover() -> list[dict[str, Any]]:
            """The brokers to stage (what ``stage`` maps over); the whole discovery is pushed as XCom ``fleet``."""
            here = settings()
            here.store.check()  # an unreachable store or a missing bucket stops the run here, named
            context = get_current_context()
            discovered = steps.discover(
                here.load_inventory(),
                only=context["params"].get("brokers") or [],
                store=here.store,  # KRaft: the controllers' metadata, read once for the run, staged here
                area=layout.staging(context["run_id"]),
                lock_dir=steps.audit_lock_dir(here),  # KRaft: where its repair lock lives (the repairs dir)
            )
            steps.show_repair_lock(here.store, discovered)  # the fleet page's view of the repair lock
            context["ti"].xcom_push(key="fleet", value=discovered)
            return discovered["brokers"]

        @task(
            pool=parsed.pool,  # one pool for the fleet; each cluster's runs take at most its share at once
            max_active_tis_per_dagrun=cluster.stage_slots,
            retries=parsed.stage_retries,
            retry_delay=timedelta(seconds=parsed.stage_retry_delay_s),
            retry_exponential_backoff=True,
            map_index_template="broker {{ broker_label }}",
        )
        def stage(broker: dict[str, Any]) -> dict[str, Any]:
            here = settings()
            context = get_current_context()
            context["broker_label"] = str(broker["broker_id"])  # type: ignore[typeddict-unknown-key]
            client = airflow_ssh_client(broker["ssh_conn_id"])
            try:
                return steps.stage_broker(
                    client,
                    broker,
                    here.store,
                    layout.staging(context["run_id"]),
                    deep=here.deep,
                    verify_crc=here.verify_crc,
                    timeout=here.ssh_timeout_s,
                )
            finally:
                client.close()

        @task
        def snapshot_metadata(discovered: dict[str, Any]) -> int:
            """ZooKeeper's snapshot, or the KRaft controllers' metadata logs (their SSH connections, as discover's)."""
            here = settings()
            area = layout.staging(get_current_context()["run_id"])
            inv = here.load_inventory()
            auth = None if inv.kraft else zookeeper.credentials(inv)  # the kafka_zk_<cluster> connection
            return steps.snapshot_metadata(discovered, here.store, area, auth=auth)

        @task(trigger_rule="all_done", multiple_outputs=True)
        def broker_facts(discovered: dict[str, Any]) -> dict[str, Any]:
            """Runs whatever happened to the stage tasks: only completely staged brokers are audited."""
            here = settings()
            run_id = get_current_context()["run_id"]
            facts = steps.write_broker_facts(discovered, here.store, layout.staging(run_id))
            if not facts["audited"]:
                raise RuntimeError("no broker could be staged: nothing to audit")
            return {**facts, "detect_args": steps.detect_args(here, run_id, facts)}

        @task(outlets=[findings])
        def publish(discovered: dict[str, Any], facts: dict[str, Any]) -> dict[str, Any]:
            return history.publish(settings(), get_current_context()["run_id"], discovered, facts)

        @task
        def alert(summary: dict[str, Any]) -> str | None:
            return alerts.send_alert(settings(), summary)

        brokers = discover()
        discovered = brokers["fleet"]
        staged = stage.expand(broker=brokers)
        metadata = snapshot_metadata(discovered)
        facts = broker_facts(discovered)
        [staged, metadata] >> facts
        detect = DetectOperator(
            task_id="detect",
            conn_id="spark_default",
            conf=parsed.detect_conf({}),
            jars=parsed.spark_jars or None,
            secret_file=parsed.spark_auth_file,
            application_args=facts["detect_args"],
        )
        summary = publish(discovered, facts)
        detect >> summary
        alert(summary)

    return audit()
