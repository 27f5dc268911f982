"""A fleet lab with a seed scenario and one audit, for the repair tests that drive the plan and the executor directly
(no Airflow): real sshd per broker, ZooKeeper 3.8, lab brokers, Spark detection."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fleet_doctor import inventory, layout
from fleet_doctor.audit import steps
from fleet_doctor.repair.gates import Gates
from fleet_doctor.repair.plan import Plan
from fleet_doctor.repair.planner import FleetFacts, build_plan
from fleet_doctor.settings import Settings
from fleet_lab import fleet
from fleet_lab.incidents import run_scenario
from harness.ssh import ssh_connect

FAST = Gates(
    stop_timeout_s=60,
    start_timeout_s=60,
    healthy_polls=3,
    poll_interval_s=0.5,
    isr_timeout_s=60,
    pause_between_brokers_s=0,
)


@contextmanager
def audited_lab(tmp_path: Path, scenario: str = "seed-004", version: str = "2.8.2") -> Iterator[dict[str, Any]]:
    """A 3-broker lab after ``scenario``, audited once as run ``run1``: state, settings, inventory, summary, tmp."""
    lab_dir = tmp_path / "lab"
    state = fleet.up(lab_dir, brokers=3, kafka_version=version)
    try:
        assert all(s.ok for s in run_scenario(state, scenario))
        settings = Settings(inventory=lab_dir / "inventory.json", data_root=tmp_path / "data")
        inv = inventory.load(settings.inventory)
        summary = steps.run_local(settings, "run1", ssh_connect(inv))
        yield {"state": state, "settings": settings, "inv": inv, "summary": summary, "tmp": tmp_path}
    finally:
        fleet.down(lab_dir)


def plan_of(ctx: dict[str, Any], **scope: Any) -> Plan:
    """The plan for the lab's audit ``run1``, in ``scope`` (build_plan's keywords: brokers, rules, topics...)."""
    s: Settings = ctx["settings"]
    findings = s.store.read_jsonl(layout.history_findings("run1"))
    return build_plan(ctx["inv"].cluster, "run1", findings, FleetFacts.load(s.store, layout.staging("run1")), **scope)
