"""Detection's start-up on small inputs (fleet_doctor.spark, issue 19): the settings chosen from the staged input's
size, and the driver JVM's class-data sharing archive, checked on real spark-submit runs of the detection app over
a genuine corpus log dir (zk-3.1-single-aryan and its ZooKeeper snapshot).

What the settings change is how Spark evaluates the same plans (interpreted instead of compiled, no adaptive
re-planning); that they give the same findings on every rule is tests/test_detection.py's
``test_small_input_settings_give_the_recorded_findings``. What they save is measured in bench/ (bench/README.md,
"Detection in seconds"), not timed here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import own_spark_submit

from fleet_doctor import spark
from fleet_doctor.cli.scan import stage_probe
from fleet_doctor.zookeeper.snapshot import read_snapshot_file

ARYAN = "zk-3.1-single-aryan"


# ------------------------------------------------------------------------------------------- settings by input size
def _args(probe: str, zk: str | None = None) -> list[str]:
    return spark.detect_args(probe, probe, "/out", "run", "/s.json", "/f.jsonl", zk)


def test_a_small_staged_input_gets_the_small_input_settings(tmp_path: Path) -> None:
    probe = tmp_path / "probe" / "broker_id=1"
    probe.mkdir(parents=True)
    (probe / "logdir-0.jsonl").write_bytes(b"x" * 1000)
    assert spark.staged_bytes(str(tmp_path / "probe")) == 1000
    assert spark.staged_bytes(f"file://{tmp_path / 'probe'}") == 1000
    assert spark.staged_bytes(str(probe / "logdir-0.jsonl")) == 1000
    assert spark.input_conf(_args(str(tmp_path / "probe"))) == spark.SMALL_INPUT_CONF
    # a big one (sparse: its size is what counts) keeps Spark's defaults: compiled plans and the full JIT
    with (probe / "logdir-0.segments.parquet").open("wb") as f:
        f.truncate(spark.SMALL_INPUT_BYTES)  # with the 1000 bytes beside it: over
    assert spark.input_conf(_args(str(tmp_path / "probe"))) == {}


def test_every_input_counts_the_cluster_facts_too(tmp_path: Path) -> None:
    """One broker of a big cluster (a partial audit): the probe output is small, the cluster's facts are not."""
    (tmp_path / "probe").mkdir()
    with (tmp_path / "zk.jsonl").open("wb") as f:
        f.truncate(spark.SMALL_INPUT_BYTES + 1)
    assert spark.input_conf(_args(str(tmp_path / "probe"))) == spark.SMALL_INPUT_CONF
    assert spark.input_conf(_args(str(tmp_path / "probe"), str(tmp_path / "zk.jsonl"))) == {}


# an S3 store that cannot be reached (nothing listens on 127.0.0.1's discard port); its credentials given, so no
# credential chain is asked (a bucket of one that can: tests/test_store.py)
UNREACHABLE_S3 = {
    "FLEET_DOCTOR_S3_ENDPOINT": "http://127.0.0.1:9",
    "AWS_ACCESS_KEY_ID": "a",
    "AWS_SECRET_ACCESS_KEY": "b",
}


@pytest.mark.parametrize(
    "where", ["s3a://bucket/run/probe", "hdfs://nn/run/probe", "gs://bucket/run/probe", "/nonexistent/probe"]
)
def test_an_input_whose_size_cannot_be_told_keeps_sparks_defaults(where: str) -> None:
    assert spark.input_conf(_args(where), UNREACHABLE_S3) == {}
    assert spark.input_conf([]) == {}


def test_an_unreadable_staging_dir_is_not_taken_for_a_small_one(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root reads every directory")
    locked = tmp_path / "probe" / "broker_id=1"
    locked.mkdir(parents=True)
    locked.chmod(0)
    try:
        assert spark.staged_bytes(str(tmp_path / "probe")) is None
    finally:
        locked.chmod(0o700)


def test_the_detect_task_takes_the_small_input_settings_under_the_configured_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fleet_doctor.audit.detect_task import DetectOperator

    (tmp_path / "probe").mkdir()
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", '{"conn_type": "spark", "host": "local[2]"}')
    args = ["--probe-dir", str(tmp_path / "probe"), "--output", "x"]
    configured = {"spark.sql.shuffle.partitions": "3"}
    op = DetectOperator(task_id="detect", conn_id="spark_default", conf=configured, application_args=args)
    op.prepare()
    assert op.conf == {**spark.PROFILES["local"], **spark.SMALL_INPUT_CONF, **configured}


# ------------------------------------------------------------------------------------------- the class archive
def _cache_in(monkeypatch: pytest.MonkeyPatch, tmp: Path) -> None:
    """The machine's cache dir (and so its class archive) under ``tmp``, the archive on (the suite turns it off)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    monkeypatch.setattr(spark, "_CACHE_DIR", None)
    monkeypatch.delenv(spark.CLASS_ARCHIVE_ENV, raising=False)


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A temp dir of its own, so that the cache (and its class archive) is this test's."""
    if spark._java() is None:
        pytest.skip("no java on this machine")
    _cache_in(monkeypatch, tmp_path)
    return tmp_path


def test_the_cache_dir_is_private_and_one_someone_else_could_write_to_is_not_used(private_tmp: Path) -> None:
    mine = private_tmp / f"fleet-doctor-spark-{os.getuid()}"
    mine.mkdir(mode=0o755)  # as an earlier version made it: made private
    assert spark.cache_dir() == mine and (mine.stat().st_mode & 0o777) == 0o700
    spark._CACHE_DIR = None
    mine.chmod(0o777)
    assert spark.cache_dir() is None
    # then no class archive, and the library archive goes to a directory of this process's own
    assert spark.class_archive("local[2]") == spark.ClassArchive()
    zipped = spark.library_archive()
    assert zipped.is_file() and zipped.parent != mine and (zipped.parent.stat().st_mode & 0o777) == 0o700


def test_no_class_archive_for_a_cluster_master_or_when_turned_off(
    private_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert spark.class_archive("spark://127.0.0.1:7077") == spark.ClassArchive()
    assert spark.ClassArchive().conf({"a": "b"}) == {"a": "b"}
    monkeypatch.setenv(spark.CLASS_ARCHIVE_ENV, "off")
    assert spark.class_archive("local[2]") == spark.ClassArchive()


def test_the_configured_java_options_come_after_the_archives_and_a_configured_archive_wins(private_tmp: Path) -> None:
    archive = spark.class_archive("local[2]")
    options = archive.conf({spark.JAVA_OPTIONS: "-XX:TieredStopAtLevel=1"})[spark.JAVA_OPTIONS]
    assert options.startswith("-XX:ArchiveClassesAtExit=") and options.endswith(" -XX:TieredStopAtLevel=1")
    for own in ("-Xshare:off", "-XX:SharedArchiveFile=/opt/x.jsa"):
        assert archive.conf({spark.JAVA_OPTIONS: own}) == {spark.JAVA_OPTIONS: own}


def test_a_dump_left_by_a_killed_run_is_removed_after_an_hour(private_tmp: Path) -> None:
    directory = spark.cache_dir()
    assert directory is not None
    old, fresh = directory / ".spark-driver-x.jsa.1.tmp", directory / ".spark-driver-x.jsa.2.tmp"
    for p in (old, fresh):
        p.write_bytes(b"half a dump")
    hours_ago = time.time() - 2 * spark.ABANDONED_DUMP_S
    os.utime(old, (hours_ago, hours_ago))
    assert spark.class_archive("local[2]").dumping
    assert not old.exists() and fresh.exists()  # another run may be dumping that one right now


def test_a_failed_run_leaves_no_half_dumped_archive(private_tmp: Path) -> None:
    archive = spark.class_archive("local[2]")
    assert archive.dumping and archive.path is not None and archive.archive is not None
    archive.path.write_bytes(b"half a dump")
    archive.finish(False)
    assert not archive.path.exists() and not archive.archive.exists()


@pytest.fixture(scope="module")
def aryan_staged(corpus, tmp_path_factory) -> tuple[Path, list[dict]]:
    """The aryan log dir probed and staged as scan stages it, and its ZooKeeper snapshot's records."""
    work = tmp_path_factory.mktemp("aryan")
    stage_probe([str(corpus / ARYAN / "kafka-logs")], work, deep=False, verify_crc=False, broker_id=None)
    return work, read_snapshot_file(str(corpus / ARYAN / "zookeeper"))


def _detect(work: Path, zk: list[dict], name: str, java_options: str = "") -> list[dict]:
    """The detection app as ``scan`` submits it (``run_detect``: the small input's settings, the class archive),
    with ``java_options`` for the driver added."""
    run = work / name
    run.mkdir()
    (run / "brokers.jsonl").write_text(json.dumps({"broker_id": 0, "kafka_version": "3.1.0", "running": False}))
    (run / "zk.jsonl").write_text("".join(json.dumps(r) + "\n" for r in zk))
    args = spark.detect_args(
        str(work / "probe"),
        str(run / "brokers.jsonl"),
        str(run / "findings"),
        "test",
        str(run / "summary.json"),
        str(run / "findings.jsonl"),
        str(run / "zk.jsonl"),
    )
    conf = {**spark.conf_for("local[2]"), **spark.input_conf(args)}
    assert conf == {**spark.PROFILES["local"], **spark.SMALL_INPUT_CONF}
    if java_options:
        conf[spark.JAVA_OPTIONS] += f" {java_options}"
    spark.run_detect("local[2]", conf, args)
    return [json.loads(line) for line in (run / "findings.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def dumped_archive(
    aryan_staged: tuple[Path, list[dict]], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Path, list[dict]]:
    """A cache dir of this module's, whose class archive its first run dumped (a spark-submit of the detection app of
    its own, as a machine's first scan): (the temp dir holding the cache dir, the archive, that run's findings)."""
    if spark._java() is None:
        pytest.skip("no java on this machine")
    work, zk = aryan_staged
    tmp = tmp_path_factory.mktemp("archived")
    with pytest.MonkeyPatch.context() as mp:
        _cache_in(mp, tmp)
        own_spark_submit(mp)  # as a test marked spark_submit: a module fixture is made before that marker acts
        first = spark.class_archive("local[2]")
        assert first.dumping and first.archive is not None
        found = _detect(work, zk, "first")
    return tmp, first.archive, found


@pytest.fixture
def archived_tmp(dumped_archive: tuple[Path, Path, list[dict]], monkeypatch: pytest.MonkeyPatch) -> Path:
    """The machine's cache dir is the module's, holding the class archive its first run dumped."""
    tmp, _archive, _found = dumped_archive
    _cache_in(monkeypatch, tmp)
    return tmp


def shared_classes(log: Path) -> bool:
    """Whether the driver JVM whose ``-Xlog:class+load`` went to ``log`` took Spark's classes out of the archive."""
    loads = [line for line in log.read_text().splitlines() if "org.apache.spark.SparkContext " in line]
    return bool(loads) and "source: shared objects file (top)" in loads[0]


@pytest.mark.spark_submit
def test_the_first_run_dumps_the_archive_and_the_next_map_it_with_the_same_findings(
    archived_tmp: Path,
    dumped_archive: tuple[Path, Path, list[dict]],
    aryan_staged: tuple[Path, list[dict]],
    tmp_path: Path,
) -> None:
    work, zk = aryan_staged
    _tmp, archive, dumped = dumped_archive
    assert archive.is_file() and archive.stat().st_size > 1 << 20
    assert not list(archive.parent.glob(".*jsa*")), "no temporary dump left"
    second = spark.class_archive("local[2]")
    assert not second.dumping and second.path == archive
    # the driver JVM maps it: Spark's own classes come out of it (class+load says where each class came from)
    log = tmp_path / "class-load.log"
    assert _detect(work, zk, "mapped", f"-Xlog:class+load=info:file={log}") == dumped
    assert shared_classes(log), log.read_text()[-2000:]
    topic_ids = {f["topic"] for f in dumped if f["rule"] == "topic-id-mismatch"}
    assert topic_ids == {"design1"}  # MANIFEST.md: the genuine drift of aryan's design1


@pytest.mark.spark_submit
def test_a_damaged_archive_is_ignored_by_the_jvm(private_tmp: Path, aryan_staged: tuple[Path, list[dict]]) -> None:
    """An archive that does not fit (here: garbage of the right name) costs only its speed: the JVM runs on without
    it, silently (its cds log lines are off), and detection gives the same findings."""
    work, zk = aryan_staged
    archive = spark.class_archive("local[2]").archive
    assert archive is not None
    archive.parent.mkdir(parents=True, exist_ok=True)
    archive.write_bytes(os.urandom(1 << 16))
    found = _detect(work, zk, "damaged")
    assert {f["topic"] for f in found if f["rule"] == "topic-id-mismatch"} == {"design1"}


# ------------------------------------------------------------------------------------------------ the warm driver
@pytest.mark.spark_submit  # this test makes its own warm drivers
def test_a_warm_driver_serves_many_detections_with_spark_submits_findings(
    archived_tmp: Path, aryan_staged: tuple[Path, list[dict]], tmp_path: Path
) -> None:
    """``warm_drivers``: one detection app (a real spark-submit of ``detect.py --serve``) serves every run of the
    block, with the same findings each time (the code a spark-submit of the app runs: ``detect_once``); a run that
    fails fails alone (the driver serves on); a driver that died is started again by the next run; the block's
    end stops it (no process left, its private dir gone). With a class archive in the cache dir, as on a machine whose
    first scan dumped one (the module's: the suite's other drivers run without one, tests/conftest.py), which each
    driver maps."""
    work, zk = aryan_staged
    log = tmp_path / "class-load.log"
    classes = f"-Xlog:class+load=info:file={log}"  # every run with the same settings: one driver serves them
    with spark.warm_drivers() as pool:
        first = _detect(work, zk, "warm-1", classes)
        assert shared_classes(log), log.read_text()[-2000:]
        again = _detect(work, zk, "warm-2", classes)
        driver = pool.current
        assert driver is not None and driver.runs == 2 and driver.proc is not None
        with pytest.raises(spark.SparkError, match="PATH_NOT_FOUND"):
            driver.detect(spark.detect_args(str(work / "nothing"), str(work / "nothing"), str(work / "x"), "t", "", ""))
        pid = driver.proc.pid
        os.killpg(pid, 9)  # the driver dies between two runs: the next starts another
        driver.proc.wait()
        log.unlink()
        third = _detect(work, zk, "warm-3", classes)
        assert shared_classes(log), log.read_text()[-2000:]  # the driver started again maps it too
        assert driver.proc is not None and driver.proc.pid != pid and driver.runs == 4  # the failed run too
        where, pid = driver.dir, driver.proc.pid
        assert where is not None and where.stat().st_mode & 0o777 == 0o700
    assert driver.proc is None and not where.exists()
    assert not running_processes_of_group(pid)  # a zombie left to a slow reaper (the CI's init) is not running
    assert first == again == third
    assert {f["topic"] for f in first if f["rule"] == "topic-id-mismatch"} == {"design1"}


@pytest.mark.spark_submit  # its own service, not the session's
def test_a_detection_service_serves_another_processs_scan_and_this_ones_with_the_same_findings(
    corpus: Path, aryan_staged: tuple[Path, list[dict]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``fleet-doctor detect-service`` (a process of its own, as a worker would run it) serves a ``fleet-doctor
    scan`` run by another process and a detection of this one: one driver JVM for both, the same findings; SIGTERM
    stops it and its driver (no process of its group left, its socket gone)."""
    if spark._java() is None:
        pytest.skip("no java on this machine")
    where = tmp_path / "service"
    env = {**os.environ, "PYTHONPATH": str(Path(spark.__file__).parents[1])}
    env.pop(spark.DETECT_SERVICE_ENV, None)
    cmd = [sys.executable, "-m", "fleet_doctor.cli", "detect-service", "--socket", str(where / "socket")]
    service = subprocess.Popen(
        [*cmd, "--master", "local[2]"], env=env, stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert service.stdout is not None
        assert "serving on" in service.stdout.readline()
        env[spark.DETECT_SERVICE_ENV] = str(where / "socket")
        aryan = corpus / ARYAN
        scan = [sys.executable, "-m", "fleet_doctor.cli", "scan", str(aryan / "kafka-logs"), "--format", "json"]
        ran = subprocess.run(
            [*scan, "--zk-snapshot-file", str(aryan / "zookeeper"), "--kafka-version", "3.1.0"],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert ran.returncode in (0, 1), ran.stderr[-3000:]
        scanned = json.loads(ran.stdout)["findings"]
        monkeypatch.setenv(spark.DETECT_SERVICE_ENV, str(where / "socket"))
        work, zk = aryan_staged
        mine = _detect(work, zk, "served")
    finally:
        service.terminate()
        out, _ = service.communicate(timeout=120)
    assert service.returncode == 0 and "stopped (2 served, 0 refused)" in out, out
    assert not running_processes_of_group(service.pid) and not (where / "socket").exists()
    mismatched = {f["topic"] for f in mine if f["rule"] == "topic-id-mismatch"}
    assert mismatched == {f["topic"] for f in scanned if f["rule"] == "topic-id-mismatch"} == {"design1"}
    assert sorted(f["rule"] for f in mine) == sorted(f["rule"] for f in scanned)


def running_processes_of_group(pgid: int) -> list[str]:
    """Every process of group ``pgid`` not yet dead (state and pid, read from /proc here, not through the code under
    test)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(f"{stat.parent.name} ({fields[0]})")
    return out


class CountedDriver:
    """A stand-in for ``WarmDriver`` that starts nothing: what the pool asked of it."""

    def __init__(self, master: str, conf: dict, jars: str, env: dict | None) -> None:
        self.key, self.closed = (master, tuple(sorted(conf.items()))), 0

    def close(self) -> None:
        self.closed += 1


def test_a_warm_pool_keeps_one_driver_and_a_run_with_other_settings_replaces_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(spark, "WarmDriver", CountedDriver)
    monkeypatch.setattr(spark, "_WARM_POOLS", [])
    with spark.warm_drivers() as pool:
        small = pool.driver("local[2]", {"a": "1"}, "", None)
        assert pool.driver("local[2]", {"a": "1"}, "", None) is small  # the same settings: the same driver
        with spark.warm_drivers() as inner:  # a block inside another: the outer block's drivers serve
            assert inner is pool
        assert small.closed == 0
        other = pool.driver("local[2]", {"a": "2"}, "", None)
        assert other is not small and small.closed == 1 and pool.current is other
    assert other.closed == 1 and spark._WARM_POOLS == []


def test_a_run_naming_the_environment_the_driver_has_anyway_is_served_by_the_same_driver(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A repair's re-verify names the store's AWS_* variables (read from the worker's environment, which a
    spark-submit inherits anyway); its post-verifies name none. The driver's environment is the same for both: one
    driver serves them all (measured: a repair's execute task started a second driver JVM, ~7 s, for its first
    post-verify). A variable whose value differs from the environment's is another driver."""
    monkeypatch.setattr(spark, "WarmDriver", CountedDriver)
    monkeypatch.setattr(spark, "_WARM_POOLS", [])
    monkeypatch.setenv("AWS_CA_BUNDLE", "/etc/ssl/certs/ca-certificates.crt")
    with spark.warm_drivers() as pool:
        verify = pool.driver("local[2]", {"a": "1"}, "", {"AWS_CA_BUNDLE": "/etc/ssl/certs/ca-certificates.crt"})
        assert pool.driver("local[2]", {"a": "1"}, "", None) is verify
        assert pool.driver("local[2]", {"a": "1"}, "", {}) is verify
        other = pool.driver("local[2]", {"a": "1"}, "", {"AWS_CA_BUNDLE": "/elsewhere.pem"})
        assert other is not verify and verify.closed == 1


def test_spark_submit_runs_this_interpreter() -> None:
    assert spark.spark_env()["PYSPARK_PYTHON"] == sys.executable


def test_spark_submit_inherits_only_the_allow_listed_environment() -> None:
    """Issue 28 item 12: Airflow's secrets (in every Airflow container's environment) never reach spark-submit."""
    worker = {
        "AIRFLOW__API_AUTH__JWT_SECRET": "jwt",
        "AIRFLOW__CORE__FERNET_KEY": "fernet",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": "postgresql://airflow:pw@127.0.0.1/airflow",
        "FLEET_DOCTOR_NOTIFIERS": '{"webhook": "https://hooks.example/T0/secret"}',
        "REDIS_PASSWORD": "r",
        "AWS_ACCESS_KEY_ID": "AKIA",
        "FLEET_DOCTOR_DATA": "s3a://bucket/fd",
        "SPARK_LOCAL_DIRS": "/tmp/spark",
        "JAVA_HOME": "/usr/lib/jvm/java-17",
        "LC_ALL": "C.UTF-8",
        "PATH": "/usr/bin",
    }
    env = spark.spark_env(worker)
    assert not {k for k in env if k.startswith("AIRFLOW") or k in ("FLEET_DOCTOR_NOTIFIERS", "REDIS_PASSWORD")}
    for kept in ("AWS_ACCESS_KEY_ID", "FLEET_DOCTOR_DATA", "SPARK_LOCAL_DIRS", "JAVA_HOME", "LC_ALL"):
        assert env[kept] == worker[kept]
    assert env["PATH"].endswith("/usr/bin") and env["PYSPARK_PYTHON"] == sys.executable
