"""The repository's DAGs as Airflow parses them (one ``DagBag`` per test session): what the tests check the forms,
the DAG ids and the task graphs against, instead of reading the DAG files' source."""

from __future__ import annotations

import functools
import os
import tempfile
from typing import Any

from harness.corpus import REPO


@functools.cache
def dag_bag() -> Any:
    os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="fleet-doctor-airflow-home-"))
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(REPO / "dags"))
    assert bag.import_errors == {}, bag.import_errors
    return bag


def dag(dag_id: str) -> Any:
    return dag_bag().dags[dag_id]


def form(dag_id: str) -> dict[str, Any]:
    """A DAG's params and their defaults, as its trigger form shows them."""
    params = dag(dag_id).params
    return {name: params[name] for name in params}
