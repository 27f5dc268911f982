"""
### Kafka fleet restore (manual, human-approved), one DAG per cluster: `kafka_fleet_restore__<cluster>`

Puts a repair's backups back.

The undo of the cluster's `kafka_fleet_repair__<cluster>`, with the same care as the repair.

On a KRaft cluster: the same lock, gates and order as the repair's there, and a restore onto a voter's metadata or a
topic-ID file is refused (`docs/repair.md`, "On KRaft").

1. **plan**: for the repair plan's hash (12+ hex digits) and brokers (default: every broker the attempt backed up;
   `attempt`: the repair's Airflow run id, default the newest attempt with a backup): per broker the files that go
   back with the sha256 each must have, the backup tarballs with their checksums (each already checked: its
   members are exactly its manifest's files, inside the broker's log dirs), the order with the controller last.
   `start=false` (leave the broker stopped) is accepted for one broker only.
2. **approve**: a human approves the restore plan (Browse → Required Actions) with its own button, e.g. "Approve:
   put back 14 file(s) on 2 broker(s) (restore 1f2e3d4c5b6a)"; `FLEET_DOCTOR_APPROVERS` applies.
3. **restore**: reads the answer itself (an approve task marked success by hand is refused), takes the cluster's
   repair lock (taking it over from a halted attempt of the same repair), then per broker: pre-check (everything
   registered, nothing under-replicated beyond what this restore puts back, min ISR kept), stop, back up the files
   as they are now, check it is still down, put the backup back (checksum checked on the broker before unpacking,
   only the manifest's members), files equal to the manifest and owned as their partition dir, start, health gates.
   The repair attempt's journal marks restored brokers pending again.

Operator guide: `docs/repair.md`.
"""

from __future__ import annotations

from airflow.sdk import DAG, Param, dag

from fleet_doctor.dags.approved import plan_approve_act
from fleet_doctor.fleet_dags import ClusterDags
from fleet_doctor.repair import restore_tasks
from fleet_doctor.repair.params import manual_dag_args, restore_gates
from fleet_doctor.settings import Settings


def every_cluster(parsed: Settings, clusters: list[ClusterDags]) -> dict[str, DAG]:
    """Each cluster's restore DAG, by id (``parsed``: the settings read when the DAG file is parsed)."""
    return {c.restore: kafka_fleet_restore(c, parsed) for c in clusters}


def kafka_fleet_restore(cluster: ClusterDags, parsed: Settings) -> DAG:
    """The cluster's restore DAG."""

    def settings() -> Settings:
        return Settings.from_env().for_cluster(cluster.cluster)

    @dag(
        dag_id=cluster.restore,
        **manual_dag_args(),
        tags=cluster.tags("restore"),
        doc_md=__doc__,
        params={
            "plan": Param(type="string", pattern="^[0-9a-f]{12,64}$", description="the repair plan's hash"),
            "attempt": Param("", type="string", description="the repair's run id (empty: the newest with a backup)"),
            "brokers": Param([], type="array", description="broker ids to restore (empty: every one with a backup)"),
            "start": Param(True, type="boolean", description="start each broker again (false: one broker only)"),
            **{name: Param(**spec) for name, spec in restore_gates().items()},  # defaults: repair.gates
        },
    )
    def restore_dag() -> None:
        plan_approve_act(
            parsed,
            settings,
            restore_tasks.plan,
            restore_tasks.approval_request,
            restore_tasks.restore_backup,
            "restore",
        )

    return restore_dag()
