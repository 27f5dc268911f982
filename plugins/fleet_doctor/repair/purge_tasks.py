"""What the purge DAG's tasks call (dags/kafka_fleet_purge.py): plan the deletion of a repair's quarantine, and run an
approved one under the cluster lock (``repair.purge``). Only the purge DAG imports it."""

from __future__ import annotations

import json
import time
from typing import Any

from fleet_doctor import layout
from fleet_doctor.repair import approval_text
from fleet_doctor.repair.broker import BrokerHost, ssh_hosts
from fleet_doctor.repair.errors import RepairError
from fleet_doctor.repair.plan import Plan
from fleet_doctor.repair.purge import purge_plan, run_purge
from fleet_doctor.repair.session import (
    cluster_lock,
    lock_mirror,
    repairs_dir,
    save_for_approval,
    ssh_connect,
)
from fleet_doctor.settings import Settings

DEFAULT_OLDER_THAN_DAYS = 7.0  # a quarantine younger than a week is kept unless the form says otherwise


def _hosts(inv: Any, connect: Any, commands: list[dict[str, Any]]) -> Any:
    hosts = ssh_hosts(inv, connect or ssh_connect(inv))

    def host(broker_id: int) -> BrokerHost:
        return hosts(broker_id, commands)

    return host


def plan(settings: Settings, params: dict[str, Any], connect: Any = None) -> dict[str, Any]:
    """The purge DAG's plan task: what the repair plan ``params["plan"]`` quarantined, at least ``older_than_days``
    ago, on the ``brokers`` named (default all), saved under ``<repairs>/<plan>/purges/<purge hash>/``, and its
    approval request."""
    inv = settings.load_inventory()
    repairs = repairs_dir(settings)
    days = params.get("older_than_days")
    p = purge_plan(
        repairs,
        inv,
        str(params.get("plan") or ""),
        [int(b) for b in params.get("brokers") or ()],
        DEFAULT_OLDER_THAN_DAYS if days is None else float(days),
        _hosts(inv, connect, []),
    )
    d = repairs.purge_dir(p.scope["purge_of"], p.hash)
    saved = save_for_approval(d, p, approval_text.purge_request(p, str(d)))
    return saved | {"purge_of": p.scope["purge_of"], "totals": approval_text.purge_totals(p)}


def stored_plan(settings: Settings, planned: dict[str, Any]) -> Plan:
    """The purge plan the plan task saved, checked to hash to ``planned["hash"]``."""
    d = repairs_dir(settings).purge_dir(planned["purge_of"], planned["hash"])
    p = Plan.from_json((d / layout.PLAN).read_text())
    if p.hash != planned["hash"]:
        raise RepairError(f"the stored purge plan does not hash to the approved {planned['hash'][:12]}: refusing")
    return p


def approval_request(settings: Settings, planned: dict[str, Any]) -> approval_text.Request:
    """The purge approval as the stored plan renders it (``approval.confirm`` compares it with Airflow's record)."""
    p = stored_plan(settings, planned)
    return approval_text.purge_request(p, str(repairs_dir(settings).purge_dir(planned["purge_of"], p.hash)))


def purge(
    settings: Settings,
    planned: dict[str, Any],
    params: dict[str, Any],
    run_id: str,
    connect: Any = None,
    approval: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Delete an approved purge plan's entries under the cluster's repair lock (no other repair, restore or purge
    of the cluster meanwhile); ``<repairs>/<plan>/purges/<purge hash>/result-<run>.json`` says what was deleted and
    freed either way."""
    inv = settings.load_inventory()
    p = stored_plan(settings, planned)
    repair = Plan.from_json(repairs_dir(settings).plan(p.scope["purge_of"]).read_text())
    where = repairs_dir(settings).purge_dir(p.scope["purge_of"], p.hash)
    owner = {"plan_hash": p.hash, "step": "purge", "run_id": run_id, "since": time.time()}
    commands: list[dict[str, Any]] = []
    report: dict[str, Any] = {"purge": p.hash, "of": p.scope["purge_of"], "run_id": run_id, "approval": approval}
    report["planned"] = approval_text.purge_totals(p)
    with cluster_lock(
        inv,
        owner,
        report,
        where / f"result-{layout.attempt_name(run_id)}.json",
        before_result=lambda r: r.update(commands=commands),
        cluster_id=repair.scope.get("cluster_id"),
        mirror=lock_mirror(settings),
        lock_dir=settings.lock_dir,
    ) as lock:
        run_purge(p, _hosts(inv, connect, commands), lock.fence(), report)
    return {k: report.get(k) for k in ("purge", "of", "freed_bytes", "lock_released")} | {
        "deleted": sum(len(v) for v in report.get("deleted", {}).values())
    }


def result(settings: Settings, planned: dict[str, Any], run_id: str) -> dict[str, Any]:
    """The result file of one purge run (tests, the operator)."""
    d = repairs_dir(settings).purge_dir(planned["purge_of"], planned["hash"])
    return json.loads((d / f"result-{layout.attempt_name(run_id)}.json").read_text())
