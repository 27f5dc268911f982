"""`fleet-doctor scan`: probe local log dirs, optionally snapshot ZooKeeper or decode a KRaft cluster's metadata
log, and run the Spark detection app (spark_apps/detect.py, the ``local`` Spark profile) through spark-submit, staged
exactly as the audit stages.

KRaft: every given log dir holding a ``__cluster_metadata-0`` (and every ``--cluster-metadata`` dir) is decoded
(fleet_doctor.cluster_metadata). The cluster facts are the records of the node whose log goes furthest (the newest
epoch, then the end offset, then the first given) among those whose image misses no record (no snapshot gap, no CRC
failure), or among all when none is whole, as the audit picks its controller; every node's ``cluster_metadata``
header and ``metadata_problem`` records are the controllers input (the KRaft rules of the controller scope)."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleet_doctor import spark
from fleet_doctor.audit import detection
from fleet_doctor.layout import LOCAL
from fleet_doctor.probe import Probe, segment_file_name

METADATA_DIR = "__cluster_metadata-0"


class ScanError(Exception):
    """A usage or I/O problem: exit status 2."""


@dataclass
class ScanResult:
    findings: list[dict[str, Any]]
    summary: dict[str, Any]
    brokers: dict[int, list[str]] = field(default_factory=dict)
    metadata_source: dict[str, Any] | None = None  # KRaft: the node, dir and snapshot the cluster facts came from


@dataclass
class KraftMetadata:
    """What a scan decoded from KRaft metadata dirs: the cluster facts (one node's records) and the controllers
    input (every node's header, each followed by its problems)."""

    cluster: list[dict[str, Any]] | None  # None: no dir could be decoded
    controllers: list[dict[str, Any]]
    source: dict[str, Any]


def metadata_dirs(paths: list[str], explicit: list[str] | None) -> list[str]:
    """The KRaft metadata dirs to decode: every ``--cluster-metadata`` dir, then every given log dir holding a
    ``__cluster_metadata-0``; each once (by its real path)."""
    out, seen = [], set()
    candidates = [(d, True) for d in explicit or []] + [(p, False) for p in paths]
    for d, given in candidates:
        inner = d if os.path.basename(os.path.normpath(d)) == METADATA_DIR else os.path.join(d, METADATA_DIR)
        if not given and not os.path.isdir(inner):
            continue
        key = os.path.realpath(inner)
        if key not in seen:
            seen.add(key)
            out.append(d)
    return out


def decode_kraft(dirs: list[str], explicit: list[str] | None = None) -> KraftMetadata:
    """Decode each metadata dir. A ``--cluster-metadata`` dir that cannot be read at all is a ScanError; a log dir's
    own ``__cluster_metadata-0`` that cannot be read becomes a header with its error (a finding, not an exit)."""
    from fleet_doctor import probe
    from fleet_doctor.cluster_metadata import (
        ClusterMetadataError,
        log_position,
        quorum_controller,
        read_cluster_metadata,
    )

    nodes: list[list[dict[str, Any]]] = []
    for d in dirs:
        try:
            records = read_cluster_metadata(d)
        except ClusterMetadataError as e:
            if d in (explicit or []):
                raise ScanError(f"cluster metadata: {e}") from e
            node = None
            try:
                node = probe.parse_meta_properties(probe._read_small(os.path.join(d, probe.META_PROPERTIES)), d)[
                    "broker_id"
                ]
            except (OSError, ValueError):
                pass
            where = os.path.join(d, METADATA_DIR)
            records = [{"kind": "cluster_metadata", "source": "kraft", "dir": where, "node_id": node, "error": str(e)}]
        nodes.append(records)

    def rank(k: int) -> tuple:
        # as the audit picks its controller (fleet_doctor.audit.kraft): a node that decoded, then the freshest
        # (cluster_metadata.log_position), then the first given
        return (_decoded(nodes[k]), *log_position(nodes[k][0]), -k)

    chosen = max(range(len(nodes)), key=rank)
    controllers = [r for records in nodes for r in records if r.get("kind") in ("cluster_metadata", "metadata_problem")]
    head = nodes[chosen][0]
    # the cluster's controller as the audit names it: the quorum's over the nodes given, not the chosen node's view
    active, epoch = quorum_controller([records[0] for records in nodes if _decoded(records)], len(nodes))
    for r in nodes[chosen]:
        if r.get("kind") == "cluster":
            r.update(controller_id=active, controller_epoch=epoch)
    source = {
        k: head.get(k)
        for k in (
            "node_id",
            "dir",
            "snapshot",
            "snapshot_end_offset",
            "log_end_offset",
            "quorum_leader_id",
            "quorum_leader_epoch",
        )
    }
    source.update(active_controller=active, active_controller_epoch=epoch)
    return KraftMetadata(nodes[chosen] if _decoded(nodes[chosen]) else None, controllers, source)


def _decoded(records: list[dict[str, Any]]) -> bool:
    """The decoder read the dir (its records end with ``cluster_metadata_end``), errors in parts or not."""
    return records[-1].get("kind") == "cluster_metadata_end"


def stage_probe(
    paths: list[str], staging: Path, *, deep: bool, verify_crc: bool, broker_id: int | None
) -> dict[int, list[str]]:
    """Probe each log dir into staging/probe/broker_id=<N>/logdir-<k>.jsonl plus its segment, partition and file
    records as logdir-<k>.{segments,partitions,files}.parquet, as the audit stages (fleet_doctor.staging).
    The broker id is --broker-id, else the log dir's meta.properties broker.id/node.id."""
    from fleet_doctor.staging import split_to_dir

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
        dest = staging / LOCAL.broker_dir(bid)
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
    cluster_metadata: list[str] | None = None,
) -> ScanResult:
    """Probe ``paths`` and detect. Cluster facts: ZooKeeper (``zookeeper`` live, or ``zk_snapshot_file``), or KRaft:
    the ``cluster_metadata`` dirs (a ``__cluster_metadata-0`` dir or a log dir holding one) plus every given log dir
    holding a ``__cluster_metadata-0``, decoded. ScanError for a usage or I/O problem."""
    from fleet_doctor.zookeeper import snapshot as zk_snapshot

    if cluster_metadata and (zookeeper or zk_snapshot_file):
        raise ScanError("give either ZooKeeper (--zookeeper, --zk-snapshot-file) or --cluster-metadata, not both")
    with tempfile.TemporaryDirectory(prefix="fleet-doctor-scan-") as tmpdir:
        work = Path(keep) if keep else Path(tmpdir)
        work.mkdir(parents=True, exist_ok=True)
        brokers = stage_probe(paths, work, deep=deep, verify_crc=verify_crc, broker_id=broker_id)
        facts = [{"broker_id": bid, "kafka_version": kafka_version, "running": False} for bid in sorted(brokers)]
        records = controllers = source = None
        if not (zookeeper or zk_snapshot_file):
            dirs = metadata_dirs(paths, cluster_metadata)
            if dirs:
                kraft = decode_kraft(dirs, cluster_metadata)
                records, controllers, source = kraft.cluster, kraft.controllers, kraft.source
        if zookeeper or zk_snapshot_file:
            try:
                if zookeeper:
                    records = zk_snapshot.read_live(zookeeper)
                else:
                    records = zk_snapshot.read_snapshot_file(zk_snapshot_file)
            except (OSError, ValueError) as e:
                raise ScanError(f"ZooKeeper snapshot: {e}") from e
        # the cluster's mode, decided once from what the scan was given: KRaft metadata dirs, or ZooKeeper
        mode = "kraft" if source is not None else ("zookeeper" if records is not None else None)
        try:
            found = detection.detect_locally(
                work, facts, records, metadata_mode=mode, master=master, controller_records=controllers
            )
        except spark.SparkError as e:
            raise ScanError(str(e)) from e
        summary = dict(found.summary)
        if source is not None:  # the report's headings and its "cluster metadata from" line (audit.report)
            summary["metadata_mode"] = "kraft"
            summary["metadata_source"] = {
                "controller": source.get("node_id"),
                "metadata_log_dir": source.get("dir"),
                **{k: source.get(k) for k in ("snapshot", "snapshot_end_offset", "log_end_offset")},
                **{
                    k: source.get(k)
                    for k in ("quorum_leader_id", "quorum_leader_epoch", "active_controller", "active_controller_epoch")
                },
            }
        return ScanResult(found.findings, summary, brokers, source)


def prepare_class_archive(master: str = "local[2]") -> Path | None:
    """Dump the Spark driver's class archive now (``spark.class_archive``), if there is none for this JVM and Spark
    yet (``bin/dev setup`` calls this, so that a user's first ``scan`` does not pay the dump, ~7 s): the detection
    app once over a tiny broker, staged as ``scan`` stages. Returns the archive (None where none is used)."""
    archive = spark.class_archive(master)
    if not archive.dumping:
        return archive.archive
    with tempfile.TemporaryDirectory(prefix="fleet-doctor-warmup-") as tmp:
        logdir = Path(tmp) / "kafka-logs"
        partition = logdir / "warmup-0"
        partition.mkdir(parents=True)
        (logdir / "meta.properties").write_text("version=0\nbroker.id=0\n")
        for ext in ("log", "index", "timeindex"):
            (partition / segment_file_name(0, ext)).write_bytes(b"")
        work = Path(tmp) / "work"
        work.mkdir()
        stage_probe([str(logdir)], work, deep=False, verify_crc=False, broker_id=None)
        cluster = [
            {"kind": "cluster", "cluster_id": "warmup", "controller_id": 0},
            {"kind": "broker", "broker_id": 0},
            {"kind": "topic", "topic": "warmup", "partitions": {"0": [0]}, "replication_factor": 1},
            {"kind": "partition_state", "topic": "warmup", "partition": 0, "leader": 0, "isr": [0]},
        ]
        facts = [{"broker_id": 0, "kafka_version": None, "running": False}]
        detection.detect_locally(work, facts, cluster, metadata_mode="zookeeper", master=master)
    return archive.archive if archive.archive is not None and archive.archive.is_file() else None
