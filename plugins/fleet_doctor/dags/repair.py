"""
### Kafka fleet repair (manual, human-approved), one DAG per cluster: `kafka_fleet_repair__<cluster>`

Nothing on a broker changes until a human has approved a plan that says exactly what will happen. On a KRaft
cluster the lock lives in the repairs dir, the gates read the quorum's committed metadata, voters restart one at a
time behind the quorum gate (the active controller last), and what KRaft's design forbids is left out of the plan
with the reason (`docs/repair.md`, "On KRaft").

1. **plan**: from an audit run's findings (default: the latest), within the scope of the form (rules, brokers,
   topics, brokers held out, internal topics): per broker the files backed up and removed (`partition.metadata`,
   `leader-epoch-checkpoint` for topic-ID drift) or quarantined (index files), the restart order with the active
   controller last, and a restart preview (last stop clean, bytes above the recovery point, indexes rebuilt,
   estimated recovery time). Content-addressed: the plan's hash is in the approval's subject.
2. **approve**: a human-in-the-loop approval in the Airflow UI (Browse → Required Actions): a summary first (what,
   where, how many, risk, the plan hash, backups, undo), then the files per broker. Its buttons name what approving
   does, e.g. "Approve: restart 3 brokers, change 14 files (plan 1f2e3d4c5b6a)", and "Reject". Reject, or no answer
   within the timeout (default 24 h): nothing is touched. **Dry run** (the form's `dry_run`): the approval says
   "DRY RUN: nothing will be written" and its button "Approve dry run: ...".
3. **execute**: first reads the answer back from Airflow's record (not the approve task's state, which can be set
   by hand): the plan's own approving option, by a user in `FLEET_DOCTOR_APPROVERS` when set, not the one who
   triggered the run (unless `FLEET_DOCTOR_ALLOW_SELF_APPROVAL`), for this plan's hash; journaled. Then it takes the
   cluster's repair lock, re-verifies (a fresh audit of the fleet must give the same plan hash, else abort
   untouched), then one broker at a time: pre-check (all registered, nothing under-replicated, min ISR kept), stop,
   back up (tar.gz + sha256 manifest fetched over SFTP and verified), remove/quarantine, start, wait for
   ISR and several consecutive healthy polls. Journaled: a rerun resumes where it stopped. After each start:
   post-verify (the broker is probed again; every touched file must now be right).
   Dry run: every read and check, every command logged, nothing written on a broker.
4. **approve_zookeeper → restore_topic_ids** (only when the plan has them): the preventive repair of
   `topic-id-missing-in-zk`, its own approval: the topic ID every replica agrees on is written back into the topic
   znode (version-checked), before a controller failover mints a new one.

Undo a repair with the cluster's `kafka_fleet_restore__<cluster>` DAG (puts a plan's backups back).

Operator guide: `docs/repair.md`.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from airflow.sdk import DAG, Param, dag, get_current_context, task

from fleet_doctor.fleet_dags import ClusterDags
from fleet_doctor.repair import approval, tasks
from fleet_doctor.repair.hitl import PlanApprovalOperator
from fleet_doctor.repair.params import manual_dag_args, repair_gates
from fleet_doctor.settings import Settings


def every_cluster(parsed: Settings, clusters: list[ClusterDags]) -> dict[str, DAG]:
    """Each cluster's repair DAG, by id (``parsed``: the settings read when the DAG file is parsed)."""
    return {c.repair: kafka_fleet_repair(c, parsed) for c in clusters}


def approval_of(task_id: str, subject: str, body: str, option: str, parsed: Settings) -> PlanApprovalOperator:
    """A human approval of (part of) the plan: subject, Markdown body and the approving option from the plan task's
    XCom. Only asks: the task that acts reads the answer back from Airflow's record (``approval.confirm``)."""
    return PlanApprovalOperator(
        task_id=task_id,
        subject_key=subject,
        body_key=body,
        option_key=option,
        assigned_users=approval.hitl_users(parsed),
        response_timeout=timedelta(hours=24),
    )


def kafka_fleet_repair(cluster: ClusterDags, parsed: Settings) -> DAG:
    """The cluster's repair DAG."""

    def settings() -> Settings:
        return Settings.from_env().for_cluster(cluster.cluster)

    @dag(
        dag_id=cluster.repair,
        **manual_dag_args(),
        tags=cluster.tags("repair"),
        doc_md=__doc__,
        params={
            "audit_run": Param("latest", type="string", description="audit run id, or 'latest'"),
            "rules": Param([], type="array", description="only these rule ids (empty: every repairable rule)"),
            "brokers": Param([], type="array", description="only these broker ids (empty: all)"),
            "topics": Param([], type="array", description="only these topics (empty: all)"),
            "hold_out": Param([], type="array", description="broker ids left out of this run"),
            "include_internal": Param(False, type="boolean", description="also repair __consumer_offsets etc."),
            **{name: Param(**spec) for name, spec in repair_gates().items()},  # defaults: repair.gates
        },
    )
    def repair() -> None:
        @task
        def plan() -> dict[str, Any]:
            return tasks.make_plan(settings(), get_current_context()["params"])

        @task.short_circuit
        def brokers_to_repair(planned: dict[str, Any]) -> bool:
            return bool(planned["restart_order"])

        approve = approval_of("approve", "subject", "markdown", "approve_option", parsed)

        @task
        def execute(planned: dict[str, Any]) -> dict[str, Any]:
            ctx, here = get_current_context(), settings()
            asked = tasks.approval_request(here, planned, tasks.BROKERS)  # what the stored plan shows and offers
            approved = approval.confirm(ctx, "approve", planned["hash"], here, asked)  # not the upstream's state
            return tasks.execute(here, planned, ctx["params"], ctx["run_id"], approval=approved)

        @task.short_circuit
        def zookeeper_to_repair(planned: dict[str, Any]) -> bool:
            return bool(planned["counts"]["zookeeper_actions"])

        approve_zookeeper = approval_of(
            "approve_zookeeper", "zookeeper_subject", "zookeeper_markdown", "zookeeper_approve_option", parsed
        )

        @task
        def restore_topic_ids(planned: dict[str, Any]) -> list[str]:
            ctx, here = get_current_context(), settings()
            asked = tasks.approval_request(here, planned, tasks.ZOOKEEPER)
            approved = approval.confirm(ctx, "approve_zookeeper", planned["hash"], here, asked)
            return tasks.restore_zookeeper(here, planned, ctx["params"], ctx["run_id"], approval=approved)

        planned = plan()
        brokers_to_repair(planned) >> approve >> execute(planned)
        zookeeper_to_repair(planned) >> approve_zookeeper >> restore_topic_ids(planned)

    return repair()
