"""The restore DAGs (a repair's backups put back), one per cluster of the fleet: ``kafka_fleet_restore__<cluster>``.

An Airflow DAG file: the DAG and its runbook are ``fleet_doctor/dags/restore.py`` (docs/fleet.md)."""

from fleet_doctor.dags import every_cluster

globals().update(every_cluster(("restore",)))
