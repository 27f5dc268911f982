"""The repair DAG's steps (dags/kafka_fleet_repair.py): make the plan, execute an approved one.

Plans come from ``repair_plan``, execution from ``repair_exec``; this module wires them to the audit's storage,
the inventory, ZooKeeper and the brokers' SSH connections (the SSH provider's hook, imported only when used).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fleet_doctor import audit, inventory
from fleet_doctor.repair_exec import (
    Cluster,
    Executor,
    Gates,
    Journal,
    Remote,
    RepairError,
    acquire_lock,
    lock_holder,
    release_lock,
    restore,
    restore_topic_ids,
    wait_until,
)
from fleet_doctor.repair_plan import FleetFacts, Plan, build_plan
from fleet_doctor.store import write_atomic

LOG = logging.getLogger(__name__)


def manual_dag_args() -> dict[str, Any]:
    """What the repair and restore DAGs share: triggered by hand only, one run at a time."""
    import pendulum

    return {"schedule": None, "start_date": pendulum.datetime(2026, 1, 1, tz="UTC"), "catchup": False,
            "max_active_runs": 1, "tags": ["kafka", "fleet-doctor", "repair"]}  # fmt: skip


def approvers() -> list[str] | None:
    """``FLEET_DOCTOR_APPROVERS``: comma-separated Airflow user names allowed to approve (unset: any user)."""
    raw = os.environ.get("FLEET_DOCTOR_APPROVERS", "").strip()
    return [u.strip() for u in raw.split(",") if u.strip()] or None


def repairs_dir(settings: audit.AuditSettings) -> Path:
    try:
        return settings.repairs
    except ValueError as e:  # a remote data root without FLEET_DOCTOR_REPAIR_DIR
        raise RepairError(str(e)) from e


def latest_audit_run(settings: audit.AuditSettings) -> str:
    """The newest audit of the whole fleet (a run of only some brokers is no base for a plan)."""
    runs = [r for r in settings.store.read_jsonl("history/runs.jsonl") if not r.get("out_of_scope")]
    if not runs:
        raise RepairError(f"no whole-fleet audit run in {settings.store.url('history')}: run kafka_fleet_audit first")
    return runs[-1]["audit_run"]


def whole_fleet_run(settings: audit.AuditSettings, run: str) -> None:
    """Refuse to plan from an audit that staged only some brokers: the others' findings would silently drop out
    of the plan, and the re-verify before execution (a whole-fleet audit) could never match its hash."""
    for r in settings.store.read_jsonl("history/runs.jsonl"):
        if r["audit_run"] == run and r.get("out_of_scope"):
            raise RepairError(
                f"audit run {run} audited only some brokers (out of scope: {r['out_of_scope']}): plan from a "
                "whole-fleet audit run (audit_run 'latest' picks the newest one)"
            )


def plan_from_run(settings: audit.AuditSettings, run: str, params: dict[str, Any]) -> Plan:
    whole_fleet_run(settings, run)
    findings = settings.store.read_jsonl(f"history/audit_run={run}/findings.jsonl")
    inv = inventory.load(settings.inventory)
    return build_plan(
        inv.cluster, run, findings, FleetFacts.load(settings.store, settings.run_key(run)),
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
            "counts": plan.counts(), "restart_order": plan.restart_order,
            "zookeeper_subject": plan.zookeeper_subject(), "zookeeper_markdown": plan.zookeeper_markdown()}  # fmt: skip


def _ssh_connect(inv: inventory.Inventory) -> Any:
    from airflow.providers.ssh.hooks.ssh import SSHHook

    def connect(broker_id: int) -> Any:
        return SSHHook(ssh_conn_id=inv.ssh_connection_id(broker_id), conn_timeout=10).get_conn()

    return connect


def _approved(settings: audit.AuditSettings, planned: dict[str, Any]) -> Plan:
    approved = Plan.from_json((repairs_dir(settings) / planned["hash"] / "plan.json").read_text())
    if approved.hash != planned["hash"]:
        raise RepairError(f"the stored plan does not hash to the approved {planned['hash'][:12]}: refusing")
    return approved


@contextlib.contextmanager
def _zookeeper(inv: inventory.Inventory) -> Iterator[Any]:
    from kazoo.client import KazooClient

    zk = KazooClient(hosts=inv.zookeeper, timeout=10)
    zk.start(timeout=15)
    try:
        yield zk
    finally:
        zk.stop()
        zk.close()


def _report(journal: dict[str, Any], order: list[int]) -> dict[str, Any]:
    """What was done and what was not, per broker, from the journal."""
    brokers = journal.get("brokers", {})
    done = [b for b in order if brokers.get(str(b), {}).get("state") == "done"]
    failed = {b: brokers[str(b)]["failed"] for b in order if brokers.get(str(b), {}).get("failed")}
    untouched = [b for b in order if brokers.get(str(b), {}).get("state", "pending") == "pending" and b not in failed]
    partly = [b for b in order if b not in done and b not in untouched]
    return {"status": journal.get("status"), "error": journal.get("error"), "done": done, "failed": failed,
            "partly_done": {b: brokers[str(b)]["state"] for b in partly}, "untouched": untouched}  # fmt: skip


def execute(
    settings: audit.AuditSettings, planned: dict[str, Any], params: dict[str, Any], run_id: str, connect: Any = None
) -> dict[str, Any]:
    """Lock, re-verify, run the approved plan's broker chain. Raises (the task fails) when the chain halts or the
    plan is stale; ``<repairs>/<hash>/result.json`` says what was done and what was not either way."""
    approved = _approved(settings, planned)
    inv = inventory.load(settings.inventory)
    connect = connect or _ssh_connect(inv)
    workdir = repairs_dir(settings) / approved.hash
    owner = {"plan_hash": approved.hash, "step": "brokers", "run_id": run_id, "since": time.time()}
    report: dict[str, Any] = {"plan": approved.hash, "run_id": run_id, "restart_order": approved.restart_order}
    try:
        with _zookeeper(inv) as zk:
            acquire_lock(zk, inv.cluster, owner)
            try:
                journal = Journal(workdir / "journal.json", approved)
                if not journal.touched():  # a resumed repair has changed the fleet: its journal is the truth
                    # re-verify against the fleet as it is now: a fresh audit must yield the very same plan
                    verify_run = audit.safe_run_id(f"{run_id}-verify")
                    audit.run_local(settings, verify_run, lambda b: connect(b["broker_id"]))
                    fresh = plan_from_run(settings, verify_run, params)
                    report["reverified_with"] = verify_run
                    if fresh.hash != approved.hash:
                        journal.data.update(status="aborted", error=f"stale plan (fleet now gives {fresh.hash[:12]})")
                        journal.save()
                        raise RepairError(
                            f"stale plan: the fleet changed since approval (approved {approved.hash[:12]}, now "
                            f"{fresh.hash[:12]}: {workdir.parent / fresh.hash / 'plan.md'}); nothing was touched"
                        )
                gates = Gates(
                    healthy_polls=int(params.get("healthy_polls", 3)),
                    poll_interval_s=float(params.get("poll_interval_s", 10)),
                    isr_timeout_s=float(params.get("isr_timeout_s", 900)),
                    pause_between_brokers_s=float(params.get("pause_between_brokers_s", 60)),
                )
                ex = Executor(approved, repairs_dir(settings), inv, connect, Cluster(zk), gates,
                              dry_run=bool(params.get("dry_run")))  # fmt: skip
                ex.run()
            finally:
                release_lock(zk, inv.cluster, owner)
                report["lock_released"] = lock_holder(zk, inv.cluster) is None
    finally:
        if (workdir / "journal.json").is_file():
            report.update(_report(json.loads((workdir / "journal.json").read_text()), approved.restart_order))
        write_atomic(workdir / "result.json", json.dumps(report, indent=2, default=str).encode())
        LOG.info("repair %s: %s", approved.hash[:12], json.dumps(report, default=str))
    return {k: report.get(k) for k in ("plan", "status", "done", "untouched", "lock_released")}


def restore_zookeeper(
    settings: audit.AuditSettings, planned: dict[str, Any], params: dict[str, Any], run_id: str, connect: Any = None
) -> list[str]:
    """The plan's preventive ZooKeeper actions, after their own approval; under the cluster lock (waiting for the
    same plan's broker chain, never for another repair)."""
    approved = _approved(settings, planned)
    inv = inventory.load(settings.inventory)
    connect = connect or _ssh_connect(inv)
    owner = {"plan_hash": approved.hash, "step": "zookeeper", "run_id": run_id, "since": time.time()}
    with _zookeeper(inv) as zk:
        acquire_lock(zk, inv.cluster, owner, wait_s=float(params.get("isr_timeout_s", 900)) * 4)
        try:
            done = restore_topic_ids(zk, approved.zookeeper, connect, inv, dry_run=bool(params.get("dry_run")))
        finally:
            release_lock(zk, inv.cluster, owner)
    write_atomic(repairs_dir(settings) / approved.hash / "zookeeper.json", json.dumps(done, indent=2).encode())
    return done


def restore_backup(
    settings: audit.AuditSettings, plan_hash: str, broker_ids: list[int], start: bool, run_id: str,
    connect: Any = None, timeout_s: float = 600.0,
) -> list[str]:  # fmt: skip
    """Put a repair's backups back: per broker (every broker with a backup when none is named) stop it, untar the
    backup over its files, check them against the manifest, and start it again unless ``start`` is false."""
    known = [d for d in repairs_dir(settings).glob(f"{plan_hash}*") if (d / "plan.json").is_file()]
    if len(known) != 1:
        raise RepairError(f"{len(known)} repair plans match {plan_hash!r} in {repairs_dir(settings)}")
    workdir = known[0]
    plan_hash = workdir.name
    with_backup = sorted(
        int(d.name.split("-", 1)[1]) for d in workdir.glob("broker-*") if (d / "backup.tar.gz").is_file()
    )
    targets = broker_ids or with_backup
    missing = sorted(set(targets) - set(with_backup))
    if missing:
        raise RepairError(f"plan {plan_hash[:12]} has no backup for broker(s) {missing}")
    inv = inventory.load(settings.inventory)
    connect = connect or _ssh_connect(inv)
    owner = {"plan_hash": plan_hash, "step": "restore", "run_id": run_id, "since": time.time()}
    out = []
    with _zookeeper(inv) as zk:
        acquire_lock(zk, inv.cluster, owner)
        try:
            cluster = Cluster(zk)
            for bid in targets:
                client = connect(bid)
                try:
                    remote = Remote(bid, client, [])
                    remote.run(inv.broker(bid).service_command("stop"), timeout=timeout_s)
                    wait_until(lambda b=bid: b not in cluster.registered(), timeout_s, f"broker {bid} did not stop")
                    out.append(f"broker {bid}: " + restore(repairs_dir(settings), plan_hash, bid, remote))
                    if start:
                        remote.run(inv.broker(bid).service_command("start"), timeout=timeout_s, check=False)
                        wait_until(lambda b=bid: b in cluster.registered(), timeout_s, f"broker {bid} did not register")
                        out[-1] += ", started and registered"
                finally:
                    client.close()
        finally:
            release_lock(zk, inv.cluster, owner)
    write_atomic(workdir / f"restore-{audit.safe_run_id(run_id)}.json", json.dumps(out, indent=2).encode())
    return out
