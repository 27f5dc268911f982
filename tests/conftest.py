"""Shared fixtures (the real-data corpus, one SparkSession, an S3 server) and the tiers of the suite.

The tiers (README, "Tests"): a test is **live** when it starts a server process (sshd, ZooKeeper, Spark, Airflow,
Chromium, Docker, an S3 server), through a fixture that starts one (``LIVE_FIXTURES``), by its module
(``LIVE_MODULES``), or marked ``@pytest.mark.live``; every other test is a **unit** test. ``bin/dev test --unit`` runs
the unit tier (``-m "not live"``); ``bin/dev test`` runs both. A unit test that starts such a process fails: the
guard below refuses it, naming the process, so a test that needs one must say so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleet_doctor import spark as fd_spark
from fleet_doctor.spark import JAVA_OPTIONS, SHORT_RUN_CONF, SMALL_INPUT_CONF
from harness.corpus import CORPUS

# The suite's Spark drivers run without the class-data sharing archive (fleet_doctor.spark.class_archive), unless the
# environment says otherwise: only ~4 of its JVMs would map it (the session's detection service, the workers' warm
# drivers; the in-process SparkSessions never do), ~3 s of CPU each, while dumping it costs ~27 s on setup's path
# (bin/dev test no longer dumps it; measured). The archive's own tests (tests/test_spark_fast_start.py) turn it on in
# a cache dir of their own, dump one and map it, with spark-submit and with a warm driver; workers started with a bare
# environment get the setting too (harness.detect_service.bare_env).
os.environ.setdefault(fd_spark.CLASS_ARCHIVE_ENV, "off")


@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """An S3 server on 127.0.0.1 (moto) with a bucket, for the s3a:// data store; stopped by PID at the end."""
    from harness.s3_server import S3Server

    with S3Server(tmp_path_factory.mktemp("s3")) as server:
        yield server


@pytest.fixture(scope="session")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The session's audited lab snapshots and live Airflow (harness.shared), made on first use, stopped at the end."""
    from harness.shared import SharedLabs

    labs = SharedLabs(tmp_path_factory.mktemp("shared"))
    SHARED_LABS.append(labs)
    try:
        yield labs
    finally:
        SHARED_LABS.remove(labs)
        labs.close()


SHARED_LABS: list[Any] = []  # the session's SharedLabs, once made (pytest_runtest_teardown stops its live Airflow)


@pytest.fixture(scope="session", autouse=True)
def warm_detection() -> Iterator[fd_spark.WarmPool]:
    """The detections this test process runs (a snapshot's audit, a repair's re-verify and post-verifies, a scan in
    process) are served by the session's detection service (``pytest_configure``) where it runs their settings,
    else by warm drivers (``fleet_doctor.spark.warm_drivers``, as a repair's execute task serves its own): the
    detection app, through spark-submit, started once per setting instead of once per detection. A driver starts
    with the first detection that needs it; a test marked ``spark_submit`` (one about spark-submit itself) gets a
    spark-submit of its own."""
    with fd_spark.warm_drivers() as pool:
        yield pool


def own_spark_submit(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process's detections go through a spark-submit of their own: no warm driver, no detection service."""
    monkeypatch.setattr(fd_spark, "_WARM_POOLS", [])
    monkeypatch.delenv(fd_spark.DETECT_SERVICE_ENV, raising=False)


@pytest.fixture(autouse=True)
def spark_submit_itself(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if request.node.get_closest_marker("spark_submit"):
        own_spark_submit(monkeypatch)


@pytest.fixture(scope="session")
def corpus() -> Path:
    if not (CORPUS / "MANIFEST.md").is_file():
        pytest.fail(
            f"real-data corpus not found at {CORPUS}: clone the repo next to shared/ or set FLEET_DOCTOR_CORPUS"
        )
    return CORPUS


# Spark settings for in-process detection tests: small local runs, loopback only, no UI, and no
# per-call Python call-site capture (pyspark's DataFrame debugging costs several JVM round trips for
# every DataFrame and Column call). Every test input is a small one, so the plans run as the product runs a small
# input (SMALL_INPUT_CONF's SQL settings: interpreted, no adaptive re-planning, one shuffle partition);
# tests/test_detection.py checks once that the compiled, adaptive plans a big input takes give the same findings.
SMALL_INPUT_SQL_CONF = {k: v for k, v in SMALL_INPUT_CONF.items() if k.startswith("spark.sql.")}
SPARK_TEST_CONF = {
    **SMALL_INPUT_SQL_CONF,
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


# ---- the tiers
LIVE_FIXTURES = {
    "shared",  # the session's audited labs and live Airflow
    "spark",  # a SparkSession (a JVM)
    "s3",  # an S3 server (moto)
    "lab",  # a fleet lab: ZooKeeper, sshd, lab brokers
    "live",  # a live Airflow
    "server",  # a ZooKeeper server
    "zk_server",
    "aryan_staged",  # the detection app run through spark-submit
    "aryan_scan",
}
LIVE_MODULES = {
    "test_approval_live",
    "test_audit_e2e",
    "test_audit_s3",
    "test_deploy",
    "test_detection",
    "test_docker_deploy",
    "test_fakes_contract",
    "test_fault_matrix",
    "test_kraft_e2e",
    "test_kraft_fault_matrix",
    "test_kraft_repair",
    "test_lab",
    "test_lab_detection",
    "test_lab_kraft",
    "test_repair",
    "test_repair_live",
    "test_repair_live_seed000",
    "test_repair_progress",
    "test_repair_safety",
    "test_roll_live",
    "test_scan_cli",
    "test_ui_browser",
}
# the modules that use the session's live Airflow: one worker runs them all, so that it starts once (the modules
# that restore the shared labs without it are groups of their own: a worker makes the snapshots it needs)
AIRFLOW_MODULES = {
    "test_approval_live",
    "test_console",
    "test_repair_live",
    "test_repair_live_seed000",
    "test_kraft_repair",
    "test_roll_live",
}
AIRFLOW_GROUP = "live-airflow"
# about how long each group takes, in seconds (a full `bin/dev test` on 2 CPUs and three workers, from each group's
# first test's start to its last test's end, fixtures included; 2026-11-30, 1260 s): only the order in which the
# workers take the groups comes from it, the longest first, so that the workers end together (a group not listed
# counts GROUP_SECONDS_PER_TEST a test). tests/test_tiers.py checks that every group named here still exists.
GROUP_SECONDS = {
    AIRFLOW_GROUP: 865,
    "test_fault_matrix": 342,
    "test_ui_browser": 285,
    "test_kraft_fault_matrix": 268,
    "test_spark_fast_start": 200,
    "test_kraft_detection": 185,
    "test_audit_e2e": 173,
    "test_repair_safety": 128,
    "test_kraft_e2e": 113,
    "test_audit_s3": 108,
    "test_kraft_audit": 98,
    "test_docker_deploy": 96,
    "test_wheel": 87,
    "test_detection": 86,
    "test_repair": 62,
    "test_lab": 59,
    "test_deploy": 56,
    "test_kraft_gates": 46,
    "test_roll_fault": 39,
    "test_fakes_contract": 37,
    "test_repair_progress": 33,
    "test_lab_kraft": 29,
    "test_lab_roll": 21,
    "test_cluster_metadata": 19,
    "test_lab_detection": 18,
    "test_tiers": 18,
    "test_scan_cli": 15,
}
GROUP_SECONDS_PER_TEST = 0.1
# programs a unit test may not start (a basename, or a module run with -m)
SERVERS = ("sshd", "java", "spark-submit", "airflow", "chromium", "chrome", "docker", "dockerd", "moto_server", "node")
SERVER_MODULES = ("airflow", "fleet_lab.broker", "fleet_lab.cli")


# Three workers (bin/dev test: pytest-xdist, --dist loadgroup): a module's tests stay together on one worker (its
# module fixtures are made once), and every test that uses the session's shared labs and live Airflow runs on the same
# worker (one live Airflow). Each worker takes its own slice of the lab's ports (fleet_lab.zk_server.free_port).
if os.environ.get("PYTEST_XDIST_WORKER", "").startswith("gw"):
    os.environ.setdefault(
        "FLEET_LAB_PORT_SLICE",
        f"{os.environ['PYTEST_XDIST_WORKER'][2:]}/{os.environ.get('PYTEST_XDIST_WORKER_COUNT', '1')}",
    )


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        module = Path(str(item.fspath)).stem
        param = getattr(getattr(item, "callspec", None), "params", {})
        fixtures = set(getattr(item, "fixturenames", ()))
        if module in LIVE_MODULES or LIVE_FIXTURES & fixtures or "s3" in param.values():
            item.add_marker(pytest.mark.live)
        item.add_marker(pytest.mark.xdist_group(AIRFLOW_GROUP if module in AIRFLOW_MODULES else module))
    # the longest groups first (the live Airflow's modules back to back: in one process, FLEET_DOCTOR_TEST_WORKERS=0,
    # it then starts once and stops after the last test of its group), so that the workers take the many short unit
    # modules last and end together: xdist hands out the groups in the order their first test comes (its own
    # reordering, by number of tests, is turned off in pytest_configure: the modules of few long tests, such as the
    # KRaft fault matrix, came last and one worker ran on for over a minute). On two workers this order measured
    # slower (1452 s against 1362-1382 s: each heavy module ran beside the other heavy one); on three, each runs
    # beside two others whatever the order
    items[:] = ordered_by_group_seconds(items)
    if os.environ.get("FLEET_DOCTOR_TEST_ORDER") == "reverse":  # order independence: each module's tests reversed
        by_module: dict[str, list[pytest.Item]] = {}
        for item in items:
            by_module.setdefault(str(item.fspath), []).append(item)
        items[:] = [i for group in by_module.values() for i in reversed(group)]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    """With ``FLEET_DOCTOR_TEST_TIMES`` set to a file: one JSON line per test (worker, group, test, start, end; setup
    and teardown included), appended, so that a full run shows each group's span on its worker (GROUP_SECONDS)."""
    times = os.environ.get("FLEET_DOCTOR_TEST_TIMES")
    start = time.time()
    try:
        return (yield)
    finally:
        if times:
            line = {
                "worker": os.environ.get("PYTEST_XDIST_WORKER", "-"),
                "group": group_of(item),
                "test": item.nodeid,
                "start": round(start, 2),
                "end": round(time.time(), 2),
            }
            with open(times, "a") as out:
                out.write(json.dumps(line) + "\n")


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """The live Airflow stops once the last test of its group has run: the worker's other modules do not need it, and
    its four processes would go on polling for the rest of the session (a test that asks for it again starts it)."""
    if SHARED_LABS and group_of(item) == AIRFLOW_GROUP and (nextitem is None or group_of(nextitem) != AIRFLOW_GROUP):
        SHARED_LABS[-1].stop_airflow()


def ordered_by_group_seconds(items: list[pytest.Item]) -> list[pytest.Item]:
    """``items`` with their groups (``xdist_group``) longest first by ``GROUP_SECONDS`` (a group not listed: its
    number of tests times ``GROUP_SECONDS_PER_TEST``), ties by name; each group's tests in their order."""
    groups: dict[str, list[pytest.Item]] = {}
    for item in items:
        groups.setdefault(group_of(item) or "", []).append(item)

    def seconds(group: str) -> float:
        return GROUP_SECONDS.get(group, len(groups[group]) * GROUP_SECONDS_PER_TEST)

    return [i for g in sorted(groups, key=lambda g: (-seconds(g), g)) for i in groups[g]]


def pytest_configure(config: pytest.Config) -> None:
    # xdist's --dist loadgroup hands the groups out by number of tests unless told not to
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False
    # one detection service for the whole session (harness.detect_service), started by the process that runs it (not
    # by an xdist worker: they inherit it) unless only the unit tier runs, or the environment names one already
    unit_only = (config.option.markexpr or "").strip() == "not live"
    if not hasattr(config, "workerinput") and not unit_only and not os.environ.get(fd_spark.DETECT_SERVICE_ENV):
        from harness.detect_service import SessionService

        service = SessionService()
        SERVICES.append(service)
        os.environ[fd_spark.DETECT_SERVICE_ENV] = str(service.socket)


def pytest_unconfigure(config: pytest.Config) -> None:
    while SERVICES:
        said = SERVICES.pop().stop()
        os.environ.pop(fd_spark.DETECT_SERVICE_ENV, None)
        print(f"\nthe session's detection service: {said}")


SERVICES: list[Any] = []  # the session's detection service, where this process started it


def group_of(item: pytest.Item) -> str | None:
    marker = item.get_closest_marker("xdist_group")
    return str(marker.args[0]) if marker and marker.args else None


def server_started(args: Any) -> str | None:
    """The server program a ``Popen`` of ``args`` would start, else None."""
    argv = [str(a) for a in ([args] if isinstance(args, (str, bytes, os.PathLike)) else args)]
    if not argv:
        return None
    words = argv[0].split() if len(argv) == 1 else argv
    prog = os.path.basename(words[0])
    if any(prog == s or prog.startswith(s + "-") or prog.startswith(s + ".") for s in SERVERS):
        return prog
    ran = [words[i + 1] for i, w in enumerate(words[:-1]) if w == "-m"]
    return next((m for m in ran if m in SERVER_MODULES or m.split(".")[0] in SERVER_MODULES), None)


@pytest.fixture(autouse=True)
def unit_tier_guard(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test not marked live may start no server process (``SERVERS``): it fails, naming the program."""
    if request.node.get_closest_marker("live"):
        return
    real = subprocess.Popen.__init__

    def guarded(self: Any, args: Any, *a: Any, **k: Any) -> None:
        started = server_started(args)
        if started:
            raise AssertionError(
                f"a unit test started {started!r} ({args!r:.200}): mark it live (tests/conftest.py, the tiers)"
            )
        real(self, args, *a, **k)

    monkeypatch.setattr(subprocess.Popen, "__init__", guarded)
