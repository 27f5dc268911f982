"""Shared fixtures: the real-data corpus and an in-process probe runner."""

from __future__ import annotations

import io
import json
import os
import shutil
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleet_doctor.probe import Probe

REPO = Path(__file__).resolve().parents[1]
CORPUS = Path(os.environ.get("FLEET_DOCTOR_CORPUS", REPO.parent / "shared" / "kafka-real-data"))


@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """An S3 server on 127.0.0.1 (moto) with a bucket, for the s3a:// data store; stopped by PID at the end."""
    from s3_server import S3Server

    with S3Server(tmp_path_factory.mktemp("s3")) as server:
        yield server


@pytest.fixture(scope="session")
def corpus() -> Path:
    if not (CORPUS / "MANIFEST.md").is_file():
        pytest.fail(
            f"real-data corpus not found at {CORPUS}: clone the repo next to shared/ or set FLEET_DOCTOR_CORPUS"
        )
    return CORPUS


def run_probe(*paths: os.PathLike | str, deep: bool = False, verify_crc: bool = False) -> list[dict[str, Any]]:
    """Run the probe in-process and return its records (every line must be valid JSON)."""
    out = io.StringIO()
    Probe(out, deep=deep, verify_crc=verify_crc).run([str(p) for p in paths])
    return [json.loads(line) for line in out.getvalue().splitlines()]


def by_kind(records: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [r for r in records if r["kind"] == kind]


def partition(records: list[dict[str, Any]], dirname: str) -> dict[str, Any]:
    found = [r for r in records if r["kind"] == "partition" and r["dir"] == dirname]
    assert len(found) == 1, f"expected one partition record for {dirname}, got {len(found)}"
    return found[0]


def segments(records: list[dict[str, Any]], dirname: str) -> list[dict[str, Any]]:
    return sorted(
        (r for r in records if r["kind"] == "segment" and Path(r["path"]).name == dirname),
        key=lambda r: r["base_offset"],
    )


def copy_writable(src: Path, dst: Path) -> Path:
    """Copy a (read-only) corpus directory to dst and make the copy writable for mutation."""
    shutil.copytree(src, dst, symlinks=True)
    for root, dirs, files in os.walk(dst):
        for name in dirs + files:
            p = os.path.join(root, name)
            if not os.path.islink(p):
                os.chmod(p, os.stat(p).st_mode | stat.S_IWUSR | stat.S_IRUSR | (stat.S_IXUSR if name in dirs else 0))
    os.chmod(dst, os.stat(dst).st_mode | stat.S_IWUSR)
    return dst


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
    "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1",
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
