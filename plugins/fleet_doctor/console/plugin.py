"""The Kafka fleet view in Airflow's UI, as an Airflow plugin: a nav entry "Kafka fleet" that shows the fleet overview
and each cluster's published audit (``fleet_doctor.console``, served by a FastAPI app at ``/kafka-fleet`` in the
api-server) inside Airflow, each cluster's repair DAG's pre-filled trigger page, and the fleet's metrics
(``docs/console.md``). Loaded through ``plugins/kafka_fleet_plugin.py`` (a plugins folder) or the wheel's
``airflow.plugins`` entry point (docs/install.md).

Airflow does not authenticate a plugin's FastAPI app: its routes use Airflow's own authorization (the logged-in user
must be allowed to read the cluster's audit DAG; the repair page, its repair DAG; the overview and the metrics show
the clusters whose audit DAG the user may read)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_dag
from airflow.plugins_manager import AirflowPlugin
from fastapi import Depends, Request

from fleet_doctor.airflow_links import (
    PREFIX,
    REPAIR_DAG,
    RESTORE_DAG,
    SEPARATOR,
    audit_dag,
    cluster_of,
    repair_dag,
)
from fleet_doctor.console.app import create_app


def may_get(dag_of: Callable[[str], str]) -> Callable[[Request, Any], None]:
    """A route dependency: 403 unless the user may read the DAG ``dag_of(<the path's cluster>)``."""

    def check(request: Request, user: GetUserDep) -> None:
        dag_id = dag_of(str(request.path_params.get("cluster", "")))
        requires_access_dag("GET", param_dag_id=dag_id)(request, user)  # Airflow's own check, for this DAG

    return check


def readable(user: GetUserDep) -> Callable[[str], bool]:
    """Which DAGs the user may read (one query for the whole overview)."""
    allowed = get_auth_manager().get_authorized_dag_ids(user=user, method="GET")
    return lambda dag_id: dag_id in allowed


def pending_approvals() -> dict[str, int]:
    """Per cluster, the approvals of its repair and restore DAGs waiting for a person: Airflow's human-in-the-loop
    requests without a response whose task still waits for one (one query)."""
    from airflow.models.hitl import HITLDetail
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from airflow.utils.state import TaskInstanceState
    from sqlalchemy import func, or_, select

    waiting = (TaskInstanceState.DEFERRED, TaskInstanceState.AWAITING_INPUT)
    query = (
        select(TaskInstance.dag_id, func.count())
        .join(HITLDetail, HITLDetail.ti_id == TaskInstance.id)
        .where(HITLDetail.responded_at.is_(None), TaskInstance.state.in_(waiting))
        .where(
            or_(
                *(
                    TaskInstance.dag_id.startswith(f"{kind}{SEPARATOR}", autoescape=True)
                    for kind in (REPAIR_DAG, RESTORE_DAG)
                )
            )
        )
        .group_by(TaskInstance.dag_id)
    )
    out: dict[str, int] = {}
    with create_session() as session:
        for dag_id, n in session.execute(query):
            named = cluster_of(dag_id)
            if named:
                out[named[1]] = out.get(named[1], 0) + int(n)
    return out


app = create_app(
    read=[Depends(may_get(audit_dag))],
    repair=[Depends(may_get(repair_dag))],
    readable=readable,
    pending_approvals=pending_approvals,
)


class KafkaFleetPlugin(AirflowPlugin):
    name = "kafka_fleet"
    fastapi_apps: ClassVar[list[dict[str, Any]]] = [{"app": app, "url_prefix": f"/{PREFIX}", "name": "Kafka fleet"}]
    # an external view with a url_route opens in-app (/plugin/kafka-fleet), in an iframe on href; href is relative
    # to Airflow's base URL, so it also works behind a path prefix
    external_views: ClassVar[list[dict[str, Any]]] = [
        {
            "name": "Kafka fleet",
            "href": f"{PREFIX}/",
            "url_route": PREFIX,
            "destination": "nav",
            "nav_top_level": True,
        }
    ]
