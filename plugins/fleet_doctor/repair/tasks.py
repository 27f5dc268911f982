"""What the repair DAG's tasks call (dags/kafka_fleet_repair.py): make the plan, execute an approved one, write the
plan's preventive ZooKeeper topic IDs.

The plan comes from ``repair.planner``, its text from ``repair.approval_text``, the run from ``repair.executor`` under
the cluster lock (``repair.session``); this module wires them to the audit's store (``fleet_doctor.layout``), the
inventory, ZooKeeper and the brokers' SSH connections. Only the repair DAG imports it.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from fleet_doctor import layout, spark
from fleet_doctor.airflow_links import audit_dag
from fleet_doctor.audit import steps
from fleet_doctor.audit.history import latest_whole_fleet_run
from fleet_doctor.repair import approval_text
from fleet_doctor.repair.broker import ssh_hosts
from fleet_doctor.repair.errors import FenceLost, RepairError
from fleet_doctor.repair.executor import Executor
from fleet_doctor.repair.gates import Gates, approved_gates, gates_of, static_min_isr
from fleet_doctor.repair.journal import Journal, attempt_report
from fleet_doctor.repair.kraft_refusals import zookeeper_write_refusal
from fleet_doctor.repair.plan import Plan
from fleet_doctor.repair.planner import FleetFacts, build_plan
from fleet_doctor.repair.progress import heartbeat
from fleet_doctor.repair.session import cluster_lock, lock_mirror, repairs_dir, ssh_connect
from fleet_doctor.repair.topic_ids import restore_topic_ids
from fleet_doctor.settings import Settings
from fleet_doctor.store import write_atomic
from fleet_doctor.zookeeper.cluster import Cluster
from fleet_doctor.zookeeper.lock import LockHeld

LOG = logging.getLogger(__name__)
BROKERS, ZOOKEEPER = "markdown", "zookeeper_markdown"  # which approval of the plan (the DAG's XCom keys)


def latest_audit_run(settings: Settings) -> str:
    """The newest audit of the whole fleet (a run of only some brokers is no base for a plan)."""
    run = latest_whole_fleet_run(settings.store)
    if run is None:
        audit = audit_dag(settings.cluster) if settings.cluster else "the audit DAG"
        raise RepairError(f"no whole-fleet audit run in {settings.store.url('history')}: run {audit} first")
    return run


def whole_fleet_run(settings: Settings, run: str) -> None:
    """Refuse to plan from an audit run the history does not know (an empty plan would look like a healthy fleet),
    or from one that staged only some brokers: the others' findings would silently drop out of the plan, and the
    re-verify before execution (a whole-fleet audit) could never match its hash."""
    runs = {r["audit_run"]: r for r in settings.store.read_jsonl(layout.HISTORY_RUNS)}
    if run not in runs:
        raise RepairError(
            f"no audit run {run!r} in {settings.store.url('history')} (audit_run 'latest' picks the "
            "newest whole-fleet run)"
        )
    if runs[run].get("out_of_scope"):
        raise RepairError(
            f"audit run {run} audited only some brokers (out of scope: {runs[run]['out_of_scope']}): plan from a "
            "whole-fleet audit run (audit_run 'latest' picks the newest one)"
        )


def plan_from_run(settings: Settings, run: str, params: dict[str, Any]) -> Plan:
    """The plan for a published audit run's findings (history), in the scope of the DAG's ``params``."""
    whole_fleet_run(settings, run)
    findings = settings.store.read_jsonl(layout.history_findings(run))
    return plan_from(settings, run, findings, layout.staging(run), params)


def plan_from(
    settings: Settings, run: str, findings: list[dict[str, Any]], area: layout.RunArea, params: dict[str, Any]
) -> Plan:
    """The plan for ``findings`` of the audit run staged in ``area``, in the scope of the DAG's ``params``: its
    gates recorded (the approver sees them), its risk counted with the brokers' static min ISR."""
    inv = settings.load_inventory()
    return build_plan(
        inv.cluster,
        run,
        findings,
        FleetFacts.load(settings.store, area),
        rules=params.get("rules") or (),
        brokers=[int(b) for b in params.get("brokers") or ()],
        topics=params.get("topics") or (),
        hold_out=[int(b) for b in params.get("hold_out") or ()],
        include_internal=bool(params.get("include_internal")),
        gates=gates_of(params),
        static_min_isr=static_min_isr(params, inv.min_insync_replicas),
        kraft=inv.kraft,
        metadata_log_dirs=[c.metadata_log_dir for c in inv.controllers],
    )


def reverify(settings: Settings, run_id: str, params: dict[str, Any], connect: Any) -> tuple[str, Plan]:
    """A fresh audit of the whole fleet (staged and detected under ``verify/<run>``, never published: the audit's
    history and findings dataset do not see it) and the plan it gives with the approved scope."""
    run = layout.safe_run_id(f"{run_id}-verify")
    area = layout.verify(run)
    with heartbeat(f"re-verify {run}: a fresh audit of the whole fleet (every broker probed, Spark detection)"):
        steps.stage_and_detect(settings, run, lambda b: connect(b["broker_id"]), area=area)
    findings = settings.store.read_jsonl(area.findings_json)
    fresh = plan_from(settings, run, findings, area, params)
    LOG.info("re-verify %s: %d finding(s), the fleet now gives plan %s", run, len(findings), fresh.hash[:12])
    return run, fresh


def save_plan(settings: Settings, plan: Plan) -> dict[str, approval_text.Request]:
    """``<repairs>/<hash>/plan.json`` (what execute runs) and ``plan.md`` (what people read); returns the plan's
    approval requests (``BROKERS``, ``ZOOKEEPER``), as the acting tasks will render them again."""
    repairs = repairs_dir(settings)
    d = repairs.plan_dir(plan.hash)
    d.mkdir(parents=True, exist_ok=True)
    asked = _requests(plan, str(d))
    write_atomic(repairs.plan(plan.hash), plan.to_json().encode())
    write_atomic(repairs.plan_text(plan.hash), asked[BROKERS].body.encode())
    return asked


def _requests(plan: Plan, where: str) -> dict[str, approval_text.Request]:
    return {
        BROKERS: approval_text.repair_request(plan, where),
        ZOOKEEPER: approval_text.zookeeper_request(plan, where),
    }


def make_plan(settings: Settings, params: dict[str, Any]) -> dict[str, Any]:
    """The plan task: the plan for the DAG's scope, saved, and what the approvals show (the DAG's XCom)."""
    run = params.get("audit_run") or "latest"
    run = latest_audit_run(settings) if run == "latest" else layout.safe_run_id(run)
    plan = plan_from_run(settings, run, params)
    asked = save_plan(settings, plan)
    return {
        "hash": plan.hash,
        "audit_run": run,
        "subject": asked[BROKERS].subject,
        "markdown": asked[BROKERS].body,
        "approve_option": asked[BROKERS].option,
        "counts": plan.counts(),
        "restart_order": plan.restart_order,
        "zookeeper_subject": asked[ZOOKEEPER].subject,
        "zookeeper_markdown": asked[ZOOKEEPER].body,
        "zookeeper_approve_option": asked[ZOOKEEPER].option,
    }


def approved_plan(settings: Settings, planned: dict[str, Any]) -> Plan:
    """The stored plan the plan task saved, checked to hash to ``planned["hash"]``."""
    approved = Plan.from_json(repairs_dir(settings).plan(planned["hash"]).read_text())
    if approved.hash != planned["hash"]:
        raise RepairError(f"the stored plan does not hash to the approved {planned['hash'][:12]}: refusing")
    return approved


def approval_request(settings: Settings, planned: dict[str, Any], which: str) -> approval_text.Request:
    """What the approval asked, as the stored plan renders it (``which``: ``BROKERS`` or ``ZOOKEEPER``): the
    headline and text the human must have seen (the subject carries "DRY RUN") and the one answer that approves it;
    ``approval.confirm`` compares all three with Airflow's record of the request and its answer."""
    stored = approved_plan(settings, planned)
    return _requests(stored, str(repairs_dir(settings).plan_dir(stored.hash)))[which]


def execute(
    settings: Settings,
    planned: dict[str, Any],
    params: dict[str, Any],
    run_id: str,
    connect: Any = None,
    approval: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Lock, re-verify, run the approved plan's broker chain. Raises (the task fails) when the chain halts or the
    plan is stale; ``<repairs>/<hash>/attempts/<run>/result.json`` says what was done and what was not either way.
    ``approval``: the human answer (``repair.approval.confirm``), recorded in the journal with who, when and which
    plan. One attempt per Airflow run: a rerun of the same run resumes it, a new run starts a new attempt."""
    inv = settings.load_inventory()
    approved = approved_plan(settings, planned)
    connect = connect or ssh_connect(inv)
    repairs = repairs_dir(settings)
    workdir = repairs.attempt(approved.hash, run_id)
    owner = {"plan_hash": approved.hash, "step": "brokers", "run_id": run_id, "since": time.time()}
    report: dict[str, Any] = {"plan": approved.hash, "run_id": run_id, "restart_order": approved.restart_order}
    journal: Journal | None = None

    def check_holder(held: dict[str, Any] | None) -> None:
        if held and held.get("plan_hash") == approved.hash and held.get("run_id") not in (None, run_id):
            raise LockHeld(
                f"cluster {inv.cluster} is locked by run {held.get('run_id')} of this same plan (step "
                f"{held.get('step')}): resume that run (clear its task) or restore its backups first: {held}"
            )
        if held and held.get("run_id") == run_id and not (workdir / layout.JOURNAL).is_file():
            raise RepairError(  # the lock stays: this run may have changed brokers, and its record is elsewhere
                f"the lock names this run, but its journal {workdir / layout.JOURNAL} is not here: the repairs "
                "dir (FLEET_DOCTOR_REPAIR_DIR) must be one shared, durable directory for every worker"
            )

    def outcome(report: dict[str, Any]) -> None:
        if (workdir / layout.JOURNAL).is_file():
            report.update(attempt_report(json.loads((workdir / layout.JOURNAL).read_text()), approved.restart_order))
        LOG.info("repair %s: %s", approved.hash[:12], json.dumps(report, default=str))

    with (
        cluster_lock(
            inv,
            owner,
            report,
            workdir / layout.RESULT,
            check_holder=check_holder,
            before_result=outcome,
            cluster_id=approved.scope.get("cluster_id"),
            mirror=lock_mirror(settings),
            lock_dir=settings.lock_dir,
        ) as lock,
        spark.warm_drivers(),
    ):  # the re-verify's detection driver serves every broker's post-verify
        lock.keep_when(lambda: journal.keeps_lock() if journal else None)
        try:
            journal = Journal(workdir / layout.JOURNAL, approved)
            if approval is not None:
                journal.approved(approval)
            if not journal.touched():  # a resumed attempt has changed the fleet: its journal is the truth
                # re-verify against the fleet as it is now: a fresh audit must yield the very same plan
                verify_run, fresh = reverify(settings, run_id, params, connect)
                report["reverified_with"] = verify_run
                if fresh.hash != approved.hash:
                    save_plan(settings, fresh)
                    journal.data.update(status="aborted", error=f"stale plan (fleet now gives {fresh.hash[:12]})")
                    journal.save()
                    raise RepairError(
                        f"stale plan: the fleet changed since approval (approved {approved.hash[:12]}, now "
                        f"{fresh.hash[:12]}: {repairs.plan_text(fresh.hash)}); nothing was touched"
                    )
            gated = approved_gates(approved.gates, params)  # what the approver saw, not what the form says now
            executor = Executor(
                approved,
                workdir,
                inv,
                ssh_hosts(inv, connect),
                lock.cluster(gated),
                Gates.from_params(gated),
                dry_run=bool(gated.get("dry_run")),
                fence=lock.fence(),
            )
            journal = executor.journal  # the one the chain writes (it re-read the file, approval included)
            executor.run()
        except BaseException as e:
            if journal is not None and journal.data.get("status") == "running" and not isinstance(e, FenceLost):
                journal.data.update(status="halted", error=f"{type(e).__name__}: {e}")
                journal.save()
            raise
    return {k: report.get(k) for k in ("plan", "status", "done", "untouched", "lock_released")}


def restore_zookeeper(
    settings: Settings,
    planned: dict[str, Any],
    params: dict[str, Any],
    run_id: str,
    connect: Any = None,
    approval: dict[str, Any] | None = None,
) -> list[str]:
    """The plan's preventive ZooKeeper actions, after their own approval; under the cluster lock (waiting for the
    same plan's broker chain, never for another repair)."""
    inv = settings.load_inventory()
    if inv.kraft:
        raise RepairError(zookeeper_write_refusal(inv.cluster))
    approved = approved_plan(settings, planned)
    connect = connect or ssh_connect(inv)
    owner = {"plan_hash": approved.hash, "step": "zookeeper", "run_id": run_id, "since": time.time()}
    gated = approved_gates(approved.gates, params)
    done: list[str] = []
    record: dict[str, Any] = {"run_id": run_id, "approval": approval, "done": done, "error": None}
    result = repairs_dir(settings).attempt(approved.hash, run_id) / layout.ZOOKEEPER_RESULT
    wait = Gates.from_params(gated).isr_timeout_s * 4
    with cluster_lock(
        inv,
        owner,
        record,
        result,
        wait_s=wait,
        cluster_id=approved.scope.get("cluster_id"),
        mirror=lock_mirror(settings),
    ) as lock:
        # a partial write: a human looks first
        lock.keep_when(
            lambda: (
                "some topic IDs were written before the failure: the lock stays"
                if record["error"] and any(": wrote " in d for d in done)
                else None
            )
        )
        try:
            dry_run = bool(gated.get("dry_run"))
            restore_topic_ids(Cluster(lock.zk), approved.zookeeper, connect, inv, dry_run=dry_run, done=done)
        except BaseException as e:
            record["error"] = f"{type(e).__name__}: {e}"
            raise
    return done
