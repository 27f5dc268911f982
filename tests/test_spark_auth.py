"""Spark's authentication secret (``fleet_doctor.spark_auth``, issue 28 item 14): read from a file, checked, and kept
off every command line: a daemon gets it in its environment, a driver in a private properties file."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fleet_doctor import spark, spark_auth
from fleet_doctor.settings import Settings

SECRET = "Zm9vYmFyYmF6cXV4LXNlY3JldC10b2tlbi0xMjM0NTY3"
PLUGINS = Path(__file__).resolve().parents[1] / "plugins"


def test_a_secret_file_is_read_and_checked(tmp_path: Path) -> None:
    good = tmp_path / "secret"
    good.write_text(SECRET + "\n")
    assert spark_auth.read_secret(good) == SECRET
    for name, text in (("short", "abc\n"), ("spaces", "a b" * 20), ("two-lines", SECRET + "\n" + SECRET + "\n")):
        bad = tmp_path / name
        bad.write_text(text)
        with pytest.raises(spark_auth.SparkAuthError, match=f"the Spark secret file {bad} must hold") as e:
            spark_auth.read_secret(bad)
        assert text.strip()[:8] not in str(e.value) or name == "short"  # the message never quotes the secret
    with pytest.raises(spark_auth.SparkAuthError, match=f"{tmp_path / 'absent'} cannot be read"):
        spark_auth.read_secret(tmp_path / "absent")


def test_the_driver_gets_it_in_a_private_properties_file(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text(SECRET)
    path = spark_auth.properties_file(secret, tmp_path)
    assert path.stat().st_mode & 0o777 == 0o600
    assert path.read_text() == f"spark.authenticate=true\nspark.authenticate.secret={SECRET}\n"
    assert spark_auth.properties_file(secret, tmp_path) == path  # once per secret
    cmd = spark.submit_command(Path("/app.py"), "spark://127.0.0.1:7077", {"a": "b"}, [], "", "x.zip", str(path))
    assert cmd[cmd.index("--properties-file") + 1] == str(path) and SECRET not in " ".join(cmd)


def test_another_secrets_file_stays_while_a_submit_may_read_it_and_goes_once_unused(tmp_path: Path) -> None:
    """Two secrets at once under one user (two clusters, or a rotation): writing one's properties file does not
    remove the other's while a spark-submit may be about to read it (seen: 'Properties file ... does not exist');
    another secret's file unused for ROTATED_KEEP_S goes."""
    first, second = tmp_path / "first", tmp_path / "second"
    first.write_text(SECRET)
    second.write_text(SECRET[::-1])
    one = spark_auth.properties_file(first, tmp_path)
    two = spark_auth.properties_file(second, tmp_path)
    assert one.is_file() and two.is_file() and one != two
    stale = time.time() - spark_auth.ROTATED_KEEP_S - 60
    os.utime(one, (stale, stale))
    assert spark_auth.properties_file(second, tmp_path) == two
    assert not one.exists() and two.is_file()


def test_settings_turn_authentication_on_without_holding_the_secret(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text(SECRET)
    s = Settings.from_env({"FLEET_DOCTOR_SPARK_SECRET_FILE": str(secret), "FLEET_DOCTOR_DATA": str(tmp_path)})
    conf = s.detect_conf({})
    assert conf["spark.authenticate"] == "true" and SECRET not in repr(conf)
    assert "spark.authenticate" not in Settings.from_env({"FLEET_DOCTOR_DATA": str(tmp_path)}).detect_conf({})


def test_a_daemon_gets_it_in_its_environment_and_an_unfit_file_stops_it(tmp_path: Path) -> None:
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "spark-class").write_text('#!/bin/sh\nprintf "%s|%s" "$*" "$_SPARK_AUTH_SECRET"\n')
    (fake / "spark-class").chmod(0o755)
    secret = tmp_path / "secret"
    secret.write_text(SECRET + "\n")
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", "PYTHONPATH": str(PLUGINS)}
    argv = [sys.executable, "-m", "fleet_doctor.spark_auth", "org.apache.spark.deploy.master.Master", "--port", "1"]
    ran = subprocess.run(argv, env={**env, spark_auth.SECRET_FILE_ENV: str(secret)}, capture_output=True, text=True)
    assert ran.returncode == 0 and ran.stdout == f"org.apache.spark.deploy.master.Master --port 1|{SECRET}", ran
    secret.write_text("short")
    ran = subprocess.run(argv, env={**env, spark_auth.SECRET_FILE_ENV: str(secret)}, capture_output=True, text=True)
    assert ran.returncode == 2 and f"the Spark secret file {secret} must hold" in ran.stderr and not ran.stdout
