"""The three steps of a DAG that changes brokers only after a person said yes to a stored plan (the restore's, the
purge's): **plan** (the plan made and saved, its approval text in XCom), **approve** (the request in Airflow's
Required Actions), then the act, which reads the answer back itself (``repair.approval.confirm``: an approve task
marked success by hand is refused) and runs the plan as stored."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from airflow.sdk import get_current_context, task

from fleet_doctor.repair import approval
from fleet_doctor.repair.hitl import PlanApprovalOperator
from fleet_doctor.settings import Settings


def plan_approve_act(
    parsed: Settings,
    settings: Callable[[], Settings],
    make_plan: Callable[[Settings, dict[str, Any]], dict[str, Any]],
    request: Callable[[Settings, dict[str, Any]], Any],
    act: Callable[..., dict[str, Any]],
    act_task_id: str,
) -> None:
    """Inside a DAG: ``plan`` (``make_plan(settings, params)``) >> ``approve`` >> ``act_task_id`` (``act(settings,
    planned, params, run_id, approval=answer)``, once ``request(settings, planned)``, what the stored plan shows
    and offers, is what the person answered)."""

    @task(task_id="plan")
    def plan() -> dict[str, Any]:
        return make_plan(settings(), get_current_context()["params"])

    approve = PlanApprovalOperator(
        task_id="approve",
        subject_key="subject",
        body_key="markdown",
        option_key="approve_option",
        assigned_users=approval.hitl_users(parsed),
        response_timeout=timedelta(hours=24),
    )

    @task(task_id=act_task_id)
    def acting(planned: dict[str, Any]) -> dict[str, Any]:
        ctx, here = get_current_context(), settings()
        answer = approval.confirm(ctx, "approve", planned["hash"], here, request(here, planned))
        return act(here, planned, ctx["params"], ctx["run_id"], approval=answer)

    planned = plan()
    planned >> approve >> acting(planned)
