"""The Kafka fleet view in Airflow's UI, for Airflow's plugins folder: the plugin is ``fleet_doctor.console.plugin``
(an installed wheel registers the same class through the ``airflow.plugins`` entry point instead: docs/install.md).

Airflow's plugin loader imports every top-level ``.py`` file in the plugins folder; the library itself
(``fleet_doctor/``) is excluded by ``.airflowignore`` and imported as a package."""

from fleet_doctor.console.plugin import KafkaFleetPlugin

__all__ = ["KafkaFleetPlugin"]
