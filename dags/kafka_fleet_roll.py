"""The roll DAGs (a rolling restart, manual and human-approved), one per cluster of the fleet:
``kafka_fleet_roll__<cluster>``.

An Airflow DAG file: the DAG and its runbook are ``fleet_doctor/dags/roll.py`` (docs/fleet.md)."""

from fleet_doctor.dags import every_cluster

globals().update(every_cluster(("roll",)))
