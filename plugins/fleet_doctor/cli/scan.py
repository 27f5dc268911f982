"""`fleet-doctor scan`: probe local log dirs, optionally snapshot ZooKeeper, and run the Spark detection app
(spark_apps/detect.py, the ``local`` Spark profile) through spark-submit, staged exactly as the audit stages."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleet_doctor import spark
from fleet_doctor.probe import Probe


class ScanError(Exception):
    """A usage or I/O problem: exit status 2."""


@dataclass
class ScanResult:
    findings: list[dict[str, Any]]
    summary: dict[str, Any]
    brokers: dict[int, list[str]] = field(default_factory=dict)


def stage_probe(
    paths: list[str], staging: Path, *, deep: bool, verify_crc: bool, broker_id: int | None
) -> dict[int, list[str]]:
    """Probe each log dir into staging/probe/broker_id=<N>/logdir-<k>.jsonl plus its segment, partition and file
    records as logdir-<k>.{segments,partitions,files}.parquet, as the audit stages (fleet_doctor.audit.staging).
    The broker id is --broker-id, else the log dir's meta.properties broker.id/node.id."""
    from fleet_doctor.audit.staging import split_to_dir

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
    from fleet_doctor.zookeeper import snapshot as zk_snapshot

    with tempfile.TemporaryDirectory(prefix="fleet-doctor-scan-") as tmpdir:
        work = Path(keep) if keep else Path(tmpdir)
        work.mkdir(parents=True, exist_ok=True)
        brokers = stage_probe(paths, work, deep=deep, verify_crc=verify_crc, broker_id=broker_id)
        facts = [{"broker_id": bid, "kafka_version": kafka_version, "running": False} for bid in sorted(brokers)]
        records = None
        if zookeeper or zk_snapshot_file:
            try:
                if zookeeper:
                    records = zk_snapshot.read_live(zookeeper)
                else:
                    records = zk_snapshot.read_snapshot_file(zk_snapshot_file)
            except (OSError, ValueError) as e:
                raise ScanError(f"ZooKeeper snapshot: {e}") from e
        try:
            found = spark.detect_locally(work, facts, records, master=master)
        except spark.SparkError as e:
            raise ScanError(str(e)) from e
        return ScanResult(found.findings, found.summary, brokers)
