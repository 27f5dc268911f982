"""What the roll DAG's tasks call (dags/kafka_fleet_roll.py): make the roll plan from the live cluster and the newest
audit, render its approval, run an approved one under the cluster lock (``repair.session``) with
``repair.roll.RollExecutor``. Only the roll DAG imports it."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from fleet_doctor import layout, roll_status
from fleet_doctor.audit.history import latest_whole_fleet_run
from fleet_doctor.cluster_health import ClusterHealth
from fleet_doctor.repair import approval_text
from fleet_doctor.repair.broker import ssh_hosts
from fleet_doctor.repair.errors import RepairError
from fleet_doctor.repair.gates import ROLL_GATE_PARAMS, Gates, approved_gates, gates_of, static_min_isr
from fleet_doctor.repair.journal import Journal, attempt_report
from fleet_doctor.repair.kraft_cluster import KraftCluster
from fleet_doctor.repair.plan import Plan, RestartPreview
from fleet_doctor.repair.planner import RECOVERY_BYTES_PER_S, FleetFacts, restart_preview
from fleet_doctor.repair.roll import RollExecutor
from fleet_doctor.repair.roll_plan import (
    BATCHING,
    StepTimes,
    build_roll_plan,
    is_roll,
    leadership_way,
    measure_recovery,
    measure_steps,
    recovery_bytes,
)
from fleet_doctor.repair.session import cluster_lock, lock_mirror, repairs_dir, save_for_approval, ssh_connect
from fleet_doctor.settings import Settings
from fleet_doctor.zookeeper import cluster_session
from fleet_doctor.zookeeper.cluster import Cluster

LOG = logging.getLogger(__name__)


def plan(settings: Settings, params: dict[str, Any], connect_controller: Any = None) -> dict[str, Any]:
    """The roll DAG's plan task: ``make_roll_plan`` over the cluster as it is now (ZooKeeper, or the KRaft quorum's
    committed metadata reached with ``connect_controller``, default the controllers' Airflow connections)."""
    inv = settings.load_inventory()
    min_isr = static_min_isr(params, inv.min_insync_replicas)
    if inv.kraft:
        with KraftCluster(inv, connect_controller, min_isr) as live:
            return make_roll_plan(settings, params, live)
    with cluster_session(inv, timeout=10, start_timeout=15) as zk:
        return make_roll_plan(settings, params, Cluster(zk, default_min_isr=min_isr))


def audit_previews(settings: Settings, brokers: list[int]) -> tuple[str, dict[int, RestartPreview | None]]:
    """Each broker's restart preview from the newest whole-fleet audit (segments and bytes past its recovery point,
    whether it is down after an unclean stop); ("", {}) when there is no audit to go by (said in the approval)."""
    run = latest_whole_fleet_run(settings.store)
    if run is None:
        return "", {}
    try:
        facts = FleetFacts.load(settings.store, layout.staging(run))
    except (OSError, ValueError) as e:
        LOG.warning("roll: the audit run %s's staged facts could not be read (%s): no recovery prediction", run, e)
        return "", {}
    return run, {b: restart_preview(facts.probe[b], set()) if b in facts.probe else None for b in brokers}


def make_roll_plan(settings: Settings, params: dict[str, Any], cluster: ClusterHealth) -> dict[str, Any]:
    """The roll plan for the DAG's ``params`` over ``cluster`` (its partitions, racks, controller and voters read
    now), saved under ``<repairs>/<hash>/`` with its approval text; what the approve task shows."""
    inv = settings.load_inventory()
    known = {b.id for b in inv.brokers}
    asked = sorted({int(b) for b in params.get("brokers") or ()}) or sorted(known)
    unknown = sorted(set(asked) - known)
    if unknown:
        raise RepairError(f"broker(s) {unknown} are not in the inventory of cluster {inv.cluster}: nothing planned")
    reason = {"kind": str(params.get("reason_kind") or ""), "text": str(params.get("reason") or "").strip()}
    if reason["kind"] == "other" and not reason["text"]:
        raise RepairError("a roll for reason 'other' says what it is for (the reason field): nothing planned")
    gates = Gates.from_params(params)
    run, previews = audit_previews(settings, asked)
    times = step_times(settings)
    try:
        control = roll_status.read_control(settings.store)
    except Exception as e:  # the roll reads them again at each step, and halts then if they still cannot be read
        LOG.warning("roll: the operator's holds and skips cannot be read now: %s", e)
        control = roll_status.Control()
    try:
        p = build_roll_plan(
            inv.cluster,
            asked,
            reason=reason,
            partitions=cluster.partitions(),
            racks=cluster.racks(),
            controller=cluster.controller(),
            voters=cluster.voters(),
            down=set(asked) - cluster.registered(),
            previews=previews,
            hold_out=[int(b) for b in params.get("hold_out") or ()],
            batched=params.get("batching") == BATCHING[1],
            isr_margin=int(params.get("isr_margin") or 0),
            max_batch=int(params.get("max_batch") or 0),
            gates=gates_of(params, ROLL_GATE_PARAMS),
            audit_run=run,
            kraft=inv.kraft,
            cluster_id=cluster.cluster_id(),  # type: ignore[attr-defined]
            leadership=leadership_way(inv),
            recovery_bytes_per_s=times.recovery_bytes_per_s or RECOVERY_BYTES_PER_S,
            isr_wait_s=gates.healthy_polls * gates.poll_interval_s,
            pause_s=gates.pause_between_brokers_s,
            times=times,
            standing=control.said(),
        )
    except ValueError as e:
        raise RepairError(f"the roll cannot be planned: {e}") from e
    return save_for_approval(repairs_dir(settings).plan_dir(p.hash), p, approval_text.roll_request(p))


def stored_roll_plan(settings: Settings, planned: dict[str, Any]) -> Plan:
    """The roll plan the plan task saved, checked to hash to ``planned["hash"]`` and to be a roll's."""
    digest = str(planned.get("hash") or "")
    path = repairs_dir(settings).plan(digest)
    if not path.is_file():
        raise RepairError(f"no roll plan {digest[:12]!r} in {path.parent.parent}")
    p = Plan.from_json(path.read_text())
    if p.hash != digest or not is_roll(p):
        raise RepairError(f"the stored plan is not the approved roll {digest[:12]}: refusing")
    return p


def approval_request(settings: Settings, planned: dict[str, Any]) -> approval_text.Request:
    """The roll approval as the stored plan renders it (``approval.confirm`` compares it with Airflow's record)."""
    return approval_text.roll_request(stored_roll_plan(settings, planned))


def roll(
    settings: Settings,
    planned: dict[str, Any],
    params: dict[str, Any],
    run_id: str,
    connect: Any = None,
    approval: dict[str, Any] | None = None,
    connect_controller: Any = None,
) -> dict[str, Any]:
    """Run an approved roll plan under the cluster lock, with the gates the approver saw. Raises (the task fails)
    when the chain halts; ``<repairs>/<hash>/attempts/<run>/result.json`` says what was done either way. One attempt
    per Airflow run: a rerun of the same run resumes it."""
    inv = settings.load_inventory()
    approved = stored_roll_plan(settings, planned)
    repairs = repairs_dir(settings)
    workdir = repairs.attempt(approved.hash, run_id)
    owner = {"plan_hash": approved.hash, "step": "roll", "run_id": run_id, "since": time.time()}
    report: dict[str, Any] = {"roll": approved.hash, "run_id": run_id, "order": approved.restart_order}
    journal: Journal | None = None
    gated = approved_gates(approved.gates, params)

    def outcome(report: dict[str, Any]) -> None:
        if (workdir / layout.JOURNAL).is_file():
            data = json.loads((workdir / layout.JOURNAL).read_text())
            brokers = data["brokers"]
            report.update(attempt_report(data, approved.restart_order))
            report["states"] = {b: brokers[str(b)]["state"] for b in approved.restart_order}
            report["skipped"] = {
                b: brokers[str(b)]["skipped"] for b in approved.restart_order if "skipped" in brokers[str(b)]
            }
            report["leadership_left"] = {
                b: brokers[str(b)]["leadership_left"]
                for b in approved.restart_order
                if "leadership_left" in brokers[str(b)]
            }
        LOG.info("roll %s: %s", approved.hash[:12], json.dumps(report, default=str))

    with cluster_lock(
        inv,
        owner,
        report,
        workdir / layout.RESULT,
        before_result=outcome,
        cluster_id=approved.scope.get("cluster_id"),
        mirror=lock_mirror(settings),
        lock_dir=settings.lock_dir,
        connect=connect_controller,
    ) as lock:
        lock.keep_when(lambda: journal.keeps_lock() if journal else None)
        ex = RollExecutor(
            approved,
            workdir,
            inv,
            ssh_hosts(inv, connect or ssh_connect(inv)),
            lock.cluster(gated),
            Gates.from_params(gated),
            dry_run=bool(gated.get("dry_run")),
            fence=lock.fence(),
            controls=lambda: roll_status.read_control(settings.store),
            status=lambda status: roll_status.record_status(settings.store, status),
            run_id=run_id,
        )
        journal = ex.journal
        if approval is not None:
            journal.approved(approval)
        ex.run()
    record_step_times(settings, journal.data, approved)
    return report


def record_step_times(settings: Settings, journal: dict[str, Any], approved: Plan) -> None:
    """The finished roll's measured step times and log recovery rate in the cluster's store
    (``layout.ROLL_TIMINGS``): the next roll's prediction goes by them. A roll that measured one and not the other
    keeps the other as it was. Best effort: a store that cannot be written costs the next prediction only."""
    measured = measure_steps(journal, approved.hash)
    recovery = measure_recovery(journal, approved.hash, recovery_bytes(approved))
    if measured is None and recovery is None:
        return
    try:
        before = settings.store.read_json(layout.ROLL_TIMINGS)
        before = before if isinstance(before, dict) else {}
    except Exception as e:  # a damaged record is replaced, never left to block every later one
        LOG.warning("roll %s: the earlier measurements cannot be read (replaced): %s", approved.hash[:12], e)
        before = {}
    try:
        record = measured or {k: v for k, v in before.items() if k != "recovery"}
        if recovery or before.get("recovery"):
            record["recovery"] = recovery or before["recovery"]
        if "stop_s" not in record:  # no step times measured yet: the recovery rate alone waits for them
            record = {"recovery": record["recovery"]}
        settings.store.write_text(layout.ROLL_TIMINGS, json.dumps(record, indent=2))
    except Exception as e:
        LOG.warning("roll %s: the measured step times could not be stored: %s", approved.hash[:12], e)


def step_times(settings: Settings) -> StepTimes:
    """The step times of the cluster's last roll (``record_step_times``), or the defaults."""
    try:
        return StepTimes.measured(settings.store.read_json(layout.ROLL_TIMINGS))
    except Exception as e:
        LOG.warning("roll: the measured step times could not be read (the defaults go): %s", e)
        return StepTimes()
