"""
### Kafka fleet restore (manual): put a repair's backups back

The undo of `kafka_fleet_repair`. For the given plan hash and brokers (default: every broker the plan backed up),
one broker at a time: stop it (and wait until `/brokers/ids/<id>` is gone), unpack its backup tarball over its
files (the exact `partition.metadata`, `leader-epoch-checkpoint` and index files the repair removed or
quarantined), check every restored file against the backup's sha256 manifest, then start it again unless
`start` is off. Takes the cluster's repair lock. The plan's journal marks restored brokers pending again, so a
later run of the same plan starts over with a fresh re-verification.

Operator guide: `docs/repair.md`.
"""

from __future__ import annotations

from airflow.sdk import Param, dag, get_current_context, task

from fleet_doctor.repair import restore as repair_restore
from fleet_doctor.repair import tasks
from fleet_doctor.settings import Settings


@dag(
    dag_id="kafka_fleet_restore",
    **tasks.manual_dag_args(),
    doc_md=__doc__,
    params={
        "plan": Param(type="string", minLength=12, description="the repair plan's hash (kafka_fleet_repair)"),
        "brokers": Param([], type="array", description="broker ids to restore (empty: every one with a backup)"),
        "start": Param(True, type="boolean", description="start each broker again after its restore"),
        "timeout_s": Param(600, type="integer", minimum=30, description="per broker: stop / register within"),
    },
)
def kafka_fleet_restore() -> None:
    @task
    def restore() -> list[str]:
        ctx = get_current_context()
        p = ctx["params"]
        return repair_restore.restore_backup(
            Settings.from_env(),
            p["plan"],
            [int(b) for b in p.get("brokers") or ()],
            bool(p.get("start", True)),
            ctx["run_id"],
            timeout_s=float(p.get("timeout_s", 600)),
        )

    restore()


kafka_fleet_restore()
