"""What the repair DAGs' tasks call (dags/kafka_fleet_repair.py, dags/kafka_fleet_restore.py): make the plan, execute
an approved one, restore the ZooKeeper topic IDs, put backups back.

Plans come from ``repair.plan``, execution from ``repair.executor``; this module wires them to the audit's storage,
the inventory, ZooKeeper and the brokers' SSH connections (the SSH provider's hook, imported only when used).
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fleet_doctor import inventory
from fleet_doctor.audit import steps
from fleet_doctor.remote import airflow_ssh_client
from fleet_doctor.repair.executor import Executor, FenceLost, Gates, Journal, RepairError, attempt_dir
from fleet_doctor.repair.plan import FleetFacts, Plan, build_plan, restart_risk
from fleet_doctor.repair.progress import heartbeat
from fleet_doctor.repair.topic_ids import restore_topic_ids
from fleet_doctor.settings import Settings, SettingsError, safe_run_id
from fleet_doctor.store import write_atomic
from fleet_doctor.zookeeper import cluster_session
from fleet_doctor.zookeeper.cluster import Cluster
from fleet_doctor.zookeeper.lock import (
    ACTIVE_ROOT,
    LockHeld,
    acquire_lock,
    lock_holder,
    release_active,
    release_lock,
)

LOG = logging.getLogger(__name__)


def manual_dag_args() -> dict[str, Any]:
    """What the repair and restore DAGs share: triggered by hand only, one run at a time."""
    import pendulum

    start = pendulum.datetime(2026, 1, 1, tz="UTC")
    tags = ["kafka", "fleet-doctor", "repair"]
    return {"schedule": None, "start_date": start, "catchup": False, "max_active_runs": 1, "tags": tags}


def refuse_kraft(settings: Settings, what: str = "repairs") -> inventory.Inventory:
    """The cluster's inventory, unless it is a KRaft cluster: the repair's health gates, its cluster lock and the
    topic-ID write all work on ZooKeeper, and a KRaft cluster has none. Refused at the first task of the repair
    and restore DAGs (and again by every task that acts), before anything is read or written."""
    inv = inventory.load(settings.inventory)
    if inv.kraft:
        raise RepairError(
            f"{what} on KRaft clusters are not supported yet: cluster {inv.cluster} keeps its metadata in its "
            "controllers' __cluster_metadata log (inventory metadata_mode kraft), and the repair's health gates, "
            "cluster lock and topic-ID write need ZooKeeper. Nothing was read or changed. The nightly audit "
            "(kafka_fleet_audit) does support KRaft: follow its findings' remediation by hand (docs/repair.md)"
        )
    return inv


def repairs_dir(settings: Settings) -> Path:
    try:
        return settings.repairs
    except SettingsError as e:  # a remote data root without FLEET_DOCTOR_REPAIR_DIR
        raise RepairError(str(e)) from e


def latest_audit_run(settings: Settings) -> str:
    """The newest audit of the whole fleet (a run of only some brokers is no base for a plan)."""
    runs = [r for r in settings.store.read_jsonl("history/runs.jsonl") if not r.get("out_of_scope")]
    if not runs:
        raise RepairError(f"no whole-fleet audit run in {settings.store.url('history')}: run kafka_fleet_audit first")
    return runs[-1]["audit_run"]


def whole_fleet_run(settings: Settings, run: str) -> None:
    """Refuse to plan from an audit run the history does not know (an empty plan would look like a healthy fleet),
    or from one that staged only some brokers: the others' findings would silently drop out of the plan, and the
    re-verify before execution (a whole-fleet audit) could never match its hash."""
    runs = {r["audit_run"]: r for r in settings.store.read_jsonl("history/runs.jsonl")}
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
    findings = settings.store.read_jsonl(f"history/audit_run={run}/findings.jsonl")
    return plan_from(settings, run, findings, settings.run_key(run), params)


def plan_from(
    settings: Settings, run: str, findings: list[dict[str, Any]], run_key: str, params: dict[str, Any]
) -> Plan:
    """The plan for ``findings`` of the audit run staged at ``run_key``, in the scope of the DAG's ``params``."""
    inv, facts = inventory.load(settings.inventory), FleetFacts.load(settings.store, run_key)
    plan = build_plan(
        inv.cluster,
        run,
        findings,
        facts,
        rules=params.get("rules") or (),
        brokers=[int(b) for b in params.get("brokers") or ()],
        topics=params.get("topics") or (),
        hold_out=[int(b) for b in params.get("hold_out") or ()],
        include_internal=bool(params.get("include_internal")),
    )
    plan.scope["gates"] = gates_of(params)  # in the hash and the approval text: the approver sees them
    # for the approver only, not in the hash: counted with ZooKeeper's cluster-wide default as the audit's snapshot
    # read it (the pre-check reads it again before each stop: cluster_for); when the audit could not read it, the
    # risk line says so
    known, cluster_default = facts.cluster_default_min_isr()
    plan.risk = restart_risk(facts, plan.restart_order, static_min_isr(params, inv), cluster_default, known)
    return plan


def reverify(settings: Settings, run_id: str, params: dict[str, Any], connect: Any) -> tuple[str, Plan]:
    """A fresh audit of the whole fleet (staged and detected under ``verify/<run>``, never published: the audit's
    history and findings dataset do not see it) and the plan it gives with the approved scope."""
    run = safe_run_id(f"{run_id}-verify")
    with heartbeat(f"re-verify {run}: a fresh audit of the whole fleet (every broker probed, Spark detection)"):
        verified = steps.stage_and_detect(settings, run, lambda b: connect(b["broker_id"]), run_key=f"verify/{run}")
    findings = settings.store.read_jsonl(f"{verified.run_key}/findings.jsonl")
    fresh = plan_from(settings, run, findings, verified.run_key, params)
    LOG.info("re-verify %s: %d finding(s), the fleet now gives plan %s", run, len(findings), fresh.hash[:12])
    return run, fresh


def save_plan(settings: Settings, plan: Plan) -> Path:
    """``<repairs>/<hash>/plan.json`` (what execute runs) and ``plan.md`` (what people read); returns the dir."""
    d = repairs_dir(settings) / plan.hash
    d.mkdir(parents=True, exist_ok=True)
    write_atomic(d / "plan.json", plan.to_json().encode())
    write_atomic(d / "plan.md", plan.to_markdown(str(d)).encode())
    return d


def make_plan(settings: Settings, params: dict[str, Any]) -> dict[str, Any]:
    refuse_kraft(settings)
    run = params.get("audit_run") or "latest"
    run = latest_audit_run(settings) if run == "latest" else safe_run_id(run)
    plan = plan_from_run(settings, run, params)
    where = str(save_plan(settings, plan))
    return {
        "hash": plan.hash,
        "audit_run": run,
        "subject": plan.subject(),
        "markdown": plan.to_markdown(where),
        "approve_option": plan.approve_option(),
        "counts": plan.counts(),
        "restart_order": plan.restart_order,
        "zookeeper_subject": plan.zookeeper_subject(),
        "zookeeper_markdown": plan.zookeeper_markdown(where),
        "zookeeper_approve_option": plan.zookeeper_approve_option(),
    }


def ssh_connect(inv: inventory.Inventory) -> Any:
    def connect(broker_id: int) -> Any:
        return airflow_ssh_client(inv.ssh_connection_id(broker_id))

    return connect


def _approved(settings: Settings, planned: dict[str, Any]) -> Plan:
    approved = Plan.from_json((repairs_dir(settings) / planned["hash"] / "plan.json").read_text())
    if approved.hash != planned["hash"]:
        raise RepairError(f"the stored plan does not hash to the approved {planned['hash'][:12]}: refusing")
    return approved


def approval_request(settings: Settings, planned: dict[str, Any], which: str) -> dict[str, str]:
    """What the approval asked, as the stored plan renders it (``which``: ``markdown`` for the brokers,
    ``zookeeper_markdown`` for ZooKeeper): ``subject`` and ``body``, the headline and text the human must have seen
    (the subject carries "DRY RUN"), and ``option``, the one answer that approves it; ``approval.confirm`` compares
    all three with Airflow's record of the request and its answer."""
    stored = _approved(settings, planned)
    where = str(repairs_dir(settings) / stored.hash)
    if which == "markdown":
        return {"subject": stored.subject(), "body": stored.to_markdown(where), "option": stored.approve_option()}
    return {
        "subject": stored.zookeeper_subject(),
        "body": stored.zookeeper_markdown(where),
        "option": stored.zookeeper_approve_option(),
    }


def restore_approval_request(settings: Settings, planned: dict[str, Any]) -> dict[str, str]:
    """The restore approval's ``subject``, ``body`` and approving ``option``, from the stored restore plan."""
    from fleet_doctor.repair import restore

    stored = restore.stored_restore_plan(settings, planned)
    return {
        "subject": restore.restore_subject(stored),
        "body": restore.restore_markdown(stored),
        "option": restore.restore_approve_option(stored),
    }


def _report(journal: dict[str, Any], order: list[int]) -> dict[str, Any]:
    """What was done and what was not, per broker, from the journal."""
    brokers = journal.get("brokers", {})
    done = [b for b in order if brokers.get(str(b), {}).get("state") == "done"]
    failed = {b: brokers[str(b)]["failed"] for b in order if brokers.get(str(b), {}).get("failed")}
    untouched = [b for b in order if brokers.get(str(b), {}).get("state", "pending") == "pending" and b not in failed]
    partly = {b: brokers[str(b)]["state"] for b in order if b not in done and b not in untouched}
    return {
        "status": journal.get("status"),
        "error": journal.get("error"),
        "done": done,
        "failed": failed,
        "partly_done": partly,
        "untouched": untouched,
    }


def gates_from(params: dict[str, Any]) -> Gates:
    """The health gates from the DAG's form (the repair's and the restore's)."""
    return Gates(
        healthy_polls=int(params.get("healthy_polls", 3)),
        poll_interval_s=float(params.get("poll_interval_s", 10)),
        isr_timeout_s=float(params.get("isr_timeout_s", 900)),
        pause_between_brokers_s=float(params.get("pause_between_brokers_s", 60)),
    )


def finish(
    zk: Any,
    inv: inventory.Inventory,
    owner: dict[str, Any],
    journal: Journal | None,
    report: dict[str, Any],
    fenced: bool = False,
) -> None:
    """Release the cluster lock, unless this attempt halted after changing a file (or leaving a broker it stopped
    down): then it stays held, so that no other plan starts until a human has looked (docs/repair.md, "After a
    halt"). A worker whose fence fell touches neither the lock nor the liveness node: they may be another's now."""
    if fenced:
        report["lock_kept"] = "this worker lost its ZooKeeper session: it left the lock and the journal alone"
        report["lock_released"] = False
        LOG.error("repair %s: %s", owner["plan_hash"][:12], report["lock_kept"])
        return
    if journal is not None and journal.data.get("status") != "done" and journal.needs_human():
        report["lock_kept"] = (
            "halted after changing files (or with a broker it stopped left down): the lock stays until a human "
            "resumes this run (clear its task), restores its backups (kafka_fleet_restore) or releases it by hand"
        )
        LOG.error("repair %s: %s", owner["plan_hash"][:12], report["lock_kept"])
        with contextlib.suppress(Exception):  # this worker is done: only its own liveness node goes
            release_active(zk, inv.cluster)
    else:
        release_lock(zk, inv.cluster, owner)
    with contextlib.suppress(Exception):
        report["lock_released"] = lock_holder(zk, inv.cluster) is None


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
    inv = refuse_kraft(settings)
    approved = _approved(settings, planned)
    connect = connect or ssh_connect(inv)
    workdir = attempt_dir(repairs_dir(settings), approved.hash, run_id)
    owner = {"plan_hash": approved.hash, "step": "brokers", "run_id": run_id, "since": time.time()}
    report: dict[str, Any] = {"plan": approved.hash, "run_id": run_id, "restart_order": approved.restart_order}
    journal: Journal | None = None
    try:
        with cluster_session(inv, timeout=10, start_timeout=15) as zk:
            held = lock_holder(zk, inv.cluster)
            if held and held.get("plan_hash") == approved.hash and held.get("run_id") not in (None, run_id):
                raise LockHeld(
                    f"cluster {inv.cluster} is locked by run {held.get('run_id')} of this same plan (step "
                    f"{held.get('step')}): resume that run (clear its task) or restore its backups first: {held}"
                )
            if held and held.get("run_id") == run_id and not (workdir / "journal.json").is_file():
                raise RepairError(  # the lock stays: this run may have changed brokers, and its record is elsewhere
                    f"the lock names this run, but its journal {workdir / 'journal.json'} is not here: the repairs "
                    "dir (FLEET_DOCTOR_REPAIR_DIR) must be one shared, durable directory for every worker"
                )
            acquire_lock(zk, inv.cluster, owner)
            executor: Executor | None = None
            try:
                journal = Journal(workdir / "journal.json", approved)
                if approval is not None:
                    journal.approved(approval)
                if not journal.touched():  # a resumed attempt has changed the fleet: its journal is the truth
                    # re-verify against the fleet as it is now: a fresh audit must yield the very same plan
                    verify_run, fresh = reverify(settings, run_id, params, connect)
                    report["reverified_with"] = verify_run
                    if fresh.hash != approved.hash:
                        fresh_md = save_plan(settings, fresh) / "plan.md"
                        journal.data.update(status="aborted", error=f"stale plan (fleet now gives {fresh.hash[:12]})")
                        journal.save()
                        raise RepairError(
                            f"stale plan: the fleet changed since approval (approved {approved.hash[:12]}, now "
                            f"{fresh.hash[:12]}: {fresh_md}); nothing was touched"
                        )
                gated = approved_gates(approved, params)  # what the approver saw, not what the form says now
                executor = Executor(
                    approved,
                    repairs_dir(settings),
                    inv,
                    connect,
                    cluster_for(zk, inv, gated),
                    gates_from(gated),
                    dry_run=bool(gated.get("dry_run")),
                    attempt=run_id,
                    fence=lock_fence(zk, inv.cluster, owner),
                )
                journal = executor.journal  # the one the chain writes (it re-read the file, approval included)
                executor.run()
            except FenceLost:
                raise
            except BaseException as e:
                if journal is not None and journal.data.get("status") == "running":
                    journal.data.update(status="halted", error=f"{type(e).__name__}: {e}")
                    journal.save()
                raise
            finally:
                finish(zk, inv, owner, journal, report, fenced=bool(executor and executor.fenced))
    finally:
        if (workdir / "journal.json").is_file():
            report.update(_report(json.loads((workdir / "journal.json").read_text()), approved.restart_order))
        workdir.mkdir(parents=True, exist_ok=True)
        write_atomic(workdir / "result.json", json.dumps(report, indent=2, default=str).encode())
        LOG.info("repair %s: %s", approved.hash[:12], json.dumps(report, default=str))
    return {k: report.get(k) for k in ("plan", "status", "done", "untouched", "lock_released")}


def lock_fence(zk: Any, cluster: str, owner: dict[str, Any]) -> Callable[[], None]:
    """Before every step: this worker still holds the lock's liveness node in the ZooKeeper session it took it
    with. A session that expired (a long GC pause, a partition) lost the ephemeral node, and another worker may have
    taken over: stop and report rather than act beside it."""
    session_id = zk.client_id[0] if zk.client_id else None
    active = f"{ACTIVE_ROOT}/{cluster}"

    def fence() -> None:
        now = zk.client_id[0] if zk.client_id else None
        if not zk.connected or now != session_id:
            raise FenceLost(f"the ZooKeeper session this repair locked {cluster} with was lost: halting")
        held = zk.exists(active)
        if held is None or held.ephemeralOwner != session_id:
            raise FenceLost(f"this worker no longer holds {active} (its session expired?): halting")

    return fence


GATE_PARAMS = (
    "healthy_polls",
    "poll_interval_s",
    "isr_timeout_s",
    "pause_between_brokers_s",
    "min_insync_replicas",
    "dry_run",
)


def gates_of(params: dict[str, Any]) -> dict[str, Any]:
    """The form's values that decide how carefully the plan runs: part of the plan (its hash, its approval text)."""
    return {k: params[k] for k in GATE_PARAMS if params.get(k) is not None}


def approved_gates(plan: Plan, params: dict[str, Any]) -> dict[str, Any]:
    """The gates the approver saw (the plan's), over whatever the form holds."""
    return {**params, **dict(plan.scope.get("gates") or {})}


def static_min_isr(params: dict[str, Any], inv: inventory.Inventory) -> int | None:
    """The brokers' static ``min.insync.replicas`` (server.properties) as the repair takes it: the form's
    ``min_insync_replicas`` or the inventory's, the larger (the form may raise the inventory's, never lower it);
    None when neither is set. Under ZooKeeper's cluster-wide default, over Kafka's 1: for the health gates
    (``cluster_for``) and the plan's risk line (``plan_from``, ``plan.default_min_isr``) alike."""
    form = int(params.get("min_insync_replicas") or 0)
    return max(form, inv.min_insync_replicas or 0) or None


def cluster_for(zk: Any, inv: inventory.Inventory, params: dict[str, Any]) -> Cluster:
    """The health gates' view of ZooKeeper. A topic without its own ``min.insync.replicas`` takes ZooKeeper's
    cluster-wide default (``/config/brokers/<default>``), else ``static_min_isr`` (the form's or the inventory's),
    else Kafka's 1."""
    return Cluster(zk, default_min_isr=static_min_isr(params, inv))


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
    inv = refuse_kraft(settings)
    approved = _approved(settings, planned)
    connect = connect or ssh_connect(inv)
    owner = {"plan_hash": approved.hash, "step": "zookeeper", "run_id": run_id, "since": time.time()}
    gated = approved_gates(approved, params)
    done: list[str] = []
    record: dict[str, Any] = {"run_id": run_id, "approval": approval, "done": done, "error": None}
    try:
        with cluster_session(inv, timeout=10, start_timeout=15) as zk:
            acquire_lock(zk, inv.cluster, owner, wait_s=float(gated.get("isr_timeout_s", 900)) * 4)
            try:
                dry_run = bool(gated.get("dry_run"))
                restore_topic_ids(Cluster(zk), approved.zookeeper, connect, inv, dry_run=dry_run, done=done)
            except BaseException as e:
                record["error"] = f"{type(e).__name__}: {e}"
                raise
            finally:
                if record["error"] and any(": wrote " in d for d in done):  # a partial write: a human looks first
                    record["lock_kept"] = "some topic IDs were written before the failure: the lock stays"
                    with contextlib.suppress(Exception):
                        release_active(zk, inv.cluster)
                else:
                    release_lock(zk, inv.cluster, owner)
    finally:
        workdir = attempt_dir(repairs_dir(settings), approved.hash, run_id)
        workdir.mkdir(parents=True, exist_ok=True)  # a plan with ZooKeeper actions only has no broker chain
        write_atomic(workdir / "zookeeper.json", json.dumps(record, indent=2).encode())
    return done


def make_restore_plan(settings: Settings, params: dict[str, Any]) -> dict[str, Any]:
    """The restore DAG's plan (``repair.restore``): which backups go back where, the controller (now) last."""
    from fleet_doctor.repair import restore

    inv = refuse_kraft(settings, "repairs and restores")
    with cluster_session(inv, timeout=10, start_timeout=15) as zk:
        controller = Cluster(zk).controller()
    return restore.make_restore_plan(settings, params, controller)
