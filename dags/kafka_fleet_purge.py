"""The purge DAGs (a repair's quarantine deleted, after its own approval), one per cluster of the fleet:
``kafka_fleet_purge__<cluster>``.

An Airflow DAG file: the DAG and its runbook are ``fleet_doctor/dags/purge.py`` (docs/fleet.md)."""

from fleet_doctor.dags import every_cluster

globals().update(every_cluster(("purge",)))
