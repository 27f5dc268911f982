"""A fleet lab with a seed scenario and one audit, for the repair tests that drive the plan and the executor directly
(no Airflow): real sshd per broker, ZooKeeper 3.8, lab brokers, Spark detection."""

from __future__ import annotations

from typing import Any

from fleet_doctor import layout
from fleet_doctor.repair.gates import Gates
from fleet_doctor.repair.plan import Plan
from fleet_doctor.repair.planner import FleetFacts, build_plan
from fleet_doctor.settings import Settings

FAST = Gates(
    stop_timeout_s=60,
    start_timeout_s=60,
    healthy_polls=3,
    poll_interval_s=0.5,
    isr_timeout_s=60,
    pause_between_brokers_s=0,
)


def plan_of(ctx: dict[str, Any], **scope: Any) -> Plan:
    """The plan for the lab's audit ``run1``, in ``scope`` (build_plan's keywords: brokers, rules, topics...)."""
    s: Settings = ctx["settings"]
    findings = s.store.read_jsonl(layout.history_findings("run1"))
    return build_plan(ctx["inv"].cluster, "run1", findings, FleetFacts.load(s.store, layout.staging("run1")), **scope)
