"""`fleet-doctor` command line (bin/fleet-doctor)."""

from __future__ import annotations

import argparse
import io
import json
import logging
import sys
from typing import Any

from fleet_doctor import cluster_metadata, inventory, probe
from fleet_doctor.cli.probe_table import read_records, render_table, summarize
from fleet_doctor.rules import severity_rank
from fleet_doctor.store import atomic_file
from fleet_doctor.zookeeper import snapshot as zk_snapshot

# (one-line help, description) of each subcommand
ZK_SNAPSHOT_HELP = (
    "Kafka's ZooKeeper metadata as JSON Lines, live or from a snapshot file (docs/zk-snapshot-schema.md)",
    "Print Kafka's ZooKeeper metadata (topics, assignments, partition states, brokers, controller, cluster id, topic "
    "configs) as JSON Lines, read from a live ZooKeeper or offline from a ZooKeeper data-dir snapshot file. Never "
    "writes to ZooKeeper.",
)
CLUSTER_METADATA_HELP = (
    "a KRaft cluster's metadata (latest snapshot + log) as JSON Lines (docs/cluster-metadata-schema.md)",
    "Replay a KRaft __cluster_metadata-0 dir (its latest snapshot, then the metadata log after it) and print the "
    "cluster's metadata (topics with IDs and assignments, partition states, registered brokers, the active controller "
    "from quorum-state, topic and broker configs) as JSON Lines in the shape of zk-snapshot, plus the metadata log's "
    "own facts and problems. Reads files only; never changes anything.",
)
SCAN_HELP = (
    "probe log dirs, snapshot ZooKeeper, run the detection app locally and print findings",
    "Probe Kafka log dirs on this machine, optionally snapshot ZooKeeper, run the Spark detection app "
    "(spark_apps/detect.py) in local mode and print findings. Exit status: 0 no finding at warning or above, "
    "1 findings, 2 usage or I/O error.",
)

INVENTORY_HELP = (
    "check a fleet's inventories (one file, or a directory of *.json: one cluster each) and list its clusters",
    'Load the inventory file, or every *.json of the directory (one cluster per file: docs/inventory.md, "A fleet '
    'of clusters"), and print each cluster (its file, metadata mode, brokers, Kafka versions) and each file that '
    "gives none, with the reason (its file and field). Exit status: 0 every file gives a cluster, 1 a problem, 2 the "
    "path cannot be read.",
)


def _cmd_probe(args: argparse.Namespace) -> int:
    argv = []
    if args.deep:
        argv.append("--deep")
    if args.verify_crc:
        argv.append("--verify-crc")
    if args.discover:
        argv.append("--discover")
    if args.jobs is not None:
        argv += ["--jobs", str(args.jobs)]
    argv += args.paths
    if args.format == "jsonl":
        return probe.main(argv)
    buf = io.StringIO()
    real_stdout = sys.stdout
    sys.stdout = buf
    try:
        rc = probe.main(argv)
    finally:
        sys.stdout = real_stdout
    if rc != 0:
        return rc
    buf.seek(0)
    render_table(summarize(read_records(buf)), sys.stdout)
    return 0


def _write_jsonl(records: list[dict[str, Any]], output: str | None) -> None:
    lines = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records)
    if output is None or output == "-":
        sys.stdout.write(lines)
        return
    with atomic_file(output) as f:  # a reader never sees a half-written file
        f.write(lines.encode("utf-8"))


def _cmd_zk_snapshot(args: argparse.Namespace) -> int:
    if args.chroot is not None and args.zookeeper is not None:
        args.parser.error("--chroot is for --from-snapshot-file; with --zookeeper give HOST:PORT/chroot")
    logging.getLogger("kazoo").setLevel(logging.CRITICAL)  # one clear error line instead of retry chatter
    try:
        if args.zookeeper is not None:
            records = zk_snapshot.read_live(args.zookeeper, timeout=args.timeout)
        else:
            records = zk_snapshot.read_snapshot_file(args.from_snapshot_file, chroot=args.chroot)
        _write_jsonl(records, args.output)
    except (OSError, ValueError) as e:
        print(f"fleet-doctor zk-snapshot: error: {e}", file=sys.stderr)
        return 2
    return 0


def _cmd_cluster_metadata(args: argparse.Namespace) -> int:
    try:
        text = cluster_metadata.format_records(cluster_metadata.read_cluster_metadata(args.dir))
        if args.output is None or args.output == "-":
            sys.stdout.write(text)
        else:
            with atomic_file(args.output) as f:  # a reader never sees a half-written file
                f.write(text.encode("utf-8"))
    except (OSError, cluster_metadata.ClusterMetadataError) as e:
        print(f"fleet-doctor cluster-metadata: error: {e}", file=sys.stderr)
        return 2
    return 0


def _add_cluster_metadata(sub: Any) -> None:
    cp = sub.add_parser("cluster-metadata", help=CLUSTER_METADATA_HELP[0], description=CLUSTER_METADATA_HELP[1])
    cp.add_argument("dir", metavar="DIR", help="a __cluster_metadata-0 dir, or a KRaft log dir holding one")
    cp.add_argument("--output", metavar="FILE", help="write the records to FILE (atomically) instead of stdout")
    cp.set_defaults(func=_cmd_cluster_metadata, parser=cp)


ROLL_CONTROL_HELP = (
    "hold, skip or release a broker for the cluster's rolls, or show them and the running roll (docs/roll.md)",
    "Hold a broker (a roll waits before the step that holds it, blocked, until it is released), skip it (a roll "
    "leaves it out), release it, or show the standing holds and skips with the cluster's roll as last written (its "
    "step, why it is blocked, since when). Written in the cluster's store (FLEET_DOCTOR_DATA), for the roll running "
    "now and the next ones, until released. Exit status: 0 done, 2 usage, inventory or store error.",
)


def _cmd_roll_control(args: argparse.Namespace) -> int:
    import getpass

    from fleet_doctor import roll_status
    from fleet_doctor.settings import Settings
    from fleet_doctor.store import StoreError

    try:
        settings = Settings.from_env().for_cluster(args.cluster)
        inv = settings.load_inventory()
        if args.action != "show":
            if args.broker is None:
                args.parser.error(f"{args.action} needs a BROKER id")
            if args.broker not in {b.id for b in inv.brokers}:
                print(
                    f"fleet-doctor: broker {args.broker} is not in cluster {inv.cluster}'s inventory", file=sys.stderr
                )
                return 2
            try:
                by = args.by or getpass.getuser()
            except (KeyError, OSError):  # no passwd entry and no USER / LOGNAME
                by = "unknown"
            roll_status.change_control(settings.store, args.action, args.broker, by, args.why or "")
        control = roll_status.read_control(settings.store)
        status = roll_status.read_status(settings.store)
    except (inventory.InventoryError, StoreError, ValueError, OSError) as e:
        print(f"fleet-doctor: {e}", file=sys.stderr)
        return 2
    if args.format == "json":
        out = {"cluster": inv.cluster, **control.to_json(), "roll": status.to_json() if status else None}
        print(json.dumps(out, indent=2))
        return 0
    for b, said in control.said().items():
        print(f"broker {b}: {said}")
    if not control.said():
        print(f"cluster {inv.cluster}: no broker held or skipped")
    print(f"roll: {status.describe()}" if status else "roll: none has run on this cluster yet")
    return 0


def _add_roll_control(sub: Any) -> None:
    rp = sub.add_parser("roll-control", help=ROLL_CONTROL_HELP[0], description=ROLL_CONTROL_HELP[1])
    rp.add_argument("cluster", metavar="CLUSTER", help="the cluster (its inventory's cluster name)")
    rp.add_argument("action", choices=("hold", "skip", "release", "show"))
    rp.add_argument("broker", nargs="?", type=int, metavar="BROKER", help="the broker id (not for show)")
    rp.add_argument("--by", metavar="NAME", help="who asks (default: this user)")
    rp.add_argument("--why", metavar="TEXT", help="why (shown in the roll's log and on the fleet page)")
    rp.add_argument("--format", choices=("text", "json"), default="text")
    rp.set_defaults(func=_cmd_roll_control, parser=rp)


def _cmd_inventory(args: argparse.Namespace) -> int:
    try:
        fleet = inventory.load_fleet(args.path)
    except inventory.InventoryError as e:
        print(f"fleet-doctor inventory: error: {e}", file=sys.stderr)
        return 2
    clusters = [
        {
            "cluster": name,
            "file": str(fleet.sources[name]),
            "metadata_mode": inv.metadata_mode,
            "brokers": [b.id for b in inv.brokers],
            "kafka_versions": sorted({b.kafka_version for b in inv.brokers}),
            **({"controllers": [c.id for c in inv.controllers]} if inv.kraft else {}),
        }
        for name, inv in fleet.clusters.items()
    ]
    problems = [{"file": p.path, "problem": p.message} for p in fleet.problems]
    if args.format == "json":
        print(json.dumps({"clusters": clusters, "problems": problems}, indent=2))
    else:
        for c in clusters:
            brokers = ", ".join(map(str, c["brokers"]))
            print(
                f"{c['cluster']}: {c['metadata_mode']}, brokers {brokers}, Kafka {', '.join(c['kafka_versions'])} "
                f"({c['file']})"
            )
        for p in problems:
            print(f"not used: {p['problem']}")
        print(f"{len(clusters)} cluster(s), {len(problems)} file(s) with a problem")
    return 1 if problems else 0


def _add_inventory(sub: Any) -> None:
    ip = sub.add_parser("inventory", help=INVENTORY_HELP[0], description=INVENTORY_HELP[1])
    ip.add_argument("path", metavar="PATH", help="an inventory file, or a directory of them")
    ip.add_argument("--format", choices=("text", "json"), default="text", help="text (default) or JSON")
    ip.set_defaults(func=_cmd_inventory, parser=ip)


def _add_zk_snapshot(sub: Any) -> None:
    zp = sub.add_parser("zk-snapshot", help=ZK_SNAPSHOT_HELP[0], description=ZK_SNAPSHOT_HELP[1])
    src = zp.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--zookeeper", metavar="HOST:PORT[/chroot]", help="Kafka's zookeeper.connect (comma-separated hosts allowed)"
    )
    src.add_argument(
        "--from-snapshot-file",
        metavar="PATH",
        help="a version-2/snapshot.<zxid> file, or a data dir / version-2 dir (its newest snapshot is read)",
    )
    zp.add_argument("--chroot", metavar="/PATH", help="with --from-snapshot-file: Kafka's chroot in that ZooKeeper")
    zp.add_argument("--output", metavar="FILE", help="write the records to FILE (atomically) instead of stdout")
    zp.add_argument(
        "--timeout", type=float, default=10.0, metavar="SECONDS", help="ZooKeeper connect timeout (default 10)"
    )
    zp.set_defaults(func=_cmd_zk_snapshot, parser=zp)


def _cmd_scan(args: argparse.Namespace) -> int:
    from fleet_doctor.audit import report
    from fleet_doctor.cli.scan import ScanError, scan

    logging.getLogger("kazoo").setLevel(logging.CRITICAL)
    if args.kafka_version:
        from fleet_doctor.rules import KafkaVersion

        try:
            KafkaVersion.parse(args.kafka_version)
        except ValueError as e:
            args.parser.error(str(e))
    paths = args.paths
    if args.discover:
        paths = probe.discover_logdirs(paths)
        if not paths:
            print(f"fleet-doctor scan: error: no Kafka log dir under {', '.join(args.paths)}", file=sys.stderr)
            return 2
    extra: dict[str, Any] = {}
    if args.cluster_metadata:
        extra["cluster_metadata"] = args.cluster_metadata
    try:
        result = scan(
            paths,
            zookeeper=args.zookeeper,
            zk_snapshot_file=args.zk_snapshot_file,
            kafka_version=args.kafka_version,
            broker_id=args.broker_id,
            deep=args.deep or args.verify_crc,
            verify_crc=args.verify_crc,
            master=args.master,
            keep=args.keep_workdir,
            **extra,
        )
    except ScanError as e:
        print(f"fleet-doctor scan: error: {e}", file=sys.stderr)
        return 2
    if args.format == "json":
        json.dump({"findings": result.findings, "summary": result.summary}, sys.stdout, indent=1)
        sys.stdout.write("\n")
    elif args.format == "html":
        report.render_html(result.findings, result.summary, sys.stdout, f"Kafka Fleet Doctor scan: {', '.join(paths)}")
    else:
        report.render_text(result.findings, result.summary, sys.stdout, color=sys.stdout.isatty())
    at_or_above_warning = severity_rank("warning")
    return 1 if any(severity_rank(f["severity"]) <= at_or_above_warning for f in result.findings) else 0


def _add_scan(sub: Any) -> None:
    sp = sub.add_parser("scan", help=SCAN_HELP[0], description=SCAN_HELP[1])
    sp.add_argument("paths", nargs="+", metavar="PATH", help="Kafka log dir(s); with --discover, trees to search")
    zk = sp.add_mutually_exclusive_group()
    zk.add_argument("--zookeeper", metavar="HOST:PORT[/chroot]", help="snapshot this ZooKeeper live")
    zk.add_argument("--zk-snapshot-file", metavar="PATH", help="a ZooKeeper snapshot file or data dir (offline)")
    zk.add_argument(
        "--cluster-metadata",
        action="append",
        metavar="DIR",
        help="KRaft: a __cluster_metadata-0 dir (or a log dir holding one) to decode; repeatable. Log dirs given as "
        "PATH that hold one are decoded anyway",
    )
    sp.add_argument("--kafka-version", metavar="V", help="the brokers' Kafka version (severities depend on it)")
    sp.add_argument("--broker-id", type=int, metavar="N", help="broker id (default: from meta.properties)")
    sp.add_argument("--deep", action="store_true", help="also walk .log batch headers (torn tails, index entries)")
    sp.add_argument("--verify-crc", action="store_true", help="deep, and verify every batch CRC")
    sp.add_argument("--discover", action="store_true", help="scan every log dir found under each PATH")
    sp.add_argument("--format", choices=("text", "json", "html"), default="text")
    sp.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    sp.add_argument("--keep-workdir", metavar="DIR", help="keep the staged probe output and findings in DIR")
    sp.set_defaults(func=_cmd_scan, parser=sp)


def _cmd_detect_service(args: argparse.Namespace) -> int:
    import signal
    from pathlib import Path

    from fleet_doctor import spark

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    try:
        service = spark.DetectService(Path(args.socket), args.master)
        service.listen()
    except (OSError, spark.SparkError) as e:
        print(f"fleet-doctor detect-service: error: {e}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # stops the driver on the way out
    print(f"fleet-doctor detect-service: serving on {args.socket} ({args.master})", flush=True)
    try:
        service.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        service.close()
        print(f"fleet-doctor detect-service: stopped ({service.served} served, {service.refused} refused)", flush=True)
    return 0


def _add_detect_service(sub: Any) -> None:
    dp = sub.add_parser(
        "detect-service",
        help="serve this machine's small detections from one warm Spark driver (FLEET_DOCTOR_DETECT_SERVICE)",
        description="Start one warm Spark driver and serve, through a Unix socket, the small local detections of "
        "every process of this user that names the socket in FLEET_DOCTOR_DETECT_SERVICE (an Airflow worker's audit "
        "and repair tasks, a scan): each pays a detection instead of a driver JVM's start. Runs with other settings "
        "are refused and run their own spark-submit. Stops on SIGTERM or Ctrl-C.",
    )
    dp.add_argument("--socket", required=True, metavar="PATH", help="the socket to serve on (its directory: 0700)")
    dp.add_argument("--master", default="local[*]", help="the local Spark master it runs (default local[*])")
    dp.set_defaults(func=_cmd_detect_service, parser=dp)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fleet-doctor", description="Audit Kafka broker log directories.")
    sub = p.add_subparsers(dest="command", required=True)
    pp = sub.add_parser(
        "probe",
        help="walk Kafka log dirs and print JSON Lines facts (docs/probe-schema.md)",
        description="Walk Kafka log dirs and print facts as JSON Lines. Reads files exactly as Kafka "
        "writes them; never changes anything.",
    )
    pp.add_argument("paths", nargs="+", metavar="PATH", help="Kafka log dir(s)")
    pp.add_argument("--deep", action="store_true", help="also walk .log batch headers and check index entries")
    pp.add_argument("--verify-crc", action="store_true", help="deep, and verify every batch CRC")
    pp.add_argument("--discover", action="store_true", help="probe every log dir found under each PATH")
    pp.add_argument(
        "--jobs",
        type=int,
        metavar="N",
        help="partition dirs probed by N processes (default 2 on 2+ CPUs); output identical and in the same order",
    )
    pp.add_argument(
        "--format", choices=("jsonl", "table"), default="jsonl", help="jsonl (default) or a per-log-dir table"
    )
    pp.set_defaults(func=_cmd_probe)
    _add_zk_snapshot(sub)
    _add_cluster_metadata(sub)
    _add_scan(sub)
    _add_inventory(sub)
    _add_roll_control(sub)
    _add_detect_service(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
