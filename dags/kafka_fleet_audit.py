"""The nightly audit DAGs, one per cluster of the fleet: ``kafka_fleet_audit__<cluster>``.

An Airflow DAG file: the DAG and its runbook are ``fleet_doctor/dags/audit.py`` (docs/fleet.md)."""

from fleet_doctor.dags import every_cluster

globals().update(every_cluster(("audit",)))
