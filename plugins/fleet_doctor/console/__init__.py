"""The Kafka fleet view in the Airflow UI: the published audit (the store's history and reports) read and rendered
as one page per deployment, and a pre-filled trigger page for the repair DAG (``docs/console.md``).
``plugins/kafka_fleet_plugin.py`` mounts ``app.create_app`` in Airflow's api-server with Airflow's own auth."""
