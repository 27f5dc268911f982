"""The repair DAGs (manual, human-approved), one per cluster of the fleet: ``kafka_fleet_repair__<cluster>``.

An Airflow DAG file: the DAG and its runbook are ``fleet_doctor/dags/repair.py`` (docs/fleet.md)."""

from fleet_doctor.dags import every_cluster

globals().update(every_cluster(("repair",)))
