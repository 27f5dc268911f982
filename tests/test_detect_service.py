"""The detection service (``fleet_doctor.spark.DetectService``, ``fleet-doctor detect-service``): what a run must
share with it to be served, the sockets a client refuses to talk to, the service's answers (served, refused, failed)
and the audit's detect task sent to it. Unit tests: a stand-in for the warm driver, no JVM (the service serving real
detections across processes: tests/test_spark_fast_start.py)."""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleet_doctor import spark


class FakeDriver:
    """Stands in for the service's ``WarmDriver``: the runs it was given; a run naming "fail" fails as the app would,
    one naming "die" kills the driver (``proc`` None, as ``WarmDriver`` leaves it), one naming "wait" waits for
    ``release``."""

    def __init__(self) -> None:
        self.runs: list[list[str]] = []
        self.closed = 0
        self.proc: object | None = object()
        self.started, self.release = threading.Event(), threading.Event()

    def detect(self, args: list[str]) -> dict[str, Any]:
        self.runs.append(args)
        self.proc = self.proc or object()  # a dead driver is started again by the next run
        if "wait" in args:
            self.started.set()
            assert self.release.wait(30)
        if "fail" in args:
            raise spark.SparkError("detection app failed (warm driver):\nPATH_NOT_FOUND")
        if "die" in args:
            self.proc = None
            raise spark.SparkError("warm detection driver exited (exit -9):\n")
        return {"audit_run": args[-1], "total": 3}

    def close(self) -> None:
        self.closed += 1


@pytest.fixture
def service(tmp_path: Path) -> Iterator[spark.DetectService]:
    where = tmp_path / "service"
    service = spark.DetectService(where / "socket", "local[2]")
    service.driver = FakeDriver()  # type: ignore[assignment]
    service.listen()
    thread = threading.Thread(target=service.serve_forever, daemon=True)
    thread.start()
    yield service
    service.close()
    thread.join(10)
    assert not thread.is_alive() and not service.path.exists()


def test_a_run_with_the_services_settings_is_served_and_a_failure_is_the_runs(service: spark.DetectService) -> None:
    where = str(service.path)
    assert (service.path.parent.stat().st_mode & 0o777) == 0o700
    assert spark.served(where, service.settings, ["--audit-run", "r1"]) is True
    assert service.driver.runs == [["--audit-run", "r1"]]  # type: ignore[attr-defined]
    with pytest.raises(spark.SparkError, match=r"(?s)detection service .*PATH_NOT_FOUND"):
        spark.served(where, service.settings, ["fail"])
    assert (service.served, service.refused) == (1, 0)


def test_a_run_with_other_settings_is_refused_and_runs_itself(
    service: spark.DetectService, caplog: pytest.LogCaptureFixture
) -> None:
    other = {**service.settings, "settings": "0" * 64}
    with caplog.at_level(logging.INFO, logger="fleet_doctor.spark"):
        assert spark.served(str(service.path), other, ["--audit-run", "r1"]) is False
    assert service.driver.runs == [] and service.refused == 1  # type: ignore[attr-defined]
    assert "runs other settings (settings differ)" in caplog.text


def test_the_settings_compared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The findings do not depend on a local master's threads, on a venv's python being called python3, on the
    process basics or on the product's variables; they do on a cluster master, the settings, the store's
    credentials, the jars."""
    conf = {"spark.sql.shuffle.partitions": "1"}
    base = spark.service_settings("local[2]", conf)
    assert spark.service_settings("local[*]", conf) == base
    assert spark.service_settings("spark://127.0.0.1:7077", conf)["master"] != base["master"]
    assert spark.service_settings("local[2]", {"spark.sql.shuffle.partitions": "2"})["settings"] != base["settings"]
    assert spark.service_settings("local[2]", conf, jars="/x.jar")["jars"] != base["jars"]
    assert (
        spark.service_settings("local[2]", conf, env={"AWS_ACCESS_KEY_ID": "AKIA"})["environment"]
        != base["environment"]
    )
    monkeypatch.setenv("FLEET_DOCTOR_DATA", "/elsewhere")
    monkeypatch.setenv("HOME", "/elsewhere")
    monkeypatch.setenv("SPARK_BUFFER_SIZE", "65536")  # what an in-process SparkContext sets (a test's, here)
    assert spark.service_settings("local[2]", conf) == base
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python3").symlink_to(sys.executable)
    (venv / "python").symlink_to("python3")
    monkeypatch.setattr(sys, "executable", str(venv / "python"))
    as_python = spark.service_settings("local[2]", conf)
    monkeypatch.setattr(sys, "executable", str(venv / "python3"))
    assert spark.service_settings("local[2]", conf) == as_python
    assert as_python["environment"] != base["environment"]  # another venv's python
    assert all(len(v) == 64 for v in base.values())  # digests: the credentials never cross the socket


def test_a_socket_that_is_not_this_users_own_is_not_talked_to(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert spark.unfit_service_socket(str(tmp_path / "none")) == "cannot be read (No such file or directory)"
    (tmp_path / "file").write_text("")
    assert spark.unfit_service_socket(str(tmp_path / "file")) == "is not a socket"
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # anyone could have put a socket here
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(str(shared / "socket"))
        assert spark.unfit_service_socket(str(shared / "socket")) == "is in a directory others can write to"
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(str(private / "socket"))  # bound, not listening: a service that stopped without removing it
        assert spark.unfit_service_socket(str(private / "socket")) is None
        with caplog.at_level(logging.WARNING, logger="fleet_doctor.spark"):
            assert spark.served(str(private / "socket"), {}, ["--audit-run", "r"]) is False
    assert "cannot be reached" in caplog.text and "this process runs the detection" in caplog.text


def test_a_service_will_not_take_a_socket_another_serves_on_nor_a_shared_directory(
    service: spark.DetectService, tmp_path: Path
) -> None:
    with pytest.raises(spark.SparkError, match="already serves there"):
        spark.DetectService(service.path).listen()
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # anyone could put a socket of theirs here
    with pytest.raises(spark.SparkError, match="not a private directory"):
        spark.DetectService(shared / "socket").listen()


def test_a_service_answers_garbage_with_an_error_and_serves_on(service: spark.DetectService) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(str(service.path))
        conn.sendall(b"\x00not json\n")
        reply = json.loads(conn.makefile("r").readline())
    assert reply["ok"] is False and reply["error"]
    assert spark.served(str(service.path), service.settings, ["--audit-run", "r2"]) is True


def test_the_audits_detect_task_is_served_with_a_small_input(
    service: spark.DetectService, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The detect task on a worker with a service (its default settings, a lab's small input): no spark-submit."""
    from fleet_doctor.audit.detect_task import DetectOperator

    (tmp_path / "probe").mkdir()
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", '{"conn_type": "spark", "host": "local[2]"}')
    monkeypatch.setenv(spark.DETECT_SERVICE_ENV, str(service.path))
    args = ["--probe-dir", str(tmp_path / "probe"), "--output", str(tmp_path / "x"), "--audit-run", "a1"]
    op = DetectOperator(task_id="detect", conn_id="spark_default", application_args=args)
    assert op.served(op.prepare()) is True
    assert service.driver.runs == [args]  # type: ignore[attr-defined]
    configured = DetectOperator(
        task_id="detect", conn_id="spark_default", conf={"spark.sql.shuffle.partitions": "3"}, application_args=args
    )
    assert configured.served(configured.prepare()) is False  # settings of its own: its own spark-submit
    memory = DetectOperator(task_id="detect", conn_id="spark_default", application_args=args, driver_memory="8g")
    assert memory.served(memory.prepare()) is False and memory.submits_more() == ["driver memory"]
    secret = DetectOperator(task_id="detect", conn_id="spark_default", application_args=args, secret_file="/s")
    assert secret.served("local[2]") is False  # a secret: never sent anywhere
    assert service.refused == 1 and len(service.driver.runs) == 1  # type: ignore[attr-defined]


def test_no_service_named_no_service_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(spark.DETECT_SERVICE_ENV, raising=False)
    asked: list[Any] = []
    monkeypatch.setattr(spark, "served", lambda *a: asked.append(a) or True)
    monkeypatch.setattr(spark, "_WARM_POOLS", [])
    monkeypatch.setattr(spark.subprocess, "run", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("submitted")))
    with pytest.raises(RuntimeError, match="submitted"):
        spark.run_detect("local[2]", {}, ["--audit-run", "r"])
    assert asked == []
    monkeypatch.setenv(spark.DETECT_SERVICE_ENV, os.devnull)
    spark.run_detect("local[2]", {}, ["--audit-run", "r"])  # served: no submit
    with pytest.raises(RuntimeError, match="submitted"):
        spark.run_detect("spark://127.0.0.1:7077", {}, ["--audit-run", "r"])  # a cluster's: never the service
    assert len(asked) == 1


def test_a_run_whose_driver_died_is_run_by_its_caller_and_the_next_is_served(service: spark.DetectService) -> None:
    assert spark.served(str(service.path), service.settings, ["die"]) is False  # the caller runs its own
    assert spark.served(str(service.path), service.settings, ["--audit-run", "r3"]) is True
    assert service.driver.runs == [["die"], ["--audit-run", "r3"]]  # type: ignore[attr-defined]


def test_runs_wait_in_turn_and_one_too_many_is_busy(service: spark.DetectService) -> None:
    """One run at a time, first come first served; beyond ``SERVICE_QUEUE`` waiting, a run is refused (busy)."""
    driver: FakeDriver = service.driver  # type: ignore[assignment]
    results: dict[str, bool] = {}

    def client(name: str) -> None:
        results[name] = spark.served(str(service.path), service.settings, [name])

    first = threading.Thread(target=client, args=("wait",))
    first.start()
    assert driver.started.wait(10)
    waiting = [threading.Thread(target=client, args=(f"q{i}",)) for i in range(spark.SERVICE_QUEUE)]
    for t in waiting:
        t.start()
    deadline = time.monotonic() + 10
    while service._runs.qsize() < spark.SERVICE_QUEUE and time.monotonic() < deadline:
        time.sleep(0.01)
    assert spark.served(str(service.path), service.settings, ["one-too-many"]) is False  # busy: runs its own
    driver.release.set()
    for t in (first, *waiting):
        t.join(10)
    assert all(results.values()) and len(results) == spark.SERVICE_QUEUE + 1
    ran = [r[0] for r in driver.runs]
    assert ran[0] == "wait" and sorted(ran[1:]) == sorted(f"q{i}" for i in range(spark.SERVICE_QUEUE))
    assert service.refused == 1 and ["one-too-many"] not in driver.runs


def test_a_stop_tells_waiting_runs_to_run_their_own_and_a_lost_service_fails_the_started_one(tmp_path: Path) -> None:
    """Never two runs of one detection at once: a run the service had not started when it stopped is run by its
    caller; the one it had started (told "accepted") fails in its caller instead of running a second time."""
    service = spark.DetectService(tmp_path / "service" / "socket", "local[2]")
    driver = FakeDriver()
    service.driver = driver  # type: ignore[assignment]
    service.listen()
    threading.Thread(target=service.serve_forever, daemon=True).start()
    outcome: dict[str, Any] = {}

    def client(name: str) -> None:
        try:
            outcome[name] = spark.served(str(service.path), service.settings, [name])
        except spark.SparkError as e:
            outcome[name] = e

    started, queued = threading.Thread(target=client, args=("wait",)), threading.Thread(target=client, args=("q",))
    started.start()
    assert driver.started.wait(10)
    queued.start()
    deadline = time.monotonic() + 10
    while service._runs.qsize() < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    stopper = threading.Thread(target=service.close)
    stopper.start()
    queued.join(10)
    assert outcome["q"] is False and ["q"] not in driver.runs  # not started: its caller runs it
    driver.release.set()
    stopper.join(30)
    started.join(10)
    assert outcome["wait"] is True  # the started one finished before the stop
    # a service that goes away mid-run (here: the reply cut after "accepted")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as fake:
        fake.bind(str(tmp_path / "service" / "cut"))
        fake.listen(1)

        def accept_then_vanish() -> None:
            conn = fake.accept()[0]
            conn.makefile("r").readline()
            conn.sendall(b'{"accepted": true}\n')
            conn.close()

        threading.Thread(target=accept_then_vanish, daemon=True).start()
        with pytest.raises(spark.SparkError, match="went away while it ran the detection"):
            spark.served(str(tmp_path / "service" / "cut"), {}, ["x"])


def test_a_run_naming_a_relative_path_is_not_sent(service: spark.DetectService) -> None:
    """The service would resolve it in its own working directory: the caller runs it itself."""
    assert spark.served(str(service.path), service.settings, ["--output", "findings", "--audit-run", "r"]) is False
    assert spark.served(str(service.path), service.settings, ["--output", "s3a://b/findings"]) is True
    assert service.driver.runs == [["--output", "s3a://b/findings"]]  # type: ignore[attr-defined]


def test_a_service_serves_only_a_local_master(tmp_path: Path) -> None:
    with pytest.raises(spark.SparkError, match="serves a local master"):
        spark.DetectService(tmp_path / "socket", "spark://127.0.0.1:7077")
