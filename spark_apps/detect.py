"""Fleet Doctor detection app: staged probe output + cluster facts + broker facts -> findings.

    spark-submit --py-files fleet_doctor-<hash>.zip spark_apps/detect.py --probe-dir STAGING \
        --brokers brokers.jsonl [--cluster-metadata cluster-metadata.jsonl] \
        [--controllers controllers.jsonl] [--metadata-mode zookeeper|kraft] \
        --output FINDINGS_DIR --audit-run RUN_ID \
        [--summary summary.json] [--findings-json findings.jsonl]
    spark-submit ... spark_apps/detect.py --serve SOCKET   # a warm driver: one detection per line (serve)

The cluster facts (--cluster-metadata; its older name --zk-snapshot still works) are a ZooKeeper snapshot's records
or, on a KRaft cluster, the same records decoded from its metadata log (fleet-doctor cluster-metadata); --controllers
adds each KRaft controller's own metadata log
header and problems (the KRaft rules of the controller scope); --metadata-mode is the cluster's declared mode, so
that a KRaft cluster none of whose controllers could be read still gets its rules reported as skipped, in KRaft words.

Findings are written as Parquet under FINDINGS_DIR/audit_run=RUN_ID/ (that partition is replaced,
so a rerun of the same audit run is idempotent). Paths may be local, hdfs:// or s3a://. The rules
themselves live in fleet_doctor.detect (no Python UDFs: executors need nothing but the JVM). The library
comes with the submit (``--py-files``, fleet_doctor.spark.library_archive).
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import traceback
from collections import Counter

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from fleet_doctor.detect import detect, load_frames
from fleet_doctor.rules import SEVERITY_ORDER
from fleet_doctor.store import temporary_name, write_atomic


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="detect.py", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--probe-dir",
        required=True,
        help="directory with broker_id=<N>/ subdirs of staged probe output (*.jsonl[.gz]; "
        "*.segments.parquet, *.partitions.parquet, *.files.parquet)",
    )
    p.add_argument("--brokers", help="broker facts, JSON Lines {broker_id, kafka_version, running, host}")
    p.add_argument(
        "--cluster-metadata",
        "--zk-snapshot",  # its name before it carried KRaft facts too: still accepted
        dest="cluster_metadata",
        help="cluster facts, JSON Lines: a ZooKeeper snapshot (fleet-doctor zk-snapshot) or a KRaft cluster's metadata "
        "log (fleet-doctor cluster-metadata)",
    )
    p.add_argument(
        "--controllers",
        help="KRaft: JSON Lines of every controller's cluster_metadata record, each followed by its metadata_problem "
        "records (fleet-doctor cluster-metadata)",
    )
    p.add_argument(
        "--metadata-mode",
        choices=("zookeeper", "kraft"),
        help="the cluster's metadata mode as the inventory declares it (default: what the cluster facts are)",
    )
    p.add_argument("--output", required=True, help="findings dataset root (Parquet, partitioned by audit_run)")
    p.add_argument("--audit-run", required=True, help="audit run id, e.g. the Airflow run id")
    p.add_argument("--summary", help="write a JSON summary here (a local path or a store URL)")
    p.add_argument("--findings-json", help="also write the findings as one JSON Lines file (a local path or a URL)")
    p.add_argument(
        "--partial-scope",
        action="store_true",
        help="only some of the fleet's brokers were staged on purpose: skip the rules that compare brokers",
    )
    return p.parse_args(argv)


def summarize(rows: list[dict], skipped: dict[str, str], audit_run: str) -> dict:
    by_sev = {s: 0 for s in reversed(SEVERITY_ORDER)}
    by_rule: dict[str, int] = {}
    by_broker: dict[str, int] = {}
    for r in rows:
        by_sev[r["severity"]] += r["n"]
        by_rule[r["rule"]] = by_rule.get(r["rule"], 0) + r["n"]
        key = "cluster" if r["broker_id"] is None else str(r["broker_id"])
        by_broker[key] = by_broker.get(key, 0) + r["n"]
    return {
        "audit_run": audit_run,
        "findings": sum(by_sev.values()),
        "by_severity": by_sev,
        "by_rule": dict(sorted(by_rule.items())),
        "by_broker": dict(sorted(by_broker.items())),
        "rules_skipped": skipped,
    }


def write_text(spark: SparkSession, path: str, text: str) -> None:
    """Write ``text`` to ``path`` atomically: a local file, or through Hadoop's filesystem for a URL (s3a://,
    hdfs://, with the session's settings), written under a hidden temporary name and renamed into place."""
    if "://" not in path or path.startswith("file://"):
        write_atomic(path.removeprefix("file://"), text.encode("utf-8"))
        return
    jvm = spark.sparkContext._jvm
    final = jvm.org.apache.hadoop.fs.Path(path)
    tmp = jvm.org.apache.hadoop.fs.Path(final.getParent(), temporary_name(final.getName()))
    fs = final.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    moved = False
    try:
        out = fs.create(tmp, True)
        try:
            out.write(bytearray(text.encode("utf-8")))
        finally:
            out.close()
        # Hadoop's rename does not replace: the old object goes first (nothing reads it while detection runs)
        fs.delete(final, False)
        moved = fs.rename(tmp, final)
        if not moved:
            raise OSError(f"{path}: could not move {tmp.toString()} into place")
    finally:
        if not moved:
            fs.delete(tmp, False)


def detect_once(spark: SparkSession, args: argparse.Namespace) -> dict:
    """One detection (the app's arguments ``args``) on ``spark``: findings written, the summary returned (and
    written to ``--summary``)."""
    spark.conf.set("spark.sql.sources.partitionOverwriteMode", "dynamic")
    # the findings are cached; without this AQE keeps the cached plan's shuffle partitions (spark.sql.shuffle.
    # partitions, 64 for big runs) instead of coalescing them, and every action on the cache runs that many tasks
    spark.conf.set("spark.sql.optimizer.canChangeCachedPlanOutputPartitioning", "true")
    frames = load_frames(
        spark, args.probe_dir, args.brokers, args.cluster_metadata, args.controllers, metadata_mode=args.metadata_mode
    )
    found, skipped = detect(frames, partial_scope=args.partial_scope)
    found = found.withColumn("audit_run", F.lit(args.audit_run)).dropDuplicates()
    found = found.cache()
    try:
        found.write.mode("overwrite").partitionBy("audit_run").parquet(args.output)
        if args.findings_json:
            order = F.array_position(F.array(*map(F.lit, SEVERITY_ORDER)), F.col("severity"))
            # the same findings always come out in the same order
            keys = ("broker_id", "log_dir", "topic", "partition", "segment", "rule", "path", "message")
            rows = [r.asDict() for r in found.orderBy(order, *keys).collect()]
            write_text(spark, args.findings_json, "".join(json.dumps(r) + "\n" for r in rows))
            # counted from the rows at hand: one job less
            tally = Counter((r["severity"], r["rule"], r["broker_id"]) for r in rows)
            counts = [{"severity": s, "rule": rule, "broker_id": b, "n": n} for (s, rule, b), n in tally.items()]
        else:
            by = found.groupBy("severity", "rule", "broker_id")
            counts = [r.asDict() for r in by.agg(F.count("*").alias("n")).collect()]
    finally:
        found.unpersist()  # a warm driver serves the next detection with the same session
    summary = summarize(counts, skipped, args.audit_run)
    if args.summary:
        write_text(spark, args.summary, json.dumps(summary, indent=2))
    return summary


def serve(spark: SparkSession, channel: str) -> None:
    """A warm driver (``--serve SOCKET``: fleet_doctor.spark.WarmDriver): connected to the Unix socket its caller
    listens on, one detection per line received (JSON: ``{"args": [the app's arguments]}``), each answered by one
    line (``{"ok": true, "summary": ...}`` or ``{"ok": false, "error": ...}``), until the caller closes it."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(channel)
        requests, replies = conn.makefile("r", encoding="utf-8"), conn.makefile("w", encoding="utf-8")
        for line in requests:
            if not line.strip():
                continue
            try:
                summary = detect_once(spark, parse_args(json.loads(line)["args"]))
                reply: dict = {"ok": True, "summary": summary}
            except (Exception, SystemExit) as e:  # said to the caller; the driver serves on (SystemExit: bad args)
                reply = {"ok": False, "error": "".join(traceback.format_exception(e))[-6000:]}
            replies.write(json.dumps(reply) + "\n")
            replies.flush()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--serve"] and len(argv) == 2:
        spark = SparkSession.builder.appName("fleet-doctor-detect-warm").getOrCreate()
        serve(spark, argv[1])
        spark.stop()
        return 0
    args = parse_args(argv)
    spark = SparkSession.builder.appName(f"fleet-doctor-detect-{args.audit_run}").getOrCreate()
    print(json.dumps(detect_once(spark, args)))
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
