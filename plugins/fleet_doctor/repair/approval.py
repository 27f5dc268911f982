"""The human approval of a repair plan, checked again by the task that acts on it.

The ``approve`` task (``repair.hitl.PlanApprovalOperator``) only asks; the ``execute`` and ``restore_topic_ids`` tasks
(and the restore DAG's) do not take its success as the answer, since an approve task marked "success" by hand, or
cleared and skipped, would otherwise stand for a human who never answered. Each reads Airflow's own record of the
answer (the task's human-in-the-loop detail in this run) and goes on only when it is the plan's own approving option
(``approval_text.repair_option``, e.g. "Approve: restart 3 brokers, change 14 files (plan 1f2e3d4c5b6a)", derived
from the stored plan, never from the request; ``repair.hitl.PlanApprovalOperator`` offers it beside "Reject"), given by
a user (not a timeout default), an allowed approver when ``FLEET_DOCTOR_APPROVERS`` is set, not the user who
triggered the run when that list is set (four eyes; ``FLEET_DOCTOR_ALLOW_SELF_APPROVAL`` lifts this), and to a request
whose text carries the hash of the plan about to run and whose subject and text are exactly the stored plan's (the
request is rendered from the plan task's XCom, which the REST API can write: a subject without its "DRY RUN" is
refused). The record (who, when, which plan) goes into the journal.

Where the record is read: Airflow's REST API (``GET .../taskInstances/{task}/-1/hitlDetails``), as a user named by
the Airflow connection ``FLEET_DOCTOR_AIRFLOW_API_CONN`` (default ``fleet_doctor_airflow_api``: host = the
api-server's URL, login/password = a user allowed to read the DAG, e.g. a viewer). Not through the execution API a
task talks to: on Airflow 3.3 its ``hitlDetails`` routes serve a task instance's own detail only (the token's
subject must be that task instance), and a worker's supervisor does not forward the task SDK's
``GetHITLDetailResponse``. Not from XCom either: the REST API can write XCom entries, so an XCom proves nothing.

Nothing here imports Airflow at module level (the DAG file imports this module at parse time).
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

from fleet_doctor.repair.approval_text import Request, hashes_in
from fleet_doctor.repair.errors import ApprovalError
from fleet_doctor.settings import Settings

LOG = logging.getLogger(__name__)
APPROVE = "Approve"  # every approving option starts with it (the live tests' LiveAirflow.approve picks it so)
HTTP_TIMEOUT_S = 30.0


def hitl_users(settings: Settings) -> list[dict[str, str]] | None:
    """``FLEET_DOCTOR_APPROVERS`` as the HITL users ``ApprovalOperator(assigned_users=...)`` takes (each entry is
    the auth manager's user id; the simple auth manager's id is the user name). None: any user with access."""
    return [{"id": u, "name": u} for u in settings.approvers] or None


def check(
    detail: Mapping[str, Any] | None,
    *,
    task_id: str,
    plan_hash: str,
    settings: Settings,
    triggered_by: str | None,
    option: str,
    body: str | None = None,
    subject: str | None = None,
) -> dict[str, Any]:
    """The journal record of a valid approval, from Airflow's HITL detail of ``task_id`` in this run (as the REST
    API returns it; None: Airflow has none); raises ``ApprovalError`` otherwise. ``option``: the answer that
    approves this plan, from the stored plan (``approval_text.repair_option``): the only one accepted. ``body``: the
    approval text as the stored plan renders it; the text the human saw must be exactly that (XCom, which the request
    was rendered from, can be written through the REST API: a tidied table over the right hash is refused).
    ``subject``: the request's headline as the stored plan renders it (``approval_text``: it says "DRY RUN"); the
    detail's ``subject`` must be exactly it (the template ``{{ ... ['subject'] }}`` renders the XCom value as is)."""
    where = f"the approval task {task_id!r} of this run"
    if not detail:
        raise ApprovalError(
            f"no approval on record: Airflow holds no human-in-the-loop request for {where} (marked success by hand, "
            "or cleared?); nothing was touched. Trigger the DAG again and answer in Browse → Required Actions"
        )
    chosen = detail.get("chosen_options")
    if not detail.get("response_received") or not chosen:
        raise ApprovalError(
            f"no answer on record for {where}: its request is still open, so the task cannot have been approved "
            "(marked success by hand?); nothing was touched"
        )
    if list(chosen) != [option]:
        raise ApprovalError(f"{where} was answered {chosen}, not [{option!r}]; nothing was touched")
    by = detail.get("responded_by_user") or {}
    if not by.get("id"):
        raise ApprovalError(
            f"the answer to {where} was not given by a user (a timeout default or the task itself wrote it); "
            "nothing was touched"
        )
    who = f"user {by['id']!r}"
    allowed = set(settings.approvers)
    if allowed and by["id"] not in allowed:
        raise ApprovalError(
            f"{who} approved {where} but is not one of FLEET_DOCTOR_APPROVERS ({', '.join(sorted(allowed))}); "
            "nothing was touched"
        )
    if allowed and not settings.allow_self_approval and not triggered_by:
        raise ApprovalError(
            "Airflow does not say who triggered this run, so four eyes cannot be checked (FLEET_DOCTOR_APPROVERS is "
            "set); trigger it as a user, or set FLEET_DOCTOR_ALLOW_SELF_APPROVAL=true; nothing was touched"
        )
    if allowed and not settings.allow_self_approval and triggered_by in (by["id"], by.get("name")):
        raise ApprovalError(
            f"{who} triggered this run and approved it: with FLEET_DOCTOR_APPROVERS set, another approver must "
            "(four eyes; FLEET_DOCTOR_ALLOW_SELF_APPROVAL=true allows it); nothing was touched"
        )
    shown = hashes_in(detail.get("body") or "")
    if shown != [plan_hash]:
        raise ApprovalError(
            f"{where} approved plan {', '.join(h[:12] for h in shown) or '(none named)'}, not the plan about to run "
            f"({plan_hash[:12]}); nothing was touched"
        )
    if body is not None and (detail.get("body") or "").strip() != body.strip():
        raise ApprovalError(
            f"the text {where} showed is not the stored plan's (the plan task's XCom was changed?): the approver did "
            "not see this plan; nothing was touched"
        )
    if subject is not None and detail.get("subject") != subject:
        raise ApprovalError(
            f"the subject {where} showed ({detail.get('subject')!r}) is not the stored plan's ({subject!r}; the plan "
            "task's XCom was changed?): the approver did not see this plan; nothing was touched"
        )
    return {
        "task": task_id,
        "option": option,
        "by": {"id": str(by["id"]), "name": str(by.get("name") or by["id"])},
        "at": detail.get("responded_at"),
        "plan_hash": plan_hash,
        "triggered_by": triggered_by,
    }


def confirm(
    context: Mapping[str, Any], task_id: str, plan_hash: str, settings: Settings, asked: Request
) -> dict[str, Any]:
    """Check, from Airflow's record, that ``task_id`` of the running DAG run (``context``: the running task's
    Airflow context) holds a valid human approval of ``plan_hash``, answered with the request's option and shown its
    subject and body (``asked``: as the stored plan renders them, ``repair.approval_text``); returns the journal
    record ``{"task", "option", "by": {"id", "name"}, "at", "plan_hash", "triggered_by"}``, raises
    ``ApprovalError``."""
    dag_run = context["dag_run"]
    triggered_by = getattr(dag_run, "triggering_user_name", None)
    detail = read_hitl_detail(settings, dag_run.dag_id, dag_run.run_id, task_id)
    record = check(
        detail,
        task_id=task_id,
        plan_hash=plan_hash,
        settings=settings,
        triggered_by=triggered_by,
        option=asked.option,
        body=asked.body,
        subject=asked.subject,
    )
    LOG.info("approval on record: %s", json.dumps(record))
    return record


# ---- Airflow's REST API
def _connection(conn_id: str) -> Any:
    from airflow.sdk import Connection

    try:
        return Connection.get(conn_id)
    except Exception as e:  # AirflowNotFoundException and the task SDK's runtime errors alike
        raise ApprovalError(
            f"cannot read the approval: no Airflow connection {conn_id!r} ({e}). It names the api-server (host: its "
            "URL) and a user allowed to read this DAG (login, password); FLEET_DOCTOR_AIRFLOW_API_CONN names it"
        ) from e


def api_base(conn: Any) -> str:
    """The api-server's URL from the connection (host as a URL, or host, port and http/https as schema), else
    Airflow's ``[api] base_url``."""
    host = (conn.host or "").rstrip("/")
    if "://" in host:
        return host
    if host:
        scheme = conn.schema if conn.schema in ("http", "https") else "http"
        return f"{scheme}://{host}" + (f":{conn.port}" if conn.port else "")
    from airflow.configuration import conf

    return str(conf.get("api", "base_url")).rstrip("/")


LOOPBACK = frozenset({"127.0.0.1", "::1", "localhost"})


def approvals_base(settings: Settings, conn: Any) -> str:
    """Where approvals are read: the deployment's ``FLEET_DOCTOR_APPROVALS_URL`` (configuration the UI cannot edit),
    else the connection's (``api_base``). ApprovalError unless it is https, or http on loopback: the user's password
    and token go there, and a forged answer from it would stand for a human."""
    base = settings.approvals_url or api_base(conn)
    parts = urllib.parse.urlsplit(base)
    if parts.scheme != "https" and not (parts.scheme == "http" and parts.hostname in LOOPBACK):
        raise ApprovalError(
            f"cannot read the approval from {base}: not https (only loopback may use http); set "
            "FLEET_DOCTOR_APPROVALS_URL to the api-server's https URL (and FLEET_DOCTOR_APPROVALS_CA to its CA)"
        )
    return base


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is an error: urllib would send the Authorization header (the token) on to wherever it points."""

    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> None:
        raise urllib.error.HTTPError(req.full_url, code, f"redirected to {newurl}: not followed", headers, fp)


def _opener(ca: str = "") -> urllib.request.OpenerDirector:
    import ssl

    context = ssl.create_default_context(cafile=ca or None)
    return urllib.request.build_opener(_NoRedirect(), urllib.request.HTTPSHandler(context=context))


def _call(method: str, url: str, body: Any = None, token: str | None = None, ca: str = "") -> tuple[int, Any]:
    req = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode(), method=method)
    req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with _opener(ca).open(req, timeout=HTTP_TIMEOUT_S) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        if 300 <= e.code < 400:
            raise ApprovalError(f"cannot read the approval: {method} {url} answered a redirect ({e.msg})") from e
        return e.code, e.read().decode(errors="replace")[:300]
    except (OSError, ValueError) as e:
        raise ApprovalError(f"cannot read the approval: {method} {url} failed ({e})") from e


def read_hitl_detail(settings: Settings, dag_id: str, run_id: str, task_id: str) -> dict[str, Any] | None:
    """Airflow's HITL detail of ``task_id`` (unmapped) in the run, as its REST API returns it; None when it has
    none (404)."""
    conn = _connection(settings.airflow_api_conn)
    base = approvals_base(settings, conn)
    ca = settings.approvals_ca
    status, got = _call("POST", f"{base}/auth/token", {"username": conn.login, "password": conn.password}, ca=ca)
    if status not in (200, 201) or not isinstance(got, dict) or "access_token" not in got:
        raise ApprovalError(
            f"cannot read the approval: {base}/auth/token refused the user {conn.login!r} of the connection "
            f"{settings.airflow_api_conn!r} (HTTP {status}: {got})"
        )
    q = urllib.parse.quote
    run = f"{base}/api/v2/dags/{q(dag_id, safe='')}/dagRuns/{q(run_id, safe='')}"
    url = f"{run}/taskInstances/{q(task_id, safe='')}/-1/hitlDetails"
    status, detail = _call("GET", url, token=got["access_token"], ca=ca)
    if status == 404:
        return None
    if status != 200 or not isinstance(detail, dict):
        raise ApprovalError(f"cannot read the approval: GET {url} -> HTTP {status}: {detail}")
    return detail
