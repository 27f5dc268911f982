"""The test harness: the corpus and probe runner, the Kafka reference encoders, fleets built from the corpus, a
live Airflow stack, an S3 server. Tests import it; the product never does (tests/test_layout.py)."""
