"""Kafka Fleet Doctor: audit and repair of Kafka broker log directories.

Library modules stay import-safe (no side effects, no heavy imports at module top): Airflow's
scheduler, dag-processor and api-server import them.
"""

__version__ = "0.1.0"
