"""`fleet-lab`: bring the fleet lab up and down, show it, inject incidents, replay the seed reports.

    fleet-lab up [--brokers N] [--kafka-version V] [--log-dirs-per-broker K] [--dir DIR] [--cluster NAME]
                 [--metadata zookeeper|kraft] [--kafka-user K [--ssh-user U]]
    fleet-lab down [--dir DIR]
    fleet-lab status [--dir DIR] [--json]
    fleet-lab inject INCIDENT [INCIDENT ...] [--broker N] [--topic T] [--partition P] [--partitions N]
                     [--suffix delete|stray] [--crc] [--unknown-topic-id]
    fleet-lab scenario seed-000|seed-004 [--broker N]

The lab dir defaults to $FLEET_LAB_DIR, else .lab/ in the repository. Exit status: 0 done, 1 a scenario
step did not end as the seed report says, 2 usage or lab error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from fleet_lab import fleet
from fleet_lab.incidents import INCIDENTS, SCENARIOS, inject, run_scenario


def _dir(args: argparse.Namespace) -> Path:
    return Path(args.dir or os.environ.get("FLEET_LAB_DIR") or fleet.DEFAULT_DIR).resolve()


def _print_status(st: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(st, indent=2))
        return
    print(f"fleet lab {st['cluster']} at {st['dir']} (Kafka {st['kafka_version']} behaviour)")
    if st.get("metadata_mode") == "kraft":
        voters = ", ".join(str(c["id"]) for c in st["controllers"])
        print(f"  metadata    KRaft, combined nodes, voters {voters}")
        print(f"  controller  {st['controller']} (quorum leader, epoch {st['quorum_leader_epoch']})")
    else:
        zk = "running" if st["zookeeper_running"] else "stopped"
        print(f"  zookeeper   {st['zookeeper']}  {zk}, pid {st['zookeeper_pid']}")
        print(f"  controller  {st['controller']}")
    for b in st["brokers"]:
        state = f"running, pid {b['pid']}" if b["running"] else "stopped"
        ssh = "" if b["ssh_running"] else "  (sshd down)"
        print(f"  broker {b['id']:<3} ssh 127.0.0.1:{b['ssh_port']:<6} {state}{ssh}  {', '.join(b['log_dirs'])}")
    print(f"  inventory   {st['inventory']}")
    print(f"  airflow     {st['airflow_connections']}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="fleet-lab", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)

    def add(name: str, help_text: str) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help_text)
        sp.add_argument("--dir", help="lab directory (default $FLEET_LAB_DIR or .lab/)")
        sp.add_argument("--json", action="store_true", help="machine-readable output")
        return sp

    up = add("up", "start ZooKeeper (or a KRaft quorum), one sshd and one lab broker per broker")
    up.add_argument("--brokers", type=int, default=3)
    up.add_argument(
        "--kafka-version",
        help=f"default {fleet.DEFAULT_VERSION} (ZooKeeper), {fleet.DEFAULT_KRAFT_VERSION} (KRaft: 3.7.x)",
    )
    up.add_argument(
        "--metadata",
        choices=fleet.METADATA_MODES,
        default="zookeeper",
        help="zookeeper (default) or kraft: no ZooKeeper, every broker a combined KRaft node and voter",
    )
    up.add_argument("--log-dirs-per-broker", type=int, default=1)
    up.add_argument(
        "--racks",
        type=int,
        default=0,
        help="broker.rack of each broker: rack-0 .. rack-(N-1), consecutive brokers in different racks (default: none)",
    )
    up.add_argument(
        "--recovery-rate",
        type=float,
        default=0.0,
        metavar="BYTES_PER_S",
        help="log recovery after an unclean stop takes the bytes past the recovery point at this rate (default: "
        "instant)",
    )
    up.add_argument(
        "--controlled-shutdown-ms",
        type=int,
        default=0,
        help="ZooKeeper labs: a clean stop's controlled shutdown takes this long, as Kafka's does (default: 0)",
    )
    up.add_argument(
        "--log-load-delay-ms", type=int, default=0, help="each log's load at start takes this long (default: 0)"
    )
    up.add_argument("--cluster", default=fleet.DEFAULT_CLUSTER, help="cluster name in the inventory and connection ids")
    up.add_argument(
        "--kafka-user",
        default="",
        help="root only, ZooKeeper labs: the brokers run as this user and own their log dirs; the inventory names it "
        "(kafka_user) so every change runs as it through sudo (made when missing, with a sudoers rule)",
    )
    up.add_argument(
        "--ssh-user",
        default="",
        help="with --kafka-user: the (non-root) user the product logs in as, allowed by sudo to act as the Kafka user",
    )
    add("down", "stop every process of the lab")
    add("status", "show the lab's endpoints and processes")
    inj = add("inject", "inject incidents")
    inj.add_argument("incidents", nargs="+", metavar="INCIDENT", choices=INCIDENTS, help=", ".join(INCIDENTS))
    inj.add_argument("--broker", type=int)
    inj.add_argument("--topic")
    inj.add_argument("--partition", type=int)
    inj.add_argument("--partitions", type=int, help="old-client-add-partitions: the new partition count")
    inj.add_argument(
        "--suffix", choices=("delete", "stray"), default="delete", help="stray-dir: a -delete (default) or -stray dir"
    )
    inj.add_argument("--crc", action="store_true", help="metadata-log-torn: flip a byte inside a batch instead")
    inj.add_argument(
        "--unknown-topic-id",
        action="store_true",
        help="kraft-stray-replica: a replica of a topic ID the metadata does not hold (default: not assigned there)",
    )
    sc = add("scenario", "replay a seed report end to end (brings a lab up first if none is)")
    sc.add_argument("name", choices=sorted(SCENARIOS))
    sc.add_argument("--broker", type=int, help="the broker to restart (seed-004) or kill (seed-000)")
    sc.add_argument("--brokers", type=int, default=3)
    args = p.parse_args(argv)
    d = _dir(args)
    try:
        if args.command == "up":
            t0 = time.monotonic()
            fleet.up(
                d,
                brokers=args.brokers,
                kafka_version=args.kafka_version,
                log_dirs_per_broker=args.log_dirs_per_broker,
                cluster=args.cluster,
                metadata=args.metadata,
                ssh_user=args.ssh_user,
                kafka_user=args.kafka_user,
                racks=args.racks,
                recovery_bytes_per_s=args.recovery_rate,
                controlled_shutdown_ms=args.controlled_shutdown_ms,
                log_load_delay_ms=args.log_load_delay_ms,
            )
            st = fleet.status(d)
            if not args.json:
                print(f"fleet lab up in {time.monotonic() - t0:.1f} s")
            _print_status(st, args.json)
        elif args.command == "down":
            stopped = fleet.down(d)
            print(json.dumps({"stopped": stopped}) if args.json else f"stopped: {', '.join(stopped) or 'nothing'}")
        elif args.command == "status":
            _print_status(fleet.status(d), args.json)
        elif args.command == "inject":
            state = fleet.LabState.load(d)
            for name in args.incidents:
                done = inject(
                    state,
                    name,
                    broker=args.broker,
                    topic=args.topic,
                    partition=args.partition,
                    partitions=args.partitions,
                    suffix=args.suffix,
                    crc=args.crc,
                    unknown_topic_id=args.unknown_topic_id,
                )
                rec = done.to_dict()
                if args.json:
                    print(json.dumps(rec))
                else:
                    where = " ".join(
                        f"{k}={rec[k]}" for k in ("broker_id", "topic", "partition", "segment") if rec[k] is not None
                    )
                    print(f"{name}: {where}")
                    for path in rec["paths"]:
                        print(f"  {path}")
                    print(f"  -> rule {rec['rule']}: {rec['mechanism']}")
        elif args.command == "scenario":
            version, _ = SCENARIOS[args.name]
            if not fleet.is_up(d):
                fleet.up(d, brokers=args.brokers, kafka_version=version)
            steps = run_scenario(fleet.LabState.load(d), args.name, broker=args.broker)
            for s in steps:
                if args.json:
                    print(json.dumps({"step": s.step, "ok": s.ok, "details": s.details}))
                else:
                    print(f"[{'ok' if s.ok else 'FAILED'}] {s.step}")
                    for k, v in s.details.items():
                        print(f"       {k}: {v}")
            return 0 if all(s.ok for s in steps) else 1
    except (fleet.LabError, OSError, ValueError) as e:
        print(f"fleet-lab {args.command}: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
