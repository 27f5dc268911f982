"""The approval request of a repair or restore plan: Airflow's human-in-the-loop operator with the plan's own
options, "Approve: restart 3 brokers, change 14 files (plan 1f2e3d4c5b6a)" and "Reject", instead of
``ApprovalOperator``'s fixed "Approve" / "Reject" (which it refuses to change).

Subject, body and the approving option are templates over the plan task's XCom, rendered by Airflow before
``execute`` (the request is written with them) and again before ``execute_complete`` (the answer is validated
against them). Semantics as ``ApprovalOperator``'s: the approving option lets the downstream task run; "Reject"
skips it (nothing touched); no answer within ``response_timeout`` fails this task, so the acting task never runs.
The acting task does not trust this task's state either way: it reads the answer back from Airflow's record and
accepts only the stored plan's ``approve_option`` (``repair.approval.confirm``).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from airflow.providers.common.compat.sdk import SkipMixin
from airflow.providers.standard.operators.hitl import HITLOperator

from fleet_doctor.repair.approval import APPROVE

REJECT = "Reject"


def _pulled(task_id: str, key: str) -> str:
    return f"{{{{ ti.xcom_pull(task_ids='{task_id}')['{key}'] }}}}"


class PlanApprovalOperator(HITLOperator, SkipMixin):
    """Ask a human to approve a plan: ``subject``, ``body`` (Markdown) and the approving option are the values
    under those keys of ``plan_task``'s XCom; the options are ``[<approving option>, "Reject"]``, one button each."""

    inherits_from_skipmixin = True
    template_fields: Collection[str] = ("subject", "body", "options")

    def __init__(
        self, *, plan_task: str = "plan", subject_key: str, body_key: str, option_key: str, **kwargs: Any
    ) -> None:
        for fixed in ("subject", "body", "options", "multiple", "defaults"):
            if fixed in kwargs:
                raise ValueError(f"PlanApprovalOperator takes {fixed!r} from the plan task's XCom, not as an argument")
        super().__init__(
            subject=_pulled(plan_task, subject_key),
            body=_pulled(plan_task, body_key),
            options=[_pulled(plan_task, option_key), REJECT],
            multiple=False,
            **kwargs,
        )

    def _check_options(self) -> str:
        """The rendered approving option (the first): it must say Approve and differ from Reject."""
        approve = str(self.options[0]) if self.options else ""
        if len(self.options) != 2 or not approve.startswith(APPROVE) or approve == REJECT or self.options[1] != REJECT:
            raise ValueError(f"the plan task's XCom gave no approving option: options {self.options!r}")
        return approve

    def execute(self, context: Any) -> Any:
        self._check_options()
        return super().execute(context)

    def execute_complete(self, context: Any, event: dict[str, Any]) -> Any:
        approve = self._check_options()
        ret = super().execute_complete(context=context, event=event)  # a timeout raises HITLTimeoutError here
        chosen = ret["chosen_options"][0]
        self.hitl_summary_extra["approved"] = chosen == approve
        if chosen == approve:
            self.log.info("Approved (%s): the acting task checks the answer again and goes on", chosen)
            return ret
        self.log.info("Answered %r: skipping %s, nothing is touched", chosen, sorted(self.downstream_task_ids))
        tasks = [t for t in context["task"].get_direct_relatives(upstream=False) if not t.is_teardown]
        if tasks:
            self.skip(ti=context["ti"], tasks=tasks)
        return ret
