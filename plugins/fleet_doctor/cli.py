"""`fleet-doctor` command line (bin/fleet-doctor)."""

from __future__ import annotations

import argparse
import io
import sys

from fleet_doctor import probe
from fleet_doctor.probe_summary import read_records, render_table, summarize


def _cmd_probe(args: argparse.Namespace) -> int:
    argv = []
    if args.deep:
        argv.append("--deep")
    if args.verify_crc:
        argv.append("--verify-crc")
    if args.discover:
        argv.append("--discover")
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
        "--format", choices=("jsonl", "table"), default="jsonl", help="jsonl (default) or a per-log-dir table"
    )
    pp.set_defaults(func=_cmd_probe)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
