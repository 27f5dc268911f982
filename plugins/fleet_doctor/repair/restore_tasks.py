"""What the restore DAG's tasks call (dags/kafka_fleet_restore.py): make the restore plan, and run an approved one under
the cluster lock (``repair.session``) with the repair's state machine (``repair.restore.RestoreExecutor``)."""

from __future__ import annotations

import time
from typing import Any

from fleet_doctor import layout
from fleet_doctor.repair import approval_text
from fleet_doctor.repair.broker import ssh_hosts
from fleet_doctor.repair.gates import RESTORE_GATE_PARAMS, Gates, approved_gates, gates_of
from fleet_doctor.repair.journal import Journal, State
from fleet_doctor.repair.kraft_cluster import KraftCluster
from fleet_doctor.repair.plan import Plan
from fleet_doctor.repair.restore import RestoreExecutor, find_plan, restore_plan, still_needs_human, stored_restore_plan
from fleet_doctor.repair.session import (
    cluster_lock,
    lock_mirror,
    repairs_dir,
    save_for_approval,
    ssh_connect,
)
from fleet_doctor.settings import Settings
from fleet_doctor.zookeeper import cluster_session
from fleet_doctor.zookeeper.cluster import Cluster


def plan(settings: Settings, params: dict[str, Any]) -> dict[str, Any]:
    """The restore DAG's plan task: ``make_restore_plan`` with the active controller as the cluster names it now
    (ZooKeeper's ``/controller``; on KRaft the quorum's leader, its voters ordered after the brokers)."""
    inv = settings.load_inventory()
    if inv.kraft:
        with KraftCluster(inv) as live:
            controller = live.controller()
        return make_restore_plan(settings, params, controller)
    with cluster_session(inv, timeout=10, start_timeout=15) as zk:
        controller = Cluster(zk).controller()
    return make_restore_plan(settings, params, controller)


def make_restore_plan(settings: Settings, params: dict[str, Any], controller: int | None) -> dict[str, Any]:
    """The restore plan (``repair.restore.restore_plan``: which backups go back where, ``controller`` last), saved
    under ``<repairs>/<hash>/restores/<restore hash>/``, and its approval request."""
    inv = settings.load_inventory()
    repairs = repairs_dir(settings)
    p = restore_plan(
        repairs,
        inv,
        str(params.get("plan") or ""),
        [int(b) for b in params.get("brokers") or ()],
        bool(params.get("start", True)),
        controller,
        str(params.get("attempt") or "") or None,
        gates_of(params, RESTORE_GATE_PARAMS),
    )
    d = repairs.restore_dir(p.scope["restore_of"], p.hash)
    return save_for_approval(d, p, approval_text.restore_request(p)) | {"restore_of": p.scope["restore_of"]}


def approval_request(settings: Settings, planned: dict[str, Any]) -> approval_text.Request:
    """The restore approval as the stored restore plan renders it (``approval.confirm`` compares it with Airflow's
    record of the request and its answer)."""
    return approval_text.restore_request(stored_restore_plan(repairs_dir(settings), planned))


def restore_backup(
    settings: Settings,
    planned: dict[str, Any],
    params: dict[str, Any],
    run_id: str,
    connect: Any = None,
    approval: dict[str, Any] | None = None,
    connect_controller: Any = None,
) -> dict[str, Any]:
    """Run an approved restore plan (``make_restore_plan``) under the cluster lock; the repair attempt's journal
    marks each restored broker pending again. ``connect_controller``: how a KRaft cluster's controllers are reached
    (default their Airflow connections). ``<repairs>/<hash>/restores/<restore hash>/result-<run>.json`` says
    what was done either way."""
    inv = settings.load_inventory()
    repairs = repairs_dir(settings)
    p = stored_restore_plan(repairs, planned)
    plan_dir = find_plan(repairs.root, p.scope["restore_of"])
    source = repairs.attempts(plan_dir.name) / p.scope["attempt"]
    repair = Plan.from_json((plan_dir / layout.PLAN).read_text())
    owner = {"plan_hash": plan_dir.name, "step": "restore", "run_id": run_id, "since": time.time()}
    report: dict[str, Any] = {"restore": p.hash, "of": plan_dir.name, "run_id": run_id, "order": p.restart_order}
    journal: Journal | None = None
    gated = approved_gates(p.gates, params)  # what the approver saw, not what the form says now

    def outcome(report: dict[str, Any]) -> None:
        if journal is not None:
            brokers = journal.data["brokers"]
            report["status"] = journal.data.get("status")
            report["error"] = journal.data.get("error")
            report["done"] = [b for b in p.restart_order if brokers[str(b)]["state"] == State.DONE]
            report["states"] = {b: brokers[str(b)]["state"] for b in p.restart_order}
            report["changed"] = [b for b in p.restart_order if journal.changing(b)]

    def left_for_human() -> str | None:
        done = {b for b in p.restart_order if journal and journal.completed(b) == State.DONE}
        left = still_needs_human(source / layout.JOURNAL, repair, done)
        if left or not journal or journal.data.get("status") != "done":
            return f"broker(s) {left} still need a human"
        return None

    result = repairs.restore_result(plan_dir.name, p.hash, run_id)
    with cluster_lock(
        inv,
        owner,
        report,
        result,
        take_over=(plan_dir.name, p.scope["attempt"]),
        before_result=outcome,
        cluster_id=repair.scope.get("cluster_id"),
        mirror=lock_mirror(settings),
        lock_dir=settings.lock_dir,
        connect=connect_controller,
    ) as lock:
        lock.hand_back_when(left_for_human)  # the halted repair still needs a human: its lock stays
        lock.keep_when(lambda: journal.keeps_lock() if journal else None)
        ex = RestoreExecutor(
            p,
            source,
            repair,
            repairs.restore_run(plan_dir.name, p.hash, run_id),
            inv,
            ssh_hosts(inv, connect or ssh_connect(inv)),
            lock.cluster(gated),
            Gates.for_restore(gated),
            fence=lock.fence(),
        )
        journal = ex.journal
        if approval is not None:
            journal.approved(approval)
        ex.run()
    return report
