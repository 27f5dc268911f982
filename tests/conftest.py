"""Shared fixtures: the real-data corpus and an in-process probe runner."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleet_doctor.spark import JAVA_OPTIONS, SHORT_RUN_CONF
from harness.corpus import CORPUS


@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """An S3 server on 127.0.0.1 (moto) with a bucket, for the s3a:// data store; stopped by PID at the end."""
    from harness.s3_server import S3Server

    with S3Server(tmp_path_factory.mktemp("s3")) as server:
        yield server


@pytest.fixture(scope="session")
def corpus() -> Path:
    if not (CORPUS / "MANIFEST.md").is_file():
        pytest.fail(
            f"real-data corpus not found at {CORPUS}: clone the repo next to shared/ or set FLEET_DOCTOR_CORPUS"
        )
    return CORPUS


# Spark settings for in-process detection tests: small local runs, loopback only, no UI, and no
# per-call Python call-site capture (pyspark's DataFrame debugging costs several JVM round trips for
# every DataFrame and Column call).
SPARK_TEST_CONF = {
    "spark.sql.shuffle.partitions": "4",
    "spark.default.parallelism": "2",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.python.sql.dataFrameDebugging.enabled": "false",
    "spark.sql.session.timeZone": "UTC",
    # a short-lived test JVM: the C1 compiler alone warms up much faster than tiered C2
    "spark.driver.extraJavaOptions": SHORT_RUN_CONF[JAVA_OPTIONS],
}


@pytest.fixture(scope="session")
def spark():
    """One local[2] SparkSession for every Spark test, created on first use (tests that never ask
    for it do not pay the JVM start-up) and stopped at the end of the session."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.master("local[2]").appName("fleet-doctor-tests")
    for key, value in SPARK_TEST_CONF.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
