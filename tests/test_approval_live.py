"""The approval gate on a live Airflow (api-server + scheduler + dag-processor as processes, SQLite) with two users,
alice and bob, and ``FLEET_DOCTOR_APPROVERS=alice``, over a 3-broker fleet lab with seed-004 (a plan that restarts
every broker). Tests run in file order on one lab:

1. bob triggers a dry run; the approve task asks alice only, with the plan's own options ("Approve dry run: ..." and
   "Reject"); bob's answer is refused by Airflow (403), so is the bare "Approve" (400), and the plan does not run;
   alice approves: execute goes on and journals who approved which plan with which option;
2. the approve task is marked "success" by hand through the REST API while its request is open: execute refuses
   (no answer on record) and nothing on the brokers changes;
3. alice triggers and approves her own run: four eyes, execute refuses and nothing changes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fleet_lab.airflow_stack import AirflowLiveError
from harness.live_stack import FAST, LAB_CLUSTER, REPAIR, fleet_snapshot, plan_dir, scrape
from harness.shared import live

pytestmark = pytest.mark.timeout(1800)


@pytest.fixture
def fleet(shared: Any) -> dict[str, Any]:
    """The session's live Airflow (users admin, alice, bob; FLEET_DOCTOR_APPROVERS=alice: harness.shared) over the
    audited seed-004 lab, restored for each test."""
    return live(shared, shared.snapshot("seed-004"))


def journals(data: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted((data / "repairs").rglob("journal.json"))]


def refused(af: Any, run: str, message: str) -> None:
    """The run failed at execute, with the approval check's error in its log."""
    assert af.wait_run(REPAIR, run) == "failed"
    assert af.task_states(REPAIR, run)["execute"] == "failed"
    log = af.task_log(REPAIR, run, "execute")
    assert "ApprovalError" in log and message in log, log[-3000:]


def test_only_an_approver_can_answer_and_execute_records_who(fleet: dict[str, Any]) -> None:
    af, state = fleet["af"], fleet["state"]
    before = fleet_snapshot(state)
    # a dry run of broker 1 only (seed-004's broker out of ISR: a dry run cannot bring it back before broker 2)
    run = af.trigger(REPAIR, {**FAST, "dry_run": True, "brokers": [1]}, user="bob")
    request = af.wait_for_approval(REPAIR, run, "approve")  # the request was created: no TypeError any more
    assert request["assigned_users"] == [{"id": "alice", "name": "alice"}]
    # the fleet's metrics count it (Airflow's own record, read by the plugin), scraped with a bearer token
    pending = (("cluster", LAB_CLUSTER),)
    assert scrape(af, "bob")["kafka_fleet_pending_approvals"] == {pending: 1}
    plan_hash = plan_dir(fleet["data"], request).name
    # the buttons say what approving does, for this plan; the text says it is a dry run, above everything else
    option = f"Approve dry run: 1 broker, nothing written (plan {plan_hash[:12]})"
    assert request["options"] == [option, "Reject"] and not request["multiple"]
    assert request["body"].splitlines()[2].startswith("**DRY RUN: nothing will be written.**")
    assert "DRY RUN" in request["subject"]
    with pytest.raises(AirflowLiveError) as e:
        af.approve(REPAIR, run, "approve", user="bob")
    assert e.value.code == 403
    with pytest.raises(AirflowLiveError) as e:  # the bare "Approve" is not an option of this request
        af.respond(REPAIR, run, "approve", "Approve", user="alice")
    assert e.value.code == 400
    assert not af.hitl_detail(REPAIR, run, "approve")["response_received"]
    assert af.task_states(REPAIR, run)["execute"] is None  # the plan does not run
    assert af.approve(REPAIR, run, "approve", user="alice") == option
    assert af.wait_run(REPAIR, run) == "success", af.task_states(REPAIR, run)
    m = scrape(af)
    assert m["kafka_fleet_pending_approvals"] == {pending: 0}
    # the repair showed its lock to the fleet page, taken and released (a dry run takes it too)
    assert m["kafka_fleet_repair_lock_held"] == {pending: 0} and m["kafka_fleet_repair_lock_needs_human"] == {
        pending: 0
    }
    approvals = [a for j in journals(fleet["data"]) for a in j.get("approvals", [])]
    assert [(a["by"]["id"], a["plan_hash"], a["triggered_by"], a["option"]) for a in approvals] == [
        ("alice", plan_hash, "bob", option)
    ]
    assert fleet_snapshot(state) == before  # a dry run


def test_an_approval_marked_success_by_hand_runs_nothing(fleet: dict[str, Any]) -> None:
    af, state = fleet["af"], fleet["state"]
    before = fleet_snapshot(state)
    run = af.trigger(REPAIR, FAST, user="bob")  # a real run: only the approval check stands between it and brokers
    af.wait_for_approval(REPAIR, run, "approve")
    af.set_task_state(REPAIR, run, "approve", "success", user="bob")
    refused(af, run, "no answer on record")
    assert fleet_snapshot(state) == before
    assert journals(fleet["data"]) == []  # this run never got that far


def test_an_approver_cannot_approve_her_own_run(fleet: dict[str, Any]) -> None:
    af, state = fleet["af"], fleet["state"]
    before = fleet_snapshot(state)
    run = af.trigger(REPAIR, FAST, user="alice")
    af.wait_for_approval(REPAIR, run, "approve")
    af.approve(REPAIR, run, "approve", user="alice")  # Airflow lets her: she is assigned
    refused(af, run, "four eyes")
    assert fleet_snapshot(state) == before
