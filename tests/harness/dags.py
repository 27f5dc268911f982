"""The repository's DAGs as Airflow parses them (one ``DagBag`` per test session), for a fleet of two clusters
(``FLEET``: a ZooKeeper one and a KRaft one): what the tests check the forms, the DAG ids and the task graphs against,
instead of reading the DAG files' source."""

from __future__ import annotations

import functools
import os
import tempfile
from pathlib import Path
from typing import Any

from harness import inventories
from harness.corpus import REPO

ZK_CLUSTER, KRAFT_CLUSTER = "prod-eu", "kraft-1"
FLEET = (inventories.inventory(ZK_CLUSTER, brokers=3), inventories.inventory(KRAFT_CLUSTER, brokers=3, kraft=True))


def parse(folder: Path, inventory: Path, **env: str) -> Any:
    """A ``DagBag`` of ``folder`` parsed with ``FLEET_DOCTOR_INVENTORY`` = ``inventory`` (and ``env``), this
    process's environment as it was afterwards."""
    os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="fleet-doctor-airflow-home-"))
    from airflow.dag_processing.dagbag import DagBag

    saved = dict(os.environ)
    os.environ.update(FLEET_DOCTOR_INVENTORY=str(inventory), **env)
    try:
        return DagBag(dag_folder=str(folder))
    finally:
        os.environ.clear()
        os.environ.update(saved)


@functools.cache
def dag_bag() -> Any:
    fleet = inventories.fleet_dir(Path(tempfile.mkdtemp(prefix="fleet-doctor-fleet-")), *FLEET)
    bag = parse(REPO / "dags", fleet)
    assert bag.import_errors == {}, bag.import_errors
    return bag


def dag(dag_id: str) -> Any:
    return dag_bag().dags[dag_id]


def form(dag_id: str) -> dict[str, Any]:
    """A DAG's params and their defaults, as its trigger form shows them."""
    params = dag(dag_id).params
    return {name: params[name] for name in params}
