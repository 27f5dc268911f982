"""An S3 server on 127.0.0.1 for the tests of an s3a:// data store: moto's S3 service as a real HTTP server, run
from .venv-s3 (bin/dev installs it), stopped by PID. Spark reaches it through hadoop-aws (.cache/s3a-jars)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

REPO = Path(__file__).resolve().parents[2]
MOTO = REPO / ".venv-s3" / "bin" / "moto_server"
JARS_DIR = REPO / ".cache" / "s3a-jars"
JARS = ("hadoop-aws-3.3.1.jar", "aws-java-sdk-bundle-1.11.901.jar")

# hadoop-aws 3.3.1 (the newest available here) reads some settings as plain numbers that Spark's Hadoop 3.5 client
# defaults with units ("60s"), and knows only the AWS SDK v1 credential providers: these settings bridge the two.
# A hadoop-aws that matches Spark's Hadoop needs none of them.
S3A_COMPAT_CONF = {
    "spark.hadoop.fs.s3a.connection.timeout": "200000",
    "spark.hadoop.fs.s3a.connection.establish.timeout": "30000",
    "spark.hadoop.fs.s3a.threads.keepalivetime": "60",
    "spark.hadoop.fs.s3a.multipart.purge.age": "86400",
    "spark.hadoop.fs.s3a.aws.credentials.provider": "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class S3Server:
    def __init__(self, workdir: Path, bucket: str = "fleet-doctor") -> None:
        if not MOTO.exists():
            raise RuntimeError(f"S3 test server missing ({MOTO}): run bin/dev setup-s3 (bin/dev test does)")
        self.workdir, self.bucket = workdir, bucket
        self.port = _free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> S3Server:
        self.workdir.mkdir(parents=True, exist_ok=True)
        log = open(self.workdir / "moto.log", "wb")  # the server's log, open for the server's lifetime
        self.proc = subprocess.Popen(
            [str(MOTO), "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError as e:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.__exit__(None, None, None)
                    log_text = (self.workdir / "moto.log").read_text()[-2000:]
                    raise RuntimeError(f"moto_server did not start: {log_text}") from e
                time.sleep(0.1)
        from pyarrow import fs

        s3 = fs.S3FileSystem(
            access_key="fleet",
            secret_key="doctor",
            endpoint_override=f"127.0.0.1:{self.port}",
            scheme="http",
            region="us-east-1",
            allow_bucket_creation=True,
        )
        s3.create_dir(self.bucket)
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def url(self, prefix: str) -> str:
        return f"s3a://{self.bucket}/{prefix.strip('/')}"

    def env(self) -> dict[str, str]:
        """What an operator sets for an s3a:// data store: credentials, endpoint, the jars and the bridge settings."""
        missing = [str(JARS_DIR / j) for j in JARS if not (JARS_DIR / j).exists()]
        if missing:
            raise RuntimeError(f"hadoop-aws jars missing ({', '.join(missing)}): run bin/dev setup-s3")
        return {
            "AWS_ACCESS_KEY_ID": "fleet",
            "AWS_SECRET_ACCESS_KEY": "doctor",
            "AWS_REGION": "us-east-1",
            "FLEET_DOCTOR_S3_ENDPOINT": self.endpoint,
            "FLEET_DOCTOR_SPARK_JARS": ",".join(str(JARS_DIR / j) for j in JARS),
            "FLEET_DOCTOR_SPARK_CONF": json.dumps(S3A_COMPAT_CONF),
        }
