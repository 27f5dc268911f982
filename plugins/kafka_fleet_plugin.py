"""The Kafka fleet view in Airflow's UI: a nav entry "Kafka fleet" that shows the published audit of the fleet
(``fleet_doctor.console``, served by a FastAPI app at ``/kafka-fleet`` in the api-server) inside Airflow, and the
repair DAG's pre-filled trigger page (``docs/console.md``).

Airflow's plugin loader imports every top-level ``.py`` file in the plugins folder; the library itself
(``fleet_doctor/``) is excluded by ``.airflowignore`` and imported as a package. Airflow does not authenticate a
plugin's FastAPI app: its routes use Airflow's own authorization dependencies (the logged-in user must be allowed to
read the audit DAG; the repair page, the repair DAG)."""

from __future__ import annotations

from typing import Any, ClassVar

from airflow.api_fastapi.core_api.security import requires_access_dag
from airflow.plugins_manager import AirflowPlugin
from fastapi import Depends

from fleet_doctor.airflow_links import AUDIT_DAG, PREFIX, REPAIR_DAG
from fleet_doctor.console.app import create_app

app = create_app(
    read=[Depends(requires_access_dag("GET", param_dag_id=AUDIT_DAG))],
    repair=[Depends(requires_access_dag("GET", param_dag_id=REPAIR_DAG))],
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
