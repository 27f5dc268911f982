"""The test session's detection service (``fleet-doctor detect-service``, ``fleet_doctor.spark.DetectService``):
started once by the process that runs the session (the xdist controller, or the only process), before the workers,
which inherit its socket in ``FLEET_DOCTOR_DETECT_SERVICE``, as does every process they start that keeps their
environment (a live Airflow's task processes, ``airflow dags test``, a scan); stopped by PID at the session's end.
Each of their small local detections is then a warm detection (~6 CPU-s here) instead of a driver JVM's start
(~15-20 CPU-s)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from fleet_doctor.spark import CLASS_ARCHIVE_ENV, DETECT_SERVICE_ENV, service_environment

REPO = Path(__file__).resolve().parents[2]
START_S = 60.0  # the service's Python start (its driver starts with the first detection)
STOP_S = 90.0  # its driver's stop (the session, the class archive) before the group is killed


def bare_env(**basics: str) -> dict[str, str]:
    """A worker's bare environment (``basics``: PATH, PYTHONPATH, HOME: a crashed Airflow worker's stand-in, nothing of
    the test's), with the session's detection service, if it has one, and the variables of this environment its
    driver compares (LANG, the JVM's and Spark's): the worker's detections are served by it rather than by a driver
    JVM of their own."""
    env = dict(basics)
    if CLASS_ARCHIVE_ENV in os.environ:  # the suite's class archive setting (tests/conftest.py), for a run not served
        env.setdefault(CLASS_ARCHIVE_ENV, os.environ[CLASS_ARCHIVE_ENV])
    service = os.environ.get(DETECT_SERVICE_ENV)
    if service:
        env[DETECT_SERVICE_ENV] = service
        for k, v in service_environment().items():  # the basics given stay the worker's own
            env.setdefault(k, v)
    return env


class SessionService:
    def __init__(self, master: str = "local[2]") -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="fleet-doctor-detect-service-"))  # 0700
        self.socket = self.dir / "socket"
        self.log = self.dir / "service.log"
        env = {**os.environ, "PYTHONPATH": str(REPO / "plugins")}
        env.pop(DETECT_SERVICE_ENV, None)
        cmd = [sys.executable, "-m", "fleet_doctor.cli", "detect-service", "--socket", str(self.socket)]
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [*cmd, "--master", master],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                start_new_session=True,  # a group of its own (its driver has another: stopped by the service)
            )
        deadline = time.monotonic() + START_S
        while not self.listening():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the detection service did not start:\n{self.tail()}")
            time.sleep(0.05)

    def listening(self) -> bool:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            return probe.connect_ex(str(self.socket)) == 0

    def tail(self, n: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self) -> str:
        """Stops it (SIGTERM: it stops its driver; then its group is killed); its last line (how many it served)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=STOP_S)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        lines = self.tail(100000).splitlines()
        said_of_runs = (line.split("detection service: ", 1)[1] for line in lines if "detection service: " in line)
        refusals = Counter(why for why in said_of_runs if why != "served")
        said = (lines[-1:] or ["(no output)"])[0]
        said += "".join(f"\n  {n} x {why}" for why, n in refusals.most_common())
        shutil.rmtree(self.dir, ignore_errors=True)
        return said
