"""The repair DAG's steps (dags/kafka_fleet_repair.py): make the plan, execute an approved one.

Plans come from ``repair_plan``, execution from ``repair_exec``; this module wires them to the audit's storage,
the inventory, ZooKeeper and the brokers' SSH connections (the SSH provider's hook, imported only when used).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from fleet_doctor import audit, inventory
from fleet_doctor.repair_exec import Cluster, Executor, Gates, RepairError, acquire_lock, release_lock
from fleet_doctor.repair_plan import FleetFacts, Plan, build_plan


def approvers() -> list[str] | None:
    """``FLEET_DOCTOR_APPROVERS``: comma-separated Airflow user names allowed to approve (unset: any user)."""
    raw = os.environ.get("FLEET_DOCTOR_APPROVERS", "").strip()
    return [u.strip() for u in raw.split(",") if u.strip()] or None


def repairs_dir(settings: audit.AuditSettings) -> Path:
    return settings.data_root / "repairs"


def latest_audit_run(settings: audit.AuditSettings) -> str:
    runs = audit.read_jsonl(settings.history_dir / "runs.jsonl")
    if not runs:
        raise RepairError(f"no audit run in {settings.history_dir}: run kafka_fleet_audit first")
    return runs[-1]["audit_run"]


def plan_from_run(settings: audit.AuditSettings, run: str, params: dict[str, Any]) -> Plan:
    findings = audit.read_jsonl(settings.history_dir / f"audit_run={run}" / "findings.jsonl")
    inv = inventory.load(settings.inventory)
    return build_plan(
        inv.cluster, run, findings, FleetFacts.load(settings.data_root / "staging" / run),
        rules=params.get("rules") or (), brokers=[int(b) for b in params.get("brokers") or ()],
        topics=params.get("topics") or (), hold_out=[int(b) for b in params.get("hold_out") or ()],
        include_internal=bool(params.get("include_internal")),
    )  # fmt: skip


def make_plan(settings: audit.AuditSettings, params: dict[str, Any]) -> dict[str, Any]:
    run = params.get("audit_run") or "latest"
    run = latest_audit_run(settings) if run == "latest" else audit.safe_run_id(run)
    plan = plan_from_run(settings, run, params)
    d = repairs_dir(settings) / plan.hash
    d.mkdir(parents=True, exist_ok=True)
    (d / "plan.json").write_text(plan.to_json())
    (d / "plan.md").write_text(plan.to_markdown())
    return {"hash": plan.hash, "audit_run": run, "subject": plan.subject(), "markdown": plan.to_markdown(),
            "counts": plan.counts(), "restart_order": plan.restart_order}  # fmt: skip


def _ssh_connect(inv: inventory.Inventory) -> Any:
    from airflow.providers.ssh.hooks.ssh import SSHHook

    def connect(broker_id: int) -> Any:
        return SSHHook(ssh_conn_id=inv.ssh_connection_id(broker_id), conn_timeout=10).get_conn()

    return connect


def execute(
    settings: audit.AuditSettings, planned: dict[str, Any], params: dict[str, Any], run_id: str, connect: Any = None
) -> dict[str, Any]:
    """Lock, re-verify, run the approved plan. Raises (the task fails) when the chain halts or the plan is stale."""
    from kazoo.client import KazooClient

    approved = Plan.from_json((repairs_dir(settings) / planned["hash"] / "plan.json").read_text())
    if approved.hash != planned["hash"]:
        raise RepairError(f"the stored plan does not hash to the approved {planned['hash'][:12]}: refusing")
    inv = inventory.load(settings.inventory)
    connect = connect or _ssh_connect(inv)
    zk = KazooClient(hosts=inv.zookeeper, timeout=10)
    zk.start(timeout=15)
    try:
        acquire_lock(zk, inv.cluster, {"plan_hash": approved.hash, "run_id": run_id, "since": time.time()})
        report: dict[str, Any] = {"plan": approved.hash}
        try:
            # re-verify against the fleet as it is now: a fresh audit must yield the very same plan
            verify_run = audit.safe_run_id(f"{run_id}-verify")
            journal = repairs_dir(settings) / approved.hash / "journal.json"
            if not journal.is_file():  # a resumed repair has already changed the fleet: its journal is the truth
                audit.run_local(settings, verify_run, lambda b: connect(b["broker_id"]))
                fresh = plan_from_run(settings, verify_run, params)
                if fresh.hash != approved.hash:
                    raise RepairError(
                        f"stale plan: the fleet changed since approval (approved {approved.hash[:12]}, now "
                        f"{fresh.hash[:12]}); nothing was touched"
                    )
            gates = Gates(
                healthy_polls=int(params.get("healthy_polls", 3)),
                poll_interval_s=float(params.get("poll_interval_s", 10)),
                isr_timeout_s=float(params.get("isr_timeout_s", 900)),
                pause_between_brokers_s=float(params.get("pause_between_brokers_s", 60)),
            )
            ex = Executor(approved, repairs_dir(settings), inv, connect, Cluster(zk), gates,
                          dry_run=bool(params.get("dry_run")))  # fmt: skip
            report["journal"] = ex.run()
        finally:
            release_lock(zk, inv.cluster, approved.hash)
    finally:
        zk.stop()
        zk.close()
    (repairs_dir(settings) / approved.hash / "result.json").write_text(json.dumps(report, indent=2, default=str))
    return {"plan": approved.hash, "status": report["journal"]["status"]}
