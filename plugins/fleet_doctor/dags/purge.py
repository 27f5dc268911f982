"""
### Kafka fleet purge (manual, human-approved), one DAG per cluster: `kafka_fleet_purge__<cluster>`

Deletes what a repair quarantined: its plan's index files moved aside in the partition dirs, its stray replicas moved
beside the log dirs. A repair never deletes them itself; they hold disk until a person approves this.

1. **plan**: for the repair plan's hash (12+ hex digits) and brokers (default: every broker), every entry the plan
   quarantined, read on each broker beside the running broker (nothing is changed): those quarantined at least
   `older_than_days` ago (default 7) are planned, the younger ones kept. The plan names every entry, its bytes and
   when it was quarantined.
2. **approve**: a human approves the deletion (Browse → Required Actions) with its own button, e.g. "Approve: delete
   12 entr(ies), free 240.0 MiB (purge 1f2e3d4c5b6a)"; `FLEET_DOCTOR_APPROVERS` applies. There is no undo.
3. **purge**: reads the answer itself (an approve task marked success by hand is refused), takes the cluster's repair
   lock (none while a repair, restore or purge of the cluster holds it), and deletes each entry only while it is
   still in that quarantine with its planned size (nothing followed; a changed entry is refused). No broker stops.
   The result names what was deleted and the bytes freed.

Operator guide: `docs/repair.md`, "Deleting a quarantine".
"""

from __future__ import annotations

from airflow.sdk import DAG, Param, dag

from fleet_doctor.dags.approved import plan_approve_act
from fleet_doctor.fleet_dags import ClusterDags
from fleet_doctor.repair import purge_tasks
from fleet_doctor.repair.params import manual_dag_args
from fleet_doctor.settings import Settings


def every_cluster(parsed: Settings, clusters: list[ClusterDags]) -> dict[str, DAG]:
    """Each cluster's purge DAG, by id (``parsed``: the settings read when the DAG file is parsed)."""
    return {c.purge: kafka_fleet_purge(c, parsed) for c in clusters}


def kafka_fleet_purge(cluster: ClusterDags, parsed: Settings) -> DAG:
    """The cluster's purge DAG."""

    def settings() -> Settings:
        return Settings.from_env().for_cluster(cluster.cluster)

    @dag(
        dag_id=cluster.purge,
        **manual_dag_args(),
        tags=cluster.tags("purge"),
        doc_md=__doc__,
        params={
            "plan": Param(type="string", pattern="^[0-9a-f]{12,64}$", description="the repair plan's hash"),
            "brokers": Param([], type="array", description="broker ids (empty: every broker)"),
            "older_than_days": Param(
                purge_tasks.DEFAULT_OLDER_THAN_DAYS,
                type="number",
                minimum=0,
                description="delete only what was quarantined at least this many days ago",
            ),
        },
    )
    def purge_dag() -> None:
        plan_approve_act(parsed, settings, purge_tasks.plan, purge_tasks.approval_request, purge_tasks.purge, "purge")

    return purge_dag()
