"""The detection app on one staged run area, assembled once for its four callers: the audit DAG's Spark task (its
arguments, ``detect_args``), a run in this process over the store (``run``: a repair's re-verification, a local
audit), and a local work dir (``detect_locally``: ``fleet-doctor scan``, the repair's post-verify).

Every caller stages the same way (``fleet_doctor.layout.RunArea``: the probe output per broker, the broker facts, the
cluster facts, the KRaft controllers' headers) and tells the app the cluster's metadata mode, decided once where the
cluster is known (the inventory, or the inputs of a scan); nothing here infers it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleet_doctor import spark
from fleet_doctor.layout import LOCAL, RunArea, safe_run_id
from fleet_doctor.store import Store

MODES = ("zookeeper", "kraft")


@dataclass(frozen=True)
class Detection:
    findings: list[dict[str, Any]]
    summary: dict[str, Any]


def detect_args(
    store: Store,
    area: RunArea,
    audit_run: str,
    *,
    metadata_mode: str | None,
    findings_dataset: str,
    partial_scope: bool = False,
) -> list[str]:
    """The detection app's arguments for the run staged in ``area`` of ``store`` (the cluster facts and the KRaft
    controllers' headers when they are staged), its findings written to ``findings_dataset``."""
    cluster = area.cluster_metadata_key(store)
    return spark.detect_args(
        store.url(area.probe_dir),
        store.url(area.brokers),
        findings_dataset,
        safe_run_id(audit_run),
        store.url(area.summary),
        store.url(area.findings_json),
        store.url(cluster) if cluster else None,
        partial_scope=partial_scope,
        controllers=store.url(area.controllers) if store.is_file(area.controllers) else None,
        metadata_mode=metadata_mode,
    )


def run(
    master: str,
    conf: Mapping[str, str],
    args: list[str],
    *,
    jars: str = "",
    env: Mapping[str, str] | None = None,
    secret_file: str = "",
) -> None:
    """The detection app through spark-submit on this machine, with the short-run settings for ``master`` and the
    input's size under ``conf`` (the store's and the deployment's); ``secret_file``: a standalone cluster's
    authentication secret (``spark_auth``)."""
    base = {**spark.conf_for(master), **spark.SHORT_RUN_CONF, **spark.input_conf(args)}
    spark.run_detect(master, {**base, **conf}, args, jars=jars, env=env, secret_file=secret_file)


def detect_locally(
    work: Path,
    brokers: Iterable[Mapping[str, Any]],
    cluster_records: Iterable[Mapping[str, Any]] | None,
    *,
    metadata_mode: str | None,
    master: str = "local[*]",
    audit_run: str = "scan",
    partial_scope: bool = False,
    controller_records: Iterable[Mapping[str, Any]] | None = None,
) -> Detection:
    """The detection app on probe output staged in the local work dir ``work`` (a run area at its root:
    ``probe/broker_id=<N>/``), in this machine's Spark. ``brokers``: the broker facts (``broker_id``,
    ``kafka_version``, ``running``); ``cluster_records``: the cluster facts (a ZooKeeper snapshot's records or a
    KRaft metadata log's), or None for none; ``controller_records``: KRaft, every controller's ``cluster_metadata``
    record each followed by its ``metadata_problem`` records, or None; ``metadata_mode``: the cluster's mode as the
    caller knows it ("zookeeper" | "kraft"; None: not known); ``partial_scope``: only some of the fleet's brokers
    are in ``work`` (rules that compare brokers are skipped). SparkError when the app fails."""
    if metadata_mode not in (None, *MODES):
        raise ValueError(f"metadata_mode must be one of {MODES}, not {metadata_mode!r}")
    store, area = Store(work), LOCAL
    store.write_jsonl(area.brokers, [dict(b) for b in brokers])
    if cluster_records is not None:
        store.write_jsonl(area.cluster_metadata, [dict(r) for r in cluster_records])
    if controller_records is not None:
        store.write_jsonl(area.controllers, [dict(r) for r in controller_records])
    findings = store.url(area.own_findings_dataset)
    args = detect_args(
        store, area, audit_run, metadata_mode=metadata_mode, findings_dataset=findings, partial_scope=partial_scope
    )
    run(master, {}, args)
    found = [json.loads(line) for line in (work / area.findings_json).read_text().splitlines() if line.strip()]
    return Detection(found, json.loads((work / area.summary).read_text()))
