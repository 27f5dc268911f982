"""Fleet Doctor's DAGs, one set per cluster of ``FLEET_DOCTOR_INVENTORY`` (docs/fleet.md): ``audit.py`` (the nightly
audit), ``repair.py`` (the human-approved repair), ``restore.py`` (a repair's backups put back), ``purge.py`` (a
repair's quarantine deleted), ``roll.py`` (a rolling restart, human-approved), each read like a runbook in its
docstring. The repository's DAG files (``dags/``) make them; so does the one line an installed wheel needs in a DAG
folder (docs/install.md)::

    from fleet_doctor.dags import *  # noqa: F403  Kafka Fleet Doctor: every cluster's Airflow DAGs

Each star import makes every cluster's DAGs afresh (this module's ``__getattr__``: Python asks it for ``__all__``,
then for each name), so a DAG file parsed again in one process, as Airflow's tools and the tests do, gets them again,
and a cluster added or removed shows up at the next parse. The comment keeps the words Airflow's parser looks for in
a DAG file ("airflow", "dag").
"""

from __future__ import annotations

from typing import Any

KINDS = ("audit", "repair", "restore", "purge", "roll")
_made: dict[str, Any] = {}  # the DAGs of the star import under way, by id


def every_cluster(kinds: tuple[str, ...] = KINDS) -> dict[str, Any]:
    """Every cluster's DAGs of ``kinds``, by DAG id, made now from the settings in this process's environment."""
    import importlib

    from fleet_doctor.fleet_dags import fleet_clusters
    from fleet_doctor.settings import Settings

    parsed = Settings.from_env()  # what shapes the DAGs; every task resolves its own settings, for its cluster
    clusters = fleet_clusters(parsed).clusters
    out: dict[str, Any] = {}
    for kind in kinds:
        out.update(importlib.import_module(f"fleet_doctor.dags.{kind}").every_cluster(parsed, clusters))
    return out


def __getattr__(name: str) -> Any:
    if name == "__all__":
        _made.clear()
        _made.update(every_cluster())
        return sorted(_made)
    if name in _made:
        return _made[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
