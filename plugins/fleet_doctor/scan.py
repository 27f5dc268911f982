"""`fleet-doctor scan`: probe local log dirs, optionally snapshot ZooKeeper, and run the Spark
detection app (spark_apps/detect.py) in local mode through spark-submit, exactly as the audit does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleet_doctor.probe import Probe

REPO = Path(__file__).resolve().parents[2]
DETECT_APP = REPO / "spark_apps" / "detect.py"
LOCAL_SPARK_CONF = {
    # small local runs: few shuffle partitions, no UI, loopback only
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.adaptive.enabled": "true",
    "spark.ui.enabled": "false",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.log.level": "WARN",
    # a short-lived driver JVM: the C1 compiler alone warms up much faster than tiered C2
    "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1",
    # no per-call Python call-site capture (several JVM round trips per DataFrame/Column call)
    "spark.python.sql.dataFrameDebugging.enabled": "false",
}


class ScanError(Exception):
    """A usage or I/O problem: exit status 2."""


@dataclass
class ScanResult:
    findings: list[dict[str, Any]]
    summary: dict[str, Any]
    brokers: dict[int, list[str]] = field(default_factory=dict)


def spark_env() -> dict[str, str]:
    """Environment for spark-submit from this interpreter's pyspark (the pip package ships Spark)."""
    import importlib.util

    spec = importlib.util.find_spec("pyspark")  # found, not imported: cheap enough for DAG parsing
    if spec is None or not spec.submodule_search_locations:
        raise ScanError("pyspark is not installed in this interpreter's environment")
    env = dict(os.environ)
    env["SPARK_HOME"] = next(iter(spec.submodule_search_locations))
    env["PYSPARK_PYTHON"] = sys.executable
    env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    return env


def spark_submit_cmd(app: Path, master: str, conf: dict[str, str], app_args: list[str], jars: str = "") -> list[str]:
    import pyspark

    cmd = [os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-submit"), "--master", master]
    if jars:
        cmd += ["--jars", jars]
    for k, v in conf.items():
        cmd += ["--conf", f"{k}={v}"]
    return [*cmd, str(app), *app_args]


def stage_probe(
    paths: list[str], staging: Path, *, deep: bool, verify_crc: bool, broker_id: int | None
) -> dict[int, list[str]]:
    """Probe each log dir into staging/probe/broker_id=<N>/logdir-<k>.jsonl plus its segment, partition and file
    records as logdir-<k>.{segments,partitions,files}.parquet, as the audit stages (fleet_doctor.staged_records).
    The broker id is --broker-id, else the log dir's meta.properties broker.id/node.id."""
    from fleet_doctor.staged_records import split_to_dir  # pyarrow: imported when used, not at DAG parse

    brokers: dict[int, list[str]] = {}
    for k, path in enumerate(paths):
        if not os.path.isdir(path):
            raise ScanError(f"{path}: not a directory (give Kafka log dirs)")
        tmp = staging / f"probe-{k}.jsonl"
        with tmp.open("w", encoding="utf-8") as out:
            Probe(out, deep=deep, verify_crc=verify_crc).run([path])
        bid = broker_id
        if bid is None:
            with tmp.open(encoding="utf-8") as f:
                for line in f:
                    rec = json.loads(line)
                    if rec["kind"] == "logdir":
                        bid = (rec.get("meta") or {}).get("broker_id")
                        break
        if bid is None:
            raise ScanError(f"{path}: no broker id in meta.properties; pass --broker-id N")
        dest = staging / "probe" / f"broker_id={bid}"
        dest.mkdir(parents=True, exist_ok=True)
        with tmp.open("rb") as src:
            split_to_dir(src, dest, f"logdir-{k}.jsonl")
        tmp.unlink()
        brokers.setdefault(bid, []).append(path)
    return brokers


def scan(
    paths: list[str],
    *,
    zookeeper: str | None = None,
    zk_snapshot_file: str | None = None,
    kafka_version: str | None = None,
    broker_id: int | None = None,
    deep: bool = False,
    verify_crc: bool = False,
    master: str = "local[*]",
    keep: str | None = None,
) -> ScanResult:
    from fleet_doctor import zk_snapshot

    with tempfile.TemporaryDirectory(prefix="fleet-doctor-scan-") as tmpdir:
        work = Path(keep) if keep else Path(tmpdir)
        work.mkdir(parents=True, exist_ok=True)
        brokers = stage_probe(paths, work, deep=deep, verify_crc=verify_crc, broker_id=broker_id)
        with (work / "brokers.jsonl").open("w", encoding="utf-8") as f:
            for bid in sorted(brokers):
                f.write(json.dumps({"broker_id": bid, "kafka_version": kafka_version, "running": False}) + "\n")
        args = [
            "--probe-dir",
            str(work / "probe"),
            "--brokers",
            str(work / "brokers.jsonl"),
            "--output",
            str(work / "findings"),
            "--audit-run",
            "scan",
            "--summary",
            str(work / "summary.json"),
            "--findings-json",
            str(work / "findings.jsonl"),
        ]
        if zookeeper or zk_snapshot_file:
            try:
                if zookeeper:
                    records = zk_snapshot.read_live(zookeeper)
                else:
                    records = zk_snapshot.read_snapshot_file(zk_snapshot_file)
            except (OSError, ValueError) as e:
                raise ScanError(f"ZooKeeper snapshot: {e}") from e
            with (work / "zk.jsonl").open("w", encoding="utf-8") as f:
                for r in records:
                    f.write(json.dumps(r) + "\n")
            args += ["--zk-snapshot", str(work / "zk.jsonl")]
        cmd = spark_submit_cmd(DETECT_APP, master, LOCAL_SPARK_CONF, args)
        proc = subprocess.run(cmd, env=spark_env(), capture_output=True, text=True)
        if proc.returncode != 0:
            tail = "\n".join(proc.stderr.strip().splitlines()[-25:])
            raise ScanError(f"detection app failed (exit {proc.returncode}):\n{tail}")
        findings = [json.loads(line) for line in (work / "findings.jsonl").read_text().splitlines()]
        summary = json.loads((work / "summary.json").read_text())
        return ScanResult(findings, summary, brokers)
