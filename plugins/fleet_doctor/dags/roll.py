"""
### Kafka fleet roll (manual, human-approved), one DAG per cluster: `kafka_fleet_roll__<cluster>`

A rolling restart of the cluster's brokers (a config change, an OS patch, an upgrade), with the repair's care and
none of its file changes.

1. **plan**: for the reason, the brokers (default: every one) and the held-out ones, from the cluster as it is now
   (partitions, ISR, min ISR, racks, the controller, on KRaft the voters) and the newest audit (each broker's log
   recovery if its stop is not clean): the order and the batches (one at a time, or with `batching`
   `partition-disjoint` brokers that share no partition together, every partition keeping min ISR + `isr_margin`
   in sync, by rack when every partition spans racks), the voters one at a time and the active controller last, how
   leadership moves back, and the predicted time batched and one at a time.
2. **approve**: a human approves the plan (Browse → Required Actions) with its own button, e.g. "Approve: restart 30
   broker(s) in 4 step(s) (roll 1f2e3d4c5b6a)"; `FLEET_DOCTOR_APPROVERS` applies.
3. **roll**: reads the answer itself (an approve task marked success by hand is refused), takes the cluster's
   repair lock, then step by step: pre-check (hosts are their brokers, everything registered and in sync but for
   this step, min ISR kept with the whole step stopped, read live), stop together, start together, wait for each
   broker to register (a broker recovering its logs is waited for, with its progress and an ETA, never restarted),
   the healthy polls, then a preferred-leader election for exactly the partitions each restarted broker should lead,
   until it leads them (or says why not). The controller of the moment goes last. A rerun of the task resumes.

Operator guide: `docs/roll.md`.
"""

from __future__ import annotations

from airflow.sdk import DAG, Param, dag

from fleet_doctor.dags.approved import plan_approve_act
from fleet_doctor.fleet_dags import ClusterDags
from fleet_doctor.repair import roll_tasks
from fleet_doctor.repair.params import manual_dag_args, roll_params
from fleet_doctor.settings import Settings


def every_cluster(parsed: Settings, clusters: list[ClusterDags]) -> dict[str, DAG]:
    """Each cluster's roll DAG, by id (``parsed``: the settings read when the DAG file is parsed)."""
    return {c.roll: kafka_fleet_roll(c, parsed) for c in clusters}


def kafka_fleet_roll(cluster: ClusterDags, parsed: Settings) -> DAG:
    """The cluster's roll DAG."""

    def settings() -> Settings:
        return Settings.from_env().for_cluster(cluster.cluster)

    @dag(
        dag_id=cluster.roll,
        **manual_dag_args(),
        tags=cluster.tags("roll"),
        doc_md=__doc__,
        params={name: Param(**spec) for name, spec in roll_params().items()},  # defaults: repair.gates
    )
    def roll_dag() -> None:
        plan_approve_act(parsed, settings, roll_tasks.plan, roll_tasks.approval_request, roll_tasks.roll, "roll")

    return roll_dag()
